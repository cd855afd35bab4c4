"""RoPE's fast path: the rotated queries and keys, their scores and the softmax over them, kept as
structure.

A rotated entry is ``a·cos(tθ) − b·sin(tθ)`` with rational ``a``, ``b``; a score is
``Σ_i [α_i cos(dθ_i) + β_i sin(dθ_i)]`` with rational ``α_i = q_a k_a + q_b k_b``,
``β_i = q_b k_a − q_a k_b`` and ``d`` the key's position minus the query's. Each exact entry is
built only when it is read (a renderer showing a corner builds a corner), straight in the
canonical form SymPy's general simplification would reach, without that simplification.
Every value is computed in ball arithmetic (python-flint's arb) from the rational inputs and
the angles: the rotated matrices entry by entry, the scores as one arb matrix product.

The path applies when the inputs are rational and every angle ``θ_i`` is a positive algebraic
number written with rationals and rational powers (``base^{-2i/d_k}``, or a given angle such as
1/2): then ``cos(dθ_i)`` and ``sin(dθ_i)`` stay as they are, and by the Lindemann–Weierstrass
theorem two scores of a row are equal only when their canonical forms are. Angles such as
π/6 (whose cosines are algebraic numbers) take the general path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flint
import mpmath
import sympy

from ..errors import SymattnError
from ..numbers.matrices import NEG_INF, is_rational, qq_to_sympy, tidy
from ..numbers.sympy_internals import product_of_distinct, product_of_two, sum_of_distinct
from ..problem.rope import angle_ball, plain_angles, plain_cos_sin
from .arb import arb_float, arb_precision, arb_to_mpf, fmpq, prec_bits
from .lazy import LazyMatrix, position, rational_rows
from .softmax import SoftmaxRow
from .structures import Output, Softmax

# Above this many terms in a stage's exact entries (all of them together), a worked solution shows
# the stage in decimals (certified by ball arithmetic) and the JSON's "exact" is null.
EXACT_TERMS = 6000
MAX_ANGLE_DPS = 8000  # the digits tried, doubling, for the balls of large angles p·θ_i
GUARD_DPS = 12  # the digits tried first beyond those asked for: a score's cancellation, a large p·θ_i
MAX_DPS = 1000  # the digits tried, doubling, to tell the largest score of a row from the others


class Balled(LazyMatrix):
    """A lazy matrix whose values come from arb balls (``arb_values``: an arb_mat, or rows of balls
    with None for −∞), read by :mod:`symattn.exact.evaluation` through these two methods."""

    def ball_rows(self, dps: int) -> list:
        balls = self.arb_values(dps)
        if isinstance(balls, list):
            return balls
        return [[balls[i, j] for j in range(balls.ncols())] for i in range(balls.nrows())]

    def mp_values(self, dps: int) -> list:
        """The entries at ``dps`` digits, as mpmath numbers (−∞ where masked)."""
        return [[mpmath.ninf if x is None else arb_to_mpf(x) for x in row] for row in self.ball_rows(dps)]

    def float_values(self):
        """The entries as float64 (−∞ where masked), each rounded from its 30-digit ball."""
        import numpy

        rows = [[-math.inf if x is None else arb_float(x) for x in row] for row in self.ball_rows(30)]
        return numpy.array(rows, dtype=numpy.float64).reshape(self.rows, self.cols)


class Rotated(Balled):
    """``m`` with row ``r``'s pairs turned by ``turns[r]·θ_i``: the exact entries built when read
    (as :func:`symattn.problem.rope.rotate` builds them), the values from balls."""

    def __init__(self, m, thetas, pairs, turns) -> None:
        self.base, self.thetas, self.pairs, self.turns = m, tuple(thetas), list(pairs), list(turns)
        self._qq = rational_rows(m)
        self._partner = {}
        for i, (a, b) in enumerate(self.pairs):
            self._partner[a] = (i, a, b)
            self._partner[b] = (i, a, b)
        self._balls: dict[int, flint.arb_mat] = {}
        self._angles: dict[tuple[int, int], tuple[sympy.Expr, sympy.Expr]] = {}
        # no two pairs turned by the same angle: then no two terms of a score are alike
        self.distinct_angles = len(set(self.thetas)) == len(self.thetas)
        super().__init__(m.rows, m.cols, self._entry_of)

    def _entry_of(self, r: int, k: int) -> sympy.Expr:
        x = qq_to_sympy(self._qq[r][k])
        if k not in self._partner:
            return x  # a component in no pair stays
        i, a, b = self._partner[k]
        c, s = self._cos_sin(self.turns[r], i)
        xa, xb = qq_to_sympy(self._qq[r][a]), qq_to_sympy(self._qq[r][b])
        # rational multiples of cos φ and sin φ: the canonical (expanded) form as it is built
        return xa * c - xb * s if k == a else xa * s + xb * c

    def _cos_sin(self, turn: int, i: int) -> tuple[sympy.Expr, sympy.Expr]:
        """cos and sin of ``turn·θ_i`` (each made once)."""
        key = (turn, i)
        found = self._angles.get(key)
        if found is None:
            found = self._angles[key] = plain_cos_sin(turn, self.thetas[i])
        return found

    @property
    def T(self) -> "RotatedT":
        return RotatedT(self)

    def arb_values(self, dps: int) -> flint.arb_mat:
        """The entries as an arb matrix good to ``dps`` digits: computed with more digits while
        some ball is wider than that (large angles p·θ_i need their own digits before a cosine)."""
        if dps not in self._balls:
            self._balls[dps] = accurate(dps, self._at)
        return self._balls[dps]

    def _at(self, dps: int) -> flint.arb_mat:
        """The entries in balls at flint's precision for ``dps`` digits."""
        with arb_precision(dps):
            turned = _turned(self.thetas, dps)
            out = flint.arb_mat(flint.fmpq_mat(self.rows, self.cols, [fmpq(x) for row in self._qq for x in row]))
            for r, turn in enumerate(self.turns):
                if turn == 0:
                    continue
                row = self._qq[r]
                for (a, b), (c, s) in zip(self.pairs, turned(turn)):
                    xa, xb = fmpq(row[a]), fmpq(row[b])
                    out[r, a] = xa * c - xb * s
                    out[r, b] = xa * s + xb * c
            return out

    def terms(self) -> int:
        """How many terms the exact entries have in all (a rotated entry has two)."""
        moved = sum(1 for t in self.turns if t != 0)
        return self.rows * self.cols + moved * 2 * len(self.pairs)


