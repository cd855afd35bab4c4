"""The worked solution as one self-contained web page: HTML with MathML, no network.

The page holds what the LaTeX solution holds, from the same blocks (:mod:`._blocks`): the
steps as sections with a table of contents, each step's why, shape and matrices, the worked
dot product, the softmax rows with ``m_i`` and ``Z_i``, exact values beside decimals and the
cross-check. Math is MathML (:mod:`._mathml`), which browsers render natively. Matrices are
HTML tables whose cells carry their stage id, row and column (``data-stage``, ``data-row``,
``data-col``, 0-based as in the JSON), so a small inline script can show which entries make
which: pointing at an entry (mouse or keyboard) highlights the rows and columns of its inputs
that made it (the registry's :data:`~symattn.stages.traces.TRACES`) and explains it (the dot product,
the row's ``m_i`` and ``Z_i``, the weighted sum). Without the script the page is complete and
static. The weights are shaded as in the PDF, masked cells hatched, and a heat map of each
softmax step is drawn as inline SVG.

A Content-Security-Policy allows only the page's own style and script (by their hashes) and
no loads at all. User text (the title, tokens) is escaped; it never reaches MathML.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from typing import TYPE_CHECKING, Callable

from .. import stages as registry
from . import prose
from .blocks import Block, Jacobian, Matrix, Normalisers, Tiles, blocks, repeated, symbol_of, symbol_text
from .escape import escape_html
from .grid import MAX_SHOWN, shown
from .options import RenderOptions
from .mathml import mathml
from .numbers import DPS, NEG_INF, tex_decimal, tex
from .matrices import form_tex, normaliser_tex, worked_dot_tex
from .page_style import PAGE_SCRIPT, PAGE_STYLE
from .labels import upright
from .shades import HATCH_LINE, grey, grey_percent, rgb
from .stream import picture, step_anchor, stream_svg
from .entries import entry_forms, jacobian_form, needs_decimals, norm_names, written_exactly

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


def _prose(text: str) -> str:
    """symattn's own sentences: the marked math (⟦…⟧, see :mod:`.prose`) as inline MathML, the rest escaped."""
    return prose.render(text, escape_html, mathml)


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


# The page loads nothing: no fonts, images, frames or connections; only its own style and script.
CSP = (
    "default-src 'none'; style-src '{style}'; script-src '{script}'; img-src 'none'; font-src 'none'; "
    "connect-src 'none'; frame-src 'none'; form-action 'none'; base-uri 'none'"
)


def render_html(
    derivation: Derivation,
    *,
    digits: int | None = None,
    check=None,
    max_shown: int = MAX_SHOWN,
    first: str | None = None,
    last: str | None = None,
    exercise: bool = False,
    ask: frozenset[str] | None = None,
    fragment: bool = False,
) -> str:
    """The worked solution as a web page (or, with ``exercise``, the exercise sheet).

    ``fragment`` gives the part inside ``<body>``, style and script included, for a notebook's
    ``text/html`` display. This is :func:`document` with these options (see
    :class:`~symattn.RenderOptions`; ``fragment`` is ``standalone=False``).
    """
    return document(derivation, RenderOptions(not fragment, digits, check, max_shown, first, last, exercise, ask))


def document(derivation: Derivation, options: RenderOptions) -> str:
    """The worked solution as a web page, or with ``options.standalone`` False the part inside
    ``<body>``, style and script included (a notebook's ``text/html`` display)."""
    d = derivation
    digits, exercise = options.digits or d.problem.digits, options.exercise
    parts = blocks(d, options, split=False, latex=False)
    page = _Page(d, digits, options.max_shown, exercise)
    title = ("Exercise: " if exercise else "") + d.problem.title
    body = page.body(parts)
    main = (
        f'<div class="symattn-page">\n<style>{PAGE_STYLE}</style>\n'
        f"<header><h1>{escape_html(title)}</h1>\n{page.toc()}\n{page.toggle()}</header>\n"
        f"<main>\n{body}\n</main>\n<script>{PAGE_SCRIPT}</script>\n</div>\n"
    )
    if not options.standalone:
        return main
    csp = CSP.format(style=_hash(PAGE_STYLE), script=_hash(PAGE_SCRIPT))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta name="generator" content="symattn">\n'
        f"<title>{escape_html(title)}</title>\n</head>\n<body>\n{main}</body>\n</html>\n"
    )


