"""The outline of a worked solution: its numbered steps, in order, and the step of each stage."""

from __future__ import annotations

from .block_backward import ce
from .ids import K
from .kinds import Context, Kind, Section, softmax_attention, tiled
from .linear import linear
from .mla import latent
from .differential import differential, paper
from .plan import per_head_blocks


def _norm_kind(n) -> str:
    return "RMSNorm" if n.rms else "LayerNorm"


# The numbered steps of a worked solution, in order.
SECTIONS: tuple[Section, ...] = (
    Section("given", "The input: queries, keys and values given", applies=lambda c: not c.projected),
    Section("input", "The input", applies=lambda c: c.projected),
    Section("positions", "Add the positions", applies=lambda c: c.positions,
            retitle=lambda c: "Add the positions and the token types" if c.token_types else "Add the positions"),
    Section("embeddings", "Normalise the embeddings", applies=lambda c: c.emb_norm is not None,
            retitle=lambda c: "Normalise the embeddings (" + ("RMSNorm" if c.emb_norm.rms else "LayerNorm") + ")"),
    Section("norm", "Normalise each token", applies=lambda c: c.pre_norm,
            retitle=lambda c: "Normalise each token (RMSNorm)" if c.norm.rms else "Normalise each token (LayerNorm)"),
    Section("mla_latent", "Compress: the latent c_KV and the shared rotated key k_R", applies=latent),
    Section("mla_weights", "The up-projections (a block of columns per head)", applies=latent),
    Section("project", "Project to queries, keys and values", per_head=True,
            applies=lambda c: c.projected and not latent(c),
            retitle=lambda c: (f"Project to queries (K/V of group {c.p.kv_group(c.head)} above)"
                               if c.reads(K, c.head) != c.head else None)),
    Section("mla_heads", "The head's queries, keys and values from the latent", per_head=True, applies=latent),
    Section("qk_norm", "Normalise the queries and keys (QK-norm)", per_head=True,
            applies=lambda c: getattr(c.p, "qk_norm", None) is not None),
    Section("rotate", "Rotate the queries and keys (RoPE)", per_head=True, applies=lambda c: c.rope is not None),
    Section("transpose", "Transpose the keys", per_head=True, applies=softmax_attention),
    Section("scores", "Score every query against every key", per_head=True, applies=softmax_attention),
    Section("scale", "Scale the scores", per_head=True, applies=softmax_attention),
    Section("softcap", "Soft-cap the scores", per_head=True, applies=lambda c: getattr(c.p, "softcap", None) is not None),
    Section("mask", "Apply the mask", per_head=True, applies=softmax_attention),
    Section("temperature", "Divide by the temperature", per_head=True,
            applies=lambda c: getattr(c.p, "temperature", None) is not None),
    Section("softmax", "Softmax on each row", per_head=True, applies=softmax_attention,
            retitle=lambda c: "Softmax on each row: the first map" if differential(c) else None),
    Section("second_map", "The second map: its own queries and keys", per_head=True,
            applies=differential),
    Section("differential", "The differential map: the first map minus λ times the second", per_head=True,
            applies=differential),
    Section("features", "Linear attention: the feature maps", per_head=True, applies=linear),
    Section("linear", "The parallel form: the masked table and its normalisers", per_head=True, applies=linear),
    Section("output", "Weighted sum of the values", per_head=True),
    Section("absorb", "The absorption: the scores straight from the cache", per_head=True, applies=latent),
    Section("subln", "The paper's per-head norm and its factor", per_head=True, applies=paper),
    Section("recurrent", "The recurrent form: one state update per token", per_head=True, applies=linear),
    Section("tiled", "The same output in one pass: FlashAttention's online softmax", per_head=True,
            applies=lambda c: tiled(c)),
    Section("decode", "Decode the new token from the KV cache", per_head=True, applies=lambda c: c.t is not None),
    Section("step_cost", "The cost of a decoding step", applies=lambda c: c.t is not None),
    Section("state_cost", "The state against the KV cache", applies=linear),
    Section("mla_cache", "The cache per token: MLA against MHA and GQA", applies=latent),
    Section("concat", "Concatenate the heads", applies=lambda c: c.multi),
    Section("projection", "Output projection", applies=lambda c: c.multi),
    Section("residual", "The residual stream", applies=lambda c: c.residual,
            retitle=lambda c: ("The residual sum and its norm (post-norm, "
                               + ("RMSNorm" if c.norm.rms else "LayerNorm") + ")") if c.norm is not None and c.norm.post
            else None),
    Section("mlp_norm", "Normalise the residual stream", applies=lambda c: c.mlp is not None and c.mlp.norm is not None
            and not c.mlp.post, retitle=lambda c: "Normalise the residual stream (" + _norm_kind(c.mlp.norm) + ")"),
    Section("mlp", "The MLP", applies=lambda c: c.mlp is not None,
            retitle=lambda c: ("The MLP (gated: " + {"silu": "SwiGLU", "gelu": "GeGLU", "gelu-tanh": "GeGLU, tanh form"}
                               [c.mlp.activation] + ")") if c.mlp.gated else None),
    Section("mlp_residual", "Add the MLP's output to the residual stream", applies=lambda c: c.mlp is not None,
            retitle=lambda c: ("The residual sum and its norm (post-norm, " + _norm_kind(c.mlp.norm) + ")")
            if c.mlp.post else None),
    Section("final_norm", "The final norm", applies=lambda c: c.logits is not None and c.logits.norm is not None,
            retitle=lambda c: "The final norm (" + _norm_kind(c.logits.norm) + ")"),
    Section("logits", "The logits: every word scored", applies=lambda c: c.logits is not None,
            retitle=lambda c: "The logits: every word scored (the logit lens)" if c.logits.lens else None),
    Section("probabilities", "Next-token probabilities", applies=lambda c: c.logits is not None),
    Section("loss", "The cross-entropy loss", applies=lambda c: c.ce is not None),
    Section("b_loss", "Backward: back through the loss and the softmax", backward=True, applies=ce),
    Section("b_logits", "Back through the unembedding", backward=True, applies=ce),
    Section("b_final_norm", "Back through the final norm", backward=True,
            applies=lambda c: ce(c) and c.logits.norm is not None,
            retitle=lambda c: "Back through the final norm (" + _norm_kind(c.logits.norm) + ")"),
    Section("b_mlp_residual", "Back through the MLP's residual", backward=True,
            applies=lambda c: ce(c) and c.mlp is not None,
            retitle=lambda c: ("Back through the norm and the MLP's residual (post-norm, " + _norm_kind(c.mlp.norm) + ")")
            if c.mlp.post else None),
    Section("b_mlp", "Back through the MLP", backward=True, applies=lambda c: ce(c) and c.mlp is not None),
    Section("b_mlp_norm", "Back through the MLP's norm", backward=True,
            applies=lambda c: ce(c) and c.mlp is not None and c.mlp.norm is not None and not c.mlp.post,
            retitle=lambda c: "Back through the MLP's norm (" + _norm_kind(c.mlp.norm) + ")"),
    Section("b_upstream", "Backward: the upstream gradient", backward=True,
            applies=lambda c: not (ce(c) and c.norm is not None and c.norm.post),  # dO = dH, or with it dH
            retitle=lambda c: "Back through the attention's residual" if ce(c) else None),
    Section("b_residual", "Back through the norm and the residual (post-norm)", backward=True,
            applies=lambda c: c.norm is not None and c.norm.post),
    Section("b_projection", "Back through the output projection", backward=True, applies=lambda c: c.multi),
    Section("b_head", "This head's upstream gradient", backward=True, per_head=True, applies=lambda c: c.multi),
    Section("b_weighted_sum", "Back through the weighted sum", backward=True, per_head=True),
    Section("b_softmax", "Back through the softmax", backward=True, per_head=True),
    Section("b_scaling", "Back through the scaling", backward=True, per_head=True),
    Section("b_qk", "Back to the queries and keys", backward=True, per_head=True),
    Section("b_rotate", "Back through the rotation", backward=True, per_head=True, applies=lambda c: c.rope is not None),
    Section("b_weights", "Back to the projection weights", backward=True, per_head=True),
    Section("b_input", "Back to the input", backward=True, applies=lambda c: not c.pre_norm or c.cross),
    Section("b_norm", "Back through the norm", backward=True, applies=lambda c: c.pre_norm,
            retitle=lambda c: "Back through the norm (RMSNorm)" if c.norm.rms else "Back through the norm (LayerNorm)"),
)


def sections(problem) -> list[tuple[Section, int, int | None]]:
    """The numbered steps of the worked solution: (section, number, head), in order.

    Forward steps are numbered 1, 2, ... over the steps this problem has (with several heads
    each head repeats its numbers); the backward steps continue after the last forward one.
    """
    c = Context(problem)
    forward = [s for s in SECTIONS if not s.backward and s.applies(c)]
    backward = [s for s in SECTIONS if s.backward and s.applies(c)]
    number = {s.key: n for n, s in enumerate(forward, 1)}
    number.update({s.key: len(forward) + n for n, s in enumerate(backward, 1)})
    multi = c.heads if c.multi else [None]
    return [(s, number[s.key], h) for s, h in per_head_blocks(forward + backward, lambda s: s.per_head and c.multi, multi)]


def section_of(kind: Kind, c: Context) -> str:
    return kind.section(c) if callable(kind.section) else kind.section
