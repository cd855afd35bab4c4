"""Numbers as the renderers write them: decimals, exact entries, sums of ``c·e^x`` terms.

Every function has a LaTeX form (``*_tex``) and a plain-text form (``*_text``) where both are
needed; the ``qq_*`` and ``exp_parts_*`` forms write QQ numbers without building a SymPy number.
"""

from __future__ import annotations

import functools
import re

import mpmath
import sympy

from ..problem.rope import plain_angle
from .latex_tokens import inline_script_fractions, script_tex

NEG_INF = sympy.S.NegativeInfinity
# Decimals are rounded from values worked to this many digits: the cross-check's own, so each
# stage is evaluated once.
DPS = 30


def decimal(x: mpmath.mpf, digits: int) -> str:
    """``x`` to ``digits`` significant figures, without trailing zeros.

    >>> decimal(mpmath.mpf(1) / 3, 4)
    '0.3333'
    >>> decimal(mpmath.mpf(2), 4)
    '2'
    """
    if mpmath.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x == 0:
        return "0"
    text = mpmath.nstr(x, digits, min_fixed=-5, max_fixed=digits + 1, strip_zeros=True)
    if text.endswith(".0"):
        text = text[:-2]
    return text


def is_plain_integer(x: sympy.Expr) -> bool:
    return isinstance(x, sympy.Integer)


def tex(x: sympy.Expr) -> str:
    """LaTeX of one exact entry."""
    if isinstance(x, sympy.Rational):
        return qq_tex(x)  # what sympy.latex writes, without its printer
    if x == NEG_INF:
        return "-\\infty"
    return _tex(x)


@functools.lru_cache(maxsize=8192)  # an entry is written in its matrix, in a worked step, in a tooltip
def _tex(x: sympy.Expr) -> str:
    # fractions in exponents inline (e^{-3 \\sqrt{2}/2}): a \\frac there is too small to read
    written = trig_sum_tex(x)
    return inline_script_fractions(sympy.latex(x) if written is None else written)


def trig_sum_tex(x: sympy.Expr) -> "str | None":
    r"""What ``sympy.latex`` writes for a rational combination of cosines and sines of plain angles
    (rationals, or rationals times rational powers of positive rationals), each term perhaps times
    one square root (a rotary score, scaled or not: ``a cos 1 + b √2 sin(1/100)
    + c``), without its printer; None for any other expression, or where two terms are too close
    in value to order them as SymPy does.

    SymPy orders such a sum's terms by their values, ascending (each term is a number), except
    that a positive number comes first before one negative product of two factors:

    >>> print(trig_sum_tex(sympy.Rational(-5, 2) * sympy.cos(sympy.Rational(1, 100)) + sympy.cos(1) + sympy.Rational(1, 3)))
    - \frac{5 \cos{\left(\frac{1}{100} \right)}}{2} + \frac{1}{3} + \cos{\left(1 \right)}
    """
    terms = []
    for term in sympy.Add.make_args(x):
        split = _trig_term(term)
        if split is None:
            return None
        terms.append(split)
    args = sympy.Add.make_args(x)
    if len(args) == 2 and isinstance(args[0], sympy.Rational) and args[0] > 0 and isinstance(args[1], sympy.Mul) \
            and len(args[1].args) == 2 and isinstance(args[1].args[0], sympy.Number) and args[1].args[0] < 0:
        ordered = terms  # SymPy's one exception: "2 - 3 sin(1)", the number first
    else:
        values = [float(c) * _factor_value(factors) for c, factors in terms]
        order = sorted(range(len(terms)), key=values.__getitem__)
        if any(abs(values[a] - values[b]) <= 1e-9 * max(abs(values[a]), abs(values[b]))
               for a, b in zip(order, order[1:])):
            return None  # near ties: SymPy's own 15-digit values decide
        ordered = [terms[k] for k in order]
    out = ""
    for k, (c, factors) in enumerate(ordered):
        if k:
            out += " - " if c < 0 else " + "
            c = abs(c)
        out += _trig_term_tex(c, factors)
    return out


