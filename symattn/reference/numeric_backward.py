"""Independent float64 references for the backward pass of attention.

Three ways to the gradients of the problem's loss, none of which touches the
exact code path: each starts again from the problem's input matrices.

- :func:`numeric_gradients`: the chain rule by hand in NumPy, stage by stage;
- :func:`finite_difference_gradients`: central differences of a NumPy forward
  pass and the loss, taken "from each stage on";
- :func:`symattn.reference.torch_backward.torch_gradients`: PyTorch autograd through
  ``scaled_dot_product_attention``.

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
``dX`` and, for cross-attention, ``dcontext``. With K/V groups (``kv_heads``) a group's ``dV``,
``dK`` (``dK_rot``), ``dW_K``, ``dW_V``, ``db_K`` and ``db_V`` are under its first head's prefix
and sum the shares of every head of the group. The norm's and the residual's gradients are
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

from .block_backward import block_gradients, from_cross_entropy
from .norm_backward import fd_norm_output, fd_top, input_gradients, norm_f64, pre_norm, stream_f64, top_gradients
from .numeric import numeric_stages, rope_matrices, rope_rotate, scale_factor, to_float64
from ..problem.model import Problem


def head_prefixes(p: Problem) -> list:
    """For each head, the function that names its stages (``head1.dQ``, ... with heads, else ``dQ``)."""
    if not p.multi_head:
        return [st.stage_id]
    return [functools.partial(st.stage_id, head=h) for h in range(1, len(p.heads) + 1)]


def gradient_ids(p: Problem) -> list[str]:
    """The gradient stage ids of a problem, in the order of the backward pass, head by head; the
    norm's and the residual's inserted where the registry does not have them (yet)."""
    planned = [x for x in st.plan(p) if x.kind.gradient]
    first = next((k for k, x in enumerate(planned) if x.head is not None), len(planned))
    layer = [x.id for x in planned if x.head is None]
    heads = [x.id for h in range(1, len(p.heads) + 1) for x in planned if x.head == h]
    return layer[:first] + heads + layer[first:]


def _in_order(p: Problem, grads: dict[str, np.ndarray], who: str) -> dict[str, np.ndarray]:
    """``grads`` in the order of :func:`gradient_ids`, which must hold the same ids."""
    ids = gradient_ids(p)
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


def loss_of(kind: str, G, O):
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

    prefixes = head_prefixes(p)
    if p.multi_head:
        W_O = fwd[st.W_O]
        out[st.DW_O] = fwd[st.CONCAT].T @ dO                      # (h·d_v, n_q) @ (n_q, d_out)
        if p.b_O is not None:
            out[st.DB_O] = dO.sum(axis=0, keepdims=True)         # b_O is on every row: the column sums
        dconcat = out[st.DCONCAT] = dO @ W_O.T                   # (n_q, d_out) @ (d_out, h·d_v)
        widths = [weights.d_v for weights in p.heads]
        blocks = np.split(dconcat, np.cumsum(widths)[:-1], axis=1)
    else:
        blocks = [dO]

    if p.projected:
        X = _projection_input(fwd)                               # X, X + PE, or its norm
        C = fwd.get(st.CONTEXT, X)
        dX = np.zeros_like(X)
        dC = np.zeros_like(C)                                   # the keys' and values' path
    groups: dict[int, list] = {}                                 # K/V group's first head -> its [dK, dV] sums
    for h, (pre, dO_h) in enumerate(zip(prefixes, blocks), 1):
        if p.multi_head:
            out[pre(st.DO)] = dO_h                              # (n_q, d_v): this head's columns
        kv = prefixes[p.kv_leader(h) - 1]                       # whose ids hold the K and V this head reads
        dQ, dK, dV = _head_gradients(p, fwd, out, (pre, kv), dO_h)
        if p.kv_heads:                                          # a group's keys and values: every head's share
            sums = groups.setdefault(p.kv_leader(h), [0.0, 0.0])
            sums[0], sums[1] = sums[0] + dK, sums[1] + dV
        if p.projected:
            dX += _query_gradients(p, fwd, out, pre, X, dQ)
            if not p.kv_heads:
                dC += _kv_gradients(p, fwd, out, pre, C, dK, dV)
    for leader, (dK, dV) in groups.items():
        kv = prefixes[leader - 1]
        _group_gradients(p, fwd, out, kv, dK, dV)
        if p.projected:
            dC += _kv_gradients(p, fwd, out, kv, C, out[kv(st.DK)], out[kv(st.DV)])
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


def _head_gradients(p: Problem, fwd: dict, out: dict, prefixes: tuple, dO_h: np.ndarray) -> tuple:
    """One head's dV, dA, dS_masked, dS (dQ_rot, dK_rot) and dQ, dK from its dO; returns dQ, dK, dV.

    ``prefixes`` are the head's own and its K/V group's (the same without groups). A group's dK,
    dK_rot and dV are the sums of its heads' (:func:`_group_gradients`): they are kept here only
    without groups."""
    pre, kv = prefixes
    Q, A = fwd[pre(st.Q)], fwd[pre(st.A)]
    K, V = fwd[kv(st.K)], fwd[kv(st.V)]
    dV = A.T @ dO_h                                             # (n_k, n_q) @ (n_q, d_v)
    dA = out[pre(st.DA)] = dO_h @ V.T                           # (n_q, d_v) @ (d_v, n_k)
    # Softmax backward, row by row: a ∘ (da − da·a); A is exactly 0 where masked.
    dZ = out[pre(st.DS_MASKED)] = A * (dA - (dA * A).sum(axis=1, keepdims=True))
    dS = out[pre(st.DS)] = scale_factor(p, Q.shape[1]) * dZ     # Ŝ = scale·S + M
    if p.rope is None:
        dQ = out[pre(st.DQ)] = dS @ K                           # (n_q, n_k) @ (n_k, d_k)
        dK = dS.T @ Q                                           # (n_k, n_q) @ (n_q, d_k)
    else:                                                       # S = Q_rot·K_rotᵀ, q_rot_p = R_p·q_p
        dQ_rot = out[pre(st.DQ_ROT)] = dS @ fwd[kv(st.K_ROT)]
        dK = dS.T @ fwd[pre(st.Q_ROT)]                          # dK_rot: turned back in _group_gradients
        R = rope_matrices(p.rope, Q.shape[0], Q.shape[1])       # (n, d_k, d_k)
        dQ = out[pre(st.DQ)] = np.einsum("pji,pj->pi", R, dQ_rot)  # dq_p = R_pᵀ·dq_rot_p
    if not p.kv_heads:
        dK, dV = _group_gradients(p, fwd, out, pre, dK, dV)
    return dQ, dK, dV


def _group_gradients(p: Problem, fwd: dict, out: dict, kv, dK: np.ndarray, dV: np.ndarray) -> tuple:
    """A K/V group's dV and dK (under RoPE dK_rot, then each row turned back) from the sums of its
    heads' shares: Σ Aᵀ·dO and Σ dSᵀ·Q (Σ dSᵀ·Q_rot); returns dK, dV."""
    out[kv(st.DV)] = dV
    if p.rope is not None:
        out[kv(st.DK_ROT)] = dK
        R = rope_matrices(p.rope, dK.shape[0], dK.shape[1])
        dK = np.einsum("pji,pj->pi", R, dK)                     # dk_p = R_pᵀ·dk_rot_p
    out[kv(st.DK)] = dK
    return dK, dV


