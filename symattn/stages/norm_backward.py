"""The registry's rows of the backward pass through the residual stream and the layer norm.

With the residual (``residual: true``, always with ``place: post``) the loss is on the block's
output H, and the backward pass starts there:

    dH = ∂L/∂H                                    dH          (the upstream gradient)
    dO = dH                                       dO          (H = X + O passes it on unchanged)

Behind the attention (post-norm, H = LN(R), R = X + O) the norm comes first:

    dR̂ = dH ∘ γ                                   dR_hat
    dγ = Σ_i dH_i ∘ R̂_i,  dβ = Σ_i dH_i           dnorm_gamma, dnorm_beta   (column sums)
    dR_i = (dR̂_i − mean(dR̂_i) − R̂_i·mean(dR̂_i ∘ R̂_i)) / √(σ_i² + ε)      dR
    dO = dR

In front of it (pre-norm) the paths through the projections reach X_norm, and the norm then
takes the gradient back to X:

    dX_norm = Σ_h (dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ)    dX_norm
    dX̂ = dX_norm ∘ γ                              dX_hat
    dγ = Σ_i dX_norm,i ∘ X̂_i,  dβ = Σ_i dX_norm,i  dnorm_gamma, dnorm_beta
    dX_i = (dX̂_i − mean(dX̂_i) − X̂_i·mean(dX̂_i ∘ X̂_i)) / √(σ_i² + ε) (+ dH_i with the residual)

RMSNorm has no mean to take away: its rows drop the ``mean(dX̂_i)`` term (and √(ms_i + ε)).
With (1 + γ) (Gemma's offset) the gain is 1 + γ and dγ is the same sum.
"""

from __future__ import annotations

from .ids import (
    DBETA, DBETA_POST, DGAMMA, DGAMMA_POST, DH, DR, DR_HAT, DX, DX_HAT, DX_NORM, GAMMA, GAMMA_POST, MS, MS_POST,
    QUERIES, R_HAT, VAR, VAR_POST, X_HAT,
)
from .kinds import Context, Kind, Mistake
from .relations import dO_relation, input_gradient
from .shapes import plain

WHY = {
    DH: "The block's output is the residual stream ⟦H⟧, so backpropagation starts there: ⟦\\partial L/\\partial H⟧ "
        "says how the loss changes with each entry of ⟦H⟧.",
    "dO_residual": "⟦H = {x} + O⟧ is a sum, and a sum passes its gradient on to each of its terms unchanged: "
                   "⟦dO = dH⟧ (the residual's other term, ⟦{x}⟧, gets the same ⟦dH⟧ back at the input).",
    "dO_post": "⟦R = {x} + O⟧ is a sum, so ⟦O⟧ gets ⟦dR⟧ unchanged (and so does ⟦{x}⟧, at the input).",
    "d_hat": "Each column ⟦k⟧ of the normalised rows ⟦{hat}⟧ was multiplied by ⟦{g}_k⟧, so their gradient is the "
             "output's gradient times ⟦{g}_k⟧ in column ⟦k⟧ (⟦\\beta⟧, only added, passes it on unchanged).",
    "d_hat_none": "This norm has no ⟦\\gamma⟧, so the normalised rows' gradient is the output's gradient itself.",
    "dgamma": "Each ⟦\\gamma_k⟧ multiplied column ⟦k⟧ of ⟦{hat}⟧ in every token's row, so its gradient sums "
              "⟦{d} \\circ {hat}⟧ down column ⟦k⟧: over the tokens.",
    "dbeta": "Each ⟦\\beta_k⟧ was added to column ⟦k⟧ of every token's row, so its gradient is the sum of column ⟦k⟧ "
             "of ⟦{d}⟧.",
    "back": "The Jacobian of the normalisation, row by row. Every entry of row ⟦i⟧ of ⟦{hat}⟧ depends on every entry "
            "of row ⟦i⟧ of ⟦{x}⟧, through {through}, so the gradient of ⟦{x}_{{ik}}⟧ is ⟦d{hat}_{{ik}}⟧ less {less}, "
            "all over the row's root ⟦\\sqrt{{{s} + \\varepsilon}}⟧ (each mean is over the row's ⟦d⟧ features). "
            "Each row of the result sums to 0, and with ⟦\\varepsilon = 0⟧ it is also orthogonal to its row of ⟦{hat}⟧.",
    "skip": " The residual adds a second path: ⟦{x}⟧ also went straight into ⟦{sum}⟧, so ⟦d{sum}⟧ is added.",
    DX_NORM: "⟦X_{norm}⟧ reached the loss along three paths (queries, keys and values), so its gradient is their sum.",
}