def _times(c, f: sympy.Expr) -> sympy.Expr:
    """``c·f`` as SymPy builds it, for a rational ``c ≠ 0`` (QQ) and ``f`` a cosine or sine, or
    the negated sine ``plain_cos_sin`` gives for a negative turn: ``c`` first, then the function."""
    if isinstance(f, sympy.Mul):  # -sin φ
        c, f = -c, f.args[1]
    return product_of_distinct(qq_to_sympy(c), [f])


def _scaled(x: sympy.Expr, factor: sympy.Expr, distinct: bool) -> sympy.Expr:
    """``Σ_t t·factor`` over the terms ``t`` of a score built by :meth:`RotaryScores._score`.

    With ``distinct`` angles (a number, then rational multiples of distinct cosines and sines)
    and a rational factor or a rational times a square root (``1/√d_k``), it is built as SymPy
    builds it: each term's coefficient times the factor's, the root put among its functions in
    SymPy's order, the terms sorted. Anything else is left to SymPy's products and sum."""
    terms = _scaled_terms(x, factor) if distinct else None
    if terms is None:
        return sympy.Add(*[t * factor for t in sympy.Add.make_args(x)])
    return sum_of_distinct(terms)


def _scaled_terms(x: sympy.Expr, factor: sympy.Expr) -> "list | None":
    """The terms of :func:`_scaled`'s sum, each made directly; None where SymPy must build them."""
    c0, root = factor.as_coeff_Mul()
    if x == 0 or not (root == 1 or (isinstance(root, sympy.Pow) and root.base.is_Integer and root.base > 1
                                    and root.exp == sympy.S.Half)):
        return None
    out = []
    for t in sympy.Add.make_args(x):
        c, f = t.as_coeff_Mul()
        if not (f == 1 or isinstance(f, (sympy.cos, sympy.sin))):
            return None
        out.append(product_of_distinct(c * c0, [g for g in (root, f) if g != 1]))
    return out


