"""MathML from the worked solution's LaTeX, for the web page.

The LaTeX is symattn's own (numbers, stage symbols, the formulas of the registry); user text
(titles, tokens) never goes through here: the page writes it as escaped HTML. The conversion
is latex2mathml's, after a few rewrites of what it does not know or what MathML Core, the
part of MathML that Chromium, Firefox and Safari all render, has no use for:

- ``\\rule`` struts (they space the rows of a LaTeX array; the page's tables space themselves);
- ``\\!`` and ``\\mkern`` (negative and mu spaces: no MathML Core length);
- ``\\operatorname{x}`` as upright text, as LaTeX sets it, not an operator;
- ``\\hat{S}`` with its accent as an accent;
- ``\\left(-3\\right)`` around a plain number as plain brackets: Chromium spaces latex2mathml's
  stretchy fences apart from what they hold, ``( −3 )``, and a number needs no stretching;
- a minus sign right after an opening bracket, a relation or another operator, as in ``(-1)``
  or ``m = -3``, as a sign (``form="prefix"``): MathML Core makes an operator in the middle of
  a row infix, and spaces it as a subtraction, ``( − 1)``.

Every result is checked against a whitelist of MathML elements and attributes, so nothing but
math can ever come out (:func:`mathml` raises on anything else, an internal error).

A page converts thousands of formulas that differ only in their numbers (the entries of its
tables, the worked dot product of each entry) and share their pieces, so a formula is converted
piece by piece: split at its top-level ``=``, ``+``, ``\\cdot`` and ``\\approx`` (outside braces
and ``\\left…\\right``), each piece converted and finished on its own and the pieces joined by
the operators' elements. A piece is converted once per shape: its numbers that are operands of
their own written as 1, the digits of any other as zeros (``A_{12,3}`` and ``A_{1,45}`` share
one), the shape converted with a different number in each place, and a piece's own numbers put
back where those came out, used only when each came out as one ``<mn>``, in the order written.
A formula with anything whose meaning reaches past its neighbours (an environment, ``\\over``, a
style switch, an operator right after a command) is not split. What comes out is what
converting the formula at once gives (``tests/test_render_mathml.py`` compares the two on every
formula of the example pages and on formulas made to trip them).

The pieces that every plain page converts (its entries' shapes, the worked dot product, the
weights' formulas) are kept as latex2mathml wrote them (:mod:`.mathml_known`, made by
``python tests/test_render_mathml.py``, which checks each against latex2mathml): latex2mathml
and what it imports take a tenth of a second to import, so a page with nothing else never
imports it.
"""

from __future__ import annotations

import functools
import re

from .mathml_known import KNOWN

_RULE = re.compile(r"\\rule(\[[^\]]*\])?\{[^{}]*\}\{[^{}]*\}")
_OPERATORNAME = re.compile(r"\\operatorname\{([A-Za-z]+)\}")
_SPACES = re.compile(r"\\!|\\mkern-?[0-9.]+mu")
_NUMBER_IN_BRACKETS = re.compile(r"\\left\(\s*(-?\s*[0-9.]+)\s*\\right\)")
_SIGN = re.compile(
    r"(<mrow>|<math>|<math display=\"block\">|<mtd[^>]*>|<msub>|<msup>|<mfrac>"
    r"|<mo(?![^>]*postfix)[^>]*>(?!&#x00029;|&#x0005D;|&#x0007D;|&#x0007C;)[^<]*</mo>)<mo>&#x02212;</mo>"
)

_ELEMENTS = frozenset(
    "math mrow mi mn mo mtext mspace mfrac msqrt mroot msub msup msubsup munder mover munderover "
    "mtable mtr mtd mstyle mpadded mphantom menclose semantics annotation".split()
)
_ATTRIBUTES = frozenset(
    "xmlns display mathvariant stretchy fence form separator accent accentunder displaystyle "
    "scriptlevel width height depth lspace rspace columnalign columnlines rowlines columnspacing "
    "rowspacing frame framespacing movablelimits largeop symmetric minsize maxsize linethickness "
    "notation encoding".split()
)
_TAG = re.compile(r"<(/?)([A-Za-z][\w:-]*)((?:\s+[\w:-]+=\"[^\"<>]*\")*)\s*(/?)>")
_ATTRIBUTE = re.compile(r"([\w:-]+)=\"")


