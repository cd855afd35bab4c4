"""Exact values at high precision (mpmath) and as float64: a rational matrix read from its
fractions directly, anything else in ball arithmetic (:mod:`symattn.exact.certified`), or through
SymPy's evaluation at the digits asked for where balls cannot follow it."""

from __future__ import annotations

import mpmath
import sympy
from mpmath.libmp import from_rational as _from_rational

from ..numbers.matrices import NEG_INF
from ..numbers.parse import matrix_float64, qq_float
from ..numbers.sympy_internals import to_mpmath
from .certified import arb_to_mpf, certified
from .lazy import qq_entries

_make_mpf = mpmath.mp.make_mpf


def to_mpf(x: sympy.Expr, dps: int, subs=None) -> mpmath.mpf:
    """``x`` as an mpmath number good to ``dps`` digits (−∞ stays −∞); ``subs`` gives the symbols' values."""
    if not isinstance(x, sympy.Basic):  # a Python number (a factor such as −1)
        x = sympy.sympify(x)
    if subs and x.free_symbols:
        x = x.xreplace(subs)
    if x == NEG_INF:
        return mpmath.ninf
    if isinstance(x, sympy.Integer):
        return mpmath.mpf(int(x))
    if isinstance(x, sympy.Rational):
        return mpmath.mpf(int(x.p)) / int(x.q)
    ball = certified(x, dps + 10)  # ball arithmetic: every digit of dps + 10 guaranteed
    if ball is not None:
        return arb_to_mpf(ball)
    value = sympy.N(x, dps + 10)  # a node balls do not follow, or a sum that cancels: SymPy's evaluation
    return mpmath.mpf(to_mpmath(value, mpmath.mp.prec + 40))


def mpf_of_qq(x, prec: int | None = None) -> mpmath.mpf:
    """The rational ``x`` correctly rounded to ``prec`` bits (default: mpmath's working precision)."""
    return _make_mpf(_from_rational(int(x.numerator), int(x.denominator), prec or mpmath.mp.prec, "n"))


def evaluate(m, dps: int, subs=None) -> list[list[mpmath.mpf]]:
    """The entries of ``m`` at ``dps`` digits (from the rationals directly when it has them)."""
    if hasattr(type(m), "mp_values"):  # a matrix that holds its values as balls (RoPE's fast path)
        return m.mp_values(dps)
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
    if hasattr(type(m), "float_values"):  # a matrix that holds its values as balls (RoPE's fast path)
        return m.float_values()
    qq = getattr(m, "qq_rows", None)
    if qq is None:
        return None
    out = numpy.empty((m.rows, m.cols), dtype=numpy.float64)
    for i, row in enumerate(qq):  # row by row: no list of n² Python floats at once
        out[i] = [_NEG_INF_FLOAT if x is None else qq_float(x) for x in row]
    return out


_NEG_INF_FLOAT = float("-inf")


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

