"""The backward pass through RoPE: dQ_rot = dS·K_rot, dK_rot = dSᵀ·Q_rot, then each row turned back,
dQ[p] = R(p·θ)ᵀ·dQ_rot[p].

Every gradient is held to the test's own mpmath forward and backward pass at 50 digits (rotation
matrices written out and transposed, nothing of symattn's), to NumPy, PyTorch autograd and finite
differences through the cross-check; the exact forms keep their structure (one fraction over Z_i² per
entry of dQ, sums over each Z_i^power for dK, cosines of relative angles, no product of two); and
``symattn check`` marks the new stages with follow-through and names the mistakes of the rotation.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import mpmath
import numpy as np
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import symattn
from symattn.problem.model import SUM_LOSS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "rope_backward.yaml"
DPS = 50
TOL = mpmath.mpf(10) ** -32  # symattn's 40-digit values against the 50-digit reference, relative to max(1, |v|)


# -- the test's own reference ----------------------------------------------------------------


def _mat(rows):
    return mpmath.matrix([[mpmath.mpf(sympy.Rational(x).p) / sympy.Rational(x).q for x in row] for row in rows])


def _rotation(d: int, pairs, angles, p: int):
    """R_p: the d × d matrix that turns each pair (a, b) by p·θ_i."""
    R = mpmath.eye(d)
    for (a, b), theta in zip(pairs, angles):
        c, s = mpmath.cos(p * theta), mpmath.sin(p * theta)
        R[a, a], R[a, b], R[b, a], R[b, b] = c, -s, s, c
    return R


def _rows_times(Rs, M, transpose=False):
    """Row p of M times R_pᵀ (so row p becomes R_p·m_p), or times R_p with ``transpose`` (R_pᵀ·m_p)."""
    out = mpmath.matrix(M.rows, M.cols)
    for p in range(M.rows):
        R = Rs[p].T if transpose else Rs[p]
        v = R * M[p, :].T
        for j in range(M.cols):
            out[p, j] = v[j]
    return out


def reference(X, W_Q, W_K, W_V, b_K, angles, pairing: str, causal: bool, scale, G):
    """Every stage of one head, forward and backward, at DPS digits; the loss L = Σ G ∘ O. Each angle
    is a function that makes θ_i at the working precision."""
    with mpmath.workdps(DPS):
        angles = [theta() for theta in angles]
        X, W_Q, W_K, W_V, G = map(_mat, (X, W_Q, W_K, W_V, G))
        n, d = X.rows, W_Q.cols
        half = d // 2
        pairs = [(i, i + half) for i in range(half)] if pairing == "half" else [(2 * i, 2 * i + 1) for i in range(half)]
        Q, K, V = X * W_Q, X * W_K, X * W_V
        if b_K is not None:
            b = _mat([b_K])
            for p in range(n):
                for j in range(d):
                    K[p, j] += b[0, j]
        Rs = [_rotation(d, pairs, angles, p) for p in range(n)]
        Qr, Kr = _rows_times(Rs, Q), _rows_times(Rs, K)
        S = Qr * Kr.T
        factor = mpmath.mpf(1) if scale is None else 1 / mpmath.sqrt(d)
        A = mpmath.matrix(n, n)
        for i in range(n):
            keys = range(i + 1) if causal else range(n)
            m = max(S[i, j] * factor for j in keys)
            e = {j: mpmath.exp(S[i, j] * factor - m) for j in keys}
            z = sum(e.values())
            for j in keys:
                A[i, j] = e[j] / z
        O = A * V
        dV, dA = A.T * G, G * V.T
        dS_hat = mpmath.matrix(n, n)
        for i in range(n):
            dot = sum(A[i, k] * dA[i, k] for k in range(n))
            for j in range(n):
                dS_hat[i, j] = A[i, j] * (dA[i, j] - dot)
        dS = dS_hat * factor
        dQr, dKr = dS * Kr, dS.T * Qr
        dQ, dK = _rows_times(Rs, dQr, transpose=True), _rows_times(Rs, dKr, transpose=True)
        out = {"Q_rot": Qr, "K_rot": Kr, "A": A, "O": O, "dV": dV, "dS": dS, "dQ_rot": dQr, "dK_rot": dKr,
               "dQ": dQ, "dK": dK, "dW_Q": X.T * dQ, "dW_K": X.T * dK, "dW_V": X.T * dV,
               "dX": dQ * W_Q.T + dK * W_K.T + dV * W_V.T}
        if b_K is not None:
            out["db_K"] = mpmath.matrix([[sum(dK[p, j] for p in range(n)) for j in range(d)]])
        return out


def _yaml(rows) -> str:
    return "[" + ", ".join("[" + ", ".join(str(x) for x in row) + "]" for row in rows) + "]"


def problem_text(X, W_Q, W_K, W_V, b_K, rope: str, causal: bool, scale, G) -> str:
    lines = [f"X: {_yaml(X)}", f"W_Q: {_yaml(W_Q)}", f"W_K: {_yaml(W_K)}", f"W_V: {_yaml(W_V)}",
             f"mask: {'causal' if causal else 'none'}", f"rope: {rope}", f"backward: {{loss: {{weights: {_yaml(G)}}}}}"]
    if b_K is not None:
        lines.append(f"b_K: {_yaml([b_K])}")
    if scale is None:
        lines.append("scale: none")
    return "\n".join(lines) + "\n"


def assert_matches(d, want: dict) -> None:
    for sid, ref in want.items():
        got = d.evaluate(sid, 40)
        assert (len(got), len(got[0])) == (ref.rows, ref.cols), sid
        for i in range(ref.rows):
            for j in range(ref.cols):
                v = ref[i, j]
                assert abs(got[i][j] - v) <= TOL * max(1, abs(v)), (sid, i + 1, j + 1, got[i][j], v)


ints = st.integers(-3, 3)


@st.composite
def problems(draw):
    n = draw(st.integers(2, 4))
    d_model = draw(st.integers(2, 3))
    d = draw(st.sampled_from([2, 4]))
    X = draw(st.lists(st.lists(ints, min_size=d_model, max_size=d_model), min_size=n, max_size=n))
    W = [draw(st.lists(st.lists(ints, min_size=d, max_size=d), min_size=d_model, max_size=d_model)) for _ in range(3)]
    G = draw(st.lists(st.lists(ints, min_size=d, max_size=d), min_size=n, max_size=n))
    b_K = draw(st.one_of(st.none(), st.lists(ints, min_size=d, max_size=d)))
    pairing = draw(st.sampled_from(["half", "interleaved"]))
    angles = draw(st.sampled_from(["base", "rational", "pi"]))
    causal, scale = draw(st.booleans()), draw(st.sampled_from([None, "auto"]))
    if angles == "base":
        base = draw(st.sampled_from([2, 100, 10000]))
        rope = f"{{base: {base}, pairing: {pairing}}}"
        thetas = [lambda i=i: mpmath.mpf(base) ** (-mpmath.mpf(2 * i) / d) for i in range(d // 2)]
    elif angles == "rational":
        chosen = draw(st.lists(st.sampled_from(["1/2", "3", "2/7"]), min_size=d // 2, max_size=d // 2))
        rope = f"{{angles: [{', '.join(chosen)}], pairing: {pairing}}}"
        thetas = [lambda a=a: mpmath.mpf(sympy.Rational(a).p) / sympy.Rational(a).q for a in chosen]
    else:  # the general path: exact algebraic cosines
        chosen = draw(st.lists(st.sampled_from([2, 3, 6]), min_size=d // 2, max_size=d // 2))
        rope = f"{{angles: [{', '.join(f'pi/{k}' for k in chosen)}], pairing: {pairing}}}"
        thetas = [lambda k=k: mpmath.pi / k for k in chosen]
    return (X, *W, b_K, rope, causal, scale, G), (X, *W, b_K, thetas, pairing, causal, scale, G)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_gradient_against_the_tests_own_50_digit_pass(case):
    text_args, ref_args = case
    with mpmath.workdps(DPS):
        want = reference(*ref_args)
    d = symattn.derive(symattn.load_problem(problem_text(*text_args)))
    assert_matches(d, want)


def test_the_worked_example_by_hand():
    """Quarter turns (θ = π/2): token 2 turned by 90°, token 3 by 180°, so each row of dQ is its row
    of dQ_rot turned back by hand: (a, b) → (b, −a) at position 1 and → (−a, −b) at position 2."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    assert d.step("K_rot").exact.tolist() == [[0, 1], [0, 1], [-1, -1]]  # K = [[0,1],[1,0],[1,1]] turned
    for rotated, back in (("dQ_rot", "dQ"), ("dK_rot", "dK")):
        R, B = d.step(rotated).lazy, d.step(back).lazy
        assert sympy.simplify(B[0, 0] - R[0, 0]) == 0 and sympy.simplify(B[0, 1] - R[0, 1]) == 0
        assert sympy.simplify(B[1, 0] - R[1, 1]) == 0 and sympy.simplify(B[1, 1] + R[1, 0]) == 0
        assert sympy.simplify(B[2, 0] + R[2, 0]) == 0 and sympy.simplify(B[2, 1] + R[2, 1]) == 0
    check = symattn.crosscheck(d)
    assert check.passed is True


