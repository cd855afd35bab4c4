"""The softmax, kept *structured*: per row the maximum ``m_i`` and the exact exponents ``z_ij − m_i``.

Weights and outputs are built from that structure as short expressions ``e^{z_ij − m_i} / Z_i``,
and evaluated at high precision from it (in arb for a rational row), so no entry ever repeats a
whole row's denominator inside a larger expression tree. Also here: the rows' values as arb balls
and float64 (:func:`weights_times`, :func:`softmax_floats`), and the backward pass through the
softmax at a number of digits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property

import flint as _flint  # exact rational matrices and ball arithmetic (a required dependency)
import mpmath
import sympy
from sympy import QQ

from ..numbers.matrices import NEG_INF, Matrix, is_rational, qq_to_sympy, tidy
from ..numbers.sympy_internals import mul_in_order, sum_of_distinct
from .arb import arb_operand, arb_precision, arb_to_mpf, balls_float, fmpq, prec_bits
from .evaluation import row_max, to_mpf



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

    ``sink`` is a learned sink's exponent ``s - m_i`` (gpt-oss): one more term
    ``e^{s - m_i}`` in ``Z_i`` that no key's weight has, so the row's weights sum
    to less than 1; ``m_i`` is then the maximum over the scores and ``s``.
    """

    maximum: sympy.Expr
    raw: tuple
    is_max: bool = True  # False for a symbolic row, normalised by its first allowed score
    algebraic: bool = False  # every exponent an algebraic number (sums of rationals times square roots)
    sink: object = None  # the sink's exponent s − m_i (QQ in a rational row), or None without a sink

    @cached_property
    def rational(self) -> bool:
        return all(e is None or not isinstance(e, sympy.Basic) for e in self.raw + (self.sink,))

    @cached_property
    def sink_exponent(self) -> sympy.Expr | None:
        """``s - m_i`` as SymPy writes it, or None without a sink."""
        if self.sink is None:
            return None
        return qq_to_sympy(self.sink) if self.rational else self.sink

    @cached_property
    def sink_term(self) -> sympy.Expr:
        """``e^{s - m_i}``, the sink's term in ``Z_i`` (0 without a sink)."""
        return sympy.Integer(0) if self.sink is None else _exp(self.sink_exponent)

    def sink_weight(self) -> sympy.Expr:
        """``e^{s - m_i} / Z_i``: what the sink absorbs, ``1 - Σ_j a_ij``."""
        return self._over_normaliser(self.sink_term)

    @property
    def has_balls(self) -> bool:
        """Whether the row's weights come as arb balls (:meth:`arb_weights`, :meth:`allowed_weights`)."""
        return self.rational

    def is_masked(self, j: int) -> bool:
        """Whether key ``j`` (0-based) is masked in this row (its weight exactly 0)."""
        return self.raw[j] is None

    def positions(self) -> list[int]:
        """The 0-based keys the row attends to."""
        return [k for k, e in enumerate(self.raw) if e is not None]

    @cached_property
    def exponents(self) -> tuple[sympy.Expr | None, ...]:
        if not self.rational:
            return self.raw
        return tuple(None if e is None else qq_to_sympy(e) for e in self.raw)

    @cached_property
    def terms(self) -> tuple[sympy.Expr, ...]:
        """``e^{z_ij - m_i}`` for each position (0 where masked)."""
        return tuple(sympy.Integer(0) if e is None else _exp(e) for e in self.exponents)

    @cached_property
    def normaliser(self) -> sympy.Expr:
        """``Z_i = Σ_j e^{z_ij - m_i}`` (like terms collected)."""
        if self.rational:  # collected in QQ first: SymPy only orders the distinct terms
            return sum_of_distinct([self._term(c, e) for c, e in self.numerator_parts()])
        return sympy.Add(*self.terms, self.sink_term)

    @cached_property
    def normaliser_is_number(self) -> bool:
        """Whether ``Z_i`` is a plain number: every allowed exponent is 0 (a sum of exponentials
        of distinct rationals, not all 0, is transcendental)."""
        if self.rational or self.algebraic:
            # Lindemann–Weierstrass: e^a for distinct algebraic a are linearly independent over the
            # algebraic numbers, so Z_i is rational only when every exponent is 0
            return all(e is None or e == 0 for e in self.raw + (self.sink,))
        return self.normaliser.is_Rational

    def numerator_parts(self, column=None) -> list:
        """``Σ_j e^{z_ij - m_i} v_j`` of a rational row and rational values ``column`` (all 1 when
        None: ``Z_i`` itself) as ``(coefficient, exponent)`` pairs in QQ: like exponents collected,
        zero terms dropped, the largest exponent first. No SymPy expression is built. ``Z_i``
        has the sink's term too."""
        parts = []
        for e, positions in self._exponent_groups:
            c = len(positions) if column is None else sum(column[k] for k in positions)
            if c:
                parts.append((QQ(c), e))
        if column is None and self.sink is not None:
            same = [k for k, (_, e) in enumerate(parts) if e == self.sink]
            if same:
                parts[same[0]] = (parts[same[0]][0] + 1, self.sink)
            else:
                parts = sorted(parts + [(QQ(1), self.sink)], key=lambda part: part[1], reverse=True)
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
        powers = {e: self.terms[positions[0]] for e, positions in self._exponent_groups}
        if self.sink is not None and self.sink not in powers:
            powers[self.sink] = self.sink_term
        return powers

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
        if all(isinstance(v, sympy.Rational) for v in column):
            collected = _collected(self.terms, column)
            if collected is not None:
                return collected
        numerator = sympy.Add(*[t * v for t, v in zip(self.terms, column) if t != 0])
        # Rational values collect by themselves; sums such as 1 + √2 need expanding.
        return sympy.expand(numerator) if any(v.is_Add for v in column) else numerator

    def weighted_sum(self, column: list[sympy.Expr]) -> sympy.Expr:
        """``Σ_j a_ij v_j`` as one fraction over ``Z_i``."""
        return self._over_normaliser(self.weighted_numerator(column))

    def _exps(self, dps: int, subs) -> list:
        """``e^{z_ij - m_i}`` at ``dps`` digits (0 where masked): arb balls or mpmath numbers."""
        if self.rational:
            return [_flint.arb(0) if e is None else _flint.arb(fmpq(e)).exp() for e in self.raw]
        return [mpmath.mpf(0) if e is None else mpmath.exp(to_mpf(e, dps, subs)) for e in self.exponents]

    def maximum_value(self, dps: int, subs=None) -> mpmath.mpf:
        """``m_i`` at ``dps`` digits (an mpmath number)."""
        return to_mpf(self.maximum, dps, subs)

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
        with arb_precision(dps):
            exps = self._exps(dps, None)
            total = sum(exps, self._arb_sink())
            found = ([e / total for e in exps], total)
        if keep:
            cache[dps] = found
        return found[0]

    def allowed_weights(self, dps: int) -> tuple[list[int], list]:
        """The positions a rational row attends to and their weights there, as arb balls at ``dps``
        digits (the same balls as :meth:`arb_weights`; not kept)."""
        positions = [k for k, e in enumerate(self.raw) if e is not None]
        with arb_precision(dps):
            exps = [_flint.arb(fmpq(self.raw[k])).exp() for k in positions]
            total = sum(exps, self._arb_sink())
            return positions, [e / total for e in exps]

    def _arb_sink(self):
        """``e^{s - m_i}`` as an arb ball at the current precision (0 without a sink)."""
        return _flint.arb(0) if self.sink is None else _flint.arb(fmpq(self.sink)).exp()

    def sink_value(self, dps: int, subs=None) -> mpmath.mpf:
        """``e^{s - m_i} / Z_i`` at ``dps`` digits (0 without a sink)."""
        if self.sink is None:
            return mpmath.mpf(0)
        if self.rational:
            with arb_precision(dps):
                total = sum(self._exps(dps, None), self._arb_sink())
                return arb_to_mpf(self._arb_sink() / total)
        with mpmath.workdps(dps + 10):
            return mpmath.exp(to_mpf(self.sink_exponent, dps, subs)) / self.evaluate_normaliser(dps, subs)

    def _evaluate(self, dps: int, subs) -> tuple[list[mpmath.mpf], mpmath.mpf]:
        if self.rational:
            weights = self.arb_weights(dps)
            return [arb_to_mpf(w) for w in weights], arb_to_mpf(self.__dict__["_arb"][dps][1])
        with mpmath.workdps(dps + 10):
            exps = self._exps(dps, subs)
            total = mpmath.fsum([e for e, x in zip(exps, self.raw) if x is not None]
                                + ([mpmath.exp(to_mpf(self.sink_exponent, dps, subs))] if self.sink is not None else []))
            return [mpmath.mpf(0) if x is None else e / total for e, x in zip(exps, self.raw)], total


