"""The relations too long for a lambda in the table: the upstream gradient, a head's block of the
concatenation, the input's gradient along all its paths, the output projection and the decoded row."""

from __future__ import annotations

from .ids import B_O, CONCAT, DCONTEXT, DK, DQ, DV, K, W_K, W_O, W_Q, W_V
from .kinds import Context, Relation


def dO_relation(ops, v, c: Context, of: str = "output"):
    """The upstream gradient of the loss on ``of`` (the layer's output, or with the residual H)."""
    loss = c.loss
    if loss.kind == "sum":
        return ops.ones(c.p.n_q, c.p.d_out)
    if loss.kind in ("weights", "dO"):
        return ops.given(loss.matrix)
    return ops.sub(v(of), ops.given(loss.matrix))  # L = ½‖O − T‖² (½‖H − T‖²)


def head_block(c: Context) -> tuple[int, int]:
    """Where this head's columns sit in the concatenation: (first, width)."""
    widths = [h.d_v for h in c.p.heads]
    k = (c.head or 1) - 1
    return sum(widths[:k]), widths[k]


def input_paths(c: Context, kind: str) -> list[tuple[str, str, int | None]]:
    """(gradient, weights, head) of every path to X (``kind`` dX) or to the context (dcontext),
    heads' query paths first."""
    heads = c.heads
    kv = [h for h in heads if c.reads(K, h) == h]  # one path per K/V group: its first head's
    if kind == DCONTEXT:
        return [(g, w, h) for h in kv for g, w in ((DK, W_K), (DV, W_V))]
    paths = [(DQ, W_Q, h) for h in heads]
    if not c.cross:
        paths += [(g, w, h) for h in kv for g, w in ((DK, W_K), (DV, W_V))]
    return paths


def input_gradient(kind: str) -> Relation:
    def relation(ops, v, c: Context):
        return ops.sum([ops.matmul(v(g, h), ops.T(v(w, h))) for g, w, h in input_paths(c, kind)])

    return relation


def output_projection(ops, v, c: Context):
    product = ops.matmul(v(CONCAT), v(W_O))
    return ops.add_row(product, v(B_O)) if c.has_bias(B_O) else product


def row_t(ops, m, c: Context):
    return ops.rows(m, c.t - 1, 1)


def cache_runs(c: Context, t: int | None = None) -> list[tuple[int, int]]:
    """The KV cache's rows when token ``t`` (default the decoded one) is decoded, as runs
    ``(first, count)`` of consecutive 0-based keys: ``[(0, t)]`` under the causal mask; the sink
    tokens and the window under a sink-window mask."""
    runs: list[tuple[int, int]] = []
    for j in c.p.mask.cache_rows(c.t if t is None else t):
        if runs and runs[-1][0] + runs[-1][1] == j:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((j, 1))
    return runs


def cached(ops, m, c: Context):
    """The rows of ``m`` the KV cache keeps (see :func:`cache_runs`), stacked in order."""
    parts = [ops.rows(m, first, count) for first, count in cache_runs(c)]
    return parts[0] if len(parts) == 1 else ops.T(ops.hstack([ops.T(part) for part in parts]))


def cache_size(c: Context, t: int | None = None) -> int:
    """How many keys the cache holds when token ``t`` (default the decoded one) is decoded."""
    return len(c.p.mask.cache_rows(c.t if t is None else t))


def decode_cost_rows(c: Context) -> list[list[int]]:
    d_k, d_v = c.d_k, c.d_v
    r = [cache_size(c, t) for t in range(1, c.p.n_q + 1)]
    return [[r[t - 1] * d_k, r[t - 1] * d_v, t * t * d_k, t * t * d_v] for t in range(1, c.p.n_q + 1)]
