"""The registry's rows of the backward pass through the model's head and the MLP, from the
cross-entropy of the logits (``backward: {loss: cross-entropy}``), down to dH, the gradient of
the residual stream the attention wrote:

    dlogits = (P − onehot(t)) / rows              dlogits   (0 in a row without a target)
    dW_U = Y_finalᵀ·dlogits                       dW_U      (the unembedding's gradient)
    dY_final = dlogits·W_Uᵀ                       dY_final  (dY_last, dY or dH without a final norm)
    back through the final norm                   dY_final_hat, dfinal_gamma, dfinal_beta, then dY_last or dY
    dY = dY_last in the last row, 0 elsewhere     dY        (rows: last)

then, behind the MLP's post norm (BERT), dY_hat, dmlp_gamma, dmlp_beta and dY_sum, and

    dF = dY (dY_sum)                              dF        (Y = H + F passes it on unchanged)
    db_2 = 1ᵀ·dF,  dW_2 = Gᵀ·dF                   db_2, dW_2 (gated: dW_down)
    dG = dF·W_2ᵀ                                  dG
    dU = dG ∘ act′(U)                             dU        (gated: dU_gate = dG ∘ U_up ∘ act′(U_gate),
                                                             dU_up = dG ∘ act(U_gate))
    db_1 = 1ᵀ·dU,  dW_1 = H_normᵀ·dU              db_1, dW_1 (gated: dW_gate, dW_up)
    dH_norm = dU·W_1ᵀ                             dH_norm   (gated: dU_gate·W_gateᵀ + dU_up·W_upᵀ)
    back through the MLP's norm                   dH_hat, dmlp_gamma, dmlp_beta
    dH = the MLP's path + dY                      dH        (the residual's path: Y = H + F)

The attention's backward pass goes on from dH as with any other upstream gradient.
"""

from __future__ import annotations

import dataclasses

from .ids import (
    DB_1, DB_2, DF, DFINAL_BETA, DFINAL_GAMMA, DG, DH, DH_HAT, DH_NORM, DLOGITS, DMLP_BETA,
    DMLP_BETA_POST, DMLP_GAMMA, DMLP_GAMMA_POST, DU, DU_GATE, DU_UP, DW_1, DW_2, DW_DOWN, DW_GATE, DW_U, DW_UP, DY,
    DY_FINAL, DY_FINAL_HAT, DY_HAT, DY_LAST, DY_SUM, FINAL_GAMMA, FINAL_MS, FINAL_VAR, G, H_HAT, LAST,
    MLP_GAMMA, MLP_GAMMA_POST, MLP_MS, MLP_MS_POST, MLP_VAR, MLP_VAR_POST, P, QUERIES, U, U_GATE, U_UP, VOCAB, W_1,
    W_2, W_DOWN, W_GATE, W_U, W_UP, Y_FINAL_HAT, Y_HAT,
)
from .kinds import Context, Kind, Mistake
from .mistakes import transposed
from .mlp import ACT_TEX, ACT_TEXT, OTHER_GELU, c_unembedded_tex, in_name
from .norm_backward import NormBack, back_mistakes, norm_gradient_rows, back_why, mean_back, row_i
from .shapes import flip, plain, prod

CE = "cross-entropy"  # the kind of backward pass these rows take (symattn.problem.model.CROSS_ENTROPY)
BASE = 18.79  # their place in the formula: before dH (18.8), where the attention's backward pass starts


def ce(c: Context) -> bool:
    """The backward pass starts from the cross-entropy of the logits."""
    return c.loss is not None and c.loss.kind == CE


def _mlp(c: Context) -> bool:
    return ce(c) and c.mlp is not None


def _final(c: Context) -> bool:
    return ce(c) and c.logits.norm is not None


def _mlp_pre_norm(c: Context) -> bool:
    return _mlp(c) and c.mlp.norm is not None and not c.mlp.post


def _act(c: Context) -> str:
    return ACT_TEXT[c.mlp.activation]


def _act_tex(c: Context) -> str:
    return ACT_TEX[c.mlp.activation]


# the key of the gradient the unembedding's product gives (the head's input), and of the final norm's input
def head_grad(c: Context) -> str:
    """The stage the product dlogits·W_Uᵀ is: dY_final, else dY_last (rows: last), dY, or dH without an MLP."""
    if c.logits.norm is not None:
        return DY_FINAL
    return below_final(c)


