"""An independent float64 evaluation of attention with NumPy.

This module never imports the exact code path: it starts again from the
problem's input matrices, written the way a practitioner would in NumPy,
with the max-subtraction softmax so large scores do not overflow. The
cross-check compares its stages with the exact ones, stage by stage.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import sympy

from .. import stages as st
from ..numbers.parse import matrix_float64
from ..problem.model import Problem


def to_float64(m, subs=None) -> np.ndarray:
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


def weights_float64(m) -> np.ndarray:
    """A weight matrix the reference only multiplies by, as float64: a rational one's own rounded
    entries, shared (read-only, not copied: an embedding table is hundreds of megabytes)."""
    values = matrix_float64(m)
    return to_float64(m) if values is None else values


def _bias(out: dict, stage: str, row, subs) -> np.ndarray:
    """A projection's bias (1 × d) in float64, kept under its stage id; NumPy broadcasts it over the rows."""
    b = out[stage] = to_float64(row, subs)
    return b


def rope_thetas(rope, d: int) -> np.ndarray:
    """RoPE's angles θ_i in float64: the given ones, or base^(−2i/d)."""
    if rope.angles is not None:
        return np.array([float(a) for a in rope.angles])
    return float(rope.base) ** (-np.arange(0, d, 2, dtype=np.float64) / d)


