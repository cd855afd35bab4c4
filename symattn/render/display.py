"""How a derivation and a step show themselves in a terminal and a notebook.

:class:`Derivation` and :class:`Step` are the exact ones (:mod:`symattn.exact.derivation`) with
these displays; :func:`derive` makes them, and is :func:`symattn.derive`. A derivation shows a
few lines of summary as text (``repr``), its worked solution as Markdown and, in Jupyter,
JupyterLab and VS Code, as the web page; a step shows its matrix in the worked solution's forms
(softmax entries over ``Z_i``, gradients over ``Z_i²``, with the ``m_i``, ``Z_i`` lines), never
raw SymPy nests such as ``1/((e^{-√2} + 1) e^{√2})``.
"""

from __future__ import annotations

from ..exact import derivation as exact
from ..problem.model import Problem
from . import headline, prose
from .blocks import check_sentence
from .matrices import approx_tex_matrix, exact_tex_matrix, normaliser_lines
from .entries import too_long, entry_forms, needs_decimals, row_base, written_exactly
from .escape import escape_markdown
from .text import text_grid, normaliser_text_lines, form_text

SUMMARY_WIDTH = 160  # a summary line is cut to this many characters
NOTEBOOK_SHOWN = 6  # rows or columns a step's matrix shows in a notebook before it is elided


def _cut(line: str) -> str:
    return line if len(line) <= SUMMARY_WIDTH else line[: SUMMARY_WIDTH - 1] + "…"


def _ids(ids: tuple[str, ...], width: int) -> str:
    """The stage ids in ``width`` characters: all, or the first ones, how many more, the last three."""
    everything = ", ".join(ids)
    if len(everything) <= width:
        return everything
    tail = ", ".join(ids[-3:])
    head: list[str] = []
    for k, id in enumerate(ids[:-3]):
        more = f", … ({len(ids) - 3 - k - 1} more), "
        if len(", ".join(head + [id])) + len(more) + len(tail) > width:
            break
        head.append(id)
    return ", ".join(head) + f", … ({len(ids) - 3 - len(head)} more), " + tail


def _dims(d: Derivation) -> str:
    dims = d.dims
    return ", ".join(f"{k} = {v}" for k, v in dims.items() if v is not None)


def summary(d: Derivation) -> str:
    """A few short lines: the title, the sizes, the stages, the cross-check (or how to run it)."""
    p = d.problem
    n_back = sum(1 for s in d.steps if s.kind_of is not None and s.kind_of.gradient)
    passes = f"{len(d.steps) - n_back} forward" + (f" + {n_back} backward" if n_back else "")
    lines = [
        f"<symattn.Derivation: {p.title}>",
        f"  sizes: {_dims(d)}; mask: {prose.plain(p.mask.rule())}",
        f"  stages ({passes}): " + _ids(d.ids, SUMMARY_WIDTH - len(passes) - 12),
    ]
    check = d.last_check
    if check is None:
        lines.append("  cross-check: not run; symattn.crosscheck(d) compares every stage with NumPy")
    else:
        lines.append("  cross-check: " + _verdict(check))
    lines.append("  d.step(id) gives one stage; symattn.render_text(d) the worked solution")
    return "\n".join(_cut(line) for line in lines)


def _verdict(check) -> str:
    if check.passed is None:
        return f"skipped ({check.skipped})"
    if not check.passed:
        return prose.plain(check_sentence(check))
    line = (f"passed; every stage agrees with NumPy float64 to {check.max_abs_error:.1e} "
            f"(tolerance {check.tolerance:.0e})")
    extra = [name for name, part in (("finite differences", check.finite_differences), ("PyTorch", check.torch))
             if part is not None and not part.skipped]
    return line + (f", and with {' and '.join(extra)}" if extra else "")


def derivation_latex(d: Derivation) -> str:
    """Display math for a notebook without Markdown (and nbconvert's LaTeX export): the formula and
    the output, in decimals when they can be evaluated, else exactly."""
    out = d.steps[_output_index(d)]
    if d.can_evaluate:
        matrix = f"{out.kind_of.symbol} \\approx {approx_tex_matrix(d, out, d.problem.digits, NOTEBOOK_SHOWN)}"
    else:
        matrix = f"{out.kind_of.symbol} = {exact_tex_matrix(d, out, NOTEBOOK_SHOWN)}"
    formula = headline.formula(d.problem)
    return f"$$ {formula},\\qquad {matrix} $$"


def _output_index(d: Derivation) -> int:
    """The last forward stage: the layer's output."""
    forward = [k for k, s in enumerate(d.steps) if s.kind_of is None or not s.kind_of.gradient]
    return forward[-1]


# -- one step ---------------------------------------------------------------------------------


def step_repr(step: Step) -> str:
    """One line: id, title, relation, shape."""
    return f"<symattn.Step {step.id}: {step.title}; {step.formula_text} [{step.shape_note}]>"


