"""The online (tiled) softmax worked row by row, whatever the format: the recurrence table of each
worked query row (block b, the keys it holds, m⁽ᵇ⁾, the rescale factor, ℓ⁽ᵇ⁾, acc⁽ᵇ⁾) and the
exact difference between the tiled output row and row i of A·V.

The rows come again from the exact pass of :mod:`symattn.exact.tiled` on the step's own inputs
(the masked scores and the values), so every format shows the same numbers as the stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from ..exact import tiled as _tiled
from .. import stages as registry
from .grid import shown
from .numbers import MAX_CELL_TERMS, MAX_TERMS, NEG_INF, exp_sum_tex, exp_sum_text, tex, text_entry

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


@dataclass(frozen=True)
class WorkedRow:
    """One query row's pass: its index (0-based), its masked scores, the blocks and the difference
    of its tiled output from row i of A·V (each entry exactly 0 when all is well)."""

    row: int
    scores: tuple[sympy.Expr, ...]
    tiled: _tiled.TiledRow
    difference: tuple[sympy.Expr, ...]


def worked_rows(d: Derivation, step: Step) -> list[int]:
    """The query rows worked block by block (0-based): the problem's ``tiling.rows``, else every row."""
    rows = d.problem.tiling.rows
    return list(rows) if rows is not None else list(range(step.shape[0]))


def shown_rows(d: Derivation, step: Step, max_shown: int) -> list[int | None]:
    """The worked rows drawn (None: a gap), elided as a matrix's rows are."""
    rows = worked_rows(d, step)
    return [None if k is None else rows[k] for k in shown(len(rows), max_shown)]


def worked_row(d: Derivation, step: Step, i: int) -> WorkedRow:
    """Row ``i``'s pass, exactly (computed once per derivation)."""
    cache = d.__dict__.setdefault("_tiles", {})
    key = (step.id, i)
    if key not in cache:
        c = registry.Context(d.problem, step.head)

        def value(name: str):
            return d.step(registry.resolve(name, c)[0])

        masked, values, output = value(registry.S_MASKED).lazy, value(registry.V).lazy, value(registry.O)
        scores = [masked[i, j] for j in range(masked.cols)]
        tiled = _tiled.exact_row(scores, values, d.problem.tiling.block)
        row = output.softmax[i]
        numerators = [row.weighted_numerator([values[k, col] for k in range(values.rows)]) for col in range(values.cols)]
        cache[key] = WorkedRow(i, tuple(scores), tiled, tuple(_tiled.exact_difference(tiled, row.normaliser, numerators)))
    return cache[key]


def every_row_exact(d: Derivation, step: Step) -> bool:
    """Whether every row's tiled output equals its row of A·V exactly (each difference simplifies to 0)."""
    return all(x == 0 for i in range(step.shape[0]) for x in worked_row(d, step, i).difference)


def keys_text(keys: range) -> str:
    """The block's keys counted from 1: ``1, 2``, or ``1 to 4`` for more than two."""
    if len(keys) > 2:
        return f"{keys[0] + 1} to {keys[-1] + 1}"
    return ", ".join(str(j + 1) for j in keys)


def sum_tex(x: sympy.Expr, max_terms: int = MAX_TERMS) -> str:
    """A sum of c·e^x terms, the largest exponent first (any other value as it is)."""
    return exp_sum_tex(x, max_terms) if x.has(sympy.exp) else tex(x)


def sum_text(x: sympy.Expr, max_terms: int = MAX_TERMS) -> str:
    return exp_sum_text(x, max_terms) if x.has(sympy.exp) else text_entry(x)


def _vector_tex(xs, max_shown: int, show=None) -> str:
    show = show or (lambda x: sum_tex(x, MAX_CELL_TERMS))
    parts = ["\\cdots" if k is None else show(xs[k]) for k in shown(len(xs), max_shown)]
    return "\\left(" + ",\\ ".join(parts) + "\\right)"


def vector_text(xs, max_shown: int, show=None) -> str:
    """A row of values as ``(x, y, …, z)``, elided above ``max_shown``."""
    show = show or (lambda x: sum_text(x, MAX_CELL_TERMS))
    return "(" + ", ".join("…" if k is None else show(xs[k]) for k in shown(len(xs), max_shown)) + ")"


HEADINGS_TEX = ("b", "\\text{keys}", "m^{(b)}", "e^{m^{(b-1)} - m^{(b)}}", "\\ell^{(b)}", "\\mathrm{acc}^{(b)}")
HEADINGS_TEXT = ("b", "keys", "m⁽ᵇ⁾", "exp(m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾)", "ℓ⁽ᵇ⁾", "acc⁽ᵇ⁾")  # as the prose writes m⁽⁰⁾


