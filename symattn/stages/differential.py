"""The rows of differential attention (``differential: {lambda, W_Q2, W_K2}``; Ye et al. 2024, "Differential
Transformer"): two softmax maps over the same values, the second subtracted from the first.

- the first map is the usual one (``S`` … ``A``, named A₁ in the prose);
- the second map: its weights ``W_Q2``, ``W_K2``, its queries and keys ``Q_2``, ``K_2`` (rotated,
  ``Q_2rot``, ``K_2rot``, under RoPE), its scores ``S_2``, scaled and masked as the first map's
  (``S_2masked``, the same M), and its weights ``A_2``;
- the differential map ``A_diff`` = A − λ·A_2, its row sums ``A_diff_sums`` (each exactly 1 − λ) and
  the output ``O`` = A_diff·V (key ``O_diff``);
- with the paper's per-head norm (``diff_transformer:``): ``O_ms``, each output row's mean square, and
  ``O_subln`` = O/√(ms + ε)·(1 − λ_init), what the heads' concatenation (or the layer) reads.
"""

from __future__ import annotations

import sympy

from .ids import (
    A, A_2, A_DIFF, A_DIFF_SUMS, K_2, K_2ROT, KEYS, M, MEAN_SQUARE, O, O_DIFF, O_MS, O_SUBLN, Q_2, Q_2ROT,
    QUERIES, ROW_SUM, S_2, S_2MASKED, V, W_K2, W_Q2,
)
from .kinds import Context, Kind, Mistake
from .mistakes import NO_SCALING
from .shapes import flip, plain, prod

# the headline formula of a differential solution, (LaTeX, plain text)
FORMULA = ("\\operatorname{DiffAttn}(X) = \\left(\\operatorname{softmax}\\!\\left(\\frac{Q_1 K_1^{\\top}}{\\sqrt{d_k}} + M"
           "\\right) - \\lambda\\,\\operatorname{softmax}\\!\\left(\\frac{Q_2 K_2^{\\top}}{\\sqrt{d_k}} + M\\right)\\right) V",
           "DiffAttn(X) = (softmax(Q₁·K₁ᵀ/√d_k + M) − λ·softmax(Q₂·K₂ᵀ/√d_k + M))·V")
WRONG_MAP = "λ applied to the wrong map: A_2 − λ·A₁ (or λ·(A₁ − A_2)) instead of A₁ − λ·A_2"
ADDED = "the maps added instead of subtracted: A₁ + λ·A_2 instead of A₁ − λ·A_2"
NO_LAMBDA = "λ left out: A₁ − A_2 instead of A₁ − λ·A_2"
NO_INIT = "(1 − λ_init) left out: the normalised rows were not multiplied by 1 − λ_init"


def differential(c: Context) -> bool:
    """The problem's attention is differential (``differential:``)."""
    return c.differential is not None


def paper(c: Context) -> bool:
    """Differential attention with the paper's per-head norm and (1 − λ_init)."""
    return c.differential is not None and c.differential.paper is not None


def not_differential(c: Context) -> bool:
    """The softmax's own output O = A·V applies: softmax attention that is not differential."""
    return c.linear is None and c.differential is None


def head_out(c: Context) -> str:
    """The key of a head's output the layer reads: O, or O_subln with the paper's per-head norm."""
    return O_SUBLN if paper(c) else O


def lam(c: Context):
    return c.differential.lam


def _num(x) -> str:
    return sympy.latex(x)


def _maps(ops, ex, c: Context, first_factor, second_factor):
    """first_factor·A₁ + second_factor·A_2 (the factors exact numbers)."""
    return ops.sum([ops.scale(ex(A), first_factor), ops.scale(ex(A_2), second_factor)])


# the slips of the differential map, as relations on the exact A₁ and A_2
SLIPS = (
    (WRONG_MAP, lambda ops, ex, c: _maps(ops, ex, c, -lam(c), 1)),
    (WRONG_MAP, lambda ops, ex, c: _maps(ops, ex, c, lam(c), -lam(c))),
    (ADDED, lambda ops, ex, c: _maps(ops, ex, c, 1, lam(c))),
    (NO_LAMBDA, lambda ops, ex, c: _maps(ops, ex, c, 1, -1)),
)


def _carried(then):
    """The differential map's slips carried on by ``then(ops, slipped_map, ex, c)``."""
    return tuple(Mistake(name, lambda ops, ex, c, slip=slip: then(ops, slip(ops, ex, c), ex, c)) for name, slip in SLIPS)