_TURNED: dict = {}  # (angles, digits) -> {turn: [(cos, sin) of turn·θ_i]}, shared by Q_rot and K_rot


def _turned(thetas: tuple, dps: int):
    """``turn -> [(cos, sin) of turn·θ_i for each i]`` in balls at ``dps`` digits, each made once
    (the queries and the keys turn by the same positions); call it at that precision."""
    key = (thetas, dps)
    if key not in _TURNED:
        if len(_TURNED) >= 4:  # the precisions of one derivation: the few last kept
            _TURNED.clear()
        _TURNED[key] = ({}, [angle_ball(t) for t in thetas])
    made, angles = _TURNED[key]

    def at(turn: int) -> list:
        if turn not in made:
            made[turn] = [(angle * turn).sin_cos()[::-1] for angle in angles]
        return made[turn]
    return at


class RotatedT(Balled):
    """A rotated matrix transposed (the keys ``K_rotᵀ``), kept for the product of the scores."""

    def __init__(self, of: Rotated) -> None:
        self.of = of
        super().__init__(of.cols, of.rows, lambda i, j: of[j, i])

    def arb_values(self, dps: int) -> flint.arb_mat:
        return self.of.arb_values(dps).transpose()

    def terms(self) -> int:
        return self.of.terms()


class RotaryScores(Balled):
    """The scores ``Q_rot·K_rotᵀ`` (``factor`` None, ``allowed`` None), scaled by ``factor``, or
    with the mask added (``allowed``: rows of True where a query may attend; ``bias``: a
    rational matrix or None). Each exact entry is built as the general path builds it from the
    one before: ``tidy(s·factor)``, ``tidy(s + m)``."""

    def __init__(self, q: Rotated, k: Rotated, factor=None, allowed=None, bias=None, parent=None) -> None:
        self.q, self.k, self.factor, self.allowed, self.bias, self.parent = q, k, factor, allowed, bias, parent
        self._balls: dict[int, list] = {}
        super().__init__(q.rows, k.rows, self._entry_of)

    def scaled(self, factor: sympy.Expr) -> "RotaryScores | None":
        """These scores times ``factor`` (None when ``factor`` is no number the balls can hold)."""
        with arb_precision(15):
            if angle_ball(abs(factor)) is None and factor != 0:
                return None
        return RotaryScores(self.q, self.k, factor, parent=self)

    def masked(self, mask) -> "RotaryScores | None":
        """These scores plus the mask (None when the mask's bias is not rational)."""
        qq = getattr(mask, "qq_rows", None)
        if qq is None:
            return None
        allowed = [[x is not None for x in row] for row in qq]
        bias = None if all(x is None or x == 0 for row in qq for x in row) else qq
        return RotaryScores(self.q, self.k, allowed=allowed, bias=bias, parent=self)

    def _entry_of(self, i: int, j: int) -> sympy.Expr:
        if self.parent is None:
            return self._score(i, j)
        if self.allowed is None:  # s·factor expanded: the factor into each term
            x = self.parent[i, j]
            return _scaled(x, self.factor, self.q.distinct_angles)
        if not self.allowed[i][j]:
            return NEG_INF
        x = self.parent[i, j]  # a sum of distinct terms: adding a rational keeps it expanded
        return x if self.bias is None else x + qq_to_sympy(self.bias[i][j])

    def _score(self, i: int, j: int) -> sympy.Expr:
        """``q_rot_i · k_rot_j`` in its canonical form: ``α cos(dθ) + β sin(dθ)`` for each pair.

        With distinct angles the terms are distinct (one cos and one sin of each angle dθ_i, and
        one number), so the sum is SymPy's canonical one with its terms only put in order."""
        q, k = self.q._qq[i], self.k._qq[j]
        d = self.k.turns[j] - self.q.turns[i]
        paired = set()
        constant = 0
        terms = []
        for index, (a, b) in enumerate(self.q.pairs):
            paired.update((a, b))
            alpha = q[a] * k[a] + q[b] * k[b]
            if d == 0:
                constant += alpha
                continue
            beta = q[b] * k[a] - q[a] * k[b]
            c, s = self.q._cos_sin(d, index)
            if alpha:
                terms.append(_times(alpha, c))
            if beta:
                terms.append(_times(beta, s))
        constant += sum((q[c] * k[c] for c in range(self.q.cols) if c not in paired), 0)
        terms = ([qq_to_sympy(constant)] if constant else []) + terms
        return sum_of_distinct(terms) if self.q.distinct_angles else sympy.Add(*terms)

    def _product_at(self, dps: int) -> flint.arb_mat:
        with arb_precision(dps):
            return self.q.arb_values(dps) * self.k.arb_values(dps).transpose()

    def is_neg_inf(self, i: int, j: int) -> bool:
        """Whether entry ``(i, j)`` is −∞ (a masked score), told without building it."""
        if self.allowed is not None:
            return not self.allowed[i][j]
        return self.parent.is_neg_inf(i, j) if self.parent is not None else False

    def allowed_at(self, i: int) -> list[int]:
        """The 0-based keys query ``i`` may attend to."""
        if self.allowed is not None:
            return [j for j, ok in enumerate(self.allowed[i]) if ok]
        return self.parent.allowed_at(i) if self.parent is not None else list(range(self.cols))

    def arb_rows(self, dps: int) -> list:
        """The entries as rows of arb balls at ``dps`` digits (None where masked)."""
        if dps not in self._balls:
            with arb_precision(dps):
                if self.parent is None:
                    product = accurate(dps, self._product_at, lambda i, j: self[i, j] == 0)
                    rows = [[product[i, j] for j in range(self.cols)] for i in range(self.rows)]
                elif self.allowed is None:
                    factor = angle_ball(self.factor) if self.factor >= 0 else -angle_ball(-self.factor)
                    rows = [[x * factor for x in row] for row in self.parent.arb_rows(dps)]
                else:
                    rows = []
                    for i, row in enumerate(self.parent.arb_rows(dps)):
                        ok, b = self.allowed[i], None if self.bias is None else self.bias[i]
                        rows.append([None if not ok[j] else (x if b is None else x + fmpq(b[j]))
                                     for j, x in enumerate(row)])
                self._balls[dps] = rows
        return self._balls[dps]

    def arb_values(self, dps: int) -> list:
        return self.arb_rows(dps)

    def terms(self) -> int:
        """How many terms the exact entries have in all."""
        count = sum(len(self.allowed_at(i)) for i in range(self.rows))
        return count * max(1, 2 * len(self.q.pairs))


