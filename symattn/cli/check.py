"""``symattn check``: hand calculations marked against a problem, one answers file or a class's."""

from __future__ import annotations

from pathlib import Path

import click

from .imports import Importing
from .options import backward_option, max_size_option, tiled_option
from .paths import echo

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
"""


@click.command(help=ANSWERS_HELP)
@click.argument("problem", type=click.Path(path_type=Path))
@click.argument("answers", nargs=-1, required=True, type=click.Path(path_type=Path))  # a folder is reported per file
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "markdown", "latex", "json", "csv"]), default="text",
              show_default=True, help="Report format (csv: one line per answers file).")
@click.option("--tolerance", type=click.FloatRange(min=0), help="Accept any entry within this absolute difference instead of the rounding rules.")
@click.option("--precision", type=click.Choice(["auto", "exact", "float32", "float64"]), default="auto", show_default=True,
              help="Decimals printed from a binary float computation: float32/float64 accept any entry within that "
                   "format's rounding; auto accepts a stage when every entry of it fits one format; exact never does.")
@backward_option("Mark gradient stages too (dV, dA, ...): the file's backward: section, else its cross-entropy "
                 "(loss:), else the loss L = Σ O.")
@tiled_option("Mark the online softmax's stages too (m_tiled, l_tiled, acc_tiled, O_tiled) over blocks of B keys.")
@max_size_option("The size budget: the most numbers the problem may hold (the budget for its scores grows with it).")
def check(problem: Path, answers: tuple[Path, ...], fmt: str, tolerance: float | None, precision: str,
          backward: bool, tiled: int | None, max_size: int) -> None:
    with Importing():
        from .. import check as _check
        from ..check import check_class
        from ..problem.load import load_problem
        from ..render.display import derive as _derive
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
        echo({"text": marking.__str__, "markdown": marking.to_markdown, "latex": marking.to_latex,
              "json": marking.to_json}[fmt](), nl=False)
        click.get_current_context().exit(0 if marking.passed else 1)
    echo({"json": marked.to_json, "csv": marked.to_csv}.get(fmt, marked.__str__)(), nl=False)
    click.get_current_context().exit(0 if marked.passed else 1)
