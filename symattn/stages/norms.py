"""The registry's rows of a layer norm and of the residual stream (``norm:``, ``residual:``).

In front of the attention (``place: pre``, GPT-2's ``ln_1``, LLaMA's ``input_layernorm``) the
rows turn the block's input (X, or X_pos) into X_norm, which the projections read:

    μ_i = (1/d) Σ_k x_ik                       norm_mean   (LayerNorm only)
    σ_i² = (1/d) Σ_k (x_ik − μ_i)²              norm_var    (biased, as PyTorch and every model)
    ms_i = (1/d) Σ_k x_ik²                      norm_ms     (RMSNorm instead of μ and σ²)
    X̂_ik = (x_ik − μ_i)/√(σ_i² + ε)             X_hat       (x_ik/√(ms_i + ε) for RMSNorm)
    X_norm = X̂ ∘ γ + β                          X_norm      (γ: norm_gamma, β: norm_beta, given)

and the residual stream behind it is H = X + O (the output after W_O and b_O). Behind the
attention (``place: post``, BERT) the same rows normalise R = X + O and end in H = LN(R); their
keys end in ``_post`` and their ids are the same names.
"""

from __future__ import annotations

from .ids import (
    BETA, BETA_POST, GAMMA, GAMMA_POST, H, H_POST, MEAN, MEAN_SQUARE, MS, MS_POST, MU, MU_POST, QUERIES, R, R_HAT,
    VAR, VAR_POST, VARIANCE, X_HAT, X_NORM,
)
from .kinds import Context, Kind, Mistake
from .shapes import plain


def _pre(c: Context) -> bool:
    return c.pre_norm


def _post(c: Context) -> bool:
    return c.norm is not None and c.norm.post


def _layer(c: Context) -> bool:
    return not c.norm.rms


def _eps(c: Context) -> str:
    eps = c.norm.eps
    return "0" if eps == 0 else str(eps)


NORM_WHY = {
    "mu": "Each token is normalised on its own, over its own features (the ⟦d⟧ entries of its row), not over the "
          "tokens: ⟦\\mu_i⟧ is the mean of row ⟦i⟧.",
    "var": "⟦\\sigma_i^2⟧ is the mean of the squared distances from ⟦\\mu_i⟧: divided by ⟦d⟧, not ⟦d - 1⟧ (the biased "
           "variance, as PyTorch's LayerNorm and every model compute it).",
    "ms": "RMSNorm takes no mean away: it divides each row by the root of its mean square ⟦(1/d)\\sum_k x_{ik}^2⟧.",
    "hat": "Each row is divided by its own root ⟦\\sqrt{{{s} + \\varepsilon}}⟧, with ⟦\\varepsilon⟧ = {eps} inside the "
           "root, so every entry of row ⟦i⟧ carries the same factor ⟦1/\\sqrt{{{s} + \\varepsilon}}⟧, which "
           "the entries below keep exactly. Each normalised row has mean 0 and {unit}.",
    "gamma": "The norm's weight ⟦\\gamma⟧ (one entry per feature) multiplies each column of the normalised rows{offset}.",
    "beta": "The norm's bias ⟦\\beta⟧ (one entry per feature) is added to every normalised row.",
    "out_pre": "The norm's output ⟦X_{{norm}}⟧ is what the attention reads: the projections below take their rows "
               "from it. {why}",
    "H": "The residual stream: the attention's output is added to its input, ⟦H = {x} + O⟧, so the block passes "
         "its input on and the attention adds to it. ⟦O⟧ is the layer's output after ⟦W_O⟧{b}.",
    "R": "Behind the attention (post-norm, BERT's order) the output is first added to the input, ⟦R = X + O⟧, and "
         "the sum is normalised.",
    "out_post": "The norm of the residual sum is the block's output ⟦H⟧. {why}",
}


def _hat_why(c: Context) -> str:
    if c.norm.rms:
        return NORM_WHY["hat"].format(s="\\mathrm{ms}_i", eps=_eps(c), unit="mean square 1 (before ⟦\\varepsilon⟧ is added)").replace(
            "has mean 0 and ", "has ")
    return NORM_WHY["hat"].format(s="\\sigma_i^2", eps=_eps(c), unit="variance 1 (before ⟦\\varepsilon⟧ is added)")


FACTORED_ROWS = 6, 8  # rows and columns up to which the normalised rows are written factored, row by row


