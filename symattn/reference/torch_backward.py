"""PyTorch autograd as a reference for the backward pass of attention (and the block around it):
:func:`torch_gradients` runs the problem's forward pass as a torch graph in float64 and reads every
gradient stage off autograd, by stage id, in the order of :func:`numeric_backward.gradient_ids`.
PyTorch is optional: imported only when asked for."""

from __future__ import annotations

import numpy as np

from .. import stages as st

from .block_backward import from_cross_entropy, torch_block_loss
from .norm_backward import pre_norm, torch_norm_graph, torch_stream
from .numeric import positions_f64, scale_factor, to_float64
from .numeric_backward import gradient_ids, head_prefixes, loss_matrix, loss_of
from ..problem.model import Problem


def torch_gradients(p: Problem) -> dict[str, np.ndarray]:
    """Every gradient stage from PyTorch autograd in float64, by stage id.

    The forward pass goes through ``torch.nn.functional.scaled_dot_product_attention``
    with the mask (and bias) as a float ``attn_mask`` (0 allowed, −∞ masked), and a norm
    through ``F.layer_norm`` or ``F.rms_norm`` (γ and β leaves); the loss's ``backward()``
    gives the leaves' ``.grad`` (Q, K, V, or X, context, each head's weights, W_O, γ, β) and,
    by ``retain_grad()``, the intermediates' (H, R, O, concat, each head's O, Q, K, V, X_norm).

    SDPA fuses the scores and the weights away, and PyTorch's norms the normalised rows, so
    ``dA``, ``dS_masked``, ``dS`` and ``dX_hat`` (``dR_hat``) are not reachable through them:
    they come from a second, manual graph of the same forward pass (Q Kᵀ, ·scale + M,
    softmax, · V; x̂ = (x − μ)/√(σ² + ε), times offset + γ, plus β), each intermediate with
    ``retain_grad()``. Its other gradients are the same as the fused graph's (the tests
    compare the two).
    """
    fused = _torch_backward(p, fused=True)
    manual = _torch_backward(p, fused=False)
    return {stage: fused[stage] if stage in fused else manual[stage] for stage in gradient_ids(p)}


def _torch_backward(p: Problem, fused: bool) -> dict[str, np.ndarray]:
    """The gradients one torch graph reaches: through SDPA and PyTorch's norm (``fused``) or written out."""
    graph = _TorchGraph(p, fused)
    if not p.projected:
        O = graph.keep(st.DO, graph.head(st.stage_id, graph.leaf(st.DQ, p.Q), graph.leaf(st.DK, p.K),
                                         graph.leaf(st.DV, p.V)))
    else:
        O, block = graph.layer()
        if p.residual:
            O = torch_stream(graph, p, block, O)                # the loss is on H
    if from_cross_entropy(p):                                   # the MLP, the head and F.cross_entropy on H
        torch_block_loss(graph, p, O).backward()
    else:
        G = loss_matrix(p)
        loss_of(p.backward.kind, None if G is None else graph.torch.from_numpy(G), O).backward()
    return {stage: t.grad.numpy() for stage, t in graph.kept.items()}


