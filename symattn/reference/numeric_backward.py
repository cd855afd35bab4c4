"""Independent float64 references for the backward pass of attention.

Three ways to the gradients of the problem's loss, none of which touches the
exact code path: each starts again from the problem's input matrices.

- :func:`numeric_gradients`: the chain rule by hand in NumPy, stage by stage;
- :func:`finite_difference_gradients`: central differences of a NumPy forward
  pass and the loss, taken "from each stage on";
- :func:`torch_gradients`: PyTorch autograd through ``scaled_dot_product_attention``.

All three return the same stage ids (``pre`` is ``headN.`` with ``heads``), in the order of
the registry (:func:`symattn.stages.plan`): with a residual stream (``residual:``, or a post
norm) first ``dH``, the loss's gradient on H, and behind a post norm ``dR_hat``,
``dnorm_gamma``, ``dnorm_beta`` (with γ, β) and ``dR``; then
``dO``; with heads ``dW_O``, ``dconcat`` and each ``headN.dO``; per head
``pre+dV``, ``pre+dA``, ``pre+dS_masked`` (w.r.t. Ŝ = scale·S + M),
``pre+dS`` (w.r.t. S = Q Kᵀ), with RoPE ``pre+dQ_rot`` and ``pre+dK_rot`` (w.r.t. the rotated
queries and keys the scores read), ``pre+dQ``, ``pre+dK`` and, with X and weights,
``pre+dW_Q``, ``pre+dW_K``, ``pre+dW_V`` (and ``pre+db_Q``, ``pre+db_K``,
``pre+db_V`` for the biases the problem has; ``db_O`` with ``b_O``); then with a pre norm
``dX_norm`` (the projections' input), ``dX_hat``, ``dnorm_gamma`` and ``dnorm_beta``; then
``dX`` and, for cross-attention, ``dcontext``. The norm's and the residual's gradients are
:mod:`symattn.reference.norm_backward`'s.

With a residual stream the loss is on H (``H = X + O``, or ``LN(X + O)`` behind a post norm)
instead of O: ``loss: sum`` is L = Σ H, ``target`` ½‖H − T‖², ``weights`` and ``dO`` Σ G ∘ H.

Masked positions (where M is −∞, from the mask or the bias) have exactly 0 in
``dS_masked`` and ``dS``: no perturbation of a score there changes the loss.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from .. import stages as st

from .block_backward import block_gradients, from_cross_entropy, torch_block_loss
from .norm_backward import (
    fd_norm_output, fd_top, input_gradients, norm_f64, pre_norm, stream_f64, top_gradients, torch_norm_graph,
    torch_stream,
)
from .numeric import numeric_stages, positions_f64, rope_matrices, rope_rotate, scale_factor, to_float64
from ..problem.model import Problem


def _prefixes(p: Problem) -> list:
    """For each head, the function that names its stages (``head1.dQ``, ... with heads, else ``dQ``)."""
    if not p.multi_head:
        return [st.stage_id]
    return [functools.partial(st.stage_id, head=h) for h in range(1, len(p.heads) + 1)]


def _stage_ids(p: Problem) -> list[str]:
    """The gradient stage ids of a problem, in the order of the backward pass, head by head; the
    norm's and the residual's inserted where the registry does not have them (yet)."""
    planned = [x for x in st.plan(p) if x.kind.gradient]
    first = next((k for k, x in enumerate(planned) if x.head is not None), len(planned))
    layer = [x.id for x in planned if x.head is None]
    heads = [x.id for h in range(1, len(p.heads) + 1) for x in planned if x.head == h]
    return layer[:first] + heads + layer[first:]


def _in_order(p: Problem, grads: dict[str, np.ndarray], who: str) -> dict[str, np.ndarray]:
    """``grads`` in the order of :func:`_stage_ids`, which must hold the same ids."""
    ids = _stage_ids(p)
    if set(ids) != set(grads):
        raise AssertionError(f"{who}: the gradients {sorted(set(grads) - set(ids))} are not planned, "
                             f"{sorted(set(ids) - set(grads))} planned but not computed")
    return {stage: grads[stage] for stage in ids}


def _has_bias(p: Problem, gradient: str) -> bool:
    """Whether the heads have the bias whose gradient is ``gradient`` (db_Q, db_K, db_V)."""
    return gradient[1:] in p.head_biases


def _biases(p: Problem, weights) -> tuple:
    """A head's (b_Q, b_K, b_V) in float64, 0 for a bias it does not have."""
    subs = p.substitutions or None
    return tuple(0.0 if b is None else to_float64(b, subs) for b in (weights.b_Q, weights.b_K, weights.b_V))


