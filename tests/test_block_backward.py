"""backward: {loss: cross-entropy}: the gradients through the model's head and the MLP.

References, per test:
- the activations' slopes: mpmath's numerical derivative (``mpmath.diff``) of each activation's own
  formula, at 40 digits, against symattn's exact slope (SymPy) and its ball arithmetic;
- every gradient stage of hand-sized blocks in each shape (ReLU with biases; SwiGLU with RMSNorm, a
  final norm and rows: last; BERT's post norms with GELU; GPT-2's tanh GELU; ReLU²; the head without
  an MLP): the exact entries (SymPy, evaluated at 30 digits), symattn's certified decimals (flint
  balls) and PyTorch autograd through F.cross_entropy (symattn.reference's graph) agree at 1e-12,
  and the loss's own central differences in NumPy, written here from the problem's numbers, agree
  with dW_1, dW_2, dW_U and the final norm's γ at the bound of their step;
- by hand: dlogits is (P − onehot)/rows, entry by entry from the exact P.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy

import symattn
from symattn.exact.arb_ops import ARB_ACTIVATIONS
from symattn.exact.block import EXACT, NUMERIC
from symattn.problem.load import load_problem
from test_problem_checkpoints import _write

ATTENTION = ("tokens: [a, b, c]\nX: [[1, 0, 2], [0, 1, -1], [1, 1, 0]]\nW_Q: [[1, 0], [0, 1], [1, 1]]\n"
             "W_K: [[0, 1], [1, 0], [1, -1]]\nW_V: [[1, 0, 1], [0, 2, 0], [1, 0, -1]]\n")
W_U = "[[1, 0, -1, 1], [0, 1, 1, -1], [1, 1, 0, 0]]"
CE = "backward: {loss: cross-entropy}\n"
BLOCKS = {
    "relu": ATTENTION + "mask: causal\nmlp:\n  W_1: [[1, -1], [0, 1], [1, 0]]\n  b_1: [1/2, -1]\n"
                        "  W_2: [[1, 0, -1], [0, 1, 1]]\n  b_2: [0, 1, 0]\n  activation: relu\n"
                        f"logits: {{W_U: {W_U}}}\nloss: {{targets: [1, 2, 3]}}\n",
    "swiglu": ATTENTION + "mask: causal\nnorm: {type: rmsnorm, weight: [[1, 2, 1/2]], eps: 1/100}\n"
                          "mlp:\n  norm: {type: rmsnorm, weight: [[1, 1/2, 2]], eps: 1/100}\n"
                          "  W_gate: [[1, -1], [0, 1], [1, 0]]\n  W_up: [[0, 1], [1, 1], [-1, 0]]\n"
                          "  W_down: [[1, 0, -1], [0, 1, 1]]\n  activation: silu\n"
                          f"logits:\n  norm: {{type: rmsnorm, weight: [[2, 1, 1]], eps: 1/100}}\n  W_U: {W_U}\n"
                          "  rows: last\nloss: {targets: [2]}\n",
    "bert": ATTENTION + "mask: none\n"
                        "norm: {type: layernorm, weight: [[1, 2, 1/2]], bias: [[0, 1, -1]], eps: 1/100, place: post}\n"
                        "mlp:\n  norm: {type: layernorm, weight: [[1, 1/2, 2]], bias: [[1, 0, 0]], eps: 1/100, "
                        "place: post}\n  W_1: [[1, -1], [0, 1], [1, 0]]\n  b_1: [1/2, -1]\n"
                        "  W_2: [[1, 0, -1], [0, 1, 1]]\n  b_2: [0, 1, 0]\n  activation: gelu\n"
                        f"logits: {{W_U: {W_U}}}\nloss: {{targets: [1, 2, 3]}}\n",
    "gpt2": ATTENTION + "mask: causal\nnorm: {type: layernorm, weight: [[1, 2, 1/2]], bias: [[0, 1, -1]], eps: 1/100}\n"
                        "mlp:\n  norm: {type: layernorm, eps: 1/100}\n  W_1: [[1, -1], [0, 1], [1, 0]]\n"
                        "  b_1: [1/2, -1]\n  W_2: [[1, 0, -1], [0, 1, 1]]\n  activation: gelu-tanh\n"
                        f"logits:\n  norm: {{type: layernorm, weight: [[1, 1, 2]], bias: [[0, 1, 0]], eps: 1/100}}\n"
                        f"  W_U: {W_U}\nloss: {{targets: [1, 2, 3]}}\n",
    "relu2": ATTENTION + "mask: causal\nmlp:\n  W_1: [[1, -1], [0, 1], [1, 0]]\n  W_2: [[1, 0, -1], [0, 1, 1]]\n"
                         f"  activation: relu2\nlogits: {{W_U: {W_U}, rows: last}}\nloss: {{targets: [0]}}\n",
    "head": ATTENTION + "mask: causal\nresidual: true\n"
                        f"logits:\n  norm: {{type: layernorm, eps: 1/100}}\n  W_U: {W_U}\nloss: {{targets: [1, 2, 3]}}\n",
}


BLOCKS["by_hand"] = (Path(__file__).parent.parent / "worked_examples" / "block_by_hand.yaml").read_text("utf-8")


def _derive(tmp_path, text, name="p.yaml"):
    return symattn.derive(load_problem(_write(tmp_path, text, name)))


def _gradients(d):
    return [s for s in d.steps if s.kind_of is not None and s.kind_of.gradient]


@pytest.mark.parametrize("name", ["relu", "relu2", "gelu", "gelu-tanh", "silu"])
def test_each_activations_slope_against_mpmaths_derivative(name):
    mpmath.mp.dps = 40
    f = NUMERIC[name]
    import flint

    for x in ("-7/5", "-1/3", "1/7", "2", "13/4"):
        q = sympy.Rational(x)
        point = mpmath.mpf(q.p) / q.q
        want = mpmath.diff(f, point)
        exact = EXACT["d:" + name](q)
        assert abs(mpmath.mpf(sympy.N(exact, 45)) - want) < mpmath.mpf(10) ** -30, (name, x)
        flint.ctx.dps = 40
        ball = ARB_ACTIVATIONS["d:" + name](flint.arb(flint.fmpq(q.p, q.q)))
        assert abs(mpmath.mpf(ball.mid().str(40, radius=False)) - want) < mpmath.mpf(10) ** -30, (name, x)
        assert ball.rad() < 10 ** -35, (name, x)
    flint.ctx.dps = 15


@pytest.mark.parametrize("block", sorted(BLOCKS))
def test_every_gradient_exact_balls_and_autograd_agree(tmp_path, block):
    pytest.importorskip("torch")
    from symattn.reference.numeric_backward import numeric_gradients
    from symattn.reference.torch_backward import torch_gradients

    d = _derive(tmp_path, BLOCKS[block] + CE)
    p = d.problem
    torch_ref, numpy_ref = torch_gradients(p), numeric_gradients(p)
    grads, checked = _gradients(d), 0
    assert {s.id for s in grads} == set(torch_ref) == set(numpy_ref)
    for step in grads:
        balls = np.array(d.evaluate(step.id, 30), dtype=float)
        scale = max(1.0, np.abs(torch_ref[step.id]).max())
        np.testing.assert_allclose(balls, torch_ref[step.id], rtol=0, atol=1e-12 * scale, err_msg=step.id)
        np.testing.assert_allclose(numpy_ref[step.id], torch_ref[step.id], rtol=0, atol=1e-12 * scale, err_msg=step.id)
        # the exact structure (the solution's, and dlogits of the blocks without a norm's roots), by SymPy
        if step.written_exactly or step.id == "dlogits" and block in ("relu", "relu2"):
            exact = np.array([[float(sympy.N(x, 30)) for x in row] for row in sympy.Matrix(step.exact).tolist()])
            np.testing.assert_allclose(exact, balls, rtol=0, atol=1e-14 * scale, err_msg=step.id)
            checked += 1
    assert checked >= {"by_hand": 4, "relu": 1, "relu2": 1}.get(block, 0), "the hand-sized gradients are exact"
    assert symattn.crosscheck(d, torch=True).passed


def _forward_loss(X, W_Q, W_K, W_V, W_1, b_1, W_2, b_2, W_U, targets, causal=True):
    """The loss of the "relu" block in NumPy, written from its formulas (one head, no norm)."""
    S = (X @ W_Q) @ (X @ W_K).T / np.sqrt(W_Q.shape[1])
    if causal:
        S = np.where(np.tril(np.ones_like(S)) > 0, S, -np.inf)
    A = np.exp(S - S.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    H = X + A @ (X @ W_V)
    Y = H + np.maximum(H @ W_1 + b_1, 0) @ W_2 + b_2
    z = Y @ W_U
    m = z.max(axis=1, keepdims=True)
    logp = z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(targets)), targets].mean()


def test_the_weights_gradients_against_central_differences_of_the_loss(tmp_path):
    d = _derive(tmp_path, BLOCKS["relu"] + CE)
    weights = dict(X=[[1, 0, 2], [0, 1, -1], [1, 1, 0]], W_Q=[[1, 0], [0, 1], [1, 1]], W_K=[[0, 1], [1, 0], [1, -1]],
                   W_V=[[1, 0, 1], [0, 2, 0], [1, 0, -1]], W_1=[[1, -1], [0, 1], [1, 0]], b_1=[[0.5, -1]],
                   W_2=[[1, 0, -1], [0, 1, 1]], b_2=[[0, 1, 0]], W_U=json.loads(W_U))
    weights = {k: np.array(v, dtype=float) for k, v in weights.items()}
    targets = [1, 2, 3]
    assert abs(_forward_loss(**weights, targets=targets) - d.approx("L")[0, 0]) < 1e-14
    h = 1e-5
    for name, stage in (("W_1", "dW_1"), ("b_1", "db_1"), ("W_2", "dW_2"), ("W_U", "dW_U"), ("W_V", "dW_V"),
                        ("X", "dX")):
        fd = np.zeros_like(weights[name])
        for ij in np.ndindex(fd.shape):
            up, down = dict(weights), dict(weights)
            up[name], down[name] = weights[name].copy(), weights[name].copy()
            up[name][ij] += h
            down[name][ij] -= h
            fd[ij] = (_forward_loss(**up, targets=targets) - _forward_loss(**down, targets=targets)) / (2 * h)
        # a central difference of a smooth loss is off by h²·|L'''|/6 (here under 1e-9: the third
        # derivatives are O(1)) plus the loss's float64 rounding over the step, 1e-16/h ≈ 1e-11; no
        # ReLU input of this block is within h of 0 (checked), so each difference stays on one side
        assert np.abs(d.approx("U")).min() > 1e-3
        np.testing.assert_allclose(d.approx(stage), fd, rtol=0, atol=1e-8, err_msg=stage)


def test_dlogits_is_p_minus_onehot_over_the_rows(tmp_path):
    d = _derive(tmp_path, BLOCKS["relu"] + CE)
    P, dz = sympy.Matrix(d.step("P").exact), sympy.Matrix(d.step("dlogits").exact)
    for i, t in enumerate([1, 2, 3]):
        for v in range(4):
            assert sympy.simplify(dz[i, v] - (P[i, v] - (1 if v == t else 0)) / 3) == 0
        assert sympy.N(sum(dz[i, :]), 30) == 0 or abs(sympy.N(sum(dz[i, :]), 30)) < 1e-28


def test_a_row_without_a_target_has_no_gradient_and_rows_last_fills_the_last_row(tmp_path):
    d = _derive(tmp_path, BLOCKS["swiglu"] + CE)
    dY = d.approx("dY")
    assert np.all(dY[:-1] == 0) and np.abs(dY[-1]).max() > 0
    np.testing.assert_allclose(dY[-1:], d.approx("dY_last"), rtol=0, atol=1e-15)


def test_the_solution_says_each_step_in_every_format(tmp_path):
    d = _derive(tmp_path, BLOCKS["gpt2"] + CE)
    text = symattn.render(d, "text")
    for title in ("Backward: back through the loss and the softmax", "Back through the unembedding",
                  "Back through the final norm (LayerNorm)", "Back through the MLP's residual", "Back through the MLP",
                  "Back through the MLP's norm (LayerNorm)", "Back through the attention's residual"):
        assert title in text, title
    assert "GELU_tanh′(U)" in text and "dz = (P − onehot(t)) / 3" in text
    latex = symattn.render(d, "latex")
    assert "dY_{final,i}" in latex and re.search(r"_\{[^{}]*\}_", latex) is None  # no double subscript
    stages = json.loads(symattn.render(d, "json"))["stages"]
    ids = [s["id"] for s in stages]
    for stage in ("dlogits", "dW_U", "dY_final", "dY_final_hat", "dfinal_gamma", "dfinal_beta", "dY", "dF", "dW_2",
                  "dG", "dU", "db_1", "dW_1", "dH_norm", "dH_hat", "dH"):
        assert stage in ids, stage
    assert ids.index("L") < ids.index("dlogits") < ids.index("dH") < ids.index("dO")


@pytest.mark.parametrize("stage, slip, fragment", [
    ("dlogits", lambda v: -v, "the sign flipped"),
    ("dlogits", lambda v: 3 * v, "not divided by the number of rows"),
    ("dH", None, "the residual's path was left out"),
    ("dU", "at_G", "slope taken at its output G"),
])
def test_check_diagnoses_the_backward_slips(tmp_path, stage, slip, fragment):
    d = _derive(tmp_path, BLOCKS["relu"].replace("relu", "gelu") + CE)
    if slip is None:
        value = d.approx("dH") - d.approx("dY")  # the MLP's path alone
    elif slip == "at_G":
        from symattn.reference.block_backward import SLOPES

        value = d.approx("dG") * SLOPES["gelu"](d.approx("G"))
    else:
        value = slip(d.approx(stage))
    report = symattn.check(d, {stage: np.round(value, 8).tolist()}).to_json()
    assert fragment in report, report


def test_finite_differences_of_the_cross_entropy_are_refused_by_name(tmp_path):
    from symattn.reference.numeric_backward import finite_difference_gradients

    with pytest.raises(ValueError, match="not taken back from the cross-entropy"):
        finite_difference_gradients(_derive(tmp_path, BLOCKS["relu"] + CE).problem)


def test_the_block_backward_refusals(tmp_path, symattn_cli):
    from test_problem_checkpoints import _error

    for extra, fragment in (
            ("backward: {loss: sum}\n", "starts from the cross-entropy of the logits"),
            ("backward: {dH: [[1, 0, 0], [0, 1, 0], [0, 0, 1]]}\n", "starts from the cross-entropy of the logits")):
        line = _error(tmp_path, BLOCKS["relu"] + extra, symattn_cli)
        assert fragment in line and line.startswith("Error: "), line
