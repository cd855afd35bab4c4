"""Linear attention's exact operations: each row divided by its normaliser, and the test that tells a
difference of the two forms is 0 however SymPy happened to arrange its quotients."""

from __future__ import annotations

import math

import sympy

from ..errors import SymattnError
from ..numbers.matrices import is_rational, rational_matrix, tidy
from .lazy import LazyMatrix, rational_rows


def divide_rows(m, d):
    """Row i of ``m`` over ``d[i, 0]``: one quotient of the two expanded (canonical) sums, so the
    parallel and the recurrent form of linear attention reach the same expression; a rational matrix
    stays rational. A normaliser that is exactly 0 is refused (at the problem's ``linear`` field)."""
    for i in range(d.rows):
        if d[i, 0] == 0:
            raise SymattnError(f"row {i + 1}: the normaliser φ(q_{i + 1})·Σ_j φ(k_j) is exactly 0 (its features "
                               "vanish), so the row has no weights and nothing to divide by; give other numbers "
                               "(elu1's features are always positive)", field="linear")
    if is_rational(m) and is_rational(d):
        z = [row[0] for row in rational_rows(d)]
        return rational_matrix(m.rows, m.cols, [x / z[i] for i, row in enumerate(rational_rows(m)) for x in row])
    return LazyMatrix(m.rows, m.cols, lambda i, j: tidy(m[i, j]) / tidy(d[i, 0]))


MAX_OPS = 4000  # a difference beyond this many operations is left as SymPy wrote it


def vanishes(x: sympy.Expr) -> bool:
    """Whether ``x``, a rational function of powers e^r (r rational) and rationals, is exactly 0.

    Each e^r is written t^(r·L) with L the common denominator of the exponents, so ``x`` becomes a
    rational function of the one number t = e^(1/L), whose numerator ``cancel`` reduces. t is
    transcendental, so that numerator is 0 exactly when ``x`` is; any other atom (a root, π) is
    kept as an indeterminate, so a 0 found is always right (a nonzero answer may be missed, never
    invented)."""
    if x == 0:
        return True
    if x.free_symbols or sympy.count_ops(x) > MAX_OPS:
        return False
    powers = [e for e in x.atoms(sympy.exp) if e.args[0].is_Rational]
    if not powers and not x.has(sympy.E):
        return False
    denominator = math.lcm(*(int(e.args[0].q) for e in powers)) if powers else 1
    t = sympy.Dummy("t", positive=True)
    y = x.xreplace({e: t ** (e.args[0] * denominator) for e in powers})
    y = y.xreplace({sympy.E: t ** denominator})
    return sympy.cancel(sympy.together(y)) == 0


def difference(a, b):
    """``a − b`` entry by entry, expanded; exactly 0 where it is 0 as a function of powers of e (see
    :func:`vanishes`), however SymPy arranged the two forms' quotients."""
    def entry(i: int, j: int) -> sympy.Expr:
        x = tidy(a[i, j] - b[i, j])
        return sympy.Integer(0) if x != 0 and not x.is_Rational and vanishes(x) else x

    return LazyMatrix(a.rows, a.cols, entry)
