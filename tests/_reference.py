"""The tests' own exact arithmetic, shared by the files that check symattn against it.

Entries are read from a problem's YAML text (``yaml.BaseLoader``: every scalar a string)
with :class:`fractions.Fraction`, and matrices are multiplied by hand: nothing here goes
through symattn, SymPy or a binary float.
"""

from __future__ import annotations

from fractions import Fraction


def frac(text: str, values: dict[str, Fraction] | None = None) -> Fraction:
    """``"3"``, ``"-2/5"``, ``"0.25"``, ``"2e-1"`` exactly; a declared symbol takes its value."""
    assert isinstance(text, str), f"BaseLoader should give strings, got {text!r}"
    text = text.strip()
    if values and text in values:
        return values[text]
    if "/" in text:
        num, den = text.split("/")
        return Fraction(num.strip()) / Fraction(den.strip())
    return Fraction(text)


def fmatrix(rows, values: dict[str, Fraction] | None = None) -> list[list[Fraction]]:
    return [[frac(x, values) for x in row] for row in rows]


def fmatmul(a, b):
    assert len(a[0]) == len(b), (len(a[0]), len(b))
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def ftranspose(a):
    return [list(col) for col in zip(*a)]


def allowed_grid(mask, n_q: int, n_k: int) -> list[list[bool]]:
    """The mask rules of the spec, written again from scratch."""
    if mask == "none":
        return [[True] * n_k for _ in range(n_q)]
    if mask == "causal":
        return [[j <= i for j in range(n_k)] for i in range(n_q)]
    if mask == "causal-bottom-right":
        return [[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)]
    if isinstance(mask, dict):
        w = int(mask["sliding-window"])
        return [[j <= i and i - j < w for j in range(n_k)] for i in range(n_q)]
    truth = {"1": True, "true": True, "0": False, "false": False}
    return [[truth[x.strip().lower()] for x in row] for row in mask]