def _row_sums(ops, m, c: Context):
    return ops.matmul(m, ops.ones(c.p.n_k, 1))


def _normalised(ops, o, c: Context):
    n = c.differential.paper
    return ops.normalise(o, None, ops.row_spread(o, None), n.eps)


def negative_note(value) -> str:
    """The sentence naming the differential map's negative weights (1-based rows and columns)."""
    where = [f"row {i + 1}, column {j + 1}" for i in range(value.rows) for j in range(value.cols)
             if value[i, j] != 0 and sympy.N(value[i, j], 30) < 0]
    if not where:
        return " Here no weight is negative: the second map never outweighs the first."
    return (" Here " + ("the weight at " + where[0] + " is" if len(where) == 1 else "the weights at " + "; ".join(where)
                        + " are") + " negative: the second map puts more weight there than the first, so the "
            "difference takes the value row away from the output.")


WHY = {
    W_Q2: lambda c: ("Differential attention computes a second attention map from the same tokens with its own "
                     "query weights ⟦W_{Q2}⟧ (the shape of ⟦W_Q⟧)."),
    W_K2: lambda c: "… and its own key weights ⟦W_{K2}⟧ (the shape of ⟦W_K⟧). The values ⟦V⟧ are shared by both maps.",
    Q_2: lambda c: "The second map's queries, one row per token, as ⟦Q⟧ is made.",
    K_2: lambda c: "The second map's keys, one row per token, as ⟦K⟧ is made.",
    Q_2ROT: lambda c: "RoPE turns the second map's queries exactly as it turned the first map's.",
    K_2ROT: lambda c: "… and the second map's keys.",
    S_2: lambda c: "Every query of the second map against every key of the second map: ⟦S_2 = Q_2 K_2^{\\top}⟧.",
    S_2MASKED: lambda c: (f"The second map's scores go through the same scale ⟦{_num(c.factor)}⟧ and the same mask ⟦M⟧ "
                          "as the first map's: ⟦\\hat{S}_2 = S_2 \\cdot " + _num(c.factor) + " + M⟧."),
    A_2: lambda c: ("Softmax on each row of ⟦\\hat{S}_2⟧: the second map ⟦A_2⟧. Like the first map ⟦A_1⟧ (the weights "
                    "⟦A⟧ above), each of its rows is positive where allowed and sums to ⟦1⟧."),
    A_DIFF: lambda c: (f"The differential map subtracts ⟦{{\\lambda}} = {_num(lam(c))}⟧ times the second map from the first: "
                       f"⟦A_{{diff}} = A_1 - {_num(lam(c))}\\,A_2⟧. Where the second map puts more weight than "
                       f"⟦A_1/\\lambda⟧ the difference is negative: the weight is taken away. Attention that both maps "
                       "put on the same keys (common-mode noise, such as weight spread over context that matters to "
                       "neither) cancels in the difference, as a differential amplifier cancels the noise common to its "
                       "two inputs; what is left is the attention the first map gives and the second does not."),
    A_DIFF_SUMS: lambda c: (f"Each row of ⟦A_{{diff}}⟧ sums to ⟦1 - {{\\lambda}} = {_num(1 - lam(c))}⟧: each softmax row sums "
                            f"to ⟦1⟧, so ⟦\\sum_j (A_1 - \\lambda A_2)_{{ij}} = 1 - \\lambda⟧, exactly."),
    O_DIFF: lambda c: ("Each output row is the sum of the value rows weighted by the differential map, negative "
                       "weights included: ⟦O = A_{diff}\\,V = A_1 V - \\lambda\\,A_2 V⟧."),
    O_MS: lambda c: ("The paper normalises each head's output on its own (its GroupNorm, \"subln\": RMSNorm of the "
                     "head's row, no learned weight): first each row's mean square ⟦\\mathrm{ms}_i = \\frac{1}{d_v}"
                     "\\sum_k O_{ik}^2⟧."),
    O_SUBLN: lambda c: (f"Each row divided by ⟦\\sqrt{{\\mathrm{{ms}}_i + \\varepsilon}}⟧ with ⟦\\varepsilon = "
                        f"{_num(c.differential.paper.eps)}⟧, then multiplied by ⟦1 - \\lambda_{{init}} = "
                        f"{_num(1 - c.differential.paper.lambda_init)}⟧ (⟦\\lambda_{{init}} = "
                        f"{_num(c.differential.paper.lambda_init)}⟧), which keeps the gradient flow like a plain "
                        "Transformer's. This is the head's output the rest of the layer reads."),
}


