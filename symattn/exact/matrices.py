"""Exact arithmetic for the stages: products, the structured softmax, evaluation.

Rational matrices are multiplied as QQ DomainMatrix objects: python-flint's
``fmpq_mat`` under SymPy's flint ground types (its fastest); anything with square
roots or exponentials is multiplied entry by entry in SymPy and expanded. SymPy's
private internals that this needs are in :mod:`symattn.numbers.sympy_internals`.

The softmax is kept *structured*: per row the maximum ``m_i`` and the exact
exponents ``z_ij - m_i``. Weights and outputs are built from that structure
as short expressions ``e^{z_ij - m_i} / Z_i``, and evaluated at high precision
from it, so no entry ever repeats a whole row's denominator inside a larger
expression tree.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import math
from dataclasses import dataclass
from functools import cached_property
from collections.abc import Sequence
from typing import Callable, Iterator

import flint as _flint  # exact rational matrices and ball arithmetic (a required dependency)
import mpmath
import sympy
from mpmath.libmp import from_man_exp as _from_man_exp, from_rational as _from_rational
from sympy import QQ

from ..numbers.matrices import (  # noqa: F401  (re-exported: the exact derivation's vocabulary)
    NEG_INF,
    Matrix,
    binary_float_matrix,
    is_rational,
    rational_matrix,
    scaled_integer_matrix,
    scaled_integers,
    tidy,
    tidy_trig,
)
from ..numbers.parse import keep_float64, matrix_float64, qq_float
from ..numbers.sympy_internals import (
    FLINT_QQ,
    QQMatrix,  # noqa: F401  (re-exported: symattn.exact.matrices.QQMatrix)
    flint_matrix,
    is_rational_matrix,
    matrix_from_domain,
    matrix_from_fmpq_mat,
    mul_in_order,
    qq_dense,
    sum_of_distinct,
    to_mpmath,
)

_make_mpf = mpmath.mp.make_mpf
_dm = qq_dense  # the QQ DomainMatrix of a rational matrix (dense; fmpq_mat under flint)


def rational_rows(m: Matrix) -> "list[list] | FmpqRows":
    """The entries of a rational matrix as ``QQ`` numbers (no SymPy objects), as rows: lists, or
    for flint's fmpq_mat, :class:`FmpqRows` (a renderer that shows a corner reads a corner)."""
    dense = _dm(m)
    fmpq_mat = flint_matrix(dense)
    return dense.to_list() if fmpq_mat is None else FmpqRows(fmpq_mat)


class FmpqRows(Sequence):
    """The rows of an ``fmpq_mat``, each a sequence of its fmpq entries read when asked for."""

    __slots__ = ("_dense", "_count", "_width")

    def __init__(self, dense) -> None:
        self._dense, self._count, self._width = dense, dense.nrows(), dense.ncols()

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        return _FmpqRow(self._dense, _position(i, self._count), self._width)

    def __iter__(self):
        return (_FmpqRow(self._dense, i, self._width) for i in range(self._count))


class MadeRows(Sequence):
    """Rows made by ``row(i)`` each time they are read, not kept: the mask and the masked scores
    of a long context hold n² entries that are read a few times, row by row."""

    __slots__ = ("_row", "_count")

    def __init__(self, count: int, row: Callable[[int], list]) -> None:
        self._count, self._row = count, row

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        return self._row(_position(i, self._count))

    def __iter__(self):
        return (self._row(i) for i in range(self._count))


MADE_ROWS_FROM = 1 << 16  # entries from which the mask and the masked scores make their rows when read


def _rows(count: int, cols: int, row: Callable[[int], list]):
    """The rows ``row(0..count-1)``: a list of them, or for a big matrix, made when read."""
    if count * cols >= MADE_ROWS_FROM:
        return MadeRows(count, row)
    return [row(i) for i in range(count)]


def _position(k: int, n: int) -> int:
    """Index ``k`` of a sequence of length ``n`` (negative from the end), as a list reads it."""
    at = k + n if k < 0 else k
    if not 0 <= at < n:
        raise IndexError(k)
    return at


class _FmpqRow(Sequence):
    __slots__ = ("_dense", "_i", "_width")

    def __init__(self, dense, i: int, cols: int) -> None:
        self._dense, self._i, self._width = dense, i, cols

    def __len__(self) -> int:
        return self._width

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(self._width))]
        return self._dense[self._i, _position(j, self._width)]

    def __iter__(self):
        dense, i = self._dense, self._i
        return (dense[i, j] for j in range(self._width))


def all_integers(m) -> bool:
    """Whether every entry of a rational matrix is an integer (read from its common denominator)."""
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


