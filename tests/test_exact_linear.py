"""Linear attention (linear: {feature: relu | elu1 | identity}): both forms, exactly.

References written here, each test saying which it uses:
- the worked example by hand: Fractions, from φ(q_i)·φ(k_j) / Σ_j φ(q_i)·φ(k_j);
- NumPy float64 from the formulas of Katharopoulos et al. (2020), "Transformers are RNNs": the
  parallel form (eq. 5, the sums over the allowed keys) and the recurrent form (eq. 18-20: S_t, z_t
  updated in a loop, one step per token);
- PyTorch: torch.nn.functional.relu / elu, the states as torch.cumsum (skips without torch);
- mpmath at 50 digits for elu(x) + 1's powers of e;
- SymPy's simplify of the two forms' difference, entry by entry.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn import stages
from symattn.check import load_answers, mark
from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "linear_attention.yaml"
EPS = np.finfo(np.float64).eps


def _problem(text: str, tmp_path: Path, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return symattn.load_problem(path), path


def _rows(m) -> list[list]:
    return [list(r) for r in m.tolist()]


# -- the references ----------------------------------------------------------------------------

FEATURES = {"relu": lambda x: np.maximum(x, 0.0), "elu1": lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0))),
            "identity": lambda x: x}


def katharopoulos(Q, K, V, feature: str, allowed):
    """NumPy float64 from the paper: the parallel form V'_i = Σ_j φ(Q_i)ᵀφ(K_j) V_j / Σ_j φ(Q_i)ᵀφ(K_j) over
    the allowed j, and the recurrent form S_i = S_{i−1} + φ(K_i)V_iᵀ, Z_i = Z_{i−1} + φ(K_i), V'_i =
    φ(Q_i)ᵀS_i / φ(Q_i)ᵀZ_i (causal: row i reads keys j ≤ i; a padding key never enters the state)."""
    phi = FEATURES[feature]
    fq, fk = phi(np.asarray(Q, float)), phi(np.asarray(K, float))
    V = np.asarray(V, float)
    allowed = np.asarray(allowed, bool)
    n, n_k = allowed.shape
    parallel = np.zeros((n, V.shape[1]))
    for i in range(n):
        w = np.array([fq[i] @ fk[j] if allowed[i, j] else 0.0 for j in range(n_k)])
        parallel[i] = w @ V / w.sum()
    S, Z = np.zeros((fk.shape[1], V.shape[1])), np.zeros(fk.shape[1])
    recurrent, states = np.zeros_like(parallel), []
    causal = all(not allowed[i, j] for i in range(n) for j in range(i + 1, n_k))
    for i in range(n):
        if causal:
            if allowed[i, i]:
                S, Z = S + np.outer(fk[i], V[i]), Z + fk[i]
            S_i, Z_i = S, Z
        else:
            S_i = sum(np.outer(fk[j], V[j]) for j in range(n_k) if allowed[i, j])
            Z_i = sum(fk[j] for j in range(n_k) if allowed[i, j])
        states.append(S_i.reshape(-1))
        recurrent[i] = fq[i] @ S_i / (fq[i] @ Z_i)
    return parallel, recurrent, np.array(states)


def _bound(*arrays) -> float:
    """float64's rounding of these small sums and quotients: a few dozen roundings of the largest magnitude."""
    return 64 * EPS * max(1.0, *(float(np.max(np.abs(a))) for a in arrays))


# -- the worked example, by hand ----------------------------------------------------------------


