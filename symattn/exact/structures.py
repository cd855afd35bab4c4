"""The exact side's structures: values that the worked solution writes and that evaluate without
building large expressions.

- :class:`Softmax`: the weights A, row by row as ``e^{z_ij − m_i} / Z_i``;
- :class:`Output`: ``O = A·V``, each entry one fraction over the row's ``Z_i``;
- :class:`OverZ2`: a gradient through the softmax, each entry one fraction over ``Z_i²``
  (``dŜ``, ``dS`` and ``dQ``), with its numerators kept for the worked solution;
- :class:`WeightsT`, :class:`ScoresT`: those transposed, kept for a product;
- :class:`OverRows`: a sum over the softmax rows, each term over a power of its row's ``Z_i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import flint
import mpmath
import sympy

from ..numbers.matrices import Matrix, is_rational, tidy
from .arb import arb_matrix, arb_precision, mp_matmul
from .evaluation import evaluate
from .lazy import LazyMatrix
from .softmax import SoftmaxRow, weights_times

Values = list[list[mpmath.mpf]]


@dataclass(frozen=True)
class Softmax:
    """The weights: each row's maximum and exact exponents (see :class:`symattn.exact.softmax.SoftmaxRow`)."""

    rows: tuple[SoftmaxRow, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.rows[0].raw) if self.rows else 0)

    @cached_property
    def lazy(self) -> LazyMatrix:  # one matrix, so each entry is built once whoever reads it
        return LazyMatrix(*self.shape, lambda i, j: self.rows[i].weight(j))


@dataclass(frozen=True)
class Output:
    """``O = A·V`` over the softmax structure: entry (i, j) is one fraction over row i's ``Z_i``."""

    rows: tuple[SoftmaxRow, ...]
    values: Matrix

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), self.values.cols)

    @cached_property
    def lazy(self) -> LazyMatrix:
        v = self.values
        columns: dict[int, list[sympy.Expr]] = {}

        def entry(i: int, j: int) -> sympy.Expr:
            if j not in columns:
                columns[j] = [v[k, j] for k in range(v.rows)]
            return self.rows[i].weighted_sum(columns[j])

        return LazyMatrix(len(self.rows), v.cols, entry)


@dataclass(frozen=True)
class OverZ2:
    """A gradient whose row i is written over ``Z_i²``: ``base(i, j)`` is the numerator before the
    scale ``factor`` (None: unscaled); ``lazy`` holds the entries."""

    rows: tuple[SoftmaxRow, ...]
    base: Callable[[int, int], sympy.Expr]
    lazy: LazyMatrix
    factor: sympy.Expr | None = None
    keyed: bool = True  # the columns are the keys of the softmax rows (dŜ, dS), not a product of them
    operands: tuple | None = None  # (dS, b) when this is dS·b (a product the backward pass may turn)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lazy.rows, self.lazy.cols)

    def top(self, i: int, j: int) -> sympy.Expr:
        """The numerator of entry (i, j) over ``Z_i²``."""
        x = self.base(i, j)
        return x if self.factor is None else tidy(self.factor * x)


@dataclass(frozen=True)
class WeightsT:
    """``Aᵀ``: the weights transposed (entry (k, i) is ``a_ik``), kept as structure for a product."""

    rows: tuple[SoftmaxRow, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows[0].raw) if self.rows else 0, len(self.rows))

    @cached_property
    def lazy(self) -> LazyMatrix:
        return LazyMatrix(*self.shape, lambda k, i: self.rows[i].weight(k))


