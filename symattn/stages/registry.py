"""The stage registry: every stage symattn derives, one row each, in the order of the formula.

Each stage kind is one :class:`~symattn.stages.kinds.Kind` row: its id, its place in the
formula, its title and one sentence of why, how its rows and columns are labelled, whether it
is a gradient, and its **relation**: one definition of how its value follows from its inputs,
written against a small set of operations (``ops``: ``matmul``, ``T``, ``scale``,
``softmax``, ...). The same relation is run three ways:

- exactly, by :func:`symattn.derive` (SymPy and flint values, softmax kept as structure);
- at high precision, when a stage is evaluated from its inputs' values (mpmath);
- on a student's own earlier answers, by ``symattn check``'s follow-through marking.

A relation reads its inputs through ``v(key)`` (``v(key, head)`` for another head's stage) and
the problem's constants through ``c`` (a :class:`~symattn.stages.kinds.Context`). The common
mistakes of a stage (``mistakes``) are relations too, run on the exact values.

The comment above each row gives its relation and its shape.
"""

from __future__ import annotations

from .grouped import group_formula, group_product, group_why, one_share, ungrouped
from .formulas import (
    cache_formula, dO_formula, dO_head_formula, dS_formula, dX_formula, dcontext_formula, few, k_t_formula, masked_formula,
    pe_formula, rot_tex, rot_text, s_formula, s_t_formula, scale_formula, softmax_formula,
)
from .ids import (
    A, ACC_TILED, A_SINK, A_T, B_K, B_O, B_Q, B_V, CACHED, CONCAT, CONTEXT, COSTS, DA, DB_K, DB_O, DB_Q, DB_V,
    DCONCAT, DCONTEXT, DECODE_COST, DH, DK, DO, DO_HEAD, DQ, DS, DS_MASKED, DV, DW_K, DW_O, DW_Q, DW_V, K,
    KEYS, K_CACHE, K_T, L_TILED, M, M_TILED, NEW, O, O_FINAL, O_T, O_TILED, O_T_DIFF, PE, Q, QUERIES, Q_T, S,
    SINK_AXIS, STEPS, S_MASKED, S_SCALED, S_T, TT, V, V_CACHE, W_K, W_O, W_Q, W_V, X, X_POS, head_sup, stage_id,
)
from .kinds import Kind, Mistake, decoding, softmax_attention, tiled
from .linear import linear_rows, recurrent_rows
from .mla import absorbed_rows, cache_row as mla_cache_row, carried_mistakes, head_rows as mla_head_rows, latent_rows
from .differential import difference_rows, head_out, not_differential, second_map_rows
from .block_backward import from_cross_entropy, rows as block_backward_rows
from .norm_backward import WHY as NORM_BACK_WHY, input_gradient_rows, post_norm_backward_rows
from .mlp import head_rows, head_rows_before, mlp_rows
from .norms import norm_rows, residual_rows
from .scores import cap, comparison_rows, qk_bound, masked_mistakes, score_rows, tempered, weight_mistakes
from .mistakes import (
    BLOCK_MAX, BY_D_K, EVICTED, FUTURE_KEY, MASK_MISSING, NO_RESCALE, NO_SCALING, ROPE_O_MISTAKES,
    ROPE_SCORE_MISTAKES, SCALE_MISSING_DQDK, by_d_k, future_weights, kept_every_key, output_without_rescale, pe_slip,
    score_variants, square_product, transposed,
)
from .relations import (
    cache_size, cached, dO_relation, decode_cost_rows, head_block, input_gradient, output_projection, row_t,
)
from .rows import (
    bias_gradient, bias_row, given_title, projection_row, rope_rows, rotated_gradient_rows, turned_back_rows,
    weight_gradient, weights_row,
)
from .shapes import flip, is_square, plain, prod
from .why import WHY, dX_why, decode_why, k_t_why, mask_why, pe_why, reads_note, s_why, scale_why, sink_why, tt_ids
from .worked import worked_score