@functools.lru_cache(maxsize=64)
def _rope_table(rope, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of p·θ_i, (n, d/2) each, made once per shape (finite differences rotate often)."""
    phi = np.arange(n, dtype=np.float64)[:, None] * rope_thetas(rope, d)[None, :]
    cos, sin = np.cos(phi), np.sin(phi)
    cos.flags.writeable = sin.flags.writeable = False
    return cos, sin


def rope_matrices(rope, n: int, d: int) -> np.ndarray:
    """Each position's rotation as a d × d matrix, (n, d, d): R_p with x_rot_p = R_p·x_p, block by block
    (pair (a, b) the 2 × 2 block [[cos, −sin], [sin, cos]] of the angle p·θ_i), for the backward pass."""
    R = np.tile(np.eye(d), (n, 1, 1))
    phi = np.arange(n, dtype=np.float64)[:, None] * rope_thetas(rope, d)[None, :]
    for i, (a, b) in enumerate(rope.pairs(d)):
        cos, sin = np.cos(phi[:, i]), np.sin(phi[:, i])
        R[:, a, a], R[:, a, b], R[:, b, a], R[:, b, b] = cos, -sin, sin, cos
    return R


def rope_rotate(x: np.ndarray, rope) -> np.ndarray:
    """Rotary embeddings in float64, as the libraries write them: row p (position p, from 0) with
    each pair of components turned by p·θ_i; half pairs i with i + d/2 (rotate_half), interleaved
    2i with 2i + 1."""
    n, d = x.shape
    cos, sin = _rope_table(rope, n, d)
    if rope.pairing == "half":
        a, b = x[:, : d // 2], x[:, d // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=1)
    a, b = x[:, 0::2], x[:, 1::2]
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = a * cos - b * sin, a * sin + b * cos
    return out


def _online_softmax(Z: np.ndarray, V: np.ndarray, block: int):
    """FlashAttention's one pass over the keys in blocks, as its kernels run it: per query a running
    maximum m, a running sum l and an accumulator acc (rescaled by exp(m_old − m_new) whenever the
    maximum grows). Returns m and l after each block, and acc after the last."""
    n_q, n_k = Z.shape
    starts = range(0, n_k, block)
    m_all = np.full((n_q, len(starts)), -np.inf)
    l_all = np.zeros((n_q, len(starts)))
    m = np.full(n_q, -np.inf)
    l = np.zeros(n_q)
    acc = np.zeros((n_q, V.shape[1]))
    for b, start in enumerate(starts):
        Zb, Vb = Z[:, start:start + block], V[start:start + block]
        m_new = np.maximum(m, Zb.max(axis=1))
        seen = np.isfinite(m_new)                                # rows with an allowed key so far
        safe = np.where(seen, m_new, 0.0)
        alpha = np.where(np.isfinite(m), np.exp(m - safe), 0.0)  # exp(-inf - m) = 0 at the start
        P = np.where(seen[:, None], np.exp(Zb - safe[:, None]), 0.0)  # exp(-inf) = 0: masked keys
        l = alpha * l + P.sum(axis=1)
        acc = alpha[:, None] * acc + P @ Vb
        m = m_new
        m_all[:, b], l_all[:, b] = m, l
    return m_all, l_all, acc


def sinusoidal_positions(n: int, d: int, base: float) -> np.ndarray:
    """The sinusoidal encodings of positions 0..n−1 in float64, as the original transformer's
    papers and tutorials write them: sin in the even columns, cos in the odd ones."""
    position = np.arange(n, dtype=np.float64)[:, None]             # p = 0, 1, ..., n − 1
    two_i = np.arange(0, d, 2, dtype=np.float64)                   # 2i = 0, 2, 4, ...
    angle = position / np.power(base, two_i / d)                  # (n, ⌈d/2⌉)
    pe = np.zeros((n, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


def positions_f64(p: Problem) -> "np.ndarray | None":
    """The problem's positional encodings PE in float64 (None without positions)."""
    if p.positions is None:
        return None
    if p.positions.kind == "sinusoidal":
        return sinusoidal_positions(p.X.rows, p.X.cols, float(p.positions.base))
    return to_float64(p.positions.matrix)


def scale_factor(p: Problem, d_k: int) -> float:
    """The factor the scores are multiplied by in a head with this d_k."""
    if p.scale == "auto":
        return 1.0 / np.sqrt(d_k)
    if p.scale == "none":
        return 1.0
    return float(p.scale)


def _mask_f64(p: Problem, subs) -> np.ndarray:
    """M in float64: 0 where allowed, −∞ where masked, plus the bias if the problem has one."""
    allowed = np.array(p.mask.allowed, dtype=bool)
    M = np.where(allowed, 0.0, -np.inf)
    if p.bias is not None:
        M = M + to_float64(p.bias, subs)
    return M


def _sink(p: Problem, head: int) -> "float | None":
    """Query head ``head``'s (1-based) learned sink logit in float64, or None."""
    return None if p.sinks is None else float(p.sinks[head - 1])


def _softmax_rows(Z: np.ndarray, sink: "float | None") -> tuple[np.ndarray, "np.ndarray | None"]:
    """Each row's softmax, the maximum subtracted first; with a learned sink s (gpt-oss) the
    denominator has one more term exp(s − m) and m is the maximum over the row and s. Returns the
    weights and, with a sink, each row's share of it (n × 1)."""
    m = Z.max(axis=1, keepdims=True)                        # finite: no row is fully masked
    if sink is not None:
        m = np.maximum(m, sink)
    E = Z - m
    np.exp(E, out=E)                                        # exp(-inf) = 0 for masked positions
    total = E.sum(axis=1, keepdims=True)
    if sink is None:
        return np.divide(E, total, out=E), None             # in place: one n² array
    absorbed = np.exp(sink - m)
    total = total + absorbed
    return E / total, absorbed / total


def _head(p: Problem, out: dict, M: np.ndarray, prefix, Q: np.ndarray, K: np.ndarray, V: np.ndarray,
          kv_prefix=None, sink: "float | None" = None) -> np.ndarray:
    """One head's stages, from its Q, K and V to its output O (returned)."""
    if p.linear is not None:                                # linear attention: no scores, no softmax
        from .linear import linear_head

        return linear_head(p, out, prefix, Q, K, V)
    factor = scale_factor(p, Q.shape[1])
    if p.qk_norm is not None:  # QK-norm: each query and key row normalised over d_k, before RoPE
        Q = _rms_rows(Q, p.qk_norm.q, out, prefix, (st.QN_MS, st.Q_HAT, st.QN_GAMMA, st.Q_NORM))
        K = _rms_rows(K, p.qk_norm.k, out, kv_prefix or prefix, (st.KN_MS, st.K_HAT, st.KN_GAMMA, st.K_NORM))
    if p.rope is not None:  # RoPE: the scores compare the rotated queries and keys
        Q = out[prefix(st.Q_ROT)] = rope_rotate(Q, p.rope)
        K = out[prefix(st.K_ROT)] = rope_rotate(K, p.rope)
    out[(kv_prefix or prefix)(st.K_T)] = K.T
    S = out[prefix(st.S)] = Q @ K.T                         # (n_q, d_k) @ (d_k, n_k)
    S_scaled = out[prefix(st.S_SCALED)] = S * factor
    out[prefix(st.M)] = M
    if p.softcap is not None:                               # Gemma 2: c·tanh(s/c), before the mask
        c = float(p.softcap)
        capped = out[prefix(st.S_CAPPED)] = c * np.tanh(S_scaled / c)
        Z = out[prefix(st.S_MASKED)] = capped + M
    else:
        Z = out[prefix(st.S_MASKED)] = S_scaled + M
    if p.temperature is not None:                           # the masked scores over T (−∞ stays −∞)
        Z = out[prefix(st.S_TEMP)] = Z / float(p.temperature)
    A, absorbed = _softmax_rows(Z, sink)
    out[prefix(st.A)] = A
    if absorbed is not None:
        out[prefix(st.A_SINK)] = absorbed
    _compared_rows(p, out, prefix, S_scaled, M, A)
    O = out[prefix(st.O)] = A @ V                           # (n_q, n_k) @ (n_k, d_v)
    if p.tiling is not None:
        m, l, acc = _online_softmax(Z, V, p.tiling.block)
        out[prefix(st.M_TILED)], out[prefix(st.L_TILED)], out[prefix(st.ACC_TILED)] = m, l, acc
        out[prefix(st.O_TILED)] = acc / l[:, -1:]
    if p.decode is not None:
        _decode(p, out, prefix, kv_prefix or prefix, Q, K, V, factor, O, sink)
    return O


def _rms_rows(x: np.ndarray, norm, out: dict, prefix, ids) -> np.ndarray:
    """RMSNorm of each row of ``x``, x/√(mean(x²) + ε)·γ, its stages kept under this head's ``ids``."""
    ms_id, hat_id, gamma_id, out_id = (prefix(i) for i in ids)
    ms = out[ms_id] = (x * x).mean(axis=1, keepdims=True)
    y = out[hat_id] = x / np.sqrt(ms + float(norm.eps))
    if norm.weight is not None:
        g = out[gamma_id] = to_float64(norm.weight)
        y = y * (norm.offset + g)
    out[out_id] = y
    return y


def _compared_rows(p: Problem, out: dict, prefix, S_scaled: np.ndarray, M: np.ndarray, A: np.ndarray) -> None:
    """The last query's weights without and with soft-capping (and without and with the temperature)."""
    T = 1.0 if p.temperature is None else float(p.temperature)
    if p.softcap is not None:
        out[prefix(st.CAP_ROW)] = np.vstack([_softmax_rows((S_scaled[-1:] + M[-1:]) / T, None)[0], A[-1:]])
    if p.temperature is not None:
        out[prefix(st.TEMP_ROW)] = np.vstack([_softmax_rows(out[prefix(st.S_MASKED)][-1:].copy(), None)[0], A[-1:]])


def _decode(p: Problem, out: dict, prefix, kv_prefix, Q, K, V, factor, O, sink=None) -> None:
    """Token t's row from the cache of keys and values 1..t (t counted from 1)."""
    t = p.decode
    kept = np.arange(t)                                     # the causal cache: keys 1..t
    if p.mask.kind == "sink-window":                        # StreamingLLM: the sink tokens and the last w keys
        kept = kept[(kept < p.mask.sink) | (t - 1 - kept < p.mask.window)]
    K_cache = out[kv_prefix(st.K_CACHE)] = K[kept]          # (r, d_k)
    V_cache = out[kv_prefix(st.V_CACHE)] = V[kept]          # (r, d_v)
    q = out[prefix(st.Q_T)] = Q[t - 1:t]                    # (1, d_k)
    s = out[prefix(st.S_T)] = (q @ K_cache.T) * factor      # (1, r): no mask, the cache holds the allowed keys
    a = out[prefix(st.A_T)] = _softmax_rows(s, sink)[0]
    o = out[prefix(st.O_T)] = a @ V_cache                   # (1, d_v)
    out[prefix(st.O_T_DIFF)] = o - O[t - 1:t]
    d_k, d_v = Q.shape[1], V.shape[1]
    steps = np.arange(1, p.n_q + 1)
    cached = steps if p.mask.kind != "sink-window" else np.minimum(steps, p.mask.sink + p.mask.window)
    out[st.DECODE_COST] = np.stack([cached * d_k, cached * d_v, steps**2 * d_k, steps**2 * d_v], axis=1).astype(float)


# each norm's stage ids: μ, σ², the mean square, the normalised rows, γ, β (the layer's norm has
# the same names in front of the attention and behind it; the embeddings' norm its own)
_NORM_IDS = {
    "pre": (st.MU, st.VAR, st.MS, st.X_HAT, st.GAMMA, st.BETA),
    "post": (st.MU, st.VAR, st.MS, st.R_HAT, st.GAMMA, st.BETA),
    "emb": (st.EMU, st.EVAR, st.EMS, st.X_EMB_HAT, st.EGAMMA, st.EBETA),
    "mlp": (st.MLP_MU, st.MLP_VAR, st.MLP_MS, st.H_HAT, st.MLP_GAMMA, st.MLP_BETA),
    "mlp_post": (st.MLP_MU, st.MLP_VAR, st.MLP_MS, st.Y_HAT, st.MLP_GAMMA, st.MLP_BETA),
    "final": (st.FINAL_MU, st.FINAL_VAR, st.FINAL_MS, st.Y_FINAL_HAT, st.FINAL_GAMMA, st.FINAL_BETA),
}

erf_f64 = np.vectorize(math.erf, otypes=[np.float64])  # erf of each entry of a float64 array
# the MLP's activations in float64, as PyTorch's and the models' code write them
ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "relu2": lambda x: np.maximum(x, 0.0) ** 2,
    "gelu": lambda x: 0.5 * x * (1.0 + erf_f64(x / math.sqrt(2.0))),
    "gelu-tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
}