def below_final(c: Context) -> str:
    """The gradient of the final norm's input (or of what the unembedding reads without one)."""
    if c.logits.last:
        return DY_LAST
    return top_grad(c)


def top_grad(c: Context) -> str:
    """The gradient of the block's output: dY, or dH without an MLP."""
    return DY if c.mlp is not None else DH


FINAL_BACK = NormBack(DY_FINAL, Y_FINAL_HAT, DY_FINAL_HAT, (DFINAL_GAMMA, DFINAL_GAMMA), (DFINAL_BETA, DFINAL_BETA),
                      FINAL_GAMMA, (FINAL_VAR, FINAL_MS), ("dY_{final}", "\\hat{Y}_{final}", "dY_{final,i}"),
                      ("dY_final", "Ŷ_final"), lambda c: c.logits.norm, _final, BASE + 0.0003, "b_final_norm", 0.00003,
                      lambda c: LAST if c.logits.last else QUERIES)
MLP_POST_BACK = NormBack(DY, Y_HAT, DY_HAT, (DMLP_GAMMA_POST, DMLP_GAMMA), (DMLP_BETA_POST, DMLP_BETA),
                         MLP_GAMMA_POST, (MLP_VAR_POST, MLP_MS_POST), ("dY", "\\hat{Y}", "dY_i"), ("dY", "Ŷ"),
                         lambda c: c.mlp.norm, lambda c: _mlp(c) and c.mlp.post, BASE + 0.0007, "b_mlp_residual", 0.00003)
MLP_BACK = NormBack(DH_NORM, H_HAT, DH_HAT, (DMLP_GAMMA, DMLP_GAMMA), (DMLP_BETA, DMLP_BETA), MLP_GAMMA,
                    (MLP_VAR, MLP_MS), ("dH_{norm}", "\\hat{H}", "dH_{norm,i}"), ("dH_norm", "Ĥ"),
                    lambda c: c.mlp.norm, _mlp_pre_norm, BASE + 0.0060, "b_mlp_norm", 0.00003)