def test_the_stage_ids_and_sections_in_every_format():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    ids = [s.id for s in d.steps]
    gradients = ids[ids.index("dO"):]
    assert gradients == ["dO", "dV", "dA", "dS_masked", "dS", "dQ_rot", "dK_rot", "dQ", "dK",
                         "dW_Q", "dW_K", "dW_V", "dX"]
    document = json.loads(symattn.render(d, "json"))
    assert [s["id"] for s in document["stages"]] == ids
    for fmt in ("latex", "markdown", "text", "html"):
        out = symattn.render(d, fmt)
        assert "Back through the rotation" in out, fmt
        assert "Turn the query gradient back" in out and "Turn the key gradient back" in out, fmt


def test_the_exact_forms_keep_their_structure():
    """dQ is one fraction over Z_i² per entry and dK a sum over each Z_i^power, and on the fast path
    each is built with the relative angles: no product of two cosines or sines appears."""
    from symattn.exact.structures import OverRows, OverZ2

    text = problem_text([[1, 0, 2], [0, 1, 1], [2, 1, 0]], [[1, 0], [0, 1], [1, 1]], [[0, 1], [1, 0], [1, 2]],
                        [[1, 1], [0, 1], [1, 0]], None, "{base: 10}", True, None, [[1, 0], [0, 1], [1, -1]])
    d = symattn.derive(symattn.load_problem(text))
    assert isinstance(d.step("dQ").value, OverZ2) and isinstance(d.step("dK").value, OverRows)
    for sid in ("dQ", "dK", "dW_Q", "dX"):
        lazy = d.step(sid).lazy
        for i in range(lazy.rows):
            for j in range(lazy.cols):
                for term in sympy.Add.make_args(sympy.expand(sympy.numer(sympy.together(lazy[i, j])))):
                    trig = [f for f in sympy.Mul.make_args(term) if isinstance(f, (sympy.cos, sympy.sin))]
                    assert len(trig) <= 1, (sid, i + 1, j + 1, term)


