"""The float64 references of the backward pass through a layer norm and the residual stream.

With a residual (``residual: true``, or a post norm) the loss is on H; a pre norm puts dX_norm,
dX_hat, dnorm_gamma, dnorm_beta before dX, a post norm dH, dR_hat, dnorm_gamma, dnorm_beta, dR
before dO (symattn/reference/norm_backward.py). The three references (backprop by hand, central
differences, PyTorch autograd) against one another, and against values written here: autograd
through torch.nn.LayerNorm and torch.nn.RMSNorm modules, the norm's Jacobian by complex steps
entry by entry, the problem without its residual, and the loss at 50 digits in mpmath.
"""

from __future__ import annotations

import dataclasses

import mpmath
import numpy as np
import pytest
import sympy

from symattn import load_problem
from symattn import stages as st
from symattn.problem.model import SUM_LOSS, Backward
from symattn.reference import fd_bound
from symattn.reference.numeric import numeric_stages
from symattn.reference.numeric_backward import (
    finite_difference_gradients,
    gradient_ids as _stage_ids,
    loss_matrix,
    numeric_gradients,
)
from symattn.reference.torch_backward import _torch_backward, torch_gradients
from _reference import FLOAT64_UNIT_ROUNDOFF, attention_loss_rounding
from test_reference_numeric_backward import finite_differences_with_bounds

# The step of the central differences, as in test_reference_numeric_backward.py: h = FD_EPS·max(1, |x|),
# each difference held to the bound of central_difference_bound (a second difference at h/2 and
# the loss's rounding, attention_loss_rounding with the norm's roundings).
FD_EPS = 1e-5
# The bounds must be tight enough to see a wrong term: each stage's largest below this much of
# max(1, |gradient|) (observed at most 1.1e-6 on these problems), so a term off by 1e-5 of the
# gradient, let alone a missing one, fails.
FD_BOUND_AT_MOST = 1e-5
# Float64 against float64 in another order (PyTorch's, the complex steps'): observed at most
# 1.6e-13 of max(1, |gradient|) (in dW_Q of a norm without γ, whose X_norm has entries near 3).
FLOAT_TOLERANCE = 1e-10

NORM_IDS = {st.DH, st.DR_HAT, st.DR, st.DX_NORM, st.DX_HAT, st.DGAMMA, st.DBETA}


def decimals(rng, rows: int, cols: int) -> str:
    """A random matrix as YAML text, entries with two decimals (read exactly)."""
    return str([[f"{v:.2f}" for v in row] for row in rng.normal(size=(rows, cols))]).replace("'", "")


def one_head(rng, d_v: int, biases: bool = False) -> list[str]:
    lines = [f"W_Q: {decimals(rng, 4, 2)}", f"W_K: {decimals(rng, 4, 2)}", f"W_V: {decimals(rng, 4, d_v)}"]
    if biases:
        lines += [f"b_Q: {decimals(rng, 1, 2)}", f"b_K: {decimals(rng, 1, 2)}", f"b_V: {decimals(rng, 1, d_v)}"]
    return lines


def two_heads(rng) -> list[str]:
    """Two heads (d_k 2 and 3, d_v 2 each) and W_O, b_O back to d_model = 4."""
    lines = ["heads:"]
    for d_k in (2, 3):
        lines += [f"  - W_Q: {decimals(rng, 4, d_k)}", f"    W_K: {decimals(rng, 4, d_k)}",
                  f"    W_V: {decimals(rng, 4, 2)}"]
    return lines + [f"W_O: {decimals(rng, 4, 4)}", f"b_O: {decimals(rng, 1, 4)}"]