WHY = {
    DLOGITS: "The cross-entropy's gradient with respect to the logits is the softmax's own: for a row with target "
             "⟦t_i⟧, ⟦\\partial(-\\log P_{{i,t_i}})/\\partial z_{{iv}} = P_{{iv}} - [v = t_i]⟧, the probability less 1 "
             "at the target and the probability itself elsewhere. {mean}{untargeted} Each row of ⟦dz⟧ sums to 0.",
    DW_U: "Each column ⟦v⟧ of ⟦W_U⟧ scored every row against word ⟦v⟧, so its gradient sums those rows, each "
          "times its entry of ⟦dz⟧: ⟦dW_U = {x}^{{\\top}} dz⟧.",
    "tied": " The unembedding is the embedding table, transposed (tied weights): in training this gradient is "
            "added, transposed, to the table's, on top of what the rows of ⟦X⟧ looked up get.",
    "head": "Each row of ⟦{x}⟧ reached the loss only through its logits: its gradient is ⟦dz⟧ times ⟦W_U^{{\\top}}⟧, "
            "the words' columns of ⟦W_U⟧ each weighted by its probability, less the target's column, so a step "
            "against it moves the row towards the target word and away from the words the model found likely.",
    DY_LAST: "Only the last position's row reached the logits, so the gradient of the block's output is that row "
             "of ⟦dY_{{last}}⟧ in row {n}, and 0 in every other row.",
    DF: "⟦Y = H + F⟧ is a sum, and a sum passes its gradient on to each of its terms unchanged: ⟦dF = {d}⟧ (the "
        "residual stream ⟦H⟧ gets the same gradient back, below).",
    DB_2: "⟦b_2⟧ was added to every row, so its gradient is the column sums of ⟦dF⟧.",
    DW_2: "Each column of ⟦{w}⟧ made one feature of ⟦F⟧ from every row of ⟦G⟧: its gradient is ⟦G^{{\\top}} dF⟧.",
    DG: "Each row of ⟦G⟧ reached ⟦F⟧ through ⟦{w}⟧: ⟦dG = dF\\,{w}^{{\\top}}⟧.",
    DU: "The activation works entry by entry, so its gradient is ⟦dG⟧ times the activation's slope at each "
        "entry of ⟦U⟧: {slope}",
    DU_GATE: "⟦G = {act}(U_{{gate}}) \\odot U_{{up}}⟧ entry by entry: the gate's gradient is ⟦dG⟧ times ⟦U_{{up}}⟧ times "
             "the activation's slope at ⟦U_{{gate}}⟧: {slope}",
    DU_UP: "The up projection was multiplied by the gate's activation, entry by entry, so its gradient is ⟦dG⟧ times "
           "⟦{act}(U_{{gate}})⟧.",
    DB_1: "⟦b_1⟧ was added to every row of ⟦U⟧, so its gradient is the column sums of ⟦dU⟧.",
    DW_1: "Each column of ⟦{w}⟧ made one hidden unit from every row of ⟦{x}⟧: its gradient is "
          "⟦{x}^{{\\top}} d{u}⟧.",
    DH_NORM: "Each row of ⟦H_{{norm}}⟧ reached the MLP through {paths}, so its gradient is {sum}.",
    DH: "⟦H⟧ reached the loss along two paths: through the MLP (its norm first), and straight along the residual "
        "stream, ⟦Y = H + F⟧. Its gradient is their sum, and the attention's backward pass starts from it.",
    "dH_head": "Without an MLP the residual stream ⟦H⟧ is what the head reads, and its gradient is the one that "
               "came back through the head; the attention's backward pass starts from it.",
}
SLOPE = {
    "relu": "ReLU's slope is 1 where ⟦u > 0⟧ and 0 elsewhere (0 at 0, as PyTorch takes it), so the units that were "
            "cut off pass no gradient back.",
    "relu2": "ReLU²'s slope is ⟦2\\max(0, u)⟧.",
    "gelu": "GELU's is ⟦\\Phi(u) + u\\,\\varphi(u) = \\tfrac12\\bigl(1 + \\operatorname{erf}(u/\\sqrt2)\\bigr) + "
            "u\\,e^{-u^2/2}/\\sqrt{2\\pi}⟧.",
    "gelu-tanh": "the tanh form's is ⟦\\tfrac12(1 + t) + \\tfrac12 u(1 - t^2)\\sqrt{2/\\pi}\\,(1 + 3\\cdot 0.044715\\,u^2)⟧ "
                 "with ⟦t = \\tanh\\bigl(\\sqrt{2/\\pi}(u + 0.044715\\,u^3)\\bigr)⟧.",
    "silu": "SiLU's is ⟦\\sigma(u)\\bigl(1 + u(1 - \\sigma(u))\\bigr)⟧.",
}


def _slope(ops, m, c: Context, name: str | None = None):
    return ops.activate(m, "d:" + (name or c.mlp.activation))


def _dlogits(ops, v, c: Context):
    """(P − onehot)/rows in the rows with a target, 0 in the others."""
    rows, cols = 1 if c.logits.last else c.p.n_q, c.logits.size
    used = [[1 if r in c.ce.rows else 0] * cols for r in range(rows)]
    hot = [[0] * cols for _ in range(rows)]
    for r, t in zip(c.ce.rows, c.ce.targets):
        hot[r][t] = 1
    return ops.scale(ops.sub(ops.hadamard(v(P), ops.table(used)), ops.table(hot)), ops.rational(1, len(c.ce.rows)))


def _dlogits_formula(c: Context) -> tuple[str, str]:
    n = len(c.ce.rows)
    if n == 1:
        return "dz = P - \\operatorname{onehot}(t)", "dz = P − onehot(t)"
    return (f"dz = \\frac{{1}}{{{n}}}\\bigl(P - \\operatorname{{onehot}}(t)\\bigr)", f"dz = (P − onehot(t)) / {n}")


def _dlogits_why(c: Context) -> str:
    n = len(c.ce.rows)
    mean = "With one row the loss is that row's cross-entropy." if n == 1 else \
        f"The loss is the mean over the {n} rows, so each row is divided by {n}."
    logit_rows = 1 if c.logits.last else c.p.n_q
    untargeted = "" if n == logit_rows else " A row with no target (the last, whose next token is not given) is no " \
                                            "part of the loss: its gradient is 0."
    return WHY[DLOGITS].format(mean=mean, untargeted=untargeted)


def _head_product(ops, v, c: Context):
    return ops.matmul(v(DLOGITS), ops.T(v(W_U)))