def hstack(*parts) -> "LazyMatrix | Matrix":
    """Matrices side by side (lazy when any part is lazy)."""
    if not any(isinstance(p, LazyMatrix) for p in parts):
        return Matrix.hstack(*parts)
    starts, col = [], 0
    for part in parts:
        starts.append(col)
        col += part.cols

    def entry(i: int, j: int) -> sympy.Expr:
        h = bisect.bisect_right(starts, j) - 1  # the part holding column j (a concat of many heads)
        return parts[h][i, j - starts[h]]

    return LazyMatrix(parts[0].rows, col, entry)


def rational_sum(parts) -> Matrix:
    """The sum of rational matrices of one shape, exactly (by flint where it holds them)."""
    total = _dm(parts[0])
    for m in parts[1:]:
        total = total + _dm(m)
    return matrix_from_domain(total)


def matmul(a, b) -> "Matrix | LazyMatrix":
    """The exact product ``a·b``."""
    assert a.cols == b.rows, (a.shape, b.shape)
    if is_rational(a) and is_rational(b):
        return matrix_from_domain(_dm(a) * _dm(b))

    def entry(i: int, j: int) -> sympy.Expr:
        return tidy_trig(tidy(sympy.Add(*[a[i, k] * b[k, j] for k in range(a.cols)])))

    if isinstance(a, LazyMatrix) or isinstance(b, LazyMatrix):
        return LazyMatrix(a.rows, b.cols, entry)
    return Matrix(a.rows, b.cols, entry)


def add_row(m, row) -> "Matrix | LazyMatrix":
    """``m`` with the 1 × cols matrix ``row`` added to every row (a projection's bias); rational
    stays rational."""
    assert row.rows == 1 and row.cols == m.cols, (m.shape, row.shape)
    if is_rational(m) and is_rational(row):
        ones = rational_matrix(m.rows, 1, [QQ(1)] * m.rows)
        return matrix_from_domain(_dm(m) + _dm(ones) * _dm(row))

    def entry(i: int, j: int) -> sympy.Expr:
        return tidy(m[i, j] + row[0, j])

    if isinstance(m, LazyMatrix):
        return LazyMatrix(m.rows, m.cols, entry)
    return Matrix(m.rows, m.cols, entry)


def transpose(m):
    """``mᵀ``; a rational matrix held as flint's fmpq_mat is transposed by flint (SymPy's own
    transpose goes through its sparse form, entry by entry)."""
    dense = fmpq_matrix(m)
    if dense is None:
        return m.T
    return matrix_from_fmpq_mat(dense.transpose())


def scale(m: Matrix, factor: sympy.Expr) -> Matrix:
    if is_rational(m) and factor.is_Rational:
        return matrix_from_domain(_dm(m) * QQ(int(factor.p), int(factor.q)))
    return m.applyfunc(lambda x: tidy(x * factor))


def _qq(x: sympy.Expr):
    """``x`` as a QQ number, or None when it is not rational."""
    return QQ(int(x.p), int(x.q)) if isinstance(x, sympy.Rational) else None


def mask_matrix(allowed, bias) -> LazyMatrix:
    """``M``: 0 where a query may attend, −∞ where it may not, plus the bias if any."""
    n_q, n_k = len(allowed), len(allowed[0])

    def entry(i: int, j: int) -> sympy.Expr:
        if not allowed[i][j]:
            return NEG_INF
        return bias[i, j] if bias is not None else sympy.Integer(0)

    if bias is None:
        zero = QQ(0)  # one number for every allowed position (a causal mask has n²/2 of them)
        qq = _rows(n_q, n_k, lambda i: [zero if ok else None for ok in allowed[i]])
    else:
        b = [[bias[i, j] for j in range(n_k)] for i in range(n_q)]
        qq = [[None if (not ok or x == NEG_INF) else _qq(x) for ok, x in zip(row, brow)]
              for row, brow in zip(allowed, b)]
        if any(x is None and ok and brow_x != NEG_INF
               for row, qrow, brow in zip(allowed, qq, b) for ok, x, brow_x in zip(row, qrow, brow)):
            qq = None  # an irrational or symbolic bias
    return LazyMatrix(n_q, n_k, entry, qq)


def add_mask(scores: Matrix, mask: LazyMatrix) -> LazyMatrix:
    """``scores + mask`` where a −∞ in the mask stays −∞ (never 0·∞ or ∞ − ∞)."""

    def entry(i: int, j: int) -> sympy.Expr:
        m = mask[i, j]
        return NEG_INF if m == NEG_INF else tidy(scores[i, j] + m)

    qq = None
    if mask.qq_rows is not None and is_rational(scores):
        score_rows, mask_rows = rational_rows(scores), mask.qq_rows
        qq = _rows(scores.rows, scores.cols,
                   lambda i: [None if b is None else s + b for s, b in zip(score_rows[i], mask_rows[i])])
    return LazyMatrix(scores.rows, scores.cols, entry, qq)