KINDS: tuple[Kind, ...] = (
    # 1 the input
    # X given  (n × d_model; n_q × d_model with a context)
    Kind(X, X, 1, "input", given_title("Query-side tokens", "Input tokens"),
         lambda c: WHY["X_cross"] if c.cross else WHY[X], ("X", "X"), (QUERIES, "d"),
         lambda sh, r, c: plain(r, "n_q × d_model" if c.cross else "n × d_model"),
         source=lambda c: c.p.X, when=lambda c: c.projected),
    # C given  (n_k × d_model)
    Kind(CONTEXT, CONTEXT, 2, "input", "Context tokens (the key and value side)", WHY[CONTEXT], ("C", "C"),
         (KEYS, "d"), lambda sh, r, c: plain(r, "n_k × d_model"), source=lambda c: c.p.context,
         when=lambda c: c.cross),
    # positional encodings, added to X before the projections
    # PE = sin and cos of p / base^(2i/d), or learned and given  (n_q × d_model)
    Kind(PE, PE, 2.3, "positions",
         lambda c: "Sinusoidal positional encodings" if c.p.positions.kind == "sinusoidal" else "Learned positions",
         pe_why, pe_formula, (QUERIES, "d"), lambda sh, r, c: plain(r, "n_q × d_model, one row per position"),
         relation=lambda ops, v, c: ops.given(c.p.positions.matrix),
         source=lambda c: c.p.positions.matrix if c.p.positions.kind == "learned" else None,
         when=lambda c: c.positions,
         mistakes=(Mistake("sin and cos swapped: the even columns 2i take the sine, the odd ones the cosine",
                           pe_slip(swap=True)),
                   Mistake("positions counted from 1: the first token is at p = 0", pe_slip(start=1)),
                   Mistake("exponent k/d with the column number k instead of 2i/d (the sine and cosine of a "
                           "pair share one frequency)", pe_slip(pairs=False)))),
    # TT = BERT's token-type embeddings, one row per token (its type's row), given  (n_q × d_model)
    Kind(TT, TT, 2.4, "positions", "Token-type embeddings",
         lambda c: "BERT adds one more learned row to each token: the row of its token type (segment) in "
                   "the model's token-type table" + tt_ids(c) + ".",
         ("TT", "TT"), (QUERIES, "d"), lambda sh, r, c: plain(r, "n_q × d_model, one row per token"),
         source=lambda c: c.p.token_types, when=lambda c: c.token_types),
    # X_pos = X + PE (+ TT)  (n_q × d_model)
    Kind(X_POS, X_POS, 2.6, "positions", "Add the positions to the tokens",
         lambda c: "Each token's row gets its position's row of ⟦PE⟧ added, entry by entry"
                   + (", and its token type's row of ⟦TT⟧" if c.token_types else "")
                   + "; the projections read ⟦X_{pos}⟧ "
                   + ("(through the embeddings' norm) " if c.emb_norm is not None else "")
                   + "instead of ⟦X⟧, so the same word at two positions gives two different queries, keys and values.",
         lambda c: ("X_{pos} = X + PE + TT", "X_pos = X + PE + TT") if c.token_types else
         ("X_{pos} = X + PE", "X_pos = X + PE"), (QUERIES, "d"), lambda sh, r, c: plain(r, "like X"),
         inputs=(X, PE, "token_types"), relation=lambda ops, v, c: ops.sum([v(X), v(PE)] + ([v(TT)] if c.token_types else [])),
         when=lambda c: c.positions,
         mistakes=(Mistake("the positions were not added: X_pos = X",
                           lambda ops, ex, c: ops.sum([ex(X), ex(TT)]) if c.token_types else ex(X)),
                   Mistake("the token types were not added: X_pos = X + PE",
                           lambda ops, ex, c: ops.sum([ex(X), ex(PE)]) if c.token_types else None))),
    # the embeddings' own norm (embeddings_norm:, BERT's embeddings.LayerNorm): μ, σ², X̂_emb, γ, β
    # and X_emb, the layer's input  (n × 1, n × d_model)
    *norm_rows("emb"),
    # the layer norm in front of the attention (norm:, place pre): μ, σ² (or the mean square), X̂,
    # γ, β and X_norm = X̂ ∘ γ + β, which the projections read  (n × 1, n × d_model)
    *norm_rows("pre"),
    # multi-head latent attention (mla:): W_DKV, c_KV = X·W_DKV  (n × d_c); W_KR, k_R = X·W_KR and
    # k_R_rot = RoPE(k_R)  (n × d_R); W_DQ, c_Q = X·W_DQ  (n × d_cq); the given up-projections
    *latent_rows(),
    # 2 projections (weights first, as the JSON contract lists them)
    weights_row(W_Q, 3, "Query weights"),  # W_Q given  (d_model × d_k)
    weights_row(W_K, 5, "Key weights"),  # W_K given  (d_model × d_k)
    weights_row(W_V, 7, "Value weights"),  # W_V given  (d_model × d_v)
    bias_row(B_Q, 3.5, "Query bias"),  # b_Q given  (1 × d_k)
    bias_row(B_K, 5.5, "Key bias"),  # b_K given  (1 × d_k)
    bias_row(B_V, 7.5, "Value bias"),  # b_V given  (1 × d_v)
    projection_row(Q, 4, "Query projection"),  # Q = X·W_Q + b_Q, or given  (n_q × d_k)
    projection_row(K, 6, "Key projection"),  # K = X·W_K + b_K (C·W_K + b_K with a context), or given  (n_k × d_k)
    projection_row(V, 8, "Value projection"),  # V = X·W_V + b_V (C·W_V + b_V with a context), or given  (n_k × d_v)
    # mla, per head: q_C  (n × d_h), q_R and q_R_rot  (n × d_R), K_C = c_KV·W_UK^(h)  (n × d_h),
    # Q = [q_C ; q_R_rot], K = [K_C ; k_R_rot]  (n × (d_h + d_R)), V = c_KV·W_UV^(h)  (n × d_v)
    *mla_head_rows(),
    # 3 to 8: one head, scores to output
    # QK-norm (qk_norm:): each head's query rows, then key rows, normalised over d_k (RMSNorm): the mean
    # squares, Q̂ (K̂), γ_q (γ_k) and Q_norm = Q̂ ∘ γ_q (K_norm), which RoPE reads  (n × 1, n × d_k, 1 × d_k)
    *norm_rows("q"),
    *norm_rows("k"),
    *rope_rows(),  # Q_rot, K_rot = each pair of q_p, k_p turned by p·θ_i  (n_q × d_k, n_k × d_k)
    # K_T = Kᵀ (K_rotᵀ with RoPE)  (d_k × n_k)
    Kind(K_T, K_T, 9, "transpose", "Transpose the keys", k_t_why, k_t_formula, ("k", KEYS),
         lambda sh, r, c: f"{r[1]}×{r[0]} → {r[0]}×{r[1]} (d_k × n_k)",
         inputs=("k_in",), relation=lambda ops, v, c: ops.T(v("k_in")), per_head=True, tex="K^{\\top}", slips=True,
         when=softmax_attention),
    # S = Q·Kᵀ (Q_rot·K_rotᵀ with RoPE)  (n_q × n_k)
    Kind(S, S, 10, "scores", "Scores", lambda c: s_why(c) + reads_note(c, K_T), s_formula, (QUERIES, KEYS),
         lambda sh, r, c: prod(sh("q_in"), sh(K_T), "n_q × n_k"),
         inputs=("q_in", K_T), relation=lambda ops, v, c: ops.matmul(v("q_in"), v(K_T)), per_head=True, slips=True,
         when=softmax_attention,
         worked=worked_score, shows=frozenset({"rope_relative"}),
         mistakes=(
             Mistake("K·Qᵀ instead of Q·Kᵀ (the scores are transposed)",
                     lambda ops, ex, c: ops.matmul(ex("k_in"), ops.T(ex("q_in")))),
             Mistake("Q·K instead of Q·Kᵀ (K was not transposed)",
                     lambda ops, ex, c: ops.matmul(ex("q_in"), ex("k_in")) if len(ex("q_in")[0]) == len(ex("k_in")) else None),
             *ROPE_SCORE_MISTAKES,
             *carried_mistakes(S),
         )),
    # S_scaled = S / √d_k, or S times the problem's scale  (n_q × n_k)
    Kind(S_SCALED, S_SCALED, 11, "scale", "Scale the scores", lambda c: scale_why(c) + qk_bound(c), scale_formula,
         (QUERIES, KEYS),
         lambda sh, r, c: plain(r, "n_q × n_k"),
         inputs=(S,), relation=lambda ops, v, c: ops.scale(v(S), c.factor), per_head=True, when=softmax_attention,
         tex="\\frac{S}{\\sqrt{d_k}}",
         mistakes=(Mistake(NO_SCALING, lambda ops, ex, c: ex(S)), Mistake(BY_D_K, by_d_k), *carried_mistakes(S_SCALED))),
    # with softcap: S_capped = c·tanh(S_scaled / c), before the mask  (n_q × n_k)
    *score_rows()[:1],
    # M = the mask (0 or −∞), plus the bias  (n_q × n_k)
    Kind(M, M, 12, "mask", "The mask", mask_why,
         lambda c: ("M = M_{\\text{mask}} + B", "M = mask + bias") if c.p.bias is not None else ("M", "M"),
         (QUERIES, KEYS), lambda sh, r, c: plain(r, "n_q × n_k"),
         relation=lambda ops, v, c: ops.mask(c.p.mask.allowed, c.p.bias), per_head=True, when=softmax_attention,
         shows=frozenset({"mask_parts"})),
    # Ŝ = S_scaled + M  (n_q × n_k)
    Kind(S_MASKED, S_MASKED, 13, "mask", "Add the mask", WHY[S_MASKED], masked_formula, (QUERIES, KEYS),
         lambda sh, r, c: plain(r, "n_q × n_k"),
         inputs=("mask_in", M), relation=lambda ops, v, c: ops.add_mask(v("mask_in"), v(M)), per_head=True,
         when=softmax_attention,
         tex="\\hat{S}",
         mistakes=(Mistake(MASK_MISSING, lambda ops, ex, c: ex("mask_in")),
                   Mistake(NO_SCALING, lambda ops, ex, c: ops.add_mask(cap(ops, ex(S), c), ex(M))),
                   Mistake(BY_D_K, lambda ops, ex, c: ops.add_mask(cap(ops, by_d_k(ops, ex, c), c), ex(M))),
                   *masked_mistakes(), *carried_mistakes(S_MASKED))),
    # with temperature: S_temp = Ŝ / T  (n_q × n_k)
    *score_rows()[1:],
    # A = softmax(Ŝ), row by row  (n_q × n_k)
    Kind(A, A, 14, "softmax", lambda c: "Softmax on each row" if c.sink is None else "Softmax on each row, with the sink",
         lambda c: WHY[A] if c.sink is None else sink_why(c, A),
         lambda c: ("A = \\operatorname{softmax}(\\hat{S}_T)",
                    "A[i,j] = exp(Ŝ_T[i,j] − m_i) / Z_i,  m_i = max_k Ŝ_T[i,k],  Z_i = Σ_k exp(Ŝ_T[i,k] − m_i)")
         if tempered(c) else softmax_formula(c),
         (QUERIES, KEYS), lambda sh, r, c: f"{r[0]}×{r[1]} (n_q × n_k), each row sums to "
         + ("1" if c.sink is None else "less than 1 (the sink takes the rest)"),
         inputs=("a_in",), relation=lambda ops, v, c: ops.softmax(v("a_in"), sink=c.sink), per_head=True,
         when=softmax_attention, shows=frozenset({"softmax"}), mistakes=score_variants(A) + weight_mistakes() + carried_mistakes(A),
         note=lambda value: WHY["A_max"] if all(r.is_max for r in value.rows) else WHY["A_symbolic"]),
    # with softcap or temperature: the last query's weights without and with it  (2 × n_k)
    *comparison_rows(),
    # a_sink = e^(s − m_i) / Z_i = 1 − Σ_j a_ij, what each row's learned sink absorbed  (n_q × 1)
    Kind(A_SINK, A_SINK, 14.5, "softmax", "What the sink absorbed", lambda c: sink_why(c, A_SINK),
         ("a^{\\text{sink}}_i = e^{s - m_i} / Z_i = 1 - \\sum_j a_{ij}", "a_sink[i] = exp(s − m_i) / Z_i = 1 − Σ_j A[i,j]"),
         (QUERIES, SINK_AXIS), lambda sh, r, c: plain(r, "n_q × 1"), inputs=(A,),
         relation=lambda ops, v, c: ops.sink_weight(v(A)), when=lambda c: c.sink is not None, per_head=True,
         tex="a^{\\text{sink}}"),
    # O = A·V  (n_q × d_v)
    Kind(O, O, 15, "output", "Weighted sum of the values",
         lambda c: WHY[O] + reads_note(c, V) + (WHY["O_sink"] if c.sink is not None else ""), ("O = A\\,V", "O = A·V"), (QUERIES, "v"),
         lambda sh, r, c: f"({sh(A)[0]}×{sh(A)[1]})·({sh(V)[0]}×{sh(V)[1]}) → {r[0]}×{r[1]} (n_q × d_v)",
         inputs=(A, V), relation=lambda ops, v, c: ops.matmul(v(A), v(V)), per_head=True, when=not_differential,
         shows=frozenset({"weighted_sum"}),
         mistakes=score_variants(O) + (
             Mistake("Aᵀ·V instead of A·V (the weights were transposed)",
                     lambda ops, ex, c: ops.matmul(ops.T(ex(A)), ex(V)) if is_square(ex(A)) else None),
             transposed(O),
             *ROPE_O_MISTAKES,
             *carried_mistakes(O),
         )),
    # mla, per head: q_abs = q_C·W_UK^(h)ᵀ  (n × d_c); S_abs = q_abs·c_KVᵀ + q_R_rot·k_R_rotᵀ and
    # S_abs − S, exactly 0  (n_q × n_k)
    *absorbed_rows(),
    # differential attention (differential:), after the first map A, instead of O: the second map's W_Q2, W_K2
    # (d_model × d_k), Q_2, K_2 (rotated under RoPE; n × d_k), S_2 = Q_2·K_2ᵀ, Ŝ_2 = S_2·scale + M, A_2 =
    # softmax(Ŝ_2)  (n_q × n_k); A_diff = A − λ·A_2  (n_q × n_k), its row sums 1 − λ  (n_q × 1), O = A_diff·V
    # (n_q × d_v); with the paper's norm, each row's mean square  (n_q × 1) and O/√(ms + ε)·(1 − λ_init)  (n_q × d_v)
    *second_map_rows(),
    *difference_rows(),
    # linear attention (linear:), instead of K_T … O: φ(Q), φ(K)  (n × d_k); S_lin = φ(Q)·φ(K)ᵀ, 0 where
    # masked  (n_q × n_k); z_lin = its row sums  (n_q × 1); A_lin = S_lin / z_lin  (n_q × n_k); O = A_lin·V
    *linear_rows(),
    # its recurrent form: z_t = z_(t−1) + φ(k_t)  (n × d_k); S_t = S_(t−1) + φ(k_t)v_tᵀ  (n × d_k·d_v);
    # φ(q_t)ᵀS_t  (n × d_v); φ(q_t)ᵀz_t  (n × 1); O_rec = their quotient; O_rec − O = 0  (n × d_v)
    *recurrent_rows()[:-1],
    # FlashAttention's online softmax: the same weighted sum in one pass over blocks of keys
    # m(b) = max(m(b−1), max of block b of Ŝ)  (n_q × blocks)
    Kind(M_TILED, M_TILED, 15.02, "tiled", "Running maximum, block by block",
         lambda c: WHY[M_TILED].format(B=c.p.tiling.block),
         ("m^{(b)} = \\max\\bigl(m^{(b-1)},\\ \\max_{j \\in b} \\hat{S}_{ij}\\bigr)",
          "m⁽ᵇ⁾ = max(m⁽ᵇ⁻¹⁾, max_{j in block b} Ŝ[i,j]),  m⁽⁰⁾ = −∞"),
         (QUERIES, "b"), lambda sh, r, c: plain(r, "n_q × blocks"),
         inputs=(S_MASKED,), relation=lambda ops, v, c: ops.tiled_max(v(S_MASKED), c.p.tiling.block),
         when=tiled, per_head=True, tex="m",
         mistakes=(Mistake(BLOCK_MAX, lambda ops, ex, c: ops.tiled_max(ex(S_MASKED), c.p.tiling.block, running=False)),)),
    # ℓ(b) = e^(m(b−1) − m(b))·ℓ(b−1) + Σ_(j in b) e^(Ŝ_ij − m(b))  (n_q × blocks)
    Kind(L_TILED, L_TILED, 15.04, "tiled", "Running sum, rescaled at each new maximum", WHY[L_TILED].format(),
         ("\\ell^{(b)} = e^{m^{(b-1)} - m^{(b)}}\\,\\ell^{(b-1)} + \\sum_{j \\in b} e^{\\hat{S}_{ij} - m^{(b)}}",
          "ℓ⁽ᵇ⁾ = exp(m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾)·ℓ⁽ᵇ⁻¹⁾ + Σ_{j in block b} exp(Ŝ[i,j] − m⁽ᵇ⁾),  ℓ⁽⁰⁾ = 0"),
         (QUERIES, "b"), lambda sh, r, c: plain(r, "n_q × blocks") + "; the last column is Z_i",
         inputs=(S_MASKED, M_TILED),
         relation=lambda ops, v, c: ops.tiled_sums(v(S_MASKED), v(M_TILED), c.p.tiling.block),
         when=tiled, per_head=True, tex="\\ell", shows=frozenset({"exp_sums"}),
         mistakes=(Mistake(NO_RESCALE, lambda ops, ex, c: ops.tiled_sums(ex(S_MASKED), ex(M_TILED), c.p.tiling.block,
                                                                      rescale=False)),)),
    # acc(b) = e^(m(b−1) − m(b))·acc(b−1) + Σ_(j in b) e^(Ŝ_ij − m(b))·v_j  (n_q × d_v)
    Kind(ACC_TILED, ACC_TILED, 15.06, "tiled", "Accumulator after the last block", WHY[ACC_TILED].format(),
         ("\\mathrm{acc}^{(b)} = e^{m^{(b-1)} - m^{(b)}}\\,\\mathrm{acc}^{(b-1)} + \\sum_{j \\in b} e^{\\hat{S}_{ij} - m^{(b)}}\\, v_j",
          "acc⁽ᵇ⁾ = exp(m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾)·acc⁽ᵇ⁻¹⁾ + Σ_{j in block b} exp(Ŝ[i,j] − m⁽ᵇ⁾)·v_j,  acc⁽⁰⁾ = 0"),
         (QUERIES, "v"), lambda sh, r, c: plain(r, "n_q × d_v") + "; the accumulator after the last block",
         inputs=(S_MASKED, M_TILED, V),
         relation=lambda ops, v, c: ops.tiled_acc(v(S_MASKED), v(M_TILED), v(V), c.p.tiling.block),
         when=tiled, per_head=True, tex="\\mathrm{acc}", shows=frozenset({"exp_sums"}),
         mistakes=(Mistake(NO_RESCALE, lambda ops, ex, c: ops.tiled_acc(ex(S_MASKED), ex(M_TILED), ex(V), c.p.tiling.block,
                                                                      rescale=False)),)),
    # O_tiled = acc / ℓ after the last block  (n_q × d_v)
    Kind(O_TILED, O_TILED, 15.08, "tiled", "Output of the tiled pass", WHY[O_TILED].format(),
         ("O^{\\text{tiled}}_i = \\mathrm{acc}_i^{(N)} / \\ell_i^{(N)}", "O_tiled[i] = acc(N)[i] / ℓ(N)[i]"),
         (QUERIES, "v"), lambda sh, r, c: plain(r, "n_q × d_v") + "; equal to O",
         inputs=(ACC_TILED, L_TILED), relation=lambda ops, v, c: ops.tiled_output(v(ACC_TILED), v(L_TILED)),
         when=tiled, per_head=True, tex="O^{\\text{tiled}}", shows=frozenset({"tiles", "exp_sums"}),
         mistakes=(Mistake(NO_RESCALE, output_without_rescale),
                   Mistake("the accumulator was not divided by the running sum ℓ at the end",
                           lambda ops, ex, c: ex(ACC_TILED)))),
    # decoding one token from the KV cache
    # K_cache = K[1..t, :]  (t × d_k)
    Kind(K_CACHE, K_CACHE, 15.1, "decode", "The key cache", decode_why(K_CACHE),
         lambda c: cache_formula(c, "K"), (CACHED, "k"),
         lambda sh, r, c: plain(r, "t × d_k" if r[0] == c.t else "(sink + window) × d_k"), inputs=("k_in",),
         relation=lambda ops, v, c: cached(ops, v("k_in"), c),
         when=decoding, per_head=True, tex="K_{\\mathrm{cache}}"),
    # V_cache = V[1..t, :]  (t × d_v)
    Kind(V_CACHE, V_CACHE, 15.2, "decode", "The value cache", decode_why(V_CACHE),
         lambda c: cache_formula(c, "V"), (CACHED, "v"),
         lambda sh, r, c: plain(r, "t × d_v" if r[0] == c.t else "(sink + window) × d_v"), inputs=(V,),
         relation=lambda ops, v, c: cached(ops, v(V), c),
         when=decoding, per_head=True, tex="V_{\\mathrm{cache}}"),
    # q_t = Q[t, :]  (1 × d_k)
    Kind(Q_T, Q_T, 15.3, "decode", "The new token's query", decode_why(Q_T),
         lambda c: (f"q_t = {rot_tex(c, 'Q')}_{{{c.t},\\,:}}", f"q_t = {rot_text(c, 'Q')}[{c.t}, :]"), (NEW, "q"),
         lambda sh, r, c: plain(r, "1 × d_k"), inputs=("q_in",), relation=lambda ops, v, c: row_t(ops, v("q_in"), c),
         when=decoding, per_head=True, tex="q_t"),
    # s_t = scale·q_t·K_cacheᵀ  (1 × t)
    Kind(S_T, S_T, 15.4, "decode", "Its scores against the cache", decode_why(S_T), s_t_formula, (NEW, CACHED),
         lambda sh, r, c: prod(sh(Q_T), flip(sh(K_CACHE)), "1 × t") + ", scaled",
         inputs=(Q_T, K_CACHE),
         relation=lambda ops, v, c: ops.scale(ops.matmul(v(Q_T), ops.T(v(K_CACHE))), c.factor),
         when=decoding, per_head=True, tex="s_t",
         mistakes=(Mistake(NO_SCALING, lambda ops, ex, c: ops.matmul(ex(Q_T), ops.T(ex(K_CACHE)))),)),
    # a_t = softmax(s_t)  (1 × t)
    Kind(A_T, A_T, 15.5, "decode", "Its weights", decode_why(A_T),
         lambda c: ("a_t = \\operatorname{softmax}(s_t)", "a_t = softmax(s_t)") if c.sink is None else
         ("a_t = \\operatorname{softmax}(s_t) \\text{ with the sink } s", "a_t = softmax(s_t) with the sink s"),
         (NEW, CACHED),
         lambda sh, r, c: f"{r[0]}×{r[1]} (1 × t), sums to " + ("1" if c.sink is None else "less than 1 (the sink takes the rest)"),
         inputs=(S_T,),
         relation=lambda ops, v, c: ops.softmax(ops.add_mask(v(S_T), ops.mask(((True,) * cache_size(c),), None)),
                                                sink=c.sink),
         when=decoding, per_head=True, tex="a_t", shows=frozenset({"softmax"}),
         mistakes=(Mistake(FUTURE_KEY, lambda ops, ex, c: ops.block(future_weights(ops, ex, c), 0, c.t)
                           if c.t < c.p.n_k and c.p.mask.kind == "causal" else None),)),
    # o_t = a_t·V_cache  (1 × d_v)
    Kind(O_T, O_T, 15.6, "decode", "Its output", decode_why(O_T), ("o_t = a_t\\,V_{\\mathrm{cache}}", "o_t = a_t·V_cache"),
         (NEW, "v"), lambda sh, r, c: prod(sh(A_T), sh(V_CACHE), "1 × d_v"), inputs=(A_T, V_CACHE),
         relation=lambda ops, v, c: ops.matmul(v(A_T), v(V_CACHE)), when=decoding, per_head=True, tex="o_t",
         shows=frozenset({"weighted_sum"}),
         mistakes=(Mistake(FUTURE_KEY, lambda ops, ex, c: ops.matmul(future_weights(ops, ex, c), ex(V))
                           if c.t < c.p.n_k and c.p.mask.kind == "causal" else None),
                   Mistake(EVICTED, kept_every_key))),
    # o_t − O[t, :]  (1 × d_v, exactly 0)
    Kind(O_T_DIFF, O_T_DIFF, 15.7, "decode", "The same as row t of the full computation", decode_why(O_T_DIFF),
         lambda c: (f"o_t - O_{{{c.t},:}}", f"o_t − O[{c.t}, :]"), (NEW, "v"),
         lambda sh, r, c: plain(r, "1 × d_v") + ", exactly 0", inputs=(O_T, O),
         relation=lambda ops, v, c: ops.sub(v(O_T), row_t(ops, v(O), c)), when=decoding, per_head=True,
         tex="o_t - O_{t,:}"),
    # cost(t) = (t·d_k, t·d_v, t²·d_k, t²·d_v) for t = 1..n  (n_q × 4)
    Kind(DECODE_COST, DECODE_COST, 15.8, "step_cost", "The cost of a decoding step", decode_why(DECODE_COST),
         lambda c: ("\\text{cost}", "cost(t) = (r_t·d_k, r_t·d_v, t²·d_k, t²·d_v)" if c.p.mask.kind == "sink-window"
                    else "cost(t) = (t·d_k, t·d_v, t²·d_k, t²·d_v)"), (STEPS, COSTS),
         lambda sh, r, c: plain(r, "one row per decoding step t = 1..n: from the cache, then recomputed in full"),
         relation=lambda ops, v, c: ops.table(decode_cost_rows(c)), when=decoding, tex="\\text{cost}"),
    # linear attention's state against the KV cache, per step: (d_k·d_v + d_k, t·(d_k + d_v))  (n × 2)
    recurrent_rows()[-1],
    # mla: the numbers cached per token (and for n tokens), MLA against MHA and GQA  (kinds × 2)
    mla_cache_row(),
    # several heads: concatenate, then project
    # concat = [O⁽¹⁾ | O⁽²⁾ | … | O⁽ʰ⁾]  (n_q × h·d_v)
    Kind(CONCAT, CONCAT, 16, "concat", "Concatenate the heads", WHY[CONCAT],
         lambda c: ("\\operatorname{concat} = \\begin{bmatrix} "
                    + " & ".join(few(c.heads, lambda h: f"O^{{({h})}}", "\\cdots")) + " \\end{bmatrix}",
                    "concat = [" + " | ".join(few(c.heads, lambda h: "O" + head_sup(h), "…")) + "]"),
         (QUERIES, "c"),
         lambda sh, r, c: f"{c.p.n_q}×({' + '.join(few(c.heads, lambda h: str(sh(O, h)[1]), '…'))}) = {r[0]}×{r[1]} (n_q × h·d_v)",
         inputs=("heads",), relation=lambda ops, v, c: ops.hstack([v(head_out(c), h) for h in c.heads]),
         when=lambda c: c.multi, tex="\\operatorname{concat}", by_relation=True,
         shows=frozenset({"heads_sum"}), mistakes=(transposed(CONCAT),)),
    # W_O given  (h·d_v × d_out)
    Kind(W_O, W_O, 17, "projection", "Output weights", WHY[W_O], ("W_{O}", "W_O"), ("c", "o"),
         lambda sh, r, c: plain(r, "h·d_v × d_out"), source=lambda c: c.p.W_O, when=lambda c: c.multi,
         labelled=False),
    bias_row(B_O, 17.5, "Output bias"),  # b_O given  (1 × d_out)
    # O = concat·W_O + b_O  (n_q × d_out)
    Kind(O_FINAL, O, 18, "projection", "Output projection",
         lambda c: WHY[O_FINAL] + (WHY["bias_added"].format(L="O") if c.has_bias(B_O) else ""),
         lambda c: (("O = \\operatorname{concat}\\,W_O + b_O", "O = concat·W_O + b_O") if c.has_bias(B_O)
                    else ("O = \\operatorname{concat}\\,W_O", "O = concat·W_O")), (QUERIES, "o"),
         lambda sh, r, c: prod(sh(CONCAT), sh(W_O), "n_q × d_out")
         + (f", plus b_O (1×{sh(B_O)[1]}) on every row" if c.has_bias(B_O) else ""),
         inputs=(CONCAT, W_O, B_O), relation=output_projection,
         when=lambda c: c.multi, by_relation=True, shows=frozenset({"heads_sum"}),
         mistakes=(transposed(O_FINAL),
                   Mistake("the bias b_O was not added: O = concat·W_O alone",
                           lambda ops, ex, c: ops.matmul(ex(CONCAT), ex(W_O)) if c.has_bias(B_O) else None))),
    # the residual stream: H = X + O, or with a post norm R = X + O and H = LN(R)  (n_q × d_model)
    *residual_rows(),
    *norm_rows("post"),
    # the rest of the block: the MLP's norm of H (mlp_mean ... H_norm), U = H_norm·W_1 + b_1 (gated:
    # U_gate, U_up), G = act(U), F = G·W_2 + b_2, Y = H + F (post: Y_sum = H + F, Y = LN(Y_sum))
    # (n × d_model, n × d_ff)
    *norm_rows("mlp"),
    *mlp_rows(),
    *norm_rows("mlp_post"),
    # the model's head: Y_last (rows: last), the final norm (final_mean ... Y_final), W_U, the logits,
    # P = softmax over the vocabulary, nll = −log P[i, t_i], L = their mean  (rows × vocabulary; 1 × 1)
    *head_rows_before(),
    *norm_rows("final"),
    *head_rows(),
    # the backward pass from the cross-entropy (backward: {loss: cross-entropy}): dlogits, dW_U, back through
    # the final norm (dY_final ... dY_last, dY), the MLP's post norm (dY_hat ... dY_sum), then dF, db_2, dW_2,
    # dG, dU (dU_gate, dU_up), db_1, dW_1 (dW_gate, dW_up), dH_norm and the MLP's norm (dH_hat ...), to dH
    *block_backward_rows(),
    # the backward pass: the upstream gradient, then back through the output projection
    # with the residual: dH = ∂L/∂H, and behind a post norm dR̂, dγ, dβ, dR  (n_q × d_model; 1 × d_model)
    *(from_cross_entropy(k) if k.key == DH else k for k in post_norm_backward_rows()),
    # dO = ∂L/∂O (dH with the residual, dR behind a post norm)  (n_q × d_out)
    Kind(DO, DO, 19, lambda c: "b_residual" if c.norm is not None and c.norm.post else "b_upstream",
         lambda c: "Back through the residual" if c.residual else "The upstream gradient",
         lambda c: (NORM_BACK_WHY["dO_" + ("post" if c.norm is not None and c.norm.post else "residual")].format(x=c.block_name)
                    if c.residual else WHY[DO] + " Here " + c.loss.describe() + "."),
         lambda c: ((f"dO = d{'R' if c.norm is not None and c.norm.post else 'H'}",) * 2 if c.residual
                    else dO_formula(c)),
         lambda c: (QUERIES, "o" if c.multi else "v"), lambda sh, r, c: plain(r, "like O"),
         inputs=("upstream",), relation=lambda ops, v, c: v("skip") if c.residual else dO_relation(ops, v, c),
         when=lambda c: c.loss is not None, gradient=True,
         short=lambda ops, value, c: c.loss.kind != "target" and not (c.norm is not None and c.norm.post)),
    # dW_O = concatᵀ·dO  (h·d_v × d_out)
    Kind(DW_O, DW_O, 20, "b_projection", "Gradient of the output weights", WHY[DW_O],
         ("dW_O = \\operatorname{concat}^{\\top} dO", "dW_O = concatᵀ·dO"), ("c", "o"),
         lambda sh, r, c: prod(flip(sh(CONCAT)), sh(DO), "like W_O"),
         inputs=(CONCAT, DO), relation=lambda ops, v, c: ops.matmul(ops.T(v(CONCAT)), v(DO)),
         when=lambda c: c.multi and c.loss is not None, gradient=True, labelled=False,
         mistakes=(transposed(DW_O, square_only=True),)),
    bias_gradient(DB_O, 20.5),  # db_O = 1ᵀ·dO, the column sums of dO  (1 × d_out)
    # dconcat = dO·W_Oᵀ  (n_q × h·d_v)
    Kind(DCONCAT, DCONCAT, 21, "b_projection", "Gradient of the concatenation", WHY[DCONCAT],
         ("d\\operatorname{concat} = dO\\,W_O^{\\top}", "dconcat = dO·W_Oᵀ"), (QUERIES, "c"),
         lambda sh, r, c: prod(sh(DO), flip(sh(W_O)), "like concat"),
         inputs=(DO, W_O), relation=lambda ops, v, c: ops.matmul(v(DO), ops.T(v(W_O))),
         when=lambda c: c.multi and c.loss is not None, gradient=True, tex="d\\operatorname{concat}",
         mistakes=(transposed(DCONCAT, square_only=True),)),
    # each head, backwards
    # dO⁽ʰ⁾ = this head's columns of dconcat  (n_q × d_v)
    Kind(DO_HEAD, DO, 19, "b_head", "This head's upstream gradient", WHY[DO_HEAD], dO_head_formula,
         (QUERIES, "v"), lambda sh, r, c: plain(r, "like this head's O"),
         inputs=(DCONCAT,), relation=lambda ops, v, c: ops.block(v(DCONCAT), *head_block(c)),
         when=lambda c: c.multi and c.loss is not None, per_head="shares", gradient=True),
    # dV = Aᵀ·dO  (n_k × d_v); a K/V group's: Σ over its heads of A⁽ʰ⁾ᵀ·dO⁽ʰ⁾
    Kind(DV, DV, 22, "b_weighted_sum", "Gradient of the values", lambda c: WHY[DV] + group_why("values")(c),
         group_formula(("dV", "dV"), ("A", "A"), ("dO", "dO")),
         (KEYS, "v"), lambda sh, r, c: prod(flip(sh(A)), sh(DO), "like V"),
         inputs=(A, DO), relation=group_product(A, DO),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(ungrouped(square_product("A·dO instead of Aᵀ·dO (the weights were not transposed)",
                                            lambda ops, ex: ex(A), lambda ops, ex: ex(DO), lambda ex: is_square(ex(A)))),
                   one_share(A, DO), transposed(DV, square_only=True))),
    # dA = dO·Vᵀ  (n_q × n_k)
    Kind(DA, DA, 23, "b_weighted_sum", "Gradient of the weights", WHY[DA], ("dA = dO\\,V^{\\top}", "dA = dO·Vᵀ"),
         (QUERIES, KEYS), lambda sh, r, c: prod(sh(DO), flip(sh(V)), "like A"),
         inputs=(DO, V), relation=lambda ops, v, c: ops.matmul(v(DO), ops.T(v(V))),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         short=lambda ops, value, c: ops.is_rational(value),
         mistakes=(square_product("dO·V instead of dO·Vᵀ (V was not transposed)",
                                  lambda ops, ex: ex(DO), lambda ops, ex: ex(V),
                                  lambda ex: len(ex(V)) == len(ex(DO)[0]) and len(ex(V)[0]) == len(ex(DO))),
                   transposed(DA, square_only=True))),
    # dŜ_ij = a_ij·(dA_ij − Σ_k a_ik·dA_ik)  (n_q × n_k)
    Kind(DS_MASKED, DS_MASKED, 24, "b_softmax", "Back through the softmax", WHY[DS_MASKED],
         ("d\\hat{S}_{ij} = a_{ij}\\Big(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\Big)",
          "dŜ[i,j] = a_ij·(dA[i,j] − Σ_k a_ik·dA[i,k])"),
         (QUERIES, KEYS), lambda sh, r, c: plain(r, "like Ŝ") + "; each row sums to 0",
         inputs=(A, DA), relation=lambda ops, v, c: ops.softmax_backward(v(A), v(DA)),
         when=lambda c: c.loss is not None, per_head=True, gradient=True, tex="d\\hat{S}",
         shows=frozenset({"jacobian"}),
         mistakes=(Mistake("Jacobian diagonal only: a_ij(1 − a_ij)·dA_ij drops the off-diagonal terms −a_ij·a_ik "
                           "(each weight also depends on the other scores of its row)",
                           lambda ops, ex, c: ops.jacobian_diagonal(ex(A), ex(DA))),
                   transposed(DS_MASKED, square_only=True))),
    # dS = scale·dŜ  (n_q × n_k)
    Kind(DS, DS, 25, "b_scaling", "Back through the scaling",
         lambda c: WHY["dS_none"] if c.p.scale == "none" else WHY[DS], dS_formula,
         (QUERIES, KEYS), lambda sh, r, c: plain(r, "like S"),
         inputs=(DS_MASKED,), relation=lambda ops, v, c: ops.scale(v(DS_MASKED), c.factor),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(Mistake("the scale factor is missing: dS = dŜ, but the scores were scaled before the softmax",
                           lambda ops, ex, c: ex(DS_MASKED)),
                   transposed(DS, square_only=True))),
    # with RoPE: dQ_rot = dS·K_rot  (n_q × d_k), dK_rot = dSᵀ·Q_rot  (n_k × d_k)
    *rotated_gradient_rows(),
    # dQ = dS·K  (n_q × d_k; with RoPE, dQ_back below)
    Kind(DQ, DQ, 26, "b_qk", "Gradient of the queries", WHY[DQ], ("dQ = dS\\,K", "dQ = dS·K"), (QUERIES, "q"),
         lambda sh, r, c: prod(sh(DS), sh(K), "like Q"),
         inputs=(DS, K), relation=lambda ops, v, c: ops.matmul(v(DS), v(K)),
         when=lambda c: c.loss is not None and c.rope is None, per_head=True, gradient=True,
         mistakes=(Mistake(SCALE_MISSING_DQDK, lambda ops, ex, c: ops.matmul(ex(DS_MASKED), ex(K))),
                   square_product("dSᵀ·K instead of dS·K (dS was transposed)",
                                  lambda ops, ex: ops.T(ex(DS)), lambda ops, ex: ex(K), lambda ex: is_square(ex(DS))),
                   transposed(DQ, square_only=True))),
    # dK = dSᵀ·Q  (n_k × d_k; with RoPE, dK_back below); a K/V group's: Σ over its heads of dS⁽ʰ⁾ᵀ·Q⁽ʰ⁾
    Kind(DK, DK, 27, "b_qk", "Gradient of the keys", lambda c: WHY[DK] + group_why("keys")(c),
         group_formula(("dK", "dK"), ("dS", "dS"), ("Q", "Q")), (KEYS, "k"),
         lambda sh, r, c: prod(flip(sh(DS)), sh(Q), "like K"),
         inputs=(DS, Q), relation=group_product(DS, Q),
         when=lambda c: c.loss is not None and c.rope is None, per_head=True, gradient=True,
         mistakes=(ungrouped(Mistake(SCALE_MISSING_DQDK, lambda ops, ex, c: ops.matmul(ops.T(ex(DS_MASKED)), ex(Q)))),
                   ungrouped(square_product("dS·Q instead of dSᵀ·Q (dS was not transposed)",
                                            lambda ops, ex: ex(DS), lambda ops, ex: ex(Q), lambda ex: is_square(ex(DS)))),
                   one_share(DS, Q), transposed(DK, square_only=True))),
    # with RoPE: dQ = R(−pθ)·dQ_rot, dK = R(−pθ)·dK_rot, row by row  (n_q × d_k, n_k × d_k)
    *turned_back_rows(),
    weight_gradient(DW_Q, 28, "query"),  # dW_Q = Xᵀ·dQ  (d_model × d_k)
    weight_gradient(DW_K, 29, "key"),  # dW_K = Xᵀ·dK (Cᵀ·dK with a context)  (d_model × d_k)
    weight_gradient(DW_V, 30, "value"),  # dW_V = Xᵀ·dV (Cᵀ·dV with a context)  (d_model × d_v)
    bias_gradient(DB_Q, 30.2),  # db_Q = 1ᵀ·dQ  (1 × d_k)
    bias_gradient(DB_K, 30.4),  # db_K = 1ᵀ·dK, exactly 0 without RoPE  (1 × d_k)
    bias_gradient(DB_V, 30.6),  # db_V = 1ᵀ·dV  (1 × d_v)
    # back to the input
    # dX = Σ_h (dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ) (+ dH with the residual)  (n × d_model); with a norm in
    # front those paths are dX_norm, then dX̂ = dX_norm ∘ γ, dγ, dβ, and dX back through the norm
    *input_gradient_rows(dX_why, dX_formula),
    # dC = Σ_h (dK·W_Kᵀ + dV·W_Vᵀ)  (n_k × d_model)
    Kind(DCONTEXT, DCONTEXT, 32, "b_input", "Gradient of the context",
         lambda c: WHY[DCONTEXT] + (WHY["dX_heads"] if c.multi else ""), dcontext_formula, (KEYS, "d"),
         lambda sh, r, c: plain(r, "like the context"), inputs=("paths",), relation=input_gradient(DCONTEXT),
         when=lambda c: c.projected and c.cross and c.loss is not None, gradient=True, tex="dC"),
)


BY_KEY: dict[str, Kind] = {k.key: k for k in KINDS}