# name -> (the norm and its fields, the rest of the problem, the norm's and the residual's gradient ids)
CASES = {
    "layernorm pre": ("norm: {type: layernorm, weight: W, bias: B, eps: 1e-5}", "one 3",
                      ["dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta"]),
    "layernorm pre, residual": ("norm: {type: layernorm, weight: W, bias: B, eps: 1e-5}\nresidual: true", "one 4",
                                ["dH", "dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta"]),
    "layernorm pre without γ and β, residual, two heads": ("norm: {type: layernorm, eps: 1/10}\nresidual: true",
                                                           "two", ["dH", "dX_norm", "dX_hat"]),
    "rmsnorm pre, offset, residual, two heads": ("norm: {type: rmsnorm, weight: W, eps: 1e-6, offset: 1}\n"
                                                 "residual: true", "two", ["dH", "dX_norm", "dX_hat", "dnorm_gamma"]),
    "rmsnorm pre, projection biases": ("norm: {type: rmsnorm, weight: W, eps: 1e-6}", "biases 3",
                                       ["dX_norm", "dX_hat", "dnorm_gamma"]),
    "post layernorm (BERT), two heads": ("norm: {type: layernorm, weight: W, bias: B, eps: 1e-12, place: post}", "two",
                                         ["dH", "dR_hat", "dnorm_gamma", "dnorm_beta", "dR"]),
    "post rmsnorm, offset": ("norm: {type: rmsnorm, weight: W, eps: 1e-6, offset: 1, place: post}", "one 4",
                             ["dH", "dR_hat", "dnorm_gamma", "dR"]),
    "residual without norm": ("residual: true", "one 4", ["dH"]),
    "residual without norm, two heads": ("residual: true", "two", ["dH"]),
    "learned positions, layernorm pre, residual": ("norm: {type: layernorm, weight: W, bias: B, eps: 1e-5}\n"
                                                   "residual: true\npositions: P", "one 4",
                                                   ["dH", "dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta"]),
    "learned positions, post layernorm, two heads": ("norm: {type: layernorm, weight: W, eps: 1e-5, place: post}\n"
                                                     "positions: P", "two", ["dH", "dR_hat", "dnorm_gamma", "dR"]),
    "cross-attention, layernorm pre, residual": ("norm: {type: layernorm, weight: W, bias: B, eps: 1e-5}\n"
                                                 "residual: true\ncontext: C", "one 4",
                                                 ["dH", "dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta"]),
    "rope, rmsnorm pre, residual": ("norm: {type: rmsnorm, weight: W, eps: 1e-6}\nresidual: true\n"
                                    "rope: {base: 100, pairing: interleaved}", "one 4",
                                    ["dH", "dX_norm", "dX_hat", "dnorm_gamma"]),
}


def norm_problem(name: str):
    """The problem of CASES[name], its matrices random (two decimals), without a loss."""
    norm, rest, _ = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name) + 11)
    norm = (norm.replace("W", decimals(rng, 1, 4)[1:-1]).replace("B", decimals(rng, 1, 4)[1:-1])
            .replace("P", decimals(rng, 3, 4)).replace("C", decimals(rng, 5, 4)))
    kind, _, d_v = rest.partition(" ")
    heads = two_heads(rng) if kind == "two" else one_head(rng, int(d_v), biases=kind == "biases")
    mask = "mask: none" if "context" in norm else "mask: causal"
    return load_problem("\n".join([f"X: {decimals(rng, 3, 4)}", norm, *heads, mask]) + "\n")


def with_loss(p, kind: str):
    """``p`` with a loss on H (O without a residual): sum, or target / weights / dO from a fixed matrix."""
    if kind == "sum":
        return dataclasses.replace(p, backward=SUM_LOSS)
    m = sympy.Matrix(np.random.default_rng(7).integers(-8, 9, size=(p.n_q, p.d_out))) / 4
    return dataclasses.replace(p, backward=Backward(kind, sympy.ImmutableMatrix(m)))


LOSSES = [pytest.param(name, loss, id=f"{name}-{loss}") for name in CASES for loss in ("sum", "target")]
LOSSES += [pytest.param(name, loss, id=f"{name}-{loss}") for name, loss in
           (("layernorm pre, residual", "weights"), ("post layernorm (BERT), two heads", "dO"),
            ("rmsnorm pre, offset, residual, two heads", "weights"), ("layernorm pre", "dO"))]
WITH_NORM = [name for name in CASES if "norm" in CASES[name][0]]


