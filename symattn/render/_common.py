"""Kept only for ``Step._repr_latex_`` in symattn/derivation.py until it imports from ``._tex``."""

from ._tex import exact_tex_matrix_of_step

__all__ = ["exact_tex_matrix_of_step"]
