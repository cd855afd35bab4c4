"""A problem's stages: the rows of the registry that apply to it, once per head for the per-head
rows, with their ids (:func:`plan`); and the stage ids a row's input keys stand for
(:func:`resolve`, :func:`input_ids`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .ids import (
    B_1, B_2, B_K, B_O, B_Q, B_V, BETA, BETA_POST, DH, DO, DO_HEAD, DR, DX, DX_HAT, EBETA, EGAMMA, EMS, EMU, EVAR,
    FINAL_BETA, FINAL_GAMMA, FINAL_MS, FINAL_MU, FINAL_VAR, GAMMA, GAMMA_POST, K, K_ROT, MLP_BETA, MLP_BETA_POST,
    MLP_GAMMA, MLP_GAMMA_POST, MLP_MS, MLP_MS_POST, MLP_MU, MLP_MU_POST, MLP_VAR, MLP_VAR_POST, MS, MS_POST, MU,
    MU_POST, O, Q, Q_ROT, S_CAPPED, S_MASKED, S_SCALED, S_TEMP, SHARED_KV, TT, U, U_GATE, U_UP, VAR, VAR_POST, W_2,
    W_DOWN, X_HAT, stage_id,
)
from .ids import KN_BETA, KN_GAMMA, KN_MS, KN_MU, KN_VAR, K_NORM, QN_BETA, QN_GAMMA, QN_MS, QN_MU, QN_VAR, Q_NORM
from .ids import K_2, K_2ROT, O_SUBLN, Q_2, Q_2ROT
from .kinds import Context, Kind
from .registry import BY_KEY, KINDS
from .relations import input_paths


NORM_WEIGHTS = {GAMMA: "weight", GAMMA_POST: "weight", BETA: "bias", BETA_POST: "bias", EGAMMA: "weight",
                EBETA: "bias", MLP_GAMMA: "weight", MLP_BETA: "bias", MLP_GAMMA_POST: "weight",
                MLP_BETA_POST: "bias", FINAL_GAMMA: "weight", FINAL_BETA: "bias", QN_GAMMA: "weight", QN_BETA: "bias",
                KN_GAMMA: "weight", KN_BETA: "bias"}
NORM_STATS = (MU, MU_POST, VAR, VAR_POST, MS, MS_POST, EMU, EVAR, EMS, MLP_MU, MLP_VAR, MLP_MS, MLP_MU_POST,
              MLP_VAR_POST, MLP_MS_POST, FINAL_MU, FINAL_VAR, FINAL_MS, QN_MU, QN_VAR, QN_MS, KN_MU, KN_VAR, KN_MS)
MS_KEYS = (MS, MS_POST, EMS, MLP_MS, MLP_MS_POST, FINAL_MS, QN_MS, KN_MS)  # RMSNorm's mean square (LayerNorm: μ and σ²)
EMB_KEYS = (EGAMMA, EBETA, EMU, EVAR, EMS)  # the embeddings' norm's (the others are the layer norm's)


def _mlp_norm(c):
    return c.mlp.norm if c.mlp is not None else None


def _final_norm(c):
    return c.logits.norm if c.logits is not None else None


# the norm each norm stage key belongs to (the layer's norm for the others)
NORM_BY_KEY = {**{k: (lambda c: c.emb_norm) for k in EMB_KEYS},
               **{k: _mlp_norm for k in (MLP_GAMMA, MLP_BETA, MLP_MU, MLP_VAR, MLP_MS, MLP_GAMMA_POST, MLP_BETA_POST,
                                          MLP_MU_POST, MLP_VAR_POST, MLP_MS_POST)},
               **{k: _final_norm for k in (FINAL_GAMMA, FINAL_BETA, FINAL_MU, FINAL_VAR, FINAL_MS)},
               **{k: (lambda c: c.p.qk_norm.q if getattr(c.p, "qk_norm", None) else None)
                  for k in (QN_GAMMA, QN_BETA, QN_MU, QN_VAR, QN_MS)},
               **{k: (lambda c: c.p.qk_norm.k if getattr(c.p, "qk_norm", None) else None)
                  for k in (KN_GAMMA, KN_BETA, KN_MU, KN_VAR, KN_MS)}}
# the pseudo-keys of the MLP's and the head's inputs: the stage each stands for here (None: none)
BLOCK_KEYS = {
    "stream": lambda c: c.stream,
    "mlp_in": lambda c: c.mlp_in,
    "mlp_u": lambda c: U_GATE if c.mlp.gated else U,
    "mlp_w2": lambda c: W_DOWN if c.mlp.gated else W_2,
    U_UP: lambda c: U_UP if c.mlp.gated else None,
    B_1: lambda c: B_1 if c.mlp.b_1 is not None else None,
    B_2: lambda c: B_2 if c.mlp.b_2 is not None else None,
    "top": lambda c: c.top,
    "final_in": lambda c: c.final_in,
    "unembedded": lambda c: c.unembedded,
}


@dataclass(frozen=True)
class Planned:
    """One stage of a problem: its row, its head and its id."""

    kind: Kind
    head: int | None
    id: str
    c: Context


def per_head_blocks(items: list, per_head: Callable, heads: list) -> Iterator[tuple[Any, int | None]]:
    """``items`` in order, each run of per-head items (the same truthy ``per_head``) repeated for
    every head in turn."""
    k = 0
    while k < len(items):
        if not per_head(items[k]):
            yield items[k], None
            k += 1
            continue
        end = k
        while end < len(items) and per_head(items[end]) == per_head(items[k]):
            end += 1
        for h in heads:
            for item in items[k:end]:
                yield item, h
        k = end


def plan(problem) -> list[Planned]:
    """The stages of ``problem`` in the order they are derived (the JSON contract's order)."""
    c = Context(problem)
    out: list[Planned] = []
    shared: list[Planned] = []  # a K/V group's gradients: after the last of its heads has given its share
    for kind, h in per_head_blocks([k for k in KINDS if k.when(c)], lambda k: k.per_head, c.heads):
        if c.reads(kind.key, h) != h:
            continue  # a grouped head reads its group's keys and values: shown once, with the group's first head
        if shared and (h is None or problem.kv_group(h) != problem.kv_group(shared[0].head)):
            out += shared
            shared = []
        planned = Planned(kind, h, stage_id(kind.name, h), c.at(h))
        (shared if kind.gradient and c.grouped and h is not None and kind.key in SHARED_KV else out).append(planned)
    return out + shared


def resolve(key: str, c: Context, head: "int | None | object" = ...) -> list[str]:
    """The stage ids an input key stands for in context ``c`` (another head's with ``head``)."""
    if key == "kv":
        key = c.kv
    normed = getattr(c.p, "qk_norm", None) is not None
    if key in ("q_pre", "k_pre"):  # what RoPE turns: the queries and keys, normalised first under QK-norm
        key = {"q_pre": Q_NORM, "k_pre": K_NORM}[key] if normed else {"q_pre": Q, "k_pre": K}[key]
    if key in ("q_in", "k_in"):  # what the scores read: the rotated queries and keys under RoPE
        key = ({"q_in": Q_ROT, "k_in": K_ROT}[key] if c.rope is not None else
               {"q_in": Q_NORM, "k_in": K_NORM}[key] if normed else {"q_in": Q, "k_in": K}[key])
    if key in ("q2_in", "k2_in"):  # what the second map's scores read (differential attention)
        key = ({"q2_in": Q_2ROT, "k2_in": K_2ROT} if c.rope is not None else {"q2_in": Q_2, "k2_in": K_2})[key]
    if key == "mask_in":  # what the mask is added to: the soft-capped scores with softcap
        key = S_CAPPED if getattr(c.p, "softcap", None) is not None else S_SCALED
    if key == "a_in":  # what the softmax reads: the masked scores over the temperature with one
        key = S_TEMP if getattr(c.p, "temperature", None) is not None else S_MASKED
    if key == "xq":
        key = c.xq
    if key == "block":
        key = c.block
    if key == "embedded":
        key = c.embedded
    if key == "token_types":
        return [TT] if c.token_types else []
    if key in BLOCK_KEYS:  # the MLP's and the head's inputs: which stage, or none
        key = BLOCK_KEYS[key](c)
        if key is None:
            return []
    n = NORM_BY_KEY.get(key, lambda c: c.norm)(c)
    if key in NORM_WEIGHTS and (n is None or getattr(n, NORM_WEIGHTS[key]) is None):
        return []  # no γ (1) or no β (0)
    if key in NORM_STATS and (n is None or n.rms != (key in MS_KEYS)):
        return []  # RMSNorm has a mean square, LayerNorm a mean and a variance
    if key == "output":
        key = c.output
    post = c.norm is not None and c.norm.post
    if key == "upstream":  # what dO is read from: the loss on O, or the residual's gradient
        key = "skip" if c.residual else c.output
    if key == "skip":  # the residual's gradient, added at the input: dH, or dR behind a post norm
        if not c.residual:
            return []
        key = DR if post else DH
    if key == "heads":
        return [stage_id(O_SUBLN if getattr(c.differential, "paper", None) is not None else O, h) for h in c.heads]
    if key in (B_Q, B_K, B_V, B_O) and not c.has_bias(key):
        return []  # no bias: the projection is the product alone
    h = c.head if head is ... else head
    if key == DO and c.multi and h is not None:
        key = DO_HEAD  # inside a head, the upstream gradient is the head's share of it
    kind = BY_KEY[key]
    return [stage_id(kind.name, c.reads(key, h) if kind.per_head and c.multi else None)]


def input_ids(kind: Kind, c: Context) -> list[str]:
    """The ids of the stages ``kind`` is computed from, in context ``c``."""
    out = []
    for key in (kind.inputs(c) if callable(kind.inputs) else kind.inputs):
        if key == "through" and c.pre_norm:  # dX back through the norm in front
            n = c.norm
            out += [i for k in (DX_HAT, X_HAT, MS if n.rms else VAR) for i in resolve(k, c)]
        elif key in ("paths", "through"):  # the paths through the projections
            out += [i for g, w, h in input_paths(c, DX if key == "through" else kind.key)
                    for i in resolve(g, c, h) + resolve(w, c, h)]
        elif kind.gradient and c.grouped and kind.key in SHARED_KV and key not in SHARED_KV:
            # a K/V group's gradient sums a share from each of its heads
            out += list(dict.fromkeys(i for h in c.group_heads for i in resolve(key, c, h)))
        else:
            out += resolve(key, c)
    return out
