"""The formula a worked solution opens with, and what the problem's first sentence says of the
scores' soft-capping and temperature (Gemma 2's c·tanh(s/c) before the mask, Ŝ/T after it)."""

from __future__ import annotations

import sympy

_PLAIN_TEX = "\\operatorname{Attention}(Q, K, V) = \\operatorname{softmax}\\!\\left(\\frac{Q K^{\\top}}{\\sqrt{d_k}} + M\\right) V"
_PLAIN_TEXT = "Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k + M)·V"


def formula(p, tex: bool = True) -> str:
    """The attention formula as this problem computes it (LaTeX, or plain text)."""
    if getattr(p, "linear", None) is not None:  # linear attention: its own formula, no softmax
        from ..stages import LINEAR_FORMULA

        return LINEAR_FORMULA[0 if tex else 1]
    diff = getattr(p, "differential", None)
    if diff is not None:  # differential attention: two maps, the second λ times subtracted
        from ..stages import DIFFERENTIAL_FORMULA

        lam = f",\\quad \\lambda = {sympy.latex(diff.lam)}" if tex else f",  λ = {sympy.sstr(diff.lam)}"
        return DIFFERENTIAL_FORMULA[0 if tex else 1] + lam
    cap, T = getattr(p, "softcap", None), getattr(p, "temperature", None)
    if cap is None and T is None:
        return _PLAIN_TEX if tex else _PLAIN_TEXT
    if tex:
        scores = "\\frac{Q K^{\\top}}{\\sqrt{d_k}}"
        if cap is not None:
            scores = f"c \\tanh\\!\\left(\\frac{{Q K^{{\\top}}}}{{c\\,\\sqrt{{d_k}}}}\\right)"
        inner = f"{scores} + M"
        inner = f"\\frac{{{inner}}}{{T}}" if T is not None else inner
        out = f"\\operatorname{{Attention}}(Q, K, V) = \\operatorname{{softmax}}\\!\\left({inner}\\right) V"
        values = ([f"c = {sympy.latex(cap)}"] if cap is not None else []) + ([f"T = {sympy.latex(T)}"] if T is not None else [])
        return out + ",\\quad " + ",\\ ".join(values)
    scores = "c·tanh(Q·Kᵀ / (c·√d_k))" if cap is not None else "Q·Kᵀ / √d_k"
    inner = f"({scores} + M) / T" if T is not None else f"{scores} + M"
    values = ([f"c = {sympy.sstr(cap)}"] if cap is not None else []) + ([f"T = {sympy.sstr(T)}"] if T is not None else [])
    return f"Attention(Q, K, V) = softmax({inner})·V,  " + ", ".join(values)


def scores_said(p) -> str:
    """The soft-capping and the temperature, for the problem's first sentence ('' without them)."""
    out = ""
    if getattr(p, "softcap", None) is not None:
        out += f"; the scaled scores are soft-capped, ⟦c \\cdot \\tanh(s/c)⟧ with ⟦c = {sympy.latex(p.softcap)}⟧, before the mask"
    if getattr(p, "temperature", None) is not None:
        out += f"; the masked scores are divided by the temperature ⟦T = {sympy.latex(p.temperature)}⟧"
    return out
