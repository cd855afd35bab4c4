"""Positional encodings (``positions:``): the stages PE and X_pos.

The references are written here: the sinusoidal encodings in NumPy as the papers and
tutorials write them, and again in mpmath at 30 digits from the formula; a learned matrix
is added by hand with fractions; the attention after X + PE is recomputed with NumPy (and
PyTorch's SDPA where installed). symattn's own derivation never produces an expected value.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy

import symattn
from symattn import SymattnError
from _child import SymattnCli
from _reference import answers_text, attention_loss_rounding, central_difference_bound, rounded_grid

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "sinusoidal_positions.yaml"

X3 = "X: [[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 1, 1]]\n"
W4 = ("W_Q: [[1, 0], [0, 1], [1, 1], [0, 0]]\n"
      "W_K: [[0, 1], [1, 0], [0, 0], [1, 1]]\n"
      "W_V: [[1, 0], [0, 1], [1, 0], [0, 1]]\n")


def numpy_pe(n: int, d: int, base: float) -> np.ndarray:
    """Sinusoidal encodings as a tutorial writes them (positions from 0, sin even, cos odd)."""
    pe = np.zeros((n, d))
    for p in range(n):
        for i in range(0, d, 2):
            angle = p / base ** (i / d)
            pe[p, i] = math.sin(angle)
            if i + 1 < d:
                pe[p, i + 1] = math.cos(angle)
    return pe


def mpmath_pe(n: int, d: int, base, dps: int = 30) -> list[list[mpmath.mpf]]:
    with mpmath.workdps(dps + 10):
        b = mpmath.mpf(base.numerator) / base.denominator if isinstance(base, Fraction) else mpmath.mpf(base)
        return [[(mpmath.sin if k % 2 == 0 else mpmath.cos)(p / mpmath.power(b, mpmath.mpf(2 * (k // 2)) / d))
                 for k in range(d)] for p in range(n)]


def attention(X, W_Q, W_K, W_V, allowed):
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T / np.sqrt(Q.shape[1])
    S = np.where(allowed, S, -np.inf)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return A, A @ V


def derive(text: str, **kw):
    return symattn.derive(symattn.load_problem(text), **kw)


# -- the sinusoidal encodings ---------------------------------------------------------------


@pytest.mark.parametrize(("base", "base_text"), [(10000, None), (100, "100"), (2.5, "5/2"), (10000, "10000")])
@pytest.mark.parametrize("d", [4, 5, 6])
def test_sinusoidal_pe_against_numpy_and_mpmath(base, base_text, d):
    n = 4
    X = "X: [" + ", ".join("[" + ", ".join(str((i + j) % 3) for j in range(d)) + "]" for i in range(n)) + "]\n"
    W = "\n".join(f"{w}: [" + ", ".join("[" + ", ".join("1" if (i + c) % d == 0 else "0" for c in range(2)) + "]"
                                         for i in range(d)) + "]" for w in ("W_Q", "W_K", "W_V")) + "\n"
    positions = "positions: sinusoidal\n" if base_text is None else f"positions: {{sinusoidal: {{base: {base_text}}}}}\n"
    d_ = derive(X + W + positions)
    exact = d_.step("PE").exact
    assert exact[0, 0] == 0 and exact[0, 1] == 1  # p = 0: sin 0, cos 0
    assert all(isinstance(x, sympy.Expr) and not isinstance(x, sympy.Float) for x in exact)  # never a float
    want = numpy_pe(n, d, base)
    assert np.abs(d_.approx("PE") - want).max() < 1e-12
    reference = mpmath_pe(n, d, Fraction(base_text) if base_text else base)
    got = d_.evaluate("PE", 30)
    for r_row, g_row in zip(reference, got):
        for r, g in zip(r_row, g_row):
            assert abs(r - g) < mpmath.mpf(10) ** -29
    # the exact entries themselves, evaluated by mpmath at 30 digits
    with mpmath.workdps(40):
        for p in range(n):
            for k in range(d):
                assert abs(mpmath.mpf(str(sympy.N(exact[p, k], 40))) - reference[p][k]) < mpmath.mpf(10) ** -29


def test_the_example_entries_are_the_exact_sines_and_cosines():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    pe = d.step("PE").exact
    s, c = sympy.sin, sympy.cos
    R = sympy.Rational
    assert pe.tolist() == [[0, 1, 0, 1], [s(1), c(1), s(R(1, 100)), c(R(1, 100))], [s(2), c(2), s(R(1, 50)), c(R(1, 50))]]
    # the scores read the fast pair of columns, where the tokens are 0: q_i·k_j = cos(p_i − p_j)
    S = d.step("S").exact
    for i in range(3):
        for j in range(3):
            assert sympy.simplify(S[i, j] - c(i - j)) == 0
    assert S[1, 1] == 1  # sin²1 + cos²1 collected exactly


def test_x_pos_and_the_whole_layer_against_numpy_written_here():
    text = X3 + W4 + "positions: {sinusoidal: {base: 100}}\nmask: causal\n"
    d = derive(text)
    X = np.array([[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=float)
    Xp = X + numpy_pe(3, 4, 100.0)
    W_Q = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    W_K = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
    W_V = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=float)
    A, O = attention(Xp, W_Q, W_K, W_V, np.tril(np.ones((3, 3), dtype=bool)))
    assert np.abs(d.approx("X_pos") - Xp).max() < 1e-12
    assert np.abs(d.approx("Q") - Xp @ W_Q).max() < 1e-12
    assert np.abs(d.approx("A") - A).max() < 1e-12
    assert np.abs(d.approx("O") - O).max() < 1e-12
    ids = d.ids
    assert ids.index("X") < ids.index("PE") < ids.index("X_pos") < ids.index("W_Q")


def test_learned_positions_are_added_exactly():
    pe = [["1/2", "0", "-1", "3/4"], ["0", "1/3", "0", "0"], ["2", "0", "1/5", "-1/2"]]
    text = X3 + W4 + "positions: [" + ", ".join("[" + ", ".join(f'"{x}"' for x in r) + "]" for r in pe) + "]\n"
    d = derive(text)
    X = [[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 1, 1]]
    want = [[Fraction(x) + Fraction(p) for x, p in zip(xr, pr)] for xr, pr in zip(X, pe)]
    got = d.step("X_pos").exact
    assert [[Fraction(int(v.p), int(v.q)) for v in row] for row in got.tolist()] == want
    assert d.step("PE").given
    assert d.step("PE").title == "Learned positions"


def test_cross_attention_adds_positions_to_the_queries_only():
    text = (X3 + "context: [[1, 1, 0, 0], [0, 0, 1, 1]]\n" + W4 + "positions: sinusoidal\n")
    d = derive(text)
    X = np.array([[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=float)
    C = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=float)
    W_Q = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    W_K = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
    assert np.abs(d.approx("Q") - (X + numpy_pe(3, 4, 10000.0)) @ W_Q).max() < 1e-12
    assert np.abs(d.approx("K") - C @ W_K).max() < 1e-12  # the context is taken as given
    assert "Only" in d.step("PE").why and "context" in d.step("PE").why


def test_backward_through_x_pos_against_numpy_finite_differences():
    text = X3 + W4 + "positions: sinusoidal\nmask: causal\nbackward: {loss: sum}\n"
    d = derive(text)
    X = np.array([[1, 0, 2, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=float)
    PE = numpy_pe(3, 4, 10000.0)
    W_Q = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=float)
    W_K = np.array([[0, 1], [1, 0], [0, 0], [1, 1]], dtype=float)
    W_V = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=float)
    mask = np.tril(np.ones((3, 3), dtype=bool))

    def loss(X_):
        return attention(X_ + PE, W_Q, W_K, W_V, mask)[1].sum()

    def central(h):  # divided by the step taken in float64, so x ± h's own rounding adds nothing
        dX = np.zeros_like(X)
        for i in range(3):
            for j in range(4):
                e = np.zeros_like(X)
                e[i, j] = h
                dX[i, j] = (loss(X + e) - loss(X - e)) / ((X + e)[i, j] - (X - e)[i, j])
        return dX

    # The bound of a central difference, from the step, a second step h/2 and the loss's own
    # rounding: its magnitudes, stage by stage (tests/_reference.py).
    h = 1e-5
    dX = central(h)
    ids = [s.id for s in d.steps]
    gradients = {i: d.approx(i) for i in ids if i.startswith("d")}
    rounding = attention_loss_rounding({i: d.approx(i) for i in ids if not i.startswith("d")}, gradients)
    bound = central_difference_bound(dX, central(h / 2), h, rounding)
    assert (np.abs(d.approx("dX") - dX) <= bound).all(), (d.approx("dX") - dX, bound)


def test_torch_cross_check_passes_with_positions():
    pytest.importorskip("torch")
    text = X3 + W4 + "positions: sinusoidal\nmask: causal\nbackward: {loss: sum}\n"
    d = derive(text)
    check = symattn.crosscheck(d, torch=True)
    assert check.passed and check.torch is not None and check.torch.passed


# -- every format shows the stages ---------------------------------------------------------------


def test_every_format_shows_pe_and_x_pos():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    tex = symattn.render_latex(d, standalone=True)
    md = symattn.render_markdown(d)
    text = symattn.render_text(d)
    page = symattn.render_html(d)
    data = json.loads(symattn.render_json(d))
    assert "\\sin" in tex and "X_{pos}" in tex
    assert "Add the positions" in md and "PE" in md
    assert "sin(1/100)" in text and "X_pos = X + PE" in text
    assert 'data-stage="PE"' in page and 'data-stage="X_pos"' in page
    stage_ids = [s["id"] for s in data["stages"]]
    assert "PE" in stage_ids and "X_pos" in stage_ids
    assert "⟦p = 0⟧" in d.step("PE").why and "token ⟦1⟧ of this text has ⟦p = 0⟧" in d.step("PE").why


# -- symattn check marks PE and X_pos -------------------------------------------------------------


def _check(cli: SymattnCli, tmp_path, problem: str, answers: dict[str, list[list[str]]]) -> dict:
    (tmp_path / "p.yaml").write_text(problem, "utf-8")
    (tmp_path / "a.yaml").write_text(answers_text(answers), "utf-8")
    r = cli("check", str(tmp_path / "p.yaml"), str(tmp_path / "a.yaml"), "--format", "json",
            catch_exceptions=False)
    return {s["id"]: s for s in json.loads(r.stdout)["stages"]}


def _mp(rows):
    return [[mpmath.mpf(x) for x in row] for row in rows]


def test_check_marks_pe_right_and_names_the_common_slips(symattn_cli, tmp_path):
    problem = EXAMPLE.read_text("utf-8")
    right = mpmath_pe(3, 4, 10000)
    swapped = [[row[k + 1] if k % 2 == 0 else row[k - 1] for k in range(4)] for row in right]
    from_one = mpmath_pe(4, 4, 10000)[1:]
    marks = _check(symattn_cli, tmp_path, problem, {"PE": rounded_grid(right, 4)})
    assert marks["PE"]["status"] == "right"
    marks = _check(symattn_cli, tmp_path, problem, {"PE": rounded_grid(swapped, 4)})
    assert marks["PE"]["status"] == "wrong" and "sin and cos swapped" in marks["PE"]["diagnosis"]
    marks = _check(symattn_cli, tmp_path, problem, {"PE": rounded_grid(from_one, 4)})
    assert marks["PE"]["status"] == "wrong" and "counted from 1" in marks["PE"]["diagnosis"]


def test_check_follows_x_pos_through_a_wrong_pe(symattn_cli, tmp_path):
    problem = EXAMPLE.read_text("utf-8")
    X = [[0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 1, 1]]
    from_one = mpmath_pe(4, 4, 10000)[1:]
    x_pos = [[x + p for x, p in zip(xr, pr)] for xr, pr in zip(X, from_one)]
    marks = _check(symattn_cli, tmp_path, problem, {"PE": rounded_grid(from_one, 4), "X_pos": rounded_grid(x_pos, 4)})
    assert marks["X_pos"]["status"] == "follows"
    # X_pos written as X (the positions forgotten) is wrong and named
    marks = _check(symattn_cli, tmp_path, problem, {"X_pos": [[str(x) for x in row] for row in X]})
    assert marks["X_pos"]["status"] == "wrong" and "not added" in marks["X_pos"]["diagnosis"]


# -- bad input: one line, with the position ------------------------------------------------------


@pytest.mark.parametrize(("tail", "where", "field", "fragment"), [
    ("positions: rotary\n", (5, 12), "positions", "unknown positions 'rotary'"),
    ("positions: sinusodial\n", (5, 12), "positions", "(did you mean 'sinusoidal'?)"),
    ("positions: {sinusoidal: {base: 0}}\n", (5, 32), "positions.sinusoidal.base", "the base must be positive, not 0"),
    ("positions: {sinusoidal: {base: -2}}\n", (5, 32), "positions.sinusoidal.base", "the base must be positive"),
    ("positions: {sinusoidal: {bass: 2}}\n", (5, 26), "positions.sinusoidal", "(did you mean 'base'?)"),
    ("positions: [[1, 0, 0, 0], [0, 1, 0, 0]]\n", (5, 12), "positions",
     "the learned positions are 2×4 but X is 3×4"),
    ("positions: [[1, 0, 0], [0, 1, 0], [0, 0, 1]]\n", (5, 12), "positions",
     "the learned positions are 3×3 but X is 3×4"),
])
def test_bad_positions(tail, where, field, fragment):
    with pytest.raises(SymattnError) as info:
        symattn.load_problem(X3 + W4 + tail)
    err = info.value
    assert (err.line, err.col) == where, str(err)
    assert err.field == field
    assert fragment in err.message


def test_positions_need_x():
    with pytest.raises(SymattnError, match="positions are added to X"):
        symattn.load_problem("Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1]]\npositions: sinusoidal\n")