def test_the_worked_example_by_hand():
    """Reference: Fractions by hand, from the formula."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    raw = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    relu = lambda row: [max(Fraction(x), 0) for x in row]  # noqa: E731
    fq, fk, V = [relu(r) for r in raw["Q"]], [relu(r) for r in raw["K"]], [[Fraction(x) for x in r] for r in raw["V"]]
    table = [[sum(a * b for a, b in zip(fq[i], fk[j])) if j <= i else 0 for j in range(4)] for i in range(4)]
    z = [sum(row) for row in table]
    O = [[sum(table[i][j] * V[j][c] for j in range(4)) / z[i] for c in range(2)] for i in range(4)]
    assert _rows(d.step("phi_Q").exact) == fq and _rows(d.step("phi_K").exact) == fk
    assert _rows(d.step("S_lin").exact) == table
    assert [r[0] for r in _rows(d.step("z_lin").exact)] == z == [1, 4, 2, 10]
    assert _rows(d.step("A_lin").exact) == [[t / z[i] for t in row] for i, row in enumerate(table)]
    assert _rows(d.step("O").exact) == O == [[1, 0], [Fraction(3, 4), Fraction(1, 4)], [Fraction(1, 2), Fraction(1, 2)],
                                              [Fraction(9, 10), 0]]
    # the recurrent form: S_t and z_t by hand, one token at a time
    S, zt = [[Fraction(0)] * 2 for _ in range(2)], [Fraction(0)] * 2
    for t in range(4):
        S = [[S[a][b] + fk[t][a] * V[t][b] for b in range(2)] for a in range(2)]
        zt = [zt[a] + fk[t][a] for a in range(2)]
        assert _rows(d.step("S_state").exact)[t] == [S[0][0], S[0][1], S[1][0], S[1][1]]
        assert _rows(d.step("z_state").exact)[t] == zt
        assert _rows(d.step("O_rec").exact)[t] == [sum(fq[t][a] * S[a][c] for a in range(2)) / sum(
            fq[t][a] * zt[a] for a in range(2)) for c in range(2)]
    assert _rows(d.step("O_rec_diff").exact) == [[0, 0]] * 4
    # the cost table: the state's d_k·d_v + d_k = 6 numbers against the cache's t·(d_k + d_v) = 4t
    assert _rows(d.step("state_cost").exact) == [[6, 4 * t] for t in range(1, 5)]
    assert d.last_check is None or d.last_check.passed


# -- both forms against the paper's, in NumPy ---------------------------------------------------

CASES = {
    "relu-causal": ("relu", "causal", [[1, -2], [2, 1], ["1/2", 3], [-1, 1], [2, 2]]),
    "elu1-causal": ("elu1", "causal", [[1, -2], [-1, "1/2"], ["1/2", -3], [-1, -1], [2, 0]]),
    "identity-causal": ("identity", "causal", [[1, 2], [2, 2], ["1/2", 3], [1, 1], [2, 2]]),
    "elu1-none": ("elu1", "none", [[1, -2], [-1, "1/2"], ["1/2", -3], [-1, -1], [2, 0]]),
    "relu-padding": ("relu", "[causal, {padding: [1, 1, 0, 1, 1]}]", [[1, 2], [2, 1], ["1/2", 3], [1, 1], [2, 2]]),
    "elu1-none-padding": ("elu1", "{valid-length: 4}", [[1, -2], [-1, "1/2"], ["1/2", -3], [-1, -1], [2, 0]]),
}
KEYS = [[1, 1], [-2, 1], [1, 0], [0, 2], ["3/2", -1]]
VALUES = [[1, 0, 2], [0, 1, -1], [2, 2, 0], [1, -1, 1], [0, 3, "1/2"]]


def _case_text(feature: str, mask: str, Q) -> str:
    return (f"Q: {json.dumps(Q)}\nK: {json.dumps(KEYS)}\nV: {json.dumps(VALUES)}\nmask: {mask}\n"
            f"linear: {{feature: {feature}}}\n")


@pytest.mark.parametrize("case", sorted(CASES))
def test_both_forms_match_the_papers_formulas_in_numpy(case, tmp_path):
    """Reference: NumPy float64 written here from Katharopoulos et al. (2020), both forms."""
    feature, mask, Q = CASES[case]
    p, _ = _problem(_case_text(feature, mask, Q), tmp_path)
    d = symattn.derive(p)
    q = np.array([[float(Fraction(x)) for x in r] for r in Q])
    k = np.array([[float(Fraction(x)) for x in r] for r in KEYS])
    v = np.array([[float(Fraction(x)) for x in r] for r in VALUES])
    parallel, recurrent, states = katharopoulos(q, k, v, feature, p.mask.allowed)
    bound = _bound(parallel, states)
    assert np.max(np.abs(d.approx("O") - parallel)) <= bound
    assert np.max(np.abs(d.approx("O_rec") - recurrent)) <= bound
    assert np.max(np.abs(d.approx("S_state") - states)) <= bound
    assert symattn.crosscheck(d).passed


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_two_forms_are_exactly_equal(case, tmp_path):
    """Reference: SymPy's simplify of O_rec − O, entry by entry (the difference written here)."""
    feature, mask, Q = CASES[case]
    d = symattn.derive(_problem(_case_text(feature, mask, Q), tmp_path)[0])
    O, O_rec = d.step("O").exact, d.step("O_rec").exact
    for i in range(O.rows):
        for j in range(O.cols):
            assert sympy.simplify(O_rec[i, j] - O[i, j]) == 0, (i, j)
            assert d.step("O_rec_diff").exact[i, j] == 0  # the stage itself: exactly 0, not a rounding
    # the parallel form's rows sum to exactly 1
    A = d.step("A_lin").exact
    assert all(sympy.simplify(sum(A[i, j] for j in range(A.cols)) - 1) == 0 for i in range(A.rows))