def convert(source: str, mode: str) -> str:
    """latex2mathml's ``<math>`` element of ``source`` (``mode``: ``inline`` or ``block``), as kept
    in :data:`~.mathml_known.KNOWN` or made now."""
    known = KNOWN[mode].get(source)
    if known is not None:
        return known
    from latex2mathml.converter import convert as latex2mathml

    return latex2mathml(source, display=mode)


class MathMLError(RuntimeError):
    """latex2mathml wrote something that is not plain MathML (a bug: the input is symattn's own)."""


@functools.lru_cache(maxsize=8192)
def mathml(tex: str, display: bool = False) -> str:
    """``tex`` as one ``<math>`` element (``display="block"`` for a display).

    >>> mathml("x_{1}")
    '<math><msub><mi>x</mi><mrow><mn>1</mn></mrow></msub></math>'
    >>> mathml(r"2 \\cdot \\left(-3\\right)")
    '<math><mn>2</mn><mo>&#x000B7;</mo><mo stretchy="false">&#x00028;</mo><mo form="prefix">&#x02212;</mo><mn>3</mn><mo stretchy="false">&#x00029;</mo></math>'
    """
    pieces = _pieces(tex) or [tex]
    inner = [_OPERATORS[piece] if k % 2 else _piece(piece, display) for k, piece in enumerate(pieces)]
    if None not in inner:
        return ('<math display="block">' if display else "<math>") + "".join(inner) + "</math>"
    return _finished(convert(_rewritten(tex), "block" if display else "inline"), tex)


@functools.lru_cache(maxsize=16384)
def _piece(tex: str, display: bool) -> "str | None":
    """One piece of a formula as it stands in the finished ``<math>`` element (see
    :func:`_finished_piece`), from its shape's template where it has one."""
    numbers = _NUMBERS.findall(tex)
    template = _template(_shape(tex), display) if numbers else None
    if template is not None:
        return _filled(template, numbers)
    return _finished_piece(tex, display)


# -- the same shape, other numbers -----------------------------------------------------------

_NUMBERS = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_DIGITS = re.compile(r"[0-9]")
_MN = re.compile(r"(?<=<mn>)([0-9]+(?:\.[0-9]+)?)(?=</mn>)")
_NOT_NUMBERS = re.compile(r"&#x[0-9A-Fa-f]+;|=\"[^\"]*\"|<mn>[0-9]+(?:\.[0-9]+)?</mn>")
_OPERAND_SIGNS = frozenset("-+=,(/[|")


def _shape(tex: str) -> str:
    """``tex`` with each number that is an operand of its own written as 1, and the digits of
    any other written as zeros.

    A number is an operand of its own when nothing could take its first digit alone as an
    argument (``\\frac12``, ``x^23``, ``\\frac-12``): when it opens the formula or a group, or
    follows a sign (``- ``, ``/``, ...) that opens the formula or a group or follows such a number.
    """
    out, last, free_end = [], 0, -1  # free_end: where the last number that is an operand ends
    for m in _NUMBERS.finditer(tex):
        k = _before(tex, m.start())
        free = k < 0 or tex[k] == "{"
        if not free and tex[k] in _OPERAND_SIGNS:
            b = _before(tex, k)
            free = b < 0 or tex[b] == "{" or b + 1 == free_end
        out += [tex[last:m.start()], "1" if free else _DIGITS.sub("0", m.group())]
        last = m.end()
        if free:
            free_end = m.end()
    out.append(tex[last:])
    return "".join(out)


def _before(tex: str, k: int) -> int:
    """The index of the last character before ``k`` that is not a space (-1: none)."""
    k -= 1
    while k >= 0 and tex[k] == " ":
        k -= 1
    return k


