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

import re
from dataclasses import dataclass
from typing import Any, Callable

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


def mean_back(n, x: str, hat: str, hat_t: str, skip: str | None) -> tuple[str, str]:
    """The formula of the norm ``n``'s backward pass, LaTeX and text: ``dx`` from ``d`` + the normalised rows."""
    s, s_t = ("\\mathrm{ms}_i", "ms_i") if n.rms else ("\\sigma_i^2", "σ_i²")
    d, d_t = "d" + hat, "d" + hat_t
    first, first_t = ("", "") if n.rms else (f" - \\operatorname{{mean}}({row_i(d)})", f" − mean({d_t}_i)")
    tex = (f"{row_i('d' + x)} = \\frac{{{row_i(d)}{first} - {row_i(hat)}\\,\\operatorname{{mean}}({row_i(d)} \\circ "
           f"{row_i(hat)})}}{{\\sqrt{{{s} + \\varepsilon}}}}")
    x_t = x.replace("_{", "_").replace("}", "")
    text = f"d{x_t}_i = ({d_t}_i{first_t} − {hat_t}_i·mean({d_t}_i ∘ {hat_t}_i)) / √({s_t} + ε)"
    if skip:
        tex, text = tex + f" + d{skip}_i", text + f" + d{skip}_i"
    return tex, text


def merged(tex: str) -> str:
    """``tex`` with a subscript on a subscripted name merged into it: Y_{sum}_{ik} is Y_{sum,ik}."""
    tex = re.sub(r"_\{([^{}]*)\}_\{([^{}]*)\}", r"_{\1,\2}", tex)
    return re.sub(r"_\{([^{}]*)\}_([a-z])(?![a-z])", r"_{\1,\2}", tex)


def row_i(name: str) -> str:
    """Row i of ``name`` in LaTeX: ``dX_i``, and ``dY_{last,i}`` for a name with a subscript already."""
    if name.endswith("}") and "_{" in name:
        return name[:-1] + ",i}"
    return name + "_i"


def back_why(n, x: str, hat: str, skip: str | None) -> str:
    if n.rms:
        through, less = "the mean square", f"⟦{hat}_{{ik}}⟧ times the row's mean of ⟦d{hat} \\circ {hat}⟧"
    else:
        through, less = ("the mean and the variance",
                         f"the row's mean of ⟦d{hat}⟧ and ⟦{hat}_{{ik}}⟧ times its mean of ⟦d{hat} \\circ {hat}⟧")
    s = "\\mathrm{ms}_i" if n.rms else "\\sigma_i^2"
    why = WHY["back"].format(hat=hat, x=x, through=through, less=less, s=s)
    if n.rms:
        why = why.replace("Each row of the result sums to 0, and with ⟦\\varepsilon = 0⟧ it is also",
                          "With ⟦\\varepsilon = 0⟧ each row of the result is")
    return merged(why + (WHY["skip"].format(x=x, sum=skip) if skip else ""))


def _gain(n, tex: bool) -> str:
    if n.offset:
        return "(1 + \\gamma)" if tex else "(1 + γ)"
    return "\\gamma" if tex else "γ"


@dataclass(frozen=True)
class NormBack:
    """Where a norm's backward rows sit: its output's gradient ``d_out``, its normalised rows
    ``hat`` and their gradient ``d_hat``, its weights' gradients (keys and names), its row
    statistics (the variance's and the mean square's keys), how the rows write them, and the norm
    itself (``norm(c)``)."""

    d_out: str
    hat: str
    d_hat: str
    dgamma: tuple[str, str]  # (key, name)
    dbeta: tuple[str, str]
    gamma: str  # the key of γ, an input of d_hat
    spread: tuple[str, str]  # (the variance's key, the mean square's)
    tex: tuple[str, str, str]  # LaTeX: the output's gradient, the normalised rows, row i of the output's gradient
    text: tuple[str, str]  # text: the output's gradient, the normalised rows
    norm: Callable[[Context], Any]
    when: Callable[[Context], bool]
    base: float
    section: "str | Callable[[Context], str]"
    step: float = 0.01  # the places of the three rows in the formula: base + step, + 2·step, + 3·step
    rows: Callable[[Context], str] = lambda c: QUERIES  # what the rows stand for

    def back(self, ops, v, c: Context, d_hat: str | None = None):
        """Back through the norm: the gradient of its input from ``d_hat`` (default: its own)."""
        n = self.norm(c)
        return ops.normalise_backward(v(d_hat or self.d_hat), v(self.hat), v(self.spread[n.rms]), n.eps, not n.rms)


