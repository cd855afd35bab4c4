"""``symattn check``: hand calculations marked against a problem, one answers file or a class's."""

from __future__ import annotations

from pathlib import Path

import click

from .imports import Importing
from .options import WholeRange, backward_option, max_size_option, output_option, stage_list, tiled_option
from .paths import check_outputs, echo, inputs, refuse_input, same_file, write_atomic

ANSWERS_HELP = """Mark hand calculations in ANSWERS files against PROBLEM, stage by stage.

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

--format gradescope writes Gradescope's results.json for one answers file (an
autograder's run_autograder: -o /autograder/results/results.json): a test per
stage worth --points, right or right by follow-through scoring them, the
feedback as its output (--hide-expected: without the values expected); --ask names the stages the exercise asks for (one not
answered scores 0). It exits 0 whenever results.json is written: a wrong answer
is a score, and an answers file that cannot be read is a score of 0 with the
reason shown to the student. A problem that cannot be read is an Error: line.
"""


FORMATS = ["text", "markdown", "latex", "json", "csv", "gradescope"]
# Gradescope's visibility values (symattn.check.gradescope.VISIBILITIES, not imported here: it loads SymPy)
VISIBILITIES = ["visible", "after_due_date", "after_published", "hidden"]


@click.command(help=ANSWERS_HELP)
@click.argument("problem", type=click.Path(path_type=Path))
@click.argument("answers", nargs=-1, required=True, type=click.Path(path_type=Path))  # a folder is reported per file
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="Report format (csv: one line per answers file; gradescope: Gradescope's results.json).")
@output_option("Write the report to this file instead of standard output (written whole, or not at all).")
@click.option("--tolerance", type=click.FloatRange(min=0), help="Accept any entry within this absolute difference instead of the rounding rules.")
@click.option("--precision", type=click.Choice(["auto", "exact", "float32", "float64"]), default="auto", show_default=True,
              help="Decimals printed from a binary float computation: float32/float64 accept any entry within that "
                   "format's rounding; auto accepts a stage when every entry of it fits one format; exact never does.")
@backward_option("Mark gradient stages too (dV, dA, ...): the file's backward: section, else its cross-entropy "
                 "(loss:), else the loss L = Σ O.")
@tiled_option("Mark the online softmax's stages too (m_tiled, l_tiled, acc_tiled, O_tiled) over blocks of B keys.")
@max_size_option("The size budget: the most numbers the problem may hold (the budget for its scores grows with it).")
@click.option("--points", type=WholeRange(min=1), help="With --format gradescope: what each stage is worth (default 1).")
@click.option("--visibility", type=click.Choice(VISIBILITIES),
              help="With --format gradescope: when students see the stages' tests (Gradescope's visibility; "
                   "default visible; the test saying whether the answers file was read is always visible).")
@click.option("--ask", callback=stage_list, metavar="IDS",
              help="With --format gradescope: the stages the exercise asks for, e.g. S_scaled,A,O (as derive "
                   "--exercise --ask); each is a test, scoring 0 when not answered (default: the stages answered).")
@click.option("--hide-expected", is_flag=True,
              help="With --format gradescope: name each wrong entry without the value expected (and an arithmetic "
                   "slip without how far off it is), for students who may submit again.")
def check(problem: Path, answers: tuple[Path, ...], fmt: str, output: Path | None, tolerance: float | None,
          precision: str, backward: bool, tiled: int | None, max_size: int, points: int | None,
          visibility: str | None, ask: frozenset[str] | None, hide_expected: bool) -> None:
    gradescope = dict(points=points or 1, visibility=visibility or "visible", ask=ask)
    _refuse_options(fmt, answers, points, visibility, ask, hide_expected or None)
    check_outputs(output)
    if output is not None and any(same_file(output, path) for path in answers):
        raise click.ClickException(f"{output} is an answers file; choose another output path")
    d = _derivation(problem, output, backward, tiled, max_size, gradescope if fmt == "gradescope" else None)
    from .. import check as _check
    from ..check import check_class
    from ..errors import SymattnError

    if fmt == "gradescope":
        _write(output, _gradescope(d, answers[0], precision, tolerance, gradescope, not hide_expected))
        click.get_current_context().exit(0)  # a wrong or unreadable answer is a score, not an error
    try:
        if len(answers) == 1 and fmt != "csv":
            marked = _check(d, answers[0], precision=precision, tolerance=tolerance)
        else:
            marked = check_class(d, [(str(path), path) for path in answers], precision=precision, tolerance=tolerance)
    except SymattnError as exc:
        raise click.ClickException(str(exc)) from None
    report = {"text": marked.__str__, "markdown": getattr(marked, "to_markdown", None),
              "latex": getattr(marked, "to_latex", None), "json": marked.to_json, "csv": getattr(marked, "to_csv", None)}
    _write(output, (report[fmt] or marked.__str__)())
    click.get_current_context().exit(0 if marked.passed else 1)


def _refuse_options(fmt: str, answers: tuple[Path, ...], points, visibility, ask, hide_expected) -> None:
    if fmt != "gradescope":
        for name, value in (("--points", points), ("--visibility", visibility), ("--ask", ask),
                            ("--hide-expected", hide_expected)):
            if value is not None:
                raise click.UsageError(f"{name} goes with --format gradescope")
    elif len(answers) > 1:
        raise click.UsageError("--format gradescope marks one answers file (Gradescope runs the autograder once "
                               "per submission)")


def _derivation(problem: Path, output: Path | None, backward: bool, tiled: int | None, max_size: int,
                gradescope: dict | None):
    """The problem derived, within its budget; with ``gradescope``, also markable and with its
    asked stages: a problem that is not is the teacher's to fix, an ``Error:`` line."""
    with Importing():
        from .. import check as _loaded  # noqa: F401  (SymPy and mpmath, loaded with the collector paused)
        from ..errors import SymattnError
        from ..problem.load import load_problem
        from ..render.display import derive as _derive
        from ..problem.budget import check_budget
        from ..problem.passes import with_backward, with_tiling

    try:
        with inputs() as read:
            p = load_problem(problem, max_size=max_size)
        refuse_input(output, read, "one of the problem's input files")
        if tiled is not None:
            p = with_tiling(p, tiled)
        p = with_backward(p) if backward else p
        check_budget(p, "text", p.backward is not None, max_size, file=str(problem))
        d = _derive(p)
        if gradescope is not None:
            from ..check.gradescope import asked_ids

            if not d.can_evaluate:
                raise SymattnError("the problem has symbols without values; give values to check answers against it",
                                   file=str(problem))
            if gradescope["ask"] is not None:
                asked_ids(d, gradescope["ask"])
    except SymattnError as exc:
        raise click.ClickException(str(exc)) from None
    return d


def _gradescope(d, answers: Path, precision: str, tolerance: float | None, options: dict, expected: bool) -> str:
    """results.json: the marking, or a score of 0 with the reason when the answers cannot be read."""
    from .. import check as _check
    from ..check import gradescope
    from ..errors import SymattnError

    try:
        marking = _check(d, answers, precision=precision, tolerance=tolerance)
    except SymattnError as exc:
        return gradescope.to_json(gradescope.unreadable(str(exc), d, **options))
    return marking.to_gradescope(**options, expected=expected)


def _write(output: Path | None, text: str) -> None:
    if output is None:
        echo(text, nl=False)
    else:
        write_atomic(output, text.encode("utf-8"))