def factored(value) -> str:
    """The normalised rows written as each row's own factor times a rational row, for a hand-sized
    matrix kept in that form (a RowScaled value: rational rows U_i, factors 1/√r_i, no C)."""
    U, scales = getattr(value, "U", None), getattr(value, "scales", None)
    if U is None or getattr(value, "C", None) is not None or U.rows > FACTORED_ROWS[0] or U.cols > FACTORED_ROWS[1]:
        return ""
    import sympy

    if all(x.is_Rational for x in scales):
        return ""  # every root is rational: the entries are plain fractions already
    rows = []
    for i in range(U.rows):
        entries = [U[i, k] for k in range(U.cols)]
        common = sympy.gcd_list([sympy.Rational(x) for x in entries if x != 0]) if any(x != 0 for x in entries) else 1
        factor = scales[i] * common
        inner = ", ".join(sympy.latex(sympy.Rational(x) / common) for x in entries)
        rows.append(f"⟦\\text{{row }} {i + 1} = {sympy.latex(factor)} \\cdot ({inner})⟧")
    return (" Factored, each row is its own number times a row of rationals: " + "; ".join(rows) + ".")


def _affine_text(c: Context, tex: bool, hat: str) -> str:
    """``X̂ ∘ γ + β`` in LaTeX or text, with what the norm has."""
    n = c.norm
    g = ("(1 + \\gamma)" if tex else "(1 + γ)") if n.offset else ("\\gamma" if tex else "γ")
    out = hat
    if n.weight is not None:
        out += (" \\odot " if tex else " ∘ ") + g
    if n.bias is not None:
        out += " + " + ("\\beta" if tex else "β")
    return out


def _affine_why(c: Context) -> str:
    n = c.norm
    if n.weight is None and n.bias is None:
        return "This norm has no ⟦\\gamma⟧ or ⟦\\beta⟧ (1 and 0), so it is the normalised rows themselves."
    parts = []
    if n.weight is not None:
        parts.append("each column ⟦k⟧ is multiplied by ⟦" + ("1 + \\gamma_k" if n.offset else "\\gamma_k") + "⟧")
    if n.bias is not None:
        parts.append("⟦\\beta_k⟧ is added")
    return "Then " + " and ".join(parts) + "."


def _forgot(which: str):
    """X_norm with γ or β (or both) left out, where the norm has them; None where it does not."""

    def relation(ops, ex, c):
        n = c.norm
        hat = ex(X_HAT if not n.post else R_HAT)
        has_g, has_b = n.weight is not None, n.bias is not None
        g, b = (ex(GAMMA if not n.post else GAMMA_POST) if has_g else None,
                ex(BETA if not n.post else BETA_POST) if has_b else None)
        gain = ops.given(n.gain) if has_g else None
        if which == "gamma" and has_g:
            return ops.add_row(hat, b) if has_b else hat
        if which == "beta" and has_b:
            return ops.times_row(hat, gain) if has_g else hat
        if which == "both" and has_g and has_b:
            return hat
        if which == "swapped" and has_g and has_b:
            return ops.add_row(ops.times_row(hat, b), g)
        if which == "offset" and has_g and n.offset:
            out = ops.times_row(hat, ops.given(n.weight))
            return ops.add_row(out, b) if has_b else out
        return None

    return relation


def _stats(ops, x, c: Context, ddof: int = 0, rms: bool | None = None):
    """(μ or None, σ² or the mean square) of each row of ``x``; ``rms`` overrides the norm's type."""
    rms = c.norm.rms if rms is None else rms
    mu = None if rms else ops.row_mean(x)
    return mu, ops.row_spread(x, mu, ddof)


def _normalised(ops, x, c: Context, ddof: int = 0, inside: bool = True, rms: bool | None = None):
    mu, spread = _stats(ops, x, c, ddof, rms)
    return ops.normalise(x, mu, spread, c.norm.eps, inside)


def _hat_mistakes(src) -> tuple[Mistake, ...]:
    """The classic slips of the normalisation, each recomputed from the norm's exact input (``src(c)``)."""

    def unbiased(ops, ex, c):
        return None if c.norm.rms or c.p.X.cols < 2 else _normalised(ops, ex(src(c)), c, ddof=1)

    def outside(ops, ex, c):
        return None if c.norm.eps == 0 else _normalised(ops, ex(src(c)), c, inside=False)

    def over_tokens(ops, ex, c):
        x = ex(src(c))
        rows = len(x) if isinstance(x, list) else x.rows
        return None if rows < 2 else ops.T(_normalised(ops, ops.T(x), c))

    def other_type(ops, ex, c):
        return _normalised(ops, ex(src(c)), c, rms=not c.norm.rms)

    return (
        Mistake("the unbiased variance: the squared distances were divided by d − 1; LayerNorm divides by d", unbiased),
        Mistake("ε outside the root: divided by √σ² + ε instead of √(σ² + ε)", outside),
        Mistake("normalised over the tokens (each column) instead of over each token's features (its row)",
                over_tokens),
        Mistake("the other norm: RMSNorm done as LayerNorm (the mean taken away) or LayerNorm as RMSNorm (no mean)",
                other_type),
    )


