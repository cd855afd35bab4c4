"""Grouped-query attention: which query heads share each K/V group, and what the KV cache holds."""

from __future__ import annotations


def kv_groups(p) -> list[tuple[int, list[int]]]:
    """``(group, query heads)`` of a grouped-query problem (1-based), in order."""
    size = len(p.heads) // p.kv_heads
    return [(g, list(range((g - 1) * size + 1, g * size + 1))) for g in range(1, p.kv_heads + 1)]


def kv_cache_size(p) -> dict:
    """Numbers the KV cache holds per token per layer: with the problem's K/V heads and without sharing."""
    heads = list(p.heads) if p.projected else []
    g = p.kv_heads or len(heads) or 1
    h = len(heads) or 1
    d_k, d_v = p.d_k, p.d_v
    return {"kv_heads": g, "query_heads": h, "d_k": d_k, "d_v": d_v,
            "per_token": g * (d_k + d_v), "without_sharing": h * (d_k + d_v)}