def test_no_general_simplification_on_the_backward_fast_path(monkeypatch):
    fu = importlib.import_module("sympy.simplify.fu")
    calls = {"TR8": 0, "simplify": 0}

    def counted(name, f):
        def wrapper(*a, **k):
            calls[name] += 1
            return f(*a, **k)
        return wrapper

    monkeypatch.setattr(fu, "TR8", counted("TR8", fu.TR8))
    monkeypatch.setattr(sympy, "simplify", counted("simplify", sympy.simplify))
    rng = np.random.default_rng(3)
    X, W_Q, W_K, W_V = (rng.integers(-3, 4, shape).tolist() for shape in ((5, 3), (3, 4), (3, 4), (3, 2)))
    G = rng.integers(-2, 3, (5, 2)).tolist()
    d = symattn.derive(symattn.load_problem(problem_text(X, W_Q, W_K, W_V, None, "{base: 10000}", True, "auto", G)))
    assert symattn.crosscheck(d).passed is True
    for fmt in ("latex", "markdown", "text", "json", "html"):
        assert symattn.render(d, fmt)
    assert calls == {"TR8": 0, "simplify": 0}


def test_the_key_bias_gradient_is_not_zero_under_rope():
    """Without RoPE db_K is exactly 0 (a row's scores all move by q_i·b_K); under RoPE each key's copy
    of b_K is turned by its own angle, so it is not, and the solution says so."""
    X, W_Q, W_K, W_V, G = [[1, 0], [0, 1], [1, 1]], [[1, 0], [0, 1]], [[0, 1], [1, 0]], [[1, 0], [1, 1]], \
        [[1, 0], [0, 1], [1, -1]]
    text = problem_text(X, W_Q, W_K, W_V, [1, 2], "{angles: [1/2]}", True, None, G)
    d = symattn.derive(symattn.load_problem(text))
    with mpmath.workdps(DPS):
        want = reference(X, W_Q, W_K, W_V, [1, 2], [lambda: mpmath.mpf(1) / 2], "half", True, None, G)
    assert_matches(d, {"db_K": want["db_K"], "dK": want["dK"]})
    assert any(abs(v) > 1e-3 for v in d.evaluate("db_K", 30)[0])
    assert "Under RoPE it is not" in d.step("db_K").why
    plain = symattn.derive(symattn.load_problem(text.replace("rope: {angles: [1/2]}\n", "")))
    assert plain.step("db_K").lazy.tolist() == [[0, 0]] and "exactly" in plain.step("db_K").why


