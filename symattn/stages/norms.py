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
keys end in ``_post`` and their ids are the same names. The embeddings' own norm
(``embeddings_norm:``, BERT's ``embeddings.LayerNorm``) is the same rows again, of X_pos, named
``emb_mean`` ... ``X_emb``: X_emb is the layer's input, which the attention reads and the
residual adds to.
"""

from __future__ import annotations

import dataclasses

from .ids import (
    K, KEYS, K_HAT, K_NORM, KN_BETA, KN_GAMMA, KN_MS, KN_MU, KN_VAR, Q, Q_HAT, Q_NORM, QN_BETA, QN_GAMMA, QN_MS,
    QN_MU, QN_VAR,
)
from .ids import (
    BETA, BETA_POST, LAST, EBETA, EGAMMA, EMS, EMU, EVAR, FINAL_BETA, FINAL_GAMMA, FINAL_MS, FINAL_MU, FINAL_VAR, GAMMA,
    GAMMA_POST, H, H_HAT, H_NORM, H_POST, MEAN, MEAN_SQUARE, MLP_BETA, MLP_BETA_POST, MLP_GAMMA, MLP_GAMMA_POST,
    MLP_MS, MLP_MS_POST, MLP_MU, MLP_MU_POST, MLP_VAR, MLP_VAR_POST, MS, MS_POST, MU, MU_POST, QUERIES, R, R_HAT,
    VAR, VAR_POST, VARIANCE, X_EMB, X_EMB_HAT, X_HAT, X_NORM, Y, Y_FINAL, Y_FINAL_HAT, Y_HAT, Y_POST, Y_SUM,
)
from .kinds import Context, Kind, Mistake
from .shapes import plain


def _pre(c: Context) -> bool:
    return c.pre_norm


def _post(c: Context) -> bool:
    return c.norm is not None and c.norm.post


def _emb(c: Context) -> bool:
    return c.emb_norm is not None


def _mlp_norm(c: Context):
    return None if c.mlp is None else c.mlp.norm


def _final_norm(c: Context):
    return None if c.logits is None else c.logits.norm


_WHEN = {"pre": _pre, "post": _post, "emb": _emb,
         "mlp": lambda c: _mlp_norm(c) is not None and not c.mlp.post,
         "mlp_post": lambda c: _mlp_norm(c) is not None and c.mlp.post,
         "final": lambda c: _final_norm(c) is not None,
         "q": lambda c: getattr(c.p, "qk_norm", None) is not None,
         "k": lambda c: getattr(c.p, "qk_norm", None) is not None}


def _eps(n) -> str:
    """ε as the why writes it: 0, a fraction, or a power of ten (10^{-12}, not 1/1000000000000)."""
    eps = n.eps
    if eps == 0:
        return "0"
    if eps.is_Rational and eps.p == 1 and eps.q >= 1000 and str(eps.q).rstrip("0") == "1":
        return f"⟦10^{{-{len(str(eps.q)) - 1}}}⟧"
    return str(eps)


# each place's stage keys: μ, σ², the mean square, γ, β, the normalised rows and the output
_KEYS = {
    "pre": (MU, VAR, MS, GAMMA, BETA, X_HAT, X_NORM),
    "post": (MU_POST, VAR_POST, MS_POST, GAMMA_POST, BETA_POST, R_HAT, H_POST),
    "emb": (EMU, EVAR, EMS, EGAMMA, EBETA, X_EMB_HAT, X_EMB),
    "mlp": (MLP_MU, MLP_VAR, MLP_MS, MLP_GAMMA, MLP_BETA, H_HAT, H_NORM),
    "mlp_post": (MLP_MU_POST, MLP_VAR_POST, MLP_MS_POST, MLP_GAMMA_POST, MLP_BETA_POST, Y_HAT, Y_POST),
    "final": (FINAL_MU, FINAL_VAR, FINAL_MS, FINAL_GAMMA, FINAL_BETA, Y_FINAL_HAT, Y_FINAL),
    "q": (QN_MU, QN_VAR, QN_MS, QN_GAMMA, QN_BETA, Q_HAT, Q_NORM),
    "k": (KN_MU, KN_VAR, KN_MS, KN_GAMMA, KN_BETA, K_HAT, K_NORM),
}
_NAMES = {"pre": "pre", "post": "pre", "emb": "emb", "mlp": "mlp", "mlp_post": "mlp", "final": "final",
          "q": "q", "k": "k"}  # whose ids
# each place's input key ("block": X, X_pos or X_emb; "stream": H; "final_in": Y, its last row, or H)
_SOURCE = {"pre": "block", "post": R, "emb": "embedded", "mlp": "stream", "mlp_post": Y_SUM, "final": "final_in",
           "q": Q, "k": K}  # QK-norm: each head's own queries and keys


def has_norm(p) -> bool:
    """Whether the problem normalises anything: the layer's norm or the embeddings' own."""
    return getattr(p, "norm", None) is not None or getattr(p, "embeddings_norm", None) is not None


def hat_keys(p) -> tuple[str, ...]:
    """The keys of the normalised rows of each norm the problem has (the embeddings' first)."""
    norm = getattr(p, "norm", None)
    places = ["emb"] if getattr(p, "embeddings_norm", None) is not None else []
    places += [] if norm is None else ["post" if norm.post else "pre"]
    return tuple(_KEYS[place][5] for place in places)


NORM_OF = {"pre": lambda c: c.norm, "post": lambda c: c.norm, "emb": lambda c: c.emb_norm,  # each place's Norm
           "mlp": _mlp_norm, "mlp_post": _mlp_norm, "final": _final_norm,
           "q": lambda c: c.p.qk_norm.q, "k": lambda c: c.p.qk_norm.k}


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
    "out_emb": "The embeddings' norm gives ⟦X_{{emb}}⟧, the layer's input: the projections below read it, and the "
               "residual stream adds the attention's output to it. {why}",
    "out_mlp": "The norm's output ⟦H_{{norm}}⟧ is what the MLP reads; the residual stream ⟦H⟧ itself goes on "
               "unnormalised, and the MLP's output is added to it. {why}",
    "out_mlp_post": "Behind the MLP (post-norm, BERT's order) the sum ⟦H + F⟧ is normalised, and its norm is the "
                    "block's output ⟦Y⟧. {why}",
    "out_q": "QK-norm (Qwen 3, OLMo 2, Gemma 3): each query row of this head is normalised over its own ⟦d_k⟧ "
             "features, not over the tokens, before RoPE; ⟦Q_{{norm}}⟧ is what {reads}. {why}",
    "out_k": "The keys are normalised the same way, row by row over ⟦d_k⟧, with their own weight ⟦\\gamma_k⟧; "
             "⟦K_{{norm}}⟧ is what {reads}. {why}",
    "out_final": "The final norm's output is what the unembedding reads: each row is scored against every word "
                 "of the vocabulary. {why}",
}


def _hat_why(n) -> str:
    if n.rms:
        return NORM_WHY["hat"].format(s="\\mathrm{ms}_i", eps=_eps(n), unit="mean square 1 (before ⟦\\varepsilon⟧ is added)").replace(
            "has mean 0 and ", "has ")
    return NORM_WHY["hat"].format(s="\\sigma_i^2", eps=_eps(n), unit="variance 1 (before ⟦\\varepsilon⟧ is added)")


FACTORED_ROWS = 6, 8  # rows and columns up to which the normalised rows are written factored, row by row
FACTOR_CHARS = 40  # the longest factor (as LaTeX) a factored row is written with


def factored(value) -> str:
    """The normalised rows written as each row's own factor times a rational row, for a hand-sized
    matrix kept in that form (a RowScaled value: rational rows U_i, factors 1/√r_i, no C)."""
    own = vars(value) if hasattr(value, "__dict__") else {}  # never a lazy matrix's delegated attributes
    U, scales = own.get("U"), own.get("scales")
    if U is None or own.get("C") is not None or U.rows > FACTORED_ROWS[0] or U.cols > FACTORED_ROWS[1]:
        return ""
    import sympy

    if all(x.is_Rational for x in scales):
        return ""  # every root is rational: the entries are plain fractions already
    rows = []
    for i in range(U.rows):
        entries = [U[i, k] for k in range(U.cols)]
        common = sympy.gcd_list([sympy.Rational(x) for x in entries if x != 0]) if any(x != 0 for x in entries) else 1
        factor = sympy.latex(scales[i] * common)
        if len(factor) > FACTOR_CHARS:
            return ""  # a root of a long fraction (ε = 10⁻¹² on float rows): no easier to read than the entries
        inner = ", ".join(sympy.latex(sympy.Rational(x) / common) for x in entries)
        rows.append(f"⟦\\text{{row }} {i + 1} = {factor} \\cdot ({inner})⟧")
    return (" Factored, each row is its own number times a row of rationals: " + "; ".join(rows) + ".")


def _affine_text(n, tex: bool, hat: str) -> str:
    """``X̂ ∘ γ + β`` in LaTeX or text, with what the norm ``n`` has."""
    g = ("(1 + \\gamma)" if tex else "(1 + γ)") if n.offset else ("\\gamma" if tex else "γ")
    out = hat
    if n.weight is not None:
        out += (" \\odot " if tex else " ∘ ") + g
    if n.bias is not None:
        out += " + " + ("\\beta" if tex else "β")
    return out


def _affine_why(n) -> str:
    if n.weight is None and n.bias is None:
        return "This norm has no ⟦\\gamma⟧ or ⟦\\beta⟧ (1 and 0), so it is the normalised rows themselves."
    parts = []
    if n.weight is not None:
        parts.append("each column ⟦k⟧ is multiplied by ⟦" + ("1 + \\gamma_k" if n.offset else "\\gamma_k") + "⟧")
    if n.bias is not None:
        parts.append("⟦\\beta_k⟧ is added")
    return "Then " + " and ".join(parts) + "."


def _forgot(which: str, place: str):
    """X_norm with γ or β (or both) left out, where the norm has them; None where it does not."""
    norm_of, (_, _, _, gamma_key, beta_key, hat_key, _) = NORM_OF[place], _KEYS[place]

    def relation(ops, ex, c):
        n = norm_of(c)
        hat = ex(hat_key)
        has_g, has_b = n.weight is not None, n.bias is not None
        g, b = ex(gamma_key) if has_g else None, ex(beta_key) if has_b else None
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


def _stats(ops, x, n, ddof: int = 0, rms: bool | None = None):
    """(μ or None, σ² or the mean square) of each row of ``x``; ``rms`` overrides the norm's type."""
    rms = n.rms if rms is None else rms
    mu = None if rms else ops.row_mean(x)
    return mu, ops.row_spread(x, mu, ddof)


def _normalised(ops, x, n, ddof: int = 0, inside: bool = True, rms: bool | None = None):
    mu, spread = _stats(ops, x, n, ddof, rms)
    return ops.normalise(x, mu, spread, n.eps, inside)


def _hat_mistakes(src, norm_of) -> tuple[Mistake, ...]:
    """The classic slips of the normalisation, each recomputed from the norm's exact input (``src(c)``)."""

    def unbiased(ops, ex, c):
        n = norm_of(c)
        return None if n.rms or c.p.X.cols < 2 else _normalised(ops, ex(src(c)), n, ddof=1)

    def outside(ops, ex, c):
        n = norm_of(c)
        return None if n.eps == 0 else _normalised(ops, ex(src(c)), n, inside=False)

    def over_tokens(ops, ex, c):
        x = ex(src(c))
        rows = len(x) if isinstance(x, list) else x.rows
        return None if rows < 2 else ops.T(_normalised(ops, ops.T(x), norm_of(c)))

    def other_type(ops, ex, c):
        n = norm_of(c)
        return _normalised(ops, ex(src(c)), n, rms=not n.rms)

    return (
        Mistake("the unbiased variance: the squared distances were divided by d − 1; LayerNorm divides by d", unbiased),
        Mistake("ε outside the root: divided by √σ² + ε instead of √(σ² + ε)", outside),
        Mistake("normalised over the tokens (each column) instead of over each token's features (its row)",
                over_tokens),
        Mistake("the other norm: RMSNorm done as LayerNorm (the mean taken away) or LayerNorm as RMSNorm (no mean)",
                other_type),
    )


def _out_mistakes(place: str) -> tuple[Mistake, ...]:
    return (
        Mistake("γ was left out (the normalised rows were not multiplied by the norm's weight)", _forgot("gamma", place)),
        Mistake("β was left out (the norm's bias was not added)", _forgot("beta", place)),
        Mistake("γ and β were both left out: the normalised rows themselves", _forgot("both", place)),
        Mistake("γ and β swapped: multiplied by β and γ added", _forgot("swapped", place)),
        Mistake("γ used where the norm multiplies by 1 + γ (Gemma's offset)", _forgot("offset", place)),
    )


def entry_tex(tex: str, sub: str) -> str:
    """Entry ``sub`` of the matrix ``tex``: bracketed when the name has a subscript of its own
    ((\\hat{X}_{emb})_{ik}, not a double subscript)."""
    return f"({tex})_{{{sub}}}" if "_" in tex else f"{tex}_{{{sub}}}"


def _hat_formula(n, tex: str, name: str, x: str) -> tuple[str, str]:
    tex = entry_tex(tex, "ik")[:-len("_{ik}")]
    if n.rms:
        return (f"{tex}_{{ik}} = \\frac{{{x}_{{ik}}}}{{\\sqrt{{\\mathrm{{ms}}_i + \\varepsilon}}}}",
                f"{name}[i,k] = {x}_ik / √(ms_i + ε)")
    return (f"{tex}_{{ik}} = \\frac{{{x}_{{ik}} - \\mu_i}}{{\\sqrt{{\\sigma_i^2 + \\varepsilon}}}}",
            f"{name}[i,k] = ({x}_ik − μ_i) / √(σ_i² + ε)")


# each place's first order, section, names of the normalised rows and the output, their LaTeX, the
# output's name in text, the letter of an input entry, and the step between its stages' orders
_PLACES = {
    "pre": (2.7, "norm", X_HAT, X_NORM, "\\hat{X}", "X_{norm}", "X_norm", "x", 0.01),
    "post": (18.6, "residual", R_HAT, H, "\\hat{R}", "H", "H", "r", 0.01),
    "emb": (2.615, "embeddings", X_EMB_HAT, X_EMB, "\\hat{X}_{emb}", "X_{emb}", "X_emb", "x", 0.01),
    "mlp": (18.7, "mlp_norm", H_HAT, H_NORM, "\\hat{H}", "H_{norm}", "H_norm", "h", 0.002),
    "mlp_post": (18.9, "mlp_residual", Y_HAT, Y, "\\hat{Y}", "Y", "Y", "r", 0.002),
    "final": (18.93, "final_norm", Y_FINAL_HAT, Y_FINAL, "\\hat{Y}_{final}", "Y_{final}", "Y_final", "y", 0.002),
    "q": (8.1, "qk_norm", Q_HAT, Q_NORM, "\\hat{Q}", "Q_{norm}", "Q_norm", "q", 0.01),
    "k": (8.2, "qk_norm", K_HAT, K_NORM, "\\hat{K}", "K_{norm}", "K_norm", "k", 0.01),
}
_OUT_TITLES = {"pre": "The attention's input", "post": "The block's output", "emb": "The layer's input",
               "mlp": "The MLP's input", "mlp_post": "The block's output", "final": "The unembedding's input",
               "q": "The normalised queries", "k": "The normalised keys"}


_ROW = {"q": "query row", "k": "key row"}  # what a QK-norm normalises, one at a time
_COLUMNS = {"q": ("q", "1 × d_k"), "k": ("k", "1 × d_k")}  # QK-norm's columns and its weights' shape


def _axes(place: str):
    """A norm's axes with columns ``col``: a row per token, or for the final norm of ``rows: last``
    the last token's row alone."""
    if place == "k":
        return lambda col: (KEYS, col)
    if place != "final":
        return lambda col: (QUERIES, col)
    return lambda col: lambda c: (LAST if c.logits.last else QUERIES, col)


def norm_rows(place: str) -> tuple[Kind, ...]:
    """The rows of the norm in front of the attention (``place`` pre), behind it (post), or of the
    embeddings' own norm (emb)."""
    when, N = _WHEN[place], NORM_OF[place]
    source = _SOURCE[place]  # the input key

    def src(c):
        return {"pre": c.block, "emb": c.embedded, "mlp": c.stream, "final": c.final_in}.get(place, source)
    col, width = _COLUMNS.get(place, ("d", "1 × d_model"))  # the normalised rows' columns: d1, ... (QK-norm: q1, ...)
    mu, var, ms, gamma, beta, hat, out = _KEYS[place]
    names = _KEYS[_NAMES[place]]  # a norm in front of a sub-block and behind it: the same names
    base, section, hat_name, out_name, hat_tex, out_tex, out_plain, x, unit = _PLACES[place]
    by_relation = place not in ("pre", "emb", "q", "k")  # behind the softmax: from the inputs' values
    axes = _axes(place)

    def spread_of(ops, v, c):
        return ops.row_spread(v(src(c)), None if N(c).rms else v(mu))

    def hat_relation(ops, v, c):
        n = N(c)
        return ops.normalise(v(src(c)), None if n.rms else v(mu), v(ms if n.rms else var), n.eps)

    def out_relation(ops, v, c):
        y, n = v(hat), N(c)
        if n.weight is not None:
            y = ops.times_row(y, ops.given(n.gain))
        if n.bias is not None:
            y = ops.add_row(y, v(beta))
        return y

    def layer(c):
        return when(c) and not N(c).rms

    rows = (
        Kind(mu, names[0], base, section, "Mean of each token's features", NORM_WHY["mu"],
             (f"\\mu_i = \\frac{{1}}{{d}}\\sum_k {x}_{{ik}}", f"μ_i = (1/d)·Σ_k {x}_ik"), axes(MEAN),
             lambda sh, r, c: plain(r, "one per token"), inputs=(source,),
             relation=lambda ops, v, c: ops.row_mean(v(src(c))), when=layer, tex="\\mu", by_relation=by_relation),
        Kind(var, names[1], base + 2 * unit, section, "Variance of each token's features",
             NORM_WHY["var"],
             (f"\\sigma_i^2 = \\frac{{1}}{{d}}\\sum_k ({x}_{{ik}} - \\mu_i)^2", f"σ_i² = (1/d)·Σ_k ({x}_ik − μ_i)²"),
             axes(VARIANCE), lambda sh, r, c: plain(r, "one per token"), inputs=(source, mu),
             relation=spread_of, when=layer, tex="\\sigma^2", by_relation=by_relation,
             mistakes=(Mistake("the unbiased variance: divided by d − 1 instead of d",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), ex(mu), 1) if c.p.X.cols > 1 else None),
                       Mistake("the mean square (RMSNorm's) instead of the variance: the mean was not taken away",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), None)))),
        Kind(ms, names[2], base + 2 * unit, section, f"Mean square of each {_ROW.get(place, 'token')}'s features",
             NORM_WHY["ms"],
             (f"\\mathrm{{ms}}_i = \\frac{{1}}{{d}}\\sum_k {x}_{{ik}}^2", f"ms_i = (1/d)·Σ_k {x}_ik²"),
             axes(MEAN_SQUARE), lambda sh, r, c: plain(r, "one per token"), inputs=(source,),
             relation=spread_of, when=lambda c: when(c) and N(c).rms, tex="\\mathrm{ms}", by_relation=by_relation,
             mistakes=(Mistake("the variance (LayerNorm's) instead of the mean square: RMSNorm takes no mean away",
                               lambda ops, ex, c: ops.row_spread(ex(src(c)), ops.row_mean(ex(src(c))))),)),
        Kind(hat, hat_name, base + 4 * unit, section, f"Normalise each {_ROW.get(place, 'token')}", lambda c: _hat_why(N(c)),
             lambda c: _hat_formula(N(c), hat_tex, hat_name, x), axes(col),
             lambda sh, r, c: plain(r, "like the input"), inputs=(source, mu, ms, var),
             relation=hat_relation, when=when, tex=hat_tex, mistakes=_hat_mistakes(src, N), by_relation=by_relation,
             note=factored),
        Kind(gamma, names[3], base + 6 * unit, section, "The norm's weight",
             lambda c: NORM_WHY["gamma"].format(offset=" as 1 + ⟦\\gamma⟧ (the weight is stored as an offset from 1)"
                                                if N(c).offset else ""),
             ("\\gamma", "γ"), ("b", col), lambda sh, r, c: plain(r, width),
             source=lambda c: N(c).weight, when=lambda c: when(c) and N(c).weight is not None, labelled=False,
             tex="\\gamma"),
        Kind(beta, names[4], base + 7 * unit, section, "The norm's bias", NORM_WHY["beta"],
             ("\\beta", "β"), ("b", col),
             lambda sh, r, c: plain(r, width), source=lambda c: N(c).bias,
             when=lambda c: when(c) and N(c).bias is not None, labelled=False, tex="\\beta"),
        Kind(out, out_name, base + 8 * unit, section, _OUT_TITLES[place],
             lambda c: NORM_WHY["out_" + place].format(why=_affine_why(N(c)),
                                                       reads="RoPE turns" if c.rope is not None else
                                                       "the scores are made from"),
             lambda c: (f"{out_tex} = {_affine_text(N(c), True, hat_tex)}",
                        f"{out_plain} = {_affine_text(N(c), False, hat_name)}"),
             axes(col), lambda sh, r, c: plain(r, "like the input"), inputs=(hat, gamma, beta),
             relation=out_relation, when=when, tex=out_tex, mistakes=_out_mistakes(place),
             by_relation=by_relation),
    )
    return tuple(dataclasses.replace(k, per_head=True) for k in rows) if place in ("q", "k") else rows  # QK-norm: per head


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