def block_f64(p: Problem, out: dict, H: np.ndarray) -> None:
    """The MLP on the residual stream ``H`` (its norm first), the block's output Y, and the model's
    head: the final norm, the logits, the softmax over the vocabulary and the cross-entropy."""
    mlp, top = p.mlp, H
    if mlp is not None:
        x = H
        if mlp.norm is not None and not mlp.post:                  # GPT-2's ln_2, LLaMA's post_attention_layernorm
            x = out[st.H_NORM] = layer_norm_f64(H, mlp.norm, out, "mlp")
        act = ACTIVATIONS[mlp.activation]
        if mlp.gated:                                              # SwiGLU / GeGLU: act(x W_gate) * (x W_up)
            W_gate, W_up = out[st.W_GATE], out[st.W_UP] = weights_float64(mlp.W_1), weights_float64(mlp.W_up)
            gate, up = out[st.U_GATE], out[st.U_UP] = x @ W_gate, x @ W_up
            G = out[st.G] = act(gate) * up
            W_2 = out[st.W_DOWN] = weights_float64(mlp.W_2)
        else:
            W_1 = out[st.W_1] = weights_float64(mlp.W_1)
            U = x @ W_1
            if mlp.b_1 is not None:
                U = U + _bias(out, st.B_1, mlp.b_1, None)
            out[st.U] = U
            G = out[st.G] = act(U)
            W_2 = out[st.W_2] = weights_float64(mlp.W_2)
        F = G @ W_2
        if mlp.b_2 is not None:
            F = F + _bias(out, st.B_2, mlp.b_2, None)
        out[st.F] = F
        if mlp.post:                                               # BERT: Y = LN(H + F)
            top = out[st.Y] = layer_norm_f64(out.setdefault(st.Y_SUM, H + F), mlp.norm, out, "mlp_post")
        else:
            top = out[st.Y] = H + F
    if p.logits is not None:
        _head_f64(p, out, top)