_SLUG = re.compile(r"[^a-z0-9]+")


class _Page:
    """The body of one page: sections, their table of contents, tables and explanations."""

    def __init__(self, d: Derivation, digits: int, max_shown: int, exercise: bool) -> None:
        self.d, self.digits, self.max_shown, self.exercise = d, digits, max_shown, exercise
        self.sections: list[tuple[str, str]] = []
        self.decimals = False  # whether any exact table carries decimals for the toggle
        self.heatmaps = 0
        self._exact: dict[str, Callable[[int, int], str]] = {}  # by step id: see _exact_tex
        self._decimals: dict[str, Callable[[int, int], str]] = {}

    # -- the page's parts --------------------------------------------------------------------

    def toc(self) -> str:
        items = "\n".join(f'<li><a href="#{id}">{escape_html(text)}</a></li>' for id, text in self.sections)
        return f'<nav class="toc" aria-label="Contents"><h2>Contents</h2>\n<ol>\n{items}\n</ol></nav>'

    def toggle(self) -> str:
        if not self.decimals:
            return ""
        return ('<p class="controls"><button type="button" class="toggle-decimal" aria-pressed="false" hidden>'
                "Show decimals</button></p>")

    def body(self, parts: list[Block]) -> str:
        out: list[str] = []
        open_section = folded = False
        figure = self.stream(parts)
        for block in parts:
            if folded and block.kind in ("section", "step"):
                out.append("</details>")
                folded = False
            if block.kind == "section":
                if figure:  # the picture of the stream, after the opening lines
                    out.append(figure)
                    figure = ""
                if open_section:
                    out.append("</section>")
                id = self._section_id(block.text)
                self.sections.append((id, block.text))
                out.append(f'<section id="{id}" aria-labelledby="{id}-h">\n<h2 id="{id}-h">{escape_html(block.text)}</h2>')
                open_section = True
            elif block.kind == "step":
                anchor = f' id="{step_anchor(block.source.id)}"' if block.source is not None else ""
                out.append(f'<h3{anchor}>{escape_html(block.text)}</h3>\n<p class="why">{_prose(block.extra)}</p>')
                same = repeated(self.d, block.source) if block.source is not None and not self.exercise else None
                if same is not None:  # a matrix shown already: folded away, one click from sight
                    out.append(f'<details class="same"><summary>{_prose(same)} Show it again.</summary>')
                    folded = True
            elif block.kind == "para":
                out.append(f"<p>{_prose(block.text)}</p>")
            else:
                out.append(self.display(block))
        if folded:
            out.append("</details>")
        if open_section:
            out.append("</section>")
        return "\n".join(out)

    def stream(self, parts: list[Block]) -> str:
        """The picture of the residual stream (:mod:`.stream`), its boxes linked to the steps shown; or ""."""
        shown = frozenset(b.source.id for b in parts if b.kind == "step" and b.source is not None)
        pic = picture(self.d, shown)
        return "" if pic is None else stream_svg(pic)

    def _section_id(self, text: str) -> str:
        base = _SLUG.sub("-", text.lower()).strip("-")[:48].strip("-") or "section"
        taken = {id for id, _ in self.sections}
        id, k = base, 2
        while id in taken:
            id, k = f"{base}-{k}", k + 1
        return id

    # -- displays ----------------------------------------------------------------------------

    def display(self, block: Block) -> str:
        source = block.source
        if isinstance(source, tuple):
            inner = "".join(self.matrix(m) for m in source)
            extra = "".join(self.heatmap(m.step) for m in source if self._has_heatmap(m))
            return f'<div class="display">{inner}</div>{extra}'
        if isinstance(source, Normalisers):
            return self.normalisers(source.step)
        if isinstance(source, Jacobian):
            return f'<div class="display">{self.jacobian(source)}</div>'
        if isinstance(source, Tiles):
            return f'<div class="display">{self.tiles(source)}</div>'
        return f'<div class="display">{mathml(block.text, True)}</div>'

    def _has_heatmap(self, m: Matrix) -> bool:
        return m.form == "decimal" and m.step.is_softmax and self.d.can_evaluate

    def matrix(self, m: Matrix) -> str:
        """``lhs`` and the step's matrix as a table, its entries in the form asked for."""
        d, step = self.d, m.step
        rows, cols = step.shape
        cell: Callable[[int, int], str]
        decimal = None
        if m.form == "answer":
            cell = lambda i, j: ""  # noqa: E731
        elif m.form == "decimal":
            value = self._decimal_tex(step)
            cell = lambda i, j: mathml(value(i, j))  # noqa: E731
        else:
            form = self._exact_tex(step)
            cell = lambda i, j: mathml(form(i, j))  # noqa: E731
            if needs_decimals(step) and d.can_evaluate and written_exactly(step):
                value = self._decimal_tex(step)
                decimal = lambda i, j: mathml(value(i, j))  # noqa: E731
                self.decimals = True
        c = registry.Context(d.problem, step.head)
        traces = [] if m.form == "answer" else registry.traces(step.kind_of, c)
        table = _table(
            step, m.form, shown(rows, self.max_shown), shown(cols, self.max_shown), cell, decimal,
            masked=self._masked(step), shade=self._shade(step, m.form), traces=traces,
            explain=None if m.form == "answer" else self._explainer(step), name_of=self._name_of,
        )
        return f'<div class="lhs">{mathml(m.lhs.rstrip(), True)}</div>{table}'

    def _masked(self, step: Step) -> Callable[[int, int], bool]:
        """Whether entry (i, j) is masked: a weight of a masked key, or a −∞ of the mask and the masked scores."""
        if step.is_softmax:
            return lambda i, j: step.softmax[i].is_masked(j)
        if step.kind_of.key in (registry.M, registry.S_MASKED):
            told = getattr(step.lazy, "is_neg_inf", None)  # rotary scores tell it without building an entry
            return told if told is not None else (lambda i, j: step.lazy[i, j] == NEG_INF)
        return lambda i, j: False

    def _shade(self, step: Step, form: str):
        """The grey of each weight, as in the PDF (masked entries are hatched instead)."""
        if form != "decimal" or not step.is_softmax:
            return None
        value = self.d.entry_values(step.id, max(self.digits + 5, DPS))
        return lambda i, j: float(value(i, j))

    def normalisers(self, step: Step) -> str:
        rows = []
        for i in shown(len(step.softmax), self.max_shown):
            if i is None:
                rows.append('<tr><td class="gap" colspan="3">⋮</td></tr>')
                continue
            m, z = normaliser_tex(self.d, step, i, self.digits)
            label = escape_html(step.rows[i])
            rows.append(f'<tr><th scope="row">{label}</th><td>{mathml(m)}</td><td>{mathml(z)}</td></tr>')
        caption = "Each row's maximum and normaliser"
        return (f'<div class="display"><table class="normalisers"><caption>{caption}</caption>'
                f'{"".join(rows)}</table></div>')

    def jacobian(self, source: Jacobian) -> str:
        step, i = source.step, source.row
        row = step.jacobian[i]
        n = len(row.raw)
        idx = shown(n, self.max_shown)
        cells = lambda j, k: mathml(form_tex(jacobian_form(row, i, j, k)))  # noqa: E731
        body = _plain_table(idx, idx, cells, [escape_html(c) for c in step.cols], [escape_html(c) for c in step.cols])
        return f'<div class="lhs">{mathml(source.lhs.rstrip(), True)}</div>{body}'

    def tiles(self, source: Tiles) -> str:
        """One row's online-softmax recurrence as a table: a row per block, from block 0 (the start)."""
        from . import tiles

        w = tiles.worked_row(self.d, source.step, source.row)
        cells = tiles.table_cells(w, self.max_shown)
        idx = shown(len(cells), self.max_shown)
        body = _plain_table(idx, list(range(5)), lambda r, k: mathml(cells[r][k + 1]) if cells[r][k + 1] else "",
                            [escape_html(r[0]) for r in cells], [mathml(h) for h in tiles.HEADINGS_TEX[1:]])
        caption = f"Row {source.row + 1} ({escape_html(source.step.rows[source.row])}), block by block"
        return body.replace('<table class="matrix plain">',
                            f'<table class="matrix plain tiles"><caption>{caption}</caption>', 1)

    def _name_of(self, id: str) -> str:
        """Stage ``id`` as a reader sees it: its symbol with its head's number (``head1.W_Q`` → ``W_Q^(1)``)."""
        if id not in self.d:
            return id
        return symbol_text(self.d.step(id))

    def heatmap(self, step: Step) -> str:
        self.heatmaps += 1
        value = self.d.entry_values(step.id, max(self.digits + 5, DPS))
        return _heatmap(step, value, self.digits, self.max_shown, self.heatmaps)

    # -- what an entry is made of --------------------------------------------------------------

    def _explainer(self, step: Step) -> Callable[[int, int], str] | None:
        """The explanation of entry (i, j) shown when a reader points at it (MathML), or None."""
        d = self.d
        key = step.kind_of.key
        c = registry.Context(d.problem, step.head)
        if step.kind_of.is_given(c):
            return None
        exact = written_exactly(step)
        if step.worked and exact:
            def v(k: str):
                return d.step(registry.resolve(k, c)[0]).value

            result = step.value

            def dot(i: int, j: int) -> str:
                worked = registry.dot_at(key, v, result, c, i, j)
                return mathml(worked_dot_tex(worked, decimals=registry.has_norm(c.p))) if worked is not None else ""

            return dot
        if step.is_softmax and key == registry.A:
            form = self._exact_tex(step)
            value = self._decimal_tex(step) if d.can_evaluate else None
            normalisers = functools.cache(lambda i: "<br>".join(  # the same for every entry of row i
                mathml(t) for t in normaliser_tex(d, step, i, self.digits)))

            def weight(i: int, j: int) -> str:
                (m, z), h = norm_names(step, i + 1), f"^{{({step.head})}}" if step.head is not None else ""
                entry = (f"{step.kind_of.symbol}{h}_{{{i + 1},{j + 1}}} = \\dfrac{{e^{{\\hat{{S}}{h}_{{{i + 1},{j + 1}}} - {m}}}}}"
                         f"{{{z}}}" + (f" = {form(i, j)}" if exact else ""))
                if value is not None:
                    entry += f" \\approx {value(i, j)}"
                return mathml(entry) + "<br>" + normalisers(i)

            return weight
        if key == registry.O and d.can_evaluate:
            return self._weighted(step, c)
        if key in _HATS and d.can_evaluate:
            return self._normalised(step, c)
        return None

    def _normalised(self, step: Step, c: registry.Context) -> Callable[[int, int], str]:
        """Entry (i, k) of a norm's normalised rows from its row's statistics, in decimals:
        x̂_ik = (x_ik − μ_i)/√(σ_i² + ε), or x_ik/√(ms_i + ε) for RMSNorm."""
        inp, norm_of = _HATS[step.kind_of.key]
        d, n = self.d, norm_of(c)
        source, *stats = [d.step(i) for i in registry.input_ids(step.kind_of, c)]
        x, own = self._decimal_tex(source), self._decimal_tex(step)
        mu, spread = (None, self._decimal_tex(stats[0])) if n.rms else (self._decimal_tex(stats[0]),
                                                                         self._decimal_tex(stats[1]))
        hat = step.kind_of.symbol
        s = "\\mathrm{ms}_{%d}" if n.rms else "\\sigma^2_{%d}"
        eps = tex(n.eps)

        def normalised(i: int, k: int) -> str:
            top = f"{inp}_{{{i + 1},{k + 1}}}" + ("" if n.rms else f" - \\mu_{{{i + 1}}}")
            top_value = x(i, k) + ("" if n.rms else f" - ({mu(i, 0)})")
            return mathml(f"{registry.entry_tex(hat, f'{i + 1},{k + 1}')} = \\dfrac{{{top}}}{{\\sqrt{{{s % (i + 1)} + \\varepsilon}}}} "
                          f"\\approx \\dfrac{{{top_value}}}{{\\sqrt{{{spread(i, 0)} + {eps}}}}} \\approx {own(i, k)}")

        return normalised

    def _weighted(self, step: Step, c: registry.Context) -> Callable[[int, int], str]:
        """Entry (i, j) of the output as its weighted sum, in decimals: the first terms and the last."""
        d, digits = self.d, self.digits
        weights = self._decimal_tex(d.step(registry.resolve(registry.A, c)[0]))
        raw = d.entry_values(d.step(registry.resolve(registry.A, c)[0]).id, max(digits + 5, DPS))
        own = self._decimal_tex(step)
        values = d.step(registry.resolve(registry.V, c)[0]).value

        @functools.cache
        def kept(i: int) -> tuple[list[int], bool]:
            """The keys of row i's terms written (its nonzero weights), and whether some are left out."""
            keys = [k for k in range(values.rows) if raw(i, k) != 0]
            return (keys[:3] + keys[-1:], True) if len(keys) > 6 else (keys, False)

        shown = self._decimal_tex(d.step(registry.resolve(registry.V, c)[0])) if registry.has_norm(c.p) else \
            (lambda k, j: tex(values[k, j]))  # a norm's value rows are long: their decimals

        def weighted(i: int, j: int) -> str:
            keys, elided = kept(i)
            terms = [f"{weights(i, k)} \\cdot {shown(k, j)}" for k in keys]
            if elided:
                terms.insert(3, "\\cdots")
            return mathml(f"o_{{{i + 1},{j + 1}}} = \\sum_k A_{{{i + 1},k}}\\, V_{{k,{j + 1}}} \\approx "
                          + " + ".join(terms) + f" \\approx {own(i, j)}")

        return weighted

    def _exact_tex(self, step: Step) -> Callable[[int, int], str]:
        """The LaTeX of each exact entry of ``step``, written once (a table cell and its explanation share it)."""
        if step.id not in self._exact:
            form = entry_forms(self.d, step)
            self._exact[step.id] = functools.cache(lambda i, j: form_tex(form(i, j)))
        return self._exact[step.id]

    def _decimal_tex(self, step: Step) -> Callable[[int, int], str]:
        """The LaTeX of each entry's decimal, rounded once."""
        if step.id not in self._decimals:
            value, digits = self.d.entry_values(step.id, max(self.digits + 5, DPS)), self.digits
            self._decimals[step.id] = functools.cache(lambda i, j: tex_decimal(value(i, j), digits))
        return self._decimals[step.id]


