"""How LaTeX math will look on the page, worked out from its text: sizes, fraction styles, struts.

The worked solution's math is written once and shown by pdflatex, MathJax and
KaTeX alike, so the layout rules here only produce constructs all three know
(``\\dfrac``, ``\\rule``, ``aligned``). The sizes are estimates in points of an
11 pt document (symattn's LaTeX preamble): good to about 10 %, which is what
deciding where to split a wide matrix needs; pdflatex measures the real width
and reports it (see :func:`symattn.render.pdf.display_scales`).
"""

from __future__ import annotations

import functools
import re

# pt: US Letter with 2 cm margins. On A4 the line is 482 pt: \symattnfit scales a display between the two
# by at most 4 %, and the MIN_SCALE floor is tested on A4, the default page.
LINE_WIDTH = 500.0
MIN_SCALE = 0.85  # no display is shrunk further; a wider matrix is split into column blocks
# A display is split when its estimate exceeds this: the estimate can be ~10 % low, and
# LaTeX then still fits it at no less than MIN_SCALE.
SPLIT_WIDTH = LINE_WIDTH / 0.95

from .latex_tokens import COMMAND, braced_group, optional_argument, display_fractions, has_fraction


# --- sizes --------------------------------------------------------------------------------------

_EM = 10.95  # pt, Latin Modern at 11 pt
_BIN = 4 / 18 * _EM  # \medmuskip
_REL = 5 / 18 * _EM  # \thickmuskip
_ARRAYCOLSEP = 5.0
_NULLDELIM = 1.2
_WIDTHS = {  # commands drawn as one symbol (pt)
    "infty": 11.0, "cdots": 14.6, "ldots": 14.6, "vdots": 3.0, "ddots": 14.6, "cdot": 3.0 + 2 * _BIN,
    "times": 8.5 + 2 * _BIN, "approx": 8.5 + 2 * _REL, "le": 8.5 + 2 * _REL, "ge": 8.5 + 2 * _REL,
    "to": 11.0 + 2 * _REL, "quad": _EM, "qquad": 2 * _EM, ",": 3 / 18 * _EM, ":": _BIN, ";": _REL,
    "!": -3 / 18 * _EM, " ": 3.7, "top": 8.5, "partial": 6.3, "delta": 4.9, "sum": 16.0, "max": 19.0,
    "surd": 9.0, "circ": 5.5 + 2 * _BIN, "hline": 0.0, "Sigma": 7.9, "hat": 0.0, "mid": 3.0 + 2 * _REL,
    "alpha": 7.0, "beta": 6.2, "gamma": 5.7, "lambda": 6.4, "mu": 6.6, "sigma": 6.3, "tau": 4.8,
    "theta": 5.2, "pi": 6.3, "in": 7.3 + 2 * _REL, "backslash": 5.5,
}
_IGNORED_ONE_ARG = {"cellcolor", "color", "vphantom", "label", "textcolor"}
_TEXT = {"text", "mathrm", "operatorname", "textbf", "mathbf", "textit"}


def width(tex: str) -> float:
    """The estimated width in points of display-style math ``tex``, pdflatex's to about 10 %.

    >>> round(width(r"\\dfrac{1 + 2e^{-2}}{Z_{2}}"))
    44
    """
    return 1.05 * _width(tex)


@functools.lru_cache(maxsize=8192)
def _width(tex: str, scale: float = 1.0) -> float:
    total = 0.0
    k = 0
    prev_op = True  # at the start a + or - is a sign, without the space of a binary operator
    while k < len(tex):
        ch = tex[k]
        if ch in " \n\t&~":
            k += 1
            continue
        if ch in "^_":
            first, e = braced_group(tex, k + 1)
            w = _width(first, 1.0) * 0.7
            # a superscript and a subscript stack: the wider counts
            if e < len(tex) and tex[e] in "^_" and tex[e] != ch:
                second, e = braced_group(tex, e + 1)
                w = max(w, _width(second, 1.0) * 0.7)
            total += w * scale
            k = e
            prev_op = False
            continue
        if ch == "{":
            body, k = braced_group(tex, k)
            total += _width(body, scale)
            prev_op = False
            continue
        if ch == "\\":
            w, k, op = _command(tex, k, scale)
            total += w
            if op is not None:
                prev_op = op
            continue
        if "0" <= ch <= "9":  # a run of digits at once (a float's numerator has 16), added digit by digit
            end = _DIGITS.match(tex, k).end()
            w = _char(ch) * scale
            for _ in range(end - k):
                total += w
            k = end
            prev_op = False
            continue
        if ch in "+-":
            total += (8.5 + (0 if prev_op else 2 * _BIN)) * scale
            prev_op = True
        elif ch in "=<>":
            total += (8.5 + 2 * _REL) * scale
            prev_op = True
        else:
            total += _char(ch) * scale
            prev_op = ch in "(["
        k += 1
    return total