def to_mpf(x: sympy.Expr, dps: int, subs=None) -> mpmath.mpf:
    """``x`` as an mpmath number good to ``dps`` digits (−∞ stays −∞); ``subs`` gives the symbols' values."""
    if subs and x.free_symbols:
        x = x.xreplace(subs)
    if x == NEG_INF:
        return mpmath.ninf
    if isinstance(x, sympy.Integer):
        return mpmath.mpf(int(x))
    if isinstance(x, sympy.Rational):
        return mpmath.mpf(int(x.p)) / int(x.q)
    value = sympy.N(x, dps + 10)
    return mpmath.mpf(to_mpmath(value, mpmath.mp.prec + 40))


def mpf_of_qq(x, prec: int | None = None) -> mpmath.mpf:
    """The rational ``x`` correctly rounded to ``prec`` bits (default: mpmath's working precision)."""
    return _make_mpf(_from_rational(int(x.numerator), int(x.denominator), prec or mpmath.mp.prec, "n"))


def evaluate(m, dps: int, subs=None) -> list[list[mpmath.mpf]]:
    """The entries of ``m`` at ``dps`` digits (from the rationals directly when it has them)."""
    with mpmath.workdps(dps + 10):
        qq = qq_entries(m)
        if qq is not None:
            return [[mpmath.ninf if x is None else mpf_of_qq(x) for x in row] for row in qq]
        return [[to_mpf(m[i, j], dps, subs) for j in range(m.cols)] for i in range(m.rows)]


def approx(m) -> "numpy.ndarray | None":
    """The entries of a rational matrix as correctly rounded float64 (−∞ kept), or None when
    ``m`` is not rational. Entries beyond float64's range become NaN."""
    import numpy

    values = matrix_float64(m)
    if values is not None:
        return values
    qq = getattr(m, "qq_rows", None)
    if qq is None:
        return None
    out = numpy.empty((m.rows, m.cols), dtype=numpy.float64)
    for i, row in enumerate(qq):  # row by row: no list of n² Python floats at once
        out[i] = [_NEG_INF_FLOAT if x is None else qq_float(x) for x in row]
    return out


_NEG_INF_FLOAT = float("-inf")


# -- high-precision evaluation ------------------------------------------------------------


def _prec(dps: int) -> int:
    return int((dps + 10) * 3.33) + 10


@contextlib.contextmanager
def _arb_precision(dps: int):
    """flint's working precision for ``dps`` digits (with guard bits), restored afterwards."""
    old = _flint.ctx.prec
    _flint.ctx.prec = _prec(dps)
    try:
        yield
    finally:
        _flint.ctx.prec = old


def _arb_to_mpf(x) -> mpmath.mpf:
    """The midpoint of an arb ball, exactly (it has at most the working precision's bits)."""
    man, exp = x.mid().man_exp()
    return _make_mpf(_from_man_exp(int(man), int(exp)))  # exact: no rounding to mpmath's precision


def _fmpq(x):
    """A QQ number as flint's fmpq (it is one already under SymPy's flint ground types)."""
    return x if type(x) is _flint.fmpq else _flint.fmpq(int(x.numerator), int(x.denominator))


def arb_float(x) -> float:
    """The midpoint of an arb ball rounded to the nearest float64 (NaN beyond its range): its
    mantissa rounded to 53 bits, then scaled (below 2^−1022, a second rounding).

    In float64's normal range that is flint's own rounding (``float(arb)``, a tenth of the time)."""
    value = float(x)
    if _SMALLEST_NORMAL <= abs(value) < math.inf or (value == 0 and x.is_zero()):
        return value
    man, exp = x.mid().man_exp()
    try:
        return math.ldexp(float(int(man)), int(exp))  # the only rounding: the mantissa to 53 bits
    except OverflowError:
        return math.nan


_SMALLEST_NORMAL = 2.0**-1022


def weights_times(rows: "tuple[SoftmaxRow, ...]", values: Matrix, dps: int, convert=None) -> "list[list] | None":
    """``A·V`` at ``dps`` digits straight from rational softmax rows and a rational ``V`` (one arb
    matrix product), as mpmath numbers (or ``convert(arb)``), or None when either is not
    rational."""
    if not is_rational(values) or not all(row.rational for row in rows):
        return None
    convert = convert or _arb_to_mpf
    with _arb_precision(dps):
        product = _flint.arb_mat([row.arb_weights(dps) for row in rows]) * _arb_operand(values)
        return [[convert(product[i, j]) for j in range(product.ncols())] for i in range(product.nrows())]


def weighted_value(row: "SoftmaxRow", column: list, dps: int) -> "mpmath.mpf | None":
    """``Σ_k a_ik v_k`` at ``dps`` digits for a rational row and rational values (QQ), from the
    row's arb weights; None when the row is not rational."""
    if not row.rational:
        return None
    with _arb_precision(dps):
        total = _flint.arb(0)
        for w, v in zip(row.arb_weights(dps), column):
            if v:
                total += w * _fmpq(v)
        return _arb_to_mpf(total)