def table_cells(w: WorkedRow, max_shown: int, text: bool = False) -> list[list[str]]:
    """The recurrence table's rows (block 0, the start, first), each a list of six cells in LaTeX
    (``text``: plain text)."""
    show = sum_text if text else sum_tex
    vector = vector_text if text else _vector_tex
    d_v = len(w.tiled.steps[0].acc)
    zero = sympy.Integer(0)
    out = [["0", "", show(NEG_INF), "", "0", vector((zero,) * d_v, max_shown)]]
    for b, t in enumerate(w.tiled.steps, 1):
        factor = "" if t.factor is None else show(t.factor)
        out.append([str(b), keys_text(t.keys), show(t.m), factor, show(t.l), vector(t.acc, max_shown)])
    return out


def table_tex(w: WorkedRow, max_shown: int) -> str:
    """The recurrence table as a LaTeX ``array``."""
    rows = table_cells(w, max_shown)
    lines = [" & ".join(HEADINGS_TEX)] + [" & ".join(r) for r in elided(rows, max_shown, "\\vdots")]
    return ("\\begin{array}{c|c|c|c|c|c} " + lines[0] + " \\\\ \\hline "
            + " \\\\ ".join(lines[1:]) + " \\end{array}")


def elided(rows: list[list[str]], max_shown: int, dots: str) -> list[list[str]]:
    return [[dots] * 6 if k is None else rows[k] for k in shown(len(rows), max_shown)]


def intro(d: Derivation, step: Step, w: WorkedRow, max_shown: int) -> str:
    """The sentence before a row's table (math marked ⟦…⟧; the token passed through prose.literal)."""
    from . import prose

    i = w.row
    token = prose.literal(step.rows[i])
    scores = ", ".join("\\ldots" if k is None else tex(w.scores[k]) for k in shown(len(w.scores), max_shown))
    blocks = "; ".join("…" if k is None else f"keys {keys_text(w.tiled.steps[k].keys)}"
                       for k in shown(len(w.tiled.steps), max_shown))
    rescaled = [str(b) for b, t in enumerate(w.tiled.steps, 1) if t.rescaled]
    why = (f" The maximum grows in block{'s' if len(rescaled) > 1 else ''} {', '.join(rescaled)}, so the sum and the "
           "accumulator so far are multiplied by the factor there." if rescaled else
           " The maximum never grows after the first block that allows a key, so every factor is ⟦1⟧ (or ⟦0⟧ at the start).")
    return (f"Row {i + 1} ({token}): the masked scores ⟦\\hat{{S}}_{{{i + 1}}} = ({scores})⟧ in blocks of "
            f"⟦B = {d.problem.tiling.block}⟧ ({blocks}).{why}")


def output_tex(step: Step, w: WorkedRow, max_shown: int) -> str:
    """``o_i = acc⁽ᴺ⁾/ℓ⁽ᴺ⁾ = (…)`` and the difference from row i of A·V, simplified: ``= (0, 0)``."""
    i, n = w.row + 1, len(w.tiled.steps)
    out = w.tiled.output
    from .matrices import sums_tex

    return (f"o^{{\\text{{tiled}}}}_{{{i}}} = \\frac{{\\mathrm{{acc}}^{{({n})}}}}{{\\ell^{{({n})}}}} = "
            + _vector_tex(out, max_shown, sums_tex))


def difference_tex(w: WorkedRow, max_shown: int) -> str:
    i = w.row + 1
    return (f"o^{{\\text{{tiled}}}}_{{{i}}} - (A\\,V)_{{{i}}} = {_vector_tex(w.difference, max_shown, tex)}"
            f"\\quad\\text{{(exactly)}}")


DIFFERENCE_SENTENCE = (
    "Its difference from row ⟦{i}⟧ of ⟦A\\,V⟧, brought over one denominator and simplified exactly "
    "(⟦e^a e^b = e^{{a+b}}⟧), is ⟦0⟧ in every column:"
)


def as_json(d: Derivation, step: Step, exact, approx) -> list[dict]:
    """Every worked row's recurrence for JSON, 0-based: ``exact(x)`` writes an exact value (SymPy's
    form), ``approx(x)`` its decimal (None when the problem cannot be evaluated)."""
    out = []
    for i in worked_rows(d, step):
        w = worked_row(d, step, i)
        blocks = [{
            "block": b, "keys": list(t.keys),
            "m": exact(t.m), "rescale": None if t.factor is None else exact(t.factor),
            "l": exact(t.l), "acc": [exact(a) for a in t.acc],
            "approx": {"m": approx(t.m), "l": approx(t.l), "acc": [approx(a) for a in t.acc]},
        } for b, t in enumerate(w.tiled.steps)]
        out.append({"row": i, "blocks": blocks, "output": [exact(x) for x in w.tiled.output],
                    "difference": [exact(x) for x in w.difference]})
    return out