def _query_gradients(p: Problem, fwd: dict, out: dict, pre, X: np.ndarray, dQ: np.ndarray) -> np.ndarray:
    """One head's dW_Q (and db_Q) from dQ and what the queries are made from; returns the gradient
    of X along the queries' path."""
    out[pre(st.DW_Q)] = X.T @ dQ                                # (d_model, n_q) @ (n_q, d_k)
    if _has_bias(p, st.DB_Q):                                   # a bias is on every row: the column sums
        out[pre(st.DB_Q)] = dQ.sum(axis=0, keepdims=True)
    return dQ @ fwd[pre(st.W_Q)].T                              # (n_q, d_k) @ (d_k, d_model)


def _kv_gradients(p: Problem, fwd: dict, out: dict, kv, C: np.ndarray, dK: np.ndarray, dV: np.ndarray) -> np.ndarray:
    """A head's (a K/V group's) dW_K, dW_V (and db_K, db_V) from dK, dV and what the keys and values
    are made from; returns the gradient of C along their paths."""
    out[kv(st.DW_K)] = C.T @ dK                                 # (d_model, n_k) @ (n_k, d_k)
    out[kv(st.DW_V)] = C.T @ dV                                 # (d_model, n_k) @ (n_k, d_v)
    for name, grad in ((st.DB_K, dK), (st.DB_V, dV)):
        if _has_bias(p, name):
            out[kv(name)] = grad.sum(axis=0, keepdims=True)
    return dK @ fwd[kv(st.W_K)].T + dV @ fwd[kv(st.W_V)].T      # (n_k, d_k) @ (d_k, d_model), ...


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
    prefixes = head_prefixes(p)
    block = fwd.get(st.X_POS, fwd.get(st.X))                   # the residual's B: X, or X + PE
    onward = _FromEachStage(p, eps, loss_matrix(p), fwd, prefixes, fwd[prefixes[0](st.M)], block)  # M: every head's
    out: dict[str, np.ndarray] = {}
    onward.output_layer(out)
    for h, pre in enumerate(prefixes):
        onward.head(out, h, pre)
    if p.kv_heads:                                              # a K/V group's, through all its heads
        size = len(p.heads) // p.kv_heads
        for first in range(0, len(p.heads), size):
            onward.group(out, list(range(first, first + size)))
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
        return loss_of(self.p.backward.kind, self.G, Y)

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
        end = np.cumsum([weights.d_v for weights in self.p.heads])[h]

        def L_O(O_h):
            c = concat.copy()
            c[:, end - O_h.shape[1]:end] = O_h
            return self.loss(c @ W_O + b_O)
        return L_O

    def kv(self, h: int):
        """The ids of the keys and values head h (0-based) reads: its K/V group's first head's."""
        return self.prefixes[self.p.kv_leader(h + 1) - 1]

    def group_loss(self, heads: list[int]) -> Callable[[list], float]:
        """L(O_h for h in heads): the loss as a function of those heads' (0-based) outputs, each in its
        columns of concat (the other heads' held)."""
        fwd = self.fwd
        W_O, concat = fwd[st.W_O], fwd[st.CONCAT]
        b_O = fwd.get(st.B_O, 0.0)
        ends = np.cumsum([weights.d_v for weights in self.p.heads])

        def L(outputs):
            c = concat.copy()
            for h, O_h in zip(heads, outputs):
                c[:, ends[h] - O_h.shape[1]:ends[h]] = O_h
            return self.loss(c @ W_O + b_O)
        return L

    def group(self, out: dict, heads: list[int]) -> None:
        """A K/V group's dV, dK (dK_rot) and its weights' (dW_K, dW_V, db_K, db_V): the loss through every
        head of the group (0-based ``heads``), the keys or values perturbed once for them all."""
        p, fwd, central, rot, attend = self.p, self.fwd, self.central, self.rot, self.attend_rotated
        kv = self.prefixes[heads[0]]
        L = self.group_loss(heads)
        queries = [rot(fwd[self.prefixes[h](st.Q)]) for h in heads]   # held, as the scores read them
        K, V = fwd[kv(st.K)], fwd[kv(st.V)]
        K_rot = rot(K)

        def through(K_rot_, V_):
            return L([attend(Q_rot, K_rot_, V_) for Q_rot in queries])

        out[kv(st.DV)] = central(lambda V_: through(K_rot, V_), V)
        if p.rope is not None:
            out[kv(st.DK_ROT)] = central(lambda K_: through(K_, V), K_rot)
        out[kv(st.DK)] = central(lambda K_: through(rot(K_), V), K)
        if not p.projected:
            return
        C = fwd.get(st.CONTEXT, _projection_input(fwd))
        _, bk, bv = _biases(p, p.heads[heads[0]])
        W_K, W_V = fwd[kv(st.W_K)], fwd[kv(st.W_V)]
        out[kv(st.DW_K)] = central(lambda W: through(rot(C @ W + bk), V), W_K)
        out[kv(st.DW_V)] = central(lambda W: through(K_rot, C @ W + bv), W_V)
        if _has_bias(p, st.DB_K):
            out[kv(st.DB_K)] = central(lambda b: through(rot(C @ W_K + b), V), bk)
        if _has_bias(p, st.DB_V):
            out[kv(st.DB_V)] = central(lambda b: through(K_rot, C @ W_V + b), bv)

    def head(self, out: dict, h: int, pre) -> None:
        """Head h's (0-based) gradients: dO_h with heads, dA, dŜ, dS, dQ, and its weights'; without K/V
        groups also dV, dK (dK_rot) and its key and value weights' (with groups, :meth:`group`)."""
        fwd, central = self.fwd, self.central
        grouped = bool(self.p.kv_heads)
        Q, K, V = fwd[pre(st.Q)], fwd[self.kv(h)(st.K)], fwd[self.kv(h)(st.V)]
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
        if not grouped:
            out[pre(st.DV)] = central(lambda V_: L_O(rotated(Q_rot, K_rot, V_)), V)
        out[pre(st.DA)] = central(L_A, fwd[pre(st.A)])
        out[pre(st.DS_MASKED)] = central(L_Shat, fwd[pre(st.S_MASKED)], skip=masked)
        out[pre(st.DS)] = central(L_S, fwd[pre(st.S)], skip=masked)
        if self.p.rope is not None:                             # L(Q_rot), L(K_rot)
            out[pre(st.DQ_ROT)] = central(lambda Q_: L_O(rotated(Q_, K_rot, V)), Q_rot)
            if not grouped:
                out[pre(st.DK_ROT)] = central(lambda K_: L_O(rotated(Q_rot, K_, V)), K_rot)
        out[pre(st.DQ)] = central(lambda Q_: L_O(rotated(rot(Q_), K_rot, V)), Q)
        if not grouped:
            out[pre(st.DK)] = central(lambda K_: L_O(rotated(Q_rot, rot(K_), V)), K)
        if self.p.projected:
            self.projections(out, h, pre, L_O)

    def projections(self, out: dict, h: int, pre, L_O: Callable[[np.ndarray], float]) -> None:
        """Head h's (0-based) dW_Q, dW_K, dW_V and the gradients of the biases it has."""
        p, fwd, attend, central, rot = self.p, self.fwd, self.attend_rotated, self.central, self.rot
        kv = self.kv(h)
        Q, K, V = rot(fwd[pre(st.Q)]), rot(fwd[kv(st.K)]), fwd[kv(st.V)]  # as the scores read them
        X = _projection_input(fwd)                               # X, X + PE, or its norm
        C = fwd.get(st.CONTEXT, X)
        bq, bk, bv = _biases(p, p.heads[h])
        out[pre(st.DW_Q)] = central(lambda W: L_O(attend(rot(X @ W + bq), K, V)), fwd[pre(st.W_Q)])
        if _has_bias(p, st.DB_Q):
            out[pre(st.DB_Q)] = central(lambda b: L_O(attend(rot(X @ fwd[pre(st.W_Q)] + b), K, V)), bq)
        if p.kv_heads:
            return                                              # the group's key and value weights: group()
        out[pre(st.DW_K)] = central(lambda W: L_O(attend(Q, rot(C @ W + bk), V)), fwd[pre(st.W_K)])
        out[pre(st.DW_V)] = central(lambda W: L_O(attend(Q, K, C @ W + bv)), fwd[pre(st.W_V)])
        if _has_bias(p, st.DB_K):
            out[pre(st.DB_K)] = central(lambda b: L_O(attend(Q, rot(C @ fwd[pre(st.W_K)] + b), V)), bk)
        if _has_bias(p, st.DB_V):
            out[pre(st.DB_V)] = central(lambda b: L_O(attend(Q, K, C @ fwd[pre(st.W_V)] + b)), bv)

    def whole_pass_loss(self, X: np.ndarray, C: np.ndarray, block: np.ndarray | None) -> float:
        """The loss through the whole forward pass from the projections' inputs X and C, and the
        block's input ``block`` the residual adds (None without one)."""
        p, fwd = self.p, self.fwd
        outputs = []
        for h, (pre, weights) in enumerate(zip(self.prefixes, p.heads)):
            bq, bk, bv = _biases(p, weights)
            kv = self.kv(h)
            outputs.append(self.attend(X @ fwd[pre(st.W_Q)] + bq, C @ fwd[kv(st.W_K)] + bk, C @ fwd[kv(st.W_V)] + bv))
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
