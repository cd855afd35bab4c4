"""What the worked solution says about the model's head beyond its matrices: the likeliest next
words of each row of P, and where each row's target ranks (shared by every format)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from . import prose
from .numbers import DPS, decimal

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step

TOP_ROWS = 8  # rows whose likeliest words are listed (the last ones, which predict the text's next words)


def _ranked(values: list, floats: list[float], k: int) -> list[int]:
    """The columns of the ``k`` largest values, largest first (ties by column). ``floats`` are the
    values rounded to float64, which keeps their order (rounding is monotone): the k largest
    values are among those whose float is at least the k-th largest float, and only those are
    compared exactly."""
    if not k:
        return []
    threshold = heapq.nlargest(k, floats)[-1]
    candidates = [j for j, f in enumerate(floats) if f >= threshold]
    return sorted(candidates, key=lambda j: (-values[j], j))[:k]


def _rank(row: list, floats: list[float], t: int) -> int:
    """The rank of column ``t`` in ``row`` (1 for the largest; ties by column): a float larger or
    smaller than ``t``'s tells the order, an equal float is compared exactly."""
    f = floats[t]
    return 1 + sum(1 for j, g in enumerate(floats)
                   if g > f or (g == f and (row[j] > row[t] or (row[j] == row[t] and j < t))))


def top_lines(d: "Derivation", step: "Step", digits: int) -> list[str]:
    """One sentence per row of P (the last TOP_ROWS rows): its likeliest words with their
    probabilities, in prose (math marked ⟦…⟧), and the target's rank when the loss has one."""
    p = d.problem
    head, loss = p.logits, p.loss
    k = min(head.top, step.shape[1])
    values = d.evaluate(step.id, max(digits + 5, DPS))
    rows = range(len(values))
    targets = {} if loss is None else dict(zip(loss.rows, loss.targets))
    out = []
    first = max(0, len(values) - TOP_ROWS)
    if first:
        out.append(f"The likeliest next words of the last {TOP_ROWS} rows:")
    for i in rows[first:]:
        row = values[i]
        floats = [float(v) for v in row]
        best = _ranked(row, floats, k)
        words = ", ".join(f"“{prose.literal(head.word(j))}” {decimal(row[j], digits)}" for j in best)
        line = f"After “{prose.literal(step.rows[i])}” (row {i + 1}), the {k} likeliest next words: {words}."
        if i in targets:
            t = targets[i]
            rank = _rank(row, floats, t)
            line += (f" The target “{prose.literal(head.word(t))}” has probability {decimal(row[t], digits)}"
                     f" (rank {rank:,} of {len(row):,}).")
        out.append(line)
    return out
