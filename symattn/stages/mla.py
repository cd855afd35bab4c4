"""The rows of multi-head latent attention (``mla:``, DeepSeek-V2/V3).

- the latent: ``c_KV = X·W_DKV`` (n × d_c), the one shared rotated key ``k_R = X·W_KR`` and
  ``k_R_rot = RoPE(k_R)`` (n × d_R), and with W_DQ the query latent ``c_Q = X·W_DQ``; the given
  up-projections W_UK, W_UV, W_UQ (or W_Q) and W_QR, column blocks per head, head 1 first;
- per head: ``q_C``, ``q_R`` and ``q_R_rot``, ``K_C = c_KV·W_UK^(h)``, and the assembled
  ``Q = [q_C ; q_R_rot]``, ``K = [K_C ; k_R_rot]``, ``V = c_KV·W_UV^(h)`` (rows named Q, K, V, so the
  scores, the scaling by 1/√(d_h + d_R), the mask, the softmax and O read them as they are);
- the absorption, per head: ``q_abs = q_C·W_UK^(h)ᵀ`` (n × d_c), the absorbed scores
  ``S_abs = q_abs·c_KVᵀ + q_R_rot·k_R_rotᵀ`` and ``S_abs_diff = S_abs − S``, exactly 0;
- ``mla_cache``: the numbers cached per token, MLA against MHA and GQA of the same widths.

The RoPE of q_R and k_R is ``mla.rope``'s (the top-level ``rope`` is refused beside ``mla``), with
the positions counted from 0 as RoPE's.
"""

from __future__ import annotations

from fractions import Fraction

from .ids import (
    A, C_KV, C_Q, CACHE_KINDS, CACHE_WIDTHS, K_C, K_R, K_R_ROT, KEYS, M, MLA_CACHE, MLA_K, MLA_Q, MLA_V, MLA_W_Q,
    Q_ABS, Q_C, Q_R, Q_R_ROT, QUERIES, S, S_ABS, S_ABS_DIFF, S_MASKED, S_SCALED, V, W_DKV, W_DQ, W_KR, W_QR, W_UK,
    W_UQ, W_UV, X,
)
from .ids import C_KV_NORM, C_Q_NORM, CQ_NORM_MS, KV_NORM_MS, MEAN_SQUARE
from .kinds import Context, Kind, Mistake
from .shapes import plain

ROPE_ON_COMPRESSED = ("MLA's RoPE applied to the compressed part: the rotation turns q_R and the shared k_R only; "
                      "q_C, K_C and the latent c_KV are never rotated (so W_UK can be absorbed into the query)")
BY_D_H = ("scaled by 1/√d_h instead of 1/√(d_h + d_R): each head's query and key are d_h + d_R wide, the "
          "rotated part included")


def latent(c: Context) -> bool:
    """The problem is multi-head latent attention (``mla:``)."""
    return getattr(c.p, "mla", None) is not None


def _mla(c: Context):
    return c.p.mla


def _first(c: Context, width: int) -> int:
    return ((c.head or 1) - 1) * width


def _head_block(ops, v, c: Context, key: str, width: int):
    """Head h's column block of the given weights ``key``."""
    return ops.block(v(key), _first(c, width), width)


def _q_source(c: Context) -> str:
    """What the queries are up-projected from: X, the query latent c_Q, or its norm."""
    m = _mla(c)
    return X if m.W_DQ is None else C_Q_NORM if m.norm_q is not None else C_Q


def _kv(c: Context) -> str:
    """The latent the keys and values are up-projected from: c_KV, or its norm."""
    return C_KV_NORM if _mla(c).norm_kv is not None else C_KV


def _normed(ops, m, ms, norm):
    """RMSNorm of the rows of ``m`` with their mean squares ``ms``: m_ik / √(ms_i + ε), times γ when given."""
    hat = ops.normalise(m, None, ms, norm.eps)
    return hat if norm.weight is None else ops.times_row(hat, ops.given(norm.weight))


