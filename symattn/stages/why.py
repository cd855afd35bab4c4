"""The why texts: a sentence or two per stage on why it is computed, and the functions that fit
them to a problem (its mask, its positions, its scale, RoPE, its K/V groups, the decoded token).

The why texts (and every other sentence the worked solution prints from the registry: the mask's
rule, the loss) mark each mathematical symbol as LaTeX between ⟦ and ⟧: "weight ⟦a_{ij}⟧ of query
⟦i⟧". The renderers typeset a marked piece as math (LaTeX \\(…\\), Markdown $…$) and the text
renderer writes it in Unicode (aᵢⱼ); the vocabulary and the conversions are in
symattn/render/prose.py. Text outside the brackets is prose, never math.
"""

from __future__ import annotations

from typing import Callable

from .groups import kv_cache_size, kv_groups
from .ids import (
    A, ACC_TILED, A_SINK, A_T, B_K, B_O, B_Q, B_V, CONCAT, CONTEXT, DA, DCONCAT, DCONTEXT, DECODE_COST, DK, DO,
    DO_HEAD, DQ, DQ_ROT, DK_ROT, DS, DS_MASKED, DV, DW_K, DW_O, DW_Q, DW_V, DX, K, K_CACHE, K_T, L_TILED, M, M_TILED, O,
    O_FINAL, O_T, O_TILED, O_T_DIFF, Q, Q_T, S, S_MASKED, S_SCALED, S_T, V, V_CACHE, W_K, W_O, W_Q, W_V, X,
)
from .formulas import rot_tex
from .kinds import Context, Text
from .relations import cache_runs, cache_size


