"""A rotary score's exponent written without SymPy's printer (symattn/render/numbers.py,
``trig_sum_tex``): it must be, character for character, what ``sympy.latex`` writes, which is
what every document held before."""

from __future__ import annotations

import mpmath
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from symattn.render.numbers import _tex, trig_sum_tex

rationals = st.builds(lambda p, q: sympy.Rational(p, q),
                      st.integers(-10**30, 10**30), st.integers(1, 10**27) | st.sampled_from([1, 2, 7, 2**53]))
rational_angles = st.sampled_from([1, 2, sympy.Rational(1, 100), sympy.Rational(1, 10000), sympy.Rational(3, 7),
                                   sympy.Rational(1, 2**20), 10, sympy.Rational(7, 3)])
# RoPE's own angles: a position (or offset) times base^(-2i/d_k), which SymPy writes 3·10^(5/8)/10
rope_angles = st.builds(lambda t, base, i, d: t * sympy.Integer(base) ** sympy.Rational(-2 * i, d),
                        st.integers(1, 300), st.sampled_from([10000, 500000, 2, 7]), st.integers(1, 31),
                        st.sampled_from([8, 64, 128]))
angles = rational_angles | rope_angles
roots = st.sampled_from([1, 1, 2, 3, 6, 8, 10])  # 1: none; 8: SymPy writes 2√2
terms = st.tuples(rationals, st.sampled_from([sympy.cos, sympy.sin, None]), angles, roots)


def built(parts) -> sympy.Expr:
    return sympy.Add(*[c * sympy.sqrt(r) * (1 if f is None else f(a)) for c, f, a, r in parts])


@settings(max_examples=1000, deadline=None)
@given(st.lists(terms, min_size=1, max_size=12))
def test_what_sympy_latex_writes(parts):
    x = built(parts)
    written = trig_sum_tex(x)
    if written is None:  # another form (a lone rational, 0) or a near tie: SymPy writes it
        return
    assert written == sympy.latex(x), x


def test_the_special_order_and_the_signs():
    s1, c1, c2 = sympy.sin(1), sympy.cos(1), sympy.cos(sympy.Rational(1, 100))
    for x in (2 - 3 * s1, -2 + 3 * s1, 2 + c1, -s1 - c1, sympy.Rational(1, 3) - s1, -s1 / 7, s1 / 7, -s1,
              sympy.Rational(-5, 2) * c2 + sympy.Rational(1, 3) + c1, 3 * sympy.cos(sympy.Rational(5, 3)), c1,
              2 - s1, 1 - sympy.sqrt(2) * s1, sympy.Rational(1, 3) - sympy.sqrt(2), sympy.sqrt(2) / 2, -sympy.sqrt(3),
              sympy.sqrt(2) / 3 - sympy.sqrt(2) * s1, sympy.Rational(-3, 7) * sympy.sqrt(6) * c2,
              sympy.cos(sympy.sqrt(2)), sympy.Rational(2, 9) * sympy.sin(sympy.Integer(10000) ** sympy.Rational(-5, 32) * 7) - c1):
        assert trig_sum_tex(x) == sympy.latex(x), x


def test_other_forms_are_left_to_sympy():
    for x in (sympy.sqrt(2) * sympy.sqrt(3) * sympy.cos(1) + sympy.exp(2), sympy.cos(1 + sympy.sqrt(2)), sympy.cos(sympy.pi / 7), sympy.cbrt(2) * sympy.cos(1),
              sympy.sqrt(sympy.Rational(1, 2)) * sympy.cos(1) * sympy.sin(1), sympy.exp(1) + sympy.cos(1),
              sympy.Symbol("x") + sympy.sin(1), sympy.cos(1) ** 2 + sympy.sin(1)):
        assert trig_sum_tex(x) is None
        assert _tex(x) == _tex.__wrapped__(x)
    # two terms equal in value to 13 digits: SymPy's own 15-digit values order them, not a float here
    d = sympy.Rational(round(mpmath.cos(1) / mpmath.sin(1) * 10**13), 10**13)
    assert trig_sum_tex(sympy.cos(1) + d * sympy.sin(1)) is None
