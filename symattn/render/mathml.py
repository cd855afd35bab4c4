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
"""

from __future__ import annotations

import functools
import re

from latex2mathml.converter import convert

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
    source = _SPACES.sub("", _RULE.sub("", tex))
    source = _OPERATORNAME.sub(r"\\text{\1}", source)
    source = _NUMBER_IN_BRACKETS.sub(r"(\1)", source)
    out = convert(source, display="block" if display else "inline")
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
    _check(out, tex)
    return out


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