WHY = {
    X: "Each row of ⟦X⟧ is one token's vector; attention will mix these rows.",
    "X_cross": "Each row of ⟦X⟧ is one query-side token; the queries are computed from it.",
    CONTEXT: "Each row of the context is one token of the other sequence; keys and values are computed from it (cross-attention).",
    W_Q: "The query weights, learned in training and given here.",
    W_K: "The key weights, learned in training and given here.",
    W_V: "The value weights, learned in training and given here.",
    W_O: "The output weights, learned in training and given here: they mix the heads' outputs.",
    B_Q: "The query bias, learned in training and given here: one row, added to every token's query.",
    B_K: "The key bias, learned in training and given here: one row, added to every token's key.",
    B_V: "The value bias, learned in training and given here: one row, added to every token's value.",
    B_O: "The output bias, learned in training and given here: one row, added to every output row.",
    "bias_added": " Then the bias ⟦b_{L}⟧ is added to every row.",
    "db": ("⟦b_{L}⟧ is added to every row of ⟦{L}⟧, so its gradient sums ⟦d{L}⟧ over the rows: the column sums "
           "⟦\\mathbf{{1}}^{{\\top}} d{L}⟧."),
    "db_K": (" It is exactly ⟦0⟧: adding ⟦b_K⟧ to every key adds ⟦q_i \\cdot b_K⟧ to every score of row ⟦i⟧, and a "
             "softmax does not change when a constant is added to its row (each row of ⟦dS⟧ sums to ⟦0⟧)."),
    "db_K_rope": (" Under RoPE it is not ⟦0⟧: ⟦b_K⟧ is added before the rotation, so each key's copy of it is turned "
                  "by that key's own angle, and the scores of a row no longer all move by the same amount."),
    Q: "Each token's query says what it is looking for: its row of ⟦X⟧ times ⟦W_Q⟧.",
    K: "Each token's key says what it offers to be matched against: its row times ⟦W_K⟧.",
    V: "Each token's value is what it hands on when it is attended to: its row times ⟦W_V⟧.",
    "Q_given": "The queries are given directly: one row per query token, what it is looking for.",
    "K_given": "The keys are given directly: one row per key token, what it offers to be matched against.",
    "V_given": "The values are given directly: one row per key token, what it hands on when attended to.",
    "cross": " Keys and values come from the context: this is cross-attention.",
    K_T: "Transposing ⟦K⟧ turns each key into a column, so one matrix product compares every query with every key.",
    S: "Entry ⟦(i, j)⟧ is the dot product of query ⟦i⟧ with key ⟦j⟧: how well query ⟦i⟧ matches key ⟦j⟧.",
    S_SCALED: (
        "A dot product of ⟦d_k⟧ terms of unit variance has variance ⟦d_k⟧; dividing by ⟦\\sqrt{d_k}⟧ brings the scores "
        "back to unit variance, so the softmax does not saturate into a one-hot row with vanishing gradients."
    ),
    "S_scaled_custom": "The scores are multiplied by the scale factor the problem gives.",
    "S_scaled_none": "This problem uses no scaling (scale ⟦1⟧), so the scaled scores equal the scores.",
    M: (
        "The mask says which keys each query may see: ⟦0⟧ where it may attend, ⟦-\\infty⟧ where it may not. "
        "Decoders (GPT-style) use a causal mask so a token cannot look ahead; encoders (BERT-style) use none."
    ),
    S_MASKED: (
        "Adding ⟦M⟧ leaves allowed scores unchanged and sends forbidden ones to ⟦-\\infty⟧; since ⟦\\exp(-\\infty) = 0⟧ "
        "(as a limit), they get weight exactly ⟦0⟧."
    ),
    # A's why is this sentence and its end, which depends on how the rows were normalised (the note)
    A: "The softmax turns each row of scores into weights that are positive and sum to ⟦1⟧; ",
    "O_sink": (" The weights of a row sum to less than ⟦1⟧ here: the sink's share multiplies no value (as a key "
               "whose value is ⟦0⟧), so the row is pulled toward ⟦0⟧ by as much as the sink absorbed."),
    "A_max": "subtracting the row maximum ⟦m_i⟧ first changes nothing (it cancels) and keeps every exponent ⟦\\le 0⟧.",
    "A_symbolic": (
        "subtracting a reference score ⟦m_i⟧ from a row first changes nothing (it cancels). With symbols the "
        "largest score of a row cannot always be picked, so such a row is normalised by its first allowed score "
        "instead and its exponents can be positive; any reference value gives the same weights."
    ),
    O: "Each output row is a weighted average of the value rows, weighted by the same row of ⟦A⟧.",
    CONCAT: "Each head attended in its own subspace; their outputs are placed side by side, row by row.",
    O_FINAL: "The output projection ⟦W_O⟧ mixes what the heads found into one output row per token.",
    DO: "Backpropagation starts from the loss: ⟦\\partial L/\\partial O⟧ says how the loss changes with each output entry.",
    DW_O: "The output projection is a product, so its weights' gradient is the concatenation (transposed) times ⟦dO⟧.",
    DCONCAT: "The gradient flows back through ⟦W_O⟧ to every head's output columns.",
    DO_HEAD: "This head's share of the upstream gradient: its block of columns of ⟦d\\operatorname{concat}⟧.",
    DV: (
        "Each value row was handed on with weight ⟦a_{ij}⟧ to every query ⟦i⟧, so its gradient collects those weights "
        "times ⟦dO⟧: ⟦A^{\\top} dO⟧."
    ),
    DA: (
        "Each weight ⟦a_{ij}⟧ scaled value row ⟦j⟧ in output row ⟦i⟧, so its gradient is the dot product of ⟦dO_i⟧ "
        "with ⟦v_j⟧: ⟦dO\\,V^{\\top}⟧."
    ),
    DS_MASKED: (
        "The softmax couples a whole row: raising one score raises its weight and lowers every other, "
        "so the gradient goes through the Jacobian ⟦\\operatorname{diag}(a) - a\\,a^{\\top}⟧ of each row, which gives "
        "⟦d\\hat{S}_{ij} = a_{ij}\\bigl(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\bigr)⟧. Masked positions have weight ⟦0⟧, "
        "so their gradient is exactly ⟦0⟧, and each row of ⟦d\\hat{S}⟧ sums to exactly ⟦0⟧ (adding a constant to a "
        "row of scores changes nothing)."
    ),
    DS: "The scores were scaled before the mask, so the gradient of the unscaled scores is the scale times ⟦d\\hat{S}⟧.",
    "dS_none": "This problem uses no scaling, so the gradient of the scores is ⟦d\\hat{S}⟧ itself.",
    DQ: (
        "Score ⟦(i, j)⟧ is ⟦q_i \\cdot k_j⟧, so query ⟦i⟧'s gradient sums the keys weighted by row ⟦i⟧ of ⟦dS⟧: "
        "⟦dS\\,K⟧."
    ),
    DK: (
        "Key ⟦j⟧ met every query in column ⟦j⟧ of ⟦S⟧, so its gradient sums the queries weighted by column ⟦j⟧ of "
        "⟦dS⟧: ⟦dS^{\\top} Q⟧."
    ),
    DQ_ROT: (
        "The scores compared the rotated queries and keys, ⟦S = Q^{\\mathrm{rot}} (K^{\\mathrm{rot}})^{\\top}⟧, so the "
        "gradient reaches the rotated queries first: rotated query ⟦i⟧'s gradient sums the rotated keys weighted by "
        "row ⟦i⟧ of ⟦dS⟧, ⟦dS\\,K^{\\mathrm{rot}}⟧."
    ),
    DK_ROT: (
        "Rotated key ⟦j⟧ met every rotated query in column ⟦j⟧ of ⟦S⟧, so its gradient sums the rotated queries "
        "weighted by column ⟦j⟧ of ⟦dS⟧: ⟦dS^{\\top} Q^{\\mathrm{rot}}⟧."
    ),
    # {C} is the name of what the keys and values are made from (X, or the context C)
    DW_Q: "⟦Q = X\\,W_Q⟧, so the query weights' gradient is ⟦X^{\\top} dQ⟧.",
    DW_K: "⟦K = {C}\\,W_K⟧, so the key weights' gradient is ⟦{C}^{\\top} dK⟧.",
    DW_V: "⟦V = {C}\\,W_V⟧, so the value weights' gradient is ⟦{C}^{\\top} dV⟧.",
    DX: "⟦X⟧ reached the loss along three paths (queries, keys and values), so its gradient is their sum.",
    "dX_cross": "⟦X⟧ only made the queries here (cross-attention), so its gradient comes through ⟦dQ⟧ alone.",
    "dX_heads": " With several heads, every head's paths add up.",
    "dX_positions": (" The paths start at ⟦X_{pos} = X + PE⟧ and ⟦PE⟧ does not depend on ⟦X⟧, so the gradient of "
                     "⟦X⟧ is that of ⟦X_{pos}⟧ (for learned positions it is their gradient too, not derived here)."),
    "positions_used": (" The rows are those of ⟦{x}⟧, {what}the tokens with their positions added, so it now "
                       "depends on where each token stands."),
    DCONTEXT: "The context made the keys and the values, so its gradient is the sum of those two paths.",
    M_TILED: (
        "FlashAttention never holds a whole row of scores: it reads the keys in blocks and keeps, per query, "
        "only a running maximum ⟦m⟧, a running sum ⟦\\ell⟧ and an accumulator ⟦\\mathrm{{acc}}⟧, starting from "
        "⟦m^{{(0)}} = -\\infty⟧, ⟦\\ell^{{(0)}} = 0⟧, ⟦\\mathrm{{acc}}^{{(0)}} = 0⟧. Here the blocks hold ⟦B = {B}⟧ keys. "
        "Column ⟦b⟧ is the largest score seen after block ⟦b⟧; a masked key (⟦-\\infty⟧) never raises it."
    ),
    L_TILED: (
        "Each block's terms ⟦e^{{s_j - m^{{(b)}}}}⟧ are taken relative to the newest maximum, but the sum so far was "
        "taken relative to the older one ⟦m^{{(b-1)}}⟧. Multiplying it by ⟦e^{{m^{{(b-1)}} - m^{{(b)}}}}⟧ re-bases it "
        "(⟦e^{{s_j - m^{{(b-1)}}}} e^{{m^{{(b-1)}} - m^{{(b)}}}} = e^{{s_j - m^{{(b)}}}}⟧), so no earlier key needs to be read "
        "again: one pass over the keys is enough, and the ⟦n \\times n⟧ weights are never stored. A masked key adds "
        "exactly ⟦0⟧; before any key is allowed the factor is ⟦0⟧ (⟦e^{{x}} \\to 0⟧ as ⟦x \\to -\\infty⟧). After the last block ⟦\\ell⟧ "
        "is the softmax normaliser ⟦Z_i⟧."
    ),
    ACC_TILED: (
        "The accumulator collects ⟦e^{{s_j - m}} v_j⟧ and is re-based by the same factor "
        "⟦e^{{m^{{(b-1)}} - m^{{(b)}}}}⟧ whenever the maximum grows, so after the last block it is the softmax's "
        "numerator ⟦\\sum_j e^{{s_j - m_i}} v_j⟧ of each output row."
    ),
    O_TILED: (
        "Dividing once at the end gives the output rows: ⟦o_i = \\mathrm{{acc}}_i / \\ell_i⟧. It equals row ⟦i⟧ of "
        "⟦A\\,V⟧ exactly, not just to rounding: the difference simplifies to ⟦0⟧."
    ),
}