@functools.lru_cache(maxsize=4096)
def _template(shape: str, display: bool) -> "tuple[str, ...] | None":
    """The MathML of a piece's shape (see :func:`_finished_piece`) as the text around its
    numbers' ``<mn>`` contents; None unless each number comes out as one ``<mn>`` of its own, in
    the order written, and no other digit comes out (the piece is then converted as it is).

    The shape is converted with a different number in each place (the k-th is k, written with
    as many digits as a number that is not an operand of its own has), so that a number that
    comes out elsewhere, or in another order (``Z^{(1)}_{3}``: the subscript first), is seen.
    """
    marks = []
    for k, token in enumerate(_NUMBERS.findall(shape), start=1):
        if token == "1":  # an operand of its own: any number will do
            marks.append(str(k))
            continue
        digits = str(k).zfill(len(token.replace(".", "")))
        if len(digits) > len(token.replace(".", "")):
            return None
        it = iter(digits)
        marks.append("".join(c if c == "." else next(it) for c in token))
    it = iter(marks)
    try:
        out = _finished_piece(_NUMBERS.sub(lambda m: next(it), shape), display)
    except Exception:  # noqa: BLE001  (the piece as written is converted, and raises if it must)
        return None
    if out is None:
        return None
    parts = _MN.split(out)
    if parts[1::2] != marks or _DIGITS.search(_NOT_NUMBERS.sub("", out)):
        return None
    return tuple(parts[0::2])


def _filled(template: tuple[str, ...], numbers: list[str]) -> str:
    out = [template[0]]
    for number, text in zip(numbers, template[1:]):
        out += [number, text]
    return "".join(out)


def _rewritten(tex: str) -> str:
    """``tex`` with what latex2mathml does not know rewritten (see the module's list)."""
    source = _SPACES.sub("", _RULE.sub("", tex))
    source = _OPERATORNAME.sub(r"\\text{\1}", source)
    return _NUMBER_IN_BRACKETS.sub(r"(\1)", source)


def _finished(out: str, tex: str) -> str:
    """latex2mathml's ``<math>`` element of ``tex`` as the page writes it, checked."""
    out = out.replace(' xmlns="http://www.w3.org/1998/Math/MathML"', "")
    out = out.replace('<math display="inline">', "<math>")
    # latex2mathml wraps every formula in one more mrow: drop it
    if out.startswith("<math><mrow>") and out.endswith("</mrow></math>") and _balanced(out[12:-14]):
        out = "<math>" + out[12:-14] + "</math>"
    elif out.startswith('<math display="block"><mrow>') and out.endswith("</mrow></math>") and _balanced(out[28:-14]):
        out = '<math display="block">' + out[28:-14] + "</math>"
    # ∞ is a number and ∂ a letter, not operators (so −∞ and ∂L/∂O are set unspaced)
    out = out.replace("<mo>&#x0221E;</mo>", "<mi>&#x0221E;</mi>").replace("<mo>&#x02202;</mo>", "<mi>&#x02202;</mi>")
    out = out.replace("<mo>&#x0002F;</mo>", '<mo lspace="0" rspace="0">&#x0002F;</mo>')  # a/b, as LaTeX sets it
    # a minus that opens a group or follows another operator is a sign, as TeX sets it: (−1), = −3
    out = _SIGN.sub(r'\1<mo form="prefix">&#x02212;</mo>', out)
    # brackets around one row of plain numbers (a value row v_j in a weighted sum) at the text's size:
    # Chromium stretches them past the row and draws them in pieces, with seams
    out = _ONE_ROW.sub(lambda m: m.group(0) if _TALL.search(m.group(2)) else
                       f'<mo stretchy="false">{m.group(1)}</mo><mtable>{m.group(2)}</mtable><mo stretchy="false">{m.group(3)}</mo>', out)
    _check(out, tex)
    return out


_ONE_ROW = re.compile(r"<mo>(&#x0005B;|&#x00028;)</mo><mtable>(<mtr>(?:(?!<mtr>|<mtable>|</mtable>).)*</mtr>)</mtable>"
                      r"<mo>(&#x0005D;|&#x00029;)</mo>")
_TALL = re.compile(r"<(?:mfrac|msqrt|mroot|munder|mover)\b")


# -- piece by piece ------------------------------------------------------------------------