def test_elu1_keeps_powers_of_e_exact_with_certified_decimals(tmp_path):
    """Reference: mpmath at 50 digits for elu(x) + 1 = e^x (x ≤ 0), x + 1 (x > 0)."""
    feature, mask, Q = CASES["elu1-causal"]
    d = symattn.derive(_problem(_case_text(feature, mask, Q), tmp_path)[0])
    phi = d.step("phi_Q").exact
    assert phi[0, 1] == sympy.exp(-2) and phi[1, 1] == sympy.Rational(3, 2) and phi[0, 0] == 2
    assert phi[3, 0] == sympy.exp(-1) and not phi[3, 0].is_Rational
    mpmath.mp.dps = 50
    for i, row in enumerate(Q):
        for j, x in enumerate(row):
            x = mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator
            want = x + 1 if x > 0 else mpmath.exp(x)
            assert abs(mpmath.mpf(sympy.N(phi[i, j], 50)) - want) < mpmath.mpf(10) ** -45
    text = symattn.render_text(d)
    assert "exp(-2)" in text and "0.1353" in text  # e^(−2), and its decimal


# -- PyTorch --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["relu-causal", "elu1-causal", "elu1-none", "relu-padding"])
def test_the_recurrent_form_matches_torch_cumsum(case, tmp_path):
    """Reference: PyTorch's F.relu / F.elu (+ 1) and the states as torch.cumsum, written here."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    feature, mask, Q = CASES[case]
    p, _ = _problem(_case_text(feature, mask, Q), tmp_path)
    d = symattn.derive(p)
    t = lambda rows: torch.tensor([[float(Fraction(x)) for x in r] for r in rows], dtype=torch.float64)  # noqa: E731
    phi = {"relu": F.relu, "elu1": lambda x: F.elu(x) + 1}[feature]
    fq, fk, V = phi(t(Q)), phi(t(KEYS)), t(VALUES)
    allowed = torch.tensor(p.mask.allowed)
    real = allowed.any(dim=0).double()
    outer = fk[:, :, None] * V[:, None, :] * real[:, None, None]
    if "causal" in mask:
        S, z = outer.cumsum(0), (fk * real[:, None]).cumsum(0)
    else:
        S, z = outer.sum(0).expand(len(Q), -1, -1), (fk * real[:, None]).sum(0).expand(len(Q), -1)
    O = (fq[:, :, None] * S).sum(1) / (fq * z).sum(1, keepdim=True)
    bound = _bound(O.numpy(), S.numpy())
    assert np.max(np.abs(d.approx("O") - O.numpy())) <= bound
    assert np.max(np.abs(d.approx("S_state") - S.reshape(len(Q), -1).numpy())) <= bound
    assert symattn.crosscheck(d, torch=True).passed


# -- several heads, and the combinations refused -------------------------------------------------

HEADS = """X: [[1, 0, 1], [0, 2, -1], [1, 1, 1], [-1, 0, 2]]
heads:
  - {W_Q: [[1, 0], [0, 1], [1, -1]], W_K: [[1, 1], [0, 1], [-1, 0]], W_V: [[1], [0], [1]]}
  - {W_Q: [[0, 1], [1, 0], [1, 1]], W_K: [[1, 0], [1, 1], [0, 1]], W_V: [[0, 1], [1, 0], [1, 1]]}
