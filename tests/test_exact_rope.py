"""Rotary position embeddings (RoPE): the rotation in both pairings, its exact values, the
relative-position property, its displays in every format, check's diagnoses and bad inputs.

The references are written here: a NumPy rotation pair by pair with explicit 2×2 matrices (and
NumPy attention from the YAML's integers), hand-computed exact entries, a SymPy rotation for the
property, and, when installed, lucidrains' rotary-embedding-torch (interleaved pairs) and Hugging
Face's ``apply_rotary_pos_emb`` (rotate_half).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import sympy
import yaml

import symattn
from _child import SymattnCli
from _reference import answers_text, rounded_grid

ROOT = Path(__file__).resolve().parent.parent
EXACT = ROOT / "worked_examples" / "rope_exact_angles.yaml"
BASE = ROOT / "worked_examples" / "rope_base.yaml"
EXAMPLES = [EXACT, BASE]
PAIRINGS = ["half", "interleaved"]
TOL = 1e-12


# -- references written here --------------------------------------------------------------


def pair_indices(d: int, pairing: str) -> list[tuple[int, int]]:
    """Hugging Face's rotate_half pairs i with i + d/2; RoFormer's interleaved 2i with 2i + 1."""
    return [(i, i + d // 2) for i in range(d // 2)] if pairing == "half" else [(2 * i, 2 * i + 1) for i in range(d // 2)]


def np_rope(x: np.ndarray, thetas, pairing: str) -> np.ndarray:
    """Row p turned pair by pair by the 2×2 rotation through p·θ_i."""
    out = np.array(x, dtype=np.float64)
    for p in range(x.shape[0]):
        for (a, b), theta in zip(pair_indices(x.shape[1], pairing), thetas):
            c, s = math.cos(p * theta), math.sin(p * theta)
            out[p, [a, b]] = np.array([[c, -s], [s, c]]) @ np.array([x[p, a], x[p, b]], dtype=np.float64)
    return out


def angle_of(text: str) -> float:
    """The angles the examples write: "pi/6", "pi/3" (read here, not by symattn)."""
    num, _, den = str(text).partition("/")
    return (math.pi if num == "pi" else float(num)) / (float(den) if den else 1.0)


def thetas_of(raw: dict, d_k: int) -> list[float]:
    rope = raw["rope"]
    if "angles" in rope:
        return [angle_of(a) for a in rope["angles"]]
    base = float(rope.get("base", 10000))
    return [base ** (-2 * i / d_k) for i in range(d_k // 2)]


def np_attention(path: Path, pairing: str) -> dict[str, np.ndarray]:
    """The example's forward pass in float64 from its integers, the rotation done here."""
    raw = yaml.safe_load(path.read_text("utf-8"))
    X, W_Q, W_K, W_V = (np.array(raw[k], dtype=np.float64) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    thetas = thetas_of(raw, Q.shape[1])
    Q_rot, K_rot = np_rope(Q, thetas, pairing), np_rope(K, thetas, pairing)
    S = Q_rot @ K_rot.T
    n = S.shape[0]
    Z = np.where(np.tril(np.ones((n, n), dtype=bool)), S / math.sqrt(Q.shape[1]), -np.inf)
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return {"Q": Q, "K": K, "V": V, "Q_rot": Q_rot, "K_rot": K_rot, "S": S, "A": A, "O": A @ V}


def with_pairing(path: Path, pairing: str):
    p = symattn.load_problem(path)
    return dataclasses.replace(p, rope=dataclasses.replace(p.rope, pairing=pairing))


def sympy_floats(m: sympy.MatrixBase) -> np.ndarray:
    """symattn's exact entries evaluated by SymPy itself."""
    return np.array([[float(sympy.N(m[i, j], 30)) for j in range(m.cols)] for i in range(m.rows)])


@pytest.fixture(scope="module", params=[(e, p) for e in EXAMPLES for p in PAIRINGS],
                ids=lambda x: f"{x[0].stem}-{x[1]}")
def case(request):
    path, pairing = request.param
    return path, pairing, symattn.derive(with_pairing(path, pairing))


# -- the values -------------------------------------------------------------------------------


def test_stages_match_numpy_in_both_pairings(case):
    path, pairing, d = case
    want = np_attention(path, pairing)
    assert d.ids[:9] == ("X", "W_Q", "W_K", "W_V", "Q", "K", "V", "Q_rot", "K_rot")
    for sid in ("Q_rot", "K_rot", "S"):
        np.testing.assert_allclose(sympy_floats(d.step(sid).exact), want[sid], rtol=0, atol=TOL, err_msg=sid)
    np.testing.assert_allclose(sympy_floats(d.step("K_T").exact), want["K_rot"].T, rtol=0, atol=TOL)
    for sid in ("Q_rot", "K_rot", "S", "A", "O"):
        np.testing.assert_allclose(d.approx(sid), want[sid], rtol=0, atol=TOL, err_msg=sid)


def test_the_pairings_differ_and_the_cross_check_passes(case):
    path, pairing, d = case
    other = "interleaved" if pairing == "half" else "half"
    assert not np.allclose(d.approx("Q_rot"), np_attention(path, other)["Q_rot"])
    check = symattn.crosscheck(d)
    assert check.passed, check.all_mismatches
    assert {"Q_rot", "K_rot"} <= set(check.as_dict()["per_stage"])


def test_pytorch_rotates_as_the_libraries_do(case):
    pytest.importorskip("torch")
    _, _, d = case
    check = symattn.crosscheck(d, torch=True)
    assert check.torch is not None and check.torch.passed, check.torch.all_mismatches


def test_exact_angles_by_hand():
    """Token 2 (position 1) of rope_exact_angles: q = (1, 2, 0, 1), k = (0, 1, 2, 1), half pairs
    (1, 3) by π/6 and (2, 4) by π/3: cos π/6 = √3/2, sin π/6 = 1/2, cos π/3 = 1/2, sin π/3 = √3/2."""
    d = symattn.derive(symattn.load_problem(EXACT))
    r3 = sympy.sqrt(3)
    half = sympy.Rational(1, 2)
    # (q1, q3) = R(π/6)(1, 0) = (√3/2, 1/2); (q2, q4) = R(π/3)(2, 1) = (1 − √3/2, √3 + 1/2)
    assert list(d.step("Q_rot").exact.row(1)) == [r3 / 2, 1 - r3 / 2, half, r3 + half]
    # (k1, k3) = R(π/6)(0, 2) = (−1, √3); (k2, k4) = R(π/3)(1, 1) = (1/2 − √3/2, √3/2 + 1/2)
    assert list(d.step("K_rot").exact.row(1)) == [-1, half - r3 / 2, r3, r3 / 2 + half]
    assert list(d.step("Q_rot").exact.row(0)) == [2, 1, 1, 0]  # position 0: not turned
    assert d.problem.rope.thetas(4) == (sympy.pi / 6, sympy.pi / 3)


def test_base_10000_entries_are_exact_sines_and_cosines():
    """θ = 10000^0 = 1 and 10000^(−1/2) = 1/100; q_2 = (1, 0, 0, 2), interleaved pairs (1, 2), (3, 4)."""
    d = symattn.derive(symattn.load_problem(BASE))
    c, s, hundredth = sympy.cos, sympy.sin, sympy.Rational(1, 100)
    assert d.problem.rope.thetas(4) == (1, hundredth)
    assert list(d.step("Q_rot").exact.row(1)) == [c(1), s(1), -2 * s(hundredth), 2 * c(hundredth)]
    # q_3 = k_2 = (1, 0, 0, 1), parallel pairs: the score is cos(−1) + cos(−1/100)
    S = d.step("S").exact
    assert S[2, 1] == c(1) + c(hundredth)
    assert sympy.simplify(S[2, 0] - (c(2) + 2 * c(2 * hundredth))) == 0  # q_3·k_1, k_1 = (1, 0, 0, 2)
    # decimals from the exact expressions
    assert abs(float(d.approx("S")[2, 1]) - (math.cos(1) + math.cos(0.01))) < 1e-15


def sympy_rotation(thetas, pairs, d: int, angle_times: int) -> sympy.Matrix:
    """The d×d block-diagonal rotation by angle_times·θ_i in each pair (as column-vector map)."""
    R = sympy.eye(d)
    for (a, b), theta in zip(pairs, thetas):
        phi = angle_times * theta
        R[a, a], R[a, b], R[b, a], R[b, b] = sympy.cos(phi), -sympy.sin(phi), sympy.sin(phi), sympy.cos(phi)
    return R


def test_the_relative_property_holds_exactly_for_every_pair(case):
    """q_i^rot · k_j^rot = q_i · R((j − i)θ) k_j, for every query i and key j, simplified to 0 here."""
    path, pairing, d = case
    Q, K, S = (d.step(s).exact for s in ("Q", "K", "S"))
    thetas = d.problem.rope.thetas(4)
    pairs = pair_indices(4, pairing)
    for i in range(S.rows):
        for j in range(S.cols):
            relative = (Q.row(i) * sympy_rotation(thetas, pairs, 4, j - i) * K.row(j).T)[0, 0]
            assert sympy.simplify(sympy.expand_trig(S[i, j] - relative)) == 0, (i, j)


def test_each_format_shows_the_turn_and_the_property():
    d = symattn.derive(symattn.load_problem(EXACT))
    latex = symattn.render_latex(d)
    markdown = symattn.render_markdown(d)
    text = symattn.render_text(d)
    html = symattn.render_html(d) if hasattr(symattn, "render_html") else None
    for out in (latex, markdown):
        assert out.count("\\begin{pmatrix} \\cos\\varphi & -\\sin\\varphi") == 2  # Q_rot and K_rot
        # the second token's first pair (components 1 and 3 of the half pairing), by π/6
        assert "q^{\\mathrm{rot}}_{2,1}" in out and "q^{\\mathrm{rot}}_{2,3}" in out
        assert "\\begin{pmatrix} \\frac{\\sqrt{3}}{2} & - \\frac{1}{2} \\\\ \\frac{1}{2} & \\frac{\\sqrt{3}}{2} \\end{pmatrix}" in out
        assert "q_{3} \\cdot R(-\\theta)\\,k_{2}" in out
        assert "(exactly: SymPy simplifies the difference to 0)" in out
        assert out.index("S = Q^{\\mathrm{rot}}") < out.index("(exactly: SymPy") < out.index("\\frac{S}{\\sqrt{d_k}}")
    assert "[[cos φ, −sin φ], [sin φ, cos φ]]" in text
    assert "[[sqrt(3)/2, -1/2], [1/2, sqrt(3)/2]]·(1, 0) = (sqrt(3)/2, 1/2)" in text
    assert "q_rot_3 · k_rot_2 − q_3 · R(−θ)·k_2 = 0   (exactly: SymPy simplifies the difference to 0)" in text
    assert "counted from 0 for the first token" in text and "rotate_half" in text
    if html is not None:
        assert "(exactly:&#x000A0;SymPy&#x000A0;simplifies&#x000A0;the&#x000A0;difference&#x000A0;to&#x000A0;0)" in html
        for sid in ("Q_rot", "K_rot"):
            assert f'data-stage="{sid}"' in html
    data = json.loads(symattn.render_json(d))
    rope = data["rope"]
    assert rope["pairing"] == "half" and rope["angles"] == ["pi/6", "pi/3"] and rope["positions_from"] == 0
    (rel,) = rope["relative"]
    assert (rel["stage"], rel["query"], rel["key"], rel["offset"], rel["difference"]) == ("S", 2, 1, -1, "0")
    assert sympy.sympify(rel["rotated_score"]) == sympy.sympify(rel["relative_score"]) == 2 + sympy.sqrt(3)


def test_problems_without_rope_are_unchanged():
    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    assert "rope" not in json.loads(symattn.render_json(d))
    assert "Q_rot" not in d.ids and "R(" not in symattn.render_text(d)


# -- several heads, Q and K given -------------------------------------------------------------

HEADS = """\
X: [[1, 0, 1], [0, 1, 1], [1, 1, 0]]
heads:
  - W_Q: [[1, 0], [0, 1], [1, 1]]
    W_K: [[0, 1], [1, 0], [1, 1]]
    W_V: [[1, 0], [0, 1], [1, 1]]
  - W_Q: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]
    W_K: [[1, 0, 0, 1], [0, 1, 1, 0], [0, 0, 1, 1]]
    W_V: [[1], [0], [1]]
W_O: [[1, 0], [0, 1], [1, 1]]
rope: {base: 100, pairing: interleaved}
"""


def test_each_head_rotates_with_its_own_d_k():
    d = symattn.derive(symattn.load_problem(HEADS))
    raw = yaml.safe_load(HEADS)
    X = np.array(raw["X"], dtype=np.float64)
    for h, head in enumerate(raw["heads"], 1):
        Q, K = X @ np.array(head["W_Q"], dtype=np.float64), X @ np.array(head["W_K"], dtype=np.float64)
        d_k = Q.shape[1]
        thetas = [100.0 ** (-2 * i / d_k) for i in range(d_k // 2)]
        np.testing.assert_allclose(d.approx(f"head{h}.Q_rot"), np_rope(Q, thetas, "interleaved"), atol=TOL)
        np.testing.assert_allclose(d.approx(f"head{h}.K_rot"), np_rope(K, thetas, "interleaved"), atol=TOL)
    assert symattn.crosscheck(d).passed
    assert json.loads(symattn.render_json(d))["rope"]["angles"] == [["1"], ["1", "1/10"]]


def test_q_and_k_given_directly_are_rotated():
    text = "Q: [[1, 0], [0, 1], [1, 1]]\nK: [[1, 1], [0, 1], [1, 0]]\nV: [[1, 2], [3, 4], [5, 6]]\n" \
           "rope: {angles: [pi/2]}\n"
    d = symattn.derive(symattn.load_problem(text))
    # position 1 turns by π/2: (0, 1) → (−1, 0); position 2 by π: (1, 1) → (−1, −1)
    assert d.step("Q_rot").exact.tolist() == [[1, 0], [-1, 0], [-1, -1]]
    assert d.step("K_rot").exact.tolist() == [[1, 1], [-1, 0], [-1, 0]]
    assert symattn.crosscheck(d).passed


def test_backward_through_rope_is_derived():
    """(The backward pass through RoPE has its own file: tests/test_exact_rope_backward.py.)"""
    p = symattn.load_problem(EXACT)
    from symattn.problem.model import SUM_LOSS

    d = symattn.derive(dataclasses.replace(p, backward=SUM_LOSS))
    assert [s.id for s in d.steps if s.id in ("dQ_rot", "dK_rot", "dQ", "dK")] == ["dQ_rot", "dK_rot", "dQ", "dK"]
    assert symattn.crosscheck(d).passed is True


# -- the reference libraries ------------------------------------------------------------------


def test_rotary_embedding_torch_interleaved_and_half_by_permutation(case):
    """lucidrains' rotary-embedding-torch rotates interleaved pairs (2i, 2i + 1); the half pairing is
    the same rotation of the components permuted so that i and i + d/2 sit side by side."""
    torch = pytest.importorskip("torch")
    rotary = pytest.importorskip("rotary_embedding_torch")
    path, pairing, d = case
    raw = yaml.safe_load(path.read_text("utf-8"))
    if "angles" in raw["rope"]:
        emb = rotary.RotaryEmbedding(dim=4, custom_freqs=torch.tensor([angle_of(a) for a in raw["rope"]["angles"]],
                                                                      dtype=torch.float64))
    else:
        emb = rotary.RotaryEmbedding(dim=4, theta=raw["rope"]["base"])
    perm = [0, 2, 1, 3] if pairing == "half" else [0, 1, 2, 3]  # half: (1, 3), (2, 4) side by side
    inverse = np.argsort(perm)
    for sid, base in (("Q_rot", "Q"), ("K_rot", "K")):
        x = torch.tensor(d.approx(base)[:, perm], dtype=torch.float64)
        got = emb.rotate_queries_or_keys(x[None, None], seq_dim=-2)[0, 0].double().numpy()[:, inverse]
        np.testing.assert_allclose(got, d.approx(sid), rtol=0, atol=1e-6, err_msg=sid)  # its θ in float32


def test_hugging_face_rotate_half():
    pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    p = with_pairing(BASE, "half")
    d = symattn.derive(p)
    q = torch.tensor(d.approx("Q"))[None, None]
    k = torch.tensor(d.approx("K"))[None, None]
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 4, 2, dtype=torch.float64) / 4))
    freqs = torch.outer(torch.arange(3, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    q_rot, k_rot = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    np.testing.assert_allclose(q_rot[0, 0].numpy(), d.approx("Q_rot"), atol=TOL)
    np.testing.assert_allclose(k_rot[0, 0].numpy(), d.approx("K_rot"), atol=TOL)


# -- symattn check ----------------------------------------------------------------------------


def run_check(cli: SymattnCli, problem: Path, answers: Path) -> dict:
    r = cli("check", str(problem), str(answers), "--format", "json", catch_exceptions=False)
    return json.loads(r.stdout)


def stage(report: dict, sid: str) -> dict:
    return next(s for s in report["stages"] if s["id"] == sid)


def test_check_diagnoses_the_pairing_swapped_and_follows_it_through(symattn_cli, tmp_path):
    want = np_attention(EXACT, "interleaved")  # the student used the other pairing throughout
    answers = tmp_path / "a.yaml"
    answers.write_text(answers_text({sid: rounded_grid(want[sid], 4) for sid in ("Q_rot", "K_rot", "S")}), "utf-8")
    report = run_check(symattn_cli, EXACT, answers)
    for sid in ("Q_rot", "K_rot"):
        s = stage(report, sid)
        assert s["status"] == "wrong" and "pairing is swapped" in s["diagnosis"], s
    s = stage(report, "S")
    assert s["status"] == "follows" and set(s["follows_from"]) == {"Q_rot", "K_rot"}, s


def test_check_marks_right_rotations_right(symattn_cli, tmp_path):
    want = np_attention(BASE, "interleaved")
    answers = tmp_path / "a.yaml"
    answers.write_text(answers_text({sid: rounded_grid(want[sid], 4) for sid in ("Q_rot", "K_rot", "S", "A")}),
                       "utf-8")
    report = run_check(symattn_cli, BASE, answers)
    assert {stage(report, s)["status"] for s in ("Q_rot", "K_rot", "S", "A")} == {"right"}, report


ROTATED_V = """\
X: [[1, 0], [0, 1], [1, 1]]
W_Q: [[1, 0], [0, 1]]
W_K: [[0, 1], [1, 1]]
W_V: [[1, 2], [2, 1]]
rope: {angles: ["pi/3"]}
mask: causal
"""


def test_check_diagnoses_the_rotation_applied_to_v(symattn_cli, tmp_path):
    problem = tmp_path / "p.yaml"
    problem.write_text(ROTATED_V, "utf-8")
    raw = yaml.safe_load(ROTATED_V)
    X = np.array(raw["X"], dtype=np.float64)
    Q, K, V = (X @ np.array(raw[w], dtype=np.float64) for w in ("W_Q", "W_K", "W_V"))
    theta = [math.pi / 3]
    Q_rot, K_rot, V_rot = (np_rope(m, theta, "half") for m in (Q, K, V))
    Z = np.where(np.tril(np.ones((3, 3), dtype=bool)), Q_rot @ K_rot.T / math.sqrt(2), -np.inf)
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    answers = tmp_path / "a.yaml"
    answers.write_text(answers_text({"V": rounded_grid(V_rot, 4)}), "utf-8")
    s = stage(run_check(symattn_cli, problem, answers), "V")
    assert s["status"] == "wrong" and "rotation was applied to V" in s["diagnosis"], s
    answers.write_text(answers_text({"O": rounded_grid(A @ V_rot, 4)}), "utf-8")
    s = stage(run_check(symattn_cli, problem, answers), "O")
    assert s["status"] == "wrong" and "rotation was applied to V" in s["diagnosis"], s


def test_check_diagnoses_positions_counted_from_one(symattn_cli, tmp_path):
    raw = yaml.safe_load(EXACT.read_text("utf-8"))
    X, W_Q = np.array(raw["X"], dtype=np.float64), np.array(raw["W_Q"], dtype=np.float64)
    Q = X @ W_Q
    shifted = np_rope(np.vstack([np.zeros((1, 4)), Q]), [math.pi / 6, math.pi / 3], "half")[1:]  # p + 1
    answers = tmp_path / "a.yaml"
    answers.write_text(answers_text({"Q_rot": rounded_grid(shifted, 4)}), "utf-8")
    s = stage(run_check(symattn_cli, EXACT, answers), "Q_rot")
    assert s["status"] == "wrong" and "positions counted from 1" in s["diagnosis"], s


def test_check_follows_a_wrong_q_through_the_rotation(symattn_cli, tmp_path):
    """A slip in Q, rotated correctly: Q_rot is right from the student's own Q."""
    raw = yaml.safe_load(EXACT.read_text("utf-8"))
    Q = np.array(raw["X"], dtype=np.float64) @ np.array(raw["W_Q"], dtype=np.float64)
    Q[1, 1] += 1  # the slip
    answers = tmp_path / "a.yaml"
    answers.write_text(answers_text({"Q": rounded_grid(Q, 4),
                                     "Q_rot": rounded_grid(np_rope(Q, [math.pi / 6, math.pi / 3], "half"), 4)}),
                       "utf-8")
    report = run_check(symattn_cli, EXACT, answers)
    assert stage(report, "Q")["status"] == "wrong"
    s = stage(report, "Q_rot")
    assert s["status"] == "follows" and s["follows_from"] == ["Q"], s
