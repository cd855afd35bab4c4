"""LaTeX worked solutions: a standalone document or a fragment for ``\\input``."""

from __future__ import annotations

import re

from ..derivation import Derivation
from ._common import blocks

_SPECIALS = {
    "\\": "\\textbackslash{}",
    "&": "\\&",
    "%": "\\%",
    "$": "\\$",
    "#": "\\#",
    "_": "\\_",
    "{": "\\{",
    "}": "\\}",
    "~": "\\textasciitilde{}",
    "^": "\\textasciicircum{}",
    "<": "\\textless{}",
    ">": "\\textgreater{}",
    "|": "\\textbar{}",
}
# Symbols of symattn's own prose, written as LaTeX math.
_SYMBOLS = {
    "√": "\\ensuremath{\\surd}",
    "−": "\\ensuremath{-}",
    "≤": "\\ensuremath{\\le}",
    "≥": "\\ensuremath{\\ge}",
    "×": "\\ensuremath{\\times}",
    "·": "\\ensuremath{\\cdot}",
    "→": "\\ensuremath{\\to}",
    "ᵀ": "\\ensuremath{^{\\top}}",
    "∞": "\\ensuremath{\\infty}",
    "Σ": "\\ensuremath{\\Sigma}",
    "≈": "\\ensuremath{\\approx}",
    "…": "\\ldots{}",
    "–": "--",
    "—": "---",
}


def escape(text: str) -> str:
    """User text made safe for LaTeX: printed as written, never executed.

    >>> escape(r"\\input{/etc/passwd} 50% & $x_1$")
    '\\\\textbackslash{}input\\\\{/etc/passwd\\\\} 50\\\\% \\\\& \\\\$x\\\\_1\\\\$'
    """
    out = []
    for ch in text:
        if ch in _SPECIALS:
            out.append(_SPECIALS[ch])
        elif ch in _SYMBOLS:
            out.append(_SYMBOLS[ch])
        elif ord(ch) < 32 or 127 <= ord(ch) < 160:  # control characters
            out.append(" ")
        elif ord(ch) > 255:
            out.append(f"[U+{ord(ch):04X}]")  # outside what pdflatex's inputenc knows
        else:
            out.append(ch)
    return "".join(out)


# The subscripted names symattn's own sentences use, written as math. Only
# these: a token such as a_b in the same sentence stays text as written.
_MATH_NAMES = {
    name: "\\ensuremath{" + tex + "}"
    for name, tex in {
        "d_model": "d_{\\mathrm{model}}",
        "d_k": "d_k",
        "d_v": "d_v",
        "n_q": "n_q",
        "n_k": "n_k",
        "m_i": "m_i",
        "Z_i": "Z_i",
        "W_Q": "W_Q",
        "W_K": "W_K",
        "W_V": "W_V",
        "W_O": "W_O",
        "d_out": "d_{\\mathrm{out}}",
    }.items()
}
_MATH_NAME_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(_MATH_NAMES) + r")(?![A-Za-z0-9_])")


def _prose(text: str) -> str:
    """symattn's own sentences: escaped, with d_k, n_q, W_Q ... as math."""
    parts = _MATH_NAME_RE.split(text)
    return "".join(_MATH_NAMES[p] if k % 2 else escape(p) for k, p in enumerate(parts))


_PREAMBLE = r"""\documentclass[11pt]{article}
\usepackage[T1]{fontenc}
\usepackage[utf8]{inputenc}
\IfFileExists{lmodern.sty}{\usepackage{lmodern}}{}
\usepackage{amsmath,amssymb}
\usepackage[margin=2cm]{geometry}
\setcounter{MaxMatrixCols}{64}
\allowdisplaybreaks
\renewcommand{\arraystretch}{1.3}
"""


def render_latex(
    derivation: Derivation, *, standalone: bool = True, digits: int | None = None, check=None
) -> str:
    """The worked solution as LaTeX (a full document unless ``standalone=False``)."""
    lines: list[str] = []
    for block in blocks(derivation, digits, check):
        if block.kind == "section":
            lines.append(f"\\section*{{{_prose(block.text)}}}")
        elif block.kind == "step":
            lines.append(f"\\paragraph{{{_prose(block.text)}.}} {_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(_prose(block.text))
        else:
            lines.append(f"\\[\n{block.text}\n\\]")
        lines.append("")
    body = "\n".join(lines).rstrip() + "\n"
    if not standalone:
        return body
    title = escape(derivation.problem.title)
    return (
        _PREAMBLE
        + f"\\title{{{title}}}\n\\date{{}}\n\\begin{{document}}\n\\maketitle\n\n"
        + body
        + "\n\\end{document}\n"
    )