PRE_BACK = NormBack(DX_NORM, X_HAT, DX_HAT, (DGAMMA, DGAMMA), (DBETA, DBETA), GAMMA, (VAR, MS),
                    ("dX_{norm}", "\\hat{X}", "dX_{norm,i}"), ("dX_norm", "X̂"), lambda c: c.norm,
                    lambda c: c.pre_norm and _on(c), 30.8, "b_norm")
POST_BACK = NormBack(DH, R_HAT, DR_HAT, (DGAMMA_POST, DGAMMA), (DBETA_POST, DBETA), GAMMA_POST, (VAR_POST, MS_POST),
                     ("dH", "\\hat{R}", "dH_i"), ("dH", "R̂"), lambda c: c.norm, lambda c: _post(c) and _on(c), 18.9,
                     "b_residual")


def _times_gain(ops, d, n):
    return d if n.weight is None else ops.times_row(d, ops.given(n.gain))


def norm_gradient_rows(b: NormBack) -> tuple[Kind, ...]:
    """dX̂ (the normalised rows' gradient), dγ and dβ: the norm's output gradient taken to its
    normalised rows and its weights."""
    out_tex, hat_tex, out_row = b.tex
    out_t, hat_t = b.text

    def hat_formula(c):
        n = b.norm(c)
        if n.weight is None:
            return f"d{hat_tex} = {out_tex}", f"d{hat_t} = {out_t} (no γ)"
        return f"d{hat_tex} = {out_tex} \\odot {_gain(n, True)}", f"d{hat_t} = {out_t} ∘ {_gain(n, False)}"

    def hat_why(c):
        n = b.norm(c)
        if n.weight is None:
            return WHY["d_hat_none"]
        return WHY["d_hat"].format(hat=hat_tex, g="(1 + \\gamma)" if n.offset else "\\gamma").replace(
            "(1 + \\gamma)_k", "(1 + \\gamma_k)")

    forgot_gain = Mistake("γ was not applied on the way back: the normalised rows' gradient taken as the output's",
                          lambda ops, ex, c: ex(b.d_out) if b.norm(c).weight is not None else None)
    return (
        Kind(b.d_hat, b.d_hat, b.base + b.step, b.section, "Back to the normalised rows", hat_why, hat_formula,
             lambda c: (b.rows(c), "d"), lambda sh, r, c: plain(r, "like " + b.hat), inputs=(b.d_out, b.gamma),
             relation=lambda ops, v, c: _times_gain(ops, v(b.d_out), b.norm(c)), when=b.when,
             gradient=True, tex=f"d{hat_tex}", mistakes=(forgot_gain,)),
        Kind(b.dgamma[0], b.dgamma[1], b.base + 2 * b.step, b.section, "Gradient of the norm's weight",
             WHY["dgamma"].format(d=out_tex, hat=hat_tex), (merged(f"d\\gamma = \\sum_i {out_row} \\circ {hat_tex}_i"),
                                                            f"dγ = Σ_i {out_t}_i ∘ {hat_t}_i"), ("b", "d"),
             lambda sh, r, c: plain(r, "like the norm's weight"), inputs=(b.d_out, b.hat),
             relation=lambda ops, v, c: ops.col_sums(ops.hadamard(v(b.d_out), v(b.hat))),
             when=lambda c: b.when(c) and b.norm(c).weight is not None, gradient=True, labelled=False,
             tex="d\\gamma",
             mistakes=(Mistake("the normalised rows were left out: the column sums of the output's gradient (β's)",
                               lambda ops, ex, c: ops.col_sums(ex(b.d_out))),)),
        Kind(b.dbeta[0], b.dbeta[1], b.base + 3 * b.step, b.section, "Gradient of the norm's bias", WHY["dbeta"].format(d=out_tex),
             (f"d\\beta = \\sum_i {out_row}", f"dβ = Σ_i {out_t}_i"), ("b", "d"),
             lambda sh, r, c: plain(r, "like the norm's bias"), inputs=(b.d_out,),
             relation=lambda ops, v, c: ops.col_sums(v(b.d_out)),
             when=lambda c: b.when(c) and b.norm(c).bias is not None, gradient=True, labelled=False,
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
        return POST_BACK.back(ops, v, c)

    return (
        Kind(DH, DH, 18.8, "b_upstream", "The upstream gradient",
             lambda c: WHY[DH] + " Here " + c.loss.describe("H") + ".", dH_formula, (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like H"), inputs=("stream",),
             relation=lambda ops, v, c: dO_relation(ops, v, c, "stream"), when=lambda c: c.residual and _on(c),
             gradient=True, short=lambda ops, value, c: c.loss.kind != "target"),
        *norm_gradient_rows(POST_BACK),
        Kind(DR, DR, 18.95, "b_residual", "Back through the norm",
             lambda c: back_why(c.norm, "R", "\\hat{R}", None), lambda c: mean_back(c.norm, "R", "\\hat{R}", "R̂", None),
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like R"), inputs=(DR_HAT, R_HAT, VAR_POST, MS_POST),
             relation=dR_relation, when=lambda c: _post(c) and _on(c), gradient=True,
             mistakes=back_mistakes(POST_BACK, None)),
    )


def back_mistakes(b: NormBack, skip) -> tuple[Mistake, ...]:
    """The slips of the norm's backward pass, each recomputed from the exact gradients; ``skip``
    (a function of the context) is the residual's gradient key added, or None."""

    def applies(c):  # the norm is there (without a norm in front, dX has none of these slips)
        return b.when(c)

    def plus_skip(ops, ex, c, value):
        key = skip(c) if skip else None
        return ops.sum([value, ex(key)]) if key else value

    def constant_root(ops, ex, c):  # μ and σ taken as constants: the gradient only divided by the root
        if not applies(c):
            return None
        n = b.norm(c)
        zero = ops.sub(ex(b.hat), ex(b.hat))
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(b.d_hat), zero, ex(b.spread[n.rms]), n.eps, False))

    def mean_dropped(ops, ex, c):
        if not applies(c) or b.norm(c).rms:
            return None
        n = b.norm(c)
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(b.d_hat), ex(b.hat), ex(b.spread[0]), n.eps, False))

    def gain_skipped(ops, ex, c):
        if not applies(c) or b.norm(c).weight is None:
            return None
        n = b.norm(c)
        return plus_skip(ops, ex, c, ops.normalise_backward(ex(b.d_out), ex(b.hat), ex(b.spread[n.rms]), n.eps,
                                                            not n.rms))

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
        through = PRE_BACK.back(ops, v, c) if c.pre_norm else input_gradient(DX)(ops, v, c)
        skip = _skip_key(c)
        return ops.sum([through, v(skip)]) if skip else through

    def formula(c):
        skip = "R" if _post(c) else "H" if c.residual else None
        if c.pre_norm:
            return mean_back(c.norm, "X", "\\hat{X}", "X̂", skip)
        tex, text = dX_formula(c)
        return (tex + f" + d{skip}", text + f" + d{skip}") if skip else (tex, text)

    def why(c):
        if c.pre_norm:
            return back_why(c.norm, "X", "\\hat{X}", "H" if c.residual else None)
        base = dX_why(c)
        return base + (WHY["skip"].format(x="X", sum="R" if _post(c) else "H") if c.residual else "")

    def no_skip(ops, ex, c):
        skip = _skip_key(c)
        if not skip:
            return None
        return PRE_BACK.back(ops, ex, c) if c.pre_norm else input_gradient(DX)(ops, ex, c)

    from .mistakes import transposed

    return (
        Kind(DX_NORM, DX_NORM, 30.79, "b_norm", "Gradient of the attention's input",
             lambda c: WHY[DX_NORM] + (" With several heads, every head's paths add up." if c.multi else ""),
             lambda c: tuple(s.replace("dX =", "dX_{norm} =" if k == 0 else "dX_norm =", 1)
                             for k, s in enumerate(dX_formula(c))),
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like X_norm"), inputs=("paths",), relation=input_gradient(DX),
             when=lambda c: c.projected and c.pre_norm and _on(c), gradient=True, tex="dX_{norm}",
             mistakes=(transposed(DX_NORM, square_only=True),)),
        *norm_gradient_rows(PRE_BACK),
        Kind(DX, DX, 31, lambda c: "b_norm" if c.pre_norm else "b_input", "Gradient of the input", why, formula,
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like X"), inputs=("through", "skip"), relation=dX_relation,
             when=lambda c: c.projected and _on(c), gradient=True,
             mistakes=(Mistake("the residual's path was left out: the gradient through the attention alone", no_skip),
                       *back_mistakes(PRE_BACK, _skip_key),
                       transposed(DX, square_only=True))),
    )


def dO_from_residual(c: Context) -> str | None:
    """The key dO is read from with the residual (dH; dR behind a post norm), or None."""
    return _skip_key(c)