def accurate(dps: int, compute, zero=None) -> flint.arb_mat:
    """``compute(d)`` (an arb matrix in balls at ``d`` digits) for ``d`` = ``dps`` + :data:`GUARD_DPS`, then doubling,
    until every ball that is not exact holds ``dps`` digits; refused past :data:`MAX_ANGLE_DPS`
    digits. A ball around 0 whose entry ``zero(i, j)`` says is exactly 0 becomes 0."""
    need = prec_bits(dps) - 20
    d, zeros = dps + GUARD_DPS, {}
    while True:
        out = compute(d)
        loose = False
        for i in range(out.nrows()):
            for j in range(out.ncols()):
                x = out[i, j]
                if x.is_exact() or x.rel_accuracy_bits() >= need:
                    continue
                if zero is not None and 0 in x:
                    if (i, j) not in zeros:
                        zeros[(i, j)] = zero(i, j)
                    if zeros[(i, j)]:
                        out[i, j] = flint.arb(0)
                        continue
                loose = True
        if not loose:
            return out
        d *= 2
        if d > MAX_ANGLE_DPS:
            raise SymattnError(f"RoPE's values need more than {MAX_ANGLE_DPS:,} digits of its angles to hold "
                               f"{dps} digits (an angle p·θ_i beyond about 10^{MAX_ANGLE_DPS // 2}); use a smaller "
                               "base or smaller angles")


def rotated(m, thetas, pairs, turns) -> "Rotated | None":
    """The fast path's rotation of ``m``, or None where the general path must serve (inputs not
    rational, angles it does not cover, or nothing turned)."""
    if not is_rational(m) or not any(turns) or not plain_angles(thetas):
        return None
    return Rotated(m, thetas, pairs, turns)