def _head_f64(p: Problem, out: dict, top: np.ndarray) -> None:
    """The final norm, the logits, their softmax over the vocabulary and the loss."""
    head = p.logits
    x = top
    if head.last:
        x = out[st.Y_LAST] = top[-1:]
    if head.norm is not None:
        x = out[st.Y_FINAL] = layer_norm_f64(x, head.norm, out, "final")
    W_U = out[st.W_U] = weights_float64(head.W_U)
    z = out[st.LOGITS] = x @ W_U                                   # (rows, d_model) @ (d_model, vocabulary)
    m = z.max(axis=1, keepdims=True)
    e = np.exp(z - m)
    total = e.sum(axis=1, keepdims=True)
    out[st.P] = e / total
    if p.loss is not None:
        rows, targets = np.array(p.loss.rows), np.array(p.loss.targets)
        nll = (m[rows, 0] + np.log(total[rows, 0])) - z[rows, targets]   # log Σ e^z − z_t, the max taken out
        out[st.NLL] = nll[:, None]
        out[st.LOSS] = np.array([[nll.mean()]])


def layer_norm_f64(x: np.ndarray, norm, out: dict, place: str = "pre") -> np.ndarray:
    """LayerNorm or RMSNorm of each row in float64, as PyTorch writes them (biased variance, ε
    inside the root), its stages kept under the ids of its ``place`` (pre, post or emb); returns
    the norm's output."""
    MU, VAR, MS, HAT, GAMMA, BETA = _NORM_IDS[place]
    eps = float(norm.eps)
    if norm.kind == "rmsnorm":
        ms = out[MS] = (x * x).mean(axis=1, keepdims=True)            # mean(x²) of each row
        hat = x / np.sqrt(ms + eps)
    else:
        mu = out[MU] = x.mean(axis=1, keepdims=True)
        var = out[VAR] = ((x - mu) ** 2).mean(axis=1, keepdims=True)  # divided by d (biased)
        hat = (x - mu) / np.sqrt(var + eps)
    out[HAT] = hat
    y = hat
    if norm.weight is not None:
        g = out[GAMMA] = to_float64(norm.weight)
        y = y * (norm.offset + g)
    if norm.bias is not None:
        b = out[BETA] = to_float64(norm.bias)
        y = y + b
    return y