def scale(g: np.ndarray) -> float:
    return max(1.0, float(np.abs(g).max()))


def assert_close(got: dict, want: dict, tolerance: float, who: str) -> None:
    for stage, value in want.items():
        assert got[stage].shape == value.shape, (who, stage)
        error = float(np.abs(got[stage] - value).max())
        assert error <= tolerance * scale(value), f"{who} {stage}: off by {error:.3g}"


def assert_within(got: dict, want: dict, bounds: dict, who: str) -> None:
    for stage, value in want.items():
        error = np.abs(got[stage] - value)
        worst = np.unravel_index(np.argmax(error - bounds[stage]), error.shape)
        assert (error <= bounds[stage]).all(), (
            f"{who} {stage}{list(worst)}: off by {error[worst]:.3g}, bound {bounds[stage][worst]:.3g}")


# -- the three references -------------------------------------------------------------------------


@pytest.mark.parametrize("name, loss", LOSSES)
def test_stage_ids_and_shapes(name, loss):
    p = with_loss(norm_problem(name), loss)
    g = numeric_gradients(p)
    plain = numeric_gradients(dataclasses.replace(p, norm=None, residual=False))  # the attention's own
    assert set(g) == set(plain) | set(CASES[name][2])
    assert [s for s in g if s in NORM_IDS] == [s for s in _stage_ids(p) if s in NORM_IDS]
    assert list(g) == _stage_ids(p) == list(finite_difference_gradients(p))
    stages = numeric_stages(p)
    for stage, grad in g.items():
        pre, _, id_ = stage.rpartition(".")
        assert grad.shape == stages[(pre + "." if pre else "") + id_[1:]].shape, stage
        assert np.isfinite(grad).all(), stage


@pytest.mark.parametrize("name, loss", LOSSES)
def test_finite_differences_agree(name, loss):
    p = with_loss(norm_problem(name), loss)
    fd, bounds = finite_differences_with_bounds(p)
    g = numeric_gradients(p)
    assert list(fd) == list(g)
    assert_within(fd, g, bounds, "finite differences")
    for stage, b in bounds.items():
        assert b.max() <= FD_BOUND_AT_MOST * scale(g[stage]), (stage, b.max())


@pytest.mark.parametrize("name", ["layernorm pre, residual", "post layernorm (BERT), two heads",
                                  "rmsnorm pre, offset, residual, two heads"])
def test_the_cross_checks_bounds_hold_too(name):
    """fd_bound.finite_differences_with_bounds, the cross-check's, passes the norm on itself."""
    p = with_loss(norm_problem(name), "target")
    g = numeric_gradients(p)
    fd, bounds = fd_bound.finite_differences_with_bounds(p, FD_EPS, g)
    assert_within(fd, g, bounds, "the cross-check's differences")


@pytest.mark.parametrize("name, loss", LOSSES)
def test_torch_agrees(name, loss):
    pytest.importorskip("torch")
    p = with_loss(norm_problem(name), loss)
    t, g = torch_gradients(p), numeric_gradients(p)
    assert list(t) == list(g)
    assert_close(t, g, FLOAT_TOLERANCE, "PyTorch")


@pytest.mark.parametrize("name", CASES)
def test_fused_and_manual_torch_graphs_agree(name):
    """F.layer_norm / F.rms_norm and SDPA against the norm and the softmax written out in torch."""
    pytest.importorskip("torch")
    p = with_loss(norm_problem(name), "target")
    fused, manual = _torch_backward(p, fused=True), _torch_backward(p, fused=False)
    written_out = {"dA", "dS_masked", "dS", "dX_hat", "dR_hat"}
    assert set(manual) - set(fused) == {s for s in manual if s.rpartition(".")[2] in written_out}
    assert_close({s: manual[s] for s in fused}, fused, 1e-12, "manual graph")


# -- values written here --------------------------------------------------------------------------------


def f64(m) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in m.tolist()], dtype=np.float64)


