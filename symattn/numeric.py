"""An independent float64 evaluation of attention with NumPy.

This module never imports the exact code path: it starts again from the
problem's input matrices, written the way a practitioner would in NumPy,
with the max-subtraction softmax so large scores do not overflow. The
cross-check compares its stages with the exact ones, stage by stage.
"""

from __future__ import annotations

import functools

import numpy as np
import sympy

from . import stages as st
from ._numbers import matrix_float64
from .problem import Problem


def _f64(m, subs=None) -> np.ndarray:
    """An exact SymPy matrix as float64 (the only place exact meets binary floats); −∞ stays −∞."""
    values = matrix_float64(m)  # rationals: each entry correctly rounded (once for a QQMatrix)
    if values is not None:
        return values.copy()  # the caller's own (a shared one is read-only)
    if subs:
        m = m.xreplace(subs)
    return np.array(
        [[-np.inf if x == sympy.S.NegativeInfinity else float(x) for x in row] for row in m.tolist()],
        dtype=np.float64,
    )


def numeric_stages(p: Problem) -> dict[str, np.ndarray]:
    """Every stage of ``softmax(Q Kᵀ·scale + M) V`` in float64, by stage id.

    Symbols take the problem's ``values``; the caller checks they are all given.
    """
    subs = p.substitutions or None
    out: dict[str, np.ndarray] = {}
    allowed = np.array(p.mask.allowed, dtype=bool)
    M = np.where(allowed, 0.0, -np.inf)
    if p.bias is not None:
        M = M + _f64(p.bias, subs)

    def head(prefix, Q: np.ndarray, K: np.ndarray, V: np.ndarray, kv_prefix=None) -> np.ndarray:
        d_k = Q.shape[1]
        if p.scale == "auto":
            factor = 1.0 / np.sqrt(d_k)
        elif p.scale == "none":
            factor = 1.0
        else:
            factor = float(p.scale)
        out[(kv_prefix or prefix)(st.K_T)] = K.T
        S = out[prefix(st.S)] = Q @ K.T                         # (n_q, d_k) @ (d_k, n_k)
        S_scaled = out[prefix(st.S_SCALED)] = S * factor
        out[prefix(st.M)] = M
        Z = out[prefix(st.S_MASKED)] = S_scaled + M
        m = Z.max(axis=1, keepdims=True)                        # finite: no row is fully masked
        E = np.exp(Z - m)                                       # exp(-inf) = 0 for masked positions
        A = out[prefix(st.A)] = E / E.sum(axis=1, keepdims=True)
        O = out[prefix(st.O)] = A @ V                           # (n_q, n_k) @ (n_k, d_v)
        if p.decode is not None:
            decode(prefix, kv_prefix or prefix, Q, K, V, factor, O)
        return O

    def decode(prefix, kv_prefix, Q, K, V, factor, O) -> None:
        """Token t's row from the cache of keys and values 1..t (t counted from 1)."""
        t = p.decode
        K_cache = out[kv_prefix(st.K_CACHE)] = K[:t]            # (t, d_k)
        V_cache = out[kv_prefix(st.V_CACHE)] = V[:t]            # (t, d_v)
        q = out[prefix(st.Q_T)] = Q[t - 1:t]                    # (1, d_k)
        s = out[prefix(st.S_T)] = (q @ K_cache.T) * factor      # (1, t): no mask, the cache holds keys 1..t
        e = np.exp(s - s.max())
        a = out[prefix(st.A_T)] = e / e.sum()
        o = out[prefix(st.O_T)] = a @ V_cache                   # (1, d_v)
        out[prefix(st.O_T_DIFF)] = o - O[t - 1:t]
        d_k, d_v = Q.shape[1], V.shape[1]
        steps = np.arange(1, p.n_q + 1)
        out[st.DECODE_COST] = np.stack([steps * d_k, steps * d_v, steps**2 * d_k, steps**2 * d_v], axis=1).astype(float)

    if not p.projected:
        Q = out[st.Q] = _f64(p.Q, subs)
        K = out[st.K] = _f64(p.K, subs)
        V = out[st.V] = _f64(p.V, subs)
        head(st.stage_id, Q, K, V)
        return out
    X = out[st.X] = _f64(p.X, subs)
    C = X
    if p.context is not None:
        C = out[st.CONTEXT] = _f64(p.context, subs)
    outputs = []
    n_heads = len(p.heads)
    per_group = n_heads // (p.kv_heads or n_heads)  # query heads sharing one K/V head (1: no sharing)
    for h, weights in enumerate(p.heads, 1):
        prefix = functools.partial(st.stage_id, head=h if p.multi_head else None)  # this head's ids
        W_Q = out[prefix(st.W_Q)] = _f64(weights.W_Q, subs)
        Q = out[prefix(st.Q)] = X @ W_Q                         # (n_q, d_model) @ (d_model, d_k)
        first = (h - 1) // per_group * per_group + 1            # query head q (0-based) reads K/V head q // per_group
        if h == first:  # the group's K and V, under its first head's ids
            kv_prefix = prefix
            W_K = out[prefix(st.W_K)] = _f64(weights.W_K, subs)
            W_V = out[prefix(st.W_V)] = _f64(weights.W_V, subs)
            K = C @ W_K                                         # (n_k, d_model) @ (d_model, d_k)
            V = C @ W_V                                         # (n_k, d_model) @ (d_model, d_v)
            out[prefix(st.K)], out[prefix(st.V)] = K, V
        outputs.append(head(prefix, Q, K, V, kv_prefix))
    if p.multi_head:
        concat = out[st.CONCAT] = np.concatenate(outputs, axis=1)  # (n_q, h·d_v)
        W_O = out[st.W_O] = _f64(p.W_O, subs)
        out[st.O] = concat @ W_O                                 # (n_q, h·d_v) @ (h·d_v, d_out)
    return out
