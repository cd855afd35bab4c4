"""The ``symattn`` command line: a thin layer over the library.

Heavy imports (SymPy, NumPy) happen inside the commands, so ``symattn --help``
starts fast.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import click

VERSION = "0.1.0"  # kept equal to symattn.__version__ by a test


class _Importing:
    """The commands' heavy imports (SymPy, NumPy, flint) with the cyclic garbage collector
    paused, and what they built frozen afterwards.

    They build a few hundred thousand long-lived objects and no garbage, yet their allocations
    would trigger a dozen collections that walk them all, and every collection of the oldest
    generation after them would walk them again: about a tenth of the 4-token demo, and
    0.04 s of a 128-token derivation. Frozen (``gc.freeze``), they are left out of collections
    for the rest of the process; reference counting still frees everything as usual. Only the
    import that loads SymPy does this, once per process.
    """

    def __enter__(self) -> None:
        import gc

        self._first = "sympy" not in sys.modules
        self._was_enabled = gc.isenabled()
        if self._first:
            gc.disable()

    def __exit__(self, *exc) -> None:
        import gc

        if self._first:
            gc.freeze()
            if self._was_enabled:
                gc.enable()


class _WholeText:
    """Click's integer types reading the text with :func:`symattn.text.whole_number`: the digits
    0-9 alone, and no more of them than any count or seed has, checked before the conversion
    (Python's guard on long integers is lifted in :func:`_main`). Click would take '٣' or
    '1_000' and spend seconds on, then print in full, a 100,000-digit argument."""

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            from ..text import LongNumber, excerpt, whole_number

            try:
                number = whole_number(value.strip(" "), signed=True)
            except LongNumber as exc:
                self.fail(str(exc), param, ctx)
            if number is None:
                self.fail(f"{excerpt(value)} is not a whole number", param, ctx)
            value = number
        return super().convert(value, param, ctx)


class _Whole(_WholeText, click.types.IntParamType):
    pass


class _WholeRange(_WholeText, click.IntRange):
    pass


_SUFFIXES = {".tex": "latex", ".md": "markdown", ".markdown": "markdown", ".json": "json", ".txt": "text", ".pdf": "pdf",
             ".html": "html", ".htm": "html"}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="symattn")
@click.option("--debug", is_flag=True, hidden=True, help="Show the traceback of an internal error.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Work out transformer attention exactly, stage by stage.

    softmax(Q Kᵀ / √d_k + M) V with exact numbers (fractions, square roots,
    e^… terms, −∞ for masked positions), a worked solution in LaTeX,
    Markdown, text or JSON, and a numeric cross-check of every stage.
    """
    ctx.obj = {"debug": debug}


def _kinds() -> tuple[str, ...]:
    """The stage names --from, --to and --ask take (with heads they apply to every head)."""
    from ..stages.names import NAMES

    return NAMES


def _stage_name(value: str | None, option: str) -> str | None:
    """A stage name for --from or --to, with a did-you-mean when it is not one."""
    if value is None or value in _kinds():
        return value
    from ..stages.names import unknown_stage

    raise click.BadParameter(unknown_stage(value, _kinds()), param_hint=f"'{option}'")


def _stage_list(ctx, param, value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    kinds = _kinds()
    unknown = [n for n in names if n not in kinds]
    if unknown or not names:
        from ..text import did_you_mean

        hint = did_you_mean(unknown[0], kinds) if unknown else ""
        raise click.BadParameter(f"{', '.join(unknown) or 'nothing'}{hint}: choose from {', '.join(kinds)}")
    return frozenset(names)


@cli.command()
@click.argument("problem", required=False, type=click.Path(path_type=Path))  # a folder: one Error line (exit 1)
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write; the format follows the suffix (.tex, .md, .json, .txt, .pdf, .html). "
                   "Default: standard output.")
@click.option("-f", "--format", "fmt", type=click.Choice(["latex", "markdown", "text", "json", "html"]),
              help="Output format (default: from the suffix of -o, else latex).")
@click.option("--standalone/--fragment", default=True, show_default=True,
              help="A complete compilable LaTeX document, or only the steps (for \\input); for HTML, a whole page "
                   "or the part to paste into another page (its style and script included).")
@click.option("--digits", type=_WholeRange(1, 50), help="Significant digits of the decimal approximations (default: the problem's, else 4).")
@click.option("--check", "check_with", type=click.Choice(["numpy", "torch"]), default="numpy", show_default=True,
              help="Cross-check against NumPy float64; 'torch' also compares every head's weights and output "
                   "with PyTorch's scaled_dot_product_attention (needs pip install 'symattn[torch]').")
@click.option("--no-check", is_flag=True, help="Skip the numeric cross-check.")
@click.option("--max-shown", type=_WholeRange(3, 1000), default=8, show_default=True,
              help="Above this many rows or columns a matrix is shown elided: first rows and columns, dots, the last.")
@click.option("--from", "first", metavar="STAGE", callback=lambda ctx, param, value: _stage_name(value, "--from"),
              help="Start the worked solution at this stage (its inputs are stated as given).")
@click.option("--to", "last", metavar="STAGE", callback=lambda ctx, param, value: _stage_name(value, "--to"),
              help="End the worked solution at this stage.")
@click.option("--exercise", is_flag=True,
              help="Write the exercise sheet instead: the problem with empty boxes for each asked stage "
                   "(LaTeX, Markdown, PDF or HTML); the normal derivation is its solution, with the same numbering.")
@click.option("--ask", callback=_stage_list, metavar="IDS",
              help="With --exercise: the stages to ask for, e.g. Q,S_scaled,A,O (default: every computed stage).")
@click.option("--max-size", type=_WholeRange(min=1), default=1_000_000, show_default=True,
              help="The size budget: the most numbers a problem file may hold in all its matrices together; "
                   "the budget for its attention scores (by default 1,000,000 for LaTeX, Markdown and text, "
                   "less for JSON, the backward pass or an irrational scale) grows in proportion.")
@click.option("--plot", type=click.Path(path_type=Path),
              help="Also draw the attention weights as a labelled heat map (.png, .svg or .pdf; needs pip install 'symattn[plot]').")
@click.option("--backward", is_flag=True,
              help="Also derive the gradients (dO back to dX): the file's backward: section, else the loss L = Σ O.")
@click.option("--tiled", type=_WholeRange(min=1), metavar="B",
              help="Also derive FlashAttention's online softmax over blocks of B keys (the file's tiling: rows are kept).")
@click.option("--decode", type=_Whole(), metavar="T",
              help="Also decode token T (from 1) from the KV cache and prove its row equals row T of the full "
                   "causal computation (causal self-attention only; overrides the file's decode:).")
def derive(problem: Path | None, output: Path | None, fmt: str | None, standalone: bool, digits: int | None,
           check_with: str, no_check: bool, max_shown: int, first: str | None, last: str | None,
           exercise: bool, ask: frozenset[str] | None, max_size: int, plot: Path | None, backward: bool,
           tiled: int | None, decode: int | None) -> None:
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
        _check_outputs(output, plot)  # a folder first: it has no format to tell
        kind = _output_kind(output, fmt)
        if ask is not None and not exercise:
            raise click.UsageError("--ask goes with --exercise")
        if exercise and kind in ("text", "json"):
            raise click.UsageError("an exercise sheet is LaTeX, Markdown, PDF or HTML")
        if first and last and _kinds().index(first) > _kinds().index(last):
            raise click.UsageError(f"--from {first} comes after --to {last} in the formula")
        for path in (output, plot):
            if path is not None and problem is not None and _same_file(path, problem):
                raise click.ClickException(f"{path} is the problem file itself; choose another output path")
        if output is not None and plot is not None and _same_file(output, plot):
            raise click.ClickException(f"{plot}: --plot and -o name the same file; choose two paths")
        layout = {"max_shown": max_shown, "first": first, "last": last, "output": output, "plot": plot}
        if exercise:
            layout.update(exercise=True, ask=ask)
        from .progress import Progress

        phases = ["reading the problem", "exact stages", "cross-check"]
        if kind == "json":  # written as it is rendered, last
            phases += ["drawing the weights"] if plot is not None else []
            phases += [_writing(kind)]
        else:
            phases += [_writing(kind)]
            phases += ["compiling the PDF"] if kind == "pdf" else []
            phases += ["drawing the weights"] if plot is not None else []
        with Progress(phases) as progress:
            d, text = _derive_text(problem, kind, standalone, digits, None if no_check else check_with, layout,
                                   max_size, progress, backward, tiled, decode)
            image = None
            if plot is not None:
                from ..render.plot import plot_weights

                progress.advance("drawing the weights")
                image = plot_weights(d, plot.suffix.lower())
            if kind == "pdf":
                from ..render.pdf import latex_to_pdf

                progress.advance("compiling the PDF")
                data = latex_to_pdf(text)
            if callable(text) and output is not None:
                progress.advance(_writing(kind))
                _write_atomic(output, text)  # streamed into the temporary file, renamed when complete
        if output is None:
            if callable(text):
                from ..writing import stream

                stream(text, lambda chunk: _echo(chunk, nl=False))  # a megabyte per echo, not a piece
            else:
                _echo(text, nl=False)
        elif not callable(text):
            _write_atomic(output, data if kind == "pdf" else text.encode("utf-8"))
        if image is not None:
            _write_atomic(plot, image)
    except _errors.SymattnError as exc:
        raise click.ClickException(str(exc)) from None


def _writing(kind: str) -> str:
    """The progress display's name for the rendering phase."""
    return "writing " + {"latex": "LaTeX", "pdf": "LaTeX", "markdown": "Markdown", "json": "JSON",
                         "html": "HTML"}.get(kind, kind)


def _derive_text(problem: Path | None, kind: str, standalone: bool, digits: int | None, check: str | None, layout,
                 max_size: int = 1_000_000, progress=None, backward: bool = False, tiled: int | None = None,
                 decode: int | None = None):
    with _Importing():
        from ..reference.crosscheck import crosscheck as _cc
        from .. import derive as _derive
        from .. import load_problem
        from ..problem.passes import with_backward, with_decode, with_tiling
        from ..render import render
        from ..errors import SymattnError

    if progress is None:
        from .progress import Progress

        progress = Progress([], enabled=False)
    advance = progress.advance
    advance("reading the problem")
    if problem is None:
        import pkgutil  # the package's own loader reads it: a third of importlib.resources' import time

        source = pkgutil.get_data("symattn", "data/causal_4_tokens.yaml").decode("utf-8")
        p = _builtin(source)
    else:
        with _inputs() as read:
            p = load_problem(problem, max_size=max_size)
        for path in (layout.get("output"), layout.get("plot")):
            _refuse_input(path, read, "one of the problem's input files")
    if backward:
        p = with_backward(p)
    if tiled is not None:
        p = with_tiling(p, tiled)
    if decode is not None:
        p = with_decode(p, decode)
    if problem is not None:
        from ..problem.budget import check_budget

        check_budget(p, kind, p.backward is not None, max_size, file=str(problem))
    advance("exact stages")
    d = _derive(p, on_step=progress.note if progress.enabled else None)
    result = None
    if check:
        advance("cross-check")
        result = _cc(d, torch=check == "torch")
        if result.passed is False:
            first = result.all_mismatches[0]
            raise SymattnError(
                f"cross-check failed at {first} ({len(result.all_mismatches)} entries differ); "
                "this is a bug in symattn, please report it with the problem file"
            )
        if result.passed is None:
            click.echo(f"Note: no numeric cross-check: {result.skipped}.", err=True)
    fmt = "latex" if kind == "pdf" else kind
    if fmt == "json":  # hundreds of megabytes for a model-sized head: written as it is rendered
        from ..render.json import write_json

        return d, lambda write: write_json(d, write, check=result)
    advance(_writing(kind))
    layout = {k: v for k, v in layout.items() if k not in ("output", "plot")}
    return d, render(d, fmt, standalone=standalone or kind == "pdf", digits=digits, check=result, **layout)


_ANSWERS_HELP = """Mark hand calculations in ANSWERS files against PROBLEM, stage by stage.

An answers file maps stage ids to matrices, for any subset of the stages
(Q, K, V, K_T, S, S_scaled, M, S_masked, A, O; head1.A ... with heads;
m_tiled, l_tiled, acc_tiled, O_tiled with tiling: or --tiled B):

\b
    S: [[2, 12], [12, 8]]
    A:
      - [1, 0]
      - [0.8808, 0.1192]          # rounded decimals
    O: [["1/2", "e^(1/2)/(1 + e^(1/2))"], ["-inf", 3]]   # exact

An exact entry must be equal; a decimal is right when it is the exact value
rounded to the places written (half a unit in the last place), or, when every
entry of the stage is what a float32 (or float64) computation prints, as that
computation (--precision). The report says which rule made the entries right.
Each stage is also checked against the same stage computed from your own
earlier answers, allowing the rounding carried in from them (follow-through
marking: one early slip is marked once). A wrong stage is tested against the
common mistakes (no scaling, scaling by d_k, mask missing or applied after the
softmax, softmax over columns, Q·K or K·Qᵀ, a transposed product, a forgotten
rescale in the online softmax, ...); one is
named only when it reproduces your answer and changes the result. Entries are
named as the worked solution names them, counting from 1: S[2,1] is row 2,
column 1.

Exit code 0 when everything is right, 1 otherwise. With several answers
files: one line per file, then a summary per stage for the whole class (how
many right, how many by follow-through, the most common diagnosis); --format
csv gives a spreadsheet, --format json everything.
"""


@cli.command(help=_ANSWERS_HELP)
@click.argument("problem", type=click.Path(path_type=Path))
@click.argument("answers", nargs=-1, required=True, type=click.Path(path_type=Path))  # a folder is reported per file
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "markdown", "latex", "json", "csv"]), default="text",
              show_default=True, help="Report format (csv: one line per answers file).")