@dataclass(frozen=True)
class OverRows:
    """A sum over the softmax rows, each term over a power of its row's normaliser: entry (k, c)
    is ``Σ top / Z_i^power`` over the ``(i, power, top)`` of ``tops(k, c)`` (none of them 0).

    ``dV = Aᵀ dO`` sums terms over ``Z_i``; ``dK = dSᵀ Q`` and ``dW_Q = Xᵀ dQ`` over ``Z_i²``; a
    rational matrix on either side keeps the form (``dW_V = Cᵀ dV``, ``dV W_Vᵀ``), and so does a
    sum (``dX``). ``lazy`` holds the entries."""

    rows: tuple[SoftmaxRow, ...]
    tops: Callable[[int, int], list[tuple[int, int, sympy.Expr]]]
    lazy: LazyMatrix
    operands: tuple | None = None  # (dSᵀ, b) when this is dSᵀ·b (a product the backward pass may turn)
    # a rational matrix added to the fractions (dX = the paths + dH with the residual); the operations
    # that carry the form on (products, sums over the rows) take only a sum without one
    plain: "Matrix | None" = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lazy.rows, self.lazy.cols)

    def fractions(self, k: int, c: int) -> tuple[sympy.Expr, list[tuple[int, int, sympy.Expr]]]:
        """Entry (k, c) as a plain part (the terms of rows whose ``Z_i`` is a plain number) and
        the ``(i, power, top)`` written over ``Z_i^power``."""
        plain, over = [], []
        if self.plain is not None:
            plain.append(self.plain[k, c])
        for i, power, top in self.tops(k, c):
            row = self.rows[i]
            if row.normaliser_is_number:
                plain.append(top / row.normaliser ** power)
            else:
                over.append((i, power, top))
        return sympy.Add(*plain), over


@dataclass(frozen=True)
class ScoresT:
    """``dSᵀ``: a gradient over ``Z_i²`` whose columns are the keys, transposed, kept for a product."""

    of: "OverZ2"

    @property
    def shape(self) -> tuple[int, int]:
        return (self.of.lazy.cols, self.of.lazy.rows)

    @cached_property
    def lazy(self) -> LazyMatrix:
        return self.of.lazy.T


def over_rows(x) -> "OverRows":
    """An OverZ2 whose row i is over ``Z_i²`` (``dQ``), as a sum over the rows; an OverRows as it is."""
    if isinstance(x, OverRows):
        return x
    assert isinstance(x, OverZ2), type(x)

    def tops(i: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
        top = x.top(i, c)
        return [] if top == 0 else [(i, 2, top)]

    return OverRows(x.rows, tops, x.lazy)


def gathered(terms) -> list[tuple[int, int, sympy.Expr]]:
    """``(i, power, top)`` terms with the same row and power added up (in that order), zeros dropped."""
    gathered: dict[tuple[int, int], list] = {}
    for i, power, top in terms:
        gathered.setdefault((i, power), []).append(top)
    out = [(i, power, tidy(sympy.Add(*tops))) for (i, power), tops in sorted(gathered.items())]
    return [t for t in out if t[2] != 0]


STRUCTURES = (Softmax, Output, OverZ2, WeightsT, OverRows, ScoresT)


def matrix_of(x) -> "Matrix | LazyMatrix":
    """An exact value as a matrix (a structure's entries, built when read)."""
    return x.lazy if isinstance(x, STRUCTURES) else x


def shape_of(x) -> tuple[int, int]:
    return x.shape if isinstance(x, STRUCTURES) else (x.rows, x.cols)



def arb_structure(value, dps: int):
    """A rational softmax structure's values as an arb_mat at ``dps`` digits (the weights, or the
    output ``A·V`` as one arb product); None for anything else."""
    rows = getattr(value, "rows", None)
    if not isinstance(value, (Softmax, Output)) or not all(row.has_balls for row in rows):
        return None
    with arb_precision(dps):
        weights = flint.arb_mat([row.arb_weights(dps) for row in rows])
        if isinstance(value, Softmax):
            return weights
        if not is_rational(value.values):
            return None
        return weights * arb_matrix(value.values, dps)


def evaluate_structure(value, dps: int, subs) -> "Values | None":
    """A softmax structure's values at ``dps`` digits, from its rows (never a large expression);
    None for anything else."""
    if isinstance(value, Softmax):
        return [row.evaluate(dps, subs) for row in value.rows]
    if isinstance(value, Output):
        fast = weights_times(value.rows, value.values, dps)
        if fast is not None:
            return fast
        weights = [row.evaluate(dps, subs) for row in value.rows]
        return mp_matmul(weights, evaluate(value.values, dps, subs), dps)
    return None
