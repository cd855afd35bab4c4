"""The layer norm and the residual stream in the float64 backward references.

The pieces :mod:`symattn.reference.numeric_backward` puts around the attention's backward pass
when the problem has a norm (``p.norm``) or a residual stream (``p.residual``), for each of its
three routes: the chain rule by hand (:func:`top_gradients`, :func:`input_gradients`), central
differences from each stage on (:func:`fd_top`, :func:`fd_norm_output`) and PyTorch autograd
(:func:`torch_norm_graph`, :func:`torch_stream`).

With a residual the loss is on the residual stream H instead of O:

- pre norm (or none): H = B + O, B the block's input (X, or X + PE), so dO = dH and dB = dH;
- post norm (BERT): R = B + O and H = LN(R) = R̂∘gain + β, so dR_hat = dH∘gain,
  dnorm_gamma = colsum(dH∘R̂), dnorm_beta = colsum(dH), dR the norm's backward of dR_hat, and
  dO = dR, dB = dR.

A pre norm sits between the block's input and the projections: X_norm = LN(B) = X̂∘gain + β,
dX_norm the sum over the projections' paths, dX_hat = dX_norm∘gain, dnorm_gamma =
colsum(dX_norm∘X̂), dnorm_beta = colsum(dX_norm), and dX the norm's backward of dX_hat (plus dH
with the residual). The norm's backward, row by row, with r = √(σ² + ε) (√(ms + ε) for RMSNorm):
dx = (dx̂ − mean(dx̂) − x̂·mean(dx̂∘x̂)) / r, RMSNorm's without the mean(dx̂) term.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import stages as st
from .numeric import layer_norm_f64, to_float64
from .pytorch import torch_norm
from ..problem.model import Norm, Problem


def pre_norm(p: Problem) -> bool:
    """Whether the attention reads the norm of its input (a norm in front of it)."""
    return p.norm is not None and not p.norm.post


def post_norm(p: Problem) -> bool:
    """Whether the residual stream is normalised behind the attention (BERT's order)."""
    return p.norm is not None and p.norm.post


def gain_f64(norm: Norm):
    """The row each normalised row is multiplied by, offset + γ, in float64 (1.0 without γ)."""
    return 1.0 if norm.weight is None else norm.offset + to_float64(norm.weight)


def beta_f64(norm: Norm):
    """β in float64 (0.0 without it)."""
    return 0.0 if norm.bias is None else to_float64(norm.bias)


def norm_f64(norm: Norm, x: np.ndarray) -> np.ndarray:
    """The norm of the rows of ``x`` (numeric.layer_norm_f64, its stages left out)."""
    return layer_norm_f64(x, norm, {})


def stream_f64(p: Problem, block: np.ndarray, O: np.ndarray) -> np.ndarray:
    """The residual stream from the block's input and the layer's output: B + O, or LN(B + O)."""
    total = block + O
    return norm_f64(p.norm, total) if post_norm(p) else total


# -- the chain rule by hand --------------------------------------------------------------------------


def norm_input_gradient(norm: Norm, dhat: np.ndarray, hat: np.ndarray, stat: np.ndarray) -> np.ndarray:
    """∂L/∂x from ∂L/∂x̂, row by row; ``stat`` is the rows' variance σ² (mean square for RMSNorm)."""
    r = np.sqrt(stat + float(norm.eps))                           # (n, 1): √(σ² + ε), √(ms + ε)
    along = hat * (dhat * hat).mean(axis=1, keepdims=True)       # x̂·mean(dx̂∘x̂): the root's share
    if norm.rms:
        return (dhat - along) / r
    return (dhat - dhat.mean(axis=1, keepdims=True) - along) / r  # and the mean's: −mean(dx̂)


def norm_layer_gradients(norm: Norm, dY: np.ndarray, hat: np.ndarray, stat: np.ndarray, out: dict,
                         hat_id: str, weight_ids: tuple[str, str] = (st.DGAMMA, st.DBETA)) -> np.ndarray:
    """Back through y = x̂∘gain + β from ∂L/∂y: ∂L/∂x̂ (under ``hat_id``), dγ and dβ (under
    ``weight_ids``: dnorm_gamma and dnorm_beta by default) into ``out``; returns ∂L/∂x."""
    dhat = out[hat_id] = dY * gain_f64(norm)                     # (n, d) ∘ (1, d)
    if norm.weight is not None:                                  # ∂(x̂·(offset + γ))/∂γ = x̂
        out[weight_ids[0]] = (dY * hat).sum(axis=0, keepdims=True)  # γ is on every row: the column sums
    if norm.bias is not None:
        out[weight_ids[1]] = dY.sum(axis=0, keepdims=True)
    return norm_input_gradient(norm, dhat, hat, stat)


def norm_stat(norm: Norm, fwd: dict) -> np.ndarray:
    """The rows' variance (mean square for RMSNorm) among the forward stages."""
    return fwd[st.MS if norm.rms else st.VAR]


def top_gradients(p: Problem, fwd: dict, d_top: np.ndarray, out: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """From ∂L/∂ of the pass's last stage (H with a residual, else O): dH and, behind a post
    norm, dR_hat, dnorm_gamma, dnorm_beta and dR into ``out``. Returns dO and what the residual
    adds to the gradient of the block's input (None without a residual)."""
    if not p.residual:
        return d_top, None
    out[st.DH] = d_top
    if not post_norm(p):
        return d_top, d_top                                      # H = B + O
    dR = out[st.DR] = norm_layer_gradients(p.norm, d_top, fwd[st.R_HAT], norm_stat(p.norm, fwd), out, st.DR_HAT)
    return dR, dR                                                # R = B + O


def input_gradients(p: Problem, fwd: dict, d_paths: np.ndarray, d_block: np.ndarray | None,
                    out: dict) -> np.ndarray:
    """dX from the gradient of the projections' input X (``d_paths``, summed over the paths that
    read it): back through a pre norm (dX_norm, dX_hat, dnorm_gamma, dnorm_beta into ``out``),
    plus the residual's ``d_block``. X + PE passes the gradient on unchanged."""
    dX = d_paths
    if pre_norm(p):
        out[st.DX_NORM] = d_paths
        dX = norm_layer_gradients(p.norm, d_paths, fwd[st.X_HAT], norm_stat(p.norm, fwd), out, st.DX_HAT)
    return dX if d_block is None else dX + d_block


# -- central differences ---------------------------------------------------------------------------------

Central = Callable[[Callable[[np.ndarray], float], np.ndarray], np.ndarray]


def fd_norm_output(out: dict, central: Central, norm: Norm, L_y: Callable[[np.ndarray], float],
                   hat: np.ndarray, hat_id: str) -> None:
    """∂L/∂x̂ (under ``hat_id``), dnorm_gamma and dnorm_beta by central differences of L(y),
    the loss as a function of the norm's output y = x̂∘(offset + γ) + β."""
    gain, beta = gain_f64(norm), beta_f64(norm)
    out[hat_id] = central(lambda h: L_y(h * gain + beta), hat)
    if norm.weight is not None:
        out[st.DGAMMA] = central(lambda g: L_y(hat * (norm.offset + g) + beta), to_float64(norm.weight))
    if norm.bias is not None:
        out[st.DBETA] = central(lambda b: L_y(hat * gain + b), to_float64(norm.bias))


def fd_top(out: dict, central: Central, p: Problem, fwd: dict, loss_top: Callable[[np.ndarray], float]) -> None:
    """With a residual: dH from L(H) and, behind a post norm, dR_hat, dnorm_gamma and dnorm_beta
    from L(R̂∘gain + β) and dR from L(LN(R)), each by central differences."""
    if not p.residual:
        return
    out[st.DH] = central(loss_top, fwd[st.H])
    if post_norm(p):
        fd_norm_output(out, central, p.norm, loss_top, fwd[st.R_HAT], st.DR_HAT)
        out[st.DR] = central(lambda R: loss_top(norm_f64(p.norm, R)), fwd[st.R])


# -- PyTorch autograd --------------------------------------------------------------------------------------


def torch_hat(torch, norm: Norm, x):
    """x̂ of the rows of ``x`` written out in torch operations (biased variance, ε in the root)."""
    eps = float(norm.eps)
    if norm.rms:
        return x / torch.sqrt((x * x).mean(dim=1, keepdim=True) + eps)
    centred = x - x.mean(dim=1, keepdim=True)
    return centred / torch.sqrt((centred * centred).mean(dim=1, keepdim=True) + eps)


def torch_norm_graph(graph, norm: Norm, x, hat_id: str, weight_ids: tuple[str, str] = (st.DGAMMA, st.DBETA)):
    """The norm of the rows of ``x`` in a torch ``graph`` (with ``leaf``, ``keep``, ``fused`` and
    ``torch``), γ and β leaves (dnorm_gamma, dnorm_beta): fused, PyTorch's own F.layer_norm or
    F.rms_norm (pytorch.torch_norm); else x̂ written out, kept under ``hat_id``, times
    offset + γ plus β."""
    if graph.fused:
        def leaf(m):  # torch_norm asks for the tensors of γ and β
            return graph.leaf(weight_ids[0] if m is norm.weight else weight_ids[1], m)
        return torch_norm(graph.torch.nn.functional, norm, x, leaf)
    y = graph.keep(hat_id, torch_hat(graph.torch, norm, x))
    if norm.weight is not None:
        y = y * (graph.leaf(weight_ids[0], norm.weight)[0] + norm.offset)
    if norm.bias is not None:
        y = y + graph.leaf(weight_ids[1], norm.bias)[0]
    return y


def torch_stream(graph, p: Problem, block, O):
    """The residual stream in a torch ``graph``, kept as dH: B + O, or behind a post norm
    LN(R) with R = B + O kept as dR."""
    if not post_norm(p):
        return graph.keep(st.DH, block + O)
    R = graph.keep(st.DR, block + O)
    return graph.keep(st.DH, torch_norm_graph(graph, p.norm, R, st.DR_HAT))
