"""Batches of exercises: :func:`generate` draws distinct variants from a seed and the options of
``symattn generate``, :func:`write_exercises` writes them into a folder with their ``index.csv``
and, if asked, their exercise and solution sheets.

>>> import symattn
>>> problems = symattn.generate(2, seed=7)
>>> [p.seed for p in problems], problems[0].to_yaml().splitlines()[2]
([7, 8], 'title: "Attention exercise, variant 1"')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Sequence

from ..errors import SymattnError
from ..text import shown
from . import block as _block, mla as _mla
from .exercises import LEVELS, Spec, from_problem, generate as _attention, to_yaml as _attention_yaml
from ..problem.load import load_problem, parse_problem
from ..problem.model import Problem

__all__ = ["GeneratedProblem", "derivation_of", "exercise_files", "generate", "write_exercises"]

MAX_COUNT = 500  # variants in one batch (symattn generate --count)
_MAX_DIGITS = 40  # a count, size or seed has at most this many digits (as on the command line)
ONE_FILE = ("exercises", "solutions")  # the sheets' files with one_file (--one-file), .pdf or .tex
_TRIES = 1000  # spare seeds tried for one variant before the options are deemed exhausted
# |projection| and |score| bounds of each level, the least a variant of a --from problem allows
_BOUNDS = {level: (proj, score) for level, (_, proj, score, _) in LEVELS.items()}
# The shape options, which a base problem gives instead, and their defaults
_SHAPE = {"tokens": 4, "d_model": 4, "d_k": 4, "d_v": 4, "mask": "causal", "heads": 1, "cross": None,
          "scale": True, "words": None, "norm": None, "residual": False, "block": False, "d_ff": 3,
          "activation": "relu", "vocab": None, "rows": "last", "sink": None, "linear": None, "softcap": None,
          "temperature": None, "mla": False, "differential": None}


class GeneratedProblem(Problem):
    """A :class:`~symattn.problem.model.Problem` made by :func:`generate`, with the text of its problem
    file (:meth:`to_yaml`), the seed it was drawn from (``seed``) and its number in the batch
    (``variant``: 1, 2, ...; None for a problem on its own, as ``symattn generate`` without
    ``--count`` writes it)."""

    seed: int | None = None
    variant: int | None = None
    _text: str | None = None
    _derivation = None  # its verified derivation, for the sheets

    def to_yaml(self) -> str:
        """The problem file, byte for byte as ``symattn generate`` writes it."""
        if self._text is None:  # dataclasses.replace (with_backward, ...) makes another problem
            raise SymattnError("this problem was changed after symattn.generate made it, so it has no problem file; "
                               "call to_yaml() on the generated problem itself")
        return self._text


def generate(count: int = 1, *, seed: int = 0, level: str = "easy", tokens: int = 4, d_model: int = 4,
             d_k: int = 4, d_v: int = 4, mask: str = "causal", heads: int = 1, cross: int | None = None,
             scale: bool = True, range: tuple[int, int] | None = None, words: str | Sequence[str] | None = None,
             base: Problem | str | os.PathLike | None = None, vary: str = "weights", numbered: bool | None = None,
             command: str | None = None, norm: str | None = None, residual: bool = False, block: bool = False,
             d_ff: int = 3, activation: str = "relu", vocab: str | Sequence[str] | None = None, rows: str = "last",
             sink: int | None = None, linear: str | None = None, softcap=None, temperature=None, mla: bool = False,
             differential: str | None = None) -> list[GeneratedProblem]:
    """``count`` different exercises with small, hand-friendly numbers, the same for the same
    options and seed (the options of ``symattn generate``; ``scale=False`` is ``--no-scale``).
    Variant k is what seed ``seed + k − 1`` gives alone; one equal to an earlier variant takes
    the next spare seed after the batch's own (``seed + count``, ...), and its ``seed`` says so.
    ``base`` (a problem or its path; ``--from``) keeps that problem's structure, its shape and
    tokens, and draws new ``vary`` ("weights" or "inputs"). ``numbered`` (by default when
    ``count`` > 1) titles them "variant k" as ``--count`` does; ``command`` is the "Made by"
    line of their header (by default this call). Each problem derives and passes the numeric
    cross-check, and meets the guarantees of its level:

    ========  ==========================================================================
    level     guarantees
    ========  ==========================================================================
    all       entries of X, context and the weights are integers in the range; Q, K, V
              and the scores are integers with |Q|, |K|, |V| ≤ PROJ and |S| ≤ SCORE of
              the level; no row is fully masked; in each head some softmax row that
              has a choice is not uniform; no two variants of a batch are equal
    easy      scaled scores are integers; every softmax row has at most two distinct
              exponents (so each weight is 1/k or e^(−x)/(a + b·e^(−x)))
    medium    scaled scores are integers, halves or thirds
    hard      scaled scores exact (a d_k that is not a perfect square gives √ terms)
    ========  ==========================================================================

    The default ranges are 0..1 (easy), -1..1 (medium), -2..2 (hard); PROJ and SCORE 4 and 8, 6 and 16, 12 and 48.

    ``norm`` ("layernorm" or "rmsnorm", ``--norm``) puts a norm with ε = 0 in front: each row
    of X is a·z + b with z a row of ±1, so the normalised rows are ±1 exactly, and the
    guarantees hold for X_norm = X̂ ∘ γ + β (γ of 1s and 2s, β of 0s and 1s), which the
    projections read. ``residual`` (``--residual``) derives H = X + O too; ``linear`` (``--linear``:
    "relu", "elu1", "identity") linear attention instead of the softmax (its guarantees: the README). ``sink``: see ``Spec``.

    ``block`` (``--block``) writes the whole block: that norm (``norm``, by default
    "layernorm") and the residual, then an MLP of ``d_ff`` hidden units with its own norm and
    ``activation`` ("relu" or "relu2"), the logits of the last position (``rows="all"``: of
    every one) over a vocabulary of 4 to 6 words (``vocab``, or the tokens' words, the next word
    and a few more) and the loss; its guarantees are in :mod:`symattn.generate.block`. ``softcap``, ``temperature``
    (exact, "50" or "1/2"), ``differential`` (λ, "1/2") add those fields to an attention exercise; ``mla``: :mod:`.mla`."""
    options = dict(tokens=tokens, d_model=d_model, d_k=d_k, d_v=d_v, mask=mask, heads=heads, cross=cross, scale=scale,
                   words=words, norm=norm, residual=residual, block=block, d_ff=d_ff, activation=activation, vocab=vocab,
                   rows=rows, softcap=softcap, temperature=temperature, sink=sink, linear=linear, mla=mla, differential=differential)
    _check(count, seed, level, options, range, vary, numbered, command)
    if command is None:
        command = _call(count, dict(seed=seed, level=level, **options, range=range, base=base, vary=vary,
                                    numbered=numbered))
    spec, drawn_base = _spec(level, range, options, base, vary)
    to_yaml = _block.to_yaml if spec.block else _mla.to_yaml if spec.mla else _attention_yaml
    numbered = count > 1 if numbered is None else numbered
    problems: list[GeneratedProblem] = []
    seen: set = set()
    spare = seed + count  # seeds after the batch's own, for variants that come out alike
    for k in _ordinals(count):
        variant_seed = seed + k - 1
        drawn = _draw(spec, variant_seed, drawn_base)
        tries = 0
        while drawn.key() in seen:
            tries += 1
            if tries > _TRIES:
                raise SymattnError(f"only {k - 1} different problems were found for these options; "
                                   "ask for fewer (nothing was written)")
            variant_seed, spare = spare, spare + 1
            drawn = _draw(spec, variant_seed, drawn_base)
        seen.add(drawn.key())
        what = "Transformer block exercise" if spec.block else "Attention exercise"
        if numbered:
            text = to_yaml(spec, drawn, f"{command}  (variant {k} of {count}, seed {variant_seed})",
                           f"{what}, variant {k}")
            source = f"variant-{k:02d}.yaml"
        else:
            text = to_yaml(spec, drawn, command, f"{what} (seed {variant_seed})")
            source = "<generated>"
        problems.append(_verified(parse_problem(text, source), text, variant_seed, k if numbered else None))
    return problems


def exercise_files(count: int, sheets: str | None = None, one_file: bool = False) -> list[str]:
    """The names :func:`write_exercises` gives ``count`` problems: their files, ``index.csv``, the sheets."""
    names = [f"variant-{k:02d}.yaml" for k in _ordinals(count)] + ["index.csv"]
    if sheets is not None:
        suffix = _sheet_suffix(sheets)
        if one_file:
            return names + [f"{part}{suffix}" for part in ONE_FILE]
        names += [f"variant-{k:02d}-{part}{suffix}" for k in _ordinals(count) for part in ("exercise", "solution")]
    return names


def check_folder(folder: str | os.PathLike, count: int, sheets: str | None = None, force: bool = False,
                 one_file: bool = False, also: Sequence[str] = ()) -> None:
    """Refuse, before any work, what :func:`write_exercises` would refuse to write into ``folder``
    (``also``: the names of the files a caller adds, see :func:`write_exercises`)."""
    _batch(Path(folder), exercise_files(count, _sheet_kind(sheets, one_file), one_file) + list(also), force)


def write_exercises(problems: Sequence[GeneratedProblem], folder: str | os.PathLike, *, sheets: str | None = None,
                    force: bool = False, paper: str = "a4", one_file: bool = False, also=None) -> list[Path]:
    """Write ``problems`` (from :func:`generate`) into ``folder`` as ``symattn generate --count
    --out-dir`` does: ``variant-01.yaml``, ..., ``index.csv`` (variant, seed, file; with sheets,
    exercise and solution too) and with
    ``sheets`` ("pdf": PDFs, or their LaTeX without pdflatex; "html": web pages) each variant's
    exercise and solution sheets, the PDFs on ``paper`` ("a4" or "letter"). With ``one_file``
    (``--one-file``, sheets "pdf") the sheets are two files, ``exercises.pdf`` and ``solutions.pdf``, each
    variant on pages of its own in order, and index.csv's last columns are exercise_page and
    solution_page, where each variant starts (empty when only the LaTeX is written). ``also``, a pair
    (names, write), adds the files ``names``, which ``write(batch)`` writes with ``batch.write``
    (a course platform's files: :func:`symattn.write_course`). All of them or nothing: a failure leaves ``folder`` as it was;
    without ``force`` a file of the same name already there is an error. Returns the paths written.
    """
    problems = list(problems) if isinstance(problems, (list, tuple)) else problems
    if not isinstance(problems, list) or not problems:
        raise SymattnError(f"write_exercises needs a list of problems from symattn.generate, not "
                           f"{shown(problems)}")
    for k, p in enumerate(problems, 1):
        if not isinstance(p, GeneratedProblem) or p._text is None:
            raise SymattnError(f"problem {k} was not made by symattn.generate, so it has no problem file to write")
    sheets = _sheet_kind(sheets, one_file)
    from ..render.paper import PAPERS

    if paper not in PAPERS:
        raise SymattnError(f"paper is 'a4' or 'letter', not {shown(paper)}")
    folder = Path(folder)
    names = exercise_files(len(problems), sheets, one_file) + (list(also[0]) if also is not None else [])
    import click  # the batch's own errors are the command line's; here they are SymattnErrors

    try:
        with _batch(folder, names, force) as batch:
            # the first three columns come first and in this order (other tools read them); with sheets,
            # each variant's exercise and solution sheet follow, as paths relative to the folder (with
            # one_file: the page of exercises.pdf and of solutions.pdf where the variant starts)
            suffix = _sheet_suffix(sheets) if sheets is not None else None
            pages = _one_file_sheets(problems, batch, paper) if one_file else None
            index = ["variant,seed,file" + (",exercise_page,solution_page" if one_file
                                            else ",exercise,solution" if suffix else "")]
            for k, p in enumerate(problems, 1):
                name = f"variant-{k:02d}"
                batch.write(f"{name}.yaml", p.to_yaml().encode("utf-8"))
                if sheets == "html":
                    _html_sheets(derivation_of(p), name, batch)
                index.append(f"{k},{p.seed},{name}.yaml"
                             + (f",{pages[0][k - 1]},{pages[1][k - 1]}" if pages
                                else f",{name}-exercise{suffix},{name}-solution{suffix}" if suffix else ""))
            if sheets == "pdf" and not one_file:
                _latex_sheets(problems, batch, paper)
            batch.write("index.csv", ("\n".join(index) + "\n").encode("utf-8"))
            if also is not None:
                also[1](batch)
    except click.ClickException as exc:
        raise SymattnError(exc.message) from None
    return [folder / name for name in names]


def _check(count, seed, level, options: dict, range, vary, numbered, command) -> None:
    """Refuse an option that is not one ``symattn generate`` takes, with one line naming it."""
    _whole("count", count, 1, MAX_COUNT)
    _whole("seed", seed, 0)
    if level not in LEVELS:
        raise SymattnError(f"unknown level {shown(level)}; choose easy, medium or hard")
    for name in ("tokens", "d_model", "d_k", "d_v", "heads") + (("cross",) if options["cross"] is not None else ()):
        _whole(name, options[name], None)
    if not isinstance(options["mask"], str):
        raise SymattnError(f"mask is text such as 'causal' or 'padding:1', not {shown(options['mask'])}")
    for name in ("words", "vocab"):
        words = options[name]
        if words is not None and not isinstance(words, str) and not (
                isinstance(words, (list, tuple)) and all(isinstance(w, str) for w in words)):
            raise SymattnError(f"{name} are text (\"the cat sat\") or a list of strings, not {shown(words)}")
    _whole("d_ff", options["d_ff"], None)
    if options["sink"] is not None:
        _whole("sink", options["sink"], None)
    for name in ("activation", "rows"):
        if not isinstance(options[name], str):
            raise SymattnError(f"{name} is text such as {_SHAPE[name]!r}, not {shown(options[name])}")
    if range is not None and not (isinstance(range, (list, tuple)) and len(range) == 2):
        raise SymattnError(f"range is (low, high), two whole numbers, not {shown(range)}")
    for end in range or ():
        _whole("range", end, None)
    if vary not in ("weights", "inputs"):
        raise SymattnError(f"vary is 'weights' or 'inputs', not {shown(vary)}")
    if options["norm"] not in (None, "layernorm", "rmsnorm"):
        raise SymattnError(f"norm is 'layernorm', 'rmsnorm' or None, not {shown(options['norm'])}")
    if options["linear"] not in (None, "relu", "elu1", "identity"):
        raise SymattnError(f"linear is 'relu', 'elu1', 'identity' or None, not {shown(options['linear'])}")
    for name, value in (("scale", options["scale"]), ("numbered", numbered), ("residual", options["residual"]),
                        ("block", options["block"]), ("mla", options["mla"])):
        if not isinstance(value, bool) and not (name == "numbered" and value is None):
            raise SymattnError(f"{name} is True or False, not {shown(value)}")
    for name in ("softcap", "temperature"):
        _positive(name, options[name])
    if command is not None and not isinstance(command, str):
        raise SymattnError(f"command is the text of the header's 'Made by' line, not {shown(command)}")


def _whole(name: str, value, low: int | None, high: int | None = None) -> None:
    """``value`` must be an int (of at most 40 digits) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SymattnError(f"{name} must be a whole number, not {shown(value)}")
    if abs(value) >= 10 ** _MAX_DIGITS:
        raise SymattnError(f"{name} has more than {_MAX_DIGITS} digits")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise SymattnError(f"{name} must be {span}, not {value}")


def _positive(name: str, value) -> None:
    """``value`` is None, or an exact positive number: an int, or text such as "50" or "1/2"."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SymattnError(f"{name} is an exact positive number, an int or text such as \"1/2\", not {shown(value)}")
    from ..numbers.parse import NumberError, is_positive, parse_number

    try:
        number = parse_number(str(value))
    except NumberError as exc:
        raise SymattnError(f"{name}: {exc}") from None
    if not is_positive(number):
        raise SymattnError(f"{name} must be positive, not {shown(value)}")


def _score_lines(options: dict) -> tuple[str, ...]:
    """The problem file's softcap: and temperature: lines of the options (none when not given)."""
    from .exercises import quote

    if options["block"] and (options["softcap"] is not None or options["temperature"] is not None):
        raise SymattnError("softcap and temperature go with the attention exercises, not with block=True (--block)")
    return tuple(f"{name}: {quote(str(options[name]))}" for name in ("softcap", "temperature")
                 if options[name] is not None)


def _spec(level: str, range, options: dict, base, vary: str):
    """The :class:`Spec` of the options, and the drawn matrices of ``base`` (None without one)."""
    if base is None:
        words, vocab = (_words(options[name]) for name in ("words", "vocab"))
        block = options["block"]
        if options["mla"]:
            _mla.refuse(options)
        if not block:
            given = [name for name in ("d_ff", "activation", "vocab", "rows") if options[name] != _SHAPE[name]]
            if given:
                raise SymattnError(f"{given[0]} is an option of the whole block: it goes with block=True (--block)")
        return Spec(tokens=options["tokens"], d_model=options["d_model"], d_k=options["d_k"], d_v=options["d_v"],
                    mask=options["mask"], heads=options["heads"], cross=options["cross"], scale=options["scale"],
                    level=level, range=tuple(range) if range is not None else None, words=words,
                    norm=options["norm"] or ("layernorm" if block else None), residual=options["residual"] or block,
                    block=block, d_ff=options["d_ff"], activation=options["activation"], vocab=vocab,
                    rows=options["rows"], sink=options["sink"], linear=options["linear"], mla=options["mla"],
                    differential=None if options["differential"] is None else str(options["differential"]),
                    extra=_score_lines(options)), None
    given = [name for name, default in _SHAPE.items() if options[name] != default]
    if given:
        raise SymattnError(f"{given[0]} comes from the base problem, which keeps its structure; leave it out with base")
    loaded = base if isinstance(base, Problem) else load_problem(base)
    if loaded.mla is not None:
        raise SymattnError("new numbers for a multi-head latent attention problem are not drawn yet: use mla=True "
                           "(--mla) instead of base (--from)")
    spec, drawn = from_problem(loaded)
    # new numbers come from the range of the part that varies (and the level's)
    if vary == "weights":
        entries = [w for h in drawn.heads for w in h] + ([drawn.W_O] if drawn.W_O is not None else [])
    else:
        entries = [drawn.X] + ([drawn.context] if drawn.context is not None else [])
    lo, hi = range or LEVELS[level][0]
    lo, hi = min([lo] + [int(e.min()) for e in entries]), max([hi] + [int(e.max()) for e in entries])
    bounds = tuple(max(a, b) for a, b in zip(spec.bounds, _BOUNDS[level]))
    return Spec(**{**spec.__dict__, "level": level, "range": (lo, hi), "vary": vary, "bounds": bounds}), drawn


def _words(words) -> tuple[str, ...] | None:
    """``--words`` or ``--vocab`` as a tuple of words (None when not given or empty)."""
    words = tuple(words.split()) if isinstance(words, str) else tuple(words) if words is not None else None
    return words or None


def _draw(spec: Spec, seed: int, base):
    """The problem of one seed: a whole block, or the attention alone (a variant of ``base``)."""
    if spec.mla:
        return _mla.generate(spec, seed)
    return _block.generate(spec, seed) if spec.block else _attention(spec, seed, base)


def _call(count: int, options: dict) -> str:
    """This call as Python, for the header: the options that are not the defaults."""
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(generate).parameters.items()}
    parts = [repr(count)] if count != 1 else []
    for name, value in options.items():
        if name == "base" and value is not None:
            source = value.source if isinstance(value, Problem) else os.fspath(value)
            parts.append(f"base=symattn.load_problem({source!r})" if isinstance(value, Problem) else f"base={source!r}")
        elif value != defaults[name]:
            parts.append(f"{name}={value!r}")
    return f"symattn.generate({', '.join(parts)})"


