"""What the worked solution says about the model's head beyond its matrices: the likeliest next
words of each row of P, and where each row's target ranks (shared by every format)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import prose
from .numbers import DPS, decimal

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step

TOP_ROWS = 8  # rows whose likeliest words are listed (the last ones, which predict the text's next words)


def _ranked(values: list, k: int) -> list[int]:
    """The columns of the ``k`` largest values, largest first (ties by column)."""
    return sorted(range(len(values)), key=lambda j: (-values[j], j))[:k]


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
        best = _ranked(row, k)
        words = ", ".join(f"“{prose.literal(head.word(j))}” {decimal(row[j], digits)}" for j in best)
        line = f"After “{prose.literal(step.rows[i])}” (row {i + 1}), the {k} likeliest next words: {words}."
        if i in targets:
            t = targets[i]
            rank = 1 + sum(1 for j in range(len(row)) if row[j] > row[t] or (row[j] == row[t] and j < t))
            line += (f" The target “{prose.literal(head.word(t))}” has probability {decimal(row[t], digits)}"
                     f" (rank {rank:,} of {len(row):,}).")
        out.append(line)
    return out