def scores(a, b) -> "RotaryScores | None":
    """``a·b`` for rotated queries and transposed rotated keys of one rotation, else None."""
    if isinstance(a, Rotated) and isinstance(b, RotatedT) and a.thetas == b.of.thetas and a.pairs == b.of.pairs:
        return RotaryScores(a, b.of)
    return None


# -- the softmax of rotary scores ------------------------------------------------------------


def softmax_rows(masked: RotaryScores) -> tuple["RotaryRow", ...]:
    """The softmax rows of masked rotary scores, each with the position of its largest score."""
    rows = []
    for i in range(masked.rows):
        allowed = masked.allowed_at(i)
        if not allowed:
            raise SymattnError(f"row {i + 1} of the mask allows no key")
        rows.append(RotaryRow(masked, i, allowed, _largest(masked, i, allowed)))
    return tuple(rows)


def _largest(masked: RotaryScores, i: int, allowed: list[int]) -> int:
    """The first of the largest allowed scores of row ``i``, told apart in balls (more digits
    while two overlap), and exactly where two are equal."""
    dps, equal = 30, set()
    while True:
        row = masked.arb_rows(dps)[i]
        best = max(allowed, key=lambda j: row[j].mid())
        unsure = False
        for j in allowed:
            if j == best or (j, best) in equal or not row[j].overlaps(row[best]):
                continue
            if tidy(masked[i, j] - masked[i, best]) == 0:
                equal.update({(j, best), (best, j)})
                continue
            unsure = True
        if not unsure:
            ties = [j for j in allowed if j == best or (j, best) in equal]
            return min(ties)
        dps *= 2
        if dps > MAX_DPS:
            raise SymattnError(f"two scores of row {i + 1} agree to {MAX_DPS} digits without being equal in the "
                               "form symattn can compare; the largest cannot be told")


class _Lazy(Sequence):
    """A row's exponents or powers, each built when read (None or 0 where masked)."""

    __slots__ = ("_row", "_make", "_made")

    def __init__(self, row: "RotaryRow", make) -> None:
        self._row, self._make, self._made = row, make, {}

    def __len__(self) -> int:
        return self._row.width

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        j = position(j, len(self))
        if j not in self._made:
            self._made[j] = self._make(j)
        return self._made[j]


