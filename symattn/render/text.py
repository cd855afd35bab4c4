"""Plain text for a terminal: aligned matrices with row labels."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import sympy

from .. import stages as registry
from ..text import show_bidi
from . import headline, prose
from .head import top_lines
from .blocks import JACOBIAN_ENTRY, check_sentence, step_why, symbol_text
from .grid import MAX_SHOWN, shown
from .numbers import DPS, MAX_CELL_TERMS, MAX_TERMS, decimal, exp_parts_text, exp_sum_text, text_entry, value_text
from .options import RenderOptions
from .entries import (
    too_long,
    EntryForm,
    Over,
    entry_forms,
    jacobian_form,
    jacobian_row,
    needs_decimals,
    normaliser_is_number,
    quotient,
    row_base,
    written_exactly,
)
from .outline import select, stages
from .rope import rope_text

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


def text_grid(row_labels, col_labels, cell: Callable[[int, int], str], max_shown: int, indent: str = "    ",
              corner: str = "") -> list[str]:
    """The matrix as aligned text: row labels (headed ``corner``), column labels, elided above ``max_shown``."""
    rows, cols = shown(len(row_labels), max_shown), shown(len(col_labels), max_shown)
    labels = ["⋮" if i is None else show_bidi(row_labels[i]) for i in rows]  # shown before they are measured
    heads = ["…" if j is None else show_bidi(col_labels[j]) for j in cols]
    cells = [["⋱" if i is None and j is None else "⋮" if i is None else "…" if j is None else cell(i, j)
              for j in cols] for i in rows]
    label_w = max(len(corner), *(len(r) for r in labels))
    widths = [max(len(h), *(len(row[k]) for row in cells)) for k, h in enumerate(heads)]
    lines = [indent + corner.ljust(label_w + 2) + "  ".join(h.rjust(w) for h, w in zip(heads, widths))]
    for label, row in zip(labels, cells):
        lines.append(indent + label.ljust(label_w) + " [" + "  ".join(v.rjust(w) for v, w in zip(row, widths)) + "]")
    return lines


def form_text(form: EntryForm) -> str:
    """Plain text of an entry written as ``form``: ``x/Z_1``, ``(x + y)/Z_1²``, ``x/Z2_1`` (head 2)."""
    if form.heads:
        terms = [("-" if over.negative else "") + _over_text(over, form.wide) for over in form.over]
        if form.value is not None:
            terms.insert(0, value_text(form.value))
        return " + ".join(terms).replace("+ -", "- ")
    if form.sums:
        split = quotient(form.value)
        if split is not None:
            top, bottom = (_sum_text(x) if not x.is_Add else f"({_sum_text(x)})" for x in split)
            return f"{top}/{bottom}"
        return _sum_text(form.value)
    if not form.over:
        return value_text(form.value)
    return _over_text(form.over[0], form.wide)


def _sum_text(x) -> str:
    return exp_sum_text(x) if x.has(sympy.exp) else value_text(x)


def _over_text(over: Over, wide: bool) -> str:
    max_terms = MAX_CELL_TERMS if wide else MAX_TERMS
    top = exp_parts_text(list(over.numerator), max_terms) if over.parts else exp_sum_text(over.numerator, max_terms)
    if over.head is not None:
        z = f"Z{registry.head_sup(over.head)}_{over.row + 1}"
        z = f"({z})²" if over.squared else z
    else:
        z = f"Z_{over.row + 1}" + ("²" if over.squared else "")
    # a top that is a sum or holds a fraction is bracketed: (1/4)/Z_3, not 1/4/Z_3
    return f"({top})/{z}" if over.terms > 1 or "/" in top else f"{top}/{z}"


def normaliser_text_lines(step: Step, digits: int, subs, max_shown: int, base: int = 1) -> list[str]:
    """Each softmax row's m and Z, numbered from ``base`` (the decoded token's t in a decoding step)."""
    lines = []
    h = registry.head_sup(step.head) if step.head is not None else ""
    for i in shown(len(step.softmax), max_shown):
        if i is None:
            lines.append("    ⋮")
            continue
        row, r = step.softmax[i], i + base
        if not normaliser_is_number(row) and not written_exactly(step):  # too long to write: decimals
            dps = max(digits + 5, DPS)
            lines.append(f"    m{h}_{r} ≈ {decimal(row.maximum_value(dps), digits)},  "
                         f"Z{h}_{r} ≈ {decimal(row.evaluate_normaliser(dps), digits)}")
        elif not normaliser_is_number(row):
            z = exp_parts_text(row.numerator_parts()) if row.rational else exp_sum_text(row.normaliser)
            line = f"    m{h}_{r} = {text_entry(row.maximum)},  Z{h}_{r} = {z}"
            if subs is not None:
                line += f" ≈ {decimal(row.evaluate_normaliser(max(digits + 5, DPS), subs), digits)}"
            lines.append(line)
    return lines


def _jacobian(step: Step, max_shown: int) -> list[str]:
    i = jacobian_row(step)
    row = step.jacobian[i]
    head = (f"    Softmax Jacobian of row {i + 1} ({prose.literal(step.rows[i])}): "
            f"⟦J = \\operatorname{{diag}}(a) - a\\,a^{{\\top}}⟧, {JACOBIAN_ENTRY}; "
            f"⟦d\\hat{{S}}_{{{i + 1}}} = J\\,dA_{{{i + 1}}}⟧")
    return [prose.plain(head)] + text_grid(step.cols, step.cols, lambda j, k: form_text(jacobian_form(row, i, j, k)), max_shown)


def _tiles(d: Derivation, step: Step, max_shown: int) -> list[str]:
    """The online softmax row by row: each worked row's recurrence table, output and difference from A·V."""
    from . import tiles

    out = ["", prose.plain("  Row by row, block by block (from ⟦m^{(0)} = -\\infty⟧, ⟦\\ell^{(0)} = 0⟧, "
                           "⟦\\mathrm{acc}^{(0)} = 0⟧):")]
    for i in tiles.shown_rows(d, step, max_shown):
        if i is None:
            out.append("    ⋮ (the rows in between are worked the same way)")
            continue
        w = tiles.worked_row(d, step, i)
        out.append("  " + prose.plain(tiles.intro(d, step, w, max_shown)))
        cells = tiles.elided(tiles.table_cells(w, max_shown, text=True), max_shown, "⋮")
        # the rows (blocks) elided as a matrix's are; the five columns always shown
        out.extend(text_grid([r[0] for r in cells], list(tiles.HEADINGS_TEXT[1:]), lambda r, k: cells[r][k + 1],
                         max(len(cells), 5), corner=tiles.HEADINGS_TEXT[0]))
        output = tiles.vector_text(w.tiled.output, max_shown, lambda x: form_text(EntryForm(x, sums=True)))
        out.append(f"    o_tiled[{i + 1}] = acc/ℓ = {output}")
        out.append(f"    o_tiled[{i + 1}] − (A·V)[{i + 1}] = {tiles.vector_text(w.difference, max_shown, value_text)}"
                   "   exactly (brought over one denominator and simplified)")
    if tiles.every_row_exact(d, step):
        o = d.step(registry.resolve(registry.O, registry.Context(d.problem, step.head))[0])
        out.append(f"  Every row, worked here or not, comes out the same: {symbol_text(step)} − "
                   f"{symbol_text(o)} = 0 exactly.")
    return out