_FLOAT_BLOCK = 64  # rows of weights held as arb balls at a time by softmax_floats
# Below this many weights the rows keep them (the backward pass and the decimals shown read them again).
KEEP_WEIGHTS_BELOW = 1 << 16


def softmax_floats(rows: "tuple[SoftmaxRow, ...]", values, dps: int):
    """``(A, A·V)`` as float64 arrays, each entry rounded from its ``dps``-digit arb value, for
    rational softmax rows and (when ``values`` is not None) a rational ``V``: the values of
    :meth:`SoftmaxRow.arb_weights` and :func:`weights_times`, made in one pass over blocks of
    rows, so that at most a block's weights are arb balls at a time and no row keeps them
    (unless the problem is small: see ``KEEP_WEIGHTS_BELOW``). ``A·V`` is None when ``values`` is None or not rational; the whole is None when a row is
    not rational. Kept with the rows: the weights and the output ask in turn."""
    import numpy

    if not rows or not all(row.rational for row in rows):
        return None
    if values is not None and not is_rational(values):
        values = None
    kept = rows[0].__dict__.setdefault("_floats", {})
    found = kept.get(dps)
    if found is not None and found[0] is rows and (values is None or found[1] is values):
        return found[2], None if values is None else found[3]
    n, width = len(rows), len(rows[0].raw)
    keep = n * width < KEEP_WEIGHTS_BELOW
    weights = numpy.zeros((n, width))
    product = None
    with _arb_precision(dps):
        v = None
        if values is not None:
            whole = _arb_operand(values)
            v = [[whole[k, c] for c in range(whole.ncols())] for k in range(whole.nrows())]
            product = numpy.empty((n, whole.ncols()))
        for start in range(0, n, _FLOAT_BLOCK):
            block, lo, hi = [], width, 0
            for i in range(start, min(n, start + _FLOAT_BLOCK)):
                if keep:  # a small problem: the rows keep their weights for the worked solution
                    every = rows[i].arb_weights(dps)
                    positions = [k for k, e in enumerate(rows[i].raw) if e is not None]
                    balls = [every[k] for k in positions]
                else:
                    positions, balls = rows[i].allowed_weights(dps)
                weights[i, positions] = _balls_float(balls)
                block.append((positions, balls))
                lo, hi = min(lo, positions[0]), max(hi, positions[-1] + 1)
            if v is not None:  # only the keys some row of the block attends to (a causal block: those up to its last row)
                grid = []
                for positions, balls in block:
                    line = [0] * (hi - lo)
                    for k, ball in zip(positions, balls):
                        line[k - lo] = ball
                    grid.append(line)
                part = _flint.arb_mat(grid) * _flint.arb_mat(v[lo:hi])
                for r in range(part.nrows()):
                    product[start + r] = _balls_float([part[r, c] for c in range(part.ncols())])
    kept[dps] = (rows, values, weights, product)
    return weights, product


def _balls_float(balls: list) -> list[float]:
    """:func:`arb_float` of each ball, flint's own rounding where it is the same."""
    out = [float(x) for x in balls]
    for k, value in enumerate(out):
        if not (_SMALLEST_NORMAL <= abs(value) < math.inf) and not (value == 0 and balls[k].is_zero()):
            out[k] = arb_float(balls[k])
    return out


def operand(m, dps: int, subs=None):
    """``m`` ready for :func:`mp_matmul`: a rational matrix as it is (read straight into arb),
    anything else evaluated at ``dps`` digits."""
    return m if is_rational(m) else evaluate(m, dps, subs)


def _arb_operand(x):
    """An arb matrix of mpmath rows, or of a rational matrix's own fmpq entries."""
    if isinstance(x, list):
        return _flint.arb_mat(x)
    dense = _dm(x)
    fmpq_mat = flint_matrix(dense)
    if fmpq_mat is not None:
        return _flint.arb_mat(fmpq_mat)
    return _flint.arb_mat([[_fmpq(v) for v in row] for row in dense.to_list()])


