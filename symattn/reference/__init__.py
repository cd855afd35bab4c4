"""The independent references every derivation is checked against: NumPy, PyTorch, finite differences."""