def _layer_inputs(p: Problem, out: dict, subs) -> tuple[np.ndarray, np.ndarray]:
    """The projections' inputs: X (plus PE with positions, then its norm with a pre norm) for the
    queries, and the context (X itself without cross-attention) for the keys and values."""
    X = out[st.X] = to_float64(p.X, subs)
    PE = positions_f64(p)
    if PE is not None:
        out[st.PE] = PE
        if p.token_types is not None:                           # BERT: X + PE + the token types
            out[st.TT] = to_float64(p.token_types)
            PE = PE + out[st.TT]
        X = out[st.X_POS] = X + PE                              # the projections read X + PE
    if p.embeddings_norm is not None:                           # BERT: the embeddings' own LayerNorm
        X = out[st.X_EMB] = layer_norm_f64(X, p.embeddings_norm, out, "emb")
    if p.norm is not None and not p.norm.post:
        X = out[st.X_NORM] = layer_norm_f64(X, p.norm, out)     # the attention reads the norm
    C = X
    if p.context is not None:
        C = out[st.CONTEXT] = to_float64(p.context, subs)
    return X, C


def _projected_heads(p: Problem, out: dict, M: np.ndarray, X: np.ndarray, C: np.ndarray, subs) -> list[np.ndarray]:
    """Every head's projections and stages; returns the heads' outputs, in order."""
    outputs = []
    n_heads = len(p.heads)
    per_group = n_heads // (p.kv_heads or n_heads)  # query heads sharing one K/V head (1: no sharing)
    for h, weights in enumerate(p.heads, 1):
        prefix = functools.partial(st.stage_id, head=h if p.multi_head else None)  # this head's ids
        W_Q = out[prefix(st.W_Q)] = to_float64(weights.W_Q, subs)
        Q = X @ W_Q                                             # (n_q, d_model) @ (d_model, d_k)
        if weights.b_Q is not None:                             # a bias row, broadcast over the rows
            Q = Q + _bias(out, prefix(st.B_Q), weights.b_Q, subs)
        out[prefix(st.Q)] = Q
        first = (h - 1) // per_group * per_group + 1            # query head q (0-based) reads K/V head q // per_group
        if h == first:  # the group's K and V, under its first head's ids
            kv_prefix = prefix
            K, V = _keys_and_values(out, prefix, weights, C, subs)
        O = _head(p, out, M, prefix, Q, K, V, kv_prefix, sink=_sink(p, h))
        if p.differential is not None:  # the second map, subtracted from the first (differential attention)
            from .differential import numeric_head

            maps = tuple(to_float64(m, subs) for m in p.differential.maps[h - 1])
            rotate = (lambda x: rope_rotate(x, p.rope)) if p.rope is not None else None
            O = numeric_head(p, out, prefix, out[prefix(st.A)], X, V, maps, M, scale_factor(p, Q.shape[1]), rotate)
        outputs.append(O)
    return outputs


