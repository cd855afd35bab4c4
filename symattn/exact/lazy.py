"""Exact matrices read when asked for: a renderer that shows a corner builds a corner.

:class:`LazyMatrix` builds its entries from structure on first access; :class:`LazyRows` is a
sequence of rows (or of a row's entries) made each time they are read, not kept. Rational
matrices are held as QQ DomainMatrix objects: python-flint's ``fmpq_mat`` under SymPy's flint
ground types. SymPy's private internals that this needs are in
:mod:`symattn.numbers.sympy_internals`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable, Iterator

import sympy
from flint import fmpq

from ..numbers.dyadic import deferred_floats
from ..numbers.matrices import Matrix, is_rational
from ..numbers.sympy_internals import flint_matrix, qq_dense

_dm = qq_dense  # the QQ DomainMatrix of a rational matrix (dense; fmpq_mat under flint)


def rational_rows(m: Matrix) -> "list[list] | LazyRows":
    """The entries of a rational matrix as ``QQ`` numbers (no SymPy objects), as rows: lists, or
    for flint's fmpq_mat, :class:`LazyRows` of its rows (a renderer that shows a corner reads a corner)."""
    floats = deferred_floats(m)
    if floats is not None:  # a big float matrix whose fmpq_mat is not made: its rows read from the floats
        return LazyRows(floats.shape[0], lambda i: _FloatRow(floats, i, floats.shape[1]))
    dense = _dm(m)
    fmpq_mat = flint_matrix(dense)
    if fmpq_mat is None:
        return dense.to_list()
    width = fmpq_mat.ncols()
    return LazyRows(fmpq_mat.nrows(), lambda i: _FmpqRow(fmpq_mat, i, width))


class LazyRows(Sequence):
    """Rows made by ``row(i)`` each time they are read, not kept: the rows of an ``fmpq_mat``, or
    the mask and the masked scores of a long context, which hold n² entries that are read a few
    times, row by row."""

    __slots__ = ("_row", "_count")

    def __init__(self, count: int, row: Callable[[int], Sequence]) -> None:
        self._count, self._row = count, row

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        return self._row(position(i, self._count))

    def __iter__(self):
        return (self._row(i) for i in range(self._count))


MADE_ROWS_FROM = 1 << 16  # entries from which the mask and the masked scores make their rows when read


def made_rows(count: int, cols: int, row: Callable[[int], list]):
    """The rows ``row(0..count-1)``: a list of them, or for a big matrix, made when read."""
    if count * cols >= MADE_ROWS_FROM:
        return LazyRows(count, row)
    return [row(i) for i in range(count)]


def position(k: int, n: int) -> int:
    """Index ``k`` of a sequence of length ``n`` (negative from the end), as a list reads it."""
    at = k + n if k < 0 else k
    if not 0 <= at < n:
        raise IndexError(k)
    return at


class _FmpqRow(Sequence):
    """Row ``i`` of an ``fmpq_mat``, its entries read when asked for (straight from the matrix: a
    row is often read whole)."""

    __slots__ = ("_dense", "_i", "_width")

    def __init__(self, dense, i: int, cols: int) -> None:
        self._dense, self._i, self._width = dense, i, cols

    def __len__(self) -> int:
        return self._width

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(self._width))]
        return self._dense[self._i, position(j, self._width)]

    def __iter__(self):
        dense, i = self._dense, self._i
        return (dense[i, j] for j in range(self._width))


class _FloatRow(_FmpqRow):
    """Row ``i`` of a float64 array of binary floats, each entry read as the fmpq it stands for."""

    __slots__ = ()

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(self._width))]
        return fmpq(*float(self._dense[self._i, position(j, self._width)]).as_integer_ratio())

    def __iter__(self):
        return (fmpq(*v.as_integer_ratio()) for v in self._dense[self._i].tolist())


