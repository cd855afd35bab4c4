"""Rotary position embeddings (RoPE), exactly: the angles, the two pairings and the rotation.

RoPE rotates each pair of a query's (and a key's) components by the angle ``p·θ_i``, where
``p`` is the token's position (0 for the first token, as the libraries count) and
``θ_i = base^{-2i/d_k}`` for pair ``i = 0 … d_k/2 − 1`` (or angles the problem gives, such as
π/6, whose cosines and sines are exact algebraic numbers). Which components make pair ``i`` is
the *pairing*:

- ``half`` (GPT-NeoX, LLaMA in Hugging Face, ``rotate_half``): component ``i`` with ``i + d_k/2``;
- ``interleaved`` (the RoFormer paper, Meta's original LLaMA code): ``2i`` with ``2i + 1``.

A pair ``(x_a, x_b)`` at angle φ becomes ``(x_a cos φ − x_b sin φ, x_a sin φ + x_b cos φ)``.
Everything here is exact (SymPy); the independent NumPy rotation is in :mod:`symattn.reference.numeric`.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy import QQ

PAIRINGS = ("half", "interleaved")
DEFAULT_PAIRING = "half"
DEFAULT_BASE = 10000


@dataclass(frozen=True)
class Rope:
    """A problem's rotary embedding: the pairing and either the base or the angles θ_i."""

    pairing: str = DEFAULT_PAIRING
    base: sympy.Expr | None = None  # θ_i = base^(−2i/d_k); None when the angles are given
    angles: tuple[sympy.Expr, ...] | None = None

    def thetas(self, d_k: int) -> tuple[sympy.Expr, ...]:
        """θ_0 … θ_{d_k/2 − 1}, exactly."""
        if self.angles is not None:
            return self.angles
        return tuple(sympy.Pow(self.base, sympy.Rational(-2 * i, d_k)) for i in range(d_k // 2))

    def pairs(self, d_k: int) -> list[tuple[int, int]]:
        """The 0-based components ``(a, b)`` of each pair, pair by pair."""
        return pairs(d_k, self.pairing)

    def plain(self, d_k: int) -> bool:
        """Whether RoPE's fast path takes this rotation's angles (see :func:`plain_angles`)."""
        return plain_angles(self.thetas(d_k))

    def rule(self) -> str:
        """The angles in words (math marked ⟦…⟧, see symattn.render.prose)."""
        if self.angles is not None:
            return "the angles are given: " + ", ".join(
                f"⟦\\theta_{{{i + 1}}} = {sympy.latex(a)}⟧" for i, a in enumerate(self.angles))
        return f"⟦\\theta_i = {sympy.latex(self.base)}^{{-2(i-1)/d_k}}⟧ for pair ⟦i = 1, \\dots, d_k/2⟧"


def angle_ball(x: sympy.Expr):
    """The angle ``x`` as an arb ball (at flint's working precision), or None when it is not a
    product of rationals and rational powers of positive rationals (as ``base^{-2i/d_k}`` is)."""
    import flint

    if isinstance(x, sympy.Rational):
        return flint.arb(flint.fmpq(int(x.p), int(x.q)))
    if isinstance(x, sympy.Pow) and isinstance(x.base, sympy.Rational) and x.base > 0 \
            and isinstance(x.exp, sympy.Rational):
        base = flint.arb(flint.fmpq(int(x.base.p), int(x.base.q)))
        return base ** flint.arb(flint.fmpq(int(x.exp.p), int(x.exp.q)))
    if isinstance(x, sympy.Mul):
        total = flint.arb(1)
        for factor in x.args:
            ball = angle_ball(factor)
            if ball is None:
                return None
            total *= ball
        return total
    return None


def plain_angles(thetas) -> bool:
    """Whether every angle is a positive algebraic number :func:`angle_ball` reads: then each
    cos(dθ) and sin(dθ) stays as it is (SymPy evaluates none), and, by the Lindemann–Weierstrass
    theorem, a sum of rational multiples of them is 0 only when its canonical form is. RoPE's fast
    path (:mod:`symattn.exact.rotary`) takes such angles; π/6 and the like take the general path."""
    return all(plain_angle(t) for t in thetas)


def plain_angle(x: sympy.Expr) -> bool:
    """Whether ``x`` is one such angle: positive, and a rational or a product of rationals and
    rational powers of positive rationals (RoPE's ``t·base^{-2i/d_k}``)."""
    return x != 0 and bool(x.is_positive) and angle_ball(x) is not None


def plain_cos_sin(turn: int, theta: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """``cos_sin(turn·θ)`` for a plain angle θ (see :func:`plain_angles`), as SymPy writes it: cos of
    the positive angle |turn|·θ, and sin with the sign of ``turn``, made without SymPy's evaluation
    (which, for such an angle, looks for a multiple of π and finds none)."""
    if turn == 0:
        return sympy.Integer(1), sympy.Integer(0)
    angle = abs(turn) * theta
    c, s = sympy.cos(angle, evaluate=False), sympy.sin(angle, evaluate=False)
    return (c, s) if turn > 0 else (c, -s)


def pairs(d_k: int, pairing: str) -> list[tuple[int, int]]:
    """The 0-based components of each pair: half pairs i with i + d_k/2, interleaved 2i with 2i + 1."""
    half = d_k // 2
    if pairing == "half":
        return [(i, i + half) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def other(pairing: str) -> str:
    """The other pairing (a student's classic swap)."""
    return "interleaved" if pairing == "half" else "half"


def cos_sin(angle: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """cos and sin of an exact angle, exactly (SymPy evaluates π/6 to √3/2; cos(1) stays cos(1))."""
    return sympy.cos(angle), sympy.sin(angle)


def rotate(m, thetas, pair_list, positions=None, sign: int = 1):
    """Row ``p`` of ``m`` (at position ``positions[p]``, default ``p``) with each pair rotated by
    ``sign·position·θ_i``, exactly; a rational result is a rational matrix (the fast paths keep
    it)."""
    from ..numbers.matrices import rational_matrix, tidy

    rows, cols = m.rows, m.cols
    out = [[None] * cols for _ in range(rows)]
    for r in range(rows):
        p = r if positions is None else positions[r]
        for k in range(cols):
            out[r][k] = m[r, k]  # a component in no pair (none when d_k is even) stays
        for (a, b), theta in zip(pair_list, thetas):
            c, s = cos_sin(sign * p * theta)
            xa, xb = m[r, a], m[r, b]
            out[r][a] = tidy(xa * c - xb * s)
            out[r][b] = tidy(xa * s + xb * c)
    flat = [x for row in out for x in row]
    if all(isinstance(x, sympy.Rational) for x in flat):
        return rational_matrix(rows, cols, [QQ(int(x.p), int(x.q)) for x in flat])
    return sympy.ImmutableMatrix(out)


# -- what the worked solution shows ------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One token's rotation of one pair, as a 2×2 block: ``(out_a, out_b) = R(angle)·(x_a, x_b)``."""

    token: int  # 0-based row (its position)
    pair: int  # 0-based pair
    a: int  # 0-based components
    b: int
    angle: sympy.Expr  # position·θ_pair
    cos: sympy.Expr
    sin: sympy.Expr
    x: tuple[sympy.Expr, sympy.Expr]
    out: tuple[sympy.Expr, sympy.Expr]


def turn(rope: Rope, before, after, d_k: int) -> Turn:
    """The second token's first pair (the first token's, with one token), from the matrices
    before and after the rotation."""
    r = 1 if before.rows > 1 else 0
    a, b = rope.pairs(d_k)[0]
    angle = r * rope.thetas(d_k)[0]
    c, s = cos_sin(angle)
    return Turn(r, 0, a, b, angle, c, s, (before[r, a], before[r, b]), (after[r, a], after[r, b]))


@dataclass(frozen=True)
class Relative:
    """The property that makes RoPE, for the query at position ``p`` and the key at ``r``:
    ``q_p^rot · k_r^rot`` (the score) equals ``q_p · R((r − p)θ) k_r`` exactly."""

    query: int  # 0-based positions
    key: int
    q: tuple[sympy.Expr, ...]  # the unrotated query and key
    k: tuple[sympy.Expr, ...]
    k_relative: tuple[sympy.Expr, ...]  # R((r − p)θ)·k_r
    score: sympy.Expr  # q_p^rot · k_r^rot, the entry of S
    relative: sympy.Expr  # q_p · R((r − p)θ) k_r
    difference: sympy.Expr  # score − relative, simplified (0)

    @property
    def offset(self) -> int:
        return self.key - self.query


def relative(rope: Rope, Q, K, S, d_k: int) -> "Relative | None":
    """The property for the last query and the key before it (None with a single token)."""
    from ..numbers.matrices import tidy, tidy_trig

    n = min(Q.rows, K.rows)
    if n < 2:
        return None
    p, r = n - 1, n - 2
    thetas, pair_list = rope.thetas(d_k), rope.pairs(d_k)
    k = tuple(K[r, c] for c in range(K.cols))
    q = tuple(Q[p, c] for c in range(Q.cols))
    score = S[p, r]
    if all(isinstance(x, sympy.Rational) for x in q + k) and plain_angles(thetas):
        k_rel, value = _relative_plain(q, k, thetas, pair_list, r - p)
        if score - value == 0:  # one canonical form: SymPy's sum cancels it term by term
            return Relative(p, r, q, k, k_rel, score, value, sympy.Integer(0))
    else:
        k_row = sympy.ImmutableMatrix([list(k)])
        k_rel = rotate(k_row, thetas, pair_list, [r - p])
        k_rel = tuple(k_rel[0, c] for c in range(K.cols))
        # q is not rotated, so no product of a cosine and a sine arises: expanding collects the terms.
        value = tidy(sympy.Add(*[x * y for x, y in zip(q, k_rel)]))
    difference = tidy(score - value)
    if difference != 0:  # forms that expanding alone does not bring together
        difference = sympy.simplify(tidy_trig(difference))
    return Relative(p, r, q, k, k_rel, score, value, difference)


def _relative_plain(q, k, thetas, pair_list, offset: int):
    """``R(offset·θ)·k`` and ``q · R(offset·θ)·k`` for rational ``q``, ``k`` and plain angles, in the
    canonical forms :func:`rotate` and expanding reach, built directly: each turned entry is
    ``k_a cos φ − k_b sin φ`` (or ``k_a sin φ + k_b cos φ``), and the dot product collects the
    rational coefficient of each cosine, sine and 1 over the components."""
    k_rel = list(k)  # a component in no pair stays
    for (a, b), theta in zip(pair_list, thetas):
        c, s = plain_cos_sin(offset, theta)
        k_rel[a] = k[a] * c - k[b] * s
        k_rel[b] = k[a] * s + k[b] * c
    collected: dict = {}
    for x, y in zip(q, k_rel):
        if x == 0:
            continue
        for factor, coefficient in y.as_coefficients_dict().items():
            collected[factor] = collected.get(factor, 0) + x * coefficient
    value = sympy.Add(*[c * f for f, c in collected.items() if c != 0])
    return tuple(k_rel), value