_DIGITS = re.compile(r"[0-9]+")
_OPERATORS = ("cdot", "times", "approx", "le", "ge", "to", "circ", "in", "mid")  # a sign after them is a sign


def _command(tex: str, k: int, scale: float) -> tuple[float, int, bool | None]:
    """The width of the command at ``tex[k]`` (a backslash), where it ends, and whether what
    follows it comes after an operator (None: as before it, for a lone backslash)."""
    m = COMMAND.match(tex, k)
    if m is None:  # a backslash ending the text: an estimate never fails
        return 5.0 * scale, k + 1, None
    name = m.group(1)
    k = m.end()
    w = 0.0
    if name in ("frac", "dfrac", "tfrac"):
        num, k = braced_group(tex, k)
        den, k = braced_group(tex, k)
        s = scale * (0.7 if name == "tfrac" else 1.0)
        w = max(_width(num, s), _width(den, s)) + 2 * _NULLDELIM
    elif name == "sqrt":
        _, k = optional_argument(tex, k)
        body, k = braced_group(tex, k)
        w = (8.5 + _width(body, 1.0)) * scale
    elif name in _TEXT:
        body, k = braced_group(tex, k)
        visible = len(re.sub(r"[{}]", "", re.sub(r"\\[A-Za-z]+(\{\})? ?", "#", body)))
        w = (visible * 5.0 + (2 * _REL if name == "operatorname" else 0)) * scale
    elif name in ("hphantom", "phantom", "hat", "boxed", "mathit", "bar", "tilde", "overline"):
        body, k = braced_group(tex, k)
        w = _width(body, scale) + (2 * 3.3 + 0.8 if name == "boxed" else 0)
    elif name in _IGNORED_ONE_ARG:
        _, k = optional_argument(tex, k)
        _, k = braced_group(tex, k)
    elif name == "rule":
        _, k = optional_argument(tex, k)
        _, k = braced_group(tex, k)
        _, k = braced_group(tex, k)
    elif name in ("left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr"):
        delim, k = braced_group(tex, k)
        w = 0.0 if delim == "." else 4.3 * scale
    elif name == "begin":
        env, k = braced_group(tex, k)
        end = tex.find("\\end{" + env + "}", k)
        end = len(tex) if end < 0 else end
        body = tex[k:end]
        k = end + len("\\end{" + env + "}")
        w = _environment_width(env, body) * scale
    elif name != "\\":
        w = _WIDTHS.get(name, 6.0) * scale
        return w, k, name in _OPERATORS
    return w, k, False


def _char(ch: str) -> float:
    if ch.isdigit():
        return 5.5
    if ch in ".,;":
        return 3.05 + (3 / 18 * _EM if ch == "," else 0)
    if ch in "()[]":
        return 4.3
    if ch in "|":
        return 3.0
    if ch == "/":
        return 5.5
    if ch == ":":
        return 3.05
    return 5.8


def _split_top(body: str, sep: str) -> list[str]:
    """``body`` split at ``sep`` outside braces."""
    parts, depth, start, k = [], 0, 0, 0
    while k < len(body):
        ch = body[k]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "\\" and body.startswith(sep, k) and depth == 0 and sep == "\\\\":
            parts.append(body[start:k])
            k += 2
            _, k2 = optional_argument(body, k)
            start = k = k2
            continue
        elif ch == "\\":
            k += 2
            continue
        elif ch == sep and depth == 0:
            parts.append(body[start:k])
            start = k + 1
        k += 1
    parts.append(body[start:])
    return parts


