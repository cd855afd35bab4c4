"""The shape notes of the registry's rows: ``(2×3)·(3×2) → 2×2 (n_q × n_k)`` and the like."""

from __future__ import annotations


def prod(a: tuple[int, int], b: tuple[int, int], note: str) -> str:
    return f"({a[0]}×{a[1]})·({b[0]}×{b[1]}) → {a[0]}×{b[1]} ({note})"


def flip(shape: tuple[int, int]) -> tuple[int, int]:
    return (shape[1], shape[0])


def plain(r: tuple[int, int], note: str) -> str:
    return f"{r[0]}×{r[1]} ({note})"


def is_square(m) -> bool:
    return m is not None and len(m) == len(m[0])