W_O: [[1, 0, 1], [0, 1, 0], [1, 1, 0]]
linear: {feature: elu1}
"""


def test_several_heads_each_get_both_forms(tmp_path):
    """Reference: NumPy from the paper, per head, then concat·W_O."""
    p, _ = _problem(HEADS, tmp_path)
    d = symattn.derive(p)
    X = np.array([[1, 0, 1], [0, 2, -1], [1, 1, 1], [-1, 0, 2]], float)
    outs = []
    for h, w in enumerate(p.heads, 1):
        f = lambda m: np.array([[float(x) for x in r] for r in m.tolist()])  # noqa: E731
        parallel, recurrent, _ = katharopoulos(X @ f(w.W_Q), X @ f(w.W_K), X @ f(w.W_V), "elu1", p.mask.allowed)
        assert np.max(np.abs(d.approx(f"head{h}.O") - parallel)) <= _bound(parallel)
        assert np.max(np.abs(d.approx(f"head{h}.O_rec") - recurrent)) <= _bound(parallel)
        assert all(x == 0 for x in d.step(f"head{h}.O_rec_diff").exact)
        outs.append(parallel)
    W_O = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]], float)
    assert np.max(np.abs(d.approx("O") - np.concatenate(outs, axis=1) @ W_O)) <= _bound(W_O, *outs)
    # the state's size summed over the heads: (2·1 + 2) + (2·2 + 2) = 10 numbers, against t·(3 + 4)
    assert _rows(d.step("state_cost").exact) == [[10, 7 * t] for t in range(1, 5)]
    assert "head1.phi_Q" in d.ids and "head2.S_state" in d.ids and "A" not in d.ids and "head1.A" not in d.ids
    data = json.loads(symattn.render(d, "json"))
    assert data["linear"] == {"feature": "elu1", "causal": True, "forms_equal": True, "state_numbers": 10,
                              "kv_cache_per_token": 7}


def test_causal_is_the_default_and_none_is_followed(tmp_path):
    text = "Q: [[1, 0], [0, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\nlinear: {feature: elu1}\n"
    p, _ = _problem(text, tmp_path)
    assert p.mask.kind == "causal"
    assert _rows(symattn.derive(p).step("S_lin").exact)[0][1] == 0
    p2, _ = _problem(text + "mask: none\n", tmp_path, "q.yaml")
    # elu(x) + 1 of (1, 0) and (0, 1): (2, 1)·(1, 2) = 4, now that query 1 reads key 2 too
    assert p2.mask.kind == "none" and _rows(symattn.derive(p2).step("S_lin").exact)[0][1] == 4


@pytest.mark.parametrize("option, field", [(["--backward"], "backward"), (["--tiled", "2"], "--tiled"),
                                           (["--decode", "2"], "--decode")])
def test_passes_linear_attention_has_none_of_are_refused_in_one_line(option, field, capsys):
    code = main(["derive", str(EXAMPLE), "-f", "text", *option])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("Error: ")
    assert f"{field}: " in err and "linear attention" in err


def test_a_vanishing_normaliser_is_refused_at_the_field_not_divided(tmp_path, capsys):
    text = "Q: [[1, 0], [-1, -2]]\nK: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\nlinear:\n  feature: relu\n"
    _, path = _problem(text, tmp_path)
    with pytest.raises(symattn.SymattnError) as e:
        symattn.derive(symattn.load_problem(path))
    assert (e.value.line, e.value.col, e.value.field) == (4, 1, "linear")
    assert "row 2" in e.value.message and "exactly 0" in e.value.message
    assert main(["derive", str(path), "-f", "json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "nan" not in err.lower()


# -- symattn check ------------------------------------------------------------------------------


def _mark(d, answers: dict, tmp_path) -> dict:
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump(answers))
    return {s["id"]: s for s in mark(d, load_answers(path, d)).as_dict()["stages"]}


def _text(rows) -> list[list[str]]:
    return [[str(Fraction(x).limit_denominator()) if not isinstance(x, str) else x for x in r] for r in rows]


def test_check_names_the_normaliser_left_out(tmp_path):
    """Reference: the mistake written here: the masked table and its product with V, not divided by z."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    table = np.array([[1, 0, 0, 0], [3, 1, 0, 0], [1, 1, 0, 0], [3, 2, 1, 4]], float)
    V = np.array([[1, 0], [0, 1], [2, 2], [1, -1]], float)
    by_id = _mark(d, {"A_lin": _text(table.tolist()), "O": _text((table @ V).tolist()),
                      "O_rec": _text((table @ V).tolist())}, tmp_path)
    for name in ("A_lin", "O_rec"):
        assert by_id[name]["status"] == "wrong"
        assert "normaliser was left out" in by_id[name]["diagnosis"], by_id[name]
    assert by_id["O"]["status"] == "follows" and by_id["O"]["follows_from"] == ["A_lin"]  # from their own A_lin
    alone = _mark(d, {"O": _text((table @ V).tolist())}, tmp_path)["O"]
    assert alone["status"] == "wrong" and "normaliser was left out" in alone["diagnosis"]


