"""The size budget: what a problem may cost before symattn starts the derivation.

Counting numbers alone (``--max-size``, 1,000,000 by default) lets through
problems that run for minutes: 2000 tokens with d = 1 is 6,000 numbers but
4,000,000 scores, each derived, cross-checked and written. So the scores are
budgeted too, per output, from measurements on a 2-core machine (see
``benchmarks/stress_limits.py``, which runs the largest problem each default
accepts): every accepted problem should finish in about a minute and 2 GiB.

* score cells (n_q × n_k, summed over heads): 1,000,000 for LaTeX, Markdown,
  text and PDF; JSON, which writes every entry of every stage exactly, a
  quarter of that; the backward pass a quarter again;
* an irrational scale (d_k not a perfect square) or symbols keep the softmax
  in SymPy expressions, whose cost grows with the count of distinct scores in
  a row and with their size, so with d_k as well: at most 40,000 cells, and
  cells × d_k at most 100,000 (a quarter of each for JSON or the backward pass).

``--max-size N`` raises every budget in proportion (N / 1,000,000), for those
who mean it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ._errors import SymattnError

if TYPE_CHECKING:
    from .problem import Problem

MAX_SIZE = 1_000_000  # numbers in one problem (all its matrices); --max-size raises it and every budget
SCORE_CELLS = 1_000_000  # rational scale, LaTeX/Markdown/text/PDF, forward pass
SCORE_CELLS_IRRATIONAL = 40_000  # an irrational scale or symbols: the softmax in SymPy expressions
SCORE_WORK_IRRATIONAL = 100_000  # ... and cells × d_k, as the scores' size and variety grow with d_k
DEARER = 4  # JSON, and the backward pass, each divide the budget by this


def score_cells(p: Problem) -> int:
    """The count of attention scores: n_q × n_k per head."""
    return p.n_q * p.n_k * max(1, len(p.heads))


def _symbolic(p: Problem) -> bool:
    """Whether the softmax is kept in SymPy expressions (an irrational scale, symbols)."""
    if p.symbols:
        return True
    scales = [p.scale_for(h.d_k) for h in p.heads] if p.projected else [p.scale_value]
    return any(not getattr(s, "is_Rational", False) for s in scales)


def _d_k(p: Problem) -> int:
    return max(h.d_k for h in p.heads) if p.projected else p.d_k


def check_budget(p: Problem, kind: str, backward: bool, max_size: int = MAX_SIZE, file: str | None = None) -> None:
    """Refuse ``p`` when it is beyond the budget for output ``kind`` (``latex``, ``json``, ...)."""
    symbolic = _symbolic(p)
    divisor = 1
    dearer = []
    if kind == "json":
        divisor *= DEARER
        dearer.append("JSON")
    if backward:
        divisor *= DEARER
        dearer.append("the backward pass")
    cells = score_cells(p)
    heads = f" × {len(p.heads)} heads" if len(p.heads) > 1 else ""
    what = f"{cells:,} attention scores ({p.n_q:,} query × {p.n_k:,} key tokens{heads})"
    checks = [(cells, SCORE_CELLS_IRRATIONAL if symbolic else SCORE_CELLS, what)]
    if symbolic:
        d_k = _d_k(p)
        checks.append((cells * d_k, SCORE_WORK_IRRATIONAL, f"{cells * d_k:,} score terms ({cells:,} attention scores × d_k = {d_k:,})"))
    # the --max-size to suggest admits the problem under every budget, not only the first one it exceeds
    needed = max(math.ceil(MAX_SIZE * used / (budget // divisor) / 1000) * 1000 for used, budget, _ in checks)
    for used, budget, what in checks:
        budget //= divisor
        limit = budget * max_size // MAX_SIZE
        if used <= limit:
            continue
        why = "symbols" if p.symbols else "an irrational scale" if symbolic else ""
        terms = ", ".join(([f"{why} (the softmax kept in exact expressions)"] if why else []) + dearer)
        raise SymattnError(
            f"the problem has {what}, more than the {limit:,} the size budget allows"
            + (f" with {terms}" if terms else "")
            + f", which keeps a run to about a minute and 2 GiB; if you mean it, raise the budget with --max-size {needed}",
            file=file,
        )


def layer_refusal(n_q: int, n_k: int, heads: int, max_size: int = MAX_SIZE) -> str | None:
    """Why no output could take ``heads`` heads of n_q × n_k scores, or None: charged for a
    checkpoint's layer before any of its heads is read (a header may claim 10^8 of them). The
    budget charged is the largest any output allows (a rational scale, LaTeX, Markdown, text or
    PDF, the forward pass); :func:`check_budget` charges the output's own once the problem is read."""
    cells = n_q * n_k * heads
    limit = SCORE_CELLS * max_size // MAX_SIZE
    if cells <= limit:
        return None
    needed = math.ceil(MAX_SIZE * cells / SCORE_CELLS / 1000) * 1000
    return (f"the {heads:,} heads make {cells:,} attention scores ({n_q:,} query × {n_k:,} key tokens × {heads:,} "
            f"heads), more than the {limit:,} the size budget allows for any output, which keeps a run to about a "
            f"minute and 2 GiB; if you mean it, raise the budget with --max-size {needed}")
