"""The model's head and the MLP in the float64 backward references, from the cross-entropy of the
logits (``backward: {loss: cross-entropy}``) back to dH, the gradient of the residual stream the
attention wrote; :mod:`symattn.reference.numeric_backward` goes on from there.

Two routes, neither touching the exact code path:

- :func:`block_gradients`: the chain rule by hand in NumPy, from the NumPy forward stages:
  dlogits = (P − onehot)/rows (0 in a row without a target), dW_U = xᵀ·dlogits with x what the
  unembedding read, back through the final norm, dY (the last row's with ``rows: last``), behind
  the MLP's post norm back through it to dY_sum, dF, db_2, dW_2 = Gᵀ·dF, dG = dF·W_2ᵀ,
  dU = dG ∘ act′(U) (gated: dU_gate = dG ∘ U_up ∘ act′(U_gate), dU_up = dG ∘ act(U_gate)), db_1,
  dW_1 = xᵀ·dU, dH_norm and back through the MLP's norm, then dH = that + dY (dY_sum);
- :func:`torch_block_loss`: the same forward pass in a PyTorch graph (``nn.GELU``, its
  ``approximate='tanh'``, ``F.silu``, ``F.relu``, the norms, ``F.cross_entropy``), whose
  ``backward()`` gives every gradient by autograd: the weights as leaves, the intermediates kept.

The activations' slopes for the chain rule are written from their formulas: ReLU's 1 where
u > 0 (0 at 0, as PyTorch), ReLU²'s 2·max(0, u), GELU's Φ(u) + u·φ(u), the tanh form's
½(1 + t) + ½u(1 − t²)·√(2/π)(1 + 3·0.044715u²), SiLU's σ(u)(1 + u(1 − σ(u))).
"""

from __future__ import annotations

import math

import numpy as np

from .. import stages as st
from ..problem.model import CROSS_ENTROPY, Problem
from .norm_backward import norm_layer_gradients, torch_norm_graph
from .numeric import ACTIVATIONS, erf_f64, to_float64



