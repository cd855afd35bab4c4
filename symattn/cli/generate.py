"""``symattn generate``: new problems with hand-friendly numbers, one or a batch with its sheets."""

from __future__ import annotations

from pathlib import Path

import click

from .imports import Importing
from .options import Whole, WholeRange, output_option, stage_list
from .paths import check_outputs, echo, inputs, refuse_input, same_file, write_atomic

# what --from takes from its problem instead (so giving one of them with --from is refused)
SHAPE_OPTIONS = ("tokens", "d_model", "d_k", "d_v", "mask", "heads", "cross", "no_scale", "words", "norm", "residual",
                 "block", "d_ff", "activation", "vocab", "rows", "sink", "linear", "softcap", "temperature", "mla",
                 "differential")
BLOCK_OPTIONS = ("d_ff", "activation", "vocab", "rows")  # the options of --block alone


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


class RecordingCommand(click.Command):
    """Keeps the command's own arguments as typed, for the header of the files it writes."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["symattn.argv"] = list(args)
        return super().parse_args(ctx, args)


@click.command(cls=RecordingCommand)
@click.option("--tokens", type=Whole(), default=4, show_default=True, help="Number of query tokens n.")
@click.option("--d-model", type=Whole(), default=4, show_default=True)
@click.option("--d-k", type=Whole(), default=4, show_default=True, help="Query/key width (a perfect square keeps the scale rational).")
@click.option("--d-v", type=Whole(), default=4, show_default=True)
@click.option("--mask", default="causal", show_default=True,
              help="none, causal, causal-bottom-right, sliding-window:W, sink-window:K,W (the first K keys and a "
                   "window of W) or padding:P (the last P keys hidden).")
@click.option("--heads", type=Whole(), default=1, show_default=True, help="Several heads get W_O.")
@click.option("--cross", "cross", type=Whole(), metavar="N_K", help="Cross-attention with N_K context tokens.")
@click.option("--no-scale", is_flag=True, help="Write scale: none (no division by √d_k).")
@click.option("--norm", type=click.Choice(["layernorm", "rmsnorm"]),
              help="A norm in front of the attention, eps: 0, rows chosen so that it gives whole numbers.")
@click.option("--sink", type=click.IntRange(-9, 9), metavar="LOGIT",
              help="A learned sink logit (gpt-oss's sink:, a whole number from -9 to 9) in every head's softmax.")
@click.option("--residual", is_flag=True, help="Derive the residual stream H = X + O too (O as wide as X).")
@click.option("--linear", type=click.Choice(["relu", "elu1", "identity"]),
              help="Linear attention with this feature map instead of the softmax (mask none, causal or padding:P): "
                   "every normaliser positive, with relu some entry cut.")
@click.option("--mla", is_flag=True,
              help="Multi-head latent attention (DeepSeek-V2): 2 heads, d_c = d_h = d_R = d_v = 2, RoPE in quarter turns, "
                   "mask causal or none; whole-number scores, each head's differing from RoPE on the compressed part.")
@click.option("--differential", metavar="LAMBDA",
              help="Differential attention: a second map (W_Q2, W_K2) drawn with the same guarantees, subtracted "
                   "LAMBDA times (a fraction between 0 and 1, such as 1/2).")
@click.option("--block", is_flag=True,
              help="The whole block: a norm in front (--norm, default layernorm), the residual, the MLP with its "
                   "own norm, the logits and the loss (guarantees below).")
@click.option("--d-ff", type=Whole(), default=3, show_default=True, help="With --block: the MLP's hidden units (1 to 8).")
@click.option("--activation", type=click.Choice(["relu", "relu2", "gelu", "gelu-tanh", "silu"]), default="relu",
              show_default=True, help="With --block: the MLP's activation; gelu, gelu-tanh and silu are refused, "
                                      "as their values are not fractions.")
@click.option("--vocab", help='With --block: the vocabulary, 4 to 6 words holding the tokens\' words and the next '
                              'word (default: those and a few more).')
@click.option("--rows", type=click.Choice(["last", "all"]), default="last", show_default=True,
              help="With --block: the logits and the loss of the last position only, or of every position.")
@click.option("--softcap", metavar="C", help='Soft-cap the scaled scores, c·tanh(s/c), before the mask (an exact number such as 50).')
@click.option("--temperature", metavar="T", help='Divide the masked scores by T (an exact number such as 2 or "1/2").')
@click.option("--level", type=click.Choice(["easy", "medium", "hard"]), default="easy", show_default=True,
              help="Difficulty: the guarantees of each level are in symattn.generate's documentation.")
@click.option("--range", "range_", callback=_range, metavar="LOW..HIGH", help="Entry range (default by level: 0..1, -1..1, -2..2).")
@click.option("--words", help='Token labels, e.g. "the cat sat down".')
@click.option("--seed", type=WholeRange(min=0), default=0, show_default=True, help="The same seed always gives the same file.")
@output_option("Where to write one problem (default: standard output).")
@click.option("--count", type=WholeRange(1, 500), help="Write this many variants into --out-dir.")
@click.option("--out-dir", type=click.Path(path_type=Path), help="Folder for --count variants and their index.csv.")
@click.option("--sheets", type=click.Choice(["pdf", "html"]), is_flag=False, flag_value="pdf",
              help="With --count: each variant's exercise and solution as PDF (LaTeX without pdflatex); "
                   "--sheets html writes them as web pages.")
@click.option("--one-file", is_flag=True,
              help="With --sheets pdf: all the variants in one exercises.pdf and one solutions.pdf, each variant on "
                   "new pages headed by its number and seed (the exercise with a line for the student's name).")
@click.option("--paper", type=click.Choice(["a4", "letter"]),
              help="With --sheets pdf: the sheets' page (default: letter where the locale's LC_PAPER, LC_ALL or "
                   "LANG names a Letter country such as en_US, else a4).")
@click.option("--lms", type=click.Choice(["moodle", "qti"]),
              help="With --count: the files a course platform imports as well (see the README's 'Using it in a "
                   "course'): a Moodle XML question bank, or a QTI 1.2 package (Canvas, Blackboard, D2L).")
@click.option("--ask", callback=stage_list, metavar="IDS",
              help="With --lms: the stages each question asks for, e.g. S,A,O (default: the last stage).")
@click.option("--places", type=click.IntRange(1, 10), metavar="PLACES",
              help="With --lms: the decimal places asked of each entry, 1 to 10 (default 4); an answer is right "
                   "within half a unit in the last place, as symattn check marks it.")
@click.option("--force", is_flag=True, help="With --count: replace files of the same names already in --out-dir (without it they are listed and nothing is written).")
@click.option("--from", "base", type=click.Path(path_type=Path), help="Keep the structure of this problem and draw new numbers.")
@click.option("--vary", type=click.Choice(["weights", "inputs"]), default="weights", show_default=True, help="With --from: what gets new numbers.")
def generate(tokens, d_model, d_k, d_v, mask, heads, cross, no_scale, norm, sink, residual, linear, mla, differential,
             block, d_ff,
             activation, vocab, rows, softcap, temperature, level, range_, words, seed, output, count, out_dir, sheets,
             one_file, paper, lms, ask, places, force, base, vary) -> None:
    """Write new problems with small, hand-friendly numbers.

    Every problem is checked against its level's guarantees before it is
    written (integer projections and scores within a bound, integer scaled
    scores at easy, halves or thirds at medium, at most two distinct exponents
    per softmax row at easy, no fully masked row, no two variants alike).

    --block adds, past the attention's guarantees: the MLP's and W_U's weights
    in the range, integers at easy, integers and halves at medium and hard; no
    MLP pre-activation 0 (at hard none within 0.1 of 0), ReLU cutting some and
    passing some; no constant row of logits. At easy and medium the attention
    is uniform (each query's visible scores equal, each weight 1/k) and every
    row of H has a variance that is a fraction squared, so every stage up to
    the logits is a fraction (from H on, denominators at most 12 at easy, 24 at
    medium) and P, the cross-entropy and L are exact in e^(…) and log. |U| and
    |logits| are at most 6 and 10 (easy), 8 and 16 (medium), 16 and 32 (hard).
    At hard the
    attention is not uniform: from H on the stages carry its exponentials,
    shown in certified decimals where long. The vocabulary is the tokens'
    words, the next word and a few more (4 to 6); each row's target is the
    next word (the last row's: the word after the tokens).

    \b
    Examples:
      symattn generate --tokens 4 --d-model 4 --d-k 4 --d-v 4 --mask causal --seed 7 -o p.yaml
      symattn generate --count 30 --out-dir variants/ --sheets
      symattn generate --count 30 --out-dir variants/ --sheets html
      symattn generate --count 30 --out-dir class/ --sheets --one-file
      symattn generate --from problem.yaml --vary weights --seed 3
      symattn generate --norm layernorm --residual --d-v 4 --seed 1 -o ln.yaml
      symattn generate --block --tokens 3 --words "the cat sat on" --seed 2 -o block.yaml
      symattn generate --linear relu --d-k 2 --d-v 2 --seed 1 -o linear.yaml
      symattn generate --mla --tokens 3 --seed 1 -o mla.yaml
    """
    import shlex

    from ..errors import SymattnError

    try:
        with Importing():
            from ..generate.batch import check_folder, generate as make, write_exercises
            from ..lms import lms_files, write_course
            from ..problem.load import load_problem  # noqa: F401  (read in _read_base)
        check_outputs(output)
        loaded = _read_base(base, output, out_dir, count)
        _refuse_options(base, output, out_dir, count, sheets, force)
        if count is not None:
            check_folder(out_dir, count, sheets, force, one_file, lms_files(lms, count) if lms else ())  # files already there: refused before any work
        argv = click.get_current_context().meta.get("symattn.argv", [])
        shape = {} if base is not None else dict(tokens=tokens, d_model=d_model, d_k=d_k, d_v=d_v, mask=mask,
                                                 heads=heads, cross=cross, scale=not no_scale, words=words,
                                                 norm=norm, residual=residual, block=block, d_ff=d_ff,
                                                 activation=activation, vocab=vocab, rows=rows, sink=sink, linear=linear,
                                                 softcap=softcap, temperature=temperature, mla=mla,
                                                 differential=differential)
        problems = make(count or 1, seed=seed, level=level, range=range_, base=loaded, vary=vary,
                        numbered=count is not None,
                        command=" ".join(["symattn generate", *(shlex.quote(a) for a in argv)]), **shape)
        if count is None:
            text = problems[0].to_yaml()
            echo(text, nl=False) if output is None else write_atomic(output, text.encode("utf-8"))
            return
        from ..render.paper import paper_from_locale

        paper = paper or paper_from_locale()
        if lms is None:
            write_exercises(problems, out_dir, sheets=sheets, force=force, paper=paper, one_file=one_file)
        else:
            write_course(problems, out_dir, lms, ask=ask, places=places, sheets=sheets, force=force, paper=paper,
                         one_file=one_file)
    except SymattnError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {count} variants to {out_dir}" + (" with all their exercises and solutions in one file each"
                                                         if one_file else " with their exercise and solution sheets"
                                                         if sheets else "")
               + (f" and their {lms} questions" if lms else ""), err=True)


def _read_base(base: Path | None, output: Path | None, out_dir: Path | None, count: int | None):
    """The --from problem (None without it), no output path naming it or one of its input files."""
    from ..generate.batch import exercise_files
    from ..problem.load import load_problem

    if output is not None and base is not None and same_file(output, base):
        raise click.ClickException(f"{output} is the --from problem itself; choose another output path")
    if base is None:
        return None
    with inputs() as read:
        loaded = load_problem(base)
    refuse_input(output, read, "one of the --from problem's input files")
    for name in exercise_files(count)[:count + 1] if out_dir is not None and count is not None else ():
        refuse_input(out_dir / name, read, "one of the --from problem's input files", base,
                     "the --from problem itself")
    return loaded


def _refuse_options(base: Path | None, output: Path | None, out_dir: Path | None, count: int | None,
                    sheets: str | None, force: bool) -> None:
    """The options that cannot go together, and a batch that would overwrite the --from problem."""
    from ..generate.batch import exercise_files

    ctx = click.get_current_context()
    given = [f"--{name.replace('_', '-')}" for name in BLOCK_OPTIONS
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given and not ctx.params["block"] and base is None:
        raise click.UsageError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --block "
                               "(the whole block: the MLP, the logits and the loss)")
    if base is not None:  # the structure comes from the problem: a shape option would be ignored, so refuse it
        given = [f"--{name.replace('_', '-')}" for name in SHAPE_OPTIONS
                 if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"{', '.join(given)} cannot go with --from: the problem's own shape, mask, heads "
                                   "and words are kept (--vary, --level, --range and --seed choose the new numbers)")
    if count is None and (sheets or out_dir or force or ctx.params.get("lms")):
        raise click.UsageError("--out-dir, --sheets, --lms and --force go with --count")
    if ctx.params.get("lms") is None and (ctx.params.get("ask") is not None or ctx.params.get("places") is not None):
        raise click.UsageError("--ask and --places go with --lms (what a course platform's question asks)")
    if ctx.params.get("one_file") and sheets != "pdf":
        raise click.UsageError("--one-file goes with --sheets pdf (one PDF of the exercises, one of the solutions)"
                               + ("; the web pages of --sheets html are one per variant" if sheets else ""))
    if ctx.params.get("paper") is not None and sheets != "pdf":
        raise click.UsageError("--paper goes with --sheets pdf (the web pages of --sheets html have no page size)")
    if count is not None and out_dir is None:
        raise click.UsageError("--count needs --out-dir")
    if count is not None and output is not None:
        raise click.UsageError("with --count the files go into --out-dir, not -o")
    for name in exercise_files(count, sheets, bool(ctx.params.get("one_file"))) if count is not None and base is not None else ():
        if same_file(out_dir / name, base):
            raise click.ClickException(f"{out_dir / name} is the --from problem itself; choose another --out-dir")
