"""The entries a worked solution works out as dot products: a projection's and a score's."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .ids import BIASES, K, K_T, Q, S, V
from .kinds import Context, Dot


def _dot(target: str, i: int, j: int, a, b, left: str, right: str, value) -> Dot:
    return Dot(target, i, j, left, right, tuple(zip(list(a), list(b))), value)


def dot_at(key: str, v, result, c: Context, i: int, j: int) -> Dot | None:
    """Entry (i, j) of a projection (Q, K, V) or of the scores worked as a dot product; None for
    any other stage."""
    if key == S:
        rot = "^{\\mathrm{rot}}" if c.rope is not None else ""
        return _dot(S, i, j, v("q_in").row(i), v(K_T).col(j), f"q{rot}_{i + 1}", f"k{rot}_{j + 1}", result[i, j])
    if key in (Q, K, V):
        inp = v(c.xq) if key == Q else v(c.kv)
        label = "x" if key == Q or not c.cross else "c"
        dot = _dot(key, i, j, inp.row(i), v("W_" + key).col(j), f"{label}_{i + 1}", f"W_{key}[:,{j + 1}]",
                   result[i, j])
        bias = BIASES[key]
        return replace(dot, bias=v(bias)[0, j]) if c.has_bias(bias) else dot
    return None


def worked_projection(name: str) -> Callable:
    def worked(v, result, c: Context) -> tuple[Dot, ...]:
        return (dot_at(name, v, result, c, 0, 0),)

    return worked


def worked_score(v, result, c: Context) -> tuple[Dot, ...]:
    return (dot_at(S, v, result, c, 0, 1 if result.cols > 1 else 0),)