def _heads_words(heads: list[int]) -> str:
    """``heads 1 and 2``, ``heads 1, 2 and 3``, ``head 1``."""
    if len(heads) == 1:
        return f"head {heads[0]}"
    return "heads " + ", ".join(str(h) for h in heads[:-1]) + f" and {heads[-1]}"


def sink_why(c: Context, key: str) -> str:
    """The softmax with a learned sink (gpt-oss's), and what the sink absorbed."""
    import sympy

    s = sympy.latex(c.sink)
    if key == A_SINK:
        return (f"The sink's share of each row: ⟦e^{{s - m_i}} / Z_i⟧ with ⟦s = {s}⟧, which is ⟦1⟧ minus the row's "
                "weights. A query with no key worth attending to puts its weight here, and its output shrinks "
                "toward ⟦0⟧ instead of averaging values it does not want.")
    return (f"The softmax with a learned sink ⟦s = {s}⟧ (gpt-oss's, one per head): each row's normaliser ⟦Z_i⟧ gets "
            "one more term ⟦e^{s - m_i}⟧ that belongs to no key, as if a key with score ⟦s⟧ and value ⟦0⟧ were "
            "always there. The weights are positive and sum to less than ⟦1⟧; ⟦m_i⟧ is the maximum over the row's "
            "scores and ⟦s⟧, and ")