def loss_matrix(p: Problem) -> np.ndarray | None:
    """The backward section's matrix (dO, W or T; with a residual stream dH, W or T of H) in
    float64; None for ``loss: sum``."""
    if p.backward is None:
        raise ValueError(
            "the problem has no backward section; set one, e.g. "
            "dataclasses.replace(p, backward=symattn.problem.model.SUM_LOSS)"
        )
    if p.backward.matrix is None:
        return None
    return to_float64(p.backward.matrix, p.substitutions or None)


def _loss(kind: str, G, O):
    """The loss L(O) of a backward section (L(H) with a residual stream: called with H); works on
    NumPy arrays and torch tensors alike.

    With a given dO the loss is the linear L = Σ dO ∘ O, whose gradient is dO.
    """
    if kind == "sum":
        return O.sum()
    if kind == "target":
        return 0.5 * ((O - G) ** 2).sum()  # ½‖O − T‖²
    return (G * O).sum()  # L = Σ W ∘ O, or dO given


def _upstream(kind: str, G: np.ndarray | None, top: np.ndarray) -> np.ndarray:
    """∂L/∂ of the stage the loss is on (O, or H with a residual stream)."""
    if kind == "sum":                                           # L = Σ O
        return np.ones_like(top)
    if kind == "target":                                        # L = ½‖O − T‖²
        return top - G
    return G                                                    # dO given, or L = Σ W ∘ O


def _softmax(Z: np.ndarray) -> np.ndarray:
    """Row softmax with the max subtracted; −∞ entries get weight 0."""
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


# -- analytic backprop ---------------------------------------------------------


def numeric_gradients(p: Problem) -> dict[str, np.ndarray]:
    """Every gradient stage by backprop written out in NumPy float64, by stage id.

    The forward values are ``numeric_stages``'s; the problem needs a backward section.
    """
    G = loss_matrix(p)
    fwd = numeric_stages(p)
    out: dict[str, np.ndarray] = {}
    if from_cross_entropy(p):                                   # back through the head and the MLP to dH
        d_top = block_gradients(p, fwd, out)
    else:
        d_top = _upstream(p.backward.kind, G, fwd[st.H] if p.residual else fwd[st.O])
    dO, d_block = top_gradients(p, fwd, d_top, out)             # dH (dR_hat, dγ, dβ, dR) with the residual
    out[st.DO] = dO                                              # (n_q, d_out)

    prefixes = _prefixes(p)
    if p.multi_head:
        W_O = fwd[st.W_O]
        out[st.DW_O] = fwd[st.CONCAT].T @ dO                      # (h·d_v, n_q) @ (n_q, d_out)
        if p.b_O is not None:
            out[st.DB_O] = dO.sum(axis=0, keepdims=True)         # b_O is on every row: the column sums
        dconcat = out[st.DCONCAT] = dO @ W_O.T                   # (n_q, d_out) @ (d_out, h·d_v)
        widths = [fwd[pre(st.V)].shape[1] for pre in prefixes]
        blocks = np.split(dconcat, np.cumsum(widths)[:-1], axis=1)
    else:
        blocks = [dO]

    if p.projected:
        X = _projection_input(fwd)                               # X, X + PE, or its norm
        C = fwd.get(st.CONTEXT, X)
        dX = np.zeros_like(X)
        dC = np.zeros_like(C)                                   # the keys' and values' path
    for pre, dO_h in zip(prefixes, blocks):
        if p.multi_head:
            out[pre(st.DO)] = dO_h                              # (n_q, d_v): this head's columns
        dQ, dK, dV = _head_gradients(p, fwd, out, pre, dO_h)
        if p.projected:
            paths = _projection_gradients(p, fwd, out, pre, (X, C), (dQ, dK, dV))
            dX += paths[0]
            dC += paths[1]
    if p.projected:
        if p.context is None:                                    # X gives queries, keys and values
            dX = dX + dC
        else:
            out[st.DCONTEXT] = dC
        out[st.DX] = input_gradients(p, fwd, dX, d_block, out)  # through a pre norm, plus the residual
    return _in_order(p, out, "numeric_gradients")


