"""Matrices as LaTeX math: labelled with tokens, elided when large, optionally shaded.

A matrix whose rows are tokens is drawn as a small table: the row labels on
the left, the column labels (key tokens, or dimension names) on top, so a
reader finds "how much *sat* attends to *cat*" at row *sat*, column *cat*.
Above ``max_shown`` rows or columns only the first ones and the last one are
drawn, with ⋮, ⋯ and ⋱ in between; entries that are not drawn are never
computed.
"""

from __future__ import annotations

import functools

from typing import Callable, Sequence

Index = int | None  # None marks the elided band
MAX_SHOWN = 8  # rows or columns drawn before a matrix is elided

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
    "²": "\\ensuremath{^{2}}",
    "…": "\\ldots{}",
    "–": "--",
    "—": "---",
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
_MATH_SPECIALS = {
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
        if ch in _MATH_SPECIALS:
            close_run()
            out.append(_MATH_SPECIALS[ch])
            continue
        if ch == "-" and run and run[-1] == "-":
            close_run()  # a second \text keeps "--" from becoming an en dash
        run.append(ch if ch in _TEXT_AS_IS else escape_tex(ch))
    close_run()
    return "".join(out) or "{}"


def shown(n: int, max_shown: int) -> list[Index]:
    """The indices drawn of ``n``: all, or the first ``max_shown - 2``, a gap and the last.

    >>> shown(4, 8)
    [0, 1, 2, 3]
    >>> shown(64, 8)
    [0, 1, 2, 3, 4, 5, None, 63]
    """
    if n <= max_shown:
        return list(range(n))
    head = max(1, max_shown - 2)
    return list(range(head)) + [None, n - 1]


def grid(
    n_rows: int,
    n_cols: int,
    cell: Callable[[int, int], str],
    *,
    max_shown: int,
    row_labels: Sequence[str] | None = None,
    col_labels: Sequence[str] | None = None,
    shade: Callable[[int, int], str] | None = None,
) -> str:
    """LaTeX of a matrix; with ``row_labels`` a labelled table, else a bracketed matrix.

    ``cell(i, j)`` gives an entry's LaTeX; ``shade(i, j)`` a prefix such as
    ``\\cellcolor[gray]{0.8}`` (LaTeX with colortbl only).
    """
    rows = shown(n_rows, max_shown)
    cols = shown(n_cols, max_shown)

    def entry(i: Index, j: Index) -> str:
        if i is None and j is None:
            return "\\ddots"
        if i is None:
            return "\\vdots"
        if j is None:
            return "\\cdots"
        text = cell(i, j)
        return (shade(i, j) + text) if shade is not None else text

    body_rows = [[entry(i, j) for j in cols] for i in rows]
    tall = any("\\dfrac" in c for row in body_rows for c in row)
    newline = " \\\\[6pt] " if tall else " \\\\ "
    if row_labels is None:
        body = newline.join(" & ".join(row) for row in body_rows)
        return f"\\begin{{bmatrix}} {body} \\end{{bmatrix}}"
    lines = [("\\vdots" if i is None else row_labels[i]) + " & " + " & ".join(row) for i, row in zip(rows, body_rows)]
    body = newline.join(lines)
    if col_labels is not None:
        header = " & ".join("\\cdots" if j is None else col_labels[j] for j in cols)
        body = f" & {header} \\\\ \\hline {body}"
    return f"\\begin{{array}}{{r|{'c' * len(cols)}}} {body} \\end{{array}}"
