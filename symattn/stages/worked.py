"""The entries a worked solution works out as dot products: a projection's and a score's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Callable

from .ids import BIASES, K, K_T, Q, S, V
from .kinds import Context, Dot


class Pairs(Sequence):
    """The pairs ``(a_k, b_k)`` of the dot product of row ``i`` of ``a`` and column ``j`` of ``b``,
    each entry read from its matrix when asked for: a worked solution writes the first terms
    and the last of a long sum, and an entry of a rational matrix becomes a SymPy number only
    when read."""

    def __init__(self, a, i: int, b, j: int) -> None:
        self._a, self._i, self._b, self._j = a, i, b, j
        self._n = min(a.cols, b.rows)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k):
        if isinstance(k, slice):
            return tuple(self[x] for x in range(*k.indices(self._n)))
        if not -self._n <= k < self._n:
            raise IndexError("dot product term out of range")
        k %= self._n
        return self._a[self._i, k], self._b[k, self._j]

    def __eq__(self, other) -> bool:
        return isinstance(other, (Pairs, tuple)) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))


def _dot(target: str, i: int, j: int, a, b, left: str, right: str, value) -> Dot:
    """Entry (i, j) of ``target`` as row ``i`` of ``a`` times column ``j`` of ``b``."""
    return Dot(target, i, j, left, right, Pairs(a, i, b, j), value)


def dot_at(key: str, v, result, c: Context, i: int, j: int) -> Dot | None:
    """Entry (i, j) of a projection (Q, K, V) or of the scores worked as a dot product; None for
    any other stage."""
    if key == S:
        rot = "^{\\mathrm{rot}}" if c.rope is not None else ""
        return _dot(S, i, j, v("q_in"), v(K_T), f"q{rot}_{i + 1}", f"k{rot}_{j + 1}", result[i, j])
    if key in (Q, K, V):
        inp = v(c.xq) if key == Q else v(c.kv)
        label = "x" if key == Q or not c.cross else "c"
        dot = _dot(key, i, j, inp, v("W_" + key), f"{label}_{i + 1}", f"W_{key}[:,{j + 1}]",
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
