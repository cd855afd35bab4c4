"""The operations the stage relations are written in, twice: exactly and numerically.

A relation in :mod:`symattn.stages.registry` says, for instance, ``ops.matmul(ops.T(v(A)), v(dO))``.
:class:`ExactOps` runs it on exact values (SymPy and flint matrices, the softmax kept as
structure), :class:`NumericOps` on values at high precision (lists of mpmath rows, or a
rational matrix read straight into arb). The exact side keeps three structures that the
worked solution writes and that evaluate without building large expressions:

- :class:`Softmax`: the weights A, row by row as ``e^{z_ij − m_i} / Z_i``;
- :class:`Output`: ``O = A·V``, each entry one fraction over the row's ``Z_i``;
- :class:`OverZ2`: a gradient through the softmax, each entry one fraction over ``Z_i²``
  (``dŜ``, ``dS`` and ``dQ``), with its numerators kept for the worked solution.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import flint
import mpmath
import sympy
from sympy import QQ

from . import matrices as _exact
from . import tiled as _tiled
from .matrices import LazyMatrix, Matrix, SoftmaxRow

NINF = mpmath.ninf
Values = list[list[mpmath.mpf]]


class Undefined(ArithmeticError):
    """A relation has no value here (a row of scores with nothing allowed has no softmax)."""


# -- exact structures ------------------------------------------------------------------------


@dataclass(frozen=True)
class Softmax:
    """The weights: each row's maximum and exact exponents (see :class:`symattn.exact.matrices.SoftmaxRow`)."""

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

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lazy.rows, self.lazy.cols)

    def top(self, i: int, j: int) -> sympy.Expr:
        """The numerator of entry (i, j) over ``Z_i²``."""
        x = self.base(i, j)
        return x if self.factor is None else _exact.tidy(self.factor * x)


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

    @property
    def shape(self) -> tuple[int, int]:
        return (self.lazy.rows, self.lazy.cols)

    def fractions(self, k: int, c: int) -> tuple[sympy.Expr, list[tuple[int, int, sympy.Expr]]]:
        """Entry (k, c) as a plain part (the terms of rows whose ``Z_i`` is a plain number) and
        the ``(i, power, top)`` written over ``Z_i^power``."""
        plain, over = [], []
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


