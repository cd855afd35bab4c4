"""RoPE's fast path (symattn.exact.rotary) against the general path and against independent values.

The general path is the one symattn takes for any rotation it has no structure for: SymPy
entries built whole and simplified (products of cosines and sines rewritten as sums, expanded).
Here the fast path is switched off by making ``rotary.rotated`` decline, and every stage's exact
entries, the rows' maxima and their values are compared, on random problems (hypothesis) with
ties and zeros. Values are compared with mpmath at 40 digits computed here from the problem's own
numbers, and a test counts the general simplification's calls (none on the fast path).
"""

from __future__ import annotations

import json

import mpmath
import numpy as np
import sympy
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import symattn
from symattn.exact import rotary

FORWARD = ("Q_rot", "K_rot", "K_T", "S", "S_scaled", "S_masked", "A", "O")


def problem_text(X, W_Q, W_K, W_V, mask="causal", rope="rope: {base: 10000}", extra="") -> str:
    def m(rows):
        return "[" + ", ".join("[" + ", ".join(str(x) for x in row) + "]" for row in rows) + "]"

    return (f"title: rotary\nmask: {mask}\nX: {m(X)}\nW_Q: {m(W_Q)}\nW_K: {m(W_K)}\nW_V: {m(W_V)}\n"
            f"{rope}\n{extra}")


def general(text: str, monkeypatch) -> symattn.Derivation:
    """The derivation with the fast path switched off."""
    with monkeypatch.context() as m:
        m.setattr(rotary, "rotated", lambda *a, **k: None)
        d = symattn.derive(symattn.load_problem(text))
        for step in d.steps:  # build every entry while the general path is in force
            _ = step.exact
            for row in step.softmax:
                _ = row.maximum, row.exponents
        return d


def fast(text: str) -> symattn.Derivation:
    return symattn.derive(symattn.load_problem(text))


def assert_same(a: symattn.Derivation, b: symattn.Derivation) -> None:
    assert a.ids == b.ids
    for sid in FORWARD:
        if sid not in a.ids:
            continue
        x, y = a.step(sid), b.step(sid)
        assert x.exact == y.exact, sid  # the same canonical SymPy forms, entry by entry
        for r, s in zip(x.softmax, y.softmax):
            assert r.maximum == s.maximum, sid
            assert tuple(r.exponents) == tuple(s.exponents), sid


