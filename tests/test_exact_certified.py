"""Ball arithmetic for exact reals (symattn.exact.certified): every ball holds the true value, computed
independently by mpmath at 120 digits from the same formula written here, and is as narrow as asked."""

import mpmath
import pytest
import sympy

from symattn import derive, load_problem
from symattn.exact.certified import certified
from symattn.exact.evaluation import to_mpf

r = sympy.Rational
s2, s3 = sympy.sqrt(2), sympy.sqrt(3)

# (an exact SymPy real, the same number as mpmath computes it at the working precision)
CASES = [
    (50 * sympy.tanh(r(3, 50) / s2), lambda: 50 * mpmath.tanh(mpmath.mpf(3) / 50 / mpmath.sqrt(2))),
    (5 * sympy.tanh(r(-17, 5)), lambda: 5 * mpmath.tanh(mpmath.mpf(-17) / 5)),
    (sympy.exp(-s3 / 7), lambda: mpmath.exp(-mpmath.sqrt(3) / 7)),
    (sympy.erf(r(1, 3)) * sympy.pi, lambda: mpmath.erf(mpmath.mpf(1) / 3) * mpmath.pi),
    (2 ** r(-5, 7), lambda: mpmath.mpf(2) ** (mpmath.mpf(-5) / 7)),
    (1 / sympy.sqrt(r(2, 3) + r(1, 10**6)), lambda: 1 / mpmath.sqrt(mpmath.mpf(2) / 3 + mpmath.mpf(1) / 10**6)),
    (sympy.E ** (s2 - 3) + sympy.log(r(7, 2)), lambda: mpmath.e ** (mpmath.sqrt(2) - 3) + mpmath.log(mpmath.mpf(7) / 2)),
    (sympy.cos(r(1, 3)) * sympy.sin(r(2, 7)), lambda: mpmath.cos(mpmath.mpf(1) / 3) * mpmath.sin(mpmath.mpf(2) / 7)),
    (sympy.Float(0.1) * s2, lambda: mpmath.mpf(0.1) * mpmath.sqrt(2)),  # the binary float itself, exactly
    (r(1, 3 * 10**40) + s2 / 10**40, lambda: (mpmath.mpf(1) / 3 + mpmath.sqrt(2)) * mpmath.mpf(10) ** -40),
    (3 ** s2, lambda: mpmath.mpf(3) ** mpmath.sqrt(2)),
]


@pytest.mark.parametrize("expr, truth", CASES, ids=[str(e)[:30] for e, _ in CASES])
@pytest.mark.parametrize("dps", [15, 30, 60])
def test_the_ball_holds_the_true_value_and_is_narrow(expr, truth, dps):
    ball = certified(expr, dps)
    assert ball is not None
    with mpmath.workdps(120):
        true = truth()
        mid, rad = (mpmath.mpf(x) for x in (ball.mid().str(130, radius=False), ball.rad().str(5, radius=False)))
        assert abs(mid - true) <= rad * (1 + mpmath.mpf(10) ** -3) + abs(true) * mpmath.mpf(10) ** -125
        assert rad <= abs(true) * mpmath.mpf(10) ** -dps


@pytest.mark.parametrize("expr, truth", CASES, ids=[str(e)[:30] for e, _ in CASES])
def test_to_mpf_is_good_to_every_digit_asked(expr, truth):
    with mpmath.workdps(120):
        true = truth()
    with mpmath.workdps(50):
        value = to_mpf(expr, 40)
        assert abs(value - true) <= abs(true) * mpmath.mpf(10) ** -45


def test_what_balls_cannot_follow_falls_back_to_sympy():
    x = sympy.Symbol("x")
    assert certified(x + 1, 15) is None                     # a symbol has no value
    assert certified(sympy.gamma(r(1, 3)), 15) is None      # a function outside the table
    zero = sympy.Add(s2 * s3, -sympy.sqrt(6), evaluate=False)  # an exact 0 the balls cannot pin down
    assert certified(zero, 15) is None
    assert abs(to_mpf(zero, 15)) < mpmath.mpf(10) ** -20
    with mpmath.workdps(40):
        assert abs(to_mpf(sympy.gamma(r(1, 3)), 30) - mpmath.gamma(mpmath.mpf(1) / 3)) < mpmath.mpf(10) ** -35


def test_soft_capped_scores_are_certified_in_the_solution():
    """Every S_capped decimal of the worked example is the exact c·tanh(s/c), with s = q·k/√d_k from
    the example's own numbers, as mpmath computes it at 60 digits (NumPy-free, by the formula)."""
    d = derive(load_problem("worked_examples/softcap_sliding_window.yaml"))
    c = d.problem.softcap
    S, values = d.step("S").lazy, d.evaluate("S_capped", 40)
    d_k = d.step("Q").lazy.cols
    with mpmath.workdps(60):
        for i in range(S.rows):
            for j in range(S.cols):
                s = mpmath.mpf(sympy.Rational(S[i, j]).p) / sympy.Rational(S[i, j]).q / mpmath.sqrt(d_k)
                true = mpmath.mpf(c) * mpmath.tanh(s / mpmath.mpf(c))
                assert abs(values[i][j] - true) <= abs(true) * mpmath.mpf(10) ** -40 + mpmath.mpf(10) ** -55
    assert "certified" in d.step("S_capped").why


def test_python_numbers_are_read_as_numbers():
    assert to_mpf(-1, 15) == -1 and to_mpf(3, 15) == 3
    with mpmath.workdps(30):
        assert abs(to_mpf(0.5, 20) - mpmath.mpf("0.5")) == 0