def _sink_window_why(c: Context, key: str, text: str) -> str:
    """The decoding step's why under StreamingLLM's sink window: the cache keeps the sink tokens and
    the window only, and says how many keys that is."""
    t, k, w = c.t, c.p.mask.sink, c.p.mask.window
    rows = ", ".join(f"⟦{a + 1}⟧" if n == 1 else f"⟦{a + 1}⟧ to ⟦{a + n}⟧" for a, n in cache_runs(c))
    size = cache_size(c)
    if key == K_CACHE:
        return (f"Decoding token ⟦t = {t}⟧ with ⟦{k}⟧ sink {'token' if k == 1 else 'tokens'} and a window of ⟦{w}⟧, "
                f"the model keeps only the keys the mask lets a query see: the first ⟦{k}⟧ "
                f"{'token' if k == 1 else 'tokens'} and the last ⟦{w}⟧ (the new token "
                f"included). The cache holds rows {rows} of ⟦{rot_tex(c, 'K')}⟧: ⟦{size}⟧ "
                f"{'key' if size == 1 else 'keys'}, never more than ⟦{k} + {w} = {k + w}⟧ however long the "
                "text grows; every other key has been evicted.")
    if key == V_CACHE:
        return f"The values are cached the same way: rows {rows} of ⟦V⟧."
    if key == S_T:
        return ("The new query against every cached key, scaled as before: one row of scores. No mask is needed, "
                "since the cache holds exactly the keys the mask allows.")
    if key == O_T_DIFF:
        return (f"The decoded row is exactly row ⟦{t}⟧ of the full masked computation: the mask gave every "
                "evicted key (and every key after the new token) weight exactly ⟦0⟧, so leaving them out of the cache "
                f"changes nothing. The difference ⟦o_t - O_{{{t},:}}⟧ simplifies to exactly ⟦0⟧.")
    if key == DECODE_COST:
        return (f"Decoding token ⟦t⟧ from the cache costs ⟦r_t\\,d_k⟧ multiplications for its scores (and "
                f"⟦r_t\\,d_v⟧ for its output), with ⟦r_t⟧ = the smaller of ⟦t⟧ and ⟦{k} + {w} = {k + w}⟧ cached keys; recomputing all ⟦t⟧ rows "
                "from scratch costs ⟦t^2 d_k⟧ for the scores and ⟦t^2 d_v⟧ for the outputs. Row ⟦t⟧ is the step "
                f"that decodes that token; here ⟦d_k = {c.d_k}⟧ and ⟦d_v = {c.d_v}⟧" + (", per head." if c.multi else "."))
    return text