def module_gradients(p) -> dict[str, np.ndarray]:
    """The gradients from autograd through torch.nn.LayerNorm / torch.nn.RMSNorm modules and the
    attention written out here (causal mask or none, scale 1/√d_k, no RoPE)."""
    torch = pytest.importorskip("torch")
    t = lambda m: torch.tensor(f64(m))  # noqa: E731
    X = t(p.X).requires_grad_()
    B = X if p.positions is None else X + t(p.positions.matrix)
    n, d = p.norm, p.X.cols
    if n is not None:
        module = (torch.nn.RMSNorm(d, eps=float(n.eps), dtype=torch.float64) if n.rms
                  else torch.nn.LayerNorm(d, eps=float(n.eps), dtype=torch.float64))
        with torch.no_grad():  # the module's weight is offset + γ (Gemma's 1 + γ): its gradient is dγ
            module.weight.copy_(torch.ones(d) if n.weight is None else t(n.weight)[0] + n.offset)
            if not n.rms:
                module.bias.copy_(torch.zeros(d) if n.bias is None else t(n.bias)[0])
    X_in = module(B) if n is not None and not n.post else B
    X_in.retain_grad()
    C = X_in if p.context is None else t(p.context)
    M = torch.tensor(np.where(np.array(p.mask.allowed), 0.0, -np.inf))
    outputs = []
    for w in p.heads:
        lin = [X_in @ t(w.W_Q), C @ t(w.W_K), C @ t(w.W_V)]
        Q, K, V = (y if b is None else y + t(b) for y, b in zip(lin, (w.b_Q, w.b_K, w.b_V)))
        outputs.append(torch.softmax(Q @ K.T / Q.shape[1] ** 0.5 + M, dim=1) @ V)
    O = outputs[0] if not p.multi_head else torch.cat(outputs, dim=1) @ t(p.W_O) + t(p.b_O)
    O.retain_grad()
    top = O
    if p.residual:
        top = R = B + O
        R.retain_grad()
        if n is not None and n.post:
            top = module(R)
            top.retain_grad()
    G = None if p.backward.matrix is None else t(p.backward.matrix)
    {"sum": lambda: top.sum(), "target": lambda: 0.5 * ((top - G) ** 2).sum()}.get(
        p.backward.kind, lambda: (G * top).sum())().backward()
    out = {"dX": X.grad, "dO": O.grad}
    if p.residual:
        out["dH"] = top.grad
    if n is not None and n.post:
        out["dR"] = R.grad
    if n is not None and not n.post:
        out["dX_norm"] = X_in.grad
    if n is not None and n.weight is not None:
        out["dnorm_gamma"] = module.weight.grad[None]
    if n is not None and n.bias is not None:
        out["dnorm_beta"] = module.bias.grad[None]
    return {k: v.numpy() for k, v in out.items()}


@pytest.mark.parametrize("name, loss", [pytest.param(n, loss, id=f"{n}-{loss}") for n in CASES if "rope" not in n
                                        for loss in ("sum", "target", "weights")])
def test_torch_modules_agree(name, loss):
    p = with_loss(norm_problem(name), loss)
    want = module_gradients(p)
    assert_close(numeric_gradients(p), want, FLOAT_TOLERANCE, "torch.nn modules")


def complex_norm(x: np.ndarray, n, gain: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """The norm of the rows of a complex ``x``, analytic in every entry (a complex step's way)."""
    if n.rms:
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + float(n.eps)) * gain + beta
    c = x - x.mean(axis=1, keepdims=True)
    return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + float(n.eps)) * gain + beta


def complex_step(f, x: np.ndarray, h: float = 1e-30) -> np.ndarray:
    """∂f/∂x_ij for each entry, f(x + i·h·e_ij) / h with f returning the imaginary part's use."""
    out = np.zeros(x.shape)
    for ij in np.ndindex(x.shape):
        z = x.astype(complex)
        z[ij] += 1j * h
        out[ij] = f(z) / h
    return out