def _trig_term(term: sympy.Expr):
    """``term`` as ``(c, factors)``: ``c`` rational times ``factors``, a tuple of at most one
    square root of an integer and at most one cosine or sine of a plain angle, in SymPy's order;
    None for anything else."""
    if isinstance(term, sympy.Rational):
        return term, ()
    args = term.args if isinstance(term, sympy.Mul) else (term,)
    c = args[0] if isinstance(args[0], sympy.Rational) else sympy.Integer(1)
    factors = args[1:] if isinstance(args[0], sympy.Rational) else args
    if not factors or len(factors) > 2:
        return None
    for k, f in enumerate(factors):
        if isinstance(f, (sympy.cos, sympy.sin)) and is_plain_angle(f.args[0]) and k == len(factors) - 1:
            continue
        if isinstance(f, sympy.Pow) and isinstance(f.base, sympy.Integer) and f.base > 0 and f.exp == sympy.S.Half and k == 0:
            continue
        return None
    return c, tuple(factors)


# RoPE's angles, t·base^(-2i/d_k) (SymPy writes 3·10^{5/8}/10), or rationals: the same few in every score
is_plain_angle = functools.lru_cache(maxsize=8192)(plain_angle)


@functools.lru_cache(maxsize=8192)  # the same angles and roots in every score
def _factor_value(factors: tuple) -> float:
    return float(sympy.Mul(*factors)) if factors else 1.0


@functools.lru_cache(maxsize=8192)
def _factor_tex(f: sympy.Expr) -> str:
    if isinstance(f, sympy.Pow):
        return f"\\sqrt{{{f.base}}}"
    angle = f.args[0]
    angle_tex = qq_tex(angle) if isinstance(angle, sympy.Rational) else sympy.latex(angle)
    return f"\\{type(f).__name__}{{\\left({angle_tex} \\right)}}"


def _trig_term_tex(c, factors: tuple) -> str:
    """One term as ``sympy.latex`` writes it: ``3 \\sin{...}``, ``- \\frac{3 \\sqrt{2} \\sin{...}}{7}``."""
    if not factors:
        return qq_tex(c)
    sign, p, q = ("- " if c < 0 else ""), abs(int(c.p)), int(c.q)
    top = " ".join(([] if p == 1 else [str(p)]) + [_factor_tex(f) for f in factors])
    return sign + (top if q == 1 else f"\\frac{{{top}}}{{{q}}}")


def qq_tex(x) -> str:
    """LaTeX of a rational (a SymPy Rational or a QQ number), exactly as ``sympy.latex`` writes it."""
    p, q = int(x.numerator), int(x.denominator)
    if q == 1:
        return str(p)
    return f"- \\frac{{{-p}}}{{{q}}}" if p < 0 else f"\\frac{{{p}}}{{{q}}}"


def qq_text(x) -> str:
    """Plain text of a rational, exactly as ``sympy.sstr`` writes it."""
    p, q = int(x.numerator), int(x.denominator)
    return str(p) if q == 1 else f"{p}/{q}"