def _ordinals(count: int):
    """1, 2, ..., ``count`` (``range`` is an option of :func:`generate`)."""
    return range(1, count + 1)


def _verified(problem: Problem, text: str, seed: int, variant: int | None) -> GeneratedProblem:
    """``problem`` as a :class:`GeneratedProblem`, once it derives and passes the cross-check."""
    from ..reference.crosscheck import crosscheck
    from ..exact.derivation import derive

    made = GeneratedProblem(**{f.name: getattr(problem, f.name) for f in dataclasses.fields(problem)})
    d = derive(made)
    result = crosscheck(d)
    if not result.passed:  # a bug in the generator or the derivation, never the user's doing
        raise RuntimeError(f"a generated problem failed the cross-check: {result.all_mismatches[0]}")
    vars(made).update(seed=seed, variant=variant, _text=text, _derivation=d)
    return made


def derivation_of(p: GeneratedProblem):
    """The verified derivation of ``p`` (derived again if ``p`` was changed since)."""
    if p._derivation is None:
        from ..exact.derivation import derive

        return derive(p)
    return p._derivation


def _sheet_kind(sheets: str | None, one_file: bool = False) -> str | None:
    if sheets not in (None, "pdf", "html"):
        raise SymattnError(f"sheets is 'pdf' or 'html' (or None: no sheets), not {shown(sheets)}")
    if not isinstance(one_file, bool):
        raise SymattnError(f"one_file is True or False, not {shown(one_file)}")
    if one_file and sheets != "pdf":
        raise SymattnError("one_file (--one-file) goes with sheets='pdf' (--sheets pdf): one PDF of the "
                           "exercises, one of the solutions" + ("; the web pages are one per variant"
                                                                  if sheets == "html" else ""))
    return sheets


