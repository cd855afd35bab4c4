"""The float64 references of the backward pass agree with each other.

Three independent routes to the same gradients: backprop by hand in NumPy
(numeric_gradients), central finite differences of the NumPy forward pass
(finite_difference_gradients) and PyTorch autograd (torch_gradients).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import sympy

from symattn import load_problem
from symattn.reference.numeric import numeric_stages
from symattn.reference.numeric_backward import finite_difference_gradients, loss_matrix, numeric_gradients
from symattn.reference.torch_backward import _torch_backward, torch_gradients
from symattn.problem.model import SUM_LOSS, Backward
from _reference import (
    FLOAT64_UNIT_ROUNDOFF, attention_loss_rounding, backward_supported, central_difference_bound, has_norm,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml"))

# The step of the central differences: h = FD_EPS·max(1, |x|) for each entry x. Each
# difference is held to the bound of _reference.central_difference_bound, from a second
# difference at h/2 and the loss's own rounding. 1e-5 rather than symattn's default 1e-6:
# the rounding, which dominates here, is divided by a ten times larger step, and the
# truncation (h², seen by the second step) stays far below it. The bounds come out at about
# 2e-8 of each stage's largest gradient (median), fifteen times the largest error seen, so a
# wrong or missing term (off by O(1)) fails, and so does a gradient scaled by 1 + 1e-6.
FD_EPS = 1e-5
# NumPy and PyTorch do the same float64 arithmetic in a different order:
# observed at most 2.6e-15 of max(1, |gradient|).
TORCH_TOLERANCE = 1e-10

# The gradient stage ids, in order, for each kind of problem.
EXPECTED_IDS = {
    "qkv": ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK"],
    "self": ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX"],
    "cross": ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX", "dcontext"],
    "self, two heads": [
        "dO", "dW_O", "dconcat",
        "head1.dO", "head1.dV", "head1.dA", "head1.dS_masked", "head1.dS", "head1.dQ", "head1.dK",
        "head1.dW_Q", "head1.dW_K", "head1.dW_V",
        "head2.dO", "head2.dV", "head2.dA", "head2.dS_masked", "head2.dS", "head2.dQ", "head2.dK",
        "head2.dW_Q", "head2.dW_K", "head2.dW_V",
        "dX",
    ],
    "cross, two heads": [
        "dO", "dW_O", "dconcat",
        "head1.dO", "head1.dV", "head1.dA", "head1.dS_masked", "head1.dS", "head1.dQ", "head1.dK",
        "head1.dW_Q", "head1.dW_K", "head1.dW_V",
        "head2.dO", "head2.dV", "head2.dA", "head2.dS_masked", "head2.dS", "head2.dQ", "head2.dK",
        "head2.dW_Q", "head2.dW_K", "head2.dW_V",
        "dX", "dcontext",
    ],
    # with projection biases: each bias's gradient after the weights' (db_O after dW_O)
    "self, biases": ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V",
                     "db_Q", "db_K", "db_V", "dX"],
    "cross, biases": ["dO", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V",
                      "db_Q", "db_K", "db_V", "dX", "dcontext"],
    "self, two heads, biases": [
        "dO", "dW_O", "db_O", "dconcat",
        "head1.dO", "head1.dV", "head1.dA", "head1.dS_masked", "head1.dS", "head1.dQ", "head1.dK",
        "head1.dW_Q", "head1.dW_K", "head1.dW_V", "head1.db_Q", "head1.db_K", "head1.db_V",
        "head2.dO", "head2.dV", "head2.dA", "head2.dS_masked", "head2.dS", "head2.dQ", "head2.dK",
        "head2.dW_Q", "head2.dW_K", "head2.dW_V", "head2.db_Q", "head2.db_K", "head2.db_V",
        "dX",
    ],
}


def expected_ids(p) -> list[str]:
    """The gradient ids of ``p``: its kind's, and under RoPE each head's dQ_rot and dK_rot before its dQ."""
    ids = []
    for stage in EXPECTED_IDS[kind_of(p)]:
        pre, _, name = stage.rpartition(".")
        if p.rope is not None and name == "dQ":
            ids += [f"{pre}.dQ_rot" if pre else "dQ_rot", f"{pre}.dK_rot" if pre else "dK_rot"]
        ids.append(stage)
    return ids


def kind_of(p) -> str:
    if not p.projected:
        return "qkv"
    kind = "self" if p.context is None else "cross"
    kind = kind + ", two heads" if p.multi_head else kind
    return kind + ", biases" if p.heads[0].b_Q is not None else kind  # (expected_ids adds RoPE's)


# -- the problems ------------------------------------------------------------------


def decimals(rng, rows: int, cols: int) -> str:
    """A random matrix as YAML text, entries with two decimals (read exactly)."""
    return str([[f"{v:.2f}" for v in row] for row in rng.normal(size=(rows, cols))]).replace("'", "")


def random_problem(kind: str, seed: int):
    """A random problem of one kind; its loss is given in the YAML itself."""
    rng = np.random.default_rng(seed)
    n, n_k, d_model = 4, 5, 3
    lines = []
    if kind == "qkv, causal, bias with -inf":
        lines += [f"Q: {decimals(rng, n, 2)}", f"K: {decimals(rng, n, 2)}", f"V: {decimals(rng, n, 3)}"]
        bias = [[f"{-abs(v):.2f}" for v in row] for row in rng.normal(size=(n, n))]
        bias[2][0] = bias[3][1] = "-inf"  # blocks keys the causal mask allows
        lines += ["mask: causal", "scale: 3/4", f"bias: {bias}".replace("'", "")]
        d_out = 3
    elif kind in ("self, causal", "self, no mask, bias"):
        lines += [f"X: {decimals(rng, n, d_model)}"]
        lines += [f"{w}: {decimals(rng, d_model, 2)}" for w in ("W_Q", "W_K", "W_V")]
        lines += ["mask: causal"] if "causal" in kind else ["mask: none", f"bias: {decimals(rng, n, n)}"]
        d_out = 2
    elif kind == "cross, bottom-right":
        lines += [f"X: {decimals(rng, n, d_model)}", f"context: {decimals(rng, n_k, d_model)}"]
        lines += [f"W_Q: {decimals(rng, d_model, 2)}", f"W_K: {decimals(rng, d_model, 2)}"]
        lines += [f"W_V: {decimals(rng, d_model, 3)}", "mask: causal-bottom-right"]
        d_out = 3
    elif kind in ("self, biases", "cross, biases"):  # every projection with its bias, flat lists
        lines += [f"X: {decimals(rng, n, d_model)}"]
        if kind.startswith("cross"):
            lines += [f"context: {decimals(rng, n_k, d_model)}"]
        for w, d in (("Q", 2), ("K", 2), ("V", 3)):
            lines += [f"W_{w}: {decimals(rng, d_model, d)}", f"b_{w}: {decimals(rng, 1, d)[1:-1]}"]
        lines += ["mask: causal-bottom-right" if kind.startswith("cross") else "mask: causal"]
        d_out = 3
    elif kind == "self, two heads, biases":
        lines += [f"X: {decimals(rng, n, d_model)}", "heads:"]
        for d_k, d_v in ((2, 2), (3, 1)):
            lines += [f"  - W_Q: {decimals(rng, d_model, d_k)}", f"    b_Q: {decimals(rng, 1, d_k)}",
                      f"    W_K: {decimals(rng, d_model, d_k)}", f"    b_K: {decimals(rng, 1, d_k)}",
                      f"    W_V: {decimals(rng, d_model, d_v)}", f"    b_V: {decimals(rng, 1, d_v)}"]
        lines += [f"W_O: {decimals(rng, 3, 2)}", f"b_O: {decimals(rng, 1, 2)[1:-1]}", "mask: causal"]
        d_out = 2
    elif kind in ("self, two heads", "cross, two heads"):
        lines += [f"X: {decimals(rng, n, d_model)}"]
        if kind.startswith("cross"):
            lines += [f"context: {decimals(rng, n_k, d_model)}"]
        lines += ["heads:"]
        for d_k, d_v in ((2, 2), (3, 1)):
            lines += [f"  - W_Q: {decimals(rng, d_model, d_k)}", f"    W_K: {decimals(rng, d_model, d_k)}",
                      f"    W_V: {decimals(rng, d_model, d_v)}"]
        lines += [f"W_O: {decimals(rng, 3, 2)}", "mask: none" if kind.startswith("cross") else "mask: causal"]
        d_out = 2
    elif kind in ("self, causal, rope", "qkv, rope", "self, two heads, biases, rope"):
        # RoPE with a base or with angles, in either pairing: the scores compare the rotated Q and K
        if kind == "qkv, rope":
            lines += [f"Q: {decimals(rng, n, 4)}", f"K: {decimals(rng, n, 4)}", f"V: {decimals(rng, n, 3)}"]
            d_out = 3
        elif kind == "self, causal, rope":
            lines += [f"X: {decimals(rng, n, d_model)}"]
            lines += [f"{w}: {decimals(rng, d_model, d)}" for w, d in (("W_Q", 4), ("W_K", 4), ("W_V", 2))]
            d_out = 2
        else:
            lines += [f"X: {decimals(rng, n, d_model)}", "heads:"]
            for d_v in (2, 1):
                lines += [f"  - W_Q: {decimals(rng, d_model, 4)}", f"    b_Q: {decimals(rng, 1, 4)}",
                          f"    W_K: {decimals(rng, d_model, 4)}", f"    b_K: {decimals(rng, 1, 4)}",
                          f"    W_V: {decimals(rng, d_model, d_v)}", f"    b_V: {decimals(rng, 1, d_v)}"]
            lines += [f"W_O: {decimals(rng, 3, 2)}", f"b_O: {decimals(rng, 1, 2)[1:-1]}"]
            d_out = 2
        lines += ["mask: causal" if seed % 2 else "mask: none",
                  "rope: {base: 100, pairing: interleaved}" if seed % 2 else "rope: {angles: [1/2, 3], pairing: half}"]
    else:
        raise ValueError(kind)
    loss = ["sum", f"{{weights: {decimals(rng, n, d_out)}}}", f"{{target: {decimals(rng, n, d_out)}}}"][seed % 3]
    lines += [f"backward: {{loss: {loss}}}" if seed % 4 else f"backward: {{dO: {decimals(rng, n, d_out)}}}"]
    return load_problem("\n".join(lines) + "\n")


def with_loss(p, kind: str):
    """``p`` with a loss: sum, or weights / target / dO from a fixed random matrix."""
    if kind == "sum":
        return dataclasses.replace(p, backward=SUM_LOSS)
    rng = np.random.default_rng(7)
    m = sympy.Matrix(rng.integers(-8, 9, size=(p.n_q, p.d_out))) / 4
    return dataclasses.replace(p, backward=Backward(kind, sympy.ImmutableMatrix(m)))


RANDOM_KINDS = [
    "qkv, causal, bias with -inf",
    "self, causal",
    "self, no mask, bias",
    "cross, bottom-right",
    "self, two heads",
    "cross, two heads",
    "self, biases",
    "cross, biases",
    "self, two heads, biases",
    "qkv, rope",
    "self, causal, rope",
    "self, two heads, biases, rope",
]
CASES = [pytest.param(path, loss, id=f"{path.stem}-{loss}") for path in EXAMPLES for loss in ("sum", "weights", "target")
         if backward_supported(path) and not has_norm(path)]
# (grouped K/V heads have no backward pass yet; the three references through a norm and the residual
# are compared with each other, and with PyTorch's own modules, in tests/test_norm_backward_refs.py)
CASES += [pytest.param(kind, seed, id=f"random {kind} #{seed}") for kind in RANDOM_KINDS for seed in (1, 2, 3, 4)]


def problem(source, arg):
    if isinstance(source, Path):
        return with_loss(load_problem(source), arg)
    return random_problem(source, arg)


def scale(g: np.ndarray) -> float:
    return max(1.0, float(np.abs(g).max()))


def assert_close(got: dict, want: dict, tolerance: float, who: str) -> None:
    assert list(got) == list(want)
    for stage, value in want.items():
        assert got[stage].shape == value.shape, stage
        error = float(np.abs(got[stage] - value).max())
        assert error <= tolerance * scale(value), f"{who} {stage}: off by {error:.3g}"


def finite_differences_with_bounds(p) -> tuple[dict, dict]:
    """The central differences of every gradient stage, and for each entry how far it may be
    from the derivative: from the same differences at half the step and a bound on the
    rounding of the loss, from the problem's own magnitudes (tests/_reference.py)."""
    fd = finite_difference_gradients(p, FD_EPS)
    half = finite_difference_gradients(p, FD_EPS / 2)
    stages = numeric_stages(p)
    target = loss_matrix(p) if p.backward.kind == "target" else None
    rounding = attention_loss_rounding(stages, fd, target=target, norm=p.norm)
    bounds = {}
    for stage, d in fd.items():
        pre, _, name = stage.rpartition(".")
        x = stages[(pre + "." if pre else "") + name[1:]]  # the matrix perturbed: dW_Q -> W_Q, dnorm_gamma -> norm_gamma
        h = FD_EPS * np.maximum(1.0, np.abs(x))  # finite_difference_gradients's step, entry by entry
        bounds[stage] = central_difference_bound(d, half[stage], h, rounding)
    return fd, bounds