def _cache_sentence(c: Context) -> str:
    """The KV cache's size per token, with and without the heads' sharing."""
    size = kv_cache_size(c.p)
    g, h, d_k, d_v = size["kv_heads"], size["query_heads"], size["d_k"], size["d_v"]
    if d_k == d_v:
        with_, without = f"2 g\\,d_k = 2 \\cdot {g} \\cdot {d_k}", f"2 h\\,d_k = 2 \\cdot {h} \\cdot {d_k}"
    else:
        with_, without = f"g(d_k + d_v) = {g}({d_k} + {d_v})", f"h(d_k + d_v) = {h}({d_k} + {d_v})"
    if not c.grouped:
        return (f" The KV cache grows by the token's key and value in every head: ⟦{without} = {size['without_sharing']}⟧ "
                "numbers per token per layer.")
    return (f" With ⟦g = {g}⟧ K/V heads for ⟦h = {h}⟧ query heads, the KV cache holds ⟦{with_} = {size['per_token']}⟧ "
            f"numbers per token per layer (keys and values), against ⟦{without} = {size['without_sharing']}⟧ "
            "without sharing.")


def group_note(c: Context, key: str) -> str:
    """Which query heads read this K/V group (grouped-query attention), for the group's stages;
    which group a query head reads, for its queries."""
    if not c.grouped or c.head is None or key == W_Q:
        return ""
    p = c.p
    group = p.kv_group(c.head)
    heads = kv_groups(p)[group - 1][1]
    if key == Q:
        names = f"⟦K^{{({heads[0]})}}⟧ and ⟦V^{{({heads[0]})}}⟧"
        return (f" Head {c.head} reads K/V group {group} ({names}), which {_heads_words(heads)} share "
                f"({'multi-query attention: one K/V head for all' if p.kv_heads == 1 else 'grouped-query attention'}).")
    note = f" {_heads_words(heads).capitalize()} read K/V group {group}: it is computed once, for them all."
    return note + (_cache_sentence(c) if key == K else "")


def reads_note(c: Context, key: str) -> str:
    """For a grouped head other than its group's first: whose keys (K_T) or values (V) it reads."""
    other = c.reads(key, c.head)
    if other == c.head:
        return ""
    name = f"K^{{({other})\\top}}" if key == K_T else f"V^{{({other})}}"
    return f" The {'keys' if key == K_T else 'values'} are K/V group {c.p.kv_group(c.head)}'s, head {other}'s ⟦{name}⟧."


def mask_why(c: Context) -> str:
    p = c.p
    why = WHY[M] + f" Here the rule is {p.mask.rule()}."
    if p.mask.kinds & {"causal", "causal-bottom-right", "sliding-window"} and p.n_q != p.n_k:
        shift = p.n_k - p.n_q
        why += (
            f" With ⟦{p.n_q}⟧ queries and ⟦{p.n_k}⟧ keys the two causal alignments differ: top-left "
            f"(PyTorch's is_causal) lets query ⟦i⟧ see keys ⟦j \\le i⟧, bottom-right (FlashAttention's) "
            f"keys ⟦j \\le i {'+' if shift >= 0 else '-'} {abs(shift)}⟧."
        )
    if p.bias is not None:
        why += " The bias is added to it, so ⟦M⟧ is the mask plus the bias."
    return why