def test_check_names_the_scaling_by_root_d_k(tmp_path):
    """Reference: φ(Q/√d_k) and the table over √d_k written here in NumPy (d_k = 2)."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    Q = np.array([[1, -1], [2, 1], [-1, 1], [1, 2]], float)
    table = np.array([[1, 0, 0, 0], [3, 1, 0, 0], [1, 1, 0, 0], [3, 2, 1, 4]], float)
    rounded = lambda m: [[f"{x:.4f}" for x in r] for r in m]  # noqa: E731
    by_id = _mark(d, {"phi_Q": rounded(np.maximum(Q, 0) / np.sqrt(2)), "S_lin": rounded(table / np.sqrt(2))}, tmp_path)
    assert by_id["phi_Q"]["status"] == "wrong" and "scaled by 1/√d_k" in by_id["phi_Q"]["diagnosis"], by_id["phi_Q"]
    assert by_id["S_lin"]["status"] == "follows"  # right from the student's own scaled features
    alone = _mark(d, {"S_lin": rounded(table / np.sqrt(2))}, tmp_path)["S_lin"]
    assert alone["status"] == "wrong" and "scaled by 1/√d_k" in alone["diagnosis"], alone
    # relu is positively homogeneous: the factor cancels in the weights, so no mistake is named there
    feature, mask, Qe = CASES["elu1-causal"]
    de = symattn.derive(_problem(_case_text(feature, mask, Qe), tmp_path, "e.yaml")[0])
    q = np.array([[float(Fraction(x)) for x in r] for r in Qe]) / np.sqrt(2)
    k = np.array([[float(Fraction(x)) for x in r] for r in KEYS]) / np.sqrt(2)
    v = np.array([[float(Fraction(x)) for x in r] for r in VALUES])
    scaled, _, _ = katharopoulos(q, k, v, "elu1", de.problem.mask.allowed)
    o = _mark(de, {"O": rounded(scaled)}, tmp_path)["O"]
    assert o["status"] == "wrong" and "scaled by 1/√d_k" in o["diagnosis"], o


def test_right_answers_pass(tmp_path):
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    answers = {s.id: [[str(x) for x in row] for row in _rows(s.exact)] for s in d if s.id not in ("Q", "K", "V")}
    by_id = _mark(d, answers, tmp_path)
    assert all(s["status"] == "right" for s in by_id.values()), by_id


# -- every format -------------------------------------------------------------------------------


def test_every_format_shows_both_forms(tmp_path, capsys):
    for fmt, marks in (("text", ["O_rec − O", "state (linear)", "Σ_j (φ(q_i)·φ(k_j))"]),
                       ("markdown", ["\\varphi(q_{1})", "S_t = S_{t-1}"]),
                       ("latex", ["\\varphi(k_{1})", "O_{rec} - O"]),
                       ("html", ["stage-S_state", "stage-O_rec_diff"])):
        assert main(["derive", str(EXAMPLE), "-f", fmt]) == 0
        out = capsys.readouterr().out
        assert all(m in out for m in marks), (fmt, [m for m in marks if m not in out])
        assert "softmax(Q" not in out.replace("softmax's", "")
    assert main(["derive", str(EXAMPLE), "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ids = [s["id"] for s in data["stages"]]
    assert ids == ["Q", "K", "V", "phi_Q", "phi_K", "S_lin", "z_lin", "A_lin", "O", "z_state", "S_state", "rec_num",
                   "rec_den", "O_rec", "O_rec_diff", "state_cost"]
    assert data["crosscheck"]["passed"] is True
    # by hand: d_k·d_v + d_k = 2·2 + 2 state numbers, d_k + d_v = 4 cache numbers per token
    assert data["linear"] == {"feature": "relu", "causal": True, "forms_equal": True, "state_numbers": 6,
                              "kv_cache_per_token": 4}


def test_the_zero_test_finds_zeros_and_invents_none():
    """Reference: the identities written here (e^a·e^b = e^(a+b), a common denominator) and mpmath for nonzeros."""
    from symattn.exact.linear import vanishes

    e = sympy.exp
    assert vanishes(4 / (2 + 4 * e(2)) + 8 / (2 * e(-2) + 4) - 2)  # the two quotients of one head's row
    assert vanishes(e(sympy.Rational(-1, 2)) ** 2 - 1 / sympy.E)
    assert vanishes(1 / (1 + 11 * sympy.E) - e(-1) / (11 + e(-1)))
    for nonzero in (e(-1) + 1 - 1, 1 / (1 + 11 * sympy.E) - 1 / (11 + e(-1)), sympy.sqrt(2) * e(-1) - e(-1)):
        assert not vanishes(nonzero) and abs(sympy.N(nonzero, 30)) > 1e-3


@pytest.mark.parametrize("feature, n, d, fits", [("relu", 125, 8, True), ("relu", 126, 8, False),
                                                 ("elu1", 43, 4, True), ("elu1", 44, 4, False)])
def test_the_size_budget_counts_the_table_and_the_state(feature, n, d, fits):
    """Reference: the count written here, n² × d_k × d_v against 1,000,000 (30,000 with elu1); the scale
    1/√8 is irrational but linear attention has no softmax to keep in SymPy expressions."""
    from symattn.problem.budget import check_budget

    rows = "[" + ", ".join(["[" + ", ".join(["1"] * d) + "]"] * n) + "]"
    p = symattn.load_problem(f"Q: {rows}\nK: {rows}\nV: {rows}\nlinear: {{feature: {feature}}}\n")
    if fits:
        check_budget(p, "latex", False)
    else:
        with pytest.raises(symattn.SymattnError, match=f"{n * n * d * d:,} terms of linear attention's table and state"):
            check_budget(p, "latex", False)


def test_the_heat_map_shows_the_linear_weights(tmp_path):
    """Reference: the worked example's weights by hand (row 4: 3/10, 1/5, 1/10, 2/5), read back from the SVG's labels."""
    pytest.importorskip("matplotlib")
    from symattn.render.plot import plot_weights

    svg = plot_weights(symattn.derive(symattn.load_problem(EXAMPLE)), ".svg").decode("utf-8")
    assert "Attention weights A_lin" in svg
    for label in ("0.30", "0.20", "0.10", "0.40", "0.75", "0.25"):
        assert label in svg, label


# -- symattn generate --linear ------------------------------------------------------------------


@pytest.mark.parametrize("feature, options", [("relu", {"d_k": 2, "d_v": 2}), ("elu1", {"tokens": 3, "mask": "padding:1"}),
                                              ("identity", {"heads": 2, "mask": "none"})])
def test_generated_linear_exercises_keep_their_guarantees(feature, options):
    """Reference: each problem's features and normalisers recomputed here in NumPy from its own numbers."""
    problems = symattn.generate(3, seed=11, linear=feature, **options)
    assert [p.to_yaml() for p in problems] == [p.to_yaml() for p in symattn.generate(3, seed=11, linear=feature, **options)]
    for p in problems:
        assert p.linear.feature == feature and f"linear: {{feature: {feature}}}" in p.to_yaml()
        d = symattn.derive(p)
        assert symattn.crosscheck(d).passed
        X = np.array(p.X.tolist(), float)
        for h, w in enumerate(p.heads, 1):
            f = lambda m: np.array(m.tolist(), float)  # noqa: E731
            Q, K = X @ f(w.W_Q), X @ f(w.W_K)
            phi = FEATURES[feature]
            table = np.where(np.array(p.mask.allowed), phi(Q) @ phi(K).T, 0.0)
            assert (table.sum(axis=1) > 0).all()  # every normaliser positive
            if feature == "relu":
                assert (Q < 0).any() or (K < 0).any()  # relu cuts something
                assert phi(K).any(axis=1).all()
            prefix = f"head{h}." if p.multi_head else ""
            assert all(x == 0 for x in d.step(prefix + "O_rec_diff").exact)


