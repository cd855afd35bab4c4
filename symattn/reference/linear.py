"""Linear attention in float64 with NumPy, from the formulas of Katharopoulos et al. (2020),
"Transformers are RNNs": the parallel form V'_i = φ(Q_i)ᵀ Σ_j φ(K_j) V_jᵀ / φ(Q_i)ᵀ Σ_j φ(K_j), the
sums over the keys the mask allows, and the recurrent form S_t = S_{t−1} + φ(k_t)v_tᵀ,
z_t = z_{t−1} + φ(k_t), one loop step per token. Like :mod:`.numeric`, it never imports the exact
code path."""

from __future__ import annotations

import numpy as np

from .. import stages as st

FEATURES = {
    "relu": lambda x: np.maximum(x, 0.0),
    "elu1": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))) + 1.0,  # elu(x) + 1
    "identity": lambda x: x,
}


def linear_head(p, out: dict, prefix, Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """One head's linear-attention stages, both forms, from its Q, K and V; returns its output O."""
    phi = FEATURES[p.linear.feature]
    allowed = np.array(p.mask.allowed, dtype=bool)             # (n_q, n_k): query i reads key j
    fq = out[prefix(st.PHI_Q)] = phi(Q)                        # no 1/√d_k: the unscaled q and k
    fk = out[prefix(st.PHI_K)] = phi(K)
    table = out[prefix(st.S_LIN)] = np.where(allowed, fq @ fk.T, 0.0)
    z = out[prefix(st.Z_LIN)] = table.sum(axis=1, keepdims=True)
    A = out[prefix(st.A_LIN)] = table / z
    O = out[prefix(st.O)] = A @ V
    n, d_k, d_v = Q.shape[0], Q.shape[1], V.shape[1]
    S, zt = np.zeros((d_k, d_v)), np.zeros(d_k)
    states, sums, num, den = [], [], np.zeros((n, d_v)), np.zeros((n, 1))
    for t in range(n):                                         # one step per token
        if _causal(p):                                         # the state takes key t when row t may read it
            if allowed[t, t]:
                S, zt = S + np.outer(fk[t], V[t]), zt + fk[t]
        else:                                                  # no causal mask: the state of every allowed key
            S = sum((np.outer(fk[j], V[j]) for j in range(K.shape[0]) if allowed[t, j]), np.zeros((d_k, d_v)))
            zt = sum((fk[j] for j in range(K.shape[0]) if allowed[t, j]), np.zeros(d_k))
        states.append(S.reshape(-1))
        sums.append(zt)
        num[t], den[t, 0] = fq[t] @ S, fq[t] @ zt
    out[prefix(st.Z_STATE)] = np.array(sums)
    out[prefix(st.S_STATE)] = np.array(states)
    out[prefix(st.REC_NUM)], out[prefix(st.REC_DEN)] = num, den
    o_rec = out[prefix(st.O_REC)] = num / den
    out[prefix(st.O_REC_DIFF)] = o_rec - O
    return O


def _causal(p) -> bool:
    return "causal" in p.mask.kinds


def state_cost(p, sizes: list[tuple[int, int]]) -> np.ndarray:
    """Per step t: every head's d_k·d_v + d_k state numbers against the KV cache's t·(d_k + d_v)."""
    t = np.arange(1, p.n_q + 1)
    state = sum(d_k * d_v + d_k for d_k, d_v in sizes)
    return np.stack([np.full(len(t), state), t * sum(d_k + d_v for d_k, d_v in sizes)], axis=1).astype(float)