# The operators a formula is split at, as latex2mathml writes each between two pieces.
_OPERATORS = {" = ": "<mo>&#x0003D;</mo>", " + ": "<mo>&#x0002B;</mo>", " \\cdot ": "<mo>&#x000B7;</mo>",
              " \\approx ": "<mo>&#x02248;</mo>"}
_SPLIT = re.compile(r"\\[{}]|[{}]|\\(?:left|right)(?![A-Za-z])| = | \+ | \\cdot | \\approx ")
# What reaches past its neighbours, or what the splitting cannot see: such a formula is converted whole.
_WHOLE = re.compile(r"&|%|\\\\|\\(?:begin|end|over|choose|atop|brace|brack|middle|displaystyle|textstyle|scriptstyle"
                    r"|scriptscriptstyle|rm|bf|it|sf|tt|cal|limits|nolimits|color|newcommand|def)(?![A-Za-z])")
# A piece that ends in ^, _ or a command (other than a symbol's) could leave the operator after it
# to be taken as an argument: such a formula is converted whole.
_AWAITS = re.compile(r"(?:\\(?!(?:cdots|ldots|dots|infty|quad|qquad)\s*$)[A-Za-z]+|[\^_])\s*$")
_WRAP = ('<math xmlns="http://www.w3.org/1998/Math/MathML" display="', '"><mrow>', "</mrow></math>")


def _pieces(tex: str) -> "list[str] | None":
    """The formula's pieces and the operators between them (``[piece, " = ", piece, ...]``);
    None when it is one piece, or is to be converted whole."""
    if not any(op in tex for op in _OPERATORS) or _WHOLE.search(tex):
        return None
    pieces, depth, start = [], 0, 0
    for m in _SPLIT.finditer(tex):
        token = m.group()
        if token in ("{", "\\left"):
            depth += 1
        elif token in ("}", "\\right"):
            depth -= 1
            if depth < 0:
                return None
        elif token in _OPERATORS and depth == 0:
            if _AWAITS.search(tex, start, m.start()):  # the operator could be an argument
                return None
            pieces += [tex[start:m.start()], token]
            start = m.end()
    pieces.append(tex[start:])
    return None if depth or len(pieces) == 1 else pieces


def _finished_piece(tex: str, display: bool) -> "str | None":
    """One piece of a formula as it stands in the finished ``<math>`` element, checked; None when
    the piece is empty or not a plain row of elements (the formula is then converted whole).

    Finishing a piece on its own finishes it as in the formula: a minus that opens it is a
    sign there too, after an operator, and nothing else the rewrites see crosses an operator.
    """
    mode = "block" if display else "inline"
    if not tex.strip():
        return None
    out = convert(_rewritten(tex), mode)
    head, tail = _WRAP[0] + mode + _WRAP[1], _WRAP[2]
    if not (out.startswith(head) and out.endswith(tail) and _balanced(out[len(head):-len(tail)])):
        return None
    try:
        out = _finished(out, tex)
    except MathMLError:  # the whole formula is converted, and says so
        return None
    start = len('<math display="block">' if display else "<math>")
    return out[start:-len("</math>")]


def _balanced(inner: str) -> bool:
    """Whether ``inner`` is a sequence of whole elements (its first mrow closes at its end only)."""
    depth = 0
    for m in re.finditer(r"<(/?)mrow\b[^>]*?(/?)>", inner):
        if m.group(2):
            continue
        depth += -1 if m.group(1) else 1
        if depth < 0:
            return False
    return depth == 0


def _check(out: str, tex: str) -> None:
    rest = _TAG.sub("", out)
    if "<" in rest or ">" in rest:
        raise MathMLError(f"unexpected markup converting {tex!r}")
    for m in _TAG.finditer(out):
        if m.group(2) not in _ELEMENTS:
            raise MathMLError(f"element <{m.group(2)}> converting {tex!r}")
        for name in _ATTRIBUTE.findall(m.group(3)):
            if name not in _ATTRIBUTES:
                raise MathMLError(f"attribute {name} converting {tex!r}")
    if re.search(r">\\[A-Za-z]", out):
        raise MathMLError(f"a LaTeX command latex2mathml does not know, converting {tex!r}")