def _collected(terms: list, column: list) -> "sympy.Expr | None":
    """``Σ_j t_j v_j`` for terms that are each an exponential or a rational and rational values,
    as ``sympy.Add`` collects it: the values of each exponential added in QQ, a product built
    once per distinct exponential (no SymPy product per key); None for any other term."""
    number, coefficients = QQ(0), {}
    for t, v in zip(terms, column):
        if isinstance(t, sympy.Rational):
            number += QQ(int(t.p), int(t.q)) * QQ(int(v.p), int(v.q))
        elif isinstance(t, sympy.exp):
            coefficients[t] = coefficients.get(t, QQ(0)) + QQ(int(v.p), int(v.q))
        else:
            return None
    out = [_rational(int(number.numerator), int(number.denominator))] if number else []
    for t, c in coefficients.items():
        if c:
            out.append(t if c == 1 else mul_in_order(_rational(int(c.numerator), int(c.denominator)), t))
    return sum_of_distinct(out)


@functools.lru_cache(maxsize=65536)  # the values of V come back in every row's sums
def _rational(p: int, q: int) -> sympy.Rational:
    return sympy.Rational(p, q)


def softmax_backward(A: list[list[mpmath.mpf]], dA: list[list[mpmath.mpf]], dps: int) -> list[list[mpmath.mpf]]:
    """Back through the softmax, row by row: a ∘ (dA − dA·a), at ``dps`` digits.

    The working precision covers every bit of the inputs (arb gives them ``prec_bits(dps)`` bits),
    so a row with one allowed key, a = (1, 0, …), gives exactly 0, as its exact value is."""
    with mpmath.workprec(prec_bits(dps) + 20):
        out = []
        for a, g in zip(A, dA):
            dot = mpmath.fsum(x * y for x, y in zip(a, g))
            out.append([x * (y - dot) for x, y in zip(a, g)])
        return out