class ArbLines:
    """A matrix whose rows and columns a product reads one at a time, as 1×K and K×1 arb_mats
    (each read once and kept): a rational matrix read straight from its fmpq entries, or an
    arb_mat. :meth:`whole` makes (and keeps) the arb_mat of all of it, for whoever needs that.
    A worked solution shows a corner of the backward pass's last products (dW_Q = Xᵀ dQ, dX =
    Σ dQ W_Qᵀ ...): their entries then read a few rows and columns of X and the weights, not the
    whole matrices."""

    def __init__(self, m, dps: int) -> None:
        self.dps = dps
        if isinstance(m, _flint.arb_mat):
            self._source = self._whole = m
        else:
            rational = flint_matrix(_dm(m)) if is_rational(m) else None  # an fmpq_mat under flint
            if rational is not None:
                self._source, self._whole = rational, None
            else:
                with _arb_precision(dps):  # read at dps digits, not flint's 53-bit default
                    self._source = self._whole = arb_matrix(m, dps)
        self._shape = (self._source.nrows(), self._source.ncols())
        self._row_of: dict[int, object] = {}
        self._col_of: dict[int, object] = {}

    def nrows(self) -> int:
        return self._shape[0]

    def ncols(self) -> int:
        return self._shape[1]

    def row(self, i: int):
        got = self._row_of.get(i)
        if got is None:
            m = self._source
            with _arb_precision(self.dps):
                got = self._row_of[i] = _flint.arb_mat([[m[i, k] for k in range(self._shape[1])]])
        return got

    def col(self, j: int):
        got = self._col_of.get(j)
        if got is None:
            m = self._source
            with _arb_precision(self.dps):
                got = self._col_of[j] = _flint.arb_mat([[m[k, j]] for k in range(self._shape[0])])
        return got

    def whole(self):
        if self._whole is None:
            with _arb_precision(self.dps):
                self._whole = _flint.arb_mat(self._source)
        return self._whole


class ArbTransposed:
    """The transpose of an :class:`ArbLines` or :class:`ArbProducts`: its rows are the other's
    columns, so nothing is transposed until it is needed whole."""

    def __init__(self, m) -> None:
        self.m = m
        self._whole = None

    def nrows(self) -> int:
        return self.m.ncols()

    def ncols(self) -> int:
        return self.m.nrows()

    def row(self, i: int):
        return self.m.col(i).transpose()

    def col(self, j: int):
        return self.m.row(j).transpose()

    def whole(self):
        if self._whole is None:
            self._whole = self.m.whole().transpose()
        return self._whole


class ArbProducts:
    """``Σ a·b`` over :class:`ArbLines` (or products, or transposes), made entry by entry until it
    is needed whole: the backward pass's last products (dW_Q = Xᵀ dQ, dX = Σ dQ W_Qᵀ ...) feed
    nothing after them, and a worked solution shows their corners. An entry is one dot product of
    a row and a column per part; a row (column) of a product is a row (column) of its left (right)
    factor times the other factor whole. :meth:`whole` makes (and keeps) the arb_mat."""

    def __init__(self, parts: list, dps: int) -> None:
        self.parts, self.dps = parts, dps
        self._whole = None
        self._row_of: dict[int, object] = {}
        self._col_of: dict[int, object] = {}

    def nrows(self) -> int:
        return self.parts[0][0].nrows()

    def ncols(self) -> int:
        return self.parts[0][1].ncols()

    def __getitem__(self, key):
        if self._whole is not None:
            return self._whole[key]
        i, j = key
        with _arb_precision(self.dps):
            if i in self._row_of:
                return self._row_of[i][0, j]
            if j in self._col_of:
                return self._col_of[j][i, 0]
            total = _flint.arb(0)
            for a, b in self.parts:
                total += (a.row(i) * b.col(j))[0, 0]
            return total

    def row(self, i: int):
        got = self._row_of.get(i)
        if got is None:
            with _arb_precision(self.dps):
                got = self._row_of[i] = _arb_sum(a.row(i) * b.whole() for a, b in self.parts)
        return got

    def col(self, j: int):
        got = self._col_of.get(j)
        if got is None:
            with _arb_precision(self.dps):
                got = self._col_of[j] = _arb_sum(a.whole() * b.col(j) for a, b in self.parts)
        return got

    def whole(self):
        if self._whole is None:
            with _arb_precision(self.dps):
                self._whole = _arb_sum(a.whole() * b.whole() for a, b in self.parts)
        return self._whole


def _arb_sum(terms):
    total = None
    for term in terms:
        total = term if total is None else total + term
    return total


def arb_lines(x, dps: int):
    """``x`` as something a product reads a row or a column at a time (see :class:`ArbLines`)."""
    return x if isinstance(x, _LAZY_ARB) else ArbLines(x, dps)


_LAZY_ARB = (ArbLines, ArbTransposed, ArbProducts)  # what arb_matrix makes whole and arb_lines keeps


def arb_matrix(x, dps: int):
    """``x`` as flint's arb_mat at ``dps`` digits (call it under :func:`arb_precision`): an arb_mat as
    it is, a rational matrix (or a lazy one with rational entries) read exactly, rows of mpmath
    numbers exactly, anything else evaluated at ``dps`` digits first."""
    if isinstance(x, _flint.arb_mat):
        return x
    if isinstance(x, _LAZY_ARB):
        return x.whole()
    if is_rational(x):
        return _arb_operand(x)
    if not isinstance(x, list):
        qq = qq_entries(x)
        if qq is not None and all(v is not None for row in qq for v in row):
            return _flint.arb_mat([[_fmpq(v) for v in row] for row in qq])
        x = evaluate(x, dps)
    return _flint.arb_mat(x) if x and x[0] else _flint.arb_mat(len(x), len(x[0]) if x else 0)