def _projection_input(fwd: dict) -> np.ndarray:
    """What the projections read: X, X + PE with positions, its norm with a pre norm."""
    return fwd.get(st.X_NORM, fwd.get(st.X_POS, fwd[st.X]))


def _head_gradients(p: Problem, fwd: dict, out: dict, pre, dO_h: np.ndarray) -> tuple:
    """One head's dV, dA, dS_masked, dS (dQ_rot, dK_rot) and dQ, dK from its dO; returns dQ, dK, dV."""
    Q, K, V, A = (fwd[pre(name)] for name in (st.Q, st.K, st.V, st.A))
    dV = out[pre(st.DV)] = A.T @ dO_h                           # (n_k, n_q) @ (n_q, d_v)
    dA = out[pre(st.DA)] = dO_h @ V.T                           # (n_q, d_v) @ (d_v, n_k)
    # Softmax backward, row by row: a ∘ (da − da·a); A is exactly 0 where masked.
    dZ = out[pre(st.DS_MASKED)] = A * (dA - (dA * A).sum(axis=1, keepdims=True))
    dS = out[pre(st.DS)] = scale_factor(p, Q.shape[1]) * dZ     # Ŝ = scale·S + M
    if p.rope is None:
        dQ = out[pre(st.DQ)] = dS @ K                           # (n_q, n_k) @ (n_k, d_k)
        dK = out[pre(st.DK)] = dS.T @ Q                         # (n_k, n_q) @ (n_q, d_k)
    else:                                                       # S = Q_rot·K_rotᵀ, q_rot_p = R_p·q_p
        dQ_rot = out[pre(st.DQ_ROT)] = dS @ fwd[pre(st.K_ROT)]
        dK_rot = out[pre(st.DK_ROT)] = dS.T @ fwd[pre(st.Q_ROT)]
        R = rope_matrices(p.rope, Q.shape[0], Q.shape[1])       # (n, d_k, d_k)
        dQ = out[pre(st.DQ)] = np.einsum("pji,pj->pi", R, dQ_rot)  # dq_p = R_pᵀ·dq_rot_p
        dK = out[pre(st.DK)] = np.einsum("pji,pj->pi", R, dK_rot)
    return dQ, dK, dV


def _projection_gradients(p: Problem, fwd: dict, out: dict, pre, inputs: tuple, grads: tuple) -> tuple:
    """One head's dW_Q, dW_K, dW_V (and its biases') from dQ, dK, dV and the projections'
    inputs (X, C); returns the gradients of X (the queries' path) and of C (the keys' and values')."""
    (X, C), (dQ, dK, dV) = inputs, grads
    W_Q, W_K, W_V = (fwd[pre(name)] for name in (st.W_Q, st.W_K, st.W_V))
    out[pre(st.DW_Q)] = X.T @ dQ                                # (d_model, n_q) @ (n_q, d_k)
    out[pre(st.DW_K)] = C.T @ dK                                # (d_model, n_k) @ (n_k, d_k)
    out[pre(st.DW_V)] = C.T @ dV                                # (d_model, n_k) @ (n_k, d_v)
    for name, grad in ((st.DB_Q, dQ), (st.DB_K, dK), (st.DB_V, dV)):
        if _has_bias(p, name):                                  # a bias is on every row: the column sums
            out[pre(name)] = grad.sum(axis=0, keepdims=True)
    return dQ @ W_Q.T, dK @ W_K.T + dV @ W_V.T                  # (n_q, d_k) @ (d_k, d_model), ...


# -- finite differences ----------------------------------------------------------


def _central(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float, skip: np.ndarray | None = None) -> np.ndarray:
    """∂f/∂x by central differences, one entry at a time; entries where ``skip`` is True are 0.

    The step is relative to the entry, h = eps·max(1, |x_ij|), and the divisor is the
    step actually taken in float64 ((x + h) − (x − h)), so the rounding of x ± h adds no error.
    """
    grad = np.zeros_like(x)
    for ij in np.ndindex(x.shape):
        if skip is not None and skip[ij]:
            continue
        h = eps * max(1.0, abs(x[ij]))
        up, down = x.copy(), x.copy()
        up[ij] += h
        down[ij] -= h
        grad[ij] = (f(up) - f(down)) / (up[ij] - down[ij])
    return grad


