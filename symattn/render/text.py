"""Plain text for a terminal: aligned matrices with row labels."""

from __future__ import annotations

import sympy

from ..derivation import Derivation, Step
from ._common import NEG_INF, decimal, needs_decimals, stages


def _entry(x: sympy.Expr) -> str:
    return "-inf" if x == NEG_INF else str(x)


def _grid(rows: list[str], cols: list[str], cells: list[list[str]], indent: str = "    ") -> list[str]:
    label_w = max(len(r) for r in rows)
    widths = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(cols)]
    lines = [indent + " " * (label_w + 2) + "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for label, row in zip(rows, cells):
        lines.append(indent + label.ljust(label_w) + " [" + "  ".join(v.rjust(w) for v, w in zip(row, widths)) + "]")
    return lines


def _exact_cells(step: Step) -> list[list[str]]:
    m = step.exact
    return [[_entry(m[i, j]) for j in range(m.cols)] for i in range(m.rows)]


def render_text(derivation: Derivation, *, digits: int | None = None, check=None) -> str:
    """The worked solution as plain text."""
    d = derivation
    digits = digits or d.problem.digits
    out = [d.problem.title, "=" * len(d.problem.title), ""]
    out.append("Attention(Q, K, V) = softmax(Q·Kᵀ / √d_k + M)·V")
    out.append("")
    for stage in stages(d):
        out.append(f"Step {stage.number}: {stage.title}")
        out.append("-" * len(out[-1]))
        for step in stage.steps:
            out.append(f"  {step.title}: {step.formula_text}   [{step.shape_note}]")
            out.append(f"  {step.why}")
            out.extend(_grid(list(step.rows), list(step.cols), _exact_cells(step)))
            if needs_decimals(step):
                values = d.evaluate(step.id, max(digits + 5, 20))
                out.append("    ≈")
                out.extend(_grid(list(step.rows), list(step.cols), [[decimal(v, digits) for v in row] for row in values]))
            out.append("")
    if check is not None:
        out.append(f"Cross-check against NumPy float64: {'passed' if check.passed else 'FAILED'}, "
                   f"largest difference {check.max_abs_error:.1e}")
    return "\n".join(out).rstrip() + "\n"