def _kind(key, name, order, section, title, formula, axes, shape, inputs, relation, **kw) -> Kind:
    return Kind(key, name, order, section, title, WHY[key], formula, axes, shape, inputs=inputs, relation=relation,
                when=kw.pop("when", differential), per_head=True, **kw)


def _weights(key: str, order: float, title: str, like: str) -> Kind:
    index = 0 if key == W_Q2 else 1
    return _kind(key, key, order, "second_map", title, (f"W_{{{key[2:]}}}", key), ("d", key[2].lower()),
                 lambda sh, r, c, like=like: plain(r, f"d_model × d_k, like {like}"), (), None,
                 source=lambda c, index=index: c.differential.maps[(c.head or 1) - 1][index], labelled=False)


def _projection(key: str, weights: str, order: float, title: str) -> Kind:
    letter = key[0]
    return _kind(key, key, order, "second_map", title,
                 lambda c: (f"{letter}_2 = {c.xq_name}\\,W_{{{letter}2}}", f"{key} = {c.plain(c.xq_name)}·{weights}"),
                 (QUERIES if letter == "Q" else KEYS, letter.lower()),
                 lambda sh, r, c: prod(sh(c.xq), sh(weights), "n × d_k"), ("xq", weights),
                 lambda ops, v, c: ops.matmul(v(c.xq), v(weights)), tex=f"{letter}_2", slips=True)


def _rotated(key: str, base: str, order: float, title: str) -> Kind:
    letter = base[0]
    return _kind(key, key, order, "second_map", title,
                 (f"{letter}_2^{{\\mathrm{{rot}}}} = \\operatorname{{RoPE}}({letter}_2)", f"{key} = RoPE({base})"),
                 (QUERIES if letter == "Q" else KEYS, letter.lower()), lambda sh, r, c: plain(r, f"like {base}"), (base,),
                 lambda ops, v, c: ops.rotate(v(base), *c.rotation()), when=lambda c: differential(c) and c.rope is not None,
                 tex=f"{letter}_2^{{\\mathrm{{rot}}}}")


def _q2(c: Context) -> str:
    return Q_2ROT if c.rope is not None else Q_2


def _k2(c: Context) -> str:
    return K_2ROT if c.rope is not None else K_2


def second_map_rows() -> tuple[Kind, ...]:
    """The second map, from its weights to its softmax."""
    return (
        _weights(W_Q2, 14.61, "The second map's query weights", "W_Q"),  # W_Q2 given  (d_model × d_k)
        _weights(W_K2, 14.62, "The second map's key weights", "W_K"),  # W_K2 given  (d_model × d_k)
        _projection(Q_2, W_Q2, 14.63, "The second map's queries"),  # Q_2 = X·W_Q2  (n × d_k)
        _projection(K_2, W_K2, 14.64, "The second map's keys"),  # K_2 = X·W_K2  (n × d_k)
        _rotated(Q_2ROT, Q_2, 14.65, "Rotate the second map's queries"),  # RoPE(Q_2)  (n × d_k)
        _rotated(K_2ROT, K_2, 14.66, "Rotate the second map's keys"),  # RoPE(K_2)  (n × d_k)
        # S_2 = Q_2·K_2ᵀ  (n_q × n_k)
        _kind(S_2, S_2, 14.7, "second_map", "The second map's scores", ("S_2 = Q_2\\,K_2^{\\top}", "S_2 = Q_2·K_2ᵀ"),
              (QUERIES, KEYS), lambda sh, r, c: prod(sh(_q2(c)), flip(sh(_k2(c))), "n_q × n_k"), ("q2_in", "k2_in"),
              lambda ops, v, c: ops.matmul(v("q2_in"), ops.T(v("k2_in"))), tex="S_2", slips=True),
        # Ŝ_2 = S_2·scale + M  (n_q × n_k)
        _kind(S_2MASKED, S_2MASKED, 14.75, "second_map", "Scale and mask the second map's scores",
              lambda c: (f"\\hat{{S}}_2 = S_2 \\cdot {_num(c.factor)} + M", f"Ŝ_2 = S_2·{sympy.sstr(c.factor)} + M"),
              (QUERIES, KEYS), lambda sh, r, c: plain(r, "n_q × n_k"), (S_2, M),
              lambda ops, v, c: ops.add_mask(ops.scale(v(S_2), c.factor), v(M)), tex="\\hat{S}_2",
              mistakes=(Mistake(NO_SCALING, lambda ops, ex, c: ops.add_mask(ex(S_2), ex(M))),)),
        # A_2 = softmax(Ŝ_2)  (n_q × n_k)
        _kind(A_2, A_2, 14.8, "second_map", "Softmax on each row: the second map",
              ("A_2 = \\operatorname{softmax}(\\hat{S}_2)", "A_2[i,j] = exp(Ŝ_2[i,j] − m_i) / Z_i"), (QUERIES, KEYS),
              lambda sh, r, c: plain(r, "n_q × n_k") + ", each row sums to 1", (S_2MASKED,),
              lambda ops, v, c: ops.softmax(v(S_2MASKED)), tex="A_2",
              mistakes=(Mistake(NO_SCALING, lambda ops, ex, c: ops.softmax(ops.add_mask(ex(S_2), ex(M)))),)),
    )


