"""The numerator of a diagonal softmax-Jacobian entry, ``expand(t_j·(Z − t_j))``, built directly
where one factor is 1 (symattn/render/entries.py, ``jacobian_diagonal_top``): it must be the very
expression SymPy's ``expand`` builds (equal and with the same tree), which is what every document
printed before."""

from __future__ import annotations

import importlib

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import symattn
from symattn.render.entries import jacobian_diagonal_top

rationals = st.builds(lambda p, q: sympy.Rational(p, q), st.integers(-10**20, 10**20), st.integers(1, 10**18))
rope_angles = st.builds(lambda t, i, d: t * sympy.Integer(10000) ** sympy.Rational(-2 * i, d),
                        st.integers(1, 300), st.integers(0, 31), st.sampled_from([8, 64]))
angles = st.sampled_from([1, sympy.Rational(1, 10), sympy.Rational(3, 7)]) | rope_angles
factors = st.sampled_from([1, sympy.sqrt(2), sympy.sqrt(3), sympy.Integer(10) ** sympy.Rational(3, 8)])
# a term of an exponent: a rational, c·√r·cos(θ) or sin(θ), and now and then one the fast path
# does not read (π, a logarithm, a symbol), which must go to expand and come back the same
plain = st.builds(lambda c, f, g, a: c * f * (1 if g is None else g(a)), rationals, factors,
                  st.sampled_from([sympy.cos, sympy.sin, None]), angles)
other = st.sampled_from([sympy.pi / 3, sympy.log(2), sympy.Symbol("x"), sympy.I * sympy.pi])
exponent_terms = st.lists(plain | st.sampled_from([sympy.Integer(1), sympy.Integer(-1)]), min_size=1, max_size=6) \
    | st.lists(plain | other, min_size=1, max_size=4)


def power(terms):
    x = sympy.Add(*terms)
    return sympy.exp(x) if x.is_Rational else sympy.exp(x, evaluate=False)


# a row's terms: 1 for its largest score, powers of e for the rest; a repeated power is a tie
rows = st.lists(exponent_terms, min_size=1, max_size=5).map(lambda es: [sympy.Integer(1)] + [power(e) for e in es])


@settings(max_examples=400, deadline=None)
@given(rows, st.data())
def test_what_expand_builds(terms, data):
    if data.draw(st.booleans()):
        terms = terms + [terms[-1]]  # a tie: Z collects the two equal powers as 2·e^x
    z = sympy.Add(*terms)
    j = data.draw(st.integers(0, len(terms) - 1))
    built, expected = jacobian_diagonal_top(terms[j], z), sympy.expand(terms[j] * (z - terms[j]))
    assert built == expected and sympy.srepr(built) == sympy.srepr(expected), (terms, j)


def test_by_hand():
    c = sympy.cos(sympy.Rational(1, 10), evaluate=False)
    e = sympy.exp(sympy.Rational(-1, 2) + 3 * c, evaluate=False)
    z = 1 + e
    # e^{-1/2 + 3cos(1/10)} is written as SymPy's expand writes it: e^{-1/2}·e^{3cos(1/10)}
    for t in (sympy.Integer(1), e):
        assert jacobian_diagonal_top(t, z).args == sympy.Mul(sympy.exp(sympy.Rational(-1, 2)), sympy.exp(3 * c)).args
    # e^1 is E, as SymPy evaluates it; and a row of three keys, seen from its largest
    e1 = sympy.exp(1 + sympy.sqrt(2) * c, evaluate=False)
    assert jacobian_diagonal_top(sympy.Integer(1), 1 + e + e1) == sympy.expand(e + e1)
    assert sympy.E in sympy.Mul.make_args(jacobian_diagonal_top(sympy.Integer(1), 1 + e1))
    # neither factor 1: left to expand
    assert jacobian_diagonal_top(e, 1 + e + e1) == sympy.expand(e * (1 + e1))


def test_a_rotary_jacobian_is_not_expanded(monkeypatch):
    """The shown Jacobian of a rotary problem (row 2: two keys, one of them the largest) is built
    without a single call of ``expand``, and is what ``expand`` builds."""
    entries = importlib.import_module("symattn.render.entries")
    text = "\n".join([
        "X: [[1, 0, 2], [0, 1, 1], [2, 1, 0]]", "W_Q: [[1, 0], [0, 1], [1, 1]]", "W_K: [[0, 1], [1, 0], [1, 2]]",
        "W_V: [[1, 1], [0, 1], [1, 0]]", "mask: causal", "rope: {base: 10000}", "backward: {loss: sum}", ""])
    d = symattn.derive(symattn.load_problem(text))
    step = next(s for s in d.steps if s.jacobian)
    row = step.jacobian[entries.jacobian_row(step)]
    assert entries.jacobian_row(step) == 1 and not row.normaliser_is_number
    expected = [sympy.expand(row.terms[j] * (row.normaliser - row.terms[j])) for j in range(2)]
    calls = []
    expand = sympy.expand
    monkeypatch.setattr(sympy, "expand", lambda *a, **k: calls.append(a) or expand(*a, **k))
    built = [entries.jacobian_form(row, 1, j, j).over[0].numerator for j in range(2)]
    assert calls == [] and built == expected
    assert all(isinstance(t, sympy.exp) and len(t.args[0].args) > 2 for t in (row.terms[0], row.terms[1]) if t != 1)