def _exp_split(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``term`` as ``(c, x)`` with ``term = c·e^x`` and ``c`` free of exponentials, if it is one."""
    coeff, exponent = [], []
    for f in sympy.Mul.make_args(term):
        if isinstance(f, sympy.exp):
            exponent.append(f.args[0])
        elif f is sympy.E:
            exponent.append(sympy.Integer(1))
        elif f.has(sympy.exp) or f.has(sympy.E):
            return None
        else:
            coeff.append(f)
    return sympy.Mul(*coeff), sympy.Add(*exponent)


def exp_sum_tex(expr: sympy.Expr, max_terms: int = 6) -> str:
    """A sum of terms ``c·e^x`` in LaTeX, the largest exponent first.

    >>> exp_sum_tex(2*sympy.exp(-2) + 1 + sympy.exp(-1))
    '1 + e^{-1} + 2 e^{-2}'
    """
    return _exp_sum(expr, tex, lambda x: f"e^{{{script_tex(tex(x))}}}", "\\left({}\\right)", " ", "\\cdots", max_terms)


def exp_sum_text(expr: sympy.Expr, max_terms: int = 6) -> str:
    """The same in plain text.

    >>> exp_sum_text(2*sympy.exp(-2) + 1 + sympy.exp(-1))
    '1 + exp(-1) + 2*exp(-2)'
    """
    return _exp_sum(expr, text_entry, lambda x: f"exp({text_entry(x)})", "({})", "*", "...", max_terms)


def text_entry(x: sympy.Expr) -> str:
    """Plain text of one exact entry (``sympify`` reads it back)."""
    return "-inf" if x == NEG_INF else sympy.sstr(x, order="none")


def value_tex(x) -> str:
    """LaTeX of an exact entry given as a SymPy expression or as a QQ number."""
    return tex(x) if isinstance(x, sympy.Basic) else qq_tex(x)


def value_text(x) -> str:
    """Plain text of the same."""
    return text_entry(x) if isinstance(x, sympy.Basic) else qq_text(x)


MAX_TERMS = 6  # terms of a sum written before it is elided
MAX_CELL_TERMS = 3  # the same inside a matrix of more than four columns


def _exp_sum(expr, show, power_of, paren: str, times: str, ellipsis: str, max_terms: int = 6) -> str:
    parts = []
    for term in sympy.Add.make_args(expr):
        split = _exp_split(term)
        if split is None:
            return show(expr)
        parts.append(split)
    parts.sort(key=lambda cx: _descending(cx[1]))
    return _exp_parts(parts, show, power_of, paren, times, ellipsis, max_terms)


@functools.lru_cache(maxsize=4096)
def _descending(x: sympy.Expr) -> float:
    """The sort key that writes the largest exponent first (remembered: exponents recur)."""
    return -float(x) if x.is_number else 0.0


def exp_parts_tex(parts: list, max_terms: int = 6) -> str:
    """LaTeX of ``Σ c·e^x`` from exact ``(c, x)`` pairs in QQ, already in order (see
    ``SoftmaxRow.numerator_parts``): what :func:`exp_sum_tex` writes for the same sum."""
    return _exp_parts(parts, qq_tex, lambda x: f"e^{{{script_tex(qq_tex(x))}}}", "\\left({}\\right)", " ", "\\cdots", max_terms)


def exp_parts_text(parts: list, max_terms: int = 6) -> str:
    """Plain text of the same (what :func:`exp_sum_text` writes)."""
    return _exp_parts(parts, qq_text, lambda x: f"exp({qq_text(x)})", "({})", "*", "...", max_terms)


def _exp_parts(parts: list, show, power_of, paren: str, times: str, ellipsis: str, max_terms: int) -> str:
    if not parts:
        return "0"
    if len(parts) > max_terms:  # a long sum: its first terms and its last (the JSON has every term)
        parts = parts[: max_terms // 2] + [None] + parts[-1:]
    out = ""
    for k, part in enumerate(parts):
        if part is None:
            out += f" + {ellipsis}"
            continue
        c, x = part
        power = "" if x == 0 else power_of(x)
        if not power:
            body = show(c)
        elif c == 1:
            body = power
        elif c == -1:
            body = "-" + power
        elif isinstance(c, sympy.Add):
            body = paren.format(show(c)) + times + power
        else:
            body = show(c) + times + power
        if k and body.startswith("-"):
            out += " - " + body[1:]
        elif k:
            out += " + " + body
        else:
            out += body
    return out


def tex_decimal(v, digits: int) -> str:
    if mpmath.isinf(v):
        return "-\\infty"
    text = decimal(v, digits)
    m = re.fullmatch(r"(-?[0-9.]+)e([-+]?)0*([0-9]+)", text)
    if m:
        sign = "-" if m.group(2) == "-" else ""
        return f"{m.group(1)}\\times 10^{{{sign}{m.group(3)}}}"
    return text


def factor_tex(x: sympy.Expr) -> str:
    """An entry as a factor in a product: negatives and sums in parentheses."""
    s = tex(x)
    if s.startswith("-") or isinstance(x, sympy.Add):
        return f"\\left({s}\\right)"
    return s