def _last_row(ops, v, c: Context):
    """dY from dY_last: its row in the last position, 0 elsewhere."""
    n = c.p.n_q
    return ops.matmul(ops.table([[1 if i == n - 1 else 0] for i in range(n)]), v(DY_LAST))


PRODUCT, THROUGH_NORM, LAST_ROW = "product", "norm", "last"  # how each of the head's gradients is made


def _head_step(key: str, c: Context) -> str:
    """How the head's gradient ``key`` (dY_final, dY_last, dY or dH) is made here: the product
    dz·W_Uᵀ, back through the final norm, or the last row's gradient put in the last row."""
    if key == head_grad(c):
        return PRODUCT
    if key == below_final(c) and c.logits.norm is not None:
        return THROUGH_NORM
    return LAST_ROW


def _head_inputs(c: Context, key: str) -> tuple[str, ...]:
    """The keys the head's gradient ``key`` is computed from."""
    return {PRODUCT: (DLOGITS, W_U), THROUGH_NORM: (DY_FINAL_HAT, Y_FINAL_HAT, FINAL_VAR, FINAL_MS),
            LAST_ROW: (DY_LAST,)}[_head_step(key, c)]


def head_relation(key: str):
    """The relation of the head's gradient ``key``: the product, back through the final norm, or the last row."""
    made = {PRODUCT: _head_product, THROUGH_NORM: FINAL_BACK.back, LAST_ROW: _last_row}
    return lambda ops, v, c: made[_head_step(key, c)](ops, v, c)


def head_formula(key: str, name: str, text: str):
    def formula(c):
        step = _head_step(key, c)
        if step == PRODUCT:
            return f"{name} = dz\\,W_U^{{\\top}}", f"{text} = dz·W_Uᵀ"
        if step == THROUGH_NORM:
            return mean_back(c.logits.norm, name[1:], "\\hat{Y}_{final}", "Ŷ_final", None)
        return f"{name} = \\begin{{bmatrix}} 0 \\\\ dY_{{last}} \\end{{bmatrix}}", f"{text} = dY_last in row {c.p.n_q}, 0 above"

    return formula


def head_why(key: str, name: str):
    def why(c):
        step = _head_step(key, c)
        if step == PRODUCT:
            return WHY["head"].format(x=c_unembedded_tex(c))
        if step == THROUGH_NORM:
            return back_why(c.logits.norm, name[1:], "\\hat{Y}_{final}", None)
        return WHY[DY_LAST].format(n=c.p.n_q)

    return why


def head_section(key: str):
    def section(c):
        if c.logits is None:  # (a problem without the head has none of these rows)
            return "b_logits"
        step = _head_step(key, c)
        if step == PRODUCT:
            return "b_logits"
        if step == THROUGH_NORM:
            return "b_final_norm"
        return "b_mlp_residual" if c.mlp is not None else "b_final_norm" if c.logits.norm is not None else "b_logits"

    return section