def _rotation(c: Context, width: int):
    """RoPE's (θ_i, pairs) for a part ``width`` wide, or None when mla's angles do not fit it."""
    from ..problem.rope import pairs

    rope = _mla(c).rope
    if width % 2 or (rope.angles is not None and len(rope.angles) != width // 2):
        return None
    return rope.thetas(width), pairs(width, rope.pairing)


def _turned(ops, m, c: Context, width: int):
    turn = _rotation(c, width)
    return None if turn is None or m is None else ops.rotate(m, *turn)


def _wrong_q(ops, ex, c: Context):
    """Q with the compressed part rotated too: [RoPE(q_C) ; q_R_rot]."""
    q_c = _turned(ops, ex(Q_C), c, _mla(c).d_h)
    return None if q_c is None else ops.hstack([q_c, ex(Q_R_ROT)])


def _wrong_k(ops, ex, c: Context):
    """K with the compressed part rotated too: [RoPE(K_C) ; k_R_rot]."""
    k_c = _turned(ops, ex(K_C), c, _mla(c).d_h)
    return None if k_c is None else ops.hstack([k_c, ex(K_R_ROT)])


def _wrong_scores(ops, ex, c: Context):
    q, k = _wrong_q(ops, ex, c), _wrong_k(ops, ex, c)
    return None if q is None or k is None else ops.matmul(q, ops.T(k))


def _by_d_h(ops, ex, c: Context):
    return ops.scale(ex(S), c.p.scale_for(_mla(c).d_h)) if c.p.scale == "auto" else None


def _carry(ops, ex, c: Context, scaled, upto: str):
    """A slip in the scaled scores carried through the mask, the softmax and the weighted sum to ``upto``."""
    if scaled is None:
        return None
    out = ops.add_mask(scaled, ex(M))
    if upto == S_MASKED:
        return out
    out = ops.softmax(out)
    return out if upto == A else ops.matmul(out, ex(V))


def carried_mistakes(key: str) -> tuple[Mistake, ...]:
    """mla's two named mistakes in a stage of the usual head (S, S_scaled, S_masked, A, O); None (not
    applicable) without mla."""
    def rope(ops, ex, c):
        if not latent(c):
            return None
        wrong = _wrong_scores(ops, ex, c)
        if key == S or wrong is None:
            return wrong
        scaled = ops.scale(wrong, c.factor)
        return scaled if key == S_SCALED else _carry(ops, ex, c, scaled, key)

    def by_d_h(ops, ex, c):
        if not latent(c):
            return None
        scaled = _by_d_h(ops, ex, c)
        return scaled if key == S_SCALED else _carry(ops, ex, c, scaled, key)

    return (Mistake(ROPE_ON_COMPRESSED, rope),) + ((Mistake(BY_D_H, by_d_h),) if key != S else ())


def cache_rows(c: Context) -> list[tuple[str, int]]:
    """The numbers cached per token: MLA's latent and shared rotated key, then MHA and every GQA of the
    same heads and widths (keys d_h + d_R, values d_v), from h groups down to 1 (MQA)."""
    m = _mla(c)
    width = m.d_h + m.d_R + m.d_v
    rows = [("MLA (latent and rotated key)", m.d_c + m.d_R), (f"MHA ({m.heads} heads)", m.heads * width)]
    for g in range(m.heads - 1, 0, -1):
        if m.heads % g == 0:
            rows.append((f"GQA ({g} groups)" if g > 1 else "MQA (1 group)", g * width))
    return rows


def cache_kinds(p) -> tuple[str, ...]:
    """The row labels of the cache table."""
    return tuple(label for label, _ in cache_rows(Context(p)))


def mla_cache_table(c: Context) -> list[list[int]]:
    """Per row of :func:`cache_rows`: the numbers per token and for the problem's n tokens."""
    return [[size, size * c.p.n_q] for _, size in cache_rows(c)]


def times_smaller(c: Context) -> Fraction:
    """How many times MHA's cache per token is MLA's."""
    rows = cache_rows(c)
    return Fraction(rows[1][1], rows[0][1])


def _cache_why(c: Context) -> str:
    m, rows = _mla(c), cache_rows(c)
    ratio = times_smaller(c)
    ratio_text = str(ratio.numerator) if ratio.denominator == 1 else f"\\tfrac{{{ratio.numerator}}}{{{ratio.denominator}}}"
    return (f"What decoding keeps per token. MLA caches the latent ⟦c_{{KV}}⟧ (⟦d_c = {m.d_c}⟧ numbers) and the "
            f"shared rotated key ⟦k_R⟧ (⟦d_R = {m.d_R}⟧): ⟦{m.d_c} + {m.d_R} = {rows[0][1]}⟧, whatever the number of "
            f"heads. Multi-head attention with the same {m.heads} heads and widths caches every head's key "
            f"(⟦d_h + d_R = {m.d_h + m.d_R}⟧) and value (⟦d_v = {m.d_v}⟧): ⟦{m.heads} \\cdot {m.d_h + m.d_R + m.d_v} "
            f"= {rows[1][1]}⟧: MLA's cache is ⟦{ratio_text}⟧ times smaller; grouped-query attention with ⟦g⟧ K/V groups caches "
            f"⟦g\\,(d_h + d_R + d_v)⟧. The second column is the cache for the problem's ⟦n = {c.p.n_q}⟧ tokens.")


def _latex(x) -> str:
    import sympy

    return sympy.latex(x)


def _d(c: Context) -> str:
    m = _mla(c)
    return f"⟦d_h = {m.d_h}⟧, ⟦d_R = {m.d_R}⟧"


WHY = {
    W_DKV: lambda c: ("The down-projection of the keys and values: each token's ⟦d_{model}⟧ features become "
                      f"⟦d_c = {_mla(c).d_c}⟧ latent numbers, the only part of the keys and values that is cached."),
    C_KV: lambda c: ("The latent ⟦c_{KV} = X\\,W_{DKV}⟧: one row per token, shared by every head. Each head's "
                     "compressed key and its value are up-projected from it; RoPE never touches it."),
    W_KR: lambda c: "The weights of the one rotated key that every head shares (⟦d_R⟧ columns).",
    K_R: lambda c: "⟦k_R = X\\,W_{KR}⟧: the part of the key that carries the position, one for all heads.",
    K_R_ROT: lambda c: ("RoPE turns each row of ⟦k_R⟧ by its position ⟦p⟧ (counted from 0): each pair by ⟦p\\,\\theta_i⟧. "
                        "This rotated key is cached beside ⟦c_{KV}⟧."),
    W_DQ: lambda c: "The down-projection of the queries: their own latent, not cached (only the keys' side is).",
    C_Q: lambda c: "The query latent ⟦c_Q = X\\,W_{DQ}⟧; each head's queries are up-projected from it.",
    KV_NORM_MS: lambda c: ("DeepSeek normalises the latent before it is up-projected (its kv_a_layernorm, an RMSNorm): "
                           "first each row's mean square."),
    C_KV_NORM: lambda c: ("Each latent row divided by ⟦\\sqrt{\\mathrm{ms}_i + \\varepsilon}⟧"
                          + (" and multiplied by ⟦\\gamma⟧" if _mla(c).norm_kv.weight is not None else "")
                          + f" (⟦\\varepsilon = {_latex(_mla(c).norm_kv.eps)}⟧). This is the latent the heads' keys and "
                          "values, and the absorbed scores, read."),
    CQ_NORM_MS: lambda c: "The query latent is normalised too (q_a_layernorm): each row's mean square.",
    C_Q_NORM: lambda c: ("Each query-latent row divided by ⟦\\sqrt{\\mathrm{ms}_i + \\varepsilon}⟧"
                         + (" and multiplied by ⟦\\gamma⟧" if _mla(c).norm_q.weight is not None else "")
                         + f" (⟦\\varepsilon = {_latex(_mla(c).norm_q.eps)}⟧); the heads' queries are up-projected from it."),
    W_UK: lambda c: "The up-projection of the keys: head ⟦h⟧'s block of ⟦d_h⟧ columns (head 1 first) turns the latent into its compressed key.",
    W_UV: lambda c: "The up-projection of the values: head ⟦h⟧'s block of ⟦d_v⟧ columns turns the latent into its value.",
    W_UQ: lambda c: "The up-projection of the query latent: head ⟦h⟧'s block of ⟦d_h⟧ columns.",
    MLA_W_Q: lambda c: "The query weights of the compressed part: head ⟦h⟧'s block of ⟦d_h⟧ columns.",
    W_QR: lambda c: "The weights of each head's rotated query: head ⟦h⟧'s block of ⟦d_R⟧ columns.",
    Q_C: lambda c: "This head's compressed query ⟦q_C⟧, from its block of columns; it is not rotated.",
    Q_R: lambda c: "This head's query part that carries the position, ⟦q_R⟧, from its block of columns.",
    Q_R_ROT: lambda c: "RoPE turns ⟦q_R⟧ as it turned ⟦k_R⟧: row ⟦p⟧ by ⟦p\\,\\theta_i⟧, so the scores see relative positions.",
    K_C: lambda c: "This head's compressed key ⟦K_C = c_{KV}\\,W_{UK}^{(h)}⟧, rebuilt from the latent (never rotated).",
    MLA_Q: lambda c: (f"The head's query is its compressed and its rotated part side by side: {_d(c)}, so "
                      f"⟦{_mla(c).d_h + _mla(c).d_R}⟧ columns."),
    MLA_K: lambda c: ("The head's key: its own compressed key beside the one rotated key ⟦k_R^{rot}⟧ that every head "
                      "shares. The scores are then ⟦Q K^{\\top}⟧ as usual, scaled by ⟦1/\\sqrt{d_h + d_R}⟧."),
    MLA_V: lambda c: "The head's value ⟦V = c_{KV}\\,W_{UV}^{(h)}⟧, from the same latent.",
    Q_ABS: lambda c: ("The absorption: ⟦q_C \\cdot (W_{UK} c_j) = (W_{UK}^{\\top} q_C) \\cdot c_j⟧, so each query row is "
                      "taken into the latent space once, ⟦q_{abs} = q_C\\,(W_{UK}^{(h)})^{\\top}⟧ (⟦d_c⟧ columns), and the "
                      "keys never need rebuilding from the cache."),
    S_ABS: lambda c: ("The scores straight from the cache: ⟦q_{abs}\\,c_{KV}^{\\top} + q_R^{rot}\\,(k_R^{rot})^{\\top}⟧. This "
                      "works only because ⟦K_C⟧ is not rotated: a rotation between ⟦W_{UK}⟧ and ⟦c_j⟧ would depend on "
                      "the position and could not be absorbed."),
    S_ABS_DIFF: lambda c: ("The absorbed scores minus the scores of the assembled ⟦Q⟧ and ⟦K⟧: exactly ⟦0⟧ in every "
                           "entry, only the brackets of ⟦q_C\\,(W_{UK}^{(h)})^{\\top} c_j⟧ moved."),
    MLA_CACHE: _cache_why,
}


def _given(key, name, order, section, title, formula, axes, source, when=latent) -> Kind:
    return Kind(key, name, order, section, title, WHY[key], formula, axes,
                lambda sh, r, c: plain(r, "given"), source=source, when=when, labelled=False)


def _kind(key, name, order, section, title, formula, axes, note, inputs, relation, **kw) -> Kind:
    return Kind(key, name, order, section, title, WHY[key], formula, axes, lambda sh, r, c: plain(r, note),
                inputs=inputs, relation=relation, when=kw.pop("when", latent), per_head=kw.pop("per_head", True), **kw)


def _with_dq(c: Context) -> bool:
    return latent(c) and _mla(c).W_DQ is not None


def _with_norm_kv(c: Context) -> bool:
    return latent(c) and _mla(c).norm_kv is not None


def _with_norm_q(c: Context) -> bool:
    return latent(c) and _mla(c).norm_q is not None


def latent_rows() -> tuple[Kind, ...]:
    """The layer-wide rows: the given weights, the latent, the shared rotated key and the query latent."""
    return (
        _given(W_DKV, W_DKV, 2.71, "mla_latent", "Down-projection of the keys and values", ("W_{DKV}", "W_DKV"),
               ("d", "c"), lambda c: _mla(c).W_DKV),
        # c_KV = X·W_DKV  (n × d_c)
        _kind(C_KV, C_KV, 2.72, "mla_latent", "The latent: what is cached", ("c_{KV} = X\\,W_{DKV}", "c_KV = X·W_DKV"),
              (KEYS, "c"), "n × d_c", (X, W_DKV), lambda ops, v, c: ops.matmul(v(X), v(W_DKV)), per_head=False,
              tex="c_{KV}", mistakes=(Mistake(ROPE_ON_COMPRESSED, lambda ops, ex, c: _turned(
                  ops, ops.matmul(ex(X), ex(W_DKV)), c, _mla(c).d_c)),)),
        _given(W_KR, W_KR, 2.73, "mla_latent", "Weights of the shared rotated key", ("W_{KR}", "W_KR"), ("d", "r"),
               lambda c: _mla(c).W_KR),
        # k_R = X·W_KR  (n × d_R)
        _kind(K_R, K_R, 2.74, "mla_latent", "The shared key part", ("k_R = X\\,W_{KR}", "k_R = X·W_KR"), (KEYS, "r"),
              "n × d_R", (X, W_KR), lambda ops, v, c: ops.matmul(v(X), v(W_KR)), per_head=False, tex="k_R"),
        # k_R_rot = RoPE(k_R), row p turned by p·θ  (n × d_R)
        _kind(K_R_ROT, K_R_ROT, 2.75, "mla_latent", "Rotate the shared key",
              ("k_R^{rot} = \\operatorname{RoPE}(k_R)", "k_R_rot = RoPE(k_R), row p turned by p·θ_i"), (KEYS, "r"),
              "n × d_R", (K_R,), lambda ops, v, c: ops.rotate(v(K_R), *_rotation(c, _mla(c).d_R)), per_head=False,
              tex="k_R^{rot}", mistakes=(Mistake("positions counted from 1: the first token was turned by θ_i, but "
                                                 "RoPE counts positions from 0", lambda ops, ex, c: ops.rotate(
                                                     ex(K_R), *_rotation(c, _mla(c).d_R), offset=1)),)),
        _given(W_DQ, W_DQ, 2.76, "mla_latent", "Down-projection of the queries", ("W_{DQ}", "W_DQ"), ("d", "c"),
               lambda c: _mla(c).W_DQ, when=_with_dq),
        # c_Q = X·W_DQ  (n × d_cq)
        _kind(C_Q, C_Q, 2.77, "mla_latent", "The query latent", ("c_Q = X\\,W_{DQ}", "c_Q = X·W_DQ"), (QUERIES, "c"),
              "n × d_cq", (X, W_DQ), lambda ops, v, c: ops.matmul(v(X), v(W_DQ)), per_head=False, when=_with_dq,
              tex="c_Q"),
        # kv_norm_ms = mean of each c_KV row's squares  (n × 1); c_KV_norm = c_KV / √(ms + ε) ∘ γ  (n × d_c)
        _kind(KV_NORM_MS, KV_NORM_MS, 2.721, "mla_latent", "Mean square of each latent row",
              ("\\mathrm{ms}_i = \\tfrac{1}{d_c} \\sum_k c_{ik}^2", "ms_i = mean_k c_KV[i,k]²"), (KEYS, MEAN_SQUARE),
              "n × 1", (C_KV,), lambda ops, v, c: ops.row_spread(v(C_KV), None), per_head=False, when=_with_norm_kv,
              tex="\\mathrm{ms}_{KV}"),
        _kind(C_KV_NORM, C_KV_NORM, 2.722, "mla_latent", "The latent normalised (RMSNorm)",
              ("c_{KV}^{norm} = c_{KV} / \\sqrt{\\mathrm{ms} + \\varepsilon} \\circ \\gamma", "c_KV_norm = c_KV / √(ms + ε) ∘ γ"),
              (KEYS, "c"), "n × d_c", (C_KV, KV_NORM_MS),
              lambda ops, v, c: _normed(ops, v(C_KV), v(KV_NORM_MS), _mla(c).norm_kv), per_head=False,
              when=_with_norm_kv, tex="c_{KV}^{norm}"),
        # with norm_q: cq_norm_ms  (n × 1); c_Q_norm = c_Q / √(ms + ε) ∘ γ  (n × d_cq)
        _kind(CQ_NORM_MS, CQ_NORM_MS, 2.771, "mla_latent", "Mean square of each query-latent row",
              ("\\mathrm{ms}_i = \\tfrac{1}{d_{cq}} \\sum_k (c_Q)_{ik}^2", "ms_i = mean_k c_Q[i,k]²"),
              (QUERIES, MEAN_SQUARE), "n × 1", (C_Q,), lambda ops, v, c: ops.row_spread(v(C_Q), None), per_head=False,
              when=_with_norm_q, tex="\\mathrm{ms}_{Q}"),
        _kind(C_Q_NORM, C_Q_NORM, 2.772, "mla_latent", "The query latent normalised (RMSNorm)",
              ("c_Q^{norm} = c_Q / \\sqrt{\\mathrm{ms} + \\varepsilon} \\circ \\gamma", "c_Q_norm = c_Q / √(ms + ε) ∘ γ"),
              (QUERIES, "c"), "n × d_cq", (C_Q, CQ_NORM_MS),
              lambda ops, v, c: _normed(ops, v(C_Q), v(CQ_NORM_MS), _mla(c).norm_q), per_head=False,
              when=_with_norm_q, tex="c_Q^{norm}"),
        _given(W_UK, W_UK, 2.81, "mla_weights", "Up-projection of the keys", ("W_{UK}", "W_UK"), ("c", "k"),
               lambda c: _mla(c).W_UK),
        _given(W_UV, W_UV, 2.82, "mla_weights", "Up-projection of the values", ("W_{UV}", "W_UV"), ("c", "v"),
               lambda c: _mla(c).W_UV),
        _given(W_UQ, W_UQ, 2.83, "mla_weights", "Up-projection of the queries", ("W_{UQ}", "W_UQ"), ("c", "q"),
               lambda c: _mla(c).W_UQ, when=_with_dq),
        _given(MLA_W_Q, "W_Q", 3, "mla_weights", "Query weights (compressed part)", ("W_Q", "W_Q"), ("d", "q"),
               lambda c: _mla(c).W_Q, when=lambda c: latent(c) and _mla(c).W_Q is not None),
        _given(W_QR, W_QR, 3.01, "mla_weights", "Weights of the rotated queries", ("W_{QR}", "W_QR"), ("d", "r"),
               lambda c: _mla(c).W_QR),
    )


def head_rows() -> tuple[Kind, ...]:
    """Each head's queries, keys and values, assembled from the latent and the shared key."""
    def q_up(ops, v, c):
        return ops.matmul(v(_q_source(c)), _head_block(ops, v, c, W_UQ if _mla(c).W_DQ is not None else MLA_W_Q,
                                                       _mla(c).d_h))

    def q_inputs(c):
        return (_q_source(c), W_UQ) if _mla(c).W_DQ is not None else (X, MLA_W_Q)

    return (
        # q_C = X·W_Q^(h) or c_Q·W_UQ^(h)  (n × d_h)
        _kind(Q_C, Q_C, 4.1, "mla_heads", "The compressed query",
              lambda c: ("q_C = c_Q\\,W_{UQ}^{(h)}", "q_C = c_Q·W_UQ^(h)") if _mla(c).W_DQ is not None
              else ("q_C = X\\,W_Q^{(h)}", "q_C = X·W_Q^(h)"), (QUERIES, "q"), "n × d_h", q_inputs, q_up,
              tex="q_C", mistakes=(Mistake(ROPE_ON_COMPRESSED, lambda ops, ex, c: _turned(ops, ex(Q_C), c,
                                                                                           _mla(c).d_h)),)),
        # q_R = X·W_QR^(h) or c_Q·W_QR^(h)  (n × d_R)
        _kind(Q_R, Q_R, 4.2, "mla_heads", "The query part to rotate",
              lambda c: ("q_R = c_Q\\,W_{QR}^{(h)}", "q_R = c_Q·W_QR^(h)") if _mla(c).W_DQ is not None
              else ("q_R = X\\,W_{QR}^{(h)}", "q_R = X·W_QR^(h)"), (QUERIES, "r"), "n × d_R",
              lambda c: (_q_source(c), W_QR),
              lambda ops, v, c: ops.matmul(v(_q_source(c)), _head_block(ops, v, c, W_QR, _mla(c).d_R)), tex="q_R"),
        # q_R_rot = RoPE(q_R)  (n × d_R)
        _kind(Q_R_ROT, Q_R_ROT, 4.3, "mla_heads", "Rotate the query part",
              ("q_R^{rot} = \\operatorname{RoPE}(q_R)", "q_R_rot = RoPE(q_R), row p turned by p·θ_i"), (QUERIES, "r"),
              "n × d_R", (Q_R,), lambda ops, v, c: ops.rotate(v(Q_R), *_rotation(c, _mla(c).d_R)), tex="q_R^{rot}"),
        # K_C = c_KV·W_UK^(h)  (n × d_h)
        _kind(K_C, K_C, 6.1, "mla_heads", "The compressed key", ("K_C = c_{KV}\\,W_{UK}^{(h)}", "K_C = c_KV·W_UK^(h)"),
              (KEYS, "k"), "n × d_h", lambda c: (_kv(c), W_UK),
              lambda ops, v, c: ops.matmul(v(_kv(c)), _head_block(ops, v, c, W_UK, _mla(c).d_h)), tex="K_C",
              mistakes=(Mistake(ROPE_ON_COMPRESSED, lambda ops, ex, c: _turned(ops, ex(K_C), c, _mla(c).d_h)),)),
        # Q = [q_C ; q_R_rot]  (n × (d_h + d_R))
        _kind(MLA_Q, "Q", 8.1, "mla_heads", "The head's queries", ("Q = [\\,q_C \\;;\\; q_R^{rot}\\,]",
                                                                    "Q = [q_C ; q_R_rot]"),
              (QUERIES, "q"), "n × (d_h + d_R)", (Q_C, Q_R_ROT), lambda ops, v, c: ops.hstack([v(Q_C), v(Q_R_ROT)]),
              mistakes=(Mistake(ROPE_ON_COMPRESSED, _wrong_q),)),
        # K = [K_C ; k_R_rot]  (n × (d_h + d_R))
        _kind(MLA_K, "K", 8.2, "mla_heads", "The head's keys", ("K = [\\,K_C \\;;\\; k_R^{rot}\\,]",
                                                                 "K = [K_C ; k_R_rot]"),
              (KEYS, "k"), "n × (d_h + d_R)", (K_C, K_R_ROT), lambda ops, v, c: ops.hstack([v(K_C), v(K_R_ROT)]),
              mistakes=(Mistake(ROPE_ON_COMPRESSED, _wrong_k),)),
        # V = c_KV·W_UV^(h)  (n × d_v)
        _kind(MLA_V, "V", 8.25, "mla_heads", "The head's values", ("V = c_{KV}\\,W_{UV}^{(h)}", "V = c_KV·W_UV^(h)"),
              (KEYS, "v"), "n × d_v", lambda c: (_kv(c), W_UV),
              lambda ops, v, c: ops.matmul(v(_kv(c)), _head_block(ops, v, c, W_UV, _mla(c).d_v))),
    )


def absorbed_rows() -> tuple[Kind, ...]:
    """Per head, after O: the absorbed query, the scores from the cache, and their difference from S."""
    return (
        # q_abs = q_C·W_UK^(h)ᵀ  (n × d_c)
        _kind(Q_ABS, Q_ABS, 15.31, "absorb", "Absorb W_UK into the query",
              ("q_{abs} = q_C\\,(W_{UK}^{(h)})^{\\top}", "q_abs = q_C·W_UK^(h)ᵀ"), (QUERIES, "c"), "n × d_c",
              (Q_C, W_UK), lambda ops, v, c: ops.matmul(v(Q_C), ops.T(_head_block(ops, v, c, W_UK, _mla(c).d_h))),
              tex="q_{abs}"),
        # S_abs = q_abs·c_KVᵀ + q_R_rot·k_R_rotᵀ  (n × n)
        _kind(S_ABS, S_ABS, 15.32, "absorb", "The scores from the cache",
              ("S_{abs} = q_{abs}\\,c_{KV}^{\\top} + q_R^{rot}\\,(k_R^{rot})^{\\top}", "S_abs = q_abs·c_KVᵀ + q_R_rot·k_R_rotᵀ"),
              (QUERIES, KEYS), "n_q × n_k", lambda c: (Q_ABS, _kv(c), Q_R_ROT, K_R_ROT),
              lambda ops, v, c: ops.sum([ops.matmul(v(Q_ABS), ops.T(v(_kv(c)))), ops.matmul(v(Q_R_ROT), ops.T(v(K_R_ROT)))]),
              tex="S_{abs}"),
        # S_abs − S  (n × n, exactly 0)
        _kind(S_ABS_DIFF, S_ABS_DIFF, 15.33, "absorb", "The same scores as the assembled keys",
              ("S_{abs} - S", "S_abs − S"), (QUERIES, KEYS), "n_q × n_k, exactly 0", (S_ABS, S),
              lambda ops, v, c: ops.difference(v(S_ABS), v(S)), tex="S_{abs} - S"),
    )


def cache_row() -> Kind:
    """The cache per token: MLA against MHA and GQA of the same widths (layer-wide)."""
    return _kind(MLA_CACHE, MLA_CACHE, 15.35, "mla_cache", "The cache per token: MLA against MHA and GQA",
                 ("\\text{cache}", "cache per token: MLA d_c + d_R, MHA h·(d_h + d_R + d_v), GQA g·(d_h + d_R + d_v)"),
                 (CACHE_KINDS, CACHE_WIDTHS), "one row per kind of attention: numbers cached per token, and for n tokens",
                 (), lambda ops, v, c: ops.table(mla_cache_table(c)), per_head=False, tex="\\text{cache}")