def assert_within(got: dict, want: dict, bounds: dict, who: str) -> None:
    assert list(got) == list(want)
    for stage, value in want.items():
        assert got[stage].shape == value.shape, stage
        error = np.abs(got[stage] - value)
        worst = np.unravel_index(np.argmax(error - bounds[stage]), error.shape)
        assert (error <= bounds[stage]).all(), (
            f"{who} {stage}{list(worst)}: off by {error[worst]:.3g}, bound {bounds[stage][worst]:.3g}")


# -- the tests ----------------------------------------------------------------------


def test_there_are_worked_examples():
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("source, arg", CASES)
def test_stage_ids_and_shapes(source, arg):
    p = problem(source, arg)
    g = numeric_gradients(p)
    assert list(g) == expected_ids(p)
    assert list(finite_difference_gradients(p)) == expected_ids(p)
    stages = numeric_stages(p)
    for stage, grad in g.items():
        pre, _, name = stage.rpartition(".")
        of = (pre + "." if pre else "") + name[1:]  # dW_Q -> W_Q, head1.dA -> head1.A
        assert grad.shape == stages[of].shape, stage
        assert np.isfinite(grad).all(), stage


@pytest.mark.parametrize("source, arg", CASES)
def test_finite_differences_agree(source, arg):
    p = problem(source, arg)
    fd, bounds = finite_differences_with_bounds(p)
    assert_within(fd, numeric_gradients(p), bounds, "finite differences")