def values_by_mpmath(text: str, dps: int = 40) -> dict:
    """Q_rot, K_rot, S, A and O at ``dps`` digits from the problem's numbers (read back from the
    problem), with mpmath: rotation pair by pair, scale 1/√d_k, causal mask, softmax."""
    p = symattn.load_problem(text)
    mp = mpmath.mp
    with mpmath.workdps(dps):
        def mat(m):
            return [[mpmath.mpf(int(m[i, j].p)) / int(m[i, j].q) for j in range(m.cols)] for i in range(m.rows)]

        X, h = mat(p.X), p.heads[0]
        WQ, WK, WV = mat(h.W_Q), mat(h.W_K), mat(h.W_V)
        mul = lambda a, b: [[mp.fsum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]  # noqa: E731
                            for i in range(len(a))]
        Q, K, V = mul(X, WQ), mul(X, WK), mul(X, WV)
        d_k = len(Q[0])
        pairs = p.rope.pairs(d_k)
        thetas = [mpmath.power(10000, mpmath.mpf(-2 * i) / d_k) for i in range(d_k // 2)]

        def rot(m):
            out = [row[:] for row in m]
            for pos, row in enumerate(m):
                for (a, b), t in zip(pairs, thetas):
                    c, s = mpmath.cos(pos * t), mpmath.sin(pos * t)
                    out[pos][a], out[pos][b] = row[a] * c - row[b] * s, row[a] * s + row[b] * c
            return out

        Qr, Kr = rot(Q), rot(K)
        S = mul(Qr, [list(col) for col in zip(*Kr)])
        n = len(S)
        A = []
        for i in range(n):
            z = [S[i][j] / mpmath.sqrt(d_k) for j in range(i + 1)]
            top = max(z)
            e = [mpmath.exp(x - top) for x in z]
            total = mp.fsum(e)
            A.append([x / total for x in e] + [mpmath.mpf(0)] * (n - i - 1))
        return {"Q_rot": Qr, "K_rot": Kr, "S": S, "A": A, "O": mul(A, V)}


small = st.integers(-3, 3)


@st.composite
def problems(draw):
    n = draw(st.integers(1, 4))
    d = draw(st.integers(1, 3))
    d_k = draw(st.sampled_from([2, 4, 6]))
    X = [[draw(small) for _ in range(d)] for _ in range(n)]
    if draw(st.booleans()):
        X = [X[0]] * n  # the same token everywhere: scores tie at every distance 0
    W_Q = [[draw(small) for _ in range(d_k)] for _ in range(d)]
    W_K = [[draw(small) for _ in range(d_k)] for _ in range(d)] if draw(st.booleans()) else [[0] * d_k] * d
    W_V = [[draw(small) for _ in range(2)] for _ in range(d)]
    pairing = draw(st.sampled_from(["half", "interleaved"]))
    angles = draw(st.sampled_from(["base: 10000", "base: 100", "angles: [1/2, 1/3, 1/2]", "base: 7/2"]))
    if angles.startswith("angles"):
        angles = f"angles: [{', '.join(['1/2', '1/3', '1/2'][:d_k // 2])}]"
    mask = draw(st.sampled_from(["causal", "none"]))
    return problem_text(X, W_Q, W_K, W_V, mask, f"rope: {{{angles}, pairing: {pairing}}}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=problems())
# terms with coefficient 1 and −1 (cos 1 and −sin 1 alone), which SymPy writes without a product
@example(text=problem_text([[1, 0], [1, 0]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]]))
@example(text=problem_text([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], mask="none"))
def test_the_fast_path_builds_what_the_general_path_builds(text, monkeypatch):
    assert_same(fast(text), general(text, monkeypatch))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=problems())
def test_the_fast_paths_values_are_the_general_paths(text, monkeypatch):
    a, b = fast(text), general(text, monkeypatch)
    for sid in FORWARD:
        if sid in a.ids:
            x, y = np.array(a.evaluate(sid, 30), dtype=float), np.array(b.evaluate(sid, 30), dtype=float)
            assert np.array_equal(np.isinf(x), np.isinf(y)), sid
            finite = ~np.isinf(x)
            assert np.allclose(x[finite], y[finite], rtol=1e-25, atol=1e-25), sid


def test_ties_and_zeros_are_exact():
    # the same token twice, and K = 0: every score 0, so every row ties; Z_i is its count of keys
    text = problem_text([[1, 2], [1, 2], [1, 2]], [[1, 0], [0, 1]], [[0, 0], [0, 0]], [[1], [2]])
    d = fast(text)
    assert isinstance(d.step("S").lazy, rotary.RotaryScores)
    for i, row in enumerate(d.step("A").softmax):
        assert row.maximum == 0 and row.normaliser_is_number and row.normaliser == i + 1
        assert [row.weight(j) for j in range(3)] == [sympy.Rational(1, i + 1)] * (i + 1) + [0] * (2 - i)


def test_values_agree_with_mpmath_at_40_digits():
    rng = np.random.default_rng(3)
    X = rng.integers(-9, 10, (5, 4)).tolist()
    W = [rng.integers(-4, 5, (4, 6)).tolist() for _ in range(3)]
    text = problem_text(X, W[0], W[1], [row[:3] for row in W[2]])
    d = fast(text)
    ref = values_by_mpmath(text)
    assert isinstance(d.step("Q_rot").lazy, rotary.Rotated)
    for sid, want in ref.items():
        got = d.evaluate(sid, 35)
        for i, row in enumerate(want):
            for j, v in enumerate(row):
                assert abs(got[i][j] - v) <= mpmath.mpf(10) ** -30 * max(1, abs(v)), (sid, i, j)
    assert d.step("A").softmax[4].maximum == d.step("S_masked").lazy[4, d.step("A").softmax[4]._best]


def test_the_fast_path_never_calls_the_general_simplification(monkeypatch, tmp_path):
    """Count the calls of SymPy's trigonometric rewriting (TR8, through tidy_trig) and of simplify
    while a 6-token problem is derived, cross-checked and written in every format."""
    import importlib

    fu = importlib.import_module("sympy.simplify.fu")

    calls = {"TR8": 0, "simplify": 0}

    def counted(name, f):
        def wrapper(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapper

    monkeypatch.setattr(fu, "TR8", counted("TR8", fu.TR8))
    monkeypatch.setattr(sympy, "simplify", counted("simplify", sympy.simplify))
    rng = np.random.default_rng(5)
    text = problem_text(rng.integers(-5, 6, (6, 4)).tolist(), *(rng.integers(-3, 4, (4, 8)).tolist() for _ in range(3)))
    d = fast(text)
    check = symattn.crosscheck(d)
    assert check.passed is True
    for fmt in ("latex", "markdown", "text", "json", "html"):
        assert symattn.render(d, fmt)
    assert calls == {"TR8": 0, "simplify": 0}
    # the same problem on the general path does call them: the counters can count
    monkeypatch.setattr(rotary, "rotated", lambda *a, **k: None)
    symattn.render(symattn.derive(symattn.load_problem(text)), "text")
    assert calls["TR8"] > 0


def test_past_the_size_the_entries_are_decimals_and_the_values_hold(tmp_path):
    rng = np.random.default_rng(11)
    n, d, d_k = 24, 6, 8  # 24 tokens, 4 pairs: the scores' 2,304 terms, the weights' more than EXACT_TERMS
    text = problem_text((rng.integers(-20, 21, (n, d)) / 10).tolist(), *((rng.integers(-5, 6, (d, d_k)) / 10).tolist()
                                                                        for _ in range(3)))
    dd = fast(text)
    written = {s.id: s.written_exactly for s in dd.steps}
    assert written["S"] and not written["O"]
    assert rotary.terms_of(dd.step("O").value) > rotary.EXACT_TERMS
    doc = json.loads(symattn.render(dd, "json"))
    stages = {s["id"]: s for s in doc["stages"]}
    assert stages["O"]["exact"] is None and stages["S"]["exact"] is not None
    assert symattn.crosscheck(dd).passed is True  # the decimals are the NumPy reference's, to its tolerance
    text_doc = symattn.render(dd, "text")
    assert "too many to write out" in text_doc and "⟦" not in text_doc
    assert "m_2 = " in text_doc  # the weights' 4,800 terms are written, their maxima exactly


def test_angles_with_pi_take_the_general_path():
    text = problem_text([[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1, 0], [0, 1]], [[1], [1]],
                        rope="rope: {angles: [pi/6]}")
    d = fast(text)
    assert not isinstance(d.step("Q_rot").lazy, rotary.Rotated)
    assert d.step("Q_rot").exact[1, 1] == sympy.sqrt(3) / 2  # cos(π/6), exactly
    Qr, Kr = (np.array(d.step(k).exact, dtype=float) for k in ("Q_rot", "K_rot"))
    assert np.allclose(np.array(d.step("S").exact, dtype=float), Qr @ Kr.T, rtol=0, atol=1e-15)


def test_large_angles_get_the_digits_they_need():
    """base 1/10^300 makes θ_2 = 10^150: cos(2·10^150) needs some 500 digits of the angle before
    the cosine; the values must still agree with mpmath at 600 digits (not a ball's midpoint 0)."""
    text = ("Q: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]\nK: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]]\n"
            'V: [[1], [2], [3]]\nrope: {base: "1/10^300"}\n')
    d = fast(text)
    assert isinstance(d.step("Q_rot").lazy, rotary.Rotated)
    got = d.evaluate("Q_rot", 30)
    with mpmath.workdps(600):
        theta = mpmath.mpf(10) ** 150
        for p, row in enumerate([[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]):
            for a, b, t in ((0, 2, mpmath.mpf(1)), (1, 3, theta)):
                c, s = mpmath.cos(p * t), mpmath.sin(p * t)
                want = (row[a] * c - row[b] * s, row[a] * s + row[b] * c)
                for k, w in zip((a, b), want):
                    assert abs(got[p][k] - w) < mpmath.mpf(10) ** -28, (p, k)


def test_a_score_that_cancels_to_zero_is_exactly_zero():
    """q_3 = (1, 0) and k_3 = (0, 1) at one position: their rotations are orthogonal, so the score
    is 0, while its ball (−cos·sin + sin·cos) only contains 0; the exact entry says it is 0."""
    text = problem_text([[0, 0], [0, 0], [0, 1]], [[0, 0], [1, 0]], [[0, 0], [0, 1]], [[0, 0], [0, 0]])
    d = fast(text)
    assert d.step("S").lazy[2, 2] == 0
    ball = d.step("S").lazy.arb_rows(30)[2][2]
    assert ball.is_exact() and ball == 0
    assert d.evaluate("S", 30)[2][2] == 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=problems())
def test_the_relative_property_is_built_as_the_general_path_builds_it(text, monkeypatch):
    """The property a worked solution shows after S (R(−θ)·k, q·R(−θ)·k and the difference), built
    straight from rational q, k and plain angles, is the general path's (rotate, expand, simplify)
    form for form; zeros (W_K of zeros) and ties (the same token everywhere) included."""
    from symattn.problem import rope

    d = fast(text)
    if d.problem.X.rows < 2:
        return
    Q, K, S = (d.step(s).lazy for s in ("Q", "K", "S"))
    d_k = Q.cols
    built = rope.relative(d.problem.rope, Q, K, S, d_k)
    with monkeypatch.context() as m:
        m.setattr(rope, "plain_angles", lambda thetas: False)
        expected = rope.relative(d.problem.rope, Q, K, S, d_k)
    assert built == expected
    assert built.difference == 0


@settings(max_examples=30, deadline=None)
@given(text=problems())
def test_masked_scores_tell_their_minus_infinities_without_building_entries(text):
    """The web page hatches a masked score by asking the rotary scores (no entry built); the
    answer is the entry's own: −∞ exactly where the mask forbids, under either mask."""
    d = fast(text)
    for sid in d.ids:
        lazy = d.step(sid).lazy
        if isinstance(lazy, rotary.RotaryScores):
            for i in range(lazy.rows):
                for j in range(lazy.cols):
                    assert lazy.is_neg_inf(i, j) == (lazy[i, j] == sympy.S.NegativeInfinity), (sid, i, j)


_angles = [sympy.Rational(1, 10), sympy.Integer(1), 3 * sympy.Integer(10) ** sympy.Rational(-5, 8), sympy.Rational(7, 3)]
_factors = [sympy.Rational(1, 8), sympy.Rational(1, 2), sympy.sqrt(2) / 4, sympy.sqrt(6) / 6, sympy.sqrt(2) / 2,
            sympy.Integer(3), sympy.Integer(-1), 2 * sympy.sqrt(3) / 9, sympy.sqrt(10), sympy.Integer(1), sympy.pi / 4]


@settings(max_examples=400, deadline=None)
@given(st.integers(-8, 8), st.lists(st.tuples(st.integers(-9, 9), st.integers(1, 9)), min_size=2 * len(_angles),
                                    max_size=2 * len(_angles)), st.sampled_from(_factors))
def test_a_scaled_score_is_what_sympy_builds(constant, coefficients, factor):
    """``rotary._scaled`` (each term of a score times 1/√d_k, built directly) against SymPy's own
    products and sum, tree for tree: coefficients that cancel the factor's, −1, a lone number, 0."""
    terms = [sympy.Integer(constant)]
    for (p, q), f in zip(coefficients, [g(a) for a in _angles for g in (sympy.cos, sympy.sin)]):
        terms.append(sympy.Rational(p, q) * f)
    x = sympy.Add(*terms)
    built, expected = rotary._scaled(x, factor, True), sympy.Add(*[t * factor for t in sympy.Add.make_args(x)])
    assert built == expected and sympy.srepr(built) == sympy.srepr(expected), (x, factor)