_POSITIONS_WHY = {
    "sinusoidal": (
        "Attention by itself ignores order: shuffling the tokens only shuffles the output rows. The original "
        "transformer therefore adds to each token a fixed vector that encodes its position ⟦p⟧: each pair of "
        "columns ⟦2i, 2i+1⟧ holds the sine and cosine of ⟦p⟧ at one frequency, ⟦1/\\mathrm{{base}}^{{2i/d}}⟧, "
        "from one radian per position (⟦i = 0⟧) to ever slower ones, so nearby positions get similar rows. "
        "Positions are counted from ⟦p = 0⟧ as in the paper: token ⟦1⟧ of this text has ⟦p = 0⟧, so its row is "
        "⟦\\sin(0) = 0⟧ and ⟦\\cos(0) = 1⟧ alternating. Here ⟦\\mathrm{{base}} = {base}⟧ and ⟦d = d_{{\\mathrm{{model}}}} = {d}⟧, and "
        "every entry is exact."
    ),
    "learned": (
        "Attention by itself ignores order: shuffling the tokens only shuffles the output rows. Here the "
        "positions are learned (as GPT-2 and BERT have them): one trained row per position, given, and row ⟦p⟧ is added to the "
        "token at position ⟦p⟧."
    ),
    "cross": (
        " Only ⟦X⟧, the query side, gets positions: the context is taken as given (in an encoder-decoder "
        "transformer it is the encoder's output, whose positions were added before the encoder)."
    ),
}


def tt_ids(c: Context) -> str:
    """Which row of the token-type table each token takes, in words (types counted from 0, as the
    model's token_type_ids are)."""
    ids = getattr(c.p, "token_type_ids", ())
    if not ids:
        return ""
    if len(set(ids)) == 1:
        return f" (type {ids[0]} for every token, row {ids[0] + 1} of the table)"
    return " (types " + ", ".join(str(t) for t in ids) + " for tokens 1 to " + str(len(ids)) + ", counted from 0)"


def pe_why(c: Context) -> str:
    pos = c.p.positions
    import sympy

    why = _POSITIONS_WHY[pos.kind]
    if pos.kind == "sinusoidal":
        why = why.format(base=sympy.latex(pos.base), d=c.p.d_model)
    return why + (_POSITIONS_WHY["cross"] if c.cross else "")


def scale_why(c: Context) -> str:
    return {"auto": WHY[S_SCALED], "none": WHY["S_scaled_none"]}.get(
        c.p.scale if isinstance(c.p.scale, str) else "", WHY["S_scaled_custom"])


def dX_why(c: Context) -> str:
    why = WHY["dX_cross"] if c.cross else WHY[DX]
    return why + (WHY["dX_heads"] if c.multi else "") + (WHY["dX_positions"] if c.positions else "")


_ROPE_PAIRING = (
    "The two pairings rotate by the same angles but pair different components: half pairs component ⟦i⟧ "
    "with ⟦i + d_k/2⟧ (GPT-NeoX, LLaMA in Hugging Face: rotate_half), interleaved pairs ⟦2i - 1⟧ with ⟦2i⟧ "
    "(the RoFormer paper, Meta's original LLaMA code), so weights trained under one give other scores under "
    "the other."
)


def rope_why(noun: str, letter: str) -> Text:
    def why(c: Context) -> str:
        r = c.rope
        return (
            f"RoPE turns each pair of {noun}'s components by the angle ⟦p\\,\\theta_i⟧, where ⟦p⟧ is the "
            f"token's position, counted from ⟦0⟧ for the first token as the libraries count, and "
            f"{r.rule()}; a turned {letter} keeps its length and only its direction carries the position. "
            f"This problem uses the {r.pairing} pairing. " + _ROPE_PAIRING
            + (" With ⟦d_k = 2⟧ both pair components ⟦1⟧ and ⟦2⟧." if c.d_k == 2 else "")
        )

    return why


def turned_back_why(noun: str, letter: str) -> str:
    """Why the gradient of the unrotated queries (keys) is the rotated one turned back."""
    v = letter.lower()
    return (
        f"Each rotated {noun} is ⟦{v}^{{\\mathrm{{rot}}}}_p = R(p\\,\\theta)\\,{v}_p⟧, one rotation per pair, so the "
        f"gradient of ⟦{v}_p⟧ is ⟦R(p\\,\\theta)^{{\\top}} d{v}^{{\\mathrm{{rot}}}}_p⟧. A rotation's transpose is its "
        f"inverse, the rotation by ⟦-p\\,\\theta_i⟧: each pair of ⟦d{letter}^{{\\mathrm{{rot}}}}⟧ is turned back by its "
        f"token's angle, in the same pairing, and no row changes its length. The first token (⟦p = 0⟧) is not "
        f"turned, so its row of ⟦d{letter}⟧ is its row of ⟦d{letter}^{{\\mathrm{{rot}}}}⟧."
    )