def difference_rows() -> tuple[Kind, ...]:
    """The differential map, its row sums, the output and the paper's per-head norm."""
    return (
        # A_diff = A − λ·A_2  (n_q × n_k)
        _kind(A_DIFF, A_DIFF, 14.9, "differential", "The differential map",
              lambda c: (f"A_{{diff}} = A_1 - {_num(lam(c))}\\,A_2", f"A_diff = A₁ − {sympy.sstr(lam(c))}·A_2"),
              (QUERIES, KEYS), lambda sh, r, c: plain(r, "n_q × n_k") + ", each row sums to 1 − λ", (A, A_2),
              lambda ops, v, c: ops.sum([v(A), ops.scale(v(A_2), -lam(c))]), tex="A_{diff}", note=negative_note,
              mistakes=tuple(Mistake(name, slip) for name, slip in SLIPS)),
        # A_diff·1, each row's sum: 1 − λ  (n_q × 1)
        _kind(A_DIFF_SUMS, A_DIFF_SUMS, 14.95, "differential", "The row sums of the differential map",
              lambda c: (f"A_{{diff}}\\,\\mathbf{{1}} = 1 - \\lambda = {_num(1 - lam(c))}",
                         f"A_diff·1 = 1 − λ = {sympy.sstr(1 - lam(c))}"),
              (QUERIES, ROW_SUM), lambda sh, r, c: plain(r, "n_q × 1"), (A, A_2),
              lambda ops, v, c: ops.sum([_row_sums(ops, v(A), c), ops.scale(_row_sums(ops, v(A_2), c), -lam(c))]),
              tex="A_{diff}\\,\\mathbf{1}", mistakes=_carried(lambda ops, m, ex, c: _row_sums(ops, m, c))),
        # O = A_diff·V  (n_q × d_v)
        _kind(O_DIFF, O, 15, "output", "Weighted sum of the values", ("O = A_{diff}\\,V", "O = A_diff·V"),
              (QUERIES, "v"), lambda sh, r, c: prod(sh(A_DIFF), sh(V), "n_q × d_v"), (A_DIFF, V),
              lambda ops, v, c: ops.matmul(v(A_DIFF), v(V)),
              mistakes=_carried(lambda ops, m, ex, c: ops.matmul(m, ex(V)))),
        # the paper's per-head norm: ms_i = mean of O_ik²  (n_q × 1)
        _kind(O_MS, O_MS, 15.3, "subln", "Each output row's mean square", ("\\mathrm{ms}_i = \\frac{1}{d_v}\\sum_k "
              "O_{ik}^2", "ms_i = Σ_k O[i,k]² / d_v"), (QUERIES, MEAN_SQUARE), lambda sh, r, c: plain(r, "n_q × 1"),
              (O,), lambda ops, v, c: ops.row_spread(v(O), None), when=paper, tex="\\mathrm{ms}", by_relation=True),
        # O_subln = O/√(ms + ε)·(1 − λ_init)  (n_q × d_v)
        _kind(O_SUBLN, O_SUBLN, 15.35, "subln", "Normalise the head's output and scale it",
              lambda c: ("O_{subln} = \\frac{O}{\\sqrt{\\mathrm{ms} + \\varepsilon}}\\,(1 - \\lambda_{init})",
                         "O_subln = O / √(ms + ε) · (1 − λ_init)"), (QUERIES, "v"),
              lambda sh, r, c: plain(r, "like O"), (O, O_MS),
              lambda ops, v, c: ops.scale(ops.normalise(v(O), None, v(O_MS), c.differential.paper.eps),
                                          1 - c.differential.paper.lambda_init),
              when=paper, tex="O_{subln}", by_relation=True,
              mistakes=(Mistake(NO_INIT, lambda ops, ex, c: _normalised(ops, ex(O), c)),)),
    )