def head_rows() -> tuple[Kind, ...]:
    """dlogits, dW_U, then back to the block's output: dY_final, the final norm, dY_last and dY."""

    def dW_U_why(c):
        return WHY[DW_U].format(x=c_unembedded_tex(c)) + (WHY["tied"] if c.logits.tied else "")

    def dW_U_formula(c):
        x = c_unembedded_tex(c)
        return f"dW_U = {x}^{{\\top}} dz", f"dW_U = {c.plain(x)}ᵀ·dz"

    def dlogits_mistakes():
        def not_divided(ops, ex, c):
            return None if len(c.ce.rows) == 1 else ops.scale(ex(DLOGITS), ops.rational(len(c.ce.rows), 1))

        def sign(ops, ex, c):
            return ops.scale(ex(DLOGITS), ops.rational(-1, 1))

        return (Mistake("not divided by the number of rows: the loss is their mean, so each row's gradient is "
                        "divided by it", not_divided),
                Mistake("the sign flipped: onehot − P instead of P − onehot", sign))

    rows = (
        Kind(DLOGITS, DLOGITS, BASE + 0.0001, "b_loss", "Back through the loss and the softmax", _dlogits_why,
             _dlogits_formula,
             lambda c: (LAST if c.logits.last else QUERIES, VOCAB), lambda sh, r, c: plain(r, "like the logits"),
             inputs=(P,), relation=_dlogits, when=ce, gradient=True, tex="dz", mistakes=dlogits_mistakes()),
        Kind(DW_U, DW_U, BASE + 0.0002, "b_logits", "Gradient of the unembedding", dW_U_why, dW_U_formula, ("d", VOCAB),
             lambda sh, r, c: prod(flip(sh("unembedded")), sh(DLOGITS), "like W_U"), inputs=("unembedded", DLOGITS),
             relation=lambda ops, v, c: ops.matmul(ops.T(v(c.unembedded)), v(DLOGITS)), when=ce, gradient=True,
             labelled=False, tex="dW_U", mistakes=(transposed(DW_U, square_only=True),)),
    )
    grads = []
    for key, name, text, order, axes, when in (
            (DY_FINAL, "dY_{final}", "dY_final", 0.0003, LAST, _final),
            (DY_LAST, "dY_{last}", "dY_last", 0.0005, LAST, lambda c: ce(c) and c.logits.last),
            (DY, "dY", "dY", 0.0007, QUERIES, _mlp)):
        grads.append(Kind(
            key, key, BASE + order, head_section(key), "The gradient of " + {DY_FINAL: "the final norm's output",
                                                                            DY_LAST: "the last position's row",
                                                                            DY: "the block's output"}[key],
            head_why(key, name), head_formula(key, name, text),
            (lambda c, a=axes: (a if c.logits.last else QUERIES, "d")) if key == DY_FINAL else (axes, "d"),
            lambda sh, r, c: plain(r, "like the rows the head read"), inputs=lambda c, k=key: _head_inputs(c, k),
            relation=head_relation(key), when=when, gradient=True, tex=name))
        if key == DY_FINAL:
            grads.extend(norm_gradient_rows(FINAL_BACK))
    return rows + tuple(grads)


def _gated(c: Context) -> bool:
    return _mlp(c) and c.mlp.gated


def _plain_mlp(c: Context) -> bool:
    return _mlp(c) and not c.mlp.gated


def _w2(c: Context) -> str:
    return W_DOWN if c.mlp.gated else W_2


def _w2_tex(c: Context) -> str:
    return "W_{down}" if c.mlp.gated else "W_2"


def _df_from(c: Context) -> str:
    return DY_SUM if c.mlp.post else DY


def mlp_paths(ops, v, c: Context):
    """The MLP's path back to what it read: dU·W_1ᵀ, or gated dU_gate·W_gateᵀ + dU_up·W_upᵀ."""
    if c.mlp.gated:
        return ops.sum([ops.matmul(v(DU_GATE), ops.T(v(W_GATE))), ops.matmul(v(DU_UP), ops.T(v(W_UP)))])
    return ops.matmul(v(DU), ops.T(v(W_1)))


def _paths_tex(c: Context) -> tuple[str, str]:
    if c.mlp.gated:
        return "dU_{gate}\\,W_{gate}^{\\top} + dU_{up}\\,W_{up}^{\\top}", "dU_gate·W_gateᵀ + dU_up·W_upᵀ"
    return "dU\\,W_1^{\\top}", "dU·W_1ᵀ"


def _paths_inputs(c: Context) -> tuple[str, ...]:
    return (DU_GATE, W_GATE, DU_UP, W_UP) if c.mlp.gated else (DU, W_1)


def mlp_dH(ops, v, c: Context):
    """dH with an MLP: back through it (and its norm in front) plus the residual's dY (dY_sum behind a post norm)."""
    through = MLP_BACK.back(ops, v, c) if c.mlp_in != c.stream else mlp_paths(ops, v, c)
    return ops.sum([through, v(_df_from(c))])


def dH_inputs(c: Context) -> tuple[str, ...]:
    """The keys dH is computed from, going back from the cross-entropy."""
    if c.mlp is None:
        return _head_inputs(c, DH)
    if c.mlp_in != c.stream:
        return DH_HAT, H_HAT, MLP_VAR, MLP_MS, DY
    return _paths_inputs(c) + (_df_from(c),)


def dH_relation(ops, v, c: Context):
    return head_relation(DH)(ops, v, c) if c.mlp is None else mlp_dH(ops, v, c)


def dH_formula(c: Context) -> tuple[str, str]:
    if c.mlp is None:
        return head_formula(DH, "dH", "dH")(c)
    skip = "Y_{sum}" if c.mlp.post else "Y"
    skip_t = "Y_sum" if c.mlp.post else "Y"
    if c.mlp_in != c.stream:
        tex, text = mean_back(c.mlp.norm, "H", "\\hat{H}", "Ĥ", None)
        return tex + " + " + row_i("d" + skip), text + f" + d{skip_t}_i"
    tex, text = _paths_tex(c)
    return f"dH = {tex} + d{skip}", f"dH = {text} + d{skip_t}"


