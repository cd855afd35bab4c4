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
  cells × d_k at most 100,000 (a quarter of each for JSON or the backward pass);
* RoPE on its fast path (rational queries and keys, a ``base`` or rational angles: see
  :mod:`symattn.exact.rotary`) computes its values in balls and builds only the entries shown:
  the ordinary budgets, an irrational scale included. On the general path, angles whose cosines
  stay transcendental (cos 1/3 beside π/6, or a rotation of symbols) keep every rotated query and
  key, and so every score, a SymPy sum of cos and sin terms, about 13 ms per score and pair of
  components: cells × d_k at most 5,000;
* heads: each costs about 12 ms of its own (its stages, its steps in the solution) however
  small its scores, so at most 4,096 heads (a checkpoint's layer is charged before any head
  is read); in a PDF 256, as pdflatex typesets about three pages a head, some 0.2 s; in a web
  page a quarter, 1,024, as its sections cost about 60 ms a head.

``--max-size N`` raises every budget in proportion (N / 1,000,000), for those
who mean it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import SymattnError

if TYPE_CHECKING:
    from .model import Problem

MAX_SIZE = 1_000_000  # numbers in one problem (all its matrices); --max-size raises it and every budget
BYTES_PER_NUMBER = 64  # the file-size limit is this many bytes per allowed number
SCORE_CELLS = 1_000_000  # rational scale, LaTeX/Markdown/text/PDF, forward pass
SCORE_CELLS_IRRATIONAL = 40_000  # an irrational scale or symbols: the softmax in SymPy expressions
SCORE_WORK_IRRATIONAL = 100_000  # ... and cells × d_k, as the scores' size and variety grow with d_k
ROPE_WORK = 5_000  # cells × d_k with RoPE on its general path, its cosines transcendental
LINEAR_WORK = 1_000_000  # linear attention: cells × d_k × d_v (its table and its state), in rationals
LINEAR_WORK_EXP = 30_000  # ... with elu(x) + 1's powers of e in every entry of both forms
HEADS = 4_096  # heads of one problem: each has a fixed cost of its own
PDF_HEADS = 256  # ... in a PDF, where pdflatex typesets three pages a head (about 0.2 s)
DEARER = 4  # JSON, and the backward pass, each divide the budget by this


def max_values(max_size: int) -> int:
    """The most YAML values (scalars and aliases) a problem file of ``max_size`` numbers may
    hold: every number, a label per number, and room for the other fields."""
    return 2 * max_size + 10_000


def score_cells(p: Problem) -> int:
    """The count of attention scores: n_q × n_k per head."""
    return p.n_q * p.n_k * max(1, len(p.heads))


def _symbolic(p: Problem) -> bool:
    """Whether the softmax is kept in SymPy expressions (an irrational scale, symbols); not with
    RoPE's fast path, which computes it in balls."""
    if p.symbols:
        return True
    if fast_rope(p) or getattr(p, "linear", None) is not None:  # linear attention: no softmax, no scale
        return False
    scales = [p.scale_for(h.d_k) for h in p.heads] if p.projected else [p.scale_value]
    return any(not getattr(s, "is_Rational", False) for s in scales)


def _needed(charges) -> int:
    """The --max-size that admits every ``(used, budget)`` of ``charges``: each budget grows with
    it in proportion, rounded up to a thousand."""
    return max(math.ceil(MAX_SIZE * used / budget / 1000) * 1000 for used, budget in charges)


def fast_rope(p: Problem) -> bool:
    """Whether the problem's RoPE takes the fast path (:mod:`symattn.exact.rotary`): rational
    queries and keys (no symbols, rational inputs) and angles it reads (a base, or given rationals)."""
    from ..numbers.matrices import is_rational

    rope = getattr(p, "rope", None)
    if rope is None or p.symbols:
        return False
    inputs = [p.X, p.context, p.Q, p.K] + [m for h in p.heads for m in (h.W_Q, h.W_K, h.b_Q, h.b_K)]
    if p.positions is not None:
        inputs.append(p.positions.matrix)
    if not all(m is None or is_rational(m) for m in inputs):
        return False
    return all(rope.plain(d) for d in {h.d_k for h in p.heads} or {p.d_k})


def _transcendental_rope(p: Problem) -> bool:
    """Whether the problem's RoPE angles take the general path with cosines SymPy cannot evaluate
    (a rotation of symbols, or of irrational inputs): every score a SymPy sum of cos and sin terms."""
    import sympy

    rope = getattr(p, "rope", None)
    if rope is None or fast_rope(p):
        return False
    if rope.angles is None:
        return True
    return any(sympy.cos(a).has(sympy.cos) or sympy.sin(a).has(sympy.sin) for a in rope.angles)


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
    # (used, budget, what, whether the budget is the softmax kept in SymPy expressions)
    checks = [(cells, SCORE_CELLS_IRRATIONAL if symbolic else SCORE_CELLS, what, symbolic)]
    d_k = _d_k(p)
    if symbolic:
        checks.append((cells * d_k, SCORE_WORK_IRRATIONAL,
                       f"{cells * d_k:,} score terms ({cells:,} attention scores × d_k = {d_k:,})", True))
    if _transcendental_rope(p):
        checks.append((cells * d_k, ROPE_WORK, f"{cells * d_k:,} rotated score terms ({cells:,} attention scores × "
                                               f"d_k = {d_k:,}, with RoPE's cos and sin kept exact)", False))
    linear = getattr(p, "linear", None)
    if linear is not None:
        d_v = max(h.d_v for h in p.heads) if p.projected else p.d_v
        work = cells * d_k * d_v
        checks.append((work, LINEAR_WORK_EXP if linear.feature == "elu1" else LINEAR_WORK,
                       f"{work:,} terms of linear attention's table and state ({cells:,} attention scores × d_k = "
                       f"{d_k:,} × d_v = {d_v:,}" + (", each with powers of e" if linear.feature == "elu1" else "") + ")",
                       False))
    if len(p.heads) > 1:
        pages = {"pdf": " and pages of a PDF", "html": " and sections of a web page"}.get(kind, "")
        allowed = PDF_HEADS if kind == "pdf" else HEADS // DEARER if kind == "html" else HEADS
        checks.append((len(p.heads), allowed, f"{len(p.heads):,} heads, each with stages of its own{pages}", False))
    # the --max-size to suggest admits the problem under every budget, not only the first one it exceeds
    needed = _needed((used, budget // divisor) for used, budget, _, _ in checks)
    for used, budget, what, in_sympy in checks:
        budget //= divisor
        limit = budget * max_size // MAX_SIZE
        if used <= limit:
            continue
        why = ("symbols" if p.symbols else "an irrational scale") if in_sympy else ""
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
    head_limit = HEADS * max_size // MAX_SIZE
    # the --max-size to suggest admits the layer under both budgets
    needed = _needed(((cells, SCORE_CELLS), (heads, HEADS)))
    if heads > head_limit:
        return (f"the layer's {heads:,} heads are more than the {head_limit:,} the size budget allows for any output "
                f"(each head has stages of its own), which keeps a run to about a minute and 2 GiB; list fewer heads, "
                f"or if you mean it, raise the budget with --max-size {needed}")
    if cells <= limit:
        return None
    return (f"the {heads:,} heads make {cells:,} attention scores ({n_q:,} query × {n_k:,} key tokens × {heads:,} "
            f"heads), more than the {limit:,} the size budget allows for any output, which keeps a run to about a "
            f"minute and 2 GiB; if you mean it, raise the budget with --max-size {needed}")
