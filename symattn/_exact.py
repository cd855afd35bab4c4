"""Exact arithmetic for the stages: products, the structured softmax, evaluation.

Rational matrices are multiplied with python-flint's ``fmpq_mat`` when it is
installed (SymPy's own fastest ground type); anything with square roots or
exponentials is multiplied entry by entry in SymPy and expanded.

The softmax is kept *structured*: per row the maximum ``m_i`` and the exact
exponents ``z_ij - m_i``. Weights and outputs are built from that structure
as short expressions ``e^{z_ij - m_i} / Z_i``, and evaluated at high precision
from it, so no entry ever repeats a whole row's denominator inside a larger
expression tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import mpmath
import sympy

try:  # python-flint: fast exact rational matrices
    import flint as _flint
except ImportError:  # pragma: no cover - the fallback is SymPy
    _flint = None

NEG_INF = sympy.S.NegativeInfinity
Matrix = sympy.ImmutableMatrix


def tidy(x: sympy.Expr) -> sympy.Expr:
    """``x`` in canonical expanded form (a no-op for rationals, the common case)."""
    if x.is_Rational or x.is_Atom:
        return x
    # Never split e^(a+b) into e^a·e^b: the exponents are the softmax's structure.
    return sympy.expand(x, power_exp=False, power_base=False, log=False)


def _all_rational(m: Matrix) -> bool:
    return all(isinstance(x, sympy.Rational) for x in m)


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """The exact product ``a·b``."""
    assert a.cols == b.rows, (a.shape, b.shape)
    if _flint is not None and _all_rational(a) and _all_rational(b):
        fa = _flint.fmpq_mat(a.rows, a.cols, [_flint.fmpq(int(x.p), int(x.q)) for x in a])
        fb = _flint.fmpq_mat(b.rows, b.cols, [_flint.fmpq(int(x.p), int(x.q)) for x in b])
        fc = fa * fb
        return Matrix(
            a.rows,
            b.cols,
            [sympy.Rational(int(fc[i, j].p), int(fc[i, j].q)) for i in range(a.rows) for j in range(b.cols)],
        )
    return Matrix(
        a.rows,
        b.cols,
        lambda i, j: tidy(sympy.Add(*[a[i, k] * b[k, j] for k in range(a.cols)])),
    )


def scale(m: Matrix, factor: sympy.Expr) -> Matrix:
    return m.applyfunc(lambda x: tidy(x * factor))


def add_mask(scores: Matrix, mask: Matrix) -> Matrix:
    """``scores + mask`` where a −∞ in the mask stays −∞ (never 0·∞ or ∞ − ∞)."""
    return Matrix(
        scores.rows,
        scores.cols,
        lambda i, j: NEG_INF if mask[i, j] == NEG_INF else tidy(scores[i, j] + mask[i, j]),
    )


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
    return mpmath.mpf(value._to_mpmath(mpmath.mp.prec + 40))


def evaluate(m: Matrix, dps: int, subs=None) -> list[list[mpmath.mpf]]:
    with mpmath.workdps(dps + 10):
        return [[to_mpf(m[i, j], dps, subs) for j in range(m.cols)] for i in range(m.rows)]


def mp_matmul(a: list[list[mpmath.mpf]], b: list[list[mpmath.mpf]], dps: int) -> list[list[mpmath.mpf]]:
    """The product of two matrices of mpmath numbers, at ``dps`` digits."""
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


@dataclass(frozen=True)
class SoftmaxRow:
    """One row of the softmax, kept as structure.

    ``exponents[j]`` is ``z_ij - m_i`` (exact, ≤ 0), or ``None`` where the
    position is masked (its weight is exactly 0).
    """

    maximum: sympy.Expr
    exponents: tuple[sympy.Expr | None, ...]
    is_max: bool = True  # False for a symbolic row, normalised by its first allowed score

    @cached_property
    def terms(self) -> tuple[sympy.Expr, ...]:
        """``e^{z_ij - m_i}`` for each position (0 where masked)."""
        return tuple(sympy.Integer(0) if e is None else sympy.exp(e) for e in self.exponents)

    @cached_property
    def normaliser(self) -> sympy.Expr:
        """``Z_i = Σ_j e^{z_ij - m_i}`` (like terms collected)."""
        return sympy.Add(*self.terms)

    def weight(self, j: int) -> sympy.Expr:
        if self.exponents[j] is None:
            return sympy.Integer(0)
        return self.terms[j] / self.normaliser

    def weighted_numerator(self, column: list[sympy.Expr]) -> sympy.Expr:
        """``Z_i · Σ_j a_ij v_j = Σ_j e^{z_ij - m_i} v_j`` (like terms collected)."""
        numerator = sympy.Add(*[t * v for t, v in zip(self.terms, column) if t != 0])
        # Rational values collect by themselves; sums such as 1 + √2 need expanding.
        return sympy.expand(numerator) if any(v.is_Add for v in column) else numerator

    def weighted_sum(self, column: list[sympy.Expr]) -> sympy.Expr:
        """``Σ_j a_ij v_j`` as one fraction over ``Z_i``."""
        return self.weighted_numerator(column) / self.normaliser

    def evaluate_normaliser(self, dps: int, subs=None) -> mpmath.mpf:
        """``Z_i`` at ``dps`` digits."""
        with mpmath.workdps(dps + 10):
            return mpmath.fsum(mpmath.exp(to_mpf(e, dps, subs)) for e in self.exponents if e is not None)

    def evaluate(self, dps: int, subs=None) -> list[mpmath.mpf]:
        """The weights at ``dps`` digits, straight from the exponents."""
        with mpmath.workdps(dps + 10):
            exps = [mpmath.mpf(0) if e is None else mpmath.exp(to_mpf(e, dps, subs)) for e in self.exponents]
            total = mpmath.fsum(e for e, x in zip(exps, self.exponents) if x is not None)
            return [mpmath.mpf(0) if x is None else e / total for e, x in zip(exps, self.exponents)]


def softmax_rows(masked: Matrix) -> tuple[SoftmaxRow, ...]:
    rows = []
    for i in range(masked.rows):
        values = [masked[i, j] for j in range(masked.cols)]
        finite = [v for v in values if v != NEG_INF]
        symbolic = any(v.free_symbols for v in finite)
        # The maximum keeps exponents ≤ 0; with symbols it cannot be picked, and the first
        # allowed score serves (any reference cancels in the quotient).
        m = finite[0] if symbolic else row_max(values)
        rows.append(
            SoftmaxRow(m, tuple(None if v == NEG_INF else tidy(v - m) for v in values), is_max=not symbolic)
        )
    return tuple(rows)
