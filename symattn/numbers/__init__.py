"""Exact numbers from text: parsing a user's entries (``0.1`` is 1/10) and SymPy's internals."""