def _out_mistakes() -> tuple[Mistake, ...]:
    return (
        Mistake("γ was left out (the normalised rows were not multiplied by the norm's weight)", _forgot("gamma")),
        Mistake("β was left out (the norm's bias was not added)", _forgot("beta")),
        Mistake("γ and β were both left out: the normalised rows themselves", _forgot("both")),
        Mistake("γ and β swapped: multiplied by β and γ added", _forgot("swapped")),
        Mistake("γ used where the norm multiplies by 1 + γ (Gemma's offset)", _forgot("offset")),
    )


def _hat_formula(c: Context, tex: str, name: str, x: str) -> tuple[str, str]:
    if c.norm.rms:
        return (f"{tex}_{{ik}} = \\frac{{{x}_{{ik}}}}{{\\sqrt{{\\mathrm{{ms}}_i + \\varepsilon}}}}",
                f"{name}[i,k] = {x}_ik / √(ms_i + ε)")
    return (f"{tex}_{{ik}} = \\frac{{{x}_{{ik}} - \\mu_i}}{{\\sqrt{{\\sigma_i^2 + \\varepsilon}}}}",
            f"{name}[i,k] = ({x}_ik − μ_i) / √(σ_i² + ε)")


def norm_rows(post: bool) -> tuple[Kind, ...]:
    """The rows of the norm in front of the attention (``post`` False) or behind it."""
    when = _post if post else _pre
    source = R if post else "block"  # the input key (block: X, or X_pos)

    def src(c):
        return R if post else c.block

    keys = (MU_POST, VAR_POST, MS_POST, GAMMA_POST, BETA_POST) if post else (MU, VAR, MS, GAMMA, BETA)
    mu, var, ms, gamma, beta = keys
    hat, out = (R_HAT, H_POST) if post else (X_HAT, X_NORM)
    x = "r" if post else "x"
    base = 18.6 if post else 2.7
    section = "residual" if post else "norm"
    hat_name, out_name = (R_HAT, H) if post else (X_HAT, X_NORM)
    hat_tex = "\\hat{R}" if post else "\\hat{X}"

    def spread_of(ops, v, c):
        return ops.row_spread(v(src(c)), None if c.norm.rms else v(mu))

    def hat_relation(ops, v, c):
        return ops.normalise(v(src(c)), None if c.norm.rms else v(mu), v(ms if c.norm.rms else var), c.norm.eps)

    def out_relation(ops, v, c):
        y = v(hat)
        if c.norm.weight is not None:
            y = ops.times_row(y, ops.given(c.norm.gain))
        if c.norm.bias is not None:
            y = ops.add_row(y, v(beta))
        return y

    return (
        Kind(mu, MU, base, section, "Mean of each token's features", NORM_WHY["mu"],
             (f"\\mu_i = \\frac{{1}}{{d}}\\sum_k {x}_{{ik}}", f"μ_i = (1/d)·Σ_k {x}_ik"), (QUERIES, MEAN),
             lambda sh, r, c: plain(r, "one per token"), inputs=(source,),
             relation=lambda ops, v, c: ops.row_mean(v(src(c))), when=lambda c: when(c) and _layer(c), tex="\\mu",
             by_relation=post),
        Kind(var, VAR, base + 0.02, section, "Variance of each token's features", NORM_WHY["var"],
             (f"\\sigma_i^2 = \\frac{{1}}{{d}}\\sum_k ({x}_{{ik}} - \\mu_i)^2", f"σ_i² = (1/d)·Σ_k ({x}_ik − μ_i)²"),
             (QUERIES, VARIANCE), lambda sh, r, c: plain(r, "one per token"), inputs=(source, mu),
             relation=spread_of, when=lambda c: when(c) and _layer(c), tex="\\sigma^2", by_relation=post,
             mistakes=(Mistake("the unbiased variance: divided by d − 1 instead of d",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), ex(mu), 1) if c.p.X.cols > 1 else None),
                       Mistake("the mean square (RMSNorm's) instead of the variance: the mean was not taken away",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), None)))),
        Kind(ms, MS, base + 0.02, section, "Mean square of each token's features", NORM_WHY["ms"],
             (f"\\mathrm{{ms}}_i = \\frac{{1}}{{d}}\\sum_k {x}_{{ik}}^2", f"ms_i = (1/d)·Σ_k {x}_ik²"),
             (QUERIES, MEAN_SQUARE), lambda sh, r, c: plain(r, "one per token"), inputs=(source,),
             relation=spread_of, when=lambda c: when(c) and not _layer(c), tex="\\mathrm{ms}", by_relation=post,
             mistakes=(Mistake("the variance (LayerNorm's) instead of the mean square: RMSNorm takes no mean away",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), ops.row_mean(ex(src(c))))),)),
        Kind(hat, hat_name, base + 0.04, section, "Normalise each token", _hat_why,
             lambda c: _hat_formula(c, hat_tex, hat_name, x), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like the input"), inputs=(source, mu, ms, var),
             relation=hat_relation, when=when, tex=hat_tex, mistakes=_hat_mistakes(src), by_relation=post,
             note=factored),
        Kind(gamma, GAMMA, base + 0.06, section, "The norm's weight",
             lambda c: NORM_WHY["gamma"].format(offset=" as 1 + ⟦\\gamma⟧ (the weight is stored as an offset from 1)"
                                                if c.norm.offset else ""),
             ("\\gamma", "γ"), ("b", "d"), lambda sh, r, c: plain(r, "1 × d_model"),
             source=lambda c: c.norm.weight, when=lambda c: when(c) and c.norm.weight is not None, labelled=False,
             tex="\\gamma"),
        Kind(beta, BETA, base + 0.07, section, "The norm's bias", NORM_WHY["beta"], ("\\beta", "β"), ("b", "d"),
             lambda sh, r, c: plain(r, "1 × d_model"), source=lambda c: c.norm.bias,
             when=lambda c: when(c) and c.norm.bias is not None, labelled=False, tex="\\beta"),
        Kind(out, out_name, base + 0.08, section, "The block's output" if post else "The attention's input",
             lambda c: NORM_WHY["out_post" if post else "out_pre"].format(why=_affine_why(c)),
             lambda c: (f"{'H' if post else 'X_{norm}'} = {_affine_text(c, True, hat_tex)}",
                        f"{'H' if post else 'X_norm'} = {_affine_text(c, False, hat_name)}"),
             (QUERIES, "d"), lambda sh, r, c: plain(r, "like the input"), inputs=(hat, gamma, beta),
             relation=out_relation, when=when, tex="H" if post else "X_{norm}", mistakes=_out_mistakes(),
             by_relation=post),
    )