def softmax_rows(masked, expanded: bool = False, sink: sympy.Expr | None = None) -> tuple[SoftmaxRow, ...]:
    """The softmax rows of ``masked``; ``expanded``: its entries are sums of distinct algebraic
    terms (a norm's scores), so z − m is already in expanded form and is not expanded again.
    ``sink``: a learned sink logit, one more term in each row's ``Z_i`` (and in its maximum)."""
    qq = getattr(masked, "qq_rows", None)
    if qq is not None and (sink is None or sink.is_Rational):  # rational: the maximum and exponents in QQ
        s = None if sink is None else QQ(int(sink.p), int(sink.q))
        rows = []
        for values in qq:
            m = max([v for v in values if v is not None] + ([s] if s is not None else []))
            rows.append(SoftmaxRow(qq_to_sympy(m), tuple(None if v is None else v - m for v in values),
                                   sink=None if s is None else s - m))
        return tuple(rows)
    rows = []
    for i in range(masked.rows):
        values = [masked[i, j] for j in range(masked.cols)]
        finite = [v for v in values if v != NEG_INF]
        symbolic = any(v.free_symbols for v in finite)
        # The maximum keeps exponents ≤ 0; with symbols it cannot be picked, and the first
        # allowed score serves (any reference cancels in the quotient).
        m = finite[0] if symbolic else row_max(values + ([sink] if sink is not None else []))
        exponents = tuple(None if v == NEG_INF else (v - m) if expanded else tidy(v - m) for v in values)
        sink_exponent = None if sink is None else tidy(sink - m)
        for e in exponents + (sink_exponent,):
            if e is not None:
                _check_exponent(e)  # now, while the derivation runs, not when the row is first shown
        rows.append(SoftmaxRow(m, exponents, is_max=not symbolic, algebraic=expanded and sink is None,
                               sink=sink_exponent))
    return tuple(rows)


def weights_times(rows: "tuple[SoftmaxRow, ...]", values: Matrix, dps: int, convert=None) -> "list[list] | None":
    """``A·V`` at ``dps`` digits straight from rational softmax rows and a rational ``V`` (one arb
    matrix product), as mpmath numbers (or ``convert(arb)``), or None when either is not
    rational."""
    if not is_rational(values) or not all(row.has_balls for row in rows):
        return None
    convert = convert or arb_to_mpf
    with arb_precision(dps):
        product = _flint.arb_mat([row.arb_weights(dps) for row in rows]) * arb_operand(values)
        return [[convert(product[i, j]) for j in range(product.ncols())] for i in range(product.nrows())]


def weighted_value(row: "SoftmaxRow", column: list, dps: int) -> "mpmath.mpf | None":
    """``Σ_k a_ik v_k`` at ``dps`` digits for a rational row and rational values (QQ), from the
    row's arb weights; None when the row is not rational."""
    if not row.has_balls:
        return None
    with arb_precision(dps):
        total = _flint.arb(0)
        for w, v in zip(row.arb_weights(dps), column):
            if v:
                total += w * fmpq(v)
        return arb_to_mpf(total)


FLOAT_BLOCK = 64  # rows of weights held as arb balls at a time by softmax_floats
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

    if not rows or not all(row.has_balls for row in rows):
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
    with arb_precision(dps):
        v = None
        if values is not None:
            whole = arb_operand(values)
            v = [[whole[k, c] for c in range(whole.ncols())] for k in range(whole.nrows())]
            product = numpy.empty((n, whole.ncols()))
        for start in range(0, n, FLOAT_BLOCK):
            block, lo, hi = [], width, 0
            for i in range(start, min(n, start + FLOAT_BLOCK)):
                if keep:  # a small problem: the rows keep their weights for the worked solution
                    every = rows[i].arb_weights(dps)
                    positions = rows[i].positions()
                    balls = [every[k] for k in positions]
                else:
                    positions, balls = rows[i].allowed_weights(dps)
                weights[i, positions] = balls_float(balls)
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
                    product[start + r] = balls_float([part[r, c] for c in range(part.ncols())])
    kept[dps] = (rows, values, weights, product)
    return weights, product