def test_generate_linear_refuses_what_it_cannot_follow(capsys):
    for args, message in ((["--linear", "relu", "--no-scale"], "--no-scale"),
                          (["--linear", "elu1", "--mask", "sliding-window:2"], "follows --mask none, causal or padding"),
                          (["--linear", "relu", "--cross", "3"], "--cross"),
                          (["--linear", "relu", "--block"], "--block")):
        assert main(["generate", *args]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


BLOCK = """X: [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1], [0, 1, 0, 1]]
W_Q: [[1, 0], [0, 1], [1, 1], [0, 1]]
W_K: [[0, 1], [1, 0], [-1, 1], [1, 0]]
W_V: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]]
linear: {feature: relu}
mlp: {W_1: [[1, 0], [0, 1], [1, 1], [0, 0]], W_2: [[1, 0, 0, 1], [0, 1, 1, 0]], activation: relu}
"""


def test_the_rest_of_the_block_reads_the_linear_output(tmp_path):
    """Reference: NumPy from the paper for O, then H = X + O and the ReLU MLP written here."""
    p, _ = _problem(BLOCK, tmp_path)
    d = symattn.derive(p)
    X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1], [0, 1, 0, 1]], float)
    f = lambda m: np.array(m.tolist(), float)  # noqa: E731
    O, _, _ = katharopoulos(X @ f(p.W_Q), X @ f(p.W_K), X @ f(p.W_V), "relu", p.mask.allowed)
    H = X + O
    Y = H + np.maximum(H @ f(p.mlp.W_1), 0) @ f(p.mlp.W_2)
    assert np.max(np.abs(d.approx("Y") - Y)) <= _bound(Y)
    assert symattn.crosscheck(d).passed
    page = symattn.render(d, "html")
    assert "linear: φ(Q)φ(K)ᵀ masked," in page and "softmax(Q·Kᵀ" not in page  # the residual stream picture
    from symattn.render.display import derivation_latex

    assert "\\varphi(q_i)" in derivation_latex(d) and "softmax" not in derivation_latex(d)