# Each norm's normalised rows: the letter of its input's entries, and the norm (see _Page._normalised).
_HATS: dict[str, tuple[str, Callable[[registry.Context], object]]] = {
    registry.X_HAT: ("x", lambda c: c.norm), registry.R_HAT: ("r", lambda c: c.norm),
    registry.X_EMB_HAT: ("x", lambda c: c.emb_norm), registry.H_HAT: ("h", lambda c: c.mlp.norm),
    registry.Y_HAT: ("r", lambda c: c.mlp.norm), registry.Y_FINAL_HAT: ("y", lambda c: c.logits.norm),
}


def _names(step: Step) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """Row and column labels as HTML, each written when drawn: tokens as text, dimensions as d<sub>1</sub>."""
    def label(axis: str, names) -> Callable[[int], str]:
        if axis in registry.TOKEN_AXES:
            return lambda k: escape_html(names[k])
        return lambda k: _DIMENSION.sub(r"\1<sub>\2</sub>", escape_html(names[k]))

    return label(step.axes[0], step.rows), label(step.axes[1], step.cols)


_DIMENSION = re.compile(r"^([a-z]+)([0-9]+)$")


# How each input entry that makes entry (i, j) is named (the ``how`` of registry.TRACES).
_TRACED = {"row": "row i", "col": "column j", "row_j": "row j", "col_i": "column i", "entry": "entry (i, j)",
           "T": "entry (j, i)", "last": "entry j of the last row"}


