"""Exact values in flint's ball arithmetic (arb) at a number of digits, and arb matrices read a row
or a column at a time: the backward pass's products, made entry by entry until needed whole.

A rational matrix is read into arb exactly, from its fmpq entries; anything else is evaluated at
the digits asked for first (:mod:`symattn.exact.evaluation`).
"""

from __future__ import annotations

import contextlib
import math

import flint as _flint  # exact rational matrices and ball arithmetic (a required dependency)
import mpmath
import sympy
from mpmath.libmp import from_man_exp as _from_man_exp

from ..numbers.dyadic import exact_floats, integer_product
from ..numbers.matrices import is_rational
from ..numbers.sympy_internals import flint_matrix, qq_dense
from .certified import arb_to_mpf, certified
from .evaluation import evaluate, to_mpf
from .lazy import qq_entries

_make_mpf = mpmath.mp.make_mpf
_dm = qq_dense  # the QQ DomainMatrix of a rational matrix (dense; fmpq_mat under flint)


def prec_bits(dps: int) -> int:
    """The bits of working precision for ``dps`` digits (with guard bits)."""
    return int((dps + 10) * 3.33) + 10


@contextlib.contextmanager
def arb_precision(dps: int):
    """flint's working precision for ``dps`` digits (with guard bits), restored afterwards."""
    old = _flint.ctx.prec
    _flint.ctx.prec = prec_bits(dps)
    try:
        yield
    finally:
        _flint.ctx.prec = old


def fmpq(x):
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


def balls_float(balls: list) -> list[float]:
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


def arb_operand(x):
    """An arb matrix of mpmath rows, or of a rational matrix's own fmpq entries."""
    if isinstance(x, list):
        return _flint.arb_mat(x)
    dense = _dm(x)
    fmpq_mat = flint_matrix(dense)
    if fmpq_mat is not None:
        return _flint.arb_mat(fmpq_mat)
    return _flint.arb_mat([[fmpq(v) for v in row] for row in dense.to_list()])


class ArbLines:
    """A matrix whose rows and columns a product reads one at a time, as 1×K and K×1 arb_mats
    (each read once and kept): a rational matrix read straight from its fmpq entries, or an
    arb_mat. :meth:`whole` makes (and keeps) the arb_mat of all of it, for whoever needs that.
    A worked solution shows a corner of the backward pass's last products (dW_Q = Xᵀ dQ, dX =
    Σ dQ W_Qᵀ ...): their entries then read a few rows and columns of X and the weights, not the
    whole matrices."""

    def __init__(self, m, dps: int) -> None:
        self.dps = dps
        self.floats = None  # a big matrix of binary floats: its float64 array (see big_floats)
        if isinstance(m, _flint.arb_mat):
            self._source = self._whole = m
        elif (floats := big_floats(m)) is not None:
            # read from its floats, each exactly (no fmpq_mat made): products by it are made in
            # float64 slices (ball_float_product)
            self.floats, self._source, self._whole = floats, floats, None
        else:
            rational = flint_matrix(_dm(m)) if is_rational(m) else None  # an fmpq_mat under flint
            if rational is not None:
                self._source, self._whole = rational, None
            else:
                with arb_precision(dps):  # read at dps digits, not flint's 53-bit default
                    self._source = self._whole = arb_matrix(m, dps)
        self._shape = self.floats.shape if self.floats is not None else (self._source.nrows(), self._source.ncols())
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
            with arb_precision(self.dps):
                if self.floats is not None:  # a float is a dyadic rational: read exactly
                    got = _flint.arb_mat([m[i].tolist()])
                else:
                    got = _flint.arb_mat([[m[i, k] for k in range(self._shape[1])]])
                self._row_of[i] = got
        return got

    def col(self, j: int):
        got = self._col_of.get(j)
        if got is None:
            m = self._source
            with arb_precision(self.dps):
                if self.floats is not None:
                    got = _flint.arb_mat([[x] for x in m[:, j].tolist()])
                else:
                    got = _flint.arb_mat([[m[k, j]] for k in range(self._shape[0])])
                self._col_of[j] = got
        return got

    def whole(self):
        if self._whole is None:
            with arb_precision(self.dps):
                if self.floats is not None:
                    self._whole = _flint.arb_mat(self.floats.tolist())
                else:
                    self._whole = _flint.arb_mat(self._source)
        return self._whole


class ArbTransposed:
    """The transpose of an :class:`ArbLines` or :class:`ArbProducts`: its rows are the other's
    columns, so nothing is transposed until it is needed whole."""

    def __init__(self, m) -> None:
        self.m = m
        self._whole = None
        floats = getattr(m, "floats", None)
        self.floats = None if floats is None else floats.T

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
        with arb_precision(self.dps):
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
            with arb_precision(self.dps):
                got = self._row_of[i] = _arb_sum(_times(a.row(i), b) for a, b in self.parts)
        return got

    def col(self, j: int):
        got = self._col_of.get(j)
        if got is None:
            with arb_precision(self.dps):
                got = self._col_of[j] = _arb_sum(_times_by(a, b.col(j)) for a, b in self.parts)
        return got

    def whole(self):
        if self._whole is None:
            with arb_precision(self.dps):
                self._whole = _arb_sum(_times(a.whole(), b) if getattr(b, "floats", None) is not None
                                       else _times_by(a, b.whole()) for a, b in self.parts)
        return self._whole


