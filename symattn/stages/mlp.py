"""The registry's rows of the rest of the block and of the model's head (``mlp:``, ``logits:``,
``loss:``).

Behind the attention's residual stream H (``stream``: H, or behind a post norm its output):

    H_norm = norm(H)                         mlp_mean ... H_norm  (the MLP's norm, place pre; optional)
    U = H_norm·W_1 + b_1                      U        (gated: U_gate = H_norm·W_gate, U_up = H_norm·W_up)
    G = act(U)                                G        (gated: act(U_gate) ∘ U_up)
    F = G·W_2 + b_2                           F        (gated: G·W_down)
    Y = H + F                                 Y        (post, BERT: Y_sum = H + F, then Y = LN(Y_sum))

and the model's head on the block's output (``top``: Y, or H without an MLP):

    Y_last = the last row of Y                Y_last   (rows: last)
    Y_final = norm(Y or Y_last)               final_mean ... Y_final  (the final norm; optional)
    logits = Y_final·W_U                      logits   (W_U given, or the embedding table transposed)
    P = softmax of each row                   P        (over the vocabulary)
    nll_i = −log P[r_i, t_i]                  nll      (one per row the loss uses)
    L = mean of nll                           L
"""

from __future__ import annotations

from .ids import (
    B_1, B_2, F, G, LAST, LOGITS, LOSS, LOSS_AXIS, LOSS_ROWS, NLL, NLL_AXIS, P, QUERIES, U, U_GATE, U_UP, VOCAB, W_1,
    W_2, W_DOWN, W_GATE, W_U, W_UP, Y, Y_LAST, Y_SUM,
)
from .kinds import Context, Kind, Mistake
from .shapes import plain, prod

ACT_TEX = {"relu": "\\operatorname{ReLU}", "relu2": "\\operatorname{ReLU}^2", "gelu": "\\operatorname{GELU}",
           "gelu-tanh": "\\operatorname{GELU}_{\\tanh}", "silu": "\\operatorname{SiLU}"}
ACT_TEXT = {"relu": "ReLU", "relu2": "ReLU²", "gelu": "GELU", "gelu-tanh": "GELU_tanh", "silu": "SiLU"}
ACT_WHY = {
    "relu": "ReLU keeps each positive entry and sets the others to 0: ⟦\\max(0, u)⟧.",
    "relu2": "ReLU² squares what ReLU keeps: ⟦\\max(0, u)^2⟧.",
    "gelu": "GELU weighs each entry by the chance that a standard normal number lies below it: "
            "⟦u\\,\\Phi(u) = \\tfrac{u}{2}\\bigl(1 + \\operatorname{erf}(u/\\sqrt{2})\\bigr)⟧ (the exact form, BERT's).",
    "gelu-tanh": "GPT-2's GELU writes ⟦\\Phi⟧ with a tanh: ⟦\\tfrac{u}{2}\\bigl(1 + \\tanh\\bigl(\\sqrt{2/\\pi}\\,"
                 "(u + 0.044715\\,u^3)\\bigr)\\bigr)⟧, close to the erf form but not equal to it.",
    "silu": "SiLU multiplies each entry by its sigmoid: ⟦u\\,\\sigma(u) = u/(1 + e^{-u})⟧.",
}
OTHER_GELU = {"gelu": "gelu-tanh", "gelu-tanh": "gelu"}


def _mlp(c: Context) -> bool:
    return c.mlp is not None


def _plain(c: Context) -> bool:
    return c.mlp is not None and not c.mlp.gated


def _gated(c: Context) -> bool:
    return c.mlp is not None and c.mlp.gated


def in_name(c: Context) -> str:
    """What the MLP reads, in LaTeX."""
    return "H_{norm}" if c.mlp_in.endswith("norm") else "H"


def _bias(c: Context, key: str) -> bool:
    return c.mlp is not None and getattr(c.mlp, key) is not None


def _product(ops, x, w, b):
    out = ops.matmul(x, w)
    return out if b is None else ops.add_row(out, b)


def first(c: Context) -> str:
    """The key of the MLP's first weights: W_1, or the gate's W_gate."""
    return W_GATE if c.mlp.gated else W_1


def hidden(c: Context) -> str:
    """The key of the pre-activation: U, or the gate's U_gate."""
    return U_GATE if c.mlp.gated else U


def second(c: Context) -> str:
    """The key of the MLP's second weights: W_2, or the down weights W_down."""
    return W_DOWN if c.mlp.gated else W_2