@click.option("--tolerance", type=click.FloatRange(min=0), help="Accept any entry within this absolute difference instead of the rounding rules.")
@click.option("--precision", type=click.Choice(["auto", "exact", "float32", "float64"]), default="auto", show_default=True,
              help="Decimals printed from a binary float computation: float32/float64 accept any entry within that "
                   "format's rounding; auto accepts a stage when every entry of it fits one format; exact never does.")
@click.option("--backward", is_flag=True,
              help="Mark gradient stages too (dV, dA, ...): the file's backward: section, else the loss L = Σ O.")
@click.option("--tiled", type=_WholeRange(min=1), metavar="B",
              help="Mark the online softmax's stages too (m_tiled, l_tiled, acc_tiled, O_tiled) over blocks of B keys.")
@click.option("--max-size", type=_WholeRange(min=1), default=1_000_000, show_default=True,
              help="The size budget: the most numbers the problem may hold (the budget for its scores grows with it).")
def check(problem: Path, answers: tuple[Path, ...], fmt: str, tolerance: float | None, precision: str,
          backward: bool, tiled: int | None, max_size: int) -> None:
    with _Importing():
        from .. import check as _check
        from .. import check_class, load_problem
        from .. import derive as _derive
        from ..problem.budget import check_budget
        from ..errors import SymattnError
        from ..problem.passes import with_backward, with_tiling

    try:
        p = load_problem(problem, max_size=max_size)
        if tiled is not None:
            p = with_tiling(p, tiled)
        p = with_backward(p) if backward else p
        check_budget(p, "text", p.backward is not None, max_size, file=str(problem))
        d = _derive(p)
        if len(answers) == 1 and fmt != "csv":
            marking = _check(d, answers[0], precision=precision, tolerance=tolerance)
        else:
            marked = check_class(d, [(str(path), path) for path in answers], precision=precision, tolerance=tolerance)
    except SymattnError as exc:
        raise click.ClickException(str(exc)) from None
    if len(answers) == 1 and fmt != "csv":
        _echo({"text": marking.__str__, "markdown": marking.to_markdown, "latex": marking.to_latex,
               "json": marking.to_json}[fmt](), nl=False)
        click.get_current_context().exit(0 if marking.passed else 1)
    _echo({"json": marked.to_json, "csv": marked.to_csv}.get(fmt, marked.__str__)(), nl=False)
    click.get_current_context().exit(0 if marked.passed else 1)