@pytest.mark.parametrize("source, arg", CASES)
def test_torch_agrees(source, arg):
    pytest.importorskip("torch")
    p = problem(source, arg)
    assert_close(torch_gradients(p), numeric_gradients(p), TORCH_TOLERANCE, "PyTorch")


@pytest.mark.parametrize("source, arg", CASES)
def test_sdpa_and_manual_torch_graphs_agree(source, arg):
    pytest.importorskip("torch")
    p = problem(source, arg)
    fused, manual = _torch_backward(p, fused=True), _torch_backward(p, fused=False)
    assert set(manual) - set(fused) == {s for s in manual if s.rpartition(".")[2] in ("dA", "dS_masked", "dS")}
    assert_close({s: manual[s] for s in fused}, fused, 1e-12, "manual graph")


@pytest.mark.parametrize("source, arg", CASES)
def test_masked_scores_have_zero_gradient_and_rows_sum_to_zero(source, arg):
    p = problem(source, arg)
    masked = np.isneginf(next(m for s, m in numeric_stages(p).items() if s.endswith("M")))
    # Σ_j a_j (da_j − da·a) = da·a − da·a = 0: softmax is shift-invariant. Observed
    # row sums: 2.4e-15 (analytic) of max(1, |dS_masked|); a finite difference's row sum is
    # at most the sum of its entries' bounds.
    fd, bounds = finite_differences_with_bounds(p)
    analytic = numeric_gradients(p)
    for g in (analytic, fd):
        for stage, grad in g.items():
            if stage.endswith(("dS_masked", "dS")):
                assert (grad[masked] == 0).all(), stage
            if stage.endswith("dS_masked"):
                row_sums = np.abs(grad.sum(axis=1))
                if g is analytic:
                    assert row_sums.max() <= 1e-13 * scale(grad), (stage, row_sums)
                else:
                    assert (row_sums <= bounds[stage].sum(axis=1)).all(), (stage, row_sums)


