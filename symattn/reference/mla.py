"""Multi-head latent attention in float64 with NumPy, from the DeepSeek-V2 paper's formulas (section
2.1): c_KV = X·W_DKV, k_R = RoPE(X·W_KR) shared by the heads, each head's key [c_KV·W_UK^(h) ; k_R],
value c_KV·W_UV^(h) and query [q_C ; RoPE(q_R)]; the absorbed scores (q_C·W_UK^(h)ᵀ)·c_KVᵀ +
q_R·k_Rᵀ; and the cache per token. Like :mod:`.numeric`, it never imports the exact code path (the
rotation is its own, written here)."""

from __future__ import annotations

import functools

import numpy as np

from .. import stages as st


def rotate_f64(x: np.ndarray, thetas: np.ndarray, pairing: str) -> np.ndarray:
    """Row p of ``x`` with each pair turned by p·θ_i (half: i with i + d/2; interleaved: 2i with 2i + 1)."""
    n, d = x.shape
    phi = np.arange(n, dtype=np.float64)[:, None] * thetas[None, :]
    a = np.arange(d // 2) if pairing == "half" else np.arange(0, d, 2)
    b = a + d // 2 if pairing == "half" else a + 1
    out = x.copy()
    out[:, a] = x[:, a] * np.cos(phi) - x[:, b] * np.sin(phi)
    out[:, b] = x[:, a] * np.sin(phi) + x[:, b] * np.cos(phi)
    return out


def thetas_f64(rope, d: int) -> np.ndarray:
    if rope.angles is not None:
        return np.array([float(t) for t in rope.angles])
    return float(rope.base) ** (-2.0 * np.arange(d // 2) / d)


def rms_f64(x: np.ndarray, norm, f) -> tuple[np.ndarray, np.ndarray]:
    """RMSNorm of each row: its mean square, and x / √(ms + ε) times γ when given."""
    ms = (x * x).mean(axis=1, keepdims=True)
    y = x / np.sqrt(ms + float(norm.eps))
    return ms, (y * f(norm.weight) if norm.weight is not None else y)


def mla_heads(p, out: dict, X: np.ndarray, f):
    """The latent stages, then per head (h, its stage-id maker, Q, K, V) for the usual head's stages;
    ``f`` turns an exact matrix into float64."""
    m = p.mla
    W_DKV = out[st.W_DKV] = f(m.W_DKV)
    W_KR = out[st.W_KR] = f(m.W_KR)
    W_UK, W_UV, W_QR = (out[st.W_UK], out[st.W_UV], out[st.W_QR]) = (f(m.W_UK), f(m.W_UV), f(m.W_QR))
    c_kv = out[st.C_KV] = X @ W_DKV                           # (n, d_c): the cached latent
    if m.norm_kv is not None:                                 # DeepSeek's kv_a_layernorm
        out[st.KV_NORM_MS], c_kv = rms_f64(c_kv, m.norm_kv, f)
        out[st.C_KV_NORM] = c_kv
    k_r = out[st.K_R] = X @ W_KR                              # (n, d_R)
    thetas = thetas_f64(m.rope, m.d_R)
    k_rot = out[st.K_R_ROT] = rotate_f64(k_r, thetas, m.rope.pairing)
    if m.W_DQ is not None:
        W_DQ = out[st.W_DQ] = f(m.W_DQ)
        W_UQ = out[st.W_UQ] = f(m.W_UQ)
        source = out[st.C_Q] = X @ W_DQ
        if m.norm_q is not None:                              # q_a_layernorm
            out[st.CQ_NORM_MS], source = rms_f64(source, m.norm_q, f)
            out[st.C_Q_NORM] = source
    else:
        W_UQ = out[st.W_Q] = f(m.W_Q)
        source = X
    d_h, d_R, d_v = m.d_h, m.d_R, m.d_v
    for h in range(1, m.heads + 1):
        prefix = functools.partial(st.stage_id, head=h)
        cols = lambda w, width: w[:, (h - 1) * width:h * width]  # noqa: E731  head h's block
        q_c = out[prefix(st.Q_C)] = source @ cols(W_UQ, d_h)
        q_r = out[prefix(st.Q_R)] = source @ cols(W_QR, d_R)
        q_rot = out[prefix(st.Q_R_ROT)] = rotate_f64(q_r, thetas, m.rope.pairing)
        k_c = out[prefix(st.K_C)] = c_kv @ cols(W_UK, d_h)
        Q = out[prefix(st.Q)] = np.hstack([q_c, q_rot])
        K = out[prefix(st.K)] = np.hstack([k_c, k_rot])
        V = out[prefix(st.V)] = c_kv @ cols(W_UV, d_v)
        yield h, prefix, Q, K, V


def mla_absorbed(p, out: dict, prefix, h: int) -> None:
    """Head h's absorbed query and scores, and their difference from S."""
    m = p.mla
    W_UK_h = out[st.W_UK][:, (h - 1) * m.d_h:h * m.d_h]
    q_abs = out[prefix(st.Q_ABS)] = out[prefix(st.Q_C)] @ W_UK_h.T          # (n, d_c)
    latent = out.get(st.C_KV_NORM, out[st.C_KV])                            # the latent the keys read
    s_abs = out[prefix(st.S_ABS)] = q_abs @ latent.T + out[prefix(st.Q_R_ROT)] @ out[st.K_R_ROT].T
    out[prefix(st.S_ABS_DIFF)] = s_abs - out[prefix(st.S)]


def mla_cache(p) -> np.ndarray:
    """Numbers cached per token (and for n tokens): MLA, MHA, then GQA from h − 1 groups down to 1."""
    m = p.mla
    width = m.d_h + m.d_R + m.d_v
    sizes = [m.d_c + m.d_R, m.heads * width] + [g * width for g in range(m.heads - 1, 0, -1) if m.heads % g == 0]
    return np.array([[s, s * p.n_q] for s in sizes], dtype=np.float64)