def _keys_and_values(out: dict, prefix, weights, C: np.ndarray, subs) -> tuple[np.ndarray, np.ndarray]:
    """A K/V group's K and V from the context, under its first head's ids."""
    W_K = out[prefix(st.W_K)] = to_float64(weights.W_K, subs)
    W_V = out[prefix(st.W_V)] = to_float64(weights.W_V, subs)
    K = C @ W_K                                                 # (n_k, d_model) @ (d_model, d_k)
    V = C @ W_V                                                 # (n_k, d_model) @ (d_model, d_v)
    if weights.b_K is not None:
        K = K + _bias(out, prefix(st.B_K), weights.b_K, subs)
    if weights.b_V is not None:
        V = V + _bias(out, prefix(st.B_V), weights.b_V, subs)
    out[prefix(st.K)], out[prefix(st.V)] = K, V
    return K, V


def _output_projection(p: Problem, out: dict, outputs: list[np.ndarray], subs) -> None:
    """The heads' outputs side by side, times W_O (plus b_O): the layer's output O."""
    concat = out[st.CONCAT] = np.concatenate(outputs, axis=1)  # (n_q, h·d_v)
    W_O = out[st.W_O] = to_float64(p.W_O, subs)
    O = concat @ W_O                                             # (n_q, h·d_v) @ (h·d_v, d_out)
    if p.b_O is not None:
        O = O + _bias(out, st.B_O, p.b_O, subs)
    out[st.O] = O


def numeric_stages(p: Problem) -> dict[str, np.ndarray]:
    """Every stage of ``softmax(Q Kᵀ·scale + M) V`` in float64, by stage id.

    Symbols take the problem's ``values``; the caller checks they are all given.
    """
    subs = p.substitutions or None
    out: dict[str, np.ndarray] = {}
    M = _mask_f64(p, subs)
    if p.linear is not None:                                # the state's size against the KV cache's
        from .linear import state_cost

        sizes = [(h.d_k, h.d_v) for h in p.heads] if p.projected else [(p.Q.cols, p.V.cols)]
        out[st.STATE_COST] = state_cost(p, sizes)
    if not p.projected:
        Q = out[st.Q] = to_float64(p.Q, subs)
        K = out[st.K] = to_float64(p.K, subs)
        V = out[st.V] = to_float64(p.V, subs)
        _head(p, out, M, st.stage_id, Q, K, V, sink=_sink(p, 1))
        return out
    X, C = _layer_inputs(p, out, subs)
    if p.mla is not None:                                   # mla: Q, K, V assembled from the latent
        from .mla import mla_absorbed, mla_cache, mla_heads

        outputs = []
        for h, prefix, Q, K, V in mla_heads(p, out, X, functools.partial(to_float64, subs=subs)):
            outputs.append(_head(p, out, M, prefix, Q, K, V))
            mla_absorbed(p, out, prefix, h)
        out[st.MLA_CACHE] = mla_cache(p)
    else:
        outputs = _projected_heads(p, out, M, X, C, subs)
    if p.multi_head:
        _output_projection(p, out, outputs, subs)
    if p.residual:
        block = out.get(st.X_EMB, out.get(st.X_POS, out[st.X]))  # the block's input (with its positions, normed)
        out_id = st.O_SUBLN if p.differential is not None and p.differential.paper and not p.multi_head else st.O
        total = block + out[out_id]                             # the layer's output, added to its input
        if p.norm is not None and p.norm.post:                  # BERT: H = LN(X + O)
            out[st.R] = total
            out[st.H] = layer_norm_f64(total, p.norm, out, "post")
        else:
            out[st.H] = total
        block_f64(p, out, out[st.H])
    return out
