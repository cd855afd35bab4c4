"""Exact real numbers evaluated in ball arithmetic (python-flint's arb): certified decimals.

An exact entry that is not a rational (a scaled score ``3/√2``, a soft-capped score
``50·tanh(3/(50√2))``, a norm's ``1/√(σ² + ε)``, a power of e, a GELU's erf) is evaluated here
node by node as a ball that is guaranteed to hold its true value. The working precision
grows until the ball is narrower than the digits asked for, so every digit a solution prints
from its midpoint is certified, not an estimate.

A node this module does not know (a symbol, a function outside the table below) gives None,
and the caller falls back to SymPy's own evaluation; so does a value the balls cannot pin down
in a few doublings of the precision (an exact 0 written as a sum that cancels).
"""

from __future__ import annotations

import flint
import mpmath
import sympy
from mpmath.libmp import from_man_exp as _from_man_exp

# SymPy's functions and the arb method that evaluates each (with a certified radius)
_FUNCTIONS = {
    sympy.exp: "exp", sympy.log: "log", sympy.tanh: "tanh", sympy.sinh: "sinh", sympy.cosh: "cosh",
    sympy.erf: "erf", sympy.erfc: "erfc", sympy.sin: "sin", sympy.cos: "cos", sympy.atan: "atan",
}
_DOUBLINGS = 3  # the working precision tried: the first, then twice, 4 and 8 times it


class _Unknown(Exception):
    """A node with no ball evaluation here."""


def _ball(x: sympy.Expr):
    """``x`` as an arb ball at flint's working precision (raises _Unknown for a node it cannot follow)."""
    if x.is_Rational:
        return flint.arb(flint.fmpq(int(x.p), int(x.q)))
    if x.is_Float:  # a binary float is a dyadic rational: read exactly
        r = sympy.Rational(x)
        return flint.arb(flint.fmpq(int(r.p), int(r.q)))
    if x is sympy.E:
        return flint.arb.const_e()
    if x is sympy.pi:
        return flint.arb.pi()
    if x.is_Add:
        total = flint.arb(0)
        for term in x.args:
            total += _ball(term)
        return total
    if x.is_Mul:
        product = flint.arb(1)
        for factor in x.args:
            product *= _ball(factor)
        return product
    if x.is_Pow:
        return _power(*x.args)
    name = _FUNCTIONS.get(type(x))
    if name is not None and len(x.args) == 1:
        return getattr(_ball(x.args[0]), name)()
    if isinstance(x, sympy.Abs):
        return abs(_ball(x.args[0]))
    raise _Unknown(type(x).__name__)


def _power(base: sympy.Expr, exponent: sympy.Expr):
    if base is sympy.E:
        return _ball(exponent).exp()
    b = _ball(base)
    if exponent.is_Integer:
        return b ** flint.fmpz(int(exponent))
    if exponent.is_Rational and b > 0:  # b^(p/q) as the q-th root's p-th power (q > 0 in SymPy)
        return b.root(int(exponent.q)) ** flint.fmpz(int(exponent.p))
    if b > 0:  # a positive base (a ball wholly above 0) to any real power
        return (_ball(exponent) * b.log()).exp()
    raise _Unknown("a power of a base not certainly positive")


def certified(x: sympy.Expr, dps: int):
    """``x`` as an arb ball whose radius is below ``10^-dps`` of its size (or exact), or None when
    ``x`` has a node this module cannot evaluate or the balls do not get that narrow."""
    wanted = int(dps * 3.33) + 8  # the relative accuracy asked for, in bits
    old = flint.ctx.prec
    try:
        for doubling in range(_DOUBLINGS + 1):
            flint.ctx.prec = (wanted + 30) << doubling
            try:
                ball = _ball(x)
            except (_Unknown, ValueError, ZeroDivisionError):
                return None
            if ball.is_exact() or ball.rel_accuracy_bits() >= wanted:
                return ball
        return None
    finally:
        flint.ctx.prec = old


def arb_to_mpf(x) -> mpmath.mpf:
    """The midpoint of an arb ball, exactly (it has at most the working precision's bits)."""
    man, exp = x.mid().man_exp()
    return mpmath.mp.make_mpf(_from_man_exp(int(man), int(exp)))  # exact: no rounding to mpmath's precision