def _over_rows(x) -> "OverRows":
    """An OverZ2 whose row i is over ``Z_i²`` (``dQ``), as a sum over the rows; an OverRows as it is."""
    if isinstance(x, OverRows):
        return x

    def tops(i: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
        top = x.top(i, c)
        return [] if top == 0 else [(i, 2, top)]

    return OverRows(x.rows, tops, x.lazy)


def _gathered(terms) -> list[tuple[int, int, sympy.Expr]]:
    """``(i, power, top)`` terms with the same row and power added up (in that order), zeros dropped."""
    gathered: dict[tuple[int, int], list] = {}
    for i, power, top in terms:
        gathered.setdefault((i, power), []).append(top)
    out = [(i, power, _exact.tidy(sympy.Add(*tops))) for (i, power), tops in sorted(gathered.items())]
    return [t for t in out if t[2] != 0]


_STRUCTURES = (Softmax, Output, OverZ2, WeightsT, OverRows, ScoresT)


def matrix_of(x) -> "Matrix | LazyMatrix":
    """An exact value as a matrix (a structure's entries, built when read)."""
    return x.lazy if isinstance(x, _STRUCTURES) else x


def shape_of(x) -> tuple[int, int]:
    return x.shape if isinstance(x, _STRUCTURES) else (x.rows, x.cols)


def product(a, b):
    """``a·b`` exactly, unexpanded: a rational product, or a lazy matrix of sums of products."""
    if _exact.is_rational(a) and _exact.is_rational(b):
        return _exact.matmul(a, b)

    def entry(i: int, j: int) -> sympy.Expr:
        return sympy.Add(*[x * y for x, y in ((a[i, k], b[k, j]) for k in range(a.cols)) if x != 0 and y != 0])

    return LazyMatrix(a.rows, b.cols, entry)


class ExactOps:
    """The relations' operations on exact values. A forward product is expanded (``expand``);
    a gradient's is kept as a sum of products, as backpropagation forms it."""

    def __init__(self, expand: bool = True) -> None:
        self.expand = expand

    def matmul(self, a, b):
        if isinstance(a, Softmax):
            return Output(a.rows, b)
        if isinstance(a, OverZ2) and a.keyed:
            return self._over_z2_times(a, b)
        if isinstance(a, WeightsT) and not isinstance(b, _STRUCTURES):
            return self._weights_t_times(a, b)
        if isinstance(a, ScoresT) and not isinstance(b, _STRUCTURES):
            return self._scores_t_times(a, b)
        if isinstance(b, (OverRows, OverZ2)) and _exact.is_rational(a):
            return self._times_over_rows(a, _over_rows(b))
        if isinstance(a, (OverRows, OverZ2)) and _exact.is_rational(b):
            return self._over_rows_times(_over_rows(a), b)
        a, b = matrix_of(a), matrix_of(b)
        return _exact.matmul(a, b) if self.expand else product(a, b)

    @staticmethod
    def _weights_t_times(a: WeightsT, b) -> OverRows:
        """``Aᵀ·b``: entry (k, c) = Σ_i a_ik b_ic, each term ``e^{z_ik − m_i} b_ic / Z_i``."""
        rows = a.rows

        def tops(k: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            return [(i, 1, row.terms[k] * b[i, c]) for i, row in enumerate(rows)
                    if row.raw[k] is not None and b[i, c] != 0]

        return OverRows(rows, tops, product(a.lazy, b))

    @staticmethod
    def _scores_t_times(a: ScoresT, b) -> OverRows:
        """``dSᵀ·b``: entry (k, c) = Σ_i dS_ik b_ic, each term over ``Z_i²``."""
        g = a.of

        def tops(k: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            terms = []
            for i in range(g.lazy.rows):
                if g.rows[i].raw[k] is not None and b[i, c] != 0:
                    top = g.top(i, k)
                    if top != 0:
                        terms.append((i, 2, top * b[i, c]))
            return _gathered(terms)

        return OverRows(g.rows, tops, product(a.lazy, b))

    @staticmethod
    def _over_rows_times(a: OverRows, b) -> OverRows:
        """``a·b`` for rational ``b``: each row's terms gather over the same power of ``Z_i``."""
        def tops(k: int, d: int) -> list[tuple[int, int, sympy.Expr]]:
            terms = []
            for c in range(b.rows):
                y = b[c, d]
                if y != 0:
                    terms += [(i, power, top * y) for i, power, top in a.tops(k, c)]
            return _gathered(terms)

        return OverRows(a.rows, tops, product(a.lazy, b))

    @staticmethod
    def _times_over_rows(a, b: OverRows) -> OverRows:
        """``a·b`` for rational ``a``: row i's terms gather over the same ``Z_i``."""
        def tops(d: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            terms = []
            for k in range(a.cols):
                x = a[d, k]
                if x != 0:
                    terms += [(i, power, x * top) for i, power, top in b.tops(k, c)]
            return _gathered(terms)

        return OverRows(b.rows, tops, product(a, b.lazy))

    @staticmethod
    def _over_z2_times(a: OverZ2, b: Matrix) -> OverZ2:
        """Row i of ``a`` shares the denominator ``Z_i²``, so each entry of ``a·b`` is one fraction."""
        rows = a.rows

        def base(i: int, c: int) -> sympy.Expr:
            return sympy.expand(sympy.Add(*[a.base(i, j) * b[j, c] for j in range(b.rows) if rows[i].raw[j] is not None]))

        def entry(i: int, c: int) -> sympy.Expr:
            x = base(i, c)
            top = x if a.factor is None else _exact.tidy(a.factor * x)
            return top if top == 0 else top / rows[i].normaliser ** 2

        return OverZ2(rows, base, LazyMatrix(len(rows), b.cols, entry), a.factor, keyed=False)

    def add_row(self, m, row):
        """``m`` with the 1 × cols ``row`` added to every row (a projection's bias)."""
        return _exact.add_row(matrix_of(m), matrix_of(row))

    def col_sums(self, m):
        """``1ᵀ m``, the 1 × cols sums of the columns (a bias's gradient). A sum over the softmax
        rows keeps its form, and each entry is built from its gathered terms, so a sum that
        cancels (the key bias's gradient) is exactly 0."""
        total = self.matmul(self.ones(1, shape_of(m)[0]), m)
        if not isinstance(total, OverRows):
            return total

        def entry(k: int, c: int) -> sympy.Expr:
            return sympy.Add(*[top / total.rows[i].normaliser ** power for i, power, top in total.tops(k, c)])

        return OverRows(total.rows, total.tops, LazyMatrix(*total.shape, entry))

    def T(self, a):
        if isinstance(a, Softmax):
            return WeightsT(a.rows)
        if isinstance(a, OverZ2) and a.keyed:
            return ScoresT(a)
        return _exact.transpose(matrix_of(a))

    def scale(self, a, factor: sympy.Expr):
        if isinstance(a, OverZ2):
            parent = a.lazy
            return OverZ2(a.rows, a.base, LazyMatrix(parent.rows, parent.cols, lambda i, j: factor * parent[i, j]),
                          factor if a.factor is None else a.factor * factor, a.keyed)
        return _exact.scale(a, factor)

    def mask(self, allowed, bias):
        return _exact.mask_matrix(allowed, bias)

    def add_mask(self, scores, mask):
        return _exact.add_mask(scores, mask)

    def softmax(self, z) -> Softmax:
        return Softmax(_exact.softmax_rows(z))

    def softmax_backward(self, a: Softmax, dA) -> OverZ2:
        """dŜ_ij = e_ij (dA_ij Z_i − D_i) / Z_i² with D_i = Σ_k e_ik dA_ik (``e`` the row's terms):
        masked positions are exactly 0 and each row sums to exactly 0."""
        rows = a.rows
        dA = matrix_of(dA)
        numerators: dict[tuple[int, int], sympy.Expr] = {}
        D: dict[int, sympy.Expr] = {}

        def numerator(i: int, j: int) -> sympy.Expr:
            if (i, j) not in numerators:
                row = rows[i]
                if row.raw[j] is None:
                    numerators[(i, j)] = sympy.Integer(0)
                else:
                    if i not in D:
                        D[i] = sympy.expand(sympy.Add(*[t * dA[i, k] for k, t in enumerate(row.terms) if t != 0]))
                    numerators[(i, j)] = sympy.expand(row.terms[j] * (dA[i, j] * row.normaliser - D[i]))
            return numerators[(i, j)]

        def entry(i: int, j: int) -> sympy.Expr:
            top = numerator(i, j)
            return top if top == 0 else top / rows[i].normaliser ** 2

        return OverZ2(rows, numerator, LazyMatrix(len(rows), dA.cols, entry))

    def hstack(self, parts):
        return _exact.hstack(*[matrix_of(p) for p in parts])

    def block(self, m, first: int, width: int):
        m = matrix_of(m)
        return LazyMatrix(m.rows, width, lambda i, j: m[i, first + j])

    def sum(self, parts):
        lazy = [matrix_of(p) for p in parts]
        if all(_exact.is_rational(m) for m in lazy):  # X + learned PE: one flint sum, and Q = X_pos·W_Q stays flint
            return _exact.rational_sum(lazy)
        total = LazyMatrix(lazy[0].rows, lazy[0].cols, lambda i, j: sympy.Add(*[m[i, j] for m in lazy]))
        if all(isinstance(p, (OverRows, OverZ2)) for p in parts):
            sums = [_over_rows(p) for p in parts]
            return OverRows(sums[0].rows, lambda i, j: _gathered(t for s in sums for t in s.tops(i, j)), total)
        return total

    def rows(self, m, first: int, count: int):
        """Rows ``first … first + count − 1`` (0-based) of ``m``; a rational matrix stays rational."""
        m = matrix_of(m)
        if _exact.is_rational(m):
            flat = [x for row in _exact.rational_rows(m)[first:first + count] for x in row]
            return _exact.rational_matrix(count, m.cols, flat)
        return LazyMatrix(count, m.cols, lambda i, j: m[first + i, j])

    def table(self, rows: list[list[int]]):
        """A matrix of whole numbers (a table of counts)."""
        return _exact.rational_matrix(len(rows), len(rows[0]), [QQ(x) for row in rows for x in row])

    def sub(self, a, b):
        a, b = matrix_of(a), matrix_of(b)
        return LazyMatrix(a.rows, a.cols, lambda i, j: _exact.tidy(a[i, j] - b[i, j]))

    def ones(self, rows: int, cols: int):
        return _exact.rational_matrix(rows, cols, [QQ(1)] * (rows * cols))

    def given(self, m):
        return m

    def is_rational(self, x) -> bool:
        return _exact.is_rational(matrix_of(x))

    # -- the online (tiled) softmax (see symattn.exact.tiled) --------------------------------------

    def tiled_max(self, z, block: int) -> Matrix:
        """The running maximum of each row after each block of keys."""
        return Matrix(_tiled.exact_maxima(matrix_of(z), block))

    def tiled_sums(self, z, m, block: int) -> Matrix:
        """The running sum ℓ of each row after each block, rescaled at each new maximum (the exact
        pass finds the running maxima ``m`` again, the same)."""
        z = matrix_of(z)
        return Matrix([r.sums for r in _tiled.exact_rows(z, Matrix.zeros(z.cols, 0), block)])

    def tiled_acc(self, z, m, v, block: int) -> Matrix:
        """Each row's accumulator Σ e^{s_j − m} v_j after the last block."""
        return Matrix([list(r.steps[-1].acc) for r in _tiled.exact_rows(matrix_of(z), matrix_of(v), block)])

    def tiled_output(self, acc, sums):
        """``acc / ℓ``: each accumulator row over its row's last running sum."""
        acc, sums = matrix_of(acc), matrix_of(sums)
        return LazyMatrix(acc.rows, acc.cols, lambda i, c: acc[i, c] / sums[i, sums.cols - 1])

    def rational(self, p: int, q: int) -> sympy.Rational:
        return sympy.Rational(p, q)

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0):
        """RoPE: row ``p`` with each pair ``pairs[i]`` turned by ``sign·(p + offset)·θ_i``, exactly."""
        from ..problem.rope import rotate

        m = matrix_of(m)
        return rotate(m, thetas, pairs, [p + offset for p in range(m.rows)], sign)


# -- numeric -----------------------------------------------------------------------------------


class NumericOps:
    """The relations' operations at ``dps`` digits. A value is a list of rows of mpmath numbers
    (−∞ for masked positions) or a rational matrix, which products read exactly (into arb)."""

    def __init__(self, dps: int, subs=None) -> None:
        self.dps = dps
        self.subs = subs

    def grid(self, x) -> Values:
        return x if isinstance(x, list) else _exact.evaluate(x, self.dps, self.subs)

    def matmul(self, a, b) -> Values:
        return _exact.mp_matmul(a, b, self.dps)

    def T(self, a):
        return [list(col) for col in zip(*a)] if isinstance(a, list) else a.T

    def add_row(self, m, row) -> Values:
        m, row = self.grid(m), self.grid(row)
        with mpmath.workdps(self.dps + 10):
            return [[x + b for x, b in zip(r, row[0])] for r in m]

    def col_sums(self, m) -> Values:
        with mpmath.workdps(self.dps + 10):
            return [[mpmath.fsum(col) for col in zip(*self.grid(m))]]

    def scale(self, a, factor) -> Values:
        a = self.grid(a)
        with mpmath.workdps(self.dps + 10):
            f = _exact.to_mpf(factor, self.dps, self.subs)
            return [[x * f for x in row] for row in a]

    def mask(self, allowed, bias) -> Values:
        b = None if bias is None else _exact.evaluate(bias, self.dps, self.subs)
        return [[(b[i][j] if b is not None else mpmath.mpf(0)) if ok else NINF for j, ok in enumerate(row)]
                for i, row in enumerate(allowed)]

    def add_mask(self, scores, mask) -> Values:
        scores, mask = self.grid(scores), self.grid(mask)
        with mpmath.workdps(self.dps + 10):
            return [[NINF if b == NINF else a + b for a, b in zip(r1, r2)] for r1, r2 in zip(scores, mask)]

    def softmax(self, z) -> Values:
        """Row by row, the maximum subtracted; a row with nothing allowed has no softmax."""
        with mpmath.workdps(self.dps + 10):
            out = []
            for row in self.grid(z):
                finite = [v for v in row if v != NINF]
                if not finite:
                    raise Undefined("a row of scores with every key masked has no softmax")
                m = max(finite)
                e = [mpmath.mpf(0) if v == NINF else mpmath.exp(v - m) for v in row]
                total = mpmath.fsum(e)
                out.append([x / total for x in e])
            return out

    def softmax_backward(self, a, dA) -> Values:
        return _exact.softmax_backward(self.grid(a), self.grid(dA), self.dps)

    def hstack(self, parts) -> Values:
        blocks = [self.grid(p) for p in parts]
        return [sum((block[i] for block in blocks), []) for i in range(len(blocks[0]))]

    def block(self, m, first: int, width: int) -> Values:
        return [row[first:first + width] for row in self.grid(m)]

    def sum(self, parts) -> Values:
        total = None
        for part in map(self.grid, parts):  # gradients, or given exact matrices (X + PE)
            with mpmath.workdps(self.dps + 10):
                total = part if total is None else [[x + y for x, y in zip(r, s)] for r, s in zip(total, part)]
        return total

    def rows(self, m, first: int, count: int) -> Values:
        return self.grid(m)[first:first + count]

    def table(self, rows: list[list[int]]) -> Values:
        return [[mpmath.mpf(x) for x in row] for row in rows]

    def sub(self, a, b) -> Values:
        a, b = self.grid(a), self.grid(b)
        with mpmath.workdps(self.dps + 10):
            return [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]

    def ones(self, rows: int, cols: int) -> Values:
        return [[mpmath.mpf(1)] * cols for _ in range(rows)]

    def given(self, m) -> Values:
        return _exact.evaluate(m, self.dps, self.subs)

    def is_rational(self, x) -> bool:
        return not isinstance(x, list) and _exact.is_rational(x)

    def rational(self, p: int, q: int) -> sympy.Rational:
        return sympy.Rational(p, q)

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0) -> Values:
        """RoPE at ``dps`` digits: row ``p`` with each pair turned by ``sign·(p + offset)·θ_i``."""
        rows = self.grid(m)
        with mpmath.workdps(self.dps + 10):
            angles = [_exact.to_mpf(t, self.dps + 10) for t in thetas]
            out = []
            for p, row in enumerate(rows):
                new = list(row)
                for (a, b), theta in zip(pairs, angles):
                    phi = sign * (p + offset) * theta
                    c, s = mpmath.cos(phi), mpmath.sin(phi)
                    new[a], new[b] = row[a] * c - row[b] * s, row[a] * s + row[b] * c
                out.append(new)
            return out

    def tiled_max(self, z, block: int, running: bool = True) -> Values:
        return _tiled.numeric_maxima(self.grid(z), block, running)

    def tiled_sums(self, z, m, block: int, rescale: bool = True) -> Values:
        return _tiled.numeric_rows(self.grid(z), self.grid(m), None, block, self.dps, rescale)[0]

    def tiled_acc(self, z, m, v, block: int, rescale: bool = True) -> Values:
        return _tiled.numeric_rows(self.grid(z), self.grid(m), self.grid(v), block, self.dps, rescale)[1]

    def tiled_output(self, acc, sums) -> Values:
        acc, sums = self.grid(acc), self.grid(sums)
        with mpmath.workdps(self.dps + 10):
            return [[x / s[-1] for x in row] for row, s in zip(acc, sums)]

    # -- for the common mistakes -----------------------------------------------------------

    def jacobian_diagonal(self, a, dA) -> Values:
        """``a_ij (1 − a_ij) dA_ij``: the softmax Jacobian's diagonal alone."""
        with mpmath.workdps(self.dps + 10):
            return [[x * (1 - x) * g for x, g in zip(ra, rg)] for ra, rg in zip(self.grid(a), self.grid(dA))]

    def zero_masked(self, a, mask) -> Values:
        """The weights with the masked positions set to 0 (and the rows not renormalised)."""
        return [[mpmath.mpf(0) if m == NINF else x for x, m in zip(r, mr)] for r, mr in zip(self.grid(a), self.grid(mask))]

    def columns_attend(self, z) -> bool:
        """Whether every column has an allowed entry (so a softmax over columns exists)."""
        return all(any(v != NINF for v in col) for col in zip(*self.grid(z)))


class ArbOps(NumericOps):
    """The relations' operations at ``dps`` digits on flint arb matrices, for a problem without
    symbols: products, sums and the softmax backward in ball arithmetic, never an mpmath number per
    entry. A value is an ``arb_mat`` or a rational matrix (read exactly). The gradients' relations
    need no −∞ (masked weights are 0), so the mask and the softmax are left to :class:`NumericOps`."""

    def __init__(self, dps: int) -> None:
        super().__init__(dps, None)
        self._transposed: dict = {}

    def grid(self, x):
        with _exact.arb_precision(self.dps):
            return _exact.arb_matrix(x, self.dps)

    def matmul(self, a, b):
        # made entry by entry (a row of a times a column of b) until needed whole
        return _exact.ArbProducts([(_exact.arb_lines(a, self.dps), _exact.arb_lines(b, self.dps))], self.dps)

    def T(self, a):
        """``aᵀ``, one per value (Xᵀ serves dW_Q, dW_K and dW_V): its rows are a's columns, read
        when a product asks for them, and it is transposed whole only if something needs that."""
        kept = self._transposed.get(id(a))
        if kept is None or kept[0] is not a:
            kept = self._transposed[id(a)] = (a, _exact.ArbTransposed(_exact.arb_lines(a, self.dps)))
        return kept[1]

    def add_row(self, m, row):
        with _exact.arb_precision(self.dps):
            m, row = _exact.arb_matrix(m, self.dps), _exact.arb_matrix(row, self.dps)
            return m + flint.arb_mat(m.nrows(), 1, [1] * m.nrows()) * row

    def col_sums(self, m):
        with _exact.arb_precision(self.dps):
            m = _exact.arb_matrix(m, self.dps)
            return flint.arb_mat(1, m.nrows(), [1] * m.nrows()) * m

    def scale(self, a, factor):
        with _exact.arb_precision(self.dps):
            return _exact.arb_matrix(a, self.dps) * _exact.arb_scalar(factor, self.dps)

    def softmax_backward(self, a, dA):
        """a ∘ (dA − rowsum(a ∘ dA)), row by row (a row with one allowed key gives exactly 0)."""
        with _exact.arb_precision(self.dps):
            a, g = _exact.arb_matrix(a, self.dps), _exact.arb_matrix(dA, self.dps)
            rows, cols = a.nrows(), a.ncols()
            out = flint.arb_mat(rows, cols)
            for i in range(rows):
                ar = [a[i, j] for j in range(cols)]
                gr = [g[i, j] for j in range(cols)]
                dot = sum((x * y for x, y in zip(ar, gr)), flint.arb(0))
                for j in range(cols):
                    out[i, j] = ar[j] * (gr[j] - dot)
            return out

    def hstack(self, parts):
        with _exact.arb_precision(self.dps):
            blocks = [_exact.arb_matrix(p, self.dps) for p in parts]
            return flint.arb_mat([[b[i, j] for b in blocks for j in range(b.ncols())] for i in range(blocks[0].nrows())])

    def block(self, m, first: int, width: int):
        with _exact.arb_precision(self.dps):
            m = _exact.arb_matrix(m, self.dps)
            return flint.arb_mat([[m[i, j] for j in range(first, first + width)] for i in range(m.nrows())])

    def sum(self, parts):
        if all(isinstance(part, _exact.ArbProducts) and part._whole is None for part in parts):
            return _exact.ArbProducts([ab for part in parts for ab in part.parts], self.dps)
        with _exact.arb_precision(self.dps):
            total = None
            for part in parts:
                part = _exact.arb_matrix(part, self.dps)
                total = part if total is None else total + part
            return total

    def sub(self, a, b):
        with _exact.arb_precision(self.dps):
            return _exact.arb_matrix(a, self.dps) - _exact.arb_matrix(b, self.dps)

    def ones(self, rows: int, cols: int):
        return flint.arb_mat(rows, cols, [1] * (rows * cols))

    def given(self, m):
        return self.grid(m)

    def is_rational(self, x) -> bool:
        return not isinstance(x, (list, flint.arb_mat)) and _exact.is_rational(x)

    def _numeric(self, name):
        raise NotImplementedError(f"{name} is left to NumericOps")

    def mask(self, allowed, bias):
        self._numeric("the mask")

    def add_mask(self, scores, mask):
        self._numeric("adding the mask")

    def softmax(self, z):
        self._numeric("the softmax")


class FloatOps(ArbOps):
    """The relations' operations in NumPy float64, for a gradient that the cross-check compares
    with another float64 computation: a value is a float64 array (a rational matrix is rounded
    once, entry by entry). Only for a problem whose values all lie well inside float64's range
    (:meth:`Derivation.approx` checks, and falls back to arb when a result is not finite)."""

    def __init__(self) -> None:
        super().__init__(30)

    def grid(self, x):
        import numpy

        if isinstance(x, numpy.ndarray):
            return x
        if isinstance(x, flint.arb_mat):
            return numpy.array(_exact.arb_floats(x), dtype=numpy.float64).reshape(x.nrows(), x.ncols())
        values = _exact.approx(x)
        if values is None:
            values = numpy.array([[float(v) for v in row] for row in NumericOps.grid(self, x)], dtype=numpy.float64)
        return values

    def matmul(self, a, b):
        return self.grid(a) @ self.grid(b)

    def T(self, a):
        return self.grid(a).T

    def add_row(self, m, row):
        return self.grid(m) + self.grid(row)

    def col_sums(self, m):
        return self.grid(m).sum(axis=0, keepdims=True)

    def scale(self, a, factor):
        return self.grid(a) * float(_exact.to_mpf(factor, 30))

    def softmax_backward(self, a, dA):
        a, g = self.grid(a), self.grid(dA)
        return a * (g - (a * g).sum(axis=1, keepdims=True))

    def hstack(self, parts):
        import numpy

        return numpy.hstack([self.grid(p) for p in parts])

    def block(self, m, first: int, width: int):
        return self.grid(m)[:, first:first + width]

    def sum(self, parts):
        total = None
        for part in parts:
            total = self.grid(part) if total is None else total + self.grid(part)
        return total

    def sub(self, a, b):
        return self.grid(a) - self.grid(b)

    def ones(self, rows: int, cols: int):
        import numpy

        return numpy.ones((rows, cols))

    def is_rational(self, x) -> bool:
        import numpy

        return not isinstance(x, (list, flint.arb_mat, numpy.ndarray)) and _exact.is_rational(x)


def arb_structure(value, dps: int):
    """A rational softmax structure's values as an arb_mat at ``dps`` digits (the weights, or the
    output ``A·V`` as one arb product); None for anything else."""
    rows = getattr(value, "rows", None)
    if not isinstance(value, (Softmax, Output)) or not all(row.rational for row in rows):
        return None
    with _exact.arb_precision(dps):
        weights = flint.arb_mat([row.arb_weights(dps) for row in rows])
        if isinstance(value, Softmax):
            return weights
        if not _exact.is_rational(value.values):
            return None
        return weights * _exact.arb_matrix(value.values, dps)


def evaluate_structure(value, dps: int, subs) -> "Values | None":
    """A softmax structure's values at ``dps`` digits, from its rows (never a large expression);
    None for anything else."""
    if isinstance(value, Softmax):
        return [row.evaluate(dps, subs) for row in value.rows]
    if isinstance(value, Output):
        fast = _exact.weights_times(value.rows, value.values, dps)
        if fast is not None:
            return fast
        weights = [row.evaluate(dps, subs) for row in value.rows]
        return _exact.mp_matmul(weights, _exact.evaluate(value.values, dps, subs), dps)
    return None