def _environment_width(env: str, body: str) -> float:
    spec = ""
    if env == "array":
        spec, rest = braced_group(body, 0)
        body = body[rest:]
    rows = [_split_top(row, "&") for row in _split_top(body, "\\\\")]
    n = max(len(r) for r in rows)
    cols = [max((_width(r[c]) if c < len(r) else 0.0) for r in rows) for c in range(n)]
    if env == "aligned":
        return sum(cols) + (n // 2) * 0  # alignment pairs sit side by side
    total = sum(cols) + 2 * _ARRAYCOLSEP * n + (0.4 if "|" in spec else 0)
    if env in ("bmatrix", "pmatrix", "matrix"):
        total += 2 * 4.3 if env != "matrix" else 0
    return total


# --- heights, for the struts that keep rows of fractions apart ----------------------------------

GAP = 3.0  # pt kept above and below the tallest entry of a row: at least 2 · GAP between rows


def _script_height(t: str) -> float:
    """How much an entry's exponents and nested fractions add above a plain line."""
    extra = 0.0
    if "^" in t:
        extra = 3.6
        if "\\sqrt" in t or "^{(" in t:
            extra = 4.4
    return extra


def extent(cell: str) -> tuple[float, float]:
    """The estimated height and depth (pt) of a display-style entry."""
    box = _BOX.search(cell)
    if box is not None:
        d = float(box.group(1)) * _EM
        return float(box.group(2)) * _EM - d + _FBOXSEP + 0.4, d + _FBOXSEP + 0.4
    m = re.search(r"\\dfrac", cell)
    if m is None:
        h = 6.9 + _script_height(cell)
        return h + (3.5 if "\\sqrt" in cell and "^" not in cell else 0), 1.0 + (2.5 if "\\left" in cell else 0)
    num, k = braced_group(cell, m.end())
    den, _ = braced_group(cell, k)
    h = 14.3 + _script_height(num) + (2.9 if "\\sqrt" in num else 0) + (5.0 if "frac" in num else 0)
    d = 9.2
    if "^{(" in den or "}_" in den or re.search(r"\^\{[^}]*\}_", den):
        d += 4.3
    elif "^" in den:
        d += 1.5
    if "\\left" in den or "frac" in den:
        d += 2.6
    if "\\sqrt" in den:
        d += 1.5
    return h, d


def strut(cells: list[str]) -> str:
    """A zero-width rule as tall and deep as the tallest entry plus :data:`GAP`, in em."""
    h = max(extent(c)[0] for c in cells) + GAP
    d = max(extent(c)[1] for c in cells) + GAP
    return f"\\rule[-{d / _EM:.2f}em]{{0pt}}{{{(h + d) / _EM:.2f}em}}"


_BOX = re.compile(r"\\boxed\{\\rule\[-([0-9.]+)em\]\{0pt\}\{([0-9.]+)em\}")
_FBOXSEP = 3.0  # pt around a box's content, plus its 0.4 pt frame


def answer_box(entry: str, digits: int) -> str:
    """An empty ``\\boxed`` as wide and tall as the answer ``entry`` (its LaTeX) or a decimal of
    ``digits`` significant figures, whichever is larger, sizes rounded up to half an em: room for
    the answer written by hand, without the answer itself in the sheet's source.

    >>> answer_box("", 4)
    '\\\\boxed{\\\\rule[-0.32em]{0pt}{1.19em}\\\\rule{3.0em}{0pt}}'
    """
    cell = display_fractions(entry)
    w = max(width(cell) if entry else 0.0, width("0." + "0" * digits))
    h, d = extent(cell) if entry else (0.0, 0.0)
    h, d = max(h, 9.5), max(d, 3.5)  # room for handwriting, even for a one-digit answer
    w_em = -(-w // (_EM / 2)) / 2
    return f"\\boxed{{\\rule[-{d / _EM:.2f}em]{{0pt}}{{{(h + d) / _EM:.2f}em}}\\rule{{{w_em:.1f}em}}{{0pt}}}}"


def needs_strut(cell: str) -> bool:
    """Whether an entry is taller than a line of text (a fraction, an answer box)."""
    return has_fraction(cell) or "\\boxed" in cell
