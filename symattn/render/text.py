"""Plain text for a terminal: aligned matrices with row labels."""

from __future__ import annotations

import sympy

from ..derivation import Derivation, Step
from ._common import check_sentence, decimal, exp_sum_text, needs_decimals, normaliser_is_number, over_normaliser, stages, text_entry




def _grid(rows: list[str], cols: list[str], cells: list[list[str]], indent: str = "    ") -> list[str]:
    label_w = max(len(r) for r in rows)
    widths = [max(len(c), *(len(row[j]) for row in cells)) for j, c in enumerate(cols)]
    lines = [indent + " " * (label_w + 2) + "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    for label, row in zip(rows, cells):
        lines.append(indent + label.ljust(label_w) + " [" + "  ".join(v.rjust(w) for v, w in zip(row, widths)) + "]")
    return lines


def _cell(step: Step, i: int, j: int) -> str:
    numerator = over_normaliser(step, i, j)
    if numerator is None:
        return text_entry(step.exact[i, j])
    if numerator == 0:
        return "0"
    top = exp_sum_text(numerator)
    return f"({top})/Z_{i + 1}" if len(sympy.Add.make_args(numerator)) > 1 else f"{top}/Z_{i + 1}"


def _exact_cells(step: Step) -> list[list[str]]:
    rows, cols = step.shape
    return [[_cell(step, i, j) for j in range(cols)] for i in range(rows)]


def _normalisers(step: Step, digits: int, subs) -> list[str]:
    lines = []
    for i, row in enumerate(step.softmax):
        if not normaliser_is_number(row):
            line = f"    m_{i + 1} = {text_entry(row.maximum)},  Z_{i + 1} = {exp_sum_text(row.normaliser)}"
            if subs is not None:
                line += f" ≈ {decimal(row.evaluate_normaliser(digits + 5, subs), digits)}"
            lines.append(line)
    return lines


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
            if step.id == "A":
                out.extend(_normalisers(step, digits, d.problem.substitutions))
            if needs_decimals(step) and d.can_evaluate:
                values = d.evaluate(step.id, max(digits + 5, 20))
                out.append("    ≈")
                out.extend(_grid(list(step.rows), list(step.cols), [[decimal(v, digits) for v in row] for row in values]))
            out.append("")
    if check is not None:
        out.append(check_sentence(check))
    return "\n".join(out).rstrip() + "\n"