class _TorchGraph:
    """One torch graph of the forward pass: its leaves and its kept intermediates by gradient id."""

    def __init__(self, p: Problem, fused: bool):
        from .pytorch import import_torch  # PyTorch is optional: imported only when asked for

        self.p, self.fused = p, fused
        self.torch = import_torch()
        self.subs = p.substitutions or None
        self.kept: dict = {}                                    # stage id -> the tensor whose .grad it is
        allowed = self.torch.tensor(p.mask.allowed, dtype=self.torch.bool)
        M = self.torch.zeros(allowed.shape, dtype=self.torch.float64).masked_fill(~allowed, float("-inf"))
        if p.bias is not None:
            M = M + self.torch.from_numpy(to_float64(p.bias, self.subs))
        self.M = M

    def leaf(self, stage: str, m):
        t = self.kept[stage] = self.torch.from_numpy(to_float64(m, self.subs)).requires_grad_()
        return t

    def keep(self, stage: str, t):
        t.retain_grad()
        self.kept[stage] = t
        return t

    def head(self, pre, Q, K, V, kv=None):
        """One head's output: (n_q, d_k), (n_k, d_k), (n_k, d_v) -> (n_q, d_v). ``kv`` names the stages of
        the keys it reads (its K/V group's first head's; its own by default): a group's rotated keys are
        made once, and their gradient sums every head's share."""
        from .pytorch import torch_rope

        p, torch = self.p, self.torch
        kv = kv or pre
        factor = scale_factor(p, Q.shape[1])
        if p.rope is not None:                                  # the scores compare the rotated Q and K
            Q = self.keep(pre(st.DQ_ROT), torch_rope(torch, Q, p.rope))
            rotated = self.kept.get(kv(st.DK_ROT))
            K = rotated if rotated is not None else self.keep(kv(st.DK_ROT), torch_rope(torch, K, p.rope))
        if self.fused:                                          # a batch of one
            return torch.nn.functional.scaled_dot_product_attention(
                Q[None], K[None], V[None], attn_mask=self.M, scale=factor)[0]
        S = self.keep(pre(st.DS), Q @ K.T)
        Z = self.keep(pre(st.DS_MASKED), S * factor + self.M)
        A = self.keep(pre(st.DA), torch.softmax(Z, dim=1))
        return A @ V

    def layer(self):
        """From X (and the context): X + PE, a pre norm, every head, W_O. Returns the layer's
        output O and the block's input B (X, or X + PE) the residual adds."""
        p, F = self.p, self.torch.nn.functional
        X = block = self.leaf(st.DX, p.X)
        PE = positions_f64(p)
        if PE is not None:
            X = block = X + self.torch.from_numpy(PE)           # X_pos = X + PE; dX flows through unchanged
        if pre_norm(p):                                         # the projections read X_norm
            X = self.keep(st.DX_NORM, torch_norm_graph(self, p.norm, X, st.DX_HAT))
        C = X if p.context is None else self.leaf(st.DCONTEXT, p.context)
        outputs = []
        prefixes = head_prefixes(p)
        for h, (pre, weights) in enumerate(zip(prefixes, p.heads), 1):
            kv = prefixes[p.kv_leader(h) - 1]                   # a K/V group's keys and values: made once
            projected = []
            for inp, grad, dw, db, w, b, who in ((X, st.DQ, st.DW_Q, st.DB_Q, weights.W_Q, weights.b_Q, pre),
                                                 (C, st.DK, st.DW_K, st.DB_K, weights.W_K, weights.b_K, kv),
                                                 (C, st.DV, st.DW_V, st.DB_V, weights.W_V, weights.b_V, kv)):
                if who(grad) in self.kept:                      # read by the group's earlier head
                    projected.append(self.kept[who(grad)])
                elif b is None:
                    projected.append(self.keep(who(grad), inp @ self.leaf(who(dw), w)))
                else:  # nn.Linear's x·Wᵀ + b, with the problem's W stored in × out
                    projected.append(self.keep(who(grad), F.linear(inp, self.leaf(who(dw), w).T,
                                                                   self.leaf(who(db), b)[0])))
            outputs.append(self.keep(pre(st.DO), self.head(pre, *projected, kv=kv)))
        if not p.multi_head:
            return outputs[0], block
        concat = self.keep(st.DCONCAT, self.torch.cat(outputs, dim=1))
        if p.b_O is None:
            return self.keep(st.DO, concat @ self.leaf(st.DW_O, p.W_O)), block
        return self.keep(st.DO, F.linear(concat, self.leaf(st.DW_O, p.W_O).T, self.leaf(st.DB_O, p.b_O)[0])), block