def _post(c: Context) -> bool:
    return c.norm is not None and c.norm.post


def _on(c: Context) -> bool:
    return c.loss is not None


def _mean_back(c: Context, x: str, hat: str, hat_t: str, skip: str | None) -> tuple[str, str]:
    """The formula of the norm's backward pass, LaTeX and text: ``dx`` from ``d`` + the normalised rows."""
    s, s_t = ("\\mathrm{ms}_i", "ms_i") if c.norm.rms else ("\\sigma_i^2", "σ_i²")
    d, d_t = "d" + hat, "d" + hat_t
    first, first_t = ("", "") if c.norm.rms else (f" - \\operatorname{{mean}}({d}_i)", f" − mean({d_t}_i)")
    tex = (f"d{x}_i = \\frac{{{d}_i{first} - {hat}_i\\,\\operatorname{{mean}}({d}_i \\circ {hat}_i)}}"
           f"{{\\sqrt{{{s} + \\varepsilon}}}}")
    text = f"d{x}_i = ({d_t}_i{first_t} − {hat_t}_i·mean({d_t}_i ∘ {hat_t}_i)) / √({s_t} + ε)"
    if skip:
        tex, text = tex + f" + d{skip}_i", text + f" + d{skip}_i"
    return tex, text


def _back_why(c: Context, x: str, hat: str, skip: str | None) -> str:
    if c.norm.rms:
        through, less = "the mean square", f"⟦{hat}_{{ik}}⟧ times the row's mean of ⟦d{hat} \\circ {hat}⟧"
    else:
        through, less = ("the mean and the variance",
                         f"the row's mean of ⟦d{hat}⟧ and ⟦{hat}_{{ik}}⟧ times its mean of ⟦d{hat} \\circ {hat}⟧")
    s = "\\mathrm{ms}_i" if c.norm.rms else "\\sigma_i^2"
    why = WHY["back"].format(hat=hat, x=x, through=through, less=less, s=s)
    if c.norm.rms:
        why = why.replace("Each row of the result sums to 0, and with ⟦\\varepsilon = 0⟧ it is also",
                          "With ⟦\\varepsilon = 0⟧ each row of the result is")
    return why + (WHY["skip"].format(x=x, sum=skip) if skip else "")


def _gain(c: Context, tex: bool) -> str:
    if c.norm.offset:
        return "(1 + \\gamma)" if tex else "(1 + γ)"
    return "\\gamma" if tex else "γ"


def _norm_back(ops, v, c: Context, d_hat: str, hat: str):
    n = c.norm
    spread = (MS_POST if n.rms else VAR_POST) if n.post else (MS if n.rms else VAR)
    return ops.normalise_backward(v(d_hat), v(hat), v(spread), n.eps, not n.rms)


def _times_gain(ops, d, c: Context):
    return d if c.norm.weight is None else ops.times_row(d, ops.given(c.norm.gain))