def arb_scalar(x: sympy.Expr, dps: int):
    """The number ``x`` as an arb ball (a rational exactly; else its ``dps``-digit value)."""
    if isinstance(x, sympy.Rational):
        return _flint.arb(_flint.fmpq(int(x.p), int(x.q)))
    with mpmath.workdps(dps + 10):
        return _flint.arb(to_mpf(x, dps))


def arb_rows(m) -> list[list[mpmath.mpf]]:
    """The midpoints of an arb_mat as rows of mpmath numbers (exactly)."""
    m = m.whole() if isinstance(m, ArbProducts) else m
    return [[_arb_to_mpf(m[i, j]) for j in range(m.ncols())] for i in range(m.nrows())]


def arb_rows_entry(m, i: int, j: int) -> mpmath.mpf:
    """Entry (i, j) of an arb_mat as :func:`arb_rows` gives it."""
    return _arb_to_mpf(m[i, j])


def arb_floats(m) -> list[list[float]]:
    """The midpoints of an arb_mat rounded to float64 (see :func:`arb_float`)."""
    m = m.whole() if isinstance(m, ArbProducts) else m
    return [[arb_float(m[i, j]) for j in range(m.ncols())] for i in range(m.nrows())]


arb_precision = _arb_precision


def mp_matmul(a, b, dps: int) -> list[list[mpmath.mpf]]:
    """The product of two matrices at ``dps`` digits (with arb unless ``b`` has an infinite entry):
    each is a list of rows of mpmath numbers, or a rational matrix (see :func:`operand`)."""
    if not isinstance(b, list) or not any(mpmath.isinf(x) for row in b for x in row):
        with _arb_precision(dps):
            product = _arb_operand(a) * _arb_operand(b)
            return [[_arb_to_mpf(product[i, j]) for j in range(product.ncols())] for i in range(product.nrows())]
    a, b = (x if isinstance(x, list) else evaluate(x, dps) for x in (a, b))
    with mpmath.workdps(dps + 10):
        return [[mpmath.fsum(x * row_b[j] for x, row_b in zip(row, b)) for j in range(len(b[0]))] for row in a]


def row_max(values: list[sympy.Expr], dps: int = 50) -> sympy.Expr:
    """The exact maximum of finite exact reals (the −∞ entries are skipped)."""
    finite = [v for v in values if v != NEG_INF]
    assert finite, "a fully masked row must be rejected before the softmax"
    best = finite[0]
    with mpmath.workdps(dps):
        best_val = to_mpf(best, dps)
        for v in finite[1:]:
            if v == best:
                continue
            val = to_mpf(v, dps)
            if val > best_val:
                best, best_val = v, val
    return best


# SymPy writes e^(c·log b) as the exact power b^c: a score such as 10^20·log 2 would become
# 2^(10^20). A power beyond this many bits (about 1,200 digits) is refused instead.
MAX_EXP_POWER_BITS = 4000


def _exp(e: sympy.Expr) -> sympy.Expr:
    """``e^e`` as SymPy writes it, refused when SymPy would turn it into a huge exact power."""
    _check_exponent(e)
    return sympy.exp(e)


def _check_exponent(e: sympy.Expr) -> None:
    """Refuse an exponent ``c·log b + ...`` that SymPy would write as an exact power b^c of more
    than :data:`MAX_EXP_POWER_BITS` bits."""
    size = 0
    for term in sympy.Add.make_args(e):
        coeff, rest = term.as_coeff_Mul()
        if isinstance(rest, sympy.log) and rest.args[0].is_Rational and coeff.is_Rational:
            base = rest.args[0]
            size += max(int(base.p).bit_length(), int(base.q).bit_length()) * abs(coeff)
    if size > MAX_EXP_POWER_BITS:
        from ..errors import SymattnError

        raise SymattnError(
            f"the softmax needs e^({sympy.sstr(e)[:60]}), which is an exact power of more than "
            f"{MAX_EXP_POWER_BITS:,} bits; use smaller scores (smaller entries in Q and K, or a logarithm "
            "with a smaller factor)"
        )