def _hidden(ops, v, c):
    return _product(ops, v(c.mlp_in), v(first(c)), v(B_1) if _bias(c, "b_1") else None)


def _activated(ops, v, c, name: str | None = None):
    name = name or c.mlp.activation
    if c.mlp.gated:
        return ops.hadamard(ops.activate(v(U_GATE), name), v(U_UP))
    return ops.activate(v(U), name)


def _act_mistakes() -> tuple[Mistake, ...]:
    def swapped(ops, ex, c):
        other = OTHER_GELU.get(c.mlp.activation)
        return None if other is None else _activated(ops, ex, c, other)

    def before_bias(ops, ex, c):
        if c.mlp.gated or not _bias(c, "b_1"):
            return None
        return ops.add_row(ops.activate(ops.matmul(ex(c.mlp_in), ex(W_1)), c.mlp.activation), ex(B_1))

    def not_gated(ops, ex, c):
        return ops.activate(ex(U_GATE), c.mlp.activation) if c.mlp.gated else None

    return (
        Mistake("GELU's erf and tanh forms swapped (GPT-2 uses the tanh form, BERT the erf one)", swapped),
        Mistake("the activation applied before the bias: act(H·W_1) + b_1 instead of act(H·W_1 + b_1)", before_bias),
        Mistake("the gate alone: act(U_gate) was not multiplied by U_up", not_gated),
    )


def _stream_why(c: Context) -> str:
    return ("The residual stream again: the MLP's output is added to the stream it read, ⟦Y = H + F⟧. ⟦Y⟧ is the "
            "block's output, the next layer's input.")


def _unembedding_why(c: Context) -> str:
    n = c.logits
    tied = (" Here it is the embedding table, transposed (tied weights): a word's logit is the dot product of the "
            "row with the word's own embedding.") if n.tied else ""
    return ("The unembedding ⟦W_U⟧ has one column per word of the vocabulary (" + f"{n.size:,}" + " here)." + tied)


def _logits_why(c: Context) -> str:
    n = c.logits
    x = "Y_{final}" if n.norm is not None else ("Y_{last}" if n.last else c_top(c))
    lens = (" This layer is not the model's last: reading its stream through the final norm and the unembedding "
            "this early is the logit lens, a view of what the model would predict if it stopped here.") if n.lens else ""
    return (f"Each row of ⟦{x}⟧ is scored against every word: the logit of word ⟦v⟧ is the dot product of the row "
            "with column ⟦v⟧ of ⟦W_U⟧. The logits are scores, not probabilities: any number, and only their "
            "differences matter." + lens)


def c_top(c: Context) -> str:
    """The block's output, in LaTeX: Y with an MLP, else the residual stream H."""
    return "Y" if c.mlp is not None else "H"


def _logit_rows(c: Context):
    return (LAST if c.logits.last else QUERIES, VOCAB)


def _loss_why(c: Context) -> str:
    rows = len(c.ce.rows)
    what = "the row" if rows == 1 else f"each of the {rows} rows"
    return (f"The cross-entropy of {what}: ⟦-\\log P_{{i, t_i}} = \\log\\sum_v e^{{z_{{iv}} - z_{{i,t_i}}}}⟧, minus the "
            "natural log of the probability the model gives the target word ⟦t_i⟧: 0 when it is sure and right, "
            "large when it gives the target little.")


def _loss_formula(c: Context) -> tuple[str, str]:
    n = len(c.ce.rows)
    if n == 1:
        return "L = -\\log P_{i, t_i}", "L = −log P[i, t_i] (one row)"
    return f"L = \\frac{{1}}{{{n}}}\\sum_i -\\log P_{{i, t_i}}", f"L = (1/{n})·Σ_i −log P[i, t_i]"


def _nll_mistakes() -> tuple[Mistake, ...]:
    def likeliest(ops, ex, c):
        z = ops.grid(ex(LOGITS))
        tops = [max(range(len(z[r])), key=lambda k: z[r][k]) for r in c.ce.rows]
        return None if list(tops) == list(c.ce.targets) else ops.nll(z, tops, c.ce.rows)

    def counted_from_one(ops, ex, c):
        if any(t == 0 for t in c.ce.targets):
            return None
        return ops.nll(ex(LOGITS), [t - 1 for t in c.ce.targets], c.ce.rows)

    return (
        Mistake("the log of the wrong class: the likeliest word's probability instead of the target's", likeliest),
        Mistake("the target id counted from 1: the vocabulary's ids count from 0", counted_from_one),
        Mistake("the base-2 logarithm (bits): the cross-entropy takes the natural log",
                lambda ops, ex, c: ops.nll(ex(LOGITS), c.ce.targets, c.ce.rows, "log2")),
    )