class RotaryRow(SoftmaxRow):
    """One softmax row over rotary scores: ``raw[j]`` (the exponent ``z_ij − m_i``) and the powers
    built when read; the weights from balls."""

    rational = False  # its exponents are sums of cosines and sines

    def __init__(self, masked: RotaryScores, i: int, allowed: list[int], best: int) -> None:
        object.__setattr__(self, "_masked", masked)
        object.__setattr__(self, "_i", i)
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_allowed_set", frozenset(allowed))
        object.__setattr__(self, "_best", best)
        object.__setattr__(self, "width", masked.cols)

    __hash__ = object.__hash__

    def __eq__(self, other) -> bool:
        return self is other

    def __repr__(self) -> str:
        return f"RotaryRow(row={self._i + 1}, largest at key {self._best + 1})"

    @property
    def maximum(self) -> sympy.Expr:
        return self._masked[self._i, self._best]

    @property
    def raw(self) -> _Lazy:
        return self.__dict__.setdefault("_raw", _Lazy(self, self._exponent))

    @property
    def terms(self) -> _Lazy:
        return self.__dict__.setdefault("_terms", _Lazy(self, self._power))

    def _exponent(self, j: int) -> "sympy.Expr | None":
        if j not in self._allowed_set:
            return None
        if j == self._best:
            return sympy.Integer(0)
        # two sums of distinct terms: their difference is collected as it is built
        return self._masked[self._i, j] - self.maximum

    def _power(self, j: int) -> sympy.Expr:
        e = self.raw[j]
        if e is None:
            return sympy.Integer(0)
        if e.is_Rational:
            return sympy.exp(e)
        # A sum of rational multiples of cosines, sines and square roots: SymPy's evaluation of the
        # power would look in each term for a logarithm or a multiple of iπ, and find none.
        return sympy.exp(e, evaluate=False)

    @property
    def _over_normaliser(self):
        """``x ↦ x / Z_i``, with ``Z_i^{-1}`` made once, unevaluated: ``Z_i`` is 1 plus powers of e
        with coefficient 1, which SymPy's evaluation of the power leaves as it is."""
        found = self.__dict__.get("_inverse")
        if found is None:
            if self.normaliser_is_number:
                found = lambda x: x / self.normaliser  # noqa: E731
            else:
                inverse = sympy.Pow(self.normaliser, -1, evaluate=False)
                found = lambda x: product_of_two(x, inverse)  # noqa: E731
            self.__dict__["_inverse"] = found
        return found

    def maximum_value(self, dps: int):
        """``m_i`` at ``dps`` digits (an mpmath number), from its ball."""
        return arb_to_mpf(self._masked.arb_rows(dps)[self._i][self._best])

    def needs_decimals(self) -> bool:
        """Whether some weight of the row is not a whole number (0 or 1)."""
        return len(self._allowed) > 1

    @property
    def has_balls(self) -> bool:
        return True

    def positions(self) -> list[int]:
        return self._allowed

    def is_masked(self, j: int) -> bool:
        return j not in self._allowed_set

    @property
    def normaliser_is_number(self) -> bool:
        """Whether ``Z_i`` is a plain number: every allowed score equals the largest."""
        found = self.__dict__.get("_number")
        if found is None:
            row = self._masked.arb_rows(30)[self._i]
            best = row[self._best]
            found = all(j == self._best or (row[j].overlaps(best) and self.raw[j] == 0) for j in self._allowed)
            self.__dict__["_number"] = found
        return found

    def _powers_at(self, dps: int):
        """The allowed positions' powers ``e^{z_ij − m_i}`` and their sum, as balls."""
        cache = self.__dict__.setdefault("_powers", {})
        if dps not in cache:
            row = self._masked.arb_rows(dps)[self._i]
            with arb_precision(dps):
                top = row[self._best]
                exps = [(row[j] - top).exp() for j in self._allowed]
                cache[dps] = (exps, sum(exps, flint.arb(0)))
        return cache[dps]

    def allowed_weights(self, dps: int) -> tuple[list[int], list]:
        exps, total = self._powers_at(dps)
        with arb_precision(dps):
            return self._allowed, [e / total for e in exps]

    def arb_weights(self, dps: int, keep: bool = True) -> list:
        _, weights = self.allowed_weights(dps)
        out = [flint.arb(0)] * self.width
        for j, w in zip(self._allowed, weights):
            out[j] = w
        return out

    def _evaluate(self, dps: int, subs):
        weights = self.arb_weights(dps)
        return [arb_to_mpf(w) for w in weights], arb_to_mpf(self._powers_at(dps)[1])


def terms_of(value) -> "int | None":
    """How many terms a rotary value's exact entries have in all; None for any other value."""
    if isinstance(value, (Rotated, RotatedT, RotaryScores)):
        return value.terms()
    rows = getattr(value, "rows", None)
    if isinstance(value, (Softmax, Output)) and rows and isinstance(rows[0], RotaryRow):
        per = 4 * len(rows[0]._masked.q.pairs)
        weights = sum(len(r._allowed) for r in rows) * per
        return weights * (value.values.cols if isinstance(value, Output) else 1)
    return None


def is_rotary(value) -> bool:
    return terms_of(value) is not None


def needs_decimals(value) -> bool:
    """Whether some entry of a rotary value is not a whole number (or −∞), read from its balls:
    a ball of radius 0 is its exact value."""
    if isinstance(value, Softmax):
        return any(row.needs_decimals() for row in value.rows)
    if isinstance(value, Output):  # a row of several keys: its outputs are fractions over Z_i
        from .lazy import all_integers

        v = value.values
        return any(row.needs_decimals() for row in value.rows) or not (is_rational(v) and all_integers(v))
    rows = value.ball_rows(30)
    return any(x is not None and not (x.is_exact() and x.is_integer()) for row in rows for x in row)


__all__ = ["EXACT_TERMS", "Rotated", "RotatedT", "RotaryRow", "RotaryScores", "is_rotary", "rotated", "scores",
           "softmax_rows", "terms_of"]
