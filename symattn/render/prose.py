"""Math inside symattn's own sentences: the markup and its three renderings.

symattn's prose (the registry's why texts, the mask rule, the loss, the Jacobian's sentence)
marks every mathematical symbol as LaTeX between ``⟦`` and ``⟧``:
``"each weight ⟦a_{ij}⟧ scaled value row ⟦j⟧"``. Each renderer turns a marked piece into
its own math:

- LaTeX: ``\\(a_{ij}\\)``;
- Markdown: ``$a_{ij}$`` (GitHub and KaTeX render inline math);
- plain text: Unicode, ``aᵢⱼ`` (:func:`text_of`; a subscript without Unicode letters stays
  ``d_model``).

The LaTeX inside the brackets uses a small vocabulary that :func:`text_of` knows (see
``_COMMANDS``); ``tests/test_render_prose.py`` checks that every marked piece symattn writes has a
plain-text rendering with no backslash or brace left. User text (tokens) interpolated into
prose passes through :func:`literal` first, so it can never open math.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

from ..stages.registry import KINDS

OPEN, CLOSE = "⟦", "⟧"
_PIECE = re.compile(f"{OPEN}(.*?){CLOSE}", re.S)


def split(text: str) -> list[tuple[bool, str]]:
    """``text`` as ``(is_math, piece)`` pairs, in order (empty pieces dropped).

    >>> split("weight ⟦a_{ij}⟧ of row ⟦i⟧")
    [(False, 'weight '), (True, 'a_{ij}'), (False, ' of row '), (True, 'i')]
    """
    out = []
    for k, piece in enumerate(_PIECE.split(text)):
        if piece:
            out.append((bool(k % 2), piece))
    return out


def render(text: str, prose: Callable[[str], str], math: Callable[[str], str]) -> str:
    """``text`` with its prose pieces passed through ``prose`` and its math through ``math``;
    the names of :data:`NAMES` that the prose spells in words (the shape notes' ``n_q × d_k``)
    are math too."""
    out = []
    for is_math, piece in split(text):
        if is_math:
            out.append(math(piece))
            continue
        for k, part in enumerate(_NAME_RE.split(piece)):
            out.append(math(NAMES[part]) if k % 2 else prose(part) if part else "")
    return "".join(out)


# The subscripted names symattn's own sentences still write in words (shape notes, the problem's
# sizes), set as math wherever they stand alone. Only these: a token such as a_b stays text.
NAMES = {
    "d_model": "d_{\\mathrm{model}}", "d_out": "d_{\\mathrm{out}}", "d_ff": "d_{\\mathrm{ff}}",
    "d_k": "d_k", "d_v": "d_v", "n_q": "n_q", "n_k": "n_k", "n": "n", "m_i": "m_i", "Z_i": "Z_i",
    "d_c": "d_c", "d_cq": "d_{cq}", "d_h": "d_h", "d_R": "d_R",  # multi-head latent attention's widths
    **{k.name: k.name for k in KINDS if k.source is not None and not k.labelled},  # W_Q, W_K, W_V, W_O
}
_NAME_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(NAMES) + r")(?![A-Za-z0-9_])")


def literal(text: str) -> str:
    """User text made safe to put into prose: its brackets cannot open math.

    >>> literal("⟦x⟧")
    '[[x]]'
    """
    return text.replace(OPEN, "[[").replace(CLOSE, "]]")


def latex(tex: str) -> str:
    return f"\\({tex}\\)"


def markdown(tex: str) -> str:
    return f"${tex}$"


def plain(text: str) -> str:
    """The whole sentence in plain Unicode (what the text renderer prints).

    >>> plain("so it gives ⟦d\\\\hat{S}_{ij} = a_{ij}(dA_{ij} - \\\\sum_k a_{ik}\\\\,dA_{ik})⟧.")
    'so it gives dŜᵢⱼ = aᵢⱼ(dAᵢⱼ − Σₖ aᵢₖ dAᵢₖ).'
    """
    return "".join(text_of(p) if is_math else p for is_math, p in split(text))


# -- LaTeX to Unicode ---------------------------------------------------------------------------

# (the text's minus is − by the time a script is read, so − is in both)
_SUB = dict(zip("0123456789+-−=()aehijklmnoprstuvx", "₀₁₂₃₄₅₆₇₈₉₊₋₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"))
_SUP = dict(zip("0123456789+-−=()bn", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁻⁼⁽⁾ᵇⁿ")) | {"⊤": "ᵀ"}
_COMMANDS = {
    "\\top": "⊤", "\\sum": "Σ", "\\partial": "∂", "\\delta": "δ", "\\cdot": "·", "\\times": "×",
    "\\le": "≤", "\\ge": "≥", "\\infty": "∞", "\\circ": "∘", "\\to": "→", "\\approx": "≈",
    "\\exp": "exp", "\\max": "max", "\\|": "‖", "\\,": " ", "\\;": " ", "\\bigl": "", "\\bigr": "",
    "\\left": "", "\\right": "", "\\ell": "ℓ", "\\ldots": "…",
    "\\theta": "θ", "\\alpha": "α", "\\beta": "β", "\\pi": "π", "\\varphi": "φ", "\\cos": "cos", "\\sin": "sin", "\\dots": "…",
    "\\mu": "μ", "\\sigma": "σ", "\\gamma": "γ", "\\varepsilon": "ε", "\\odot": "∘",
    "\\log": "log ", "\\tanh": "tanh", "\\Phi": "Φ", "\\lambda": "λ",
}
_OPERATORS = {"\\cdot", "\\times", "\\le", "\\ge", "\\to", "\\approx", "\\circ", "\\odot"}
_WRAPPERS = ("\\operatorname", "\\mathrm", "\\mathbf", "\\text", "\\hat", "\\tilde", "\\sqrt")
_COMMAND = re.compile(r"\\(?:[A-Za-z]+|.)")


def _group(tex: str, k: int) -> tuple[str, int]:
    """The argument starting at ``tex[k]``: a braced group's contents or one character, and the
    index after it."""
    if k < len(tex) and tex[k] == "{":
        depth = 0
        for end in range(k, len(tex)):
            depth += {"{": 1, "}": -1}.get(tex[end], 0)
            if depth == 0:
                return tex[k + 1:end], end + 1
        raise ValueError(f"unbalanced braces in {tex!r}")
    m = _COMMAND.match(tex, k)
    if m:
        return m.group(0), m.end()
    return tex[k:k + 1], k + 1


class _NoScript(Exception):
    """A sub- or superscript has no Unicode form."""


def _script(body: str, table: dict, mark: str, unicode: bool) -> str:
    """``body`` as Unicode sub- or superscripts, or (``unicode`` False) ``mark`` and the body."""
    if unicode:
        if body and all(ch in table for ch in body):
            return "".join(table[ch] for ch in body)
        raise _NoScript(body)
    if mark == "^" and body == "⊤":
        return "ᵀ"
    if body.startswith("(") and body.endswith(")") and "(" not in body[1:-1]:
        return mark + body  # already bracketed: m^(b−1), not m^((b−1))
    return mark + (body if len(body) == 1 or body.isalnum() else f"({body})")


def text_of(tex: str) -> str:
    """One marked piece of LaTeX in plain Unicode: sub- and superscripts as Unicode when each of
    the piece's has a Unicode form, else all written ``_k``, ``^2`` (so one piece never mixes
    ``dₖ`` and ``n_q``).

    >>> text_of("\\\\partial a_j/\\\\partial \\\\hat{s}_k = a_j(\\\\delta_{jk} - a_k)")
    '∂aⱼ/∂ŝₖ = aⱼ(δⱼₖ − aₖ)'
    >>> text_of("d_{\\\\mathrm{model}} \\\\times d_k")
    'd_model × d_k'
    """
    try:
        return _text(tex, True)
    except _NoScript:
        return _text(tex, False)


def _text(tex: str, unicode: bool) -> str:
    out = []
    k = 0
    while k < len(tex):
        ch = tex[k]
        if ch in "_^":
            body, k = _group(tex, k + 1)
            body = _text(body, unicode)
            if ch == "^" and out and out[-1] == "e" and (len(out) == 1 or not out[-2][-1:].isalnum()):
                # a power of e: e⁻⁴ when it has superscripts, else exp(…) as the text format writes values
                try:
                    out.append(_script(body, _SUP, ch, unicode) if unicode else f"^{body}")
                except _NoScript:
                    out.append(f"^{body}")
                if out[-1].startswith("^"):
                    out[-2:] = [f"exp({body})"]
                continue
            out.append(_script(body, _SUB if ch == "_" else _SUP, ch, unicode))
            continue
        if ch == "{" or ch == "}":
            k += 1
            continue
        if ch == "-":
            out.append("−")
            k += 1
            continue
        if ch == "\\":
            m = _COMMAND.match(tex, k)
            name = m.group(0)
            k = m.end()
            if name[1:].isalpha() and name != "\\sum":  # a control word ends at the spaces after it
                while k < len(tex) and tex[k] == " ":
                    k += 1
            if name in _WRAPPERS:
                body, k = _group(tex, k)
                body = _text(body, unicode)
                if name == "\\hat":
                    body = unicodedata.normalize("NFC", body + "\u0302")  # Ŝ
                elif name == "\\tilde":
                    body = unicodedata.normalize("NFC", body + "\u0303")  # S̃
                elif name == "\\sqrt":
                    body = "√" + (f"({body})" if re.search(r"[ +−·/]", body) else body)
                out.append(body)
            elif name in ("\\frac", "\\tfrac"):
                top, k = _group(tex, k)
                bottom, k = _group(tex, k)
                top, bottom = _text(top, unicode), _text(bottom, unicode)
                out.append("½" if (top, bottom) == ("1", "2") else f"{top}/{bottom}")
            elif name in _OPERATORS:
                out.append(f" {_COMMANDS[name]} ")
            elif name in _COMMANDS:
                out.append(_COMMANDS[name])
            else:
                raise ValueError(f"no plain-text form for {name} in {tex!r}")
            continue
        out.append(ch)
        k += 1
    return re.sub(r" {2,}", " ", "".join(out)).strip()