def finite_difference_gradients(p: Problem, eps: float = 1e-6) -> dict[str, np.ndarray]:
    """Every gradient stage by central differences of the NumPy forward pass and loss.

    For each stage the loss is written as a function of that stage alone, the
    rest held at its forward value ("from this stage on"): with a residual stream L(H) and
    L(O) = L(B + O) (B the block's input), behind a post norm L(O) = L(LN(B + O)), L(R̂),
    L(γ), L(β) and L(R); then L(W_O), L(concat), L(O_h), L(V), L(A), L(Ŝ), L(S), L(Q), L(K),
    L(W_·); with a pre norm L(X_norm), L(X̂), L(γ), L(β); then L(X) through the whole pass (the
    norm and the residual included) and L(context). Masked entries of Ŝ and S (−∞ in M) are
    not perturbed: their value is 0.

    The step is relative to each entry (see :func:`_central`). Central
    differences are O(h²) accurate, but each difference of two losses carries
    float64 rounding of about 1e-16·|L|, divided by the step: with the default
    eps = 1e-6 they agree with :func:`numeric_gradients` to about 1e-9 of
    max(1, |gradient|) on the worked examples.
    """
    if from_cross_entropy(p):
        raise ValueError("finite differences are not taken back from the cross-entropy through the MLP and the "
                         "head: compare with numeric_gradients or torch_gradients")
    fwd = numeric_stages(p)
    prefixes = _prefixes(p)
    block = fwd.get(st.X_POS, fwd.get(st.X))                   # the residual's B: X, or X + PE
    onward = _FromEachStage(p, eps, loss_matrix(p), fwd, prefixes, fwd[prefixes[0](st.M)], block)  # M: every head's
    out: dict[str, np.ndarray] = {}
    onward.output_layer(out)
    for h, pre in enumerate(prefixes):
        onward.head(out, h, pre)
    if p.projected:
        onward.inputs(out)
    return _in_order(p, out, "finite_difference_gradients")