def test_past_the_size_the_gradients_are_decimals_and_cross_checked():
    rng = np.random.default_rng(8)
    X, W_Q, W_K, W_V = (rng.integers(-2, 3, shape).tolist() for shape in ((12, 4), (4, 8), (4, 8), (4, 2)))
    G = rng.integers(-2, 3, (12, 2)).tolist()
    d = symattn.derive(symattn.load_problem(problem_text(X, W_Q, W_K, W_V, None, "{base: 10000}", True, "auto", G)))
    assert not d.step("dQ").written_exactly and not d.step("dK_rot").written_exactly
    document = json.loads(symattn.render(d, "json"))
    by_id = {s["id"]: s for s in document["stages"]}
    assert by_id["dQ"]["exact"] is None and by_id["dK"]["exact"] is None
    check = symattn.crosscheck(d)
    assert check.passed is True


# -- marking -----------------------------------------------------------------------------------


def _rows(values) -> list[list[str]]:
    return [[format(float(v), ".6f") for v in row] for row in values]


def test_check_marks_the_new_stages_and_names_the_slips():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    right = {sid: _rows(d.approx(sid)) for sid in ("dQ_rot", "dK_rot", "dQ", "dK")}
    marking = symattn.check(d, right)
    assert marking.passed, str(marking)
    slips = {
        "dQ": (d.approx("dQ_rot"), "not turned back"),  # dQ_rot copied
        "dK": (None, "turned forward"),
        "dQ_rot": (d.approx("dS") @ d.approx("K"), "unrotated keys"),
    }
    turned_forward = d.approx("dK_rot").copy()  # position p turned by +p·π/2 instead of −p·π/2
    turned_forward[1] = [-turned_forward[1][1], turned_forward[1][0]]
    turned_forward[2] = -turned_forward[2]
    slips["dK"] = (turned_forward, "turned forward")
    for sid, (values, cause) in slips.items():
        marking = symattn.check(d, {sid: _rows(values)})
        assert not marking.passed
        assert cause in str(marking), (sid, str(marking))


def test_follow_through_from_a_wrong_dS():
    """A student whose dS is wrong but whose dQ_rot and dQ follow from it gets those marked as
    following through."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    dS = d.approx("dS").copy()
    dS[1, 0] += 1  # a slip in dS
    K_rot = d.approx("K_rot")
    dQ_rot = dS @ K_rot
    dQ = dQ_rot.copy()
    dQ[1] = [dQ_rot[1][1], -dQ_rot[1][0]]
    dQ[2] = -dQ_rot[2]
    marking = symattn.check(d, {"dS": _rows(dS), "dQ_rot": _rows(dQ_rot), "dQ": _rows(dQ)})
    status = {s.id: s.status for s in marking.stages}
    assert status["dS"] == "wrong"
    assert status["dQ_rot"] != "wrong" and status["dQ"] != "wrong", str(marking)


def test_rope_with_backward_from_the_library_helper():
    p = symattn.load_problem((ROOT / "worked_examples" / "rope_base.yaml").read_text("utf-8"))
    d = symattn.derive(dataclasses.replace(p, backward=SUM_LOSS))
    assert "dQ_rot" in [s.id for s in d.steps]
    assert symattn.crosscheck(d).passed is True
