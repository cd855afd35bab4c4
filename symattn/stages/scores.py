"""The registry's rows that change the scores before the softmax: soft-capping (``softcap: c``,
Gemma 2's) and a temperature (``temperature: T``).

    S_capped = c·tanh(S_scaled / c)        before the mask: the mask then reads S_capped  (n_q × n_k)
    S_temp = Ŝ / T                         after the mask: the softmax then reads S_temp  (n_q × n_k)
    cap_row, temp_row                      the last query's weights without and with it, one row each  (2 × n_k)

and the common mistakes of each: soft-capping after the mask (the masked −∞ become −c) or of the
unscaled scores, the temperature multiplied instead of divided, and either left out.
"""

from __future__ import annotations

import sympy

from .ids import A, CAP_ROW, CAP_ROWS, KEYS, M, QUERIES, S, S_CAPPED, S_MASKED, S_SCALED, S_TEMP, TEMP_ROW, TEMP_ROWS
from .kinds import Context, Kind, Mistake
from .shapes import plain


def capped(c: Context) -> bool:
    return getattr(c.p, "softcap", None) is not None


def tempered(c: Context) -> bool:
    return getattr(c.p, "temperature", None) is not None


def _num(x) -> str:
    return sympy.latex(x)


def cap(ops, z, c: Context):
    """``z`` soft-capped when the problem caps its scores, else ``z``."""
    return ops.softcap(z, c.p.softcap) if capped(c) else z


def temper(ops, z, c: Context):
    """``z`` divided by the temperature when the problem has one, else ``z``."""
    return ops.scale(z, 1 / c.p.temperature) if tempered(c) else z


def finish(ops, scaled, mask, c: Context):
    """What the softmax reads, from scaled scores and the mask: capped, masked, divided by T."""
    return temper(ops, ops.add_mask(cap(ops, scaled, c), mask), c)


def qk_bound(c: Context) -> str:
    """The bound QK-norm puts on every scaled score, proved and stated with this head's numbers ('' without it)."""
    n = getattr(c.p, "qk_norm", None)
    if n is None:
        return ""
    gq, gk, d = n.q.largest_gain, n.k.largest_gain, c.d_k
    bound = c.factor * gq * gk * d
    value = sympy.N(bound, 4)
    rope = " and RoPE's rotations keep lengths" if c.rope is not None else ""
    return (f" With QK-norm every score is bounded, whatever the inputs: a normalised row has mean square "
            f"⟦\\mathrm{{ms}}_i/(\\mathrm{{ms}}_i + \\varepsilon) \\le 1⟧, so its length ⟦|q_i|⟧ is at most "
            f"⟦\\sqrt{{d_k}} = {_num(sympy.sqrt(d))}⟧; ⟦\\gamma⟧ stretches it by at most its largest entry, "
            f"⟦\\max_k|\\gamma_{{q,k}}| = {_num(gq)}⟧ and ⟦\\max_k|\\gamma_{{k,k}}| = {_num(gk)}⟧{rope}; so by "
            f"Cauchy–Schwarz ⟦|S_{{ij}}| \\le |q_i|\\,|k_j| \\le "
            f"\\max|\\gamma_q|\\,\\max|\\gamma_k|\\,d_k⟧ and each scaled score has "
            f"⟦|S_{{\\mathrm{{scaled}},ij}}| \\le {_num(c.factor)} \\cdot {_num(gq)} \\cdot {_num(gk)} "
            f"\\cdot {d} = {_num(bound)}⟧" + ("" if bound.is_Integer else f" ≈ {value}") + " here.")


def _last(c: Context) -> int:
    return c.p.n_q - 1


def _row_why(c: Context, what: str) -> str:
    i = _last(c)
    return (f"The last query's row (row {i + 1}, {c.p.tokens[i]}) of weights computed twice, side by side: "
            f"{what} The two rows have the same keys masked and each sums to ⟦1⟧.")