def dH_why(c: Context) -> str:
    if c.mlp is None:
        return head_why(DH, "dH")(c) + " " + WHY["dH_head"]
    if c.mlp_in != c.stream:
        return back_why(c.mlp.norm, "H", "\\hat{H}", None) + " " + WHY[DH]
    return WHY[DH].replace(" (its norm first)", "")


def dH_section(c: Context) -> str:
    if c.mlp is None:
        return head_section(DH)(c)
    return "b_mlp_norm" if c.mlp_in != c.stream else "b_mlp"


def dH_mistakes() -> tuple[Mistake, ...]:
    def no_skip(ops, ex, c):
        if c.mlp is None:
            return None
        return MLP_BACK.back(ops, ex, c) if c.mlp_in != c.stream else mlp_paths(ops, ex, c)

    def only_ce(mistake: Mistake) -> Mistake:
        return dataclasses.replace(mistake, relation=lambda ops, ex, c: mistake.relation(ops, ex, c) if ce(c) else None)

    return tuple(only_ce(m) for m in (
        Mistake("the residual's path was left out: dH through the MLP alone, without dY", no_skip),
        *back_mistakes(MLP_BACK, lambda c: _df_from(c) if c.mlp is not None else None)))


def mlp_rows() -> tuple[Kind, ...]:
    """Behind a post norm dY_hat, dγ, dβ and dY_sum; then dF, db_2, dW_2, dG, dU (gated dU_gate and
    dU_up), db_1, dW_1 (gated dW_gate and dW_up), dH_norm and the MLP's norm's dH_hat, dγ and dβ."""
    b = BASE + 0.001

    def dU_relation(ops, v, c):
        return ops.hadamard(v(DG), _slope(ops, v(U), c))

    def gate_relation(ops, v, c):
        return ops.hadamard(ops.hadamard(v(DG), v(U_UP)), _slope(ops, v(U_GATE), c))

    def slope_mistakes(gated: bool):
        def swapped(ops, ex, c):
            other = OTHER_GELU.get(c.mlp.activation)
            if other is None:
                return None
            if gated:
                return ops.hadamard(ops.hadamard(ex(DG), ex(U_UP)), _slope(ops, ex(U_GATE), c, other))
            return ops.hadamard(ex(DG), _slope(ops, ex(U), c, other))

        def at_output(ops, ex, c):  # the slope taken of G instead of U
            return None if gated else ops.hadamard(ex(DG), _slope(ops, ex(G), c))

        return (Mistake("GELU's erf and tanh forms swapped in the slope", swapped),
                Mistake("the activation's slope taken at its output G instead of its input U", at_output))

    def weight_row(key, name, w, w_tex, d, u_tex, order, when):
        """dW = (the MLP's input)ᵀ·d, ``u_tex`` the pre-activation d is the gradient of (U, U_{gate})."""
        return Kind(key, key, b + order, "b_mlp", "Gradient of the " + name,
                    lambda c: WHY[DW_1].format(w=w_tex, x=in_name(c), u=u_tex),
                    lambda c: (f"d{w_tex} = {in_name(c)}^{{\\top}} d{u_tex}", f"d{w} = {c.plain(in_name(c))}ᵀ·{d}"),
                    ("d", "f"), lambda sh, r, c: prod(flip(sh("mlp_in")), sh(d), "like " + w), inputs=("mlp_in", d),
                    relation=lambda ops, v, c: ops.matmul(ops.T(v(c.mlp_in)), v(d)), when=when, gradient=True,
                    labelled=False, tex=f"d{w_tex}", mistakes=(transposed(key, square_only=True),))

    return _back_to_g(b) + (
        Kind(DU, DU, b + 0.0004, "b_mlp", "Back through the activation",
             lambda c: WHY[DU].format(slope=SLOPE[c.mlp.activation]),
             lambda c: (f"dU = dG \\odot {_act_tex(c)}'(U)", f"dU = dG ∘ {_act(c)}′(U)"), (QUERIES, "f"),
             lambda sh, r, c: plain(r, "like U"), inputs=(DG, U), relation=dU_relation, when=_plain_mlp,
             gradient=True, tex="dU", mistakes=slope_mistakes(False)),
        Kind(DU_GATE, DU_GATE, b + 0.0004, "b_mlp", "Back through the gate",
             lambda c: WHY[DU_GATE].format(act=_act_tex(c), slope=SLOPE[c.mlp.activation]),
             lambda c: (f"dU_{{gate}} = dG \\odot U_{{up}} \\odot {_act_tex(c)}'(U_{{gate}})",
                        f"dU_gate = dG ∘ U_up ∘ {_act(c)}′(U_gate)"), (QUERIES, "f"),
             lambda sh, r, c: plain(r, "like U_gate"), inputs=(DG, U_UP, U_GATE), relation=gate_relation,
             when=_gated, gradient=True, tex="dU_{gate}", mistakes=slope_mistakes(True)),
        Kind(DU_UP, DU_UP, b + 0.0005, "b_mlp", "Back to the up projection",
             lambda c: WHY[DU_UP].format(act=_act_tex(c)),
             lambda c: (f"dU_{{up}} = dG \\odot {_act_tex(c)}(U_{{gate}})", f"dU_up = dG ∘ {_act(c)}(U_gate)"),
             (QUERIES, "f"), lambda sh, r, c: plain(r, "like U_up"), inputs=(DG, U_GATE),
             relation=lambda ops, v, c: ops.hadamard(v(DG), ops.activate(v(U_GATE), c.mlp.activation)), when=_gated,
             gradient=True, tex="dU_{up}"),
        Kind(DB_1, DB_1, b + 0.0006, "b_mlp", "Gradient of the MLP's first bias", WHY[DB_1],
             ("db_1 = \\mathbf{1}^{\\top} dU", "db_1 = 1ᵀ·dU (the column sums of dU)"), ("b", "f"),
             lambda sh, r, c: plain(r, "like b_1"), inputs=(DU,), relation=lambda ops, v, c: ops.col_sums(v(DU)),
             when=lambda c: _plain_mlp(c) and c.mlp.b_1 is not None, gradient=True, labelled=False, tex="db_1"),
        weight_row(DW_1, "MLP's first weights", "W_1", "W_1", DU, "U", 0.0007, _plain_mlp),
        weight_row(DW_GATE, "gate's weights", "W_gate", "W_{gate}", DU_GATE, "U_{gate}", 0.0007, _gated),
        weight_row(DW_UP, "up weights", "W_up", "W_{up}", DU_UP, "U_{up}", 0.0008, _gated),
        Kind(DH_NORM, DH_NORM, b + 0.0009, "b_mlp", "Gradient of the MLP's input",
             lambda c: WHY[DH_NORM].format(paths="both projections, the gate's and the up one" if c.mlp.gated
                                           else "⟦W_1⟧", sum="their sum" if c.mlp.gated else "⟦dU\\,W_1^{\\top}⟧"),
             lambda c: (f"dH_{{norm}} = {_paths_tex(c)[0]}", f"dH_norm = {_paths_tex(c)[1]}"), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like H_norm"), inputs=_paths_inputs, relation=mlp_paths, when=_mlp_pre_norm,
             gradient=True, tex="dH_{norm}", mistakes=(transposed(DH_NORM, square_only=True),)),
        *norm_gradient_rows(MLP_BACK),
    )