def _gradient_rows(post: bool) -> tuple[Kind, ...]:
    """dX̂ (dR̂), dγ and dβ: the norm's output gradient taken to its normalised rows and its weights."""
    d_out, hat, d_hat = (DH, R_HAT, DR_HAT) if post else (DX_NORM, X_HAT, DX_HAT)
    dgamma, dbeta = (DGAMMA_POST, DBETA_POST) if post else (DGAMMA, DBETA)
    out_tex, hat_tex = ("dH", "\\hat{R}") if post else ("dX_{norm}", "\\hat{X}")
    out_row = "dH_i" if post else "dX_{norm,i}"  # row i of the output's gradient
    out_t, hat_t = ("dH", "R̂") if post else ("dX_norm", "X̂")
    when = _post if post else (lambda c: c.pre_norm)
    base, section = (18.9, "b_residual") if post else (30.8, "b_norm")

    def hat_formula(c):
        if c.norm.weight is None:
            return f"d{hat_tex} = {out_tex}", f"d{hat_t} = {out_t} (no γ)"
        return f"d{hat_tex} = {out_tex} \\odot {_gain(c, True)}", f"d{hat_t} = {out_t} ∘ {_gain(c, False)}"

    def hat_why(c):
        if c.norm.weight is None:
            return WHY["d_hat_none"]
        return WHY["d_hat"].format(hat=hat_tex, g="(1 + \\gamma)" if c.norm.offset else "\\gamma").replace(
            "(1 + \\gamma)_k", "(1 + \\gamma_k)")

    forgot_gain = Mistake("γ was not applied on the way back: the normalised rows' gradient taken as the output's",
                          lambda ops, ex, c: ex(d_out) if c.norm.weight is not None else None)
    return (
        Kind(d_hat, d_hat, base + 0.01, section, "Back to the normalised rows", hat_why, hat_formula, (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like " + hat), inputs=(d_out, GAMMA_POST if post else GAMMA),
             relation=lambda ops, v, c: _times_gain(ops, v(d_out), c), when=lambda c: when(c) and _on(c),
             gradient=True, tex=f"d{hat_tex}", mistakes=(forgot_gain,)),
        Kind(dgamma, DGAMMA, base + 0.02, section, "Gradient of the norm's weight",
             WHY["dgamma"].format(d=out_tex, hat=hat_tex), (f"d\\gamma = \\sum_i {out_row} \\circ {hat_tex}_i",
                                                            f"dγ = Σ_i {out_t}_i ∘ {hat_t}_i"), ("b", "d"),
             lambda sh, r, c: plain(r, "like the norm's weight"), inputs=(d_out, hat),
             relation=lambda ops, v, c: ops.col_sums(ops.hadamard(v(d_out), v(hat))),
             when=lambda c: when(c) and _on(c) and c.norm.weight is not None, gradient=True, labelled=False,
             tex="d\\gamma",
             mistakes=(Mistake("the normalised rows were left out: the column sums of the output's gradient (β's)",
                               lambda ops, ex, c: ops.col_sums(ex(d_out))),)),
        Kind(dbeta, DBETA, base + 0.03, section, "Gradient of the norm's bias", WHY["dbeta"].format(d=out_tex),
             (f"d\\beta = \\sum_i {out_row}", f"dβ = Σ_i {out_t}_i"), ("b", "d"),
             lambda sh, r, c: plain(r, "like the norm's bias"), inputs=(d_out,),
             relation=lambda ops, v, c: ops.col_sums(v(d_out)),
             when=lambda c: when(c) and _on(c) and c.norm.bias is not None, gradient=True, labelled=False,
             tex="d\\beta"),
    )


def post_norm_backward_rows() -> tuple[Kind, ...]:
    """dH, then behind the attention dR̂, dγ, dβ and dR (dO = dR follows)."""

    def dH_formula(c):
        kind = c.loss.kind
        tail = {"sum": (" = \\mathbf{1}", " = 1 (every entry)"), "weights": (" = W", " = W"),
                "dO": ("", " (given)"), "target": (" = H - T", " = H − T")}[kind]
        return "dH = \\frac{\\partial L}{\\partial H}" + tail[0], "dH = ∂L/∂H" + tail[1]

    def dR_relation(ops, v, c):
        return _norm_back(ops, v, c, DR_HAT, R_HAT)

    return (
        Kind(DH, DH, 18.8, "b_upstream", "The upstream gradient",
             lambda c: WHY[DH] + " Here " + c.loss.describe("H") + ".", dH_formula, (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like H"), inputs=("stream",),
             relation=lambda ops, v, c: dO_relation(ops, v, c, "stream"), when=lambda c: c.residual and _on(c),
             gradient=True, short=lambda ops, value, c: c.loss.kind != "target"),
        *_gradient_rows(post=True),
        Kind(DR, DR, 18.95, "b_residual", "Back through the norm",
             lambda c: _back_why(c, "R", "\\hat{R}", None), lambda c: _mean_back(c, "R", "\\hat{R}", "R̂", None),
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like R"), inputs=(DR_HAT, R_HAT, VAR_POST, MS_POST),
             relation=dR_relation, when=lambda c: _post(c) and _on(c), gradient=True,
             mistakes=_back_mistakes(DR_HAT, R_HAT, DH, None)),
    )


def _back_mistakes(d_hat: str, hat: str, d_out: str, skip) -> tuple[Mistake, ...]:
    """The slips of the norm's backward pass, each recomputed from the exact gradients; ``skip``
    (a function of the context) is the residual's gradient key added, or None."""

    def applies(c):  # the norm is there (without a norm in front, dX has none of these slips)
        return c.norm is not None and (c.norm.post if hat == R_HAT else c.pre_norm)

    def plus_skip(ops, ex, c, value):
        key = skip(c) if skip else None
        return ops.sum([value, ex(key)]) if key else value

    def constant_root(ops, ex, c):  # μ and σ taken as constants: the gradient only divided by the root
        if not applies(c):
            return None
        n = c.norm
        spread = ex((MS_POST if n.rms else VAR_POST) if n.post else (MS if n.rms else VAR))
        zero = ops.sub(ex(hat), ex(hat))
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(d_hat), zero, spread, n.eps, False))

    def mean_dropped(ops, ex, c):
        if not applies(c) or c.norm.rms:
            return None
        n = c.norm
        spread = ex(VAR_POST if n.post else VAR)
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(d_hat), ex(hat), spread, n.eps, False))

    def gain_skipped(ops, ex, c):
        if not applies(c) or c.norm.weight is None:
            return None
        n = c.norm
        spread = ex((MS_POST if n.rms else VAR_POST) if n.post else (MS if n.rms else VAR))
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(d_out), ex(hat), spread, n.eps, not n.rms))

    return (
        Mistake("the norm's Jacobian was left out: the gradient only divided by the row's root, as if μ_i and σ_i "
                "did not depend on the row", constant_root),
        Mistake("the mean's path was left out: LayerNorm's gradient without the −mean(dX̂_i) term (RMSNorm's)",
                mean_dropped),
        Mistake("γ was not applied on the way back: the norm's output gradient used as the normalised rows'",
                gain_skipped),
    )


