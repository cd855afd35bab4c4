"""The formulas that depend on the problem: each gives ``(LaTeX, plain text)`` for a context (the
scale factor, the loss, the positions, RoPE, the heads, the decoded token)."""

from __future__ import annotations

from typing import Callable

from .kinds import Context
from .relations import cache_runs
from .relations import head_block


def pe_formula(c: Context) -> tuple[str, str]:
    import sympy

    pos = c.p.positions
    if pos.kind != "sinusoidal":
        return "PE", "PE (given)"
    b, d, t = sympy.latex(pos.base), c.p.d_model, str(pos.base)
    if not pos.base.is_Integer:
        b, t = f"\\left({b}\\right)", f"({t})"
    angle = f"\\frac{{p}}{{{b}^{{2i/{d}}}}}"
    return (f"PE_{{p,\\,2i}} = \\sin {angle},\\quad PE_{{p,\\,2i+1}} = \\cos {angle}",
            f"PE[p, 2i] = sin(p / {t}^(2i/{d})), PE[p, 2i+1] = cos(p / {t}^(2i/{d})), p = 0, 1, ...")


def scale_formula(c: Context) -> tuple[str, str]:
    import sympy

    p = c.p
    if p.scale == "auto":
        return f"\\frac{{S}}{{\\sqrt{{d_k}}}} = \\frac{{S}}{{\\sqrt{{{c.d_k}}}}}", f"S / √d_k = S / √{c.d_k}"
    if p.scale == "none":
        return "S", "S (no scaling)"
    return f"{sympy.latex(c.factor)}\\cdot S", f"{c.factor}·S"


def masked_formula(c: Context) -> tuple[str, str]:
    import sympy

    p = c.p
    if getattr(p, "softcap", None) is not None:
        return "\\hat{S} = \\tilde{S} + M", "Ŝ = S̃ + M"
    scaled = {"auto": "\\frac{S}{\\sqrt{d_k}}", "none": "S"}.get(p.scale) if isinstance(p.scale, str) else None
    scaled = scaled or f"{sympy.latex(p.scale)}\\,S"
    scaled_text = {"auto": "S/√dₖ", "none": "S"}.get(p.scale) if isinstance(p.scale, str) else None
    return f"\\hat{{S}} = {scaled} + M", f"Ŝ = {scaled_text or f'{sympy.sstr(p.scale)}·S'} + M"


def _scale_tex(c: Context) -> str:
    import sympy

    return "\\frac{1}{\\sqrt{d_k}}" if c.p.scale == "auto" else sympy.latex(c.factor)


def dS_formula(c: Context) -> tuple[str, str]:
    if c.factor == 1:  # no scaling (or a scale of 1): no factor written
        return "dS = d\\hat{S}", "dS = dŜ"
    return f"dS = {_scale_tex(c)}\\, d\\hat{{S}}", f"dS = {c.factor}·dŜ"


def dO_formula(c: Context) -> tuple[str, str]:
    kind = c.loss.kind
    if kind == "sum":
        return "dO = \\frac{\\partial L}{\\partial O} = \\mathbf{1}", "dO = ∂L/∂O = 1 (every entry)"
    if kind == "weights":
        return "dO = \\frac{\\partial L}{\\partial O} = W", "dO = ∂L/∂O = W"
    if kind == "dO":
        return "dO = \\frac{\\partial L}{\\partial O}", "dO = ∂L/∂O (given)"
    return "dO = \\frac{\\partial L}{\\partial O} = O - T", "dO = ∂L/∂O = O − T"


def dO_head_formula(c: Context) -> tuple[str, str]:
    lo, width = head_block(c)
    return (f"dO^{{({c.head})}} = d\\operatorname{{concat}}_{{[:,\\,{lo + 1}..{lo + width}]}}",
            f"dO = dconcat[:, {lo + 1}..{lo + width}]")


def dX_formula(c: Context) -> tuple[str, str]:
    sum_h, sum_t = ("\\sum_h ", "Σ_h ") if c.multi else ("", "")
    if c.cross:
        return f"dX = {sum_h}dQ\\,W_Q^{{\\top}}", f"dX = {sum_t}dQ·W_Qᵀ"
    return (f"dX = {sum_h}\\left(dQ\\,W_Q^{{\\top}} + dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)",
            f"dX = {sum_t}(dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ)")


def dcontext_formula(c: Context) -> tuple[str, str]:
    sum_h, sum_t = ("\\sum_h ", "Σ_h ") if c.multi else ("", "")
    return (f"dC = {sum_h}\\left(dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)",
            f"dC = {sum_t}(dK·W_Kᵀ + dV·W_Vᵀ)")