@dataclasses.dataclass
class _FromEachStage:
    """The loss as a function of one stage at a time, the rest held at its forward value ``fwd``,
    and its central differences (step ``eps``) stage by stage."""

    p: Problem
    eps: float
    G: np.ndarray | None                                        # the loss's matrix (None for sum)
    fwd: dict[str, np.ndarray]
    prefixes: list
    M: np.ndarray
    block: np.ndarray | None                                    # the block's input B (X, or X + PE)

    def central(self, f: Callable[[np.ndarray], float], x: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
        return _central(f, x, self.eps, skip)

    def loss_top(self, Y: np.ndarray) -> float:                 # L(H) with a residual stream, else L(O)
        return _loss(self.p.backward.kind, self.G, Y)

    def loss(self, O: np.ndarray) -> float:                     # L(O), O the layer's output
        if self.p.residual:                                     # H = B + O, or LN(B + O): B held
            return self.loss_top(stream_f64(self.p, self.block, O))
        return self.loss_top(O)

    def rot(self, x: np.ndarray) -> np.ndarray:
        """Queries or keys as the scores read them: rotated under RoPE, else as they are."""
        return x if self.p.rope is None else rope_rotate(x, self.p.rope)

    def attend(self, Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
        return self.attend_rotated(self.rot(Q), self.rot(K), V)

    def attend_rotated(self, Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
        """The output from the queries and keys the scores read (under RoPE, the rotated ones)."""
        return _softmax(Q @ K.T * scale_factor(self.p, Q.shape[1]) + self.M) @ V

    def output_layer(self, out: dict) -> None:
        """dH (dR_hat, dγ, dβ, dR behind a post norm) with a residual, dO and, with heads, dW_O
        (db_O) and dconcat."""
        fwd, loss = self.fwd, self.loss
        fd_top(out, self.central, self.p, fwd, self.loss_top)
        out[st.DO] = self.central(loss, fwd[st.O])
        if not self.p.multi_head:
            return
        W_O, concat = fwd[st.W_O], fwd[st.CONCAT]
        b_O = fwd.get(st.B_O, 0.0)
        out[st.DW_O] = self.central(lambda W: loss(concat @ W + b_O), W_O)
        if self.p.b_O is not None:
            out[st.DB_O] = self.central(lambda b: loss(concat @ W_O + b), b_O)
        out[st.DCONCAT] = self.central(lambda c: loss(c @ W_O + b_O), concat)

    def head_output_loss(self, h: int) -> Callable[[np.ndarray], float]:
        """L(O_h): the loss as a function of head h's output (0-based), in its columns of concat."""
        if not self.p.multi_head:
            return self.loss
        fwd = self.fwd
        W_O, concat = fwd[st.W_O], fwd[st.CONCAT]
        b_O = fwd.get(st.B_O, 0.0)
        end = np.cumsum([fwd[pre(st.V)].shape[1] for pre in self.prefixes])[h]

        def L_O(O_h):
            c = concat.copy()
            c[:, end - O_h.shape[1]:end] = O_h
            return self.loss(c @ W_O + b_O)
        return L_O

    def head(self, out: dict, h: int, pre) -> None:
        """Head h's (0-based) gradients: dO_h with heads, dV, dA, dŜ, dS, dQ, dK, and its weights'."""
        fwd, central = self.fwd, self.central
        Q, K, V = fwd[pre(st.Q)], fwd[pre(st.K)], fwd[pre(st.V)]
        factor = scale_factor(self.p, Q.shape[1])
        masked = np.isneginf(self.M)                            # from the mask or a −∞ bias
        L_O = self.head_output_loss(h)

        def L_A(A):
            return L_O(A @ V)

        def L_Shat(Z):
            return L_A(_softmax(Z))

        def L_S(S):
            return L_Shat(S * factor + self.M)

        if self.p.multi_head:
            out[pre(st.DO)] = central(L_O, fwd[pre(st.O)])
        rotated, rot = self.attend_rotated, self.rot
        Q_rot, K_rot = rot(Q), rot(K)                           # held: only what a loss perturbs is turned
        out[pre(st.DV)] = central(lambda V_: L_O(rotated(Q_rot, K_rot, V_)), V)
        out[pre(st.DA)] = central(L_A, fwd[pre(st.A)])
        out[pre(st.DS_MASKED)] = central(L_Shat, fwd[pre(st.S_MASKED)], skip=masked)
        out[pre(st.DS)] = central(L_S, fwd[pre(st.S)], skip=masked)
        if self.p.rope is not None:                             # L(Q_rot), L(K_rot)
            out[pre(st.DQ_ROT)] = central(lambda Q_: L_O(rotated(Q_, K_rot, V)), Q_rot)
            out[pre(st.DK_ROT)] = central(lambda K_: L_O(rotated(Q_rot, K_, V)), K_rot)
        out[pre(st.DQ)] = central(lambda Q_: L_O(rotated(rot(Q_), K_rot, V)), Q)
        out[pre(st.DK)] = central(lambda K_: L_O(rotated(Q_rot, rot(K_), V)), K)
        if self.p.projected:
            self.projections(out, h, pre, L_O)

    def projections(self, out: dict, h: int, pre, L_O: Callable[[np.ndarray], float]) -> None:
        """Head h's (0-based) dW_Q, dW_K, dW_V and the gradients of the biases it has."""
        p, fwd, attend, central, rot = self.p, self.fwd, self.attend_rotated, self.central, self.rot
        Q, K, V = rot(fwd[pre(st.Q)]), rot(fwd[pre(st.K)]), fwd[pre(st.V)]  # as the scores read them
        X = _projection_input(fwd)                               # X, X + PE, or its norm
        C = fwd.get(st.CONTEXT, X)
        bq, bk, bv = _biases(p, p.heads[h])
        out[pre(st.DW_Q)] = central(lambda W: L_O(attend(rot(X @ W + bq), K, V)), fwd[pre(st.W_Q)])
        out[pre(st.DW_K)] = central(lambda W: L_O(attend(Q, rot(C @ W + bk), V)), fwd[pre(st.W_K)])
        out[pre(st.DW_V)] = central(lambda W: L_O(attend(Q, K, C @ W + bv)), fwd[pre(st.W_V)])
        if _has_bias(p, st.DB_Q):
            out[pre(st.DB_Q)] = central(lambda b: L_O(attend(rot(X @ fwd[pre(st.W_Q)] + b), K, V)), bq)
        if _has_bias(p, st.DB_K):
            out[pre(st.DB_K)] = central(lambda b: L_O(attend(Q, rot(C @ fwd[pre(st.W_K)] + b), V)), bk)
        if _has_bias(p, st.DB_V):
            out[pre(st.DB_V)] = central(lambda b: L_O(attend(Q, K, C @ fwd[pre(st.W_V)] + b)), bv)

    def whole_pass_loss(self, X: np.ndarray, C: np.ndarray, block: np.ndarray | None) -> float:
        """The loss through the whole forward pass from the projections' inputs X and C, and the
        block's input ``block`` the residual adds (None without one)."""
        p, fwd = self.p, self.fwd
        outputs = []
        for pre, weights in zip(self.prefixes, p.heads):
            bq, bk, bv = _biases(p, weights)
            outputs.append(self.attend(X @ fwd[pre(st.W_Q)] + bq, C @ fwd[pre(st.W_K)] + bk, C @ fwd[pre(st.W_V)] + bv))
        O = outputs[0]
        if p.multi_head:
            O = np.concatenate(outputs, axis=1) @ fwd[st.W_O] + fwd.get(st.B_O, 0.0)
        return self.loss_top(stream_f64(p, block, O)) if p.residual else self.loss_top(O)

    def inputs(self, out: dict) -> None:
        """With a pre norm dX_norm, dX_hat, dγ and dβ; dX through the whole pass (X + PE, the norm,
        the residual) and, for cross-attention, dcontext."""
        p, fwd, central = self.p, self.fwd, self.central
        X, C, B = fwd[st.X], fwd.get(st.CONTEXT), self.block
        PE = fwd.get(st.PE, 0.0)                                # X_pos = X + PE: perturb X, add PE

        def L_in(X_in, block):                                  # L(the projections' input, B)
            return self.whole_pass_loss(X_in, X_in if C is None else C, block)

        if pre_norm(p):
            out[st.DX_NORM] = central(lambda X_in: L_in(X_in, B), fwd[st.X_NORM])
            fd_norm_output(out, central, p.norm, lambda X_in: L_in(X_in, B), fwd[st.X_HAT], st.DX_HAT)

        def L_X(X_):
            block = X_ + PE
            return L_in(norm_f64(p.norm, block) if pre_norm(p) else block, block)

        out[st.DX] = central(L_X, X)
        if C is not None:
            X_in = _projection_input(fwd)
            out[st.DCONTEXT] = central(lambda C_: self.whole_pass_loss(X_in, C_, B), C)


# -- PyTorch autograd --------------------------------------------------------------


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
    return {stage: fused[stage] if stage in fused else manual[stage] for stage in _stage_ids(p)}


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
        _loss(p.backward.kind, None if G is None else graph.torch.from_numpy(G), O).backward()
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

    def head(self, pre, Q, K, V):
        """One head's output: (n_q, d_k), (n_k, d_k), (n_k, d_v) -> (n_q, d_v)."""
        from .pytorch import torch_rope

        p, torch = self.p, self.torch
        factor = scale_factor(p, Q.shape[1])
        if p.rope is not None:                                  # the scores compare the rotated Q and K
            Q = self.keep(pre(st.DQ_ROT), torch_rope(torch, Q, p.rope))
            K = self.keep(pre(st.DK_ROT), torch_rope(torch, K, p.rope))
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
        for pre, weights in zip(_prefixes(p), p.heads):
            projected = []
            for inp, grad, dw, db, w, b in ((X, st.DQ, st.DW_Q, st.DB_Q, weights.W_Q, weights.b_Q),
                                            (C, st.DK, st.DW_K, st.DB_K, weights.W_K, weights.b_K),
                                            (C, st.DV, st.DW_V, st.DB_V, weights.W_V, weights.b_V)):
                if b is None:
                    y = inp @ self.leaf(pre(dw), w)
                else:  # nn.Linear's x·Wᵀ + b, with the problem's W stored in × out
                    y = F.linear(inp, self.leaf(pre(dw), w).T, self.leaf(pre(db), b)[0])
                projected.append(self.keep(pre(grad), y))
            outputs.append(self.keep(pre(st.DO), self.head(pre, *projected)))
        if not p.multi_head:
            return outputs[0], block
        concat = self.keep(st.DCONCAT, self.torch.cat(outputs, dim=1))
        if p.b_O is None:
            return self.keep(st.DO, concat @ self.leaf(st.DW_O, p.W_O)), block
        return self.keep(st.DO, F.linear(concat, self.leaf(st.DW_O, p.W_O).T, self.leaf(st.DB_O, p.b_O)[0])), block
