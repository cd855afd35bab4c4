"""How a message names a place in a problem, as a person reads it: a matrix's entry, row or
list item counted from 1, a plural, a shape."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Matrix


# Where an entry, a row or a list item is, as a person reads it: counted from 1, as the
# worked solution's subscripts are (S₂₁ is row 2, column 1). JSON keeps 0-based indices.
def entry_field(name: str, i: int, j: int) -> str:
    """``X row 3, column 2`` for the 0-based entry ``(i, j)`` of matrix ``name``."""
    return f"{name} row {i + 1}, column {j + 1}"


def row_field(name: str, i: int) -> str:
    """``X row 3`` for the 0-based row ``i`` of matrix ``name``."""
    return f"{name} row {i + 1}"


def item_field(name: str, i: int) -> str:
    """``tokens item 2`` for the 0-based item ``i`` of the list ``name``."""
    return f"{name} item {i + 1}"


def plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def shape_text(m: Matrix) -> str:
    return f"{m.rows}×{m.cols}"

