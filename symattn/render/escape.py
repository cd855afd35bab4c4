"""User text made safe in each output language: printed as written, never obeyed.

One escape per target: :func:`escape_tex` (LaTeX text) and :func:`tex_token` (a token as LaTeX
math), :func:`escape_html` (HTML text and attributes), :func:`escape_markdown`, :func:`escape_myst`. Every renderer,
and every report that writes user text, takes its escape from here.
"""

from __future__ import annotations

import functools
import html
import re

from ..text import BIDI_CONTROLS, bidi_name, show_bidi

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
    "Ŝ": "\\ensuremath{\\hat{S}}",
    "ŝ": "\\ensuremath{\\hat{s}}",
    "∂": "\\ensuremath{\\partial}",
    "δ": "\\ensuremath{\\delta}",
    "∘": "\\ensuremath{\\circ}",
    "‖": "\\ensuremath{\\|}",
    "½": "\\ensuremath{\\tfrac{1}{2}}",
    "λ": "\\ensuremath{\\lambda}",
    "²": "\\ensuremath{^{2}}",
    "…": "\\ldots{}",
    "–": "--",
    "—": "---",
    "“": "``",
    "”": "''",
}


@functools.lru_cache(maxsize=4096)  # token labels come back in every matrix
def escape_tex(text: str) -> str:
    """User text made safe for LaTeX: printed as written, never executed.

    >>> escape_tex(r"\\input{/etc/passwd} 50% & $x_1$")
    '\\\\textbackslash{}input\\\\{/etc/passwd\\\\} 50\\\\% \\\\& \\\\$x\\\\_1\\\\$'
    """
    out = []
    for ch in text:
        if ch in _SPECIALS:
            out.append(_SPECIALS[ch])
        elif ch in _SYMBOLS:
            out.append(_SYMBOLS[ch])
        elif ch in BIDI_CONTROLS:  # shown, as every renderer shows them, never obeyed
            out.append(f"\\ensuremath{{\\langle}}{bidi_name(ch)}\\ensuremath{{\\rangle}}")
        elif ord(ch) < 32 or 127 <= ord(ch) < 160:  # control characters
            out.append(" ")
        elif ord(ch) > 255:
            out.append(f"[U+{ord(ch):04X}]")  # outside what pdflatex's inputenc knows
        else:
            out.append(ch)
    return "".join(out)


# A token's characters that are written in math mode, outside \text{...}. MathJax 3 prints
# \text's contents as they are (no \textless, no \_) or, with its textmacros package, reads
# them as LaTeX text that rejects _ ^ # & and knows no \textless; KaTeX and pdflatex read
# them as LaTeX text too. So \text keeps only what all of them print as itself, and each of
# these is an ordinary math symbol that pdflatex, MathJax and KaTeX all know (braced, so that
# none is spaced as a relation and no two $ meet, which would end a Markdown $$ block).
# < > | are math too: in a document with the OT1 encoding \text{<} prints an inverted !.
MATH_SPECIALS = {
    "\\": "{\\backslash}",
    "&": "{\\&}",
    "%": "{\\%}",
    "$": "{\\$}",
    "#": "{\\#}",
    "_": "{\\_}",
    "{": "{\\{}",
    "}": "{\\}}",
    "~": "{\\sim}",
    "^": "{\\hat{\\mkern6mu}}",
    "<": "{<}",
    ">": "{>}",
    "|": "{|}",
    "…": "{\\ldots}",
    **{ch: "{" + tex[len("\\ensuremath{"):-1] + "}" for ch, tex in _SYMBOLS.items() if tex.startswith("\\ensuremath{")},
    **{ch: f"{{\\langle}}\\text{{{bidi_name(ch)}}}{{\\rangle}}" for ch in BIDI_CONTROLS},  # ⟨U+202E⟩
}
_TEXT_AS_IS = "–—"  # inputenc knows them; escape_tex writes them as LaTeX's -- and --- instead


@functools.lru_cache(maxsize=4096)
def tex_token(token: str) -> str:
    """A token as LaTeX math that pdflatex, MathJax 3 (with or without textmacros) and KaTeX print as written.

    Runs of plain characters are ``\\text``; the others are math symbols:

    >>> tex_token("<pad>")
    '{<}\\\\text{pad}{>}'
    >>> tex_token("a_b")
    '\\\\text{a}{\\\\_}\\\\text{b}'
    """
    out = []
    run: list[str] = []

    def close_run() -> None:
        if run:
            out.append("\\text{" + "".join(run) + "}")
            run.clear()

    for ch in token:
        if ch in MATH_SPECIALS:
            close_run()
            out.append(MATH_SPECIALS[ch])
            continue
        if ch == "-" and run and run[-1] == "-":
            close_run()  # a second \text keeps "--" from becoming an en dash
        run.append(ch if ch in _TEXT_AS_IS else escape_tex(ch))
    close_run()
    return "".join(out) or "{}"


def escape_html(text: str) -> str:
    """User text as HTML text (quotes too, so it is safe in an attribute).

    >>> escape_html('"><img src=x onerror=alert(1)>')
    '&quot;&gt;&lt;img src=x onerror=alert(1)&gt;'
    """
    text = "".join(" " if (ord(ch) < 32 and ch not in "\t\n") or 127 <= ord(ch) < 160 else ch for ch in show_bidi(text))
    return html.escape(text, quote=True)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~$&])")


def escape_markdown(text: str) -> str:
    """User text shown literally in Markdown (no links, emphasis, HTML or math).

    >>> escape_markdown("*bold* <b>")
    '\\\\*bold\\\\* \\\\<b\\\\>'
    """
    return _MD_SPECIAL.sub(r"\\\1", show_bidi(text).replace("\n", " "))


# Every ASCII punctuation character may be backslash-escaped in CommonMark: user text escaped so
# is text in MyST too, never a role ({abbr}`…`), directive (:::), target, HTML or math.
_PUNCT = re.compile(r"([!-/:-@\[-`{-~])")


def escape_myst(text: str) -> str:
    """User text shown literally in MyST.

    >>> escape_myst("{abbr}`x` <b> $y$")
    '\\\\{abbr\\\\}\\\\`x\\\\` \\\\<b\\\\> \\\\$y\\\\$'
    """
    return _PUNCT.sub(r"\\\1", show_bidi(text).replace("\n", " "))