_CAP_WHY = (
    "Soft-capping (Gemma 2's) replaces each scaled score ⟦s⟧ by ⟦c \\cdot \\tanh(s/c)⟧ with ⟦c = {c}⟧, before the mask. "
    "⟦\\tanh⟧ keeps a small score almost as it is (⟦c \\cdot \\tanh(s/c) \\approx s⟧ when ⟦|s|⟧ is small beside ⟦c⟧) and "
    "bounds every score to the open interval ⟦(-{c}, {c})⟧, so no key can take nearly all of a row's weight "
    "however large its score grows: each allowed weight is at least ⟦e^{{-2c}}/n_k⟧. Each entry is the exact "
    "⟦\\tanh⟧ of an exact argument; its decimals are certified, computed in ball arithmetic from that exact value."
)
_TEMP_WHY = (
    "The masked scores are divided by the temperature ⟦T = {t}⟧ before the softmax. A temperature above ⟦1⟧ "
    "flattens each row's weights toward uniform, one below ⟦1⟧ sharpens them toward the row's largest score; a "
    "masked ⟦-\\infty⟧ stays ⟦-\\infty⟧, so the mask is kept."
)
NOT_CAPPED = "the cap was left out: the scaled scores were copied"
CAP_UNSCALED = "soft-capped the unscaled scores: c·tanh(S/c) of S, not of S/√d_k (the cap comes after the scaling)"
CAP_NO_C = "tanh(s/c) was not multiplied back by c"
CAP_AFTER_MASK = ("soft-capped after the mask: c·tanh(−∞/c) = −c, so the masked keys got a score of −c (and a "
                  "weight) instead of −∞")
TEMP_TIMES = "multiplied by T instead of dividing"
TEMP_MISSING = "the temperature was left out: the masked scores were not divided by T"


def _cap_mistakes() -> tuple[Mistake, ...]:
    return (
        Mistake(NOT_CAPPED, lambda ops, ex, c: ex(S_SCALED)),
        Mistake(CAP_UNSCALED, lambda ops, ex, c: ops.softcap(ex(S), c.p.softcap)),
        Mistake(CAP_NO_C, lambda ops, ex, c: ops.scale(ops.softcap(ex(S_SCALED), c.p.softcap), 1 / c.p.softcap)),
    )


def masked_mistakes() -> tuple[Mistake, ...]:
    """The soft-capping slips as they show in the masked scores Ŝ."""
    return (
        Mistake(CAP_AFTER_MASK, lambda ops, ex, c: ops.softcap(ops.add_mask(ex(S_SCALED), ex(M)), c.p.softcap)
                if capped(c) else None),
        Mistake(NOT_CAPPED, lambda ops, ex, c: ops.add_mask(ex(S_SCALED), ex(M)) if capped(c) else None),
        Mistake(CAP_UNSCALED, lambda ops, ex, c: ops.add_mask(ops.softcap(ex(S), c.p.softcap), ex(M))
                if capped(c) else None),
    )


def weight_mistakes() -> tuple[Mistake, ...]:
    """The slips of soft-capping and the temperature carried to the weights A."""

    def softmax_of(z_of):
        def relation(ops, ex, c):
            z = z_of(ops, ex, c)
            return None if z is None else ops.softmax(z)

        return relation

    return (
        Mistake(CAP_AFTER_MASK, softmax_of(lambda ops, ex, c: temper(
            ops, ops.softcap(ops.add_mask(ex(S_SCALED), ex(M)), c.p.softcap), c) if capped(c) else None)),
        Mistake(NOT_CAPPED, softmax_of(lambda ops, ex, c: temper(ops, ops.add_mask(ex(S_SCALED), ex(M)), c)
                                       if capped(c) else None)),
        Mistake(CAP_UNSCALED, softmax_of(lambda ops, ex, c: finish(ops, ex(S), ex(M), c) if capped(c) else None)),
        Mistake(TEMP_TIMES, softmax_of(lambda ops, ex, c: ops.scale(ex(S_MASKED), c.p.temperature)
                                       if tempered(c) else None)),
        Mistake(TEMP_MISSING, softmax_of(lambda ops, ex, c: ex(S_MASKED) if tempered(c) else None)),
    )


def _side_by_side(ops, without, with_, c: Context):
    i = _last(c)
    return ops.vstack([ops.softmax(ops.rows(without, i, 1)), ops.softmax(ops.rows(with_, i, 1))])


