"""An independent float64 evaluation of attention with NumPy.

This module never imports the exact code path: it starts again from the
problem's input matrices, written the way a practitioner would in NumPy,
with the max-subtraction softmax so large scores do not overflow. The
cross-check compares its stages with the exact ones, stage by stage.
"""

from __future__ import annotations

import numpy as np

from .problem import Problem


def _f64(m) -> np.ndarray:
    """An exact SymPy matrix as float64 (the only place exact meets binary floats)."""
    return np.array([[float(x) for x in row] for row in m.tolist()], dtype=np.float64)


def numeric_stages(p: Problem) -> dict[str, np.ndarray]:
    """Every stage of ``softmax(Q Kᵀ·scale + M) V`` in float64, by stage id."""
    out: dict[str, np.ndarray] = {}
    if p.projected:
        X = out["X"] = _f64(p.X)
        C = X
        if p.context is not None:
            C = out["context"] = _f64(p.context)
        W_Q = out["W_Q"] = _f64(p.W_Q)
        W_K = out["W_K"] = _f64(p.W_K)
        W_V = out["W_V"] = _f64(p.W_V)
        Q = out["Q"] = X @ W_Q                                  # (n_q, d_model) @ (d_model, d_k)
        K = out["K"] = C @ W_K                                  # (n_k, d_model) @ (d_model, d_k)
        V = out["V"] = C @ W_V                                  # (n_k, d_model) @ (d_model, d_v)
    else:
        Q = out["Q"] = _f64(p.Q)
        K = out["K"] = _f64(p.K)
        V = out["V"] = _f64(p.V)
    d_k = Q.shape[1]
    out["K_T"] = K.T
    S = out["S"] = Q @ K.T                                      # (n_q, d_k) @ (d_k, n_k)
    if p.scale == "auto":
        factor = 1.0 / np.sqrt(d_k)
    elif p.scale == "none":
        factor = 1.0
    else:
        factor = float(p.scale)
    S_scaled = out["S_scaled"] = S * factor
    allowed = np.array(p.mask.allowed, dtype=bool)
    M = np.where(allowed, 0.0, -np.inf)
    if p.bias is not None:
        M = M + _f64_with_inf(p.bias)
    out["M"] = M
    Z = out["S_masked"] = S_scaled + M
    m = Z.max(axis=1, keepdims=True)                            # row maxima, finite: no row is fully masked
    E = np.exp(Z - m)                                           # exp(-inf) = 0 for masked positions
    A = out["A"] = E / E.sum(axis=1, keepdims=True)
    out["O"] = A @ V                                            # (n_q, n_k) @ (n_k, d_v)
    return out


def _f64_with_inf(m) -> np.ndarray:
    return np.array(
        [[-np.inf if x.is_infinite else float(x) for x in row] for row in m.tolist()], dtype=np.float64
    )