@dataclass(frozen=True)
class SoftmaxRow:
    """One row of the softmax, kept as structure.

    ``exponents[j]`` is ``z_ij - m_i`` (exact, ≤ 0), or ``None`` where the
    position is masked (its weight is exactly 0). ``raw`` holds the exponents
    as built: ``QQ`` numbers when the row is rational (converted to SymPy only
    when shown), SymPy expressions otherwise.
    """

    maximum: sympy.Expr
    raw: tuple
    is_max: bool = True  # False for a symbolic row, normalised by its first allowed score

    @cached_property
    def rational(self) -> bool:
        return all(e is None or not isinstance(e, sympy.Basic) for e in self.raw)

    @cached_property
    def exponents(self) -> tuple[sympy.Expr | None, ...]:
        if not self.rational:
            return self.raw
        return tuple(None if e is None else sympy.Rational(int(e.numerator), int(e.denominator)) for e in self.raw)

    @cached_property
    def terms(self) -> tuple[sympy.Expr, ...]:
        """``e^{z_ij - m_i}`` for each position (0 where masked)."""
        return tuple(sympy.Integer(0) if e is None else _exp(e) for e in self.exponents)

    @cached_property
    def normaliser(self) -> sympy.Expr:
        """``Z_i = Σ_j e^{z_ij - m_i}`` (like terms collected)."""
        if self.rational:  # collected in QQ first: SymPy only orders the distinct terms
            return sum_of_distinct([self._term(c, e) for c, e in self.numerator_parts()])
        return sympy.Add(*self.terms)

    @cached_property
    def normaliser_is_number(self) -> bool:
        """Whether ``Z_i`` is a plain number: every allowed exponent is 0 (a sum of exponentials
        of distinct rationals, not all 0, is transcendental)."""
        if self.rational:
            return all(e is None or e == 0 for e in self.raw)
        return self.normaliser.is_Rational

    def numerator_parts(self, column=None) -> list:
        """``Σ_j e^{z_ij - m_i} v_j`` of a rational row and rational values ``column`` (all 1 when
        None: ``Z_i`` itself) as ``(coefficient, exponent)`` pairs in QQ: like exponents collected,
        zero terms dropped, the largest exponent first. No SymPy expression is built."""
        parts = []
        for e, positions in self._exponent_groups:
            c = len(positions) if column is None else sum(column[k] for k in positions)
            if c:
                parts.append((QQ(c), e))
        return parts

    def _term(self, c, e) -> sympy.Expr:
        """``c·e^e`` for QQ numbers, as SymPy builds the product (the exponential made once per row)."""
        c = _rational(int(c.numerator), int(c.denominator))
        if e == 0:
            return c
        power = self._powers[e]
        # The product SymPy would build (coefficient first), without its flattening pass.
        return power if c == 1 else mul_in_order(c, power)

    @cached_property
    def _powers(self) -> dict:
        return {e: self.terms[positions[0]] for e, positions in self._exponent_groups}

    @cached_property
    def _exponent_groups(self) -> list:
        """The allowed positions grouped by equal exponent, the largest exponent first."""
        assert self.rational
        groups: dict = {}
        for k, e in enumerate(self.raw):
            if e is not None:
                groups.setdefault(e, []).append(k)
        return sorted(groups.items(), key=lambda group: group[0], reverse=True)

    @cached_property
    def _over_normaliser(self):
        """``x ↦ x / Z_i``. For a rational row with Z_i not a number, ``Z_i^{-1}`` is made once,
        unevaluated: Z_i is then 1 plus exponentials of distinct rationals with positive
        coefficients, which SymPy's evaluation of the power leaves as it is, after asking each
        exponential whether it is algebraic (most of a small derivation's time)."""
        if not self.rational or self.normaliser_is_number:
            return lambda x: x / self.normaliser
        inverse = sympy.Pow(self.normaliser, -1, evaluate=False)
        return lambda x: sympy.Mul(x, inverse)

    def weight(self, j: int) -> sympy.Expr:
        if self.raw[j] is None:
            return sympy.Integer(0)
        return self._over_normaliser(self.terms[j])

    def weighted_numerator(self, column: list[sympy.Expr]) -> sympy.Expr:
        """``Z_i · Σ_j a_ij v_j = Σ_j e^{z_ij - m_i} v_j`` (like terms collected)."""
        if self.rational and all(isinstance(v, sympy.Rational) for v in column):
            # Like terms collected in QQ first: SymPy only orders the distinct terms.
            qq = [QQ(int(v.p), int(v.q)) for v in column]
            return sum_of_distinct([self._term(c, e) for c, e in self.numerator_parts(qq)])
        numerator = sympy.Add(*[t * v for t, v in zip(self.terms, column) if t != 0])
        # Rational values collect by themselves; sums such as 1 + √2 need expanding.
        return sympy.expand(numerator) if any(v.is_Add for v in column) else numerator

    def weighted_sum(self, column: list[sympy.Expr]) -> sympy.Expr:
        """``Σ_j a_ij v_j`` as one fraction over ``Z_i``."""
        return self._over_normaliser(self.weighted_numerator(column))

    def _exps(self, dps: int, subs) -> list:
        """``e^{z_ij - m_i}`` at ``dps`` digits (0 where masked): arb balls or mpmath numbers."""
        if self.rational:
            return [_flint.arb(0) if e is None else _flint.arb(_fmpq(e)).exp() for e in self.raw]
        return [mpmath.mpf(0) if e is None else mpmath.exp(to_mpf(e, dps, subs)) for e in self.exponents]

    def evaluate_normaliser(self, dps: int, subs=None) -> mpmath.mpf:
        """``Z_i`` at ``dps`` digits."""
        return self.evaluate_with_normaliser(dps, subs)[1]

    def evaluate(self, dps: int, subs=None) -> list[mpmath.mpf]:
        """The weights at ``dps`` digits, straight from the exponents."""
        return self.evaluate_with_normaliser(dps, subs)[0]

    def evaluate_with_normaliser(self, dps: int, subs=None) -> tuple[list[mpmath.mpf], mpmath.mpf]:
        cache = self.__dict__.setdefault("_values", {})
        key = (dps, tuple(sorted(subs.items(), key=str)) if subs else None)
        if key not in cache:
            cache[key] = self._evaluate(dps, subs)
        return cache[key]

    def arb_weights(self, dps: int, keep: bool = True) -> list:
        """The weights as arb balls at ``dps`` digits (a rational row); kept for the next call
        unless ``keep`` is False (then only read from what an earlier call kept)."""
        cache = self.__dict__.setdefault("_arb", {})
        if dps in cache:
            return cache[dps][0]
        with _arb_precision(dps):
            exps = self._exps(dps, None)
            total = sum(exps, _flint.arb(0))
            found = ([e / total for e in exps], total)
        if keep:
            cache[dps] = found
        return found[0]

    def allowed_weights(self, dps: int) -> tuple[list[int], list]:
        """The positions a rational row attends to and their weights there, as arb balls at ``dps``
        digits (the same balls as :meth:`arb_weights`; not kept)."""
        positions = [k for k, e in enumerate(self.raw) if e is not None]
        with _arb_precision(dps):
            exps = [_flint.arb(_fmpq(self.raw[k])).exp() for k in positions]
            total = sum(exps, _flint.arb(0))
            return positions, [e / total for e in exps]

    def _evaluate(self, dps: int, subs) -> tuple[list[mpmath.mpf], mpmath.mpf]:
        if self.rational:
            weights = self.arb_weights(dps)
            return [_arb_to_mpf(w) for w in weights], _arb_to_mpf(self.__dict__["_arb"][dps][1])
        with mpmath.workdps(dps + 10):
            exps = self._exps(dps, subs)
            total = mpmath.fsum(e for e, x in zip(exps, self.raw) if x is not None)
            return [mpmath.mpf(0) if x is None else e / total for e, x in zip(exps, self.raw)], total