def complex_step_gradients(n, x: np.ndarray, dY: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """∂L/∂x, ∂L/∂γ and ∂L/∂β of L = Σ dY ∘ LN(x), each entry's derivative by a complex step
    f(x + i·h)/h (no subtraction, so no cancellation: h = 1e-30)."""
    h = 1e-30
    d = x.shape[1]
    gamma = np.zeros((1, d)) if n.weight is None else f64(n.weight)
    beta = np.zeros((1, d)) if n.bias is None else f64(n.bias)

    def step(which: str, ij) -> float:
        args = {"x": x.astype(complex), "gamma": gamma.astype(complex), "beta": beta.astype(complex)}
        args[which][ij] += 1j * h
        y = complex_norm(args["x"], n, n.offset + args["gamma"] if n.weight is not None else 1.0, args["beta"])
        return float((dY * y.imag).sum()) / h

    dx = np.array([[step("x", (i, k)) for k in range(d)] for i in range(x.shape[0])])
    dgamma = np.array([[step("gamma", (0, k)) for k in range(d)]])
    dbeta = np.array([[step("beta", (0, k)) for k in range(d)]])
    return dx, dgamma, dbeta


@pytest.mark.parametrize("name", WITH_NORM)
def test_norm_backward_against_complex_steps(name):
    """dX (less the residual's dH) from dX_norm, or dR from dH behind a post norm, and dγ, dβ, dX̂
    against the Jacobian of the norm, entry by entry, by complex steps."""
    p = with_loss(norm_problem(name), "target")
    n, g, fwd = p.norm, numeric_gradients(p), numeric_stages(p)
    if n.post:
        dY, x, dx, hat = g["dH"], fwd["R"], g["dR"], "dR_hat"
    else:
        dY, x, hat = g["dX_norm"], fwd.get("X_pos", fwd["X"]), "dX_hat"
        dx = g["dX"] - g["dH"] if p.residual else g["dX"]
    want_dx, want_dgamma, want_dbeta = complex_step_gradients(n, x, dY)
    want = {"dx": want_dx}
    got = {"dx": dx}
    if n.weight is not None:
        want["dnorm_gamma"], got["dnorm_gamma"] = want_dgamma, g["dnorm_gamma"]
    if n.bias is not None:
        want["dnorm_beta"], got["dnorm_beta"] = want_dbeta, g["dnorm_beta"]
    # x̂ ↦ x̂∘gain + β, by complex steps on x̂ as well
    gain = 1.0 if n.weight is None else n.offset + f64(n.weight)
    want[hat] = complex_step(lambda y: float((dY * (y * gain).imag).sum()), fwd["R_hat" if n.post else "X_hat"])
    got[hat] = g[hat]
    assert_close(got, want, FLOAT_TOLERANCE, "complex steps")


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][2][:1] == ["dH"]])
def test_the_residual_adds_its_gradient_to_dX(name):
    """dX = the problem without its residual (and post norm), started from dO = dH (dR), plus dH (dR)."""
    p = with_loss(norm_problem(name), "target")
    g = numeric_gradients(p)
    post = p.norm is not None and p.norm.post
    d_block = g["dR"] if post else g["dH"]
    assert np.array_equal(g["dO"], d_block)
    bare = dataclasses.replace(p, residual=False, norm=None if post else p.norm,
                               backward=Backward("dO", sympy.ImmutableMatrix(d_block.tolist())))
    without = numeric_gradients(bare)
    assert_close({"dX": g["dX"] - d_block}, {"dX": without["dX"]}, FLOAT_TOLERANCE, "without the residual")
    assert not np.allclose(g["dX"], without["dX"])  # the residual's share is there


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][2][:1] == ["dH"]])
def test_the_loss_is_on_H(name):
    p = norm_problem(name)
    H, O = numeric_stages(p)["H"], numeric_stages(p)["O"]
    assert np.array_equal(numeric_gradients(with_loss(p, "sum"))["dH"], np.ones_like(H))
    q = with_loss(p, "target")
    T = loss_matrix(q)
    dH = numeric_gradients(q)["dH"]
    np.testing.assert_allclose(dH, H - T, rtol=0, atol=4 * FLOAT64_UNIT_ROUNDOFF * np.abs(H - T).max())
    assert np.abs(dH - (O - T)).max() > 0.1  # H − T, not O − T