def _table(step: Step, form: str, rows, cols, cell, decimal, *, masked, shade, traces, explain, name_of) -> str:
    """A step's matrix as an HTML table with token labels (weights: bracketed, no labels); ``name_of``
    gives a stage id's name as a reader sees it (``head1.W_Q`` → ``W_Q^(1)``)."""
    labelled = step.kind_of.labelled
    row_names, col_names = _names(step)
    trace = " ".join(f"{id}:{how}" for id, how in traces)
    names = ", ".join(f"{_TRACED[how]} of {name_of(id)}" for id, how in traces)
    attrs = [f'class="matrix {form}{"" if labelled else " bracketed"}"', f'data-stage="{escape_html(step.id)}"',
             f'data-form="{form}"']
    if trace:
        attrs.append(f'data-traces="{escape_html(trace)}"')
    label = f"{symbol_text(step)}, {step.shape[0]}×{step.shape[1]}, {'decimals' if form == 'decimal' else form}"
    if trace:
        label += f"; entry (i, j) is made from {names}"
    attrs.append(f'aria-label="{escape_html(label)}"')
    out = [f"<table {' '.join(attrs)}>"]
    if labelled:
        head = "".join('<th scope="col" class="gap">⋯</th>' if j is None else f'<th scope="col">{col_names(j)}</th>'
                       for j in cols)
        out.append(f'<thead><tr><td class="corner"></td>{head}</tr></thead>')
    out.append("<tbody>")
    first = True
    templates = []
    for i in rows:
        cells = []
        if labelled:
            cells.append('<th scope="row" class="gap">⋮</th>' if i is None else f'<th scope="row">{row_names(i)}</th>')
        for j in cols:
            if i is None or j is None:
                gap = "⋱" if i is None and j is None else "⋮" if i is None else "⋯"
                hatched = " masked" if _gap_masked(masked, rows, cols, i, j) else ""  # the row's hatching unbroken
                cells.append(f'<td class="gap{hatched}">{gap}</td>')
                continue
            content = cell(i, j)
            classes = ["entry"]
            if masked(i, j):
                classes.append("masked")
            elif shade is not None:
                classes.append(f"g{grey_percent(shade(i, j))}")
            if decimal is not None:
                content = f'<span class="x">{content}</span><span class="dec">{decimal(i, j)}</span>'
            if form == "answer":
                classes.append("answer")
                content = '<span class="box"></span>'
            focus = ""
            if trace:
                focus = f' tabindex="{0 if first else -1}"'
                first = False
                if explain is not None:
                    text = explain(i, j)
                    if text:
                        templates.append(f'<template data-row="{i}" data-col="{j}">{text}</template>')
            cells.append(f'<td class="{" ".join(classes)}" data-row="{i}" data-col="{j}"{focus}>{content}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    if trace:
        out.append(f'<div class="explain" data-for="{escape_html(step.id)}" aria-live="polite"></div>')
        out += templates
    return "".join(out)


def _gap_masked(masked, rows, cols, i, j) -> bool:
    """Whether every entry a gap cell (⋯, ⋮ or ⋱) stands for is masked: then it is hatched as they are."""
    def hidden(indices):
        k = indices.index(None)
        return range(indices[k - 1] + 1, indices[k + 1])

    return all(masked(r, c) for r in (hidden(rows) if i is None else (i,)) for c in (hidden(cols) if j is None else (j,)))


def _plain_table(rows, cols, cell, row_names, col_names) -> str:
    """A labelled matrix that is not a stage (the softmax Jacobian)."""
    head = "".join('<th scope="col" class="gap">⋯</th>' if j is None else f'<th scope="col">{col_names[j]}</th>'
                   for j in cols)
    body = []
    for i in rows:
        cells = ['<th scope="row" class="gap">⋮</th>' if i is None else f'<th scope="row">{row_names[i]}</th>']
        for j in cols:
            if i is None or j is None:
                cells.append(f'<td class="gap">{"⋱" if i is None and j is None else "⋮" if i is None else "⋯"}</td>')
            else:
                cells.append(f"<td>{cell(i, j)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="matrix plain"><thead><tr><td class="corner"></td>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


_CELL = 46  # px, a heat map cell


def _heatmap(step: Step, value, digits: int, max_shown: int, number: int) -> str:
    """The weights as an inline SVG heat map: the PDF's greys, masked cells hatched, each cell's
    value written in it and in its title (so colour is never the only signal)."""
    rows, cols = shown(step.shape[0], max_shown), shown(step.shape[1], max_shown)
    label_w = 14 + min(8 * max(len(_cut(t)) for t in step.rows), 130)
    top = 14 + min(6 * max(len(_cut(t)) for t in step.cols), 100)
    width, height = label_w + _CELL * len(cols) + 2, top + _CELL * len(rows) + 2
    pattern = f"hatch{number}"
    hatched = "; hatched cells are masked" if any(
        step.softmax[i].is_masked(j) for i in rows if i is not None for j in cols if j is not None) else ""
    out = [
        f'<figure class="heatmap"><svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" aria-labelledby="{pattern}-t">',
        f'<title id="{pattern}-t">Heat map of {escape_html(prose.text_of(_whose(step)[1]))}: darker is a larger weight'
        f'{hatched}</title>',
        f'<defs><pattern id="{pattern}" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        f'<rect width="6" height="6" fill="#fff"/><line x1="0" y1="0" x2="0" y2="6" stroke="{HATCH_LINE}" stroke-width="2"/>'
        "</pattern></defs>",
    ]
    for k, j in enumerate(cols):
        x = label_w + _CELL * k + _CELL / 2
        text = "⋯" if j is None else escape_html(_cut(step.cols[j]))
        if j is None or upright(step.cols[j]):  # a short token turned 45° loses its shape ("I" reads as "\\")
            out.append(f'<text x="{x:g}" y="{top - 6}" class="col up">{text}</text>')
        else:
            out.append(f'<text x="{x:g}" y="{top - 6}" transform="rotate(-45 {x:g} {top - 6})" class="col">{text}</text>')
    for r, i in enumerate(rows):
        y = top + _CELL * r
        text = "⋮" if i is None else escape_html(_cut(step.rows[i]))
        out.append(f'<text x="{label_w - 6}" y="{y + _CELL / 2 + 4:g}" class="row">{text}</text>')
        for k, j in enumerate(cols):
            x = label_w + _CELL * k
            if i is None or j is None:  # a gap: hatched when it stands for masked entries only, as in the table
                if _gap_masked(lambda r, c: step.softmax[r].is_masked(c), rows, cols, i, j):
                    out.append(f'<rect x="{x}" y="{y}" width="{_CELL}" height="{_CELL}" fill="url(#{pattern})" '
                               'stroke="#fff" class="gap"/>')
                continue
            masked = step.softmax[i].is_masked(j)
            w = 0.0 if masked else float(value(i, j))
            shown_value = "masked" if masked else _plain_decimal(value(i, j), digits)
            fill = f"url(#{pattern})" if masked else _grey(w)
            tip = f"row {i + 1} ({step.rows[i]}), column {j + 1} ({step.cols[j]}): {shown_value}"
            out.append(f'<g><title>{escape_html(tip)}</title><rect x="{x}" y="{y}" width="{_CELL}" height="{_CELL}" '
                       f'fill="{fill}" stroke="#fff"/>')
            if not masked:
                out.append(f'<text x="{x + _CELL / 2:g}" y="{y + _CELL / 2 + 4:g}" class="v">'
                           f"{escape_html(_plain_decimal(value(i, j), 2))}</text>")
            out.append("</g>")
    words, symbol = _whose(step)
    out.append(f"</svg><figcaption>{words}{mathml(symbol)} as a heat map: darker is larger"
               f"{'; hatched cells are masked (weight exactly 0)' if hatched else ''}.</figcaption></figure>")
    return "".join(out)


def _whose(step: Step) -> tuple[str, str]:
    """The heat map's subject in words and its symbol as the solution writes it: ("Head 4's weights ",
    "A^{(4)}"), ("The weights ", "a_t")."""
    return ("The weights " if step.head is None else f"Head {step.head}'s weights "), symbol_of(step)


def _cut(text: str, n: int = 16) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _grey(w: float) -> str:
    """The PDF's grey for weight ``w`` (see :mod:`.shades`)."""
    return rgb(grey(w))


def _plain_decimal(x, digits: int) -> str:
    from .numbers import decimal

    return decimal(x, digits)