def residual_rows() -> tuple[Kind, ...]:
    """The residual stream: H = X + O (pre-norm or none), or the sum R = X + O a post norm takes."""

    def b_note(c):
        return " and ⟦b_O⟧" if c.has_bias("b_O") else ""

    return (
        Kind(H, H, 18.5, "residual", "Add the residual",
             lambda c: NORM_WHY["H"].format(x=c.block_name, b=b_note(c)) if c.multi else
             NORM_WHY["H"].format(x=c.block_name, b="").replace(" after ⟦W_O⟧", " (one head, no output projection)"),
             lambda c: (f"H = {c.block_name} + O", f"H = {c.plain(c.block_name)} + O"), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like X"), inputs=("block", "output"),
             relation=lambda ops, v, c: ops.sum([v(c.block), v(c.output)]),
             when=lambda c: c.residual and not _post(c), shows=frozenset({"heads_sum"}), by_relation=True,
             mistakes=(Mistake("the residual was left out: H = O", lambda ops, ex, c: ex(c.output)),
                       Mistake("the normalised input was added instead of the block's input: H = X_norm + O",
                               lambda ops, ex, c: ops.sum([ex(X_NORM), ex(c.output)]) if c.pre_norm else None))),
        Kind(R, R, 18.55, "residual", "Add the residual (before the norm)", NORM_WHY["R"],
             lambda c: (f"R = {c.block_name} + O", f"R = {c.plain(c.block_name)} + O"), (QUERIES, "d"),
             lambda sh, r, c: plain(r, "like X"), inputs=("block", "output"),
             relation=lambda ops, v, c: ops.sum([v(c.block), v(c.output)]), when=_post, by_relation=True,
             mistakes=(Mistake("the residual was left out: R = O", lambda ops, ex, c: ex(c.output)),)),
    )
