"""Independent float64 references for the backward pass of attention.

Three ways to the gradients of the problem's loss, none of which touches the
exact code path: each starts again from the problem's input matrices.

- :func:`numeric_gradients`: the chain rule by hand in NumPy, stage by stage;
- :func:`finite_difference_gradients`: central differences of a NumPy forward
  pass and the loss, taken "from each stage on";
- :func:`torch_gradients`: PyTorch autograd through ``scaled_dot_product_attention``.

All three return the same stage ids (``pre`` is ``headN.`` with ``heads``):
``dO``; with heads ``dW_O``, ``dconcat`` and each ``headN.dO``; per head
``pre+dV``, ``pre+dA``, ``pre+dS_masked`` (w.r.t. Ŝ = scale·S + M),
``pre+dS`` (w.r.t. S = Q Kᵀ), ``pre+dQ``, ``pre+dK`` and, with X and weights,
``pre+dW_Q``, ``pre+dW_K``, ``pre+dW_V``; then ``dX`` and, for
cross-attention, ``dcontext``.

Masked positions (where M is −∞, from the mask or the bias) have exactly 0 in
``dS_masked`` and ``dS``: no perturbation of a score there changes the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .numeric import _f64, numeric_stages
from .problem import Problem


def _factor(p: Problem, d_k: int) -> float:
    """The scale factor of a head with this d_k, as ``numeric_stages`` computes it."""
    if p.scale == "auto":
        return 1.0 / np.sqrt(d_k)
    if p.scale == "none":
        return 1.0
    return float(p.scale)


def _prefixes(p: Problem) -> list[str]:
    """The stage-id prefix of each head: ``head1.``, ... with heads, else ``""``."""
    if not p.multi_head:
        return [""]
    return [f"head{h}." for h in range(1, len(p.heads) + 1)]


def _stage_ids(p: Problem) -> list[str]:
    """The gradient stage ids of a problem, in the order of the backward pass."""
    ids = ["dO"] + (["dW_O", "dconcat"] if p.multi_head else [])
    for pre in _prefixes(p):
        ids += [pre + "dO"] if p.multi_head else []
        ids += [pre + s for s in ("dV", "dA", "dS_masked", "dS", "dQ", "dK")]
        ids += [pre + s for s in ("dW_Q", "dW_K", "dW_V")] if p.projected else []
    if p.projected:
        ids += ["dX"] + (["dcontext"] if p.context is not None else [])
    return ids


def _loss_matrix(p: Problem) -> np.ndarray | None:
    """The backward section's matrix (dO, W or T) in float64; None for ``loss: sum``."""
    if p.backward is None:
        raise ValueError(
            "the problem has no backward section; set one, e.g. "
            "dataclasses.replace(p, backward=symattn.problem.SUM_LOSS)"
        )
    if p.backward.matrix is None:
        return None
    return _f64(p.backward.matrix, p.substitutions or None)


def _loss(kind: str, G, O):
    """The loss L(O) of a backward section; works on NumPy arrays and torch tensors alike.

    With a given dO the loss is the linear L = Σ dO ∘ O, whose gradient is dO.
    """
    if kind == "sum":
        return O.sum()
    if kind in ("dO", "weights"):
        return (G * O).sum()
    return 0.5 * ((O - G) ** 2).sum()  # target: ½‖O − T‖²


def _softmax(Z: np.ndarray) -> np.ndarray:
    """Row softmax with the max subtracted; −∞ entries get weight 0."""
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


# -- analytic backprop ---------------------------------------------------------