def _range(ctx, param, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    from ..text import LongNumber, excerpt, whole_number

    parts = value.replace("..", " ").split()
    try:
        ends = [whole_number(x, signed=True) for x in parts]
    except LongNumber as exc:
        raise click.BadParameter(str(exc)) from None
    if len(ends) != 2 or None in ends:
        raise click.BadParameter(f"{excerpt(value)}: write the range as LOW..HIGH, e.g. -2..2")
    lo, hi = ends
    return lo, hi


class _RecordingCommand(click.Command):
    """Keeps the command's own arguments as typed, for the header of the files it writes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["symattn.argv"] = list(args)
        return super().parse_args(ctx, args)


# what --from takes from its problem instead (so giving one of them with --from is refused)
_SHAPE_OPTIONS = ("tokens", "d_model", "d_k", "d_v", "mask", "heads", "cross", "no_scale", "words")


@cli.command(cls=_RecordingCommand)
@click.option("--tokens", type=_Whole(), default=4, show_default=True, help="Number of query tokens n.")
@click.option("--d-model", type=_Whole(), default=4, show_default=True)
@click.option("--d-k", type=_Whole(), default=4, show_default=True, help="Query/key width (a perfect square keeps the scale rational).")
@click.option("--d-v", type=_Whole(), default=4, show_default=True)
@click.option("--mask", default="causal", show_default=True,
              help="none, causal, causal-bottom-right, sliding-window:W or padding:P (the last P keys hidden).")
@click.option("--heads", type=_Whole(), default=1, show_default=True, help="Several heads get W_O.")
@click.option("--cross", "cross", type=_Whole(), metavar="N_K", help="Cross-attention with N_K context tokens.")
@click.option("--no-scale", is_flag=True, help="Write scale: none (no division by √d_k).")
@click.option("--level", type=click.Choice(["easy", "medium", "hard"]), default="easy", show_default=True,
              help="Difficulty: the guarantees of each level are in symattn.generate's documentation.")
@click.option("--range", "range_", callback=_range, metavar="LOW..HIGH", help="Entry range (default by level: 0..1, -1..1, -2..2).")
@click.option("--words", help='Token labels, e.g. "the cat sat down".')
@click.option("--seed", type=_WholeRange(min=0), default=0, show_default=True, help="The same seed always gives the same file.")
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Where to write one problem (default: standard output).")
@click.option("--count", type=_WholeRange(1, 500), help="Write this many variants into --out-dir.")
@click.option("--out-dir", type=click.Path(path_type=Path), help="Folder for --count variants and their index.csv.")
@click.option("--sheets", type=click.Choice(["pdf", "html"]), is_flag=False, flag_value="pdf",
              help="With --count: each variant's exercise and solution as PDF (LaTeX without pdflatex); "
                   "--sheets html writes them as web pages.")
@click.option("--force", is_flag=True, help="With --count: replace files of the same names already in --out-dir (without it they are listed and nothing is written).")
@click.option("--from", "base", type=click.Path(path_type=Path), help="Keep the structure of this problem and draw new numbers.")
@click.option("--vary", type=click.Choice(["weights", "inputs"]), default="weights", show_default=True, help="With --from: what gets new numbers.")
def generate(tokens, d_model, d_k, d_v, mask, heads, cross, no_scale, level, range_, words, seed, output, count,
             out_dir, sheets, force, base, vary) -> None:
    """Write new problems with small, hand-friendly numbers.

    Every problem is checked against its level's guarantees before it is
    written (integer projections and scores within a bound, integer scaled
    scores at easy, halves or thirds at medium, at most two distinct exponents
    per softmax row at easy, no fully masked row, no two variants alike).

    \b
    Examples:
      symattn generate --tokens 4 --d-model 4 --d-k 4 --d-v 4 --mask causal --seed 7 -o p.yaml
      symattn generate --count 30 --out-dir variants/ --sheets
      symattn generate --count 30 --out-dir variants/ --sheets html
      symattn generate --from problem.yaml --vary weights --seed 3
    """
    import shlex

    from ..errors import SymattnError

    try:
        with _Importing():
            from ..generate.batch import check_folder, exercise_files, generate as make, write_exercises
            from ..problem.load import load_problem
        _check_outputs(output)
        if output is not None and base is not None and _same_file(output, base):
            raise click.ClickException(f"{output} is the --from problem itself; choose another output path")
        loaded = None
        if base is not None:
            with _inputs() as read:
                loaded = load_problem(base)
            _refuse_input(output, read, "one of the --from problem's input files")
            for name in exercise_files(count)[:count + 1] if out_dir is not None and count is not None else ():
                _refuse_input(out_dir / name, read, "one of the --from problem's input files", base,
                              "the --from problem itself")
        if base is not None:  # the structure comes from the problem: a shape option would be ignored, so refuse it
            ctx = click.get_current_context()
            given = [f"--{name.replace('_', '-')}" for name in _SHAPE_OPTIONS
                     if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
            if given:
                raise click.UsageError(f"{', '.join(given)} cannot go with --from: the problem's own shape, mask, heads "
                                       "and words are kept (--vary, --level, --range and --seed choose the new numbers)")
        if count is None and (sheets or out_dir or force):
            raise click.UsageError("--out-dir, --sheets and --force go with --count")
        if count is not None and out_dir is None:
            raise click.UsageError("--count needs --out-dir")
        if count is not None and output is not None:
            raise click.UsageError("with --count the files go into --out-dir, not -o")
        for name in exercise_files(count, sheets) if count is not None and base is not None else ():
            if _same_file(out_dir / name, base):
                raise click.ClickException(f"{out_dir / name} is the --from problem itself; choose another --out-dir")
        if count is not None:
            check_folder(out_dir, count, sheets, force)  # files already there: refused before any work
        argv = click.get_current_context().meta.get("symattn.argv", [])
        shape = {} if base is not None else dict(tokens=tokens, d_model=d_model, d_k=d_k, d_v=d_v, mask=mask,
                                                 heads=heads, cross=cross, scale=not no_scale, words=words)
        problems = make(count or 1, seed=seed, level=level, range=range_, base=loaded, vary=vary,
                        numbered=count is not None,
                        command=" ".join(["symattn generate", *(shlex.quote(a) for a in argv)]), **shape)
        if count is None:
            text = problems[0].to_yaml()
            _echo(text, nl=False) if output is None else _write_atomic(output, text.encode("utf-8"))
            return
        write_exercises(problems, out_dir, sheets=sheets, force=force)
    except SymattnError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {count} variants to {out_dir}" + (" with their exercise and solution sheets" if sheets else ""),
               err=True)


def __getattr__(name: str):
    """``with_backward`` and ``with_tiling``, now in :mod:`symattn.problem.passes`, for code that takes them from here."""
    if name in ("with_backward", "with_tiling"):
        from ..problem import passes

        return getattr(passes, name)
    raise AttributeError(f"module 'symattn.cli' has no attribute {name!r}")


def _builtin(source: str):
    from ..problem.load import parse_problem

    return parse_problem(source, "causal_4_tokens.yaml")


def _output_kind(output: Path | None, fmt: str | None) -> str:
    if fmt is not None:
        if output is not None and output.suffix.lower() == ".pdf" and fmt != "latex":
            raise click.UsageError(f"--format {fmt} cannot be written as a PDF")
        return "pdf" if output is not None and output.suffix.lower() == ".pdf" else fmt
    if output is None:
        return "latex"
    kind = _SUFFIXES.get(output.suffix.lower())
    if kind is None and _is_stream(output):
        return "latex"  # a device or FIFO such as /dev/stdout gets what standard output would
    if kind is None:
        raise click.UsageError(
            f"cannot tell the format from {output.name!r}; use a .tex, .md, .json, .txt, .pdf or .html name, "
            "or give --format"
        )
    return kind


_READING: list[str] | None = None  # the files opened while a problem is read (see _inputs)
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    if _READING is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        _READING.append(os.fspath(args[0]))


class _inputs:
    """Records every file opened while a problem is read (the problem and its .csv and .npy
    matrices), so that no output is written over one of them."""

    def __enter__(self) -> list[str]:
        global _READING, _HOOKED
        if not _HOOKED:
            sys.addaudithook(_audit)  # audit hooks stay for the process: one, switched by _READING
            _HOOKED = True
        _READING = []
        return _READING

    def __exit__(self, *exc) -> None:
        global _READING
        _READING = None


def _refuse_input(path: Path | None, read: list[str], what: str, problem: Path | None = None,
                  itself: str = "the problem file itself") -> None:
    if path is None:
        return
    if problem is not None and _same_file(path, problem):
        raise click.ClickException(f"{path} is {itself}; choose another output path")
    for name in dict.fromkeys(read):
        if os.path.isfile(name) and _same_file(path, Path(name)):
            raise click.ClickException(f"{path} is {what} ({name}); choose another output path")


def _is_stream(path: Path) -> bool:
    """Whether ``path`` is a character device or a FIFO (written in place, see symattn.writing)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _check_outputs(*paths: Path | None) -> None:
    """Refuse an output path symattn would not write (a folder, a socket, ...) before any work: one
    ``Error:`` line, as every other bad path gets (see symattn.writing)."""
    from ..writing import check_output

    for path in paths:
        if path is not None:
            check_output(path)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _write_atomic(path: Path, data: "bytes | Callable[[Callable[[str], object]], None]") -> None:
    """Write ``data`` to ``path`` all at once (see symattn.writing): a failure leaves the old file untouched.
    ``data`` is the bytes, or a function that writes the text piece by piece with the ``write`` it is
    given (streamed into the temporary file, which replaces ``path`` only when the last piece is written)."""
    from ..writing import write_file

    write_file(path, data)


def _echo(text: str, nl: bool = True) -> None:
    """Standard output; a full disk is an ``Error:`` line (see symattn.writing)."""
    from ..writing import echo

    echo(text, nl)


class _Terminated(BaseException):
    """SIGTERM arrived: unwind as Ctrl-C does, so temporary files are removed."""


# Python runs a signal's handler between two bytecodes of the main thread, and the exception it
# raises can still be lost: raised inside a finaliser (``Exception ignored in ...``) or caught by a
# library's bare ``except:``. So the first SIGTERM also starts a timer of CPU time (SIGPROF every
# 0.1 CPU second) that raises it again until the process unwinds; CPU time, not a clock, so a busy
# machine changes nothing. The frames that unwind (``main``, ``_stopped``) are never interrupted.
_RAISE_AGAIN_CPU_S = 0.1
_unwinding = False


def _on_sigterm(signum, frame) -> None:
    import signal

    if _unwinding or frame is not None and frame.f_code in (main.__code__, _stopped.__code__):
        return
    if signum == signal.SIGTERM and hasattr(signal, "setitimer"):
        signal.signal(signal.SIGPROF, _on_sigterm)
        signal.setitimer(signal.ITIMER_PROF, _RAISE_AGAIN_CPU_S, _RAISE_AGAIN_CPU_S)
    raise _Terminated()


def _stopped() -> int:
    """The end of a run that SIGTERM stopped: the timer disarmed, temporary files removed, one line."""
    global _unwinding
    import signal

    from .. import writing as _output

    _unwinding = True
    if hasattr(signal, "setitimer"):
        signal.setitimer(signal.ITIMER_PROF, 0)
    _output.cleanup()
    _output.silence_stdout()
    click.echo("Error: stopped by SIGTERM; no output file was left half-written", err=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    """The console script: click's exit codes, and no traceback for a bug either."""
    import signal

    from .. import writing as _output

    args = sys.argv[1:] if argv is None else argv
    # NumPy here only cross-checks (matrices of n×d_k and n×n): one BLAS thread does that in
    # well under a millisecond a product, while a thread pool on a busy machine costs 10-100×
    # more. Read when NumPy is first imported; a user's own setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    global _unwinding
    _unwinding = False
    try:
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        code = _main(args)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _output.silence_stdout()
            return 1
        except OSError as exc:
            _output.silence_stdout()
            click.echo(f"Error: cannot write to standard output: {exc.strerror or exc}", err=True)
            return 1
        return code
    except _Terminated:
        return _stopped()
    finally:
        _output.cleanup()
        if previous is not None:
            if hasattr(signal, "setitimer"):
                signal.setitimer(signal.ITIMER_PROF, 0)  # a SIGTERM's timer, if one came
            signal.signal(signal.SIGTERM, previous)
        if argv is None:
            # The console script's process ends here. Interpreter shutdown would run full
            # collections over every object SymPy and a derivation built (a fifth of the 4-token
            # demo's time) only to hand the memory back to the OS; frozen, they are skipped.
            # Output is flushed and temporary files are gone by now, and atexit handlers still run.
            import gc

            gc.freeze()


def _main(args: list[str]) -> int:
    from .. import writing as _output

    debug = "--debug" in args
    if hasattr(sys, "set_int_max_str_digits"):
        # Exact results are printed in full: a sum of fractions can outgrow Python's 4,300-digit
        # guard, while every input is bounded before any arithmetic (see symattn.numbers.parse).
        sys.set_int_max_str_digits(0)
    try:
        code = cli.main(args=args, prog_name="symattn", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        return 1
    except _output.StdoutError as exc:
        _output.silence_stdout()
        exc.show()
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except BrokenPipeError:
        _output.silence_stdout()
        return 1
    except KeyboardInterrupt:
        return 1
    except Exception as exc:  # an internal error: a short message, never a traceback
        if debug:
            raise
        click.echo(
            f"Error: internal error ({type(exc).__name__}: {exc}). This is a bug in symattn {VERSION}; "
            "please report it with the problem file (run with --debug for the traceback).",
            err=True,
        )
        return 3
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