GQA = """X: [[1, 0], [0, 1]]
kv_heads: 1
heads:
  - W_Q: [[1, 0], [0, 1]]
  - W_Q: [[0, 1], [1, 0]]
kv:
  - {W_K: [[1, 0], [0, 1]], W_V: [[1], [0]]}
W_O: [[1], [1]]
"""
QKV = "Q: [[1, 0], [0, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\n"


@pytest.mark.parametrize("text, field, words", [
    (QKV + "bias: [[0, 0], [0, 0]]\n", "bias", "no place in linear attention"),
    (QKV + "tiling: {block: 1}\n", "tiling", "no softmax to tile"),
    (QKV + "mask: causal\ndecode: 2\n", "decode", "constant-size state"),
    (QKV + "symbols: [a]\n", "symbols", "needs numbers"),
    (QKV + "mask: causal-bottom-right\n", "mask", "a causal-bottom-right mask is not one of them"),
    (GQA, "kv_heads", "shared keys and values"),
])
def test_fields_linear_attention_cannot_follow_are_one_line_at_their_field(text, field, words, tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(text + "linear: {feature: relu}\n", encoding="utf-8")
    assert main(["derive", str(path), "-f", "json"]) == 1
    out, err = capsys.readouterr()
    line = next(k for k, row in enumerate((text + "linear:").splitlines(), 1) if row.startswith(field + ":"))
    assert out == "" and len(err.splitlines()) == 1 and f"{path}:{line}:" in err, err
    assert f": {field}: " in err and words in err, err