def numeric_gradients(p: Problem) -> dict[str, np.ndarray]:
    """Every gradient stage by backprop written out in NumPy float64, by stage id.

    The forward values are ``numeric_stages``'s; the problem needs a backward section.
    """
    G = _loss_matrix(p)
    fwd = numeric_stages(p)
    out: dict[str, np.ndarray] = {}
    if p.backward.kind == "sum":                                # L = Σ O
        dO = np.ones_like(fwd["O"])
    elif p.backward.kind == "target":                           # L = ½‖O − T‖²
        dO = fwd["O"] - G
    else:                                                       # dO given, or L = Σ W ∘ O
        dO = G
    out["dO"] = dO                                              # (n_q, d_out)

    prefixes = _prefixes(p)
    if p.multi_head:
        W_O = fwd["W_O"]
        out["dW_O"] = fwd["concat"].T @ dO                      # (h·d_v, n_q) @ (n_q, d_out)
        dconcat = out["dconcat"] = dO @ W_O.T                   # (n_q, d_out) @ (d_out, h·d_v)
        widths = [fwd[pre + "V"].shape[1] for pre in prefixes]
        blocks = np.split(dconcat, np.cumsum(widths)[:-1], axis=1)
    else:
        blocks = [dO]

    if p.projected:
        X = fwd["X"]
        C = fwd.get("context", X)
        dX = np.zeros_like(X)
        dC = np.zeros_like(C)                                   # the keys' and values' path
    for pre, dO_h in zip(prefixes, blocks):
        if p.multi_head:
            out[pre + "dO"] = dO_h                              # (n_q, d_v): this head's columns
        Q, K, V, A = (fwd[pre + name] for name in ("Q", "K", "V", "A"))
        dV = out[pre + "dV"] = A.T @ dO_h                       # (n_k, n_q) @ (n_q, d_v)
        dA = out[pre + "dA"] = dO_h @ V.T                       # (n_q, d_v) @ (d_v, n_k)
        # Softmax backward, row by row: a ∘ (da − da·a); A is exactly 0 where masked.
        dZ = out[pre + "dS_masked"] = A * (dA - (dA * A).sum(axis=1, keepdims=True))
        dS = out[pre + "dS"] = _factor(p, Q.shape[1]) * dZ      # Ŝ = scale·S + M
        dQ = out[pre + "dQ"] = dS @ K                           # (n_q, n_k) @ (n_k, d_k)
        dK = out[pre + "dK"] = dS.T @ Q                         # (n_k, n_q) @ (n_q, d_k)
        if p.projected:
            W_Q, W_K, W_V = (fwd[pre + name] for name in ("W_Q", "W_K", "W_V"))
            out[pre + "dW_Q"] = X.T @ dQ                        # (d_model, n_q) @ (n_q, d_k)
            out[pre + "dW_K"] = C.T @ dK                        # (d_model, n_k) @ (n_k, d_k)
            out[pre + "dW_V"] = C.T @ dV                        # (d_model, n_k) @ (n_k, d_v)
            dX += dQ @ W_Q.T                                    # (n_q, d_k) @ (d_k, d_model)
            dC += dK @ W_K.T + dV @ W_V.T                       # (n_k, d_k) @ (d_k, d_model), ...
    if p.projected:
        if p.context is None:
            out["dX"] = dX + dC                                 # X gives queries, keys and values
        else:
            out["dX"] = dX
            out["dcontext"] = dC
    return out


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
    rest held at its forward value ("from this stage on"): L(O), L(W_O),
    L(concat), L(O_h), L(V), L(A), L(Ŝ), L(S), L(Q), L(K), L(W_·), L(X),
    L(context). Masked entries of Ŝ and S (−∞ in M) are not perturbed: their value is 0.

    The step is relative to each entry (see :func:`_central`). Central
    differences are O(h²) accurate, but each difference of two losses carries
    float64 rounding of about 1e-16·|L|, divided by the step: with the default
    eps = 1e-6 they agree with :func:`numeric_gradients` to about 1e-9 of
    max(1, |gradient|) on the worked examples.
    """
    G = _loss_matrix(p)
    fwd = numeric_stages(p)
    prefixes = _prefixes(p)
    M = fwd[prefixes[0] + "M"]                                  # the same for every head
    masked = np.isneginf(M)                                     # from the mask or a −∞ bias
    out: dict[str, np.ndarray] = {}

    def loss(O: np.ndarray) -> float:                           # L(O), O the final output
        return _loss(p.backward.kind, G, O)

    def attend(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
        return _softmax(Q @ K.T * _factor(p, Q.shape[1]) + M) @ V

    out["dO"] = _central(loss, fwd["O"], eps)
    if p.multi_head:
        W_O, concat = fwd["W_O"], fwd["concat"]
        out["dW_O"] = _central(lambda W: loss(concat @ W), W_O, eps)
        out["dconcat"] = _central(lambda c: loss(c @ W_O), concat, eps)
        ends = np.cumsum([fwd[pre + "V"].shape[1] for pre in prefixes])

    def head(h: int, pre: str) -> None:
        Q, K, V = fwd[pre + "Q"], fwd[pre + "K"], fwd[pre + "V"]
        factor = _factor(p, Q.shape[1])

        def L_O(O_h):                                           # this head's output in concat
            if not p.multi_head:
                return loss(O_h)
            c = concat.copy()
            c[:, ends[h] - O_h.shape[1]:ends[h]] = O_h
            return loss(c @ W_O)

        def L_A(A):
            return L_O(A @ V)

        def L_Shat(Z):
            return L_A(_softmax(Z))

        def L_S(S):
            return L_Shat(S * factor + M)

        if p.multi_head:
            out[pre + "dO"] = _central(L_O, fwd[pre + "O"], eps)
        out[pre + "dV"] = _central(lambda V_: L_O(attend(Q, K, V_)), V, eps)
        out[pre + "dA"] = _central(L_A, fwd[pre + "A"], eps)
        out[pre + "dS_masked"] = _central(L_Shat, fwd[pre + "S_masked"], eps, skip=masked)
        out[pre + "dS"] = _central(L_S, fwd[pre + "S"], eps, skip=masked)
        out[pre + "dQ"] = _central(lambda Q_: L_O(attend(Q_, K, V)), Q, eps)
        out[pre + "dK"] = _central(lambda K_: L_O(attend(Q, K_, V)), K, eps)
        if p.projected:
            X, C = fwd["X"], fwd.get("context", fwd["X"])
            out[pre + "dW_Q"] = _central(lambda W: L_O(attend(X @ W, K, V)), fwd[pre + "W_Q"], eps)
            out[pre + "dW_K"] = _central(lambda W: L_O(attend(Q, C @ W, V)), fwd[pre + "W_K"], eps)
            out[pre + "dW_V"] = _central(lambda W: L_O(attend(Q, K, C @ W)), fwd[pre + "W_V"], eps)

    for h, pre in enumerate(prefixes):
        head(h, pre)

    if p.projected:
        def L_inputs(X: np.ndarray, C: np.ndarray) -> float:    # the whole forward pass
            outputs = [
                attend(X @ fwd[pre + "W_Q"], C @ fwd[pre + "W_K"], C @ fwd[pre + "W_V"]) for pre in prefixes
            ]
            if p.multi_head:
                return loss(np.concatenate(outputs, axis=1) @ fwd["W_O"])
            return loss(outputs[0])

        X = fwd["X"]
        if p.context is None:                                   # X gives queries, keys and values
            out["dX"] = _central(lambda X_: L_inputs(X_, X_), X, eps)
        else:
            C = fwd["context"]
            out["dX"] = _central(lambda X_: L_inputs(X_, C), X, eps)
            out["dcontext"] = _central(lambda C_: L_inputs(X, C_), C, eps)
    return out


# -- PyTorch autograd --------------------------------------------------------------


def torch_gradients(p: Problem) -> dict[str, np.ndarray]:
    """Every gradient stage from PyTorch autograd in float64, by stage id.

    The forward pass goes through ``torch.nn.functional.scaled_dot_product_attention``
    with the mask (and bias) as a float ``attn_mask`` (0 allowed, −∞ masked);
    the loss's ``backward()`` gives the leaves' ``.grad`` (Q, K, V, or X,
    context, each head's weights and W_O) and, by ``retain_grad()``, the
    intermediates' (O, concat, each head's O, Q, K, V).

    SDPA fuses the scores and the weights away, so ``dA``, ``dS_masked`` and
    ``dS`` are not reachable through it: they come from a second, manual graph
    of the same forward pass (Q Kᵀ, ·scale + M, softmax, · V), each
    intermediate with ``retain_grad()``. Its other gradients are the same as
    the SDPA graph's (the tests compare the two).
    """
    fused = _torch_backward(p, fused=True)
    manual = _torch_backward(p, fused=False)
    return {stage: fused[stage] if stage in fused else manual[stage] for stage in _stage_ids(p)}


def _torch_backward(p: Problem, fused: bool) -> dict[str, np.ndarray]:
    """The gradients one torch graph reaches: through SDPA (``fused``) or written out."""
    from .torch_check import _torch  # PyTorch is optional: imported only when asked for

    torch = _torch()
    F = torch.nn.functional
    subs = p.substitutions or None
    kept = {}                                                   # stage id -> the tensor whose .grad it is

    def leaf(stage: str, m):
        t = kept[stage] = torch.from_numpy(_f64(m, subs)).requires_grad_()
        return t

    def keep(stage: str, t):
        t.retain_grad()
        kept[stage] = t
        return t

    allowed = torch.tensor(p.mask.allowed, dtype=torch.bool)
    M = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    if p.bias is not None:
        M = M + torch.from_numpy(_f64(p.bias, subs))

    def head(pre: str, Q, K, V):
        """One head's output: (n_q, d_k), (n_k, d_k), (n_k, d_v) -> (n_q, d_v)."""
        factor = _factor(p, Q.shape[1])
        if fused:                                               # a batch of one
            return F.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=M, scale=factor)[0]
        S = keep(pre + "dS", Q @ K.T)
        Z = keep(pre + "dS_masked", S * factor + M)
        A = keep(pre + "dA", torch.softmax(Z, dim=1))
        return A @ V

    if not p.projected:
        O = keep("dO", head("", leaf("dQ", p.Q), leaf("dK", p.K), leaf("dV", p.V)))
    else:
        X = leaf("dX", p.X)
        C = X if p.context is None else leaf("dcontext", p.context)
        outputs = []
        for pre, weights in zip(_prefixes(p), p.heads):
            Q = keep(pre + "dQ", X @ leaf(pre + "dW_Q", weights.W_Q))
            K = keep(pre + "dK", C @ leaf(pre + "dW_K", weights.W_K))
            V = keep(pre + "dV", C @ leaf(pre + "dW_V", weights.W_V))
            outputs.append(keep(pre + "dO", head(pre, Q, K, V)))
        if p.multi_head:
            concat = keep("dconcat", torch.cat(outputs, dim=1))
            O = keep("dO", concat @ leaf("dW_O", p.W_O))
        else:
            O = outputs[0]
    G = _loss_matrix(p)
    _loss(p.backward.kind, None if G is None else torch.from_numpy(G), O).backward()
    return {stage: t.grad.numpy() for stage, t in kept.items()}