def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu_tanh_slope(x):
    root, c = math.sqrt(2.0 / math.pi), 0.044715
    t = np.tanh(root * (x + c * x**3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * root * (1.0 + 3.0 * c * x * x)


SLOPES = {
    "relu": lambda x: (x > 0).astype(np.float64),
    "relu2": lambda x: 2.0 * np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * (1.0 + erf_f64(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi),
    "gelu-tanh": _gelu_tanh_slope,
    "silu": lambda x: _sigmoid(x) * (1.0 + x * (1.0 - _sigmoid(x))),
}


def from_cross_entropy(p: Problem) -> bool:
    """Whether the backward pass starts from the cross-entropy of the logits."""
    return p.backward is not None and p.backward.kind == CROSS_ENTROPY


def _stat(norm, fwd: dict, var: str, ms: str) -> np.ndarray:
    return fwd[ms if norm.rms else var]


def _unembedded(p: Problem, fwd: dict) -> np.ndarray:
    """What the unembedding multiplied: the final norm's output, the last row, or the block's output."""
    head = p.logits
    if head.norm is not None:
        return fwd[st.Y_FINAL]
    top = fwd[st.Y] if p.mlp is not None else fwd[st.H]
    return top[-1:] if head.last else top


def _head_gradients(p: Problem, fwd: dict, out: dict) -> np.ndarray:
    """dlogits, dW_U, back through the final norm and the last row: returns the block output's gradient."""
    head, loss = p.logits, p.loss
    z = fwd[st.LOGITS]
    dz = np.zeros_like(z)
    rows, targets = np.array(loss.rows), np.array(loss.targets)
    dz[rows] = fwd[st.P][rows]
    dz[rows, targets] -= 1.0                                     # P − onehot in the rows with a target
    dz /= len(loss.rows)                                         # the loss is their mean
    out[st.DLOGITS] = dz
    W_U = to_float64(head.W_U)
    out[st.DW_U] = _unembedded(p, fwd).T @ dz                    # (d, rows) @ (rows, vocabulary)
    d = dz @ W_U.T
    if head.norm is not None:
        out[st.DY_FINAL] = d
        d = norm_layer_gradients(head.norm, d, fwd[st.Y_FINAL_HAT], _stat(head.norm, fwd, st.FINAL_VAR, st.FINAL_MS),
                                 out, st.DY_FINAL_HAT, (st.DFINAL_GAMMA, st.DFINAL_BETA))
    if head.last:
        out[st.DY_LAST] = d
        full = np.zeros((p.n_q, d.shape[1]))
        full[-1] = d[0]                                          # only the last row reached the logits
        d = full
    return d


def block_gradients(p: Problem, fwd: dict, out: dict) -> np.ndarray:
    """Every gradient from the cross-entropy back to dH into ``out`` (by stage id); returns dH."""
    d = _head_gradients(p, fwd, out)
    mlp = p.mlp
    if mlp is None:
        return d                                                 # the head read the stream H itself
    out[st.DY] = d
    if mlp.post:                                                 # Y = LN(Y_sum), Y_sum = H + F
        d = out[st.DY_SUM] = norm_layer_gradients(mlp.norm, d, fwd[st.Y_HAT], _stat(mlp.norm, fwd, st.MLP_VAR, st.MLP_MS),
                                                  out, st.DY_HAT, (st.DMLP_GAMMA, st.DMLP_BETA))
    skip = dF = out[st.DF] = d                                   # a sum passes its gradient on
    G = fwd[st.G]
    x = fwd[st.H_NORM] if mlp.norm is not None and not mlp.post else fwd[st.H]
    if mlp.b_2 is not None:
        out[st.DB_2] = dF.sum(axis=0, keepdims=True)
    out[st.DW_DOWN if mlp.gated else st.DW_2] = G.T @ dF
    dG = out[st.DG] = dF @ to_float64(mlp.W_2).T
    if mlp.gated:
        gate, up = fwd[st.U_GATE], fwd[st.U_UP]
        dgate = out[st.DU_GATE] = dG * up * SLOPES[mlp.activation](gate)
        dup = out[st.DU_UP] = dG * ACTIVATIONS[mlp.activation](gate)
        out[st.DW_GATE], out[st.DW_UP] = x.T @ dgate, x.T @ dup
        dx = dgate @ to_float64(mlp.W_1).T + dup @ to_float64(mlp.W_up).T
    else:
        dU = out[st.DU] = dG * SLOPES[mlp.activation](fwd[st.U])
        if mlp.b_1 is not None:
            out[st.DB_1] = dU.sum(axis=0, keepdims=True)
        out[st.DW_1] = x.T @ dU
        dx = dU @ to_float64(mlp.W_1).T
    if mlp.norm is not None and not mlp.post:                    # back through the MLP's norm
        out[st.DH_NORM] = dx
        dx = norm_layer_gradients(mlp.norm, dx, fwd[st.H_HAT], _stat(mlp.norm, fwd, st.MLP_VAR, st.MLP_MS), out,
                                  st.DH_HAT, (st.DMLP_GAMMA, st.DMLP_BETA))
    return dx + skip                                             # and the residual's path


# -- PyTorch autograd ------------------------------------------------------------------------------------------


def torch_block_loss(graph, p: Problem, H):
    """The MLP, the head and the mean cross-entropy from the residual stream ``H`` in a torch
    ``graph`` (see torch_backward._TorchGraph: ``leaf``, ``keep``, ``torch``, ``fused``): the
    weights as leaves under their gradients' ids, the intermediates kept. Returns the loss."""
    from .pytorch import TORCH_ACTIVATIONS

    torch, F = graph.torch, graph.torch.nn.functional
    top, mlp = H, p.mlp
    if mlp is not None:
        x = H
        if mlp.norm is not None and not mlp.post:
            x = graph.keep(st.DH_NORM, torch_norm_graph(graph, mlp.norm, H, st.DH_HAT, (st.DMLP_GAMMA, st.DMLP_BETA)))
        act = TORCH_ACTIVATIONS[mlp.activation]
        if mlp.gated:
            gate = graph.keep(st.DU_GATE, x @ graph.leaf(st.DW_GATE, mlp.W_1))
            up = graph.keep(st.DU_UP, x @ graph.leaf(st.DW_UP, mlp.W_up))
            G = graph.keep(st.DG, act(torch, F, gate) * up)
            Fo = G @ graph.leaf(st.DW_DOWN, mlp.W_2)
        else:
            b_1 = None if mlp.b_1 is None else graph.leaf(st.DB_1, mlp.b_1)[0]
            U = graph.keep(st.DU, F.linear(x, graph.leaf(st.DW_1, mlp.W_1).T, b_1))
            G = graph.keep(st.DG, act(torch, F, U))
            b_2 = None if mlp.b_2 is None else graph.leaf(st.DB_2, mlp.b_2)[0]
            Fo = F.linear(G, graph.leaf(st.DW_2, mlp.W_2).T, b_2)
        Fo = graph.keep(st.DF, Fo)
        if mlp.post:
            Y_sum = graph.keep(st.DY_SUM, H + Fo)
            top = graph.keep(st.DY, torch_norm_graph(graph, mlp.norm, Y_sum, st.DY_HAT, (st.DMLP_GAMMA, st.DMLP_BETA)))
        else:
            top = graph.keep(st.DY, H + Fo)
    head = p.logits
    x = graph.keep(st.DY_LAST, top[-1:]) if head.last else top
    if head.norm is not None:
        x = graph.keep(st.DY_FINAL, torch_norm_graph(graph, head.norm, x, st.DY_FINAL_HAT,
                                                     (st.DFINAL_GAMMA, st.DFINAL_BETA)))
    z = graph.keep(st.DLOGITS, x @ graph.leaf(st.DW_U, head.W_U))
    rows, targets = torch.tensor(p.loss.rows), torch.tensor(p.loss.targets)
    return F.cross_entropy(z[rows], targets)
