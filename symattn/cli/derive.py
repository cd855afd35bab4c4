"""``symattn derive``: a problem's worked solution, written in one format."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .imports import Importing
from .options import WholeRange, Whole, asked_in, backward_option, kinds, max_size_option, output_option, stage_names, \
    stage_name, tiled_option
from .paths import check_outputs, echo, inputs, is_stream, refuse_input, same_file, write_atomic

SUFFIXES = {".tex": "latex", ".md": "markdown", ".markdown": "markdown", ".json": "json", ".txt": "text", ".pdf": "pdf",
            ".html": "html", ".htm": "html"}


@click.command()
@click.argument("problem", required=False, type=click.Path(path_type=Path))  # a folder: one Error line (exit 1)
@output_option("Where to write; the format follows the suffix (.tex, .md, .myst.md, .json, .txt, .pdf, .html). "
               "Default: standard output.")
@click.option("-f", "--format", "fmt", type=click.Choice(["latex", "markdown", "myst", "text", "json", "html"]),
              help="Output format (default: from the suffix of -o; on standard output, text when it is a "
                   "terminal, else latex).")
@click.option("--standalone/--fragment", default=True, show_default=True,
              help="A complete compilable LaTeX document, or only the steps (for \\input); for HTML, a whole page "
                   "or the part to paste into another page (its style and script included).")
@click.option("--digits", type=WholeRange(1, 50), help="Significant digits of the decimal approximations (default: the problem's, else 4).")
@click.option("--check", "check_with", type=click.Choice(["numpy", "torch"]), default="numpy", show_default=True,
              help="Cross-check against NumPy float64; 'torch' also compares every head's weights and output "
                   "with PyTorch's scaled_dot_product_attention (needs pip install 'symattn[torch]').")
@click.option("--no-check", is_flag=True, help="Skip the numeric cross-check.")
@click.option("--max-shown", type=WholeRange(3, 1000), default=8, show_default=True,
              help="Above this many rows or columns a matrix is shown elided: first rows and columns, dots, the last.")
@click.option("--from", "first", metavar="STAGE", callback=lambda ctx, param, value: stage_name(value, "--from"),
              help="Start the worked solution at this stage (its inputs are stated as given).")
@click.option("--to", "last", metavar="STAGE", callback=lambda ctx, param, value: stage_name(value, "--to"),
              help="End the worked solution at this stage.")
@click.option("--exercise", is_flag=True,
              help="Write the exercise sheet instead: the problem with empty boxes for each asked stage "
                   "(LaTeX, Markdown, MyST, PDF or HTML); the normal derivation is its solution, with the same numbering.")
@click.option("--ask", callback=stage_names, metavar="IDS",
              help="With --exercise: the stages to ask for, e.g. Q,S_scaled,A,O (default: every computed stage).")
@max_size_option("The size budget: the most numbers a problem file may hold in all its matrices together; "
                 "the budget for its attention scores (by default 1,000,000 for LaTeX, Markdown and text, "
                 "less for JSON, the backward pass or an irrational scale) grows in proportion.")
@click.option("--plot", type=click.Path(path_type=Path),
              help="Also draw the attention weights as a labelled heat map (.png, .svg or .pdf; needs pip install 'symattn[plot]').")
@backward_option("Also derive the gradients (dO back to dX): the file's backward: section, else its cross-entropy "
                 "(loss:), else the loss L = Σ O.")
@tiled_option("Also derive FlashAttention's online softmax over blocks of B keys (the file's tiling: rows are kept).")
@click.option("--paper", type=click.Choice(["a4", "letter"]),
              help="The page of LaTeX and PDF output (default: letter where the locale's LC_PAPER, LC_ALL or LANG "
                   "names a Letter country such as en_US, else a4).")
@click.option("--decode", type=Whole(), metavar="T",
              help="Also decode token T (from 1) from the KV cache and prove its row equals row T of the full "
                   "causal computation (causal self-attention only; overrides the file's decode:).")
def derive(problem: Path | None, output: Path | None, fmt: str | None, standalone: bool, digits: int | None,
           check_with: str, no_check: bool, max_shown: int, first: str | None, last: str | None,
           exercise: bool, ask: frozenset[str] | None, max_size: int, plot: Path | None, backward: bool,
           tiled: int | None, decode: int | None, paper: str | None) -> None:
    """Derive every stage of attention for PROBLEM exactly.

    PROBLEM is a YAML problem file; without it, symattn derives its built-in
    four-token causal example so you see the whole output at once.

    \b
    Examples:
      symattn derive
      symattn derive problem.yaml -o solution.pdf
      symattn derive problem.yaml -o solution.html
      symattn derive problem.yaml --format json
      symattn derive problem.yaml --from S --to A --format markdown
      symattn derive problem.yaml --exercise --ask Q,S_scaled,A,O -o sheet.pdf
      symattn derive problem.yaml --plot weights.png -o solution.tex
    """
    from .. import errors as _errors

    try:
        check_outputs(output, plot)  # a folder first: it has no format to tell
        kind = output_kind(output, fmt)
        asked = fmt is not None or output is not None or exercise or paper is not None  # else text on a terminal
        hint = terminal_hint(problem) if not asked and _to_terminal() else None
        kind = "text" if hint is not None else kind
        _refuse_options(problem, output, plot, kind, exercise, ask, first, last)
        layout = {"max_shown": max_shown, "first": first, "last": last, "output": output, "plot": plot}
        layout.update(_paper(kind, paper, standalone))
        if exercise:
            layout.update(exercise=True, ask=ask)
        from .progress import Progress

        with Progress(_phases(kind, plot)) as progress:
            d, text = derive_text(problem, kind, standalone, digits, None if no_check else check_with, layout,
                                  max_size, progress, backward, tiled, decode)
            image, data = _draw_and_compile(d, text, kind, output, plot, progress)
        _write(text, data, image, kind, output, plot)
        if hint is not None:
            echo("\n" + hint)
    except _errors.SymattnError as exc:
        raise click.ClickException(str(exc)) from None


def _paper(kind: str, paper: str | None, standalone: bool) -> dict[str, str]:
    """The paper option for LaTeX and PDF (``--paper``, else the locale's); refused for another format."""
    if paper is not None and kind == "latex" and not standalone:
        raise click.UsageError("--paper goes with a whole LaTeX document: a --fragment takes its page from the "
                               "document it is \\input in")
    if kind not in ("latex", "pdf"):
        if paper is not None:
            raise click.UsageError(f"--paper goes with LaTeX or PDF output (--format latex, or -o FILE.tex or "
                                   f"FILE.pdf), not {kind}")
        return {}
    from ..render.paper import paper_from_locale

    return {"paper": paper or paper_from_locale()}


def _to_terminal() -> bool:
    """Whether standard output is a terminal (a person reading, not a pipe or a file)."""
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed
        return False


def terminal_hint(problem: Path | None) -> str:
    """The last line of the text solution shown on a terminal: the commands for the other formats."""
    import shlex

    command = "symattn derive" + ("" if problem is None else " " + shlex.quote(str(problem)))
    return (f"Shown as text because this is a terminal. LaTeX: {command} --format latex; "
            f"PDF: {command} -o solution.pdf; web page: {command} -o solution.html")


def _refuse_options(problem: Path | None, output: Path | None, plot: Path | None, kind: str, exercise: bool,
                    ask: frozenset[str] | None, first: str | None, last: str | None) -> None:
    """The options that cannot go together, and outputs that would overwrite the problem."""
    if ask is not None and not exercise:
        raise click.UsageError("--ask goes with --exercise")
    if exercise and kind in ("text", "json"):
        raise click.UsageError("an exercise sheet is LaTeX, Markdown, MyST, PDF or HTML")
    if first and last and kinds().index(first) > kinds().index(last):
        raise click.UsageError(f"--from {first} comes after --to {last} in the formula")
    for path in (output, plot):
        if path is not None and problem is not None and same_file(path, problem):
            raise click.ClickException(f"{path} is the problem file itself; choose another output path")
    if output is not None and plot is not None and same_file(output, plot):
        raise click.ClickException(f"{plot}: --plot and -o name the same file; choose two paths")


def _phases(kind: str, plot: Path | None) -> list[str]:
    """What the progress display shows, in order."""
    phases = ["reading the problem", "exact stages", "cross-check"]
    if kind == "json":  # written as it is rendered, last
        phases += ["drawing the weights"] if plot is not None else []
        phases += [writing(kind)]
    else:
        phases += [writing(kind)]
        phases += ["compiling the PDF"] if kind == "pdf" else []
        phases += ["drawing the weights"] if plot is not None else []
    return phases


def _draw_and_compile(d, text, kind: str, output: Path | None, plot: Path | None, progress):
    """The heat map's image and the PDF's bytes (None where not asked for); JSON streamed into ``output``."""
    image = data = None
    if plot is not None:
        from ..render.plot import plot_weights

        progress.advance("drawing the weights")
        image = plot_weights(d, plot.suffix.lower())
    if kind == "pdf":
        from ..render.pdf import latex_to_pdf

        progress.advance("compiling the PDF")
        data = latex_to_pdf(text)
    if callable(text) and output is not None:
        progress.advance(writing(kind))
        write_atomic(output, text)  # streamed into the temporary file, renamed when complete
    return image, data


def _write(text, data, image, kind: str, output: Path | None, plot: Path | None) -> None:
    """The solution to ``output`` or standard output, and the heat map to ``plot``."""
    if output is None:
        if callable(text):
            from ..writing import stream

            stream(text, lambda chunk: echo(chunk, nl=False))  # a megabyte per echo, not a piece
        else:
            echo(text, nl=False)
    elif not callable(text):
        write_atomic(output, data if kind == "pdf" else text.encode("utf-8"))
    if image is not None:
        write_atomic(plot, image)


def writing(kind: str) -> str:
    """The progress display's name for the rendering phase."""
    return "writing " + {"latex": "LaTeX", "pdf": "LaTeX", "markdown": "Markdown", "myst": "MyST", "json": "JSON",
                         "html": "HTML"}.get(kind, kind)


def derive_text(problem: Path | None, kind: str, standalone: bool, digits: int | None, check: str | None, layout,
                max_size: int = 1_000_000, progress=None, backward: bool = False, tiled: int | None = None,
                decode: int | None = None):
    """The derivation of ``problem`` (the built-in example without one), cross-checked, and its
    rendering: the text, or for JSON a function that writes it piece by piece."""
    with Importing():  # every import the pipeline makes, so that what they build is frozen once
        from ..reference.crosscheck import crosscheck  # noqa: F401
        from ..render.display import derive as _derive
        from ..problem.load import load_problem  # noqa: F401
        from ..problem.passes import with_backward  # noqa: F401
        from ..render import render

    if progress is None:
        from .progress import Progress

        progress = Progress([], enabled=False)
    advance = progress.advance
    advance("reading the problem")
    p = _read(problem, layout, max_size, backward, tiled, decode, kind)
    advance("exact stages")
    d = _derive(p, on_step=progress.note if progress.enabled else None)
    asked_in(d, layout.get("ask"))
    result = _crosscheck(d, check, advance) if check else None
    fmt = "latex" if kind == "pdf" else kind
    if fmt == "json":  # hundreds of megabytes for a model-sized head: written as it is rendered
        from ..render.json import write_json

        return d, lambda write: write_json(d, write, check=result)
    advance(writing(kind))
    layout = {k: v for k, v in layout.items() if k not in ("output", "plot")}
    return d, render(d, fmt, standalone=standalone or kind == "pdf", digits=digits, check=result, **layout)


def _read(problem: Path | None, layout, max_size: int, backward: bool, tiled: int | None, decode: int | None,
          kind: str):
    """The problem with the passes the options ask for, within its budget."""
    from ..problem.load import load_problem
    from ..problem.passes import with_backward, with_decode, with_tiling

    if problem is None:
        import pkgutil  # the package's own loader reads it: a third of importlib.resources' import time

        source = pkgutil.get_data("symattn", "data/causal_4_tokens.yaml").decode("utf-8")
        p = _builtin(source)
    else:
        with inputs() as read:
            p = load_problem(problem, max_size=max_size)
        for path in (layout.get("output"), layout.get("plot")):
            refuse_input(path, read, "one of the problem's input files")
    if backward:
        p = with_backward(p)
    if tiled is not None:
        p = with_tiling(p, tiled)
    if decode is not None:
        p = with_decode(p, decode)
    if problem is not None:
        from ..problem.budget import check_budget

        check_budget(p, kind, p.backward is not None, max_size, file=str(problem))
    return p


def _crosscheck(d, check: str, advance):
    """The numeric cross-check; a failure is symattn's bug, reported as one."""
    from ..errors import SymattnError
    from ..reference.crosscheck import crosscheck

    advance("cross-check")
    result = crosscheck(d, torch=check == "torch")
    if result.passed is False:
        first = result.all_mismatches[0]
        raise SymattnError(
            f"cross-check failed at {first} ({len(result.all_mismatches)} entries differ); "
            "this is a bug in symattn, please report it with the problem file"
        )
    if result.passed is None:
        click.echo(f"Note: no numeric cross-check: {result.skipped}.", err=True)
    return result


def _builtin(source: str):
    from ..problem.load import parse_problem

    return parse_problem(source, "causal_4_tokens.yaml")


def output_kind(output: Path | None, fmt: str | None) -> str:
    """The format to write: ``--format``, else the suffix of ``-o``, else LaTeX."""
    if fmt is not None:
        if output is not None and output.suffix.lower() == ".pdf" and fmt != "latex":
            raise click.UsageError(f"--format {fmt} cannot be written as a PDF")
        return "pdf" if output is not None and output.suffix.lower() == ".pdf" else fmt
    if output is None:
        return "latex"
    kind = "myst" if output.name.lower().endswith(".myst.md") else SUFFIXES.get(output.suffix.lower())
    if kind is None and is_stream(output):
        return "latex"  # a device or FIFO such as /dev/stdout gets what standard output would
    if kind is None:
        raise click.UsageError(
            f"cannot tell the format from {output.name!r}; use a .tex, .md, .myst.md, .json, .txt, .pdf or .html name, "
            "or give --format"
        )
    return kind