K_ROT_WHY = (
    "Each key is turned exactly as the queries are: pair ⟦i⟧ of the key at position ⟦p⟧ by ⟦p\\,\\theta_i⟧, "
    "in the same pairing. The values are not rotated: the position belongs in the match, not in what is "
    "handed on."
)


def k_t_why(c: Context) -> str:
    if c.rope is None and getattr(c.p, "qk_norm", None) is not None:
        return WHY[K_T].replace("⟦K⟧", "the normalised keys ⟦K_{norm}⟧")
    if c.rope is None:
        return WHY[K_T]
    return WHY[K_T].replace("⟦K⟧", "the rotated keys ⟦K^{\\mathrm{rot}}⟧")


def s_why(c: Context) -> str:
    if c.rope is None:
        return WHY[S]
    return (WHY[S].replace("the dot product of query", "the dot product of rotated query") +
            " Since ⟦R(a)^{\\top} R(b) = R(b - a)⟧, the score of the query at position ⟦p⟧ and the key at "
            "position ⟦r⟧ is ⟦q_p \\cdot R((r - p)\\,\\theta)\\,k_r⟧: it depends on the positions only through "
            "⟦r - p⟧.")


def decode_why(key: str) -> Callable[[Context], str]:
    def why(c: Context) -> str:
        t = c.t
        text = {
            K_CACHE: (f"Decoding token ⟦t = {t}⟧, a model has already computed the keys of tokens ⟦1⟧ to ⟦{t}⟧ "
                      f"(row ⟦{t}⟧ was just added for the new token) and keeps them: the KV cache holds rows ⟦1⟧ to "
                      f"⟦{t}⟧ of ⟦K⟧. Causal attention never reads a key after ⟦t⟧, so nothing else is needed."),
            V_CACHE: f"The values of tokens ⟦1⟧ to ⟦{t}⟧ are cached the same way: rows ⟦1⟧ to ⟦{t}⟧ of ⟦V⟧.",
            Q_T: f"Only the new token's query is needed: row ⟦{t}⟧ of ⟦Q⟧. The earlier rows were decoded at earlier steps.",
            S_T: ("The new query against every cached key, scaled as before: one row of ⟦t⟧ scores. No mask is "
                  "needed, since the cache holds only keys ⟦j \\le t⟧."),
            A_T: "The softmax of the one row of scores: weights over the cached keys that sum to ⟦1⟧.",
            O_T: "The new token's output: the cached values weighted by ⟦a_t⟧.",
            O_T_DIFF: (f"The decoded row is exactly row ⟦{t}⟧ of the full causal computation: the causal mask gave "
                       f"every key after ⟦{t}⟧ weight exactly ⟦0⟧, so leaving those keys out of the cache changes "
                       f"nothing. The difference ⟦o_t - O_{{{t},:}}⟧ simplifies to exactly ⟦0⟧."),
            DECODE_COST: ("Decoding token ⟦t⟧ from the cache costs ⟦t\\,d_k⟧ multiplications for its scores (and "
                          "⟦t\\,d_v⟧ for its output); recomputing all ⟦t⟧ rows from scratch costs ⟦t^2 d_k⟧ for the "
                          "scores (the full product ⟦Q K^{\\top}⟧ of ⟦t⟧ tokens) and ⟦t^2 d_v⟧ for the outputs. Row "
                          f"⟦t⟧ is the step that decodes that token; here ⟦d_k = {c.d_k}⟧ and ⟦d_v = {c.d_v}⟧"
                          + (", per head." if c.multi else ".")),
        }[key]
        if key == A_T and c.sink is not None:
            text = ("The softmax of the one row of scores, with the head's learned sink in its denominator as in "
                    "⟦A⟧: weights over the cached keys that sum to less than ⟦1⟧.")
        if c.p.mask.kind == "sink-window":
            return _sink_window_why(c, key, text)
        if key == K_CACHE:
            text += _cache_sentence(c)
            if c.grouped:
                text += f" {_heads_words(kv_groups(c.p)[c.p.kv_group(c.head) - 1][1]).capitalize()} read this cache."
        return text

    return why