def score_rows() -> tuple[Kind, ...]:
    return (
        # S_capped = c·tanh(S_scaled / c)  (n_q × n_k)
        Kind(S_CAPPED, S_CAPPED, 11.5, "softcap", "Soft-cap the scores",
             lambda c: _CAP_WHY.format(c=_num(c.p.softcap)),
             lambda c: (f"\\tilde{{S}} = {_num(c.p.softcap)}\\,\\tanh\\!\\left(S_{{\\mathrm{{scaled}}}} / {_num(c.p.softcap)}\\right)",
                        f"S̃ = c·tanh(S_scaled / c),  c = {sympy.sstr(c.p.softcap)}"),
             (QUERIES, KEYS), lambda sh, r, c: plain(r, "n_q × n_k") + ", every entry in (−c, c)",
             inputs=(S_SCALED,), relation=lambda ops, v, c: ops.softcap(v(S_SCALED), c.p.softcap),
             when=capped, per_head=True, tex="\\tilde{S}", mistakes=_cap_mistakes()),
        # S_temp = Ŝ / T  (n_q × n_k)
        Kind(S_TEMP, S_TEMP, 13.5, "temperature", "Divide by the temperature",
             lambda c: _TEMP_WHY.format(t=_num(c.p.temperature)),
             lambda c: (f"\\hat{{S}}_T = \\hat{{S}} / {_num(c.p.temperature)}",
                        f"S_temp = Ŝ / T,  T = {sympy.sstr(c.p.temperature)}"),
             (QUERIES, KEYS), lambda sh, r, c: plain(r, "n_q × n_k"),
             inputs=(S_MASKED,), relation=lambda ops, v, c: ops.scale(v(S_MASKED), 1 / c.p.temperature),
             when=tempered, per_head=True, tex="\\hat{S}_T",
             mistakes=(Mistake(TEMP_TIMES, lambda ops, ex, c: ops.scale(ex(S_MASKED), c.p.temperature)),
                       Mistake(TEMP_MISSING, lambda ops, ex, c: ex(S_MASKED)))),
    )


def comparison_rows() -> tuple[Kind, ...]:
    return (
        # the last query's weights: softmax of its row without the cap, then with it  (2 × n_k)
        Kind(CAP_ROW, CAP_ROW, 14.2, "softmax", "One row's weights without and with the cap",
             lambda c: _row_why(c, "above, the softmax of the scores without the cap (everything else the same); "
                                   "below, with it, the row of ⟦A⟧. The cap pulls the largest scores in, so the "
                                   "weights are flatter where the scores are large beside ⟦c⟧."),
             ("A_{i,:}\\ \\text{without and with the cap}", "row i of A without and with the cap"),
             (CAP_ROWS, KEYS), lambda sh, r, c: plain(r, "2 × n_k: without, with"),
             inputs=(S_SCALED, M, "a_in"),
             relation=lambda ops, v, c: _side_by_side(ops, temper(ops, ops.add_mask(v(S_SCALED), v(M)), c),
                                                      v("a_in"), c),
             when=capped, per_head=True, tex="A_{\\text{cap}}", shows=frozenset({"softmax"})),
        # the last query's weights: softmax of its row at T = 1, then at T  (2 × n_k)
        Kind(TEMP_ROW, TEMP_ROW, 14.3, "softmax", "One row's weights without and with the temperature",
             lambda c: _row_why(c, "above, the softmax of the masked scores at ⟦T = 1⟧; below, at ⟦T = "
                                   f"{_num(c.p.temperature)}⟧, the row of ⟦A⟧. "
                                   + ("A temperature above ⟦1⟧ makes the row flatter." if c.p.temperature > 1
                                      else "A temperature below ⟦1⟧ makes the row sharper.")),
             ("A_{i,:}\\ \\text{at}\\ T = 1\\ \\text{and at}\\ T", "row i of A at T = 1 and at T"),
             (TEMP_ROWS, KEYS), lambda sh, r, c: plain(r, "2 × n_k: T = 1, then T"),
             inputs=(S_MASKED, S_TEMP),
             relation=lambda ops, v, c: _side_by_side(ops, v(S_MASKED), v(S_TEMP), c),
             when=tempered, per_head=True, tex="A_{T}", shows=frozenset({"softmax"})),
    )