def step_text(step: Step) -> str:
    """The step as the text worked solution writes it (``print(step)``)."""
    d = step.derivation
    lines = [f"{step.title} ({step.id}): {step.formula_text}   [{prose.plain(step.shape_note)}]",
             prose.plain(step.why)]
    if d is None:
        return "\n".join(lines)
    if not written_exactly(step):
        lines.append(prose.plain(too_long(step)))
    else:
        form = entry_forms(d, step)
        lines += text_grid(step.rows, step.cols, lambda i, j: form_text(form(i, j)), NOTEBOOK_SHOWN, indent="  ")
    if "softmax" in step.shows:
        lines += [line[2:] for line in normaliser_text_lines(step, d.problem.digits, d.problem.substitutions, NOTEBOOK_SHOWN,
                                                                  row_base(d, step))]
    return "\n".join(lines)


def step_latex(step: Step) -> str:
    """Display math: the relation and the matrix as the worked solution writes it, with the rows'
    ``m_i`` and ``Z_i`` beneath for the weights and the output (a step made outside a
    derivation writes its exact entries in full)."""
    d = step.derivation
    if d is None:
        from .matrices import exact_tex_matrix_of_step

        return f"$$ {step.formula} = {exact_tex_matrix_of_step(step, NOTEBOOK_SHOWN)} $$"
    if not written_exactly(step):
        body = f"{step.formula} \\approx {approx_tex_matrix(d, step, d.problem.digits, NOTEBOOK_SHOWN)}"
        return f"$$ {body} $$"
    lines = [f"{step.formula} = {exact_tex_matrix(d, step, NOTEBOOK_SHOWN)}"]
    if "softmax" in step.shows:
        lines += normaliser_lines(d, step, d.problem.digits, NOTEBOOK_SHOWN)
    if len(lines) == 1:
        return f"$$ {lines[0]} $$"
    return "$$ \\begin{gathered} " + " \\\\ ".join(lines) + " \\end{gathered} $$"


def step_markdown(step: Step) -> str:
    """Title, why, the matrix (and its decimals), the shape."""
    from .markdown import markdown_prose

    parts = [f"**{escape_markdown(step.title)}** ({escape_markdown(step.id)}). {markdown_prose(step.why)}", step_latex(step)]
    d = step.derivation
    if d is not None and written_exactly(step) and needs_decimals(step) and d.can_evaluate:
        parts.append(f"$$ {step.kind_of.symbol} \\approx "
                     f"{approx_tex_matrix(d, step, d.problem.digits, NOTEBOOK_SHOWN)} $$")
    parts.append(f"Shape: {markdown_prose(step.shape_note)}.")
    return "\n\n".join(parts)


# -- the classes symattn.derive makes ---------------------------------------------------------


class Step(exact.Step):
    """One stage of the derivation (see :class:`symattn.exact.derivation.Step`), which shows
    itself: ``repr`` one line, ``print`` its entries as the text solution writes them, and in a
    notebook its relation and matrix."""

    @property
    def why_text(self) -> str:
        """The why in plain Unicode (``why`` marks its math ``⟦…⟧``, see :mod:`symattn.render.prose`)."""
        return prose.plain(self.why)

    def __repr__(self) -> str:
        """One line: id, title, relation and shape (``print(step)`` shows its entries)."""
        return step_repr(self)

    def __str__(self) -> str:
        """The step as the text worked solution writes it: entries over ``Z_i``, the ``Z_i`` lines."""
        return step_text(self)

    def _repr_latex_(self) -> str:
        """In a notebook: the step's relation and matrix in the worked solution's forms, as display math."""
        return step_latex(self)

    def _repr_markdown_(self) -> str:
        return step_markdown(self)


class Derivation(exact.Derivation):
    """Every stage of one attention problem, exactly (see :class:`symattn.exact.derivation.Derivation`),
    which shows itself: ``repr`` a few lines, and in a notebook its worked solution."""

    step_class = Step

    def __repr__(self) -> str:
        """A few short lines: title, sizes, the stage ids, the cross-check's result or how to run it."""
        return summary(self)

    def _repr_latex_(self) -> str:
        """Display math for a frontend without Markdown (and nbconvert's LaTeX export): the
        formula and the output."""
        return derivation_latex(self)

    def _repr_markdown_(self) -> str:
        """In a notebook, a derivation shows its whole worked solution."""
        from .markdown import render_markdown

        return render_markdown(self)

    def _repr_html_(self) -> str:
        """The worked solution as the web page draws it (MathML, no MathJax needed): what Jupyter,
        JupyterLab and VS Code show, with the cross-check's result once it has run."""
        from .html import render_html

        return render_html(self, check=self.last_check, fragment=True)


def derive(problem: Problem, *, on_step=None) -> Derivation:
    """Derive every stage of ``softmax(Q Kᵀ·scale + M) V`` exactly (and, with a backward
    section, every gradient): :func:`symattn.exact.derivation.derive`, making a :class:`Derivation`
    that shows itself. ``on_step(id)`` is called after each stage.

    >>> from symattn import load_problem
    >>> d = derive(load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nscale: none\\n"))
    >>> repr(d).splitlines()[0], d.step("A").exact
    ('<symattn.Derivation: Scaled dot-product attention>', Matrix([[1/(exp(-1) + 1), exp(-1)/(exp(-1) + 1)]]))
    """
    return exact.derive(problem, on_step=on_step, cls=Derivation)


__all__ = ["Derivation", "Step", "derivation_latex", "derive", "step_latex", "step_markdown", "step_repr",
           "step_text", "summary"]