def rope_formula(letter: str) -> Callable[[Context], tuple[str, str]]:
    def formula(c: Context) -> tuple[str, str]:
        first = "(1, 1 + d_k/2)" if c.rope.pairing == "half" else "(1, 2)"
        return (f"{letter}^{{\\mathrm{{rot}}}}_p = R(p\\,\\theta)\\,{letter.lower()}_p",
                f"{letter}_rot[p] = R(p·θ)·{letter.lower()}_p, each pair {first}, … turned by p·θ_i")

    return formula


def _normed(c: Context) -> bool:
    return getattr(c.p, "qk_norm", None) is not None


def k_t_formula(c: Context) -> tuple[str, str]:
    if c.rope is None and _normed(c):  # QK-norm: the normalised keys
        return "K^{\\top} = (K_{norm})^{\\top}", "Kᵀ = K_normᵀ"
    if c.rope is None:
        return "K^{\\top}", "Kᵀ"
    return "K^{\\top} = (K^{\\mathrm{rot}})^{\\top}", "Kᵀ = K_rotᵀ"


def s_formula(c: Context) -> tuple[str, str]:
    if c.rope is None and _normed(c):
        return "S = Q_{norm}\\,(K_{norm})^{\\top}", "S = Q_norm·K_normᵀ"
    if c.rope is None:
        return "S = Q\\,K^{\\top}", "S = Q·Kᵀ"
    return "S = Q^{\\mathrm{rot}}\\,(K^{\\mathrm{rot}})^{\\top}", "S = Q_rot·K_rotᵀ"


def few(heads, show, dots: str, most: int = 8) -> list[str]:
    """``show(h)`` for each head, or for the first two and the last with ``dots`` between when there
    are more than ``most`` (a formula of 256 heads is one line, and LaTeX's matrices hold 64 columns)."""
    heads = list(heads)
    if len(heads) <= most:
        return [show(h) for h in heads]
    return [show(heads[0]), show(heads[1]), dots, show(heads[-1])]


def rot_tex(c: Context, letter: str) -> str:
    """The matrix the cache reads: the rotated queries or keys under RoPE (the cache holds them rotated),
    the normalised ones under QK-norm."""
    return f"{letter}^{{\\mathrm{{rot}}}}" if c.rope is not None else f"{letter}_{{norm}}" if _normed(c) else letter


def rot_text(c: Context, letter: str) -> str:
    return f"{letter}_rot" if c.rope is not None else f"{letter}_norm" if _normed(c) else letter


def cache_span(c: Context, tex: bool) -> str:
    """The cached rows, 1-based: ``1..t``, or the sink tokens' and the window's ``1..2, 4..5``."""
    sep = ",\\," if tex else ", "
    runs = cache_runs(c)
    if c.p.mask.kind != "sink-window":
        return sep.join(f"{first + 1}..{first + count}" for first, count in runs)
    return sep.join(f"{first + 1}..{first + count}" if count > 1 else f"{first + 1}" for first, count in runs)


def cache_formula(c: Context, letter: str) -> tuple[str, str]:
    """``K_cache = K[1..t, :]`` (or the rows a sink window keeps), in LaTeX and text."""
    tex_letter, text_letter = (rot_tex(c, letter), rot_text(c, letter)) if letter == "K" else (letter, letter)
    return (f"{letter}_{{\\mathrm{{cache}}}} = {tex_letter}_{{{cache_span(c, True)},\\,:}}",
            f"{letter}_cache = {text_letter}[{cache_span(c, False)}, :]")


def softmax_formula(c: Context) -> tuple[str, str]:
    """``A = softmax(Ŝ)``; with a learned sink s, one more term in Z_i and in the maximum."""
    if c.sink is None:
        return ("A = \\operatorname{softmax}(\\hat{S})",
                "A[i,j] = exp(Ŝ[i,j] − m_i) / Z_i,  m_i = max_k Ŝ[i,k],  Z_i = Σ_k exp(Ŝ[i,k] − m_i)")
    return ("A_{ij} = \\frac{e^{\\hat{S}_{ij} - m_i}}{\\sum_k e^{\\hat{S}_{ik} - m_i} + e^{s - m_i}}",
            "A[i,j] = exp(Ŝ[i,j] − m_i) / Z_i,  m_i = max(max_k Ŝ[i,k], s),  Z_i = Σ_k exp(Ŝ[i,k] − m_i) + exp(s − m_i)")


def s_t_formula(c: Context) -> tuple[str, str]:
    factor = "" if c.factor == 1 else _scale_tex(c) + "\\,"
    text = "" if c.factor == 1 else f"{c.factor}·"
    return f"s_t = {factor}q_t\\,K_{{\\mathrm{{cache}}}}^{{\\top}}", f"s_t = {text}q_t·K_cacheᵀ"