def render_text(
    derivation: Derivation,
    *,
    digits: int | None = None,
    check=None,
    max_shown: int = MAX_SHOWN,
    first: str | None = None,
    last: str | None = None,
) -> str:
    """The worked solution as plain text: :func:`document` with these options (see
    :class:`~symattn.RenderOptions`)."""
    return document(derivation, RenderOptions(digits=digits, check=check, max_shown=max_shown, first=first, last=last))


def document(derivation: Derivation, options: RenderOptions) -> str:
    """The worked solution as plain text."""
    d = derivation
    digits, max_shown = options.digits or d.problem.digits, options.max_shown
    chosen = {s.id for s in select(d, options.first, options.last)}
    title = show_bidi(d.problem.title)
    out = [title, "=" * len(title), ""]
    out.append(headline.formula(d.problem, tex=False))
    out.append("")
    for stage in stages(d):
        steps = [s for s in stage.steps if s.id in chosen]
        if not steps:
            continue
        head = f"Head {stage.head} · " if stage.head else ""
        out.append(f"{head}Step {stage.number}: {stage.title}")
        out.append("-" * len(out[-1]))
        for step in steps:
            out.append(f"  {step.title} ({symbol_text(step)}): {step.formula_text}   [{step.shape_note}]")
            out.append(f"  {prose.plain(step_why(d, step))}")
            if written_exactly(step):
                form = entry_forms(d, step)
                out.extend(text_grid(step.rows, step.cols, lambda i, j: form_text(form(i, j)), max_shown))
            else:
                out.append("  " + prose.plain(too_long(step)))
            out.extend(rope_text(d, step))
            if "softmax" in step.shows:
                out.extend(normaliser_text_lines(step, digits, d.problem.substitutions, max_shown, row_base(d, step)))
            if "jacobian" in step.shows:
                out.extend(_jacobian(step, max_shown))
            if needs_decimals(step) and d.can_evaluate:
                value = d.entry_values(step.id, max(digits + 5, DPS))
                out.append("    ≈")
                out.extend(text_grid(step.rows, step.cols, lambda i, j: decimal(value(i, j), digits), max_shown))
            if "tiles" in step.shows:
                out.extend(_tiles(d, step, max_shown))
            if "top" in step.shows and d.can_evaluate:
                out.extend("  " + prose.plain(line) for line in top_lines(d, step, digits))
            out.append("")
    if options.check is not None:
        out.append(prose.plain(check_sentence(options.check)))
    # a bidirectional control in a token or the title is shown, never obeyed (symattn writes none)
    return show_bidi("\n".join(out).rstrip() + "\n")