@functools.lru_cache(maxsize=65536)  # the values of V come back in every row's sums
def _rational(p: int, q: int) -> sympy.Rational:
    return sympy.Rational(p, q)


def softmax_backward(A: list[list[mpmath.mpf]], dA: list[list[mpmath.mpf]], dps: int) -> list[list[mpmath.mpf]]:
    """Back through the softmax, row by row: a ∘ (dA − dA·a), at ``dps`` digits.

    The working precision covers every bit of the inputs (arb gives them ``_prec(dps)`` bits),
    so a row with one allowed key, a = (1, 0, …), gives exactly 0, as its exact value is."""
    with mpmath.workprec(_prec(dps) + 20):
        out = []
        for a, g in zip(A, dA):
            dot = mpmath.fsum(x * y for x, y in zip(a, g))
            out.append([x * (y - dot) for x, y in zip(a, g)])
        return out


def softmax_rows(masked) -> tuple[SoftmaxRow, ...]:
    qq = getattr(masked, "qq_rows", None)
    if qq is not None:  # rational scores: the maximum and the exponents in exact QQ arithmetic
        rows = []
        for values in qq:
            m = max(v for v in values if v is not None)
            rows.append(SoftmaxRow(sympy.Rational(int(m.numerator), int(m.denominator)),
                                   tuple(None if v is None else v - m for v in values)))
        return tuple(rows)
    rows = []
    for i in range(masked.rows):
        values = [masked[i, j] for j in range(masked.cols)]
        finite = [v for v in values if v != NEG_INF]
        symbolic = any(v.free_symbols for v in finite)
        # The maximum keeps exponents ≤ 0; with symbols it cannot be picked, and the first
        # allowed score serves (any reference cancels in the quotient).
        m = finite[0] if symbolic else row_max(values)
        exponents = tuple(None if v == NEG_INF else tidy(v - m) for v in values)
        for e in exponents:
            if e is not None:
                _check_exponent(e)  # now, while the derivation runs, not when the row is first shown
        rows.append(SoftmaxRow(m, exponents, is_max=not symbolic))
    return tuple(rows)