def _sheet_suffix(kind: str = "pdf") -> str:
    """Sheets are web pages with --sheets html; else PDFs when pdflatex is installed, or their LaTeX."""
    import shutil

    if kind == "html":
        return ".html"
    return ".pdf" if shutil.which("pdflatex") else ".tex"


def _html_sheets(d, name: str, batch) -> None:
    from ..render import render_html

    for part, exercise in (("exercise", True), ("solution", False)):
        batch.write(f"{name}-{part}.html", render_html(d, exercise=exercise).encode("utf-8"))


def _latex_sheets(problems: list[GeneratedProblem], batch, paper: str) -> None:
    """Each variant's exercise and solution as PDFs, compiled in parallel while the next are
    rendered (their LaTeX when pdflatex is not installed)."""
    from ..render import render_latex

    def sources():
        for p in problems:
            d = derivation_of(p)
            yield render_latex(d, exercise=True, paper=paper)
            yield render_latex(d, paper=paper)

    names = [f"variant-{k:02d}-{part}" for k in _ordinals(len(problems)) for part in ("exercise", "solution")]
    if _sheet_suffix() == ".tex":
        for name, source in zip(names, sources()):
            batch.write(f"{name}.tex", source.encode("utf-8"))
        return
    from ..render.pdf import latex_to_pdfs

    for name, pdf in zip(names, latex_to_pdfs(sources(), len(names))):
        batch.write(f"{name}.pdf", pdf)