# -- the rounding bound --------------------------------------------------------------------------------


def test_the_rounding_bound_needs_the_norm():
    p = with_loss(norm_problem("layernorm pre"), "sum")
    with pytest.raises(ValueError, match="give attention_loss_rounding its norm"):
        attention_loss_rounding(numeric_stages(p), numeric_gradients(p))


def mp_layer_norm_loss(X, gamma, beta, eps, W_Q, W_K, W_V) -> mpmath.mpf:
    """L = Σ O of one causal head reading LN(X), at 50 digits."""
    with mpmath.workdps(50):
        rows = []
        for x in X:
            mu = mpmath.fsum(x) / len(x)
            r = mpmath.sqrt(mpmath.fsum((v - mu) ** 2 for v in x) / len(x) + eps)
            rows.append([(v - mu) / r * g + b for v, g, b in zip(x, gamma, beta)])
        Xn = mpmath.matrix(rows)
        Q, K, V = Xn * mpmath.matrix(W_Q), Xn * mpmath.matrix(W_K), Xn * mpmath.matrix(W_V)
        total = mpmath.mpf(0)
        for i in range(Q.rows):
            s = [mpmath.fsum(Q[i, c] * K[j, c] for c in range(Q.cols)) / mpmath.sqrt(Q.cols) for j in range(i + 1)]
            e = [mpmath.exp(v - max(s)) for v in s]
            total += mpmath.fsum(e[j] / mpmath.fsum(e) * V[j, c] for j in range(i + 1) for c in range(V.cols))
        return total


def test_the_rounding_bound_covers_the_mean_of_large_rows():
    """Rows of about 2^20 with a spread of about 2: fl(Σx/3) is off by up to 2^20·u, which
    shifts every x̂ of its row alike. With W_Q = W_K = 0 (uniform weights) and W_V's rows summing
    to 1/gain, ∂L/∂x̂ is the same along each row, so dX = 0 (the loss does not change when a
    row shifts) and L = Σ O depends on x̂ only through Σ x̂ = 0: the mean's rounding is all the
    error there is, and no stage's term relative to its own magnitude covers it. The float64 loss
    of the NumPy pass is within attention_loss_rounding of the loss at 50 digits (the inputs are
    exact in binary), and would not be without the norm's term (dX_hat's)."""
    X = [[2 ** 20 + a / 4 for a in row] for row in ((1, -3, 6), (2, 7, -1), (-6, 1, 3), (4, 5, -5))]
    gamma, beta = [1.0, 2.0, 4.0], [0.25, 0.5, -1.0]
    W_Q = W_K = [[0.0, 0.0]] * 3
    W_V = [[1.5, -0.5], [0.75, -0.25], [0.5, -0.25]]  # row sums 1, 1/2, 1/4: 1/γ
    text = (f"X: {X}\nnorm: {{type: layernorm, weight: {gamma}, bias: {beta}, eps: 1/1024}}\n"
            f"W_Q: {W_Q}\nW_K: {W_K}\nW_V: {W_V}\nmask: causal\n")
    p = with_loss(load_problem(text), "sum")
    stages, g = numeric_stages(p), numeric_gradients(p)
    assert np.allclose(g["dX_hat"], g["dX_hat"][:, :1]) and np.abs(g["dX"]).max() < 1e-9
    L_float = float(stages["O"].sum())
    L_exact = mp_layer_norm_loss(X, gamma, beta, mpmath.mpf(1) / 1024, W_Q, W_K, W_V)
    error = float(abs(mpmath.mpf(L_float) - L_exact))
    assert error > 1e5 * FLOAT64_UNIT_ROUNDOFF * abs(L_float)  # the mean's rounding shows
    assert error <= attention_loss_rounding(stages, g, norm=p.norm)
    without = attention_loss_rounding(stages, {s: v for s, v in g.items() if s != "dX_hat"}, norm=p.norm)
    assert error > without, (error, without)