def all_integers(m) -> bool:
    """Whether every entry of a rational matrix is an integer (read from its common denominator,
    or for a float matrix whose fmpq_mat is not made, from its floats)."""
    floats = deferred_floats(m)
    if floats is not None:  # a block of rows at a time: weights show a fraction in their first rows
        import numpy

        step = max(1, (1 << 16) // max(1, floats.shape[1]))
        return all(numpy.array_equal(numpy.floor(block), block)
                   for block in (floats[i:i + step] for i in range(0, floats.shape[0], step)))
    fmpq_mat = flint_matrix(_dm(m))
    if fmpq_mat is not None:
        return fmpq_mat.numer_denom()[1] == 1
    return all(x.denominator == 1 for row in _dm(m).to_list() for x in row)


def fmpq_matrix(m):
    """The python-flint ``fmpq_mat`` a rational matrix holds, or None (not rational, or not held
    as one: SymPy's python ground types)."""
    return flint_matrix(_dm(m)) if is_rational(m) else None


def qq_entries(m) -> "list[list] | None":
    """The entries of ``m`` as ``QQ`` numbers (None for −∞) when they are all rational, else None:
    a rational matrix's own, or a lazy matrix's ``qq_rows``."""
    return rational_rows(m) if is_rational(m) else getattr(m, "qq_rows", None)


class LazyMatrix:
    """An exact matrix whose entries are built from structure on first access.

    Big matrices (the masked scores, the weights, the outputs) are never built
    whole: a renderer that shows a corner builds a corner. ``qq_rows`` holds the
    entries as ``QQ`` numbers (``None`` for −∞) when they are all rational.
    Anything else a SymPy matrix offers is reached through :meth:`as_matrix`.
    """

    def __init__(self, rows: int, cols: int, entry: Callable[[int, int], sympy.Expr], qq_rows=None) -> None:
        self.rows, self.cols = rows, cols
        self._entry = entry
        self._cache: dict[tuple[int, int], sympy.Expr] = {}
        self.qq_rows = qq_rows

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def __getitem__(self, key):
        if isinstance(key, tuple) and all(isinstance(k, int) for k in key):
            i, j = key
            i, j = i % self.rows if i < 0 else i, j % self.cols if j < 0 else j
            if not (0 <= i < self.rows and 0 <= j < self.cols):
                raise IndexError(f"index {key} out of range for a {self.rows}×{self.cols} matrix")
            if (i, j) not in self._cache:
                self._cache[(i, j)] = self._entry(i, j)
            return self._cache[(i, j)]
        if isinstance(key, int):
            return self[divmod(key, self.cols)]
        return self.as_matrix()[key]

    def peek(self, key: tuple[int, int]) -> sympy.Expr:
        """Entry ``key`` without keeping it (a writer that reads every entry once)."""
        return self._cache[key] if key in self._cache else self._entry(*key)

    def __iter__(self) -> Iterator[sympy.Expr]:
        for i in range(self.rows):
            for j in range(self.cols):
                yield self[i, j]

    def __len__(self) -> int:
        return self.rows * self.cols

    def tolist(self) -> list[list[sympy.Expr]]:
        return [[self[i, j] for j in range(self.cols)] for i in range(self.rows)]

    @property
    def T(self) -> "LazyMatrix":
        qq = None if self.qq_rows is None else [list(c) for c in zip(*self.qq_rows)]
        return LazyMatrix(self.cols, self.rows, lambda i, j: self[j, i], qq)

    def row(self, i: int) -> Matrix:
        return Matrix(1, self.cols, [self[i, j] for j in range(self.cols)])

    def col(self, j: int) -> Matrix:
        return Matrix(self.rows, 1, [self[i, j] for i in range(self.rows)])

    def as_matrix(self) -> Matrix:
        """The whole matrix as a SymPy ImmutableMatrix (builds every entry)."""
        return Matrix(self.rows, self.cols, [self[i, j] for i in range(self.rows) for j in range(self.cols)])

    def _sympy_(self) -> Matrix:
        return self.as_matrix()

    def __eq__(self, other) -> bool:
        if isinstance(other, LazyMatrix):
            other = other.as_matrix()
        return self.as_matrix() == other

    __hash__ = None  # type: ignore[assignment]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.as_matrix(), name)

    def __repr__(self) -> str:
        return repr(self.as_matrix())