def _one_file_sheets(problems: list[GeneratedProblem], batch, paper: str) -> tuple[list, list]:
    """Every variant's exercise in exercises.pdf, its solution in solutions.pdf (their LaTeX when
    pdflatex is not installed, and then no pages: empty columns); the page where each variant
    starts in each, from the compiled documents' logs."""
    from ..render.sheets import sheets_latex, variant_pages

    sheets = [(derivation_of(p), k, p.seed) for k, p in enumerate(problems, 1)]
    sources = [sheets_latex(sheets, exercise=exercise, paper=paper) for exercise in (True, False)]
    if _sheet_suffix() == ".tex":
        for name, source in zip(ONE_FILE, sources):
            batch.write(f"{name}.tex", source.encode("utf-8"))
        return [""] * len(problems), [""] * len(problems)
    from ..render.pdf import compile_latexes

    # one pdflatex run holds every variant: its bound grows with them (the two documents run at once)
    compiled = compile_latexes(iter(sources), 2, timeout=120 + 4 * len(problems))
    pages = [variant_pages(log) for _, log in compiled]
    if any(len(p) != len(problems) for p in pages):  # a bug of symattn's, never the user's doing
        raise RuntimeError("the one-file sheets' log does not give every variant's first page")
    for name, (pdf, _) in zip(ONE_FILE, compiled):
        batch.write(f"{name}.pdf", pdf)
    return pages[0], pages[1]


def _batch(folder: Path, names: list[str], force: bool):
    import click

    from ..writing import Batch

    try:
        return Batch(folder, names, force)
    except click.ClickException as exc:
        raise SymattnError(exc.message) from None
