"""Reading LaTeX math as text, and rewriting its fractions: one size in a matrix, inline in scripts.

A small tokenizer (control sequences, braced groups, optional arguments) that never fails,
whatever the text: :mod:`symattn.render.measure` measures with it too.
"""

from __future__ import annotations

import re

COMMAND = re.compile(r"\\([A-Za-z]+|.)")
_BRACE = re.compile(r"[{}]")
# Runs of text that a rewrite copies as they are (the tokenizer stops only at these
# characters): a 16-digit numerator is one step, not sixteen.
_PLAIN = re.compile(r"[^\\^_{]+")
_PLAIN_OUTSIDE_SCRIPTS = re.compile(r"[^\\^_]+")


def braced_group(s: str, k: int) -> tuple[str, int]:
    """The braced group starting at ``s[k]`` (or the single token there) and the index after it."""
    while k < len(s) and s[k] == " ":
        k += 1
    if k >= len(s):
        return "", k
    if s[k] == "{":
        depth = 0
        for m in _BRACE.finditer(s, k):  # only the braces count
            if m.group() == "{":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    e = m.start()
                    return s[k + 1 : e], e + 1
        return s[k + 1 :], len(s)
    if s[k] == "\\":
        return _command(s, k)
    return s[k], k + 1


def optional_argument(s: str, k: int) -> tuple[str | None, int]:
    """An optional ``[...]`` argument at ``s[k]``."""
    j = k
    while j < len(s) and s[j] == " ":
        j += 1
    if j < len(s) and s[j] == "[":
        e = s.find("]", j)
        if e < 0:  # unclosed: the rest of the text
            return s[j + 1 :], len(s)
        return s[j + 1 : e], e + 1
    return None, k


def _command(s: str, k: int) -> tuple[str, int]:
    """The control sequence at ``s[k]`` (a backslash) and where it ends; a backslash that ends
    the text stands alone, so a rewrite never fails."""
    m = COMMAND.match(s, k)
    return (m.group(0), m.end()) if m else (s[k], k + 1)


# --- fractions ---------------------------------------------------------------------------------

_FRAC = re.compile(r"\\[dt]?frac(?![A-Za-z])")


def _is_sum(t: str) -> bool:
    """Whether ``t`` has a ``+`` or a binary ``-`` outside braces and parentheses."""
    depth = 0
    for k, ch in enumerate(t):
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        elif depth == 0 and (ch == "+" or (ch == "-" and t[:k].strip())):
            return True
    return False


def _is_atom(t: str) -> bool:
    """A number, one letter, or one command with its argument: a denominator needing no parentheses."""
    t = t.strip()
    return re.fullmatch(r"[0-9.]+|[A-Za-z]|\\[A-Za-z]+(\{[^{}]*\})?", t) is not None


def inline_script_fractions(tex: str) -> str:
    """Fractions inside exponents and subscripts written inline, ``a/b``, so they stay legible.

    >>> inline_script_fractions(r"e^{- \\frac{3 \\sqrt{2}}{2}}")
    'e^{- 3 \\\\sqrt{2}/2}'
    >>> inline_script_fractions(r"\\frac{e^{\\frac{1}{2}}}{2}")
    '\\\\frac{e^{1/2}}{2}'
    """
    if "frac" not in tex or ("^" not in tex and "_" not in tex):
        return tex
    return _rewrite(tex, in_script=False)


def script_tex(tex: str) -> str:
    """``tex`` as it is written inside an exponent: its fractions inline.

    >>> script_tex(r"- \\frac{407}{8}")
    '- 407/8'
    """
    return _rewrite(tex, in_script=True) if "frac" in tex else tex


def _rewrite(s: str, in_script: bool) -> str:
    out: list[str] = []
    k = 0
    while k < len(s):
        ch = s[k]
        if ch in "^_":
            body, k = braced_group(s, k + 1)
            out.append(ch + "{" + _rewrite(body, True) + "}")
            continue
        m = _FRAC.match(s, k)
        if m:
            num, k = braced_group(s, m.end())
            den, k = braced_group(s, k)
            num, den = _rewrite(num, in_script), _rewrite(den, in_script)
            if in_script:
                num = f"({num})" if _is_sum(num) else num
                den = den if _is_atom(den) else f"({den})"
                out.append(f"{num}/{den}")
            else:
                out.append(f"{m.group(0)}{{{num}}}{{{den}}}")
            continue
        if ch == "{":
            body, k = braced_group(s, k)
            out.append("{" + _rewrite(body, in_script) + "}")
            continue
        if ch == "\\":
            command, k = _command(s, k)
            out.append(command)
            continue
        plain = _PLAIN.match(s, k)
        out.append(plain.group())
        k = plain.end()
    return "".join(out)


def display_fractions(tex: str) -> str:
    """Every outermost fraction outside scripts written as ``\\dfrac``: one fraction size in a matrix.

    >>> display_fractions(r"- \\frac{1}{2} + e^{\\frac{1}{2}}")
    '- \\\\dfrac{1}{2} + e^{\\\\frac{1}{2}}'
    """
    out: list[str] = []
    k = 0
    while k < len(tex):
        ch = tex[k]
        if ch in "^_":
            body, e = braced_group(tex, k + 1)
            out.append(tex[k:e])
            k = e
            continue
        m = _FRAC.match(tex, k)
        if m:  # a fraction inside this one's numerator or denominator keeps its (smaller) size
            num, e = braced_group(tex, m.end())
            den, e = braced_group(tex, e)
            out.append(f"\\dfrac{{{num}}}{{{den}}}")
            k = e
            continue
        if ch == "\\":
            command, k = _command(tex, k)
            out.append(command)
            continue
        plain = _PLAIN_OUTSIDE_SCRIPTS.match(tex, k)
        out.append(plain.group())
        k = plain.end()
    return "".join(out)


def has_fraction(tex: str) -> bool:
    return _FRAC.search(tex) is not None