def mlp_rows() -> tuple[Kind, ...]:
    """The MLP's weights, its hidden layer, its activation and output, and the residual sum."""
    return (
        Kind(W_1, W_1, 18.72, "mlp", "The MLP's first weights",
             "The MLP's first weights: one column per hidden unit (d_ff of them, often 4·d_model).",
             ("W_1", "W_1"), ("d", "f"), lambda sh, r, c: plain(r, "d_model × d_ff"), source=lambda c: c.mlp.W_1,
             when=_plain, labelled=False),
        Kind(W_GATE, W_GATE, 18.72, "mlp", "The gate's weights", "The gate's weights: one column per hidden unit "
             "(d_ff of them).", ("W_{gate}", "W_gate"), ("d", "f"), lambda sh, r, c: plain(r, "d_model × d_ff"),
             source=lambda c: c.mlp.W_1, when=_gated, labelled=False),
        Kind(W_UP, W_UP, 18.725, "mlp", "The up weights", "The up projection's weights, one column per hidden unit.",
             ("W_{up}", "W_up"), ("d", "f"), lambda sh, r, c: plain(r, "d_model × d_ff"),
             source=lambda c: c.mlp.W_up, when=_gated, labelled=False),
        Kind(B_1, B_1, 18.73, "mlp", "The MLP's first bias", "One number per hidden unit, added to every row.",
             ("b_1", "b_1"), ("b", "f"), lambda sh, r, c: plain(r, "1 × d_ff"), source=lambda c: c.mlp.b_1,
             when=lambda c: _bias(c, "b_1"), labelled=False),
        Kind(U, U, 18.74, "mlp", "The hidden layer, before the activation",
             "Each token's row goes through the MLP on its own: the tokens do not mix here (only the attention mixes "
             "them). ⟦U⟧ has one column per hidden unit.",
             lambda c: (f"U = {in_name(c)}\\,W_1" + (" + b_1" if _bias(c, "b_1") else ""),
                        f"U = {c.plain(in_name(c))}·W_1" + (" + b_1" if _bias(c, "b_1") else "")),
             (QUERIES, "f"), lambda sh, r, c: prod(sh(c.mlp_in), sh(W_1), "n × d_ff"),
             inputs=("mlp_in", W_1, B_1), relation=_hidden, when=_plain, by_relation=True,
             mistakes=(Mistake("the bias b_1 was not added",
                               lambda ops, ex, c: ops.matmul(ex(c.mlp_in), ex(W_1)) if _bias(c, "b_1") else None),)),
        Kind(U_GATE, U_GATE, 18.74, "mlp", "The gate's pre-activation",
             "Each token's row goes through the MLP on its own: the tokens do not mix here (only the attention mixes "
             "them). ⟦U_{gate}⟧ has one column per hidden unit.",
             lambda c: (f"U_{{gate}} = {in_name(c)}\\,W_{{gate}}", f"U_gate = {c.plain(in_name(c))}·W_gate"),
             (QUERIES, "f"), lambda sh, r, c: prod(sh(c.mlp_in), sh(W_GATE), "n × d_ff"),
             inputs=("mlp_in", W_GATE), relation=_hidden, when=_gated, by_relation=True, tex="U_{gate}"),
        Kind(U_UP, U_UP, 18.745, "mlp", "The up projection",
             "The second projection of the same rows: the gate's activation multiplies it entry by entry.",
             lambda c: (f"U_{{up}} = {in_name(c)}\\,W_{{up}}", f"U_up = {c.plain(in_name(c))}·W_up"), (QUERIES, "f"),
             lambda sh, r, c: prod(sh(c.mlp_in), sh(W_UP), "n × d_ff"), inputs=("mlp_in", W_UP),
             relation=lambda ops, v, c: ops.matmul(v(c.mlp_in), v(W_UP)), when=_gated, by_relation=True,
             tex="U_{up}"),
        Kind(G, G, 18.75, "mlp", "The activation",
             lambda c: ACT_WHY[c.mlp.activation] + (" Gated (SwiGLU with SiLU, GeGLU with GELU), the activation of the "
                                                     "gate multiplies the up projection, entry by entry." if c.mlp.gated else ""),
             lambda c: ((f"G = {ACT_TEX[c.mlp.activation]}(U_{{gate}}) \\odot U_{{up}}",
                         f"G = {ACT_TEXT[c.mlp.activation]}(U_gate) ∘ U_up") if c.mlp.gated else
                        (f"G = {ACT_TEX[c.mlp.activation]}(U)", f"G = {ACT_TEXT[c.mlp.activation]}(U)")),
             (QUERIES, "f"), lambda sh, r, c: plain(r, "like U, entry by entry"), inputs=("mlp_u", U_UP),
             relation=_activated, when=_mlp, by_relation=True, mistakes=_act_mistakes()),
        Kind(W_2, W_2, 18.76, "mlp", "The MLP's second weights",
             "They bring each row back to d_model, the width of the residual stream.", ("W_2", "W_2"), ("f", "d"),
             lambda sh, r, c: plain(r, "d_ff × d_model"), source=lambda c: c.mlp.W_2, when=_plain, labelled=False),
        Kind(W_DOWN, W_DOWN, 18.76, "mlp", "The down weights",
             "They bring each row back to d_model, the width of the residual stream.", ("W_{down}", "W_down"),
             ("f", "d"), lambda sh, r, c: plain(r, "d_ff × d_model"), source=lambda c: c.mlp.W_2, when=_gated,
             labelled=False),
        Kind(B_2, B_2, 18.765, "mlp", "The MLP's second bias", "One number per feature, added to every row.",
             ("b_2", "b_2"), ("b", "d"), lambda sh, r, c: plain(r, "1 × d_model"), source=lambda c: c.mlp.b_2,
             when=lambda c: _bias(c, "b_2"), labelled=False),
        Kind(F, F, 18.77, "mlp", "The MLP's output",
             "Back to the width of the residual stream: one row per token, d_model columns.",
             lambda c: (("F = G\\,W_{down}", "F = G·W_down") if c.mlp.gated else
                        ("F = G\\,W_2" + (" + b_2" if _bias(c, "b_2") else ""), "F = G·W_2" + (" + b_2" if _bias(c, "b_2") else ""))),
             (QUERIES, "d"), lambda sh, r, c: prod(sh(G), sh(second(c)), "n × d_model"), inputs=(G, "mlp_w2", B_2),
             relation=lambda ops, v, c: _product(ops, v(G), v(second(c)), v(B_2) if _bias(c, "b_2") else None),
             when=_mlp, by_relation=True,
             mistakes=(Mistake("the bias b_2 was not added",
                               lambda ops, ex, c: ops.matmul(ex(G), ex(second(c))) if _bias(c, "b_2") else None),)),
        Kind(Y, Y, 18.78, "mlp_residual", "Add the MLP's output to the residual stream", _stream_why,
             ("Y = H + F", "Y = H + F"), (QUERIES, "d"), lambda sh, r, c: plain(r, "like H"),
             inputs=("stream", F), relation=lambda ops, v, c: ops.sum([v(c.stream), v(F)]),
             when=lambda c: _mlp(c) and not c.mlp.post, by_relation=True,
             mistakes=(Mistake("the residual was left out: Y = F", lambda ops, ex, c: ex(F)),
                       Mistake("the MLP's normalised input was added instead of the stream: Y = H_norm + F",
                               lambda ops, ex, c: ops.sum([ex(c.mlp_in), ex(F)]) if c.mlp.norm is not None else None))),
        Kind(Y_SUM, Y_SUM, 18.89, "mlp_residual", "Add the residual (before the norm)",
             "Behind the MLP (post-norm, BERT's order) its output is first added to its input, ⟦H + F⟧, and the sum "
             "is normalised.", ("Y_{sum} = H + F", "Y_sum = H + F"), (QUERIES, "d"), lambda sh, r, c: plain(r, "like H"),
             inputs=("stream", F), relation=lambda ops, v, c: ops.sum([v(c.stream), v(F)]),
             when=lambda c: _mlp(c) and c.mlp.post, by_relation=True, tex="Y_{sum}",
             mistakes=(Mistake("the residual was left out: Y_sum = F", lambda ops, ex, c: ex(F)),)),
    )