def test_bias_minus_infinity_counts_as_masked():
    p = random_problem("qkv, causal, bias with -inf", 1)
    g = numeric_gradients(p)
    assert g["dS_masked"][2, 0] == 0 and g["dS_masked"][3, 1] == 0  # allowed by the mask, −∞ by the bias
    assert p.mask.allowed[2][0] and p.mask.allowed[3][1]
    fd = finite_difference_gradients(p)
    assert fd["dS"][2, 0] == 0 and fd["dS"][3, 1] == 0


def test_one_query_two_keys_by_hand():
    # S = Q Kᵀ = [0, 1] (scale none), so a = (1, e)/(1 + e); the third key is masked.
    # With V = [1, 3, 5]ᵀ and L = Σ O: dO = 1, dA = Vᵀ = [1, 3, 5], dA·a = a0 + 3·a1, and
    # dS_masked = a ∘ (dA − dA·a) = [a0(1 − a0 − 3a1), a1(3 − a0 − 3a1), 0] = [−2a0a1, 2a0a1, 0].
    p = load_problem(
        "Q: [[1]]\nK: [[0], [1], [2]]\nV: [[1], [3], [5]]\nmask: [[1, 1, 0]]\nscale: none\nbackward: {loss: sum}\n"
    )
    a0, a1 = 1 / (1 + math.e), math.e / (1 + math.e)
    w = 2 * a0 * a1
    want = {
        "dO": [[1.0]],
        "dV": [[a0], [a1], [0.0]],
        "dA": [[1.0, 3.0, 5.0]],
        "dS_masked": [[-w, w, 0.0]],
        "dS": [[-w, w, 0.0]],
        "dQ": [[w]],  # dS · K = −w·0 + w·1
        "dK": [[-w], [w], [0.0]],  # dSᵀ · Q
    }
    g = numeric_gradients(p)
    assert list(g) == list(want)
    for stage, value in want.items():
        np.testing.assert_allclose(g[stage], value, rtol=1e-9, atol=1e-12, err_msg=stage)
    assert g["dS_masked"][0, 2] == 0.0
    # The central differences, within their bound; the values above carry a few roundings
    # of their own (e, 1 + e, two divisions, a product): 8 units of their last place.
    fd, bounds = finite_differences_with_bounds(p)
    assert list(fd) == list(want)
    for stage, value in want.items():
        value = np.array(value)
        bounds[stage] = bounds[stage] + 8 * FLOAT64_UNIT_ROUNDOFF * np.abs(value)
    assert_within(fd, {s: np.array(v) for s, v in want.items()}, bounds, "finite differences")


def test_scale_multiplies_dS():
    p = load_problem("Q: [[1, 2]]\nK: [[0, 1], [1, 0]]\nV: [[1], [3]]\nbackward: {loss: sum}\n")
    g = numeric_gradients(p)  # scale auto: 1/√2
    np.testing.assert_allclose(g["dS"], g["dS_masked"] / math.sqrt(2), rtol=1e-15)


def test_without_backward_section_is_an_error():
    p = load_problem("Q: [[1]]\nK: [[0], [1]]\nV: [[1], [3]]\n")
    assert p.backward is None
    for f in (numeric_gradients, finite_difference_gradients):
        with pytest.raises(ValueError, match="no backward section"):
            f(p)
