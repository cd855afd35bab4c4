"""The reference practitioners trust: PyTorch's ``scaled_dot_product_attention``.

Independent of the exact code path: it starts from the problem's inputs in
float64 and asks PyTorch for each head's weights and output (the weights by
attending to the identity matrix as values), then concatenates and projects
with ``W_O``. PyTorch is an optional extra: ``pip install 'symattn[torch]'``.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import stages as st
from ..errors import SymattnError
from .numeric import positions_f64, to_float64
from ..problem.model import Problem

INSTALL_HINT = "pip install 'symattn[torch]'"


def import_torch():
    """PyTorch, imported (a SymattnError saying how to install it when it is missing)."""
    try:
        import torch
    except ImportError:
        raise SymattnError(f"the PyTorch cross-check needs PyTorch, which is not installed; {INSTALL_HINT}") from None
    return torch


def torch_rope(torch, x, rope):
    """Rotary embeddings as the two codebases write them: Hugging Face's ``x·cos + rotate_half(x)·sin``
    (half) and Meta's LLaMA, pairs as complex numbers times ``e^{i p θ}`` (interleaved)."""
    n, d = x.shape
    if rope.angles is not None:
        theta = torch.tensor([float(a) for a in rope.angles], dtype=torch.float64)
    else:
        theta = 1.0 / (float(rope.base) ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), theta)
    if rope.pairing == "half":
        emb = torch.cat((freqs, freqs), dim=-1)
        rotated_half = torch.cat((-x[:, d // 2:], x[:, : d // 2]), dim=-1)
        return x * emb.cos() + rotated_half * emb.sin()
    pairs = torch.view_as_complex(x.reshape(n, d // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(freqs), freqs)).reshape(n, d)


def torch_norm(F, n, x, t):
    """The norm ``n`` of the rows of ``x`` as PyTorch's own functions compute it (F.layer_norm,
    F.rms_norm); ``t`` makes a float64 tensor of an exact matrix."""
    weight = None if n.weight is None else t(n.weight)[0] + n.offset
    if n.kind == "rmsnorm":
        return F.rms_norm(x, (x.shape[1],), weight=weight, eps=float(n.eps))
    return F.layer_norm(x, (x.shape[1],), weight=weight, bias=None if n.bias is None else t(n.bias)[0],
                        eps=float(n.eps))


def _sink(p: Problem, head: int) -> "float | None":
    return None if p.sinks is None else float(p.sinks[head - 1])


def with_sink_key(torch, K, V, mask, sink: float):
    """A learned sink as SDPA can take it: one more key, all zeros (so its score q·0 is 0), with the
    value 0 and the mask entry ``sink`` in every row, so each row's softmax has the extra term
    exp(s − m) in its denominator and the sink adds nothing to the output. K and V are (…, n_k, d);
    ``mask`` (n_q × n_k) gets the sink's column (None: left None)."""
    zero_k, zero_v = torch.zeros_like(K[..., :1, :]), torch.zeros_like(V[..., :1, :])
    K, V = torch.cat([K, zero_k], dim=-2), torch.cat([V, zero_v], dim=-2)
    if mask is not None:
        mask = torch.cat([mask, torch.full((mask.shape[0], 1), sink, dtype=mask.dtype)], dim=1)
    return K, V, mask


def _attn_mask(torch, p: Problem, t):
    """SDPA's float mask: 0 where allowed, −inf where masked, plus the bias if the problem has one."""
    allowed = torch.tensor(p.mask.allowed, dtype=torch.bool)
    attn_mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    return attn_mask + t(p.bias) if p.bias is not None else attn_mask


def grouped_sink_keys(torch, K, V, mask, sinks):
    """:func:`with_sink_key` for grouped heads: one zero key per K/V group and a mask per query head,
    each with its own sink's column; unchanged without sinks."""
    if sinks is None:
        return K, V, mask
    K2, V2, _ = with_sink_key(torch, K, V, None, 0.0)
    return K2, V2, torch.stack([with_sink_key(torch, K[0], V[0], mask, float(s))[2] for s in sinks])


def _sdpa_scale(p: Problem, d_k: int) -> float:
    """The factor SDPA's ``scale=`` takes: 1/√d_k, 1 (``scale: none``) or the problem's own number."""
    return {"auto": d_k**-0.5, "none": 1.0}.get(p.scale) if isinstance(p.scale, str) else float(p.scale)


def torch_stages(p: Problem) -> dict[str, np.ndarray]:
    """Each head's ``A`` and ``O`` (and with heads, the projected ``O``) from PyTorch in float64."""
    torch = import_torch()
    F = torch.nn.functional
    subs = p.substitutions or None

    def t(m):
        return torch.from_numpy(to_float64(m, subs))

    def linear(x, W, b):
        """x·W + b as nn.Linear computes it (its weight is stored out × in: Wᵀ)."""
        return F.linear(x, t(W).T, None if b is None else t(b)[0])

    attn_mask = _attn_mask(torch, p, t)
    out: dict[str, np.ndarray] = {}

    def head(prefix: str, Q, K, V, sink=None):
        if p.linear is not None:
            return torch_linear(torch, F, p, torch.tensor(p.mask.allowed, dtype=torch.bool), out, prefix, Q, K, V)
        Q, K = qk_normed(F, p, Q, K, t)
        if p.rope is not None:
            Q, K = torch_rope(torch, Q, p.rope), torch_rope(torch, K, p.rope)
        scale, n_k = _sdpa_scale(p, Q.shape[-1]), K.shape[0]
        K, V, mask = with_sink_key(torch, K, V, attn_mask, sink) if sink is not None else (K, V, attn_mask)
        eye = torch.eye(K.shape[0], dtype=torch.float64)
        A = attend(torch, F, p, Q[None], K[None], eye[None], mask, scale)[0][:, :n_k]
        O = attend(torch, F, p, Q[None], K[None], V[None], mask, scale)[0]
        out[prefix(st.A)] = A.numpy()
        out[prefix(st.O)] = O.numpy()
        return O

    def grouped(X, C):
        """Grouped-query attention as PyTorch does it: each K/V group once, SDPA's enable_gqa repeating it."""
        n_heads = len(p.heads)
        per_group = n_heads // p.kv_heads
        def rot(x, side):  # QK-norm, then RoPE, on each head's queries and each group's keys (then shared)
            x = qk_normed(F, p, x, x, t)[side]
            return torch_rope(torch, x, p.rope) if p.rope is not None else x

        Q = torch.stack([rot(linear(X, w.W_Q, w.b_Q), 0) for w in p.heads])     # (h, n_q, d_k)
        firsts = p.heads[::per_group]
        K = torch.stack([rot(linear(C, w.W_K, w.b_K), 1) for w in firsts])      # (g, n_k, d_k)
        V = torch.stack([linear(C, w.W_V, w.b_V) for w in firsts])              # (g, n_k, d_v)
        scale, n_k = _sdpa_scale(p, Q.shape[-1]), K.shape[1]
        K, V, mask = grouped_sink_keys(torch, K, V, attn_mask, p.sinks)
        eye = torch.eye(K.shape[1], dtype=torch.float64).expand(p.kv_heads, -1, -1)
        A, O = (attend(torch, F, p, Q, K, values, mask, scale, gqa=True) for values in (eye, V))
        A = A[..., :n_k]
        for h in range(n_heads):
            out[st.stage_id(st.A, h + 1)] = A[h].numpy()
            out[st.stage_id(st.O, h + 1)] = O[h].numpy()
        return list(O)

    with torch.no_grad():
        if not p.projected:
            head(st.stage_id, t(p.Q), t(p.K), t(p.V), _sink(p, 1))
            return out
        X = block = torch_embedded(torch, F, p, t, out)         # X, with its positions (and its norm)
        if p.norm is not None and not p.norm.post:
            X = torch_norm(F, p.norm, X, t)                     # the attention reads the norm of X
            out[st.X_NORM] = X.numpy()
        C = t(p.context) if p.context is not None else X
        outputs = [head(*qkv) for qkv in torch_mla(torch, p, X, t)] if p.mla is not None else []  # mla: SDPA too
        if p.kv_heads:
            outputs = grouped(X, C)
        elif p.mla is None:
            for h, weights in enumerate(p.heads, 1):
                prefix = functools.partial(st.stage_id, head=h if p.multi_head else None)  # this head's ids
                outputs.append(_differential(torch, F, p, out, prefix, X, weights, h, t, attn_mask, linear)
                               if p.differential is not None else head(prefix, linear(X, weights.W_Q, weights.b_Q), linear(C, weights.W_K, weights.b_K),
                                    linear(C, weights.W_V, weights.b_V), _sink(p, h)))
        O = outputs[0]
        if p.multi_head:
            O = linear(torch.cat(outputs, dim=1), p.W_O, p.b_O)
            out[st.O] = O.numpy()
        if p.residual:
            H = torch_residual(F, p, block, O, t)
            out[st.H] = H.numpy()
            torch_block(torch, F, p, H, t, out)
    return out


def torch_mla(torch, p: Problem, X, t):
    """Each head's stage-id maker and assembled Q, K, V of multi-head latent attention, with torch's
    products and the rotation as Hugging Face's and Meta's codebases write it (:func:`torch_rope`)."""
    m = p.mla
    F = torch.nn.functional
    c_kv = X @ t(m.W_DKV)
    if m.norm_kv is not None:  # DeepSeek's kv_a_layernorm, with F.rms_norm
        c_kv = torch_norm(F, m.norm_kv, c_kv, t)
    k_rot = torch_rope(torch, X @ t(m.W_KR), m.rope)
    source = X @ t(m.W_DQ) if m.W_DQ is not None else X
    if m.norm_q is not None:  # q_a_layernorm
        source = torch_norm(F, m.norm_q, source, t)
    W_q = t(m.W_UQ) if m.W_DQ is not None else t(m.W_Q)
    W_UK, W_UV, W_QR = t(m.W_UK), t(m.W_UV), t(m.W_QR)
    out = []
    for h in range(m.heads):
        def cols(w, width):
            return w[:, h * width:(h + 1) * width]
        q_rot = torch_rope(torch, source @ cols(W_QR, m.d_R), m.rope)
        Q = torch.cat([source @ cols(W_q, m.d_h), q_rot], dim=1)
        K = torch.cat([c_kv @ cols(W_UK, m.d_h), k_rot], dim=1)
        out.append((functools.partial(st.stage_id, head=h + 1), Q, K, c_kv @ cols(W_UV, m.d_v)))
    return out
def _differential(torch, F, p: Problem, out: dict, prefix, X, weights, h: int, t, attn_mask, linear):
    """Head ``h`` of differential attention (see :func:`.differential.torch_head`): its output."""
    from .differential import torch_head

    Q, K, V = linear(X, weights.W_Q, None), linear(X, weights.W_K, None), linear(X, weights.W_V, weights.b_V)
    rope = (lambda x: torch_rope(torch, x, p.rope)) if p.rope is not None else None
    return torch_head(torch, F, p, out, prefix, X, Q, K, V, tuple(t(m) for m in p.differential.maps[h - 1]),
                      attn_mask, _sdpa_scale(p, Q.shape[-1]), rope)


# linear attention's feature maps as PyTorch's functions compute them (elu(x) + 1 with F.elu)
TORCH_FEATURES = {
    "relu": lambda F, x: F.relu(x),
    "elu1": lambda F, x: F.elu(x) + 1,
    "identity": lambda F, x: x,
}


def torch_linear(torch, F, p: Problem, allowed, out: dict, prefix, Q, K, V):
    """Linear attention's recurrent form with cumulative sums (the state S_t = Σ_{j≤t} φ(k_j)v_jᵀ and
    z_t = Σ_{j≤t} φ(k_j) for every t at once; with no causal mask, the sums over every key), a real
    key (not padding) only; returns O = φ(q_t)ᵀS_t / φ(q_t)ᵀz_t."""
    fq, fk = TORCH_FEATURES[p.linear.feature](F, Q), TORCH_FEATURES[p.linear.feature](F, K)
    real = allowed.any(dim=0).to(torch.float64)                     # keys some query may read: not padding
    kv = torch.einsum("jk,jv->jkv", fk, V) * real[:, None, None]    # φ(k_j)v_jᵀ of each key
    zk = fk * real[:, None]
    if "causal" in p.mask.kinds:
        S, z = kv.cumsum(dim=0), zk.cumsum(dim=0)
    else:
        S, z = kv.sum(dim=0).expand(Q.shape[0], -1, -1), zk.sum(dim=0).expand(Q.shape[0], -1)
    num = torch.einsum("tk,tkv->tv", fq, S)
    den = torch.einsum("tk,tk->t", fq, z)[:, None]
    O = num / den
    out[prefix(st.PHI_Q)], out[prefix(st.PHI_K)] = fq.numpy(), fk.numpy()
    out[prefix(st.Z_STATE)], out[prefix(st.S_STATE)] = z.numpy(), S.reshape(Q.shape[0], -1).numpy()
    out[prefix(st.O_REC)] = out[prefix(st.O)] = O.numpy()
    return O


def qk_normed(F, p: Problem, Q, K, t):
    """QK-norm as Qwen 3 applies it: F.rms_norm of each query and key row over d_head, before RoPE."""
    if p.qk_norm is None:
        return Q, K
    return tuple(torch_norm(F, n, x, t) for n, x in ((p.qk_norm.q, Q), (p.qk_norm.k, K)))


def attend(torch, F, p: Problem, Q, K, V, attn_mask, scale: float, gqa: bool = False):
    """SDPA's output, with the problem's temperature T folded into its ``scale=`` (and the mask, which
    is divided by T with the scores: −∞/T = −∞); with soft-capping, the scores capped by torch.tanh
    before the mask and the softmax taken by hand, as Gemma 2's eager attention does."""
    T = 1.0 if p.temperature is None else float(p.temperature)
    if p.softcap is None:
        return F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask / T, scale=scale / T, enable_gqa=gqa)
    if gqa:
        K, V = (x.repeat_interleave(Q.shape[0] // K.shape[0], dim=0) for x in (K, V))
    c = float(p.softcap)
    scores = c * torch.tanh(Q @ K.transpose(-1, -2) * scale / c)
    return torch.softmax((scores + attn_mask) / T, dim=-1) @ V


# the MLP's activations as PyTorch's modules and functions compute them
TORCH_ACTIVATIONS = {
    "relu": lambda torch, F, x: F.relu(x),
    "relu2": lambda torch, F, x: F.relu(x) ** 2,
    "gelu": lambda torch, F, x: torch.nn.GELU()(x),
    "gelu-tanh": lambda torch, F, x: torch.nn.GELU(approximate="tanh")(x),
    "silu": lambda torch, F, x: F.silu(x),
}


def torch_block(torch, F, p: Problem, H, t, out: dict) -> None:
    """The MLP (nn.Linear's arithmetic, nn.GELU, F.silu), the block's output Y, and the model's head:
    the final norm, the logits, F.softmax over the vocabulary and F.cross_entropy."""
    top, mlp = H, p.mlp
    if mlp is not None:
        x = torch_norm(F, mlp.norm, H, t) if mlp.norm is not None and not mlp.post else H
        act = TORCH_ACTIVATIONS[mlp.activation]
        if mlp.gated:                                       # LLaMA's down(act(gate(x)) * up(x))
            G = act(torch, F, F.linear(x, t(mlp.W_1).T)) * F.linear(x, t(mlp.W_up).T)
        else:
            G = act(torch, F, F.linear(x, t(mlp.W_1).T, None if mlp.b_1 is None else t(mlp.b_1)[0]))
        out[st.G] = G.numpy()
        Fo = F.linear(G, t(mlp.W_2).T, None if mlp.b_2 is None else t(mlp.b_2)[0])
        out[st.F] = Fo.numpy()
        top = torch_norm(F, mlp.norm, H + Fo, t) if mlp.post else H + Fo
        out[st.Y] = top.numpy()
    head = p.logits
    if head is None:
        return
    x = top[-1:] if head.last else top
    if head.norm is not None:
        x = torch_norm(F, head.norm, x, t)
        out[st.Y_FINAL] = x.numpy()
    z = x @ t(head.W_U)
    out[st.LOGITS] = z.numpy()
    out[st.P] = F.softmax(z, dim=-1).numpy()
    if p.loss is not None:
        rows, targets = torch.tensor(p.loss.rows), torch.tensor(p.loss.targets)
        out[st.NLL] = F.cross_entropy(z[rows], targets, reduction="none")[:, None].numpy()
        out[st.LOSS] = F.cross_entropy(z[rows], targets).reshape(1, 1).numpy()


def torch_embedded(torch, F, p: Problem, t, out: dict):
    """The block's input: X, plus PE with positions (and BERT's token types), then the embeddings'
    own norm when the problem has it (kept under its id)."""
    X = t(p.X)
    PE = positions_f64(p)
    if PE is not None:
        if p.token_types is not None:                           # BERT adds its token types too
            PE = PE + to_float64(p.token_types)
        X = X + torch.from_numpy(PE)                            # the projections read X + PE
    if p.embeddings_norm is not None:                           # BERT's embeddings.LayerNorm: the layer's input
        X = torch_norm(F, p.embeddings_norm, X, t)
        out[st.X_EMB] = X.numpy()
    return X


def torch_residual(F, p: Problem, block, O, t):
    """The residual stream H = X + O (the block's input plus the layer's output), and with a
    post norm its norm, BERT's H = LN(X + O)."""
    H = block + O
    return torch_norm(F, p.norm, H, t) if p.norm is not None and p.norm.post else H