def head_rows_before() -> tuple[Kind, ...]:
    """The last row of the block's output, when only its logits are asked for."""
    return (
        Kind(Y_LAST, Y_LAST, 18.92, lambda c: "final_norm" if c.logits is not None and c.logits.norm is not None else "logits",
             "The last position's row",
             "Only the last position's logits predict the next token, so the head reads the last row alone.",
             lambda c: (f"Y_{{last}} = {c_top(c)}_{{{c.p.n_q},:}}", f"Y_last = {c_top(c)}[{c.p.n_q}, :]"), (LAST, "d"),
             lambda sh, r, c: plain(r, "1 × d_model"), inputs=("top",),
             relation=lambda ops, v, c: ops.rows(v(c.top), c.p.n_q - 1, 1),
             when=lambda c: c.logits is not None and c.logits.last, by_relation=True, tex="Y_{last}"),
    )


def head_rows() -> tuple[Kind, ...]:
    """The unembedding, the logits, the probabilities and the loss."""
    return (
        Kind(W_U, W_U, 18.95, "logits", lambda c: "The unembedding (tied: the embedding table, transposed)"
             if c.logits.tied else "The unembedding", _unembedding_why,
             lambda c: ("W_U = E^{\\top}", "W_U = Eᵀ") if c.logits.tied else ("W_U", "W_U"), ("d", VOCAB),
             lambda sh, r, c: plain(r, "d_model × vocabulary"), source=lambda c: c.logits.W_U,
             when=lambda c: c.logits is not None, tex="W_U"),
        Kind(LOGITS, LOGITS, 18.96, "logits", "The logits", _logits_why,
             lambda c: (f"z = {c_unembedded_tex(c)}\\,W_U", f"z = {c.plain(c_unembedded_tex(c))}·W_U"), _logit_rows,
             lambda sh, r, c: prod(sh(c.unembedded), sh(W_U), "rows × vocabulary"), inputs=("unembedded", W_U),
             relation=lambda ops, v, c: ops.matmul(v(c.unembedded), v(W_U)),
             when=lambda c: c.logits is not None, by_relation=True, tex="z"),
        Kind(P, P, 18.97, "probabilities", "Next-token probabilities",
             "The softmax of each row of logits over the whole vocabulary: ⟦P_{iv} = e^{z_{iv}} / \\sum_u e^{z_{iu}}⟧, "
             "the model's probability that word ⟦v⟧ comes next; each row sums to 1. Dividing through by "
             "⟦e^{z_{iv}}⟧ writes each entry as ⟦1/\\sum_u e^{z_{iu} - z_{iv}}⟧: the same number, with only "
             "differences of logits in the exponents.",
             ("P = \\operatorname{softmax}(z)", "P[i,v] = exp(z[i,v]) / Σ_u exp(z[i,u])"), _logit_rows,
             lambda sh, r, c: f"{r[0]}×{r[1]} (rows × vocabulary), each row sums to 1", inputs=(LOGITS,),
             relation=lambda ops, v, c: ops.row_softmax(v(LOGITS)), when=lambda c: c.logits is not None,
             by_relation=True, shows=frozenset({"top"}),
             mistakes=(Mistake("the softmax over the wrong axis: each column was normalised instead of each row",
                               lambda ops, ex, c: ops.column_softmax(ex(LOGITS)) if len(ops.grid(ex(LOGITS))) > 1 else None),)),
        Kind(NLL, NLL, 18.98, "loss", "Each row's cross-entropy", _loss_why,
             ("-\\log P_{i, t_i}", "−log P[i, t_i] = log Σ_v exp(z[i,v] − z[i, t_i])"), (LOSS_ROWS, NLL_AXIS),
             lambda sh, r, c: plain(r, "one per row with a target"), inputs=(LOGITS,),
             relation=lambda ops, v, c: ops.nll(v(LOGITS), c.ce.targets, c.ce.rows),
             when=lambda c: c.ce is not None, by_relation=True, tex="\\ell", labelled=True,
             mistakes=_nll_mistakes()),
        Kind(LOSS, LOSS, 18.99, "loss", "The loss",
             lambda c: ("The loss is the mean of the rows' cross-entropies (divided by the number of rows, not summed), "
                        "so it does not grow with the length of the text." if len(c.ce.rows) > 1 else
                        "With one row, the loss is its cross-entropy."),
             _loss_formula,
             (LOSS_AXIS, LOSS_AXIS), lambda sh, r, c: plain(r, "one number"), inputs=(NLL,),
             relation=lambda ops, v, c: ops.scale(ops.col_sums(v(NLL)), ops.rational(1, len(c.ce.rows))),
             when=lambda c: c.ce is not None, by_relation=True, tex="L",
             mistakes=(Mistake("the sum over the rows instead of their mean",
                               lambda ops, ex, c: ops.col_sums(ex(NLL)) if len(c.ce.rows) > 1 else None),)),
    )


def c_unembedded_tex(c: Context) -> str:
    """What the unembedding multiplies, in LaTeX."""
    if c.logits.norm is not None:
        return "Y_{final}"
    return "Y_{last}" if c.logits.last else c_top(c)