def from_cross_entropy(dH: Kind) -> Kind:
    """The row of dH (``dH``, the upstream gradient of the residual stream) that, back from the
    cross-entropy, comes through the MLP (or the head) and its residual instead of from a given loss."""
    def either(mine, theirs):
        return lambda c, *rest: mine(c, *rest) if ce(c) else (theirs(c, *rest) if callable(theirs) else theirs)

    def relation(ops, v, c):
        return dH_relation(ops, v, c) if ce(c) else dH.relation(ops, v, c)

    return dataclasses.replace(
        dH, section=either(dH_section, dH.section), title=either(lambda c: "Back to the residual stream", dH.title),
        why=either(dH_why, dH.why), formula=either(dH_formula, dH.formula),
        inputs=lambda c: dH_inputs(c) if ce(c) else dH.inputs, relation=relation,
        short=lambda ops, value, c: not ce(c) and dH.short(ops, value, c), mistakes=dH.mistakes + dH_mistakes())


def _back_to_g(b: float) -> tuple[Kind, ...]:
    """Behind a post norm dY_hat, dγ, dβ and dY_sum; then dF, db_2, dW_2 (dW_down) and dG."""

    def post_back(ops, v, c):
        return MLP_POST_BACK.back(ops, v, c)

    return (
        *norm_gradient_rows(MLP_POST_BACK),
        Kind(DY_SUM, DY_SUM, BASE + 0.0008, "b_mlp_residual", "Back through the norm",
             lambda c: back_why(c.mlp.norm, "Y_{sum}", "\\hat{Y}", None),
             lambda c: mean_back(c.mlp.norm, "Y_{sum}", "\\hat{Y}", "Ŷ", None), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like Y_sum"), inputs=(DY_HAT, Y_HAT, MLP_VAR_POST, MLP_MS_POST),
             relation=post_back, when=lambda c: _mlp(c) and c.mlp.post, gradient=True, tex="dY_{sum}",
             mistakes=back_mistakes(MLP_POST_BACK, None)),
        Kind(DF, DF, BASE + 0.0009, "b_mlp_residual", "Back through the residual",
             lambda c: WHY[DF].format(d="dY_{sum}" if c.mlp.post else "dY").replace(
                 "⟦Y = H + F⟧", "⟦Y_{sum} = H + F⟧" if c.mlp.post else "⟦Y = H + F⟧"),
             lambda c: ("dF = dY_{sum}", "dF = dY_sum") if c.mlp.post else ("dF = dY", "dF = dY"), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like F"), inputs=lambda c: (_df_from(c),),
             relation=lambda ops, v, c: v(_df_from(c)), when=_mlp, gradient=True, tex="dF"),
        Kind(DB_2, DB_2, b + 0.0001, "b_mlp", "Gradient of the MLP's second bias", WHY[DB_2],
             ("db_2 = \\mathbf{1}^{\\top} dF", "db_2 = 1ᵀ·dF (the column sums of dF)"), ("b", "d"),
             lambda sh, r, c: plain(r, "like b_2"), inputs=(DF,), relation=lambda ops, v, c: ops.col_sums(v(DF)),
             when=lambda c: _mlp(c) and c.mlp.b_2 is not None, gradient=True, labelled=False, tex="db_2"),
        Kind(DW_2, DW_2, b + 0.0002, "b_mlp", "Gradient of the MLP's second weights",
             lambda c: WHY[DW_2].format(w="W_2"), ("dW_2 = G^{\\top} dF", "dW_2 = Gᵀ·dF"), ("f", "d"),
             lambda sh, r, c: prod(flip(sh(G)), sh(DF), "like W_2"), inputs=(G, DF),
             relation=lambda ops, v, c: ops.matmul(ops.T(v(G)), v(DF)), when=_plain_mlp, gradient=True,
             labelled=False, tex="dW_2", mistakes=(transposed(DW_2, square_only=True),)),
        Kind(DW_DOWN, DW_DOWN, b + 0.0002, "b_mlp", "Gradient of the down weights",
             lambda c: WHY[DW_2].format(w="W_{down}"), ("dW_{down} = G^{\\top} dF", "dW_down = Gᵀ·dF"), ("f", "d"),
             lambda sh, r, c: prod(flip(sh(G)), sh(DF), "like W_down"), inputs=(G, DF),
             relation=lambda ops, v, c: ops.matmul(ops.T(v(G)), v(DF)), when=_gated, gradient=True,
             labelled=False, tex="dW_{down}", mistakes=(transposed(DW_DOWN, square_only=True),)),
        Kind(DG, DG, b + 0.0003, "b_mlp", "Gradient of the activation",
             lambda c: WHY[DG].format(w=_w2_tex(c)),
             lambda c: (f"dG = dF\\,{_w2_tex(c)}^{{\\top}}", f"dG = dF·{c.plain(_w2_tex(c))}ᵀ"), (QUERIES, "f"),
             lambda sh, r, c: prod(sh(DF), flip(sh("mlp_w2")), "like G"), inputs=(DF, "mlp_w2"),
             relation=lambda ops, v, c: ops.matmul(v(DF), ops.T(v(_w2(c)))), when=_mlp, gradient=True, tex="dG",
             mistakes=(transposed(DG, square_only=True),)),
    )


def rows() -> tuple[Kind, ...]:
    """Every row of the backward pass from the cross-entropy to just before dH, in order."""
    return head_rows() + mlp_rows()