def _times(a, b):
    """The arb_mat ``a`` times the lazy matrix ``b`` (its floats in float64 slices when it has them)."""
    floats = getattr(b, "floats", None)
    if floats is not None:
        got = ball_float_product(a, floats)
        if got is not None:
            return got
    return a * b.whole()


def _times_by(a, b):
    """The lazy matrix ``a`` times the arb_mat ``b`` (``(bᵀ·aᵀ)ᵀ`` in float64 slices when ``a`` has floats)."""
    floats = getattr(a, "floats", None)
    if floats is not None:
        got = ball_float_product(b.transpose(), floats.T)
        if got is not None:
            return got.transpose()
    return a.whole() * b


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
        return arb_operand(x)
    if not isinstance(x, list):
        qq = qq_entries(x)
        if qq is not None and all(v is not None for row in qq for v in row):
            return _flint.arb_mat([[fmpq(v) for v in row] for row in qq])
        x = evaluate(x, dps)
    return _flint.arb_mat(x) if x and x[0] else _flint.arb_mat(len(x), len(x[0]) if x else 0)


def arb_scalar(x: sympy.Expr, dps: int):
    """The number ``x`` as an arb ball (a rational exactly; else its certified ball at ``dps`` digits, or
    failing that its ``dps``-digit value)."""
    if isinstance(x, sympy.Rational):
        return _flint.arb(_flint.fmpq(int(x.p), int(x.q)))
    with arb_precision(dps):
        ball = certified(x, dps)
    if ball is not None:
        return ball
    with mpmath.workdps(dps + 10):
        return _flint.arb(to_mpf(x, dps))


def arb_angle(theta: sympy.Expr, dps: int):
    """An angle as a ball: a rational or a rational power of one exactly as flint reads it (RoPE's
    ``base^{-2i/d}``), else its ``dps``-digit value."""
    from ..problem.rope import angle_ball

    ball = angle_ball(theta)
    return ball if ball is not None else arb_scalar(theta, dps)


def angle_digits(thetas, turns: int) -> int:
    """How many digits before the point the largest of the angles ``turns·θ_i`` has (0 below 1): the
    digits its cosine and sine need beyond those asked for."""
    if not thetas or turns == 0:
        return 0
    with mpmath.workdps(15):
        largest = max(abs(to_mpf(t, 15)) for t in thetas) * turns
        return max(0, int(mpmath.log10(largest)) + 2) if largest > 1 else 0


def arb_rows(m) -> list[list[mpmath.mpf]]:
    """The midpoints of an arb_mat as rows of mpmath numbers (exactly)."""
    m = m.whole() if isinstance(m, ArbProducts) else m
    return [[arb_to_mpf(m[i, j]) for j in range(m.ncols())] for i in range(m.nrows())]


def arb_rows_entry(m, i: int, j: int) -> mpmath.mpf:
    """Entry (i, j) of an arb_mat as :func:`arb_rows` gives it."""
    return arb_to_mpf(m[i, j])


def arb_floats(m) -> list[list[float]]:
    """The midpoints of an arb_mat rounded to float64 (see :func:`arb_float`)."""
    m = m.whole() if isinstance(m, ArbProducts) else m
    return [[arb_float(m[i, j]) for j in range(m.ncols())] for i in range(m.nrows())]


def mp_matmul(a, b, dps: int) -> list[list[mpmath.mpf]]:
    """The product of two matrices at ``dps`` digits (with arb unless ``b`` has an infinite entry):
    each is a list of rows of mpmath numbers, or a rational matrix (see :func:`operand`). Rows
    of finite numbers times a matrix read from binary floats (a checkpoint's weights) are
    multiplied exactly in float64 slices instead (:func:`float_product`)."""
    fast = float_product(a, b, dps)
    if fast is not None:
        return fast
    if not isinstance(b, list) or not any(mpmath.isinf(x) for row in b for x in row):
        with arb_precision(dps):
            product = arb_operand(a) * arb_operand(b)
            return [[arb_to_mpf(product[i, j]) for j in range(product.ncols())] for i in range(product.nrows())]
    a, b = (x if isinstance(x, list) else evaluate(x, dps) for x in (a, b))
    with mpmath.workdps(dps + 10):
        return [[mpmath.fsum(x * row_b[j] for x, row_b in zip(row, b)) for j in range(len(b[0]))] for row in a]



_MAX_BITS = 4000  # the widest integers float_product makes of a row of mpmath numbers


