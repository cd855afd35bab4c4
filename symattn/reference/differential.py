"""Differential attention in float64, from the formula of Ye et al. (2024), "Differential Transformer":
(softmax(Q₁K₁ᵀ/√d + M) − λ·softmax(Q₂K₂ᵀ/√d + M))·V, and the paper's per-head norm (RMSNorm of each
output row, no learned weight) times (1 − λ_init). :func:`numeric_head` in NumPy, like :mod:`.numeric`
(it never imports the exact code path); :func:`torch_head` with PyTorch's scaled_dot_product_attention,
once for each of the two maps, and F.rms_norm."""

from __future__ import annotations

import numpy as np

from .. import stages as st


def _paper_np(O: np.ndarray, paper, out: dict, prefix) -> np.ndarray:
    ms = out[prefix(st.O_MS)] = (O * O).mean(axis=1, keepdims=True)
    sub = out[prefix(st.O_SUBLN)] = O / np.sqrt(ms + float(paper.eps)) * (1.0 - float(paper.lambda_init))
    return sub


def numeric_head(p, out: dict, prefix, first_map, X: np.ndarray, V: np.ndarray, maps, M: np.ndarray,
                 factor: float, rotate) -> np.ndarray:
    """One head's second map, the differential map, its row sums and O (its O_subln with the paper's
    norm, which is returned as what the layer reads). ``first_map`` is the head's A (computed by the
    usual stages); ``maps`` its (W_Q2, W_K2) in float64; ``rotate`` RoPE (None: none)."""
    W_Q2, W_K2 = out[prefix(st.W_Q2)], out[prefix(st.W_K2)] = maps
    Q2 = out[prefix(st.Q_2)] = X @ W_Q2
    K2 = out[prefix(st.K_2)] = X @ W_K2
    if rotate is not None:
        Q2 = out[prefix(st.Q_2ROT)] = rotate(Q2)
        K2 = out[prefix(st.K_2ROT)] = rotate(K2)
    S2 = out[prefix(st.S_2)] = Q2 @ K2.T
    Z = out[prefix(st.S_2MASKED)] = S2 * factor + M
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A2 = out[prefix(st.A_2)] = E / E.sum(axis=1, keepdims=True)
    lam = float(p.differential.lam)
    A_diff = out[prefix(st.A_DIFF)] = first_map - lam * A2
    out[prefix(st.A_DIFF_SUMS)] = A_diff.sum(axis=1, keepdims=True)
    O = out[prefix(st.O)] = A_diff @ V
    return O if p.differential.paper is None else _paper_np(O, p.differential.paper, out, prefix)


def torch_head(torch, F, p, out: dict, prefix, X, Q, K, V, maps, attn_mask, scale: float, rope):
    """One head's differential attention with SDPA: each map's weights (SDPA of the identity) and
    output, then O = O₁ − λ·O₂ (and the paper's norm with F.rms_norm). Returns what the layer reads."""
    W_Q2, W_K2 = maps
    Q2, K2 = X @ W_Q2, X @ W_K2
    if rope is not None:
        Q, K, Q2, K2 = (rope(x) for x in (Q, K, Q2, K2))
    eye = torch.eye(K.shape[0], dtype=torch.float64)
    sdpa = F.scaled_dot_product_attention
    A1 = sdpa(Q[None], K[None], eye[None], attn_mask=attn_mask, scale=scale)[0]
    A2 = sdpa(Q2[None], K2[None], eye[None], attn_mask=attn_mask, scale=scale)[0]
    O1 = sdpa(Q[None], K[None], V[None], attn_mask=attn_mask, scale=scale)[0]
    O2 = sdpa(Q2[None], K2[None], V[None], attn_mask=attn_mask, scale=scale)[0]
    lam = float(p.differential.lam)
    O = O1 - lam * O2
    out[prefix(st.A)], out[prefix(st.A_2)] = A1.numpy(), A2.numpy()
    out[prefix(st.A_DIFF)], out[prefix(st.O)] = (A1 - lam * A2).numpy(), O.numpy()
    paper = p.differential.paper
    if paper is None:
        return O
    sub = F.rms_norm(O, (O.shape[-1],), eps=float(paper.eps)) * (1.0 - float(paper.lambda_init))
    out[prefix(st.O_SUBLN)] = sub.numpy()
    return sub