def _skip_key(c: Context) -> str | None:
    if not c.residual:
        return None
    return DR if _post(c) else DH


def input_gradient_rows(dX_why, dX_formula) -> tuple[Kind, ...]:
    """dX_norm (the paths into the norm's output) and dX: back through the norm in front, plus the
    residual's gradient; without a norm dX is the paths' sum (plus the residual's)."""

    def dX_relation(ops, v, c):
        through = _norm_back(ops, v, c, DX_HAT, X_HAT) if c.pre_norm else input_gradient(DX)(ops, v, c)
        skip = _skip_key(c)
        return ops.sum([through, v(skip)]) if skip else through

    def formula(c):
        skip = "R" if _post(c) else "H" if c.residual else None
        if c.pre_norm:
            return _mean_back(c, "X", "\\hat{X}", "X̂", skip)
        tex, text = dX_formula(c)
        return (tex + f" + d{skip}", text + f" + d{skip}") if skip else (tex, text)

    def why(c):
        if c.pre_norm:
            return _back_why(c, "X", "\\hat{X}", "H" if c.residual else None)
        base = dX_why(c)
        return base + (WHY["skip"].format(x="X", sum="R" if _post(c) else "H") if c.residual else "")

    def no_skip(ops, ex, c):
        skip = _skip_key(c)
        if not skip:
            return None
        return _norm_back(ops, ex, c, DX_HAT, X_HAT) if c.pre_norm else input_gradient(DX)(ops, ex, c)

    from .mistakes import transposed

    return (
        Kind(DX_NORM, DX_NORM, 30.79, "b_norm", "Gradient of the attention's input",
             lambda c: WHY[DX_NORM] + (" With several heads, every head's paths add up." if c.multi else ""),
             lambda c: tuple(s.replace("dX =", "dX_{norm} =" if k == 0 else "dX_norm =", 1)
                             for k, s in enumerate(dX_formula(c))),
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like X_norm"), inputs=("paths",), relation=input_gradient(DX),
             when=lambda c: c.projected and c.pre_norm and _on(c), gradient=True, tex="dX_{norm}",
             mistakes=(transposed(DX_NORM, square_only=True),)),
        *_gradient_rows(post=False),
        Kind(DX, DX, 31, lambda c: "b_norm" if c.pre_norm else "b_input", "Gradient of the input", why, formula,
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like X"), inputs=("through", "skip"), relation=dX_relation,
             when=lambda c: c.projected and _on(c), gradient=True,
             mistakes=(Mistake("the residual's path was left out: the gradient through the attention alone", no_skip),
                       *(_back_mistakes(DX_HAT, X_HAT, DX_NORM, _skip_key)),
                       transposed(DX, square_only=True))),
    )


def dO_from_residual(c: Context) -> str | None:
    """The key dO is read from with the residual (dH; dR behind a post norm), or None."""
    return _skip_key(c)