def big_floats(m) -> "numpy.ndarray | None":
    """The float64 array of a matrix read from binary floats with at least
    :data:`~symattn.numbers.dyadic.DEFER_FROM` entries (a model's unembedding, its MLP's weights),
    whose products :class:`ArbProducts` makes in float64 slices; None for any other matrix."""
    from ..numbers import dyadic

    floats = exact_floats(m) if not isinstance(m, list) else None
    return floats if floats is not None and floats.size >= dyadic.DEFER_FROM else None


def ball_float_product(a, b) -> "_flint.arb_mat | None":
    """The ball product of an arb_mat ``a`` (n × k) and a float64 array ``b`` (k × m) of finite floats,
    at flint's working precision, without reading ``b`` into arb: None when either has numbers it
    cannot take (not finite, a radius beyond float64's range, too wide a range of sizes).

    The midpoints' product is exact (:func:`~symattn.numbers.dyadic.integer_product`), each entry then
    rounded once to the working precision, the rounding added to its radius. The radii's part,
    Σ_k rad(a_ik)·|b_kj|, is a float64 product rounded up: a classical sum of k products of
    nonnegative floats is within a factor 1 + k·u of the exact one (u = 2⁻⁵³), so the float64 product
    times 1 + (2k + 8)·u, plus k of the smallest subnormal for underflow, bounds it from above."""
    import numpy as np

    n, k = a.nrows(), a.ncols()
    if k != b.shape[0]:
        raise ValueError(f"a {n}×{k} ball matrix times a {b.shape[0]}×{b.shape[1]} array")
    mans, exps, rads = [], [], np.zeros((n, k), dtype=np.float64)
    for i in range(n):
        row_m, row_e = [], []
        for j in range(k):
            x = a[i, j]
            if not x.is_finite():
                return None
            man, exp = x.mid().man_exp()
            row_m.append(int(man))
            row_e.append(int(exp))
            r = x.rad()
            if r != 0:
                value = float(r)
                if not (0 < value < math.inf):
                    return None  # a radius below or beyond float64's range
                rads[i, j] = math.nextafter(value, math.inf)
        mans.append(row_m)
        exps.append(row_e)
    nonzero = [e for row_m, row_e in zip(mans, exps) for m_, e in zip(row_m, row_e) if m_]
    shift = min(nonzero, default=0)
    if nonzero and max(e + abs(m_).bit_length() for row_m, row_e in zip(mans, exps)
                       for m_, e in zip(row_m, row_e) if m_) - shift > _MAX_BITS:
        return None
    ints = [[m_ << (e - shift) if m_ else 0 for m_, e in zip(row_m, row_e)] for row_m, row_e in zip(mans, exps)]
    got = integer_product(ints, b)
    if got is None:
        return None
    rows, power = got
    exp = _flint.fmpz(shift - power)
    spread = rads @ np.abs(b)
    if not np.isfinite(spread).all():
        return None
    spread = spread * (1 + (2 * k + 8) * 2.0**-53) + k * 5e-324
    out = _flint.arb_mat(n, b.shape[1])
    for i, row in enumerate(rows):
        radii = spread[i].tolist()
        for j, x in enumerate(row):
            # +: rounded to the working precision, the rounding's error added to the radius
            out[i, j] = +_flint.arb(_flint.arf((_flint.fmpz(x), exp)), radii[j])
    return out


def float_product(a, b, dps: int) -> "list[list[mpmath.mpf]] | None":
    """``a·b`` for rows of finite mpmath numbers ``a`` and a matrix ``b`` whose entries are binary
    floats (:func:`~symattn.numbers.dyadic.exact_floats`): the exact product of the numbers given
    (:func:`~symattn.numbers.dyadic.integer_product`), each entry rounded once to the working
    precision of ``dps`` digits. None for anything else (or numbers of too wide a range)."""
    floats = exact_floats(b)
    if floats is None or not isinstance(a, list) or not a or not a[0]:
        return None
    scaled = _mpf_integers(a)
    if scaled is None:
        return None
    got = integer_product(scaled[0], floats)
    if got is None:
        return None
    rows, power = got
    exp, prec = scaled[1] - power, prec_bits(dps)
    return [[_make_mpf(_from_man_exp(x, exp, prec, "n")) for x in row] for row in rows]


def _mpf_integers(a: list[list[mpmath.mpf]]) -> "tuple[list[list[int]], int] | None":
    """Rows of finite mpmath numbers as rows of integers times one power of two, exactly:
    ``(ints, shift)`` with ``a = ints·2^shift``; None for an infinite entry or too wide a range."""
    parts = [[x._mpf_ for x in row] for row in a]
    exps = [e for row in parts for (_, man, e, bc) in row if man]
    if any(not man and (e or bc) for row in parts for (_, man, e, bc) in row):
        return None  # ±∞ or NaN
    if not exps:
        return [[0] * len(row) for row in a], 0
    shift = min(exps)
    top = max(e + bc for row in parts for (_, man, e, bc) in row if man)
    if top - shift > _MAX_BITS:
        return None
    return [[(-man if sign else man) << (e - shift) if man else 0 for (sign, man, e, bc) in row] for row in parts], shift
