"""Marking a hand calculation: stage by stage, entry by entry, with diagnosis.

An answers file is a YAML mapping from stage ids (``Q``, ``S_scaled``, ``A``,
``head1.A``, ...) to matrices. Each entry is either

* **exact**: an integer, a fraction or an expression (``"1/3"``,
  ``"e^(1/2)/(1 + e^(1/2))"``, ``"-inf"``), which must equal the exact value; or
* **a rounded decimal** (``0.4231``), which is right when it is the exact value
  rounded to the places written: within half a unit in the last written place.

Each stage is also compared with the same stage computed from the student's
*own* earlier answers (follow-through marking): one early slip is marked once.
Those comparisons allow, besides half a unit in the answer's last place, the
rounding carried in from the earlier answers: two units in the last place of
the coarsest earlier answer used, times the size of the value (at least 1).
``tolerance`` replaces both rules with one absolute tolerance.

A wrong stage is tested against the common mistakes, and the one that
reproduces the answer is named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import mpmath
import sympy
import yaml

from . import _yaml, stages
from ._errors import SymattnError
from ._numbers import NumberError, parse_number
from ._ops import NumericOps, Undefined
from .derivation import Derivation

DPS = 30
MAX_WRONG_SHOWN = 5
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?\Z")
_E = {"e": sympy.E}
NINF = mpmath.ninf

Grid = list[list[mpmath.mpf]]


@dataclass(frozen=True)
class Entry:
    """One answer entry: its text, exact value, and the half-unit of its last written place (None if exact)."""

    text: str
    value: sympy.Expr
    half_unit: mpmath.mpf | None

    @cached_property
    def approx(self) -> mpmath.mpf:
        return _mp(self.value)


@dataclass(frozen=True)
class Answer:
    """A student's matrix for one stage."""

    id: str
    entries: tuple[tuple[Entry, ...], ...]
    line: int

    @cached_property
    def values(self) -> Grid:  # computed once: marking compares it with many candidates
        return [[e.approx for e in row] for row in self.entries]

    @property
    def coarsest(self) -> mpmath.mpf:
        """The largest half-unit among the entries (0 when all are exact)."""
        units = [e.half_unit for row in self.entries for e in row if e.half_unit is not None]
        return max(units, default=mpmath.mpf(0))


@dataclass(frozen=True)
class WrongEntry:
    row: int
    col: int
    given: str
    expected: str
    expected_approx: float | None


@dataclass(frozen=True)
class StageMark:
    """The verdict on one stage: ``right``, ``wrong`` or ``follows`` (error carried forward)."""

    id: str
    status: str
    wrong: tuple[WrongEntry, ...] = ()
    wrong_count: int = 0
    diagnosis: str | None = None
    note: str | None = None

    def as_dict(self) -> dict:
        out: dict = {"id": self.id, "status": self.status}
        if self.wrong:
            out["wrong"] = [
                {"row": w.row, "col": w.col, "given": w.given, "expected": w.expected, "expected_approx": w.expected_approx}
                for w in self.wrong
            ]
            out["wrong_count"] = self.wrong_count
        if self.diagnosis:
            out["diagnosis"] = self.diagnosis
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Marking:
    """The marking of one answers file."""

    source: str
    stages: tuple[StageMark, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return all(s.status == "right" for s in self.stages)

    def as_dict(self) -> dict:
        return {"passed": self.passed, "stages": [s.as_dict() for s in self.stages]}


# -- reading answers ----------------------------------------------------------------


def load_answers(path: str | Path, derivation: Derivation) -> dict[str, Answer]:
    """Read and validate an answers file against the derivation's stages."""
    name = str(path)
    try:
        text = Path(path).read_text("utf-8-sig")
    except FileNotFoundError:
        raise SymattnError("no such file", file=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SymattnError(f"cannot read the file: {exc}", file=name) from None
    return parse_answers(text, name, derivation)


def parse_answers(text: str, name: str, derivation: Derivation) -> dict[str, Answer]:
    root = _yaml.compose(text, name)
    if root is None or _yaml.is_null(root):
        raise SymattnError("the answers file is empty; write stage ids with your matrices, e.g. S: [[1, 2], [3, 4]]", file=name)
    _yaml.check_tags(root, name)
    if not isinstance(root, yaml.MappingNode):
        raise _yaml.where(name, root).error(f"an answers file is a mapping of stage ids to matrices, not {_yaml.kind(root)}")
    ids = [s.id for s in derivation.steps if not s.given]
    out: dict[str, Answer] = {}
    for key, node in root.value:
        where = _yaml.where(name, key)
        stage = getattr(key, "value", None)
        if stage not in ids and derivation.problem.backward is None and stages.split_id(str(stage))[1] in stages.GRADIENT_NAMES:
            raise where.error(
                f"{stage} is a gradient of the backward pass, which this problem does not derive; "
                "add a backward: section to the problem or mark with --backward"
            )
        if stage not in ids:
            raise where.error(f"{stage!r} is not a computed stage of this problem{stages.did_you_mean(stage, ids)}; "
                              f"the stages are {', '.join(ids)}")
        if stage in out:
            raise where.error(f"{stage} is answered twice")
        out[stage] = _read_matrix(name, stage, node, derivation.step(stage).shape, key.start_mark.line + 1)
    if not out:
        raise SymattnError("the answers file has no answers", file=name)
    return out


def _read_matrix(name: str, stage: str, node, shape: tuple[int, int], line: int) -> Answer:
    where = _yaml.where(name, node)
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise where.error(f"an answer is a matrix written as a list of rows, not {_yaml.kind(node)}", stage)
    rows, cols = shape
    if len(node.value) != rows:
        raise where.error(f"{stage} is {rows}×{cols} but the answer has {len(node.value)} rows", stage)
    entries = []
    for i, row in enumerate(node.value):
        if not isinstance(row, yaml.SequenceNode) or len(row.value) != cols:
            n = len(row.value) if isinstance(row, yaml.SequenceNode) else "no"
            raise _yaml.where(name, row).error(f"{stage} has {cols} columns but this row has {n} entries", f"{stage}[{i}]")
        entries.append(tuple(_read_entry(name, f"{stage}[{i}][{j}]", e) for j, e in enumerate(row.value)))
    return Answer(stage, tuple(entries), line)


def _read_entry(name: str, field_name: str, node) -> Entry:
    where = _yaml.where(name, node)
    if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node) or _yaml.is_bool(node):
        raise where.error(f"expected a number, not {_yaml.kind(node)}", field_name)
    text = node.value.strip()
    try:
        value = parse_number(text, symbols=_E, allow_neg_inf=True)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if value.free_symbols:
        raise where.error(f"{text!r} is not a number", field_name)
    half = None
    if _DECIMAL.match(text):
        mantissa, _, exponent = text.lower().partition("e")
        places = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
        half = mpmath.mpf(10) ** (-places) / 2
    return Entry(text, value, half)


# -- numbers --------------------------------------------------------------------------


def _mp(x: sympy.Expr) -> mpmath.mpf:
    from ._exact import to_mpf

    with mpmath.workdps(DPS + 10):
        return to_mpf(x, DPS)


def _same_shape(a: Grid | None, b: Grid) -> bool:
    return a is not None and len(a) == len(b) and len(a[0]) == len(b[0])


# -- marking ------------------------------------------------------------------------------

# A relation that cannot be computed from the values at hand (a shape that does not fit, a row
# with nothing allowed) gives no follow-through and no candidate mistake.
_CANNOT = (Undefined, ValueError, IndexError, TypeError, ZeroDivisionError)


def mark(derivation: Derivation, answers: dict[str, Answer], tolerance: float | None = None, source: str = "") -> Marking:
    """Mark every answered stage, in the derivation's order."""
    if not derivation.can_evaluate:
        raise SymattnError("the problem has symbols without values; give values to check answers against it")
    marker = _Marker(derivation, answers, tolerance)
    return Marking(source, tuple(marker.stage(step.id) for step in derivation.steps if step.id in answers))


class _Marker:
    def __init__(self, d: Derivation, answers: dict[str, Answer], tolerance: float | None) -> None:
        self.d = d
        self.answers = answers
        self.tolerance = None if tolerance is None else mpmath.mpf(tolerance)
        self.ops = NumericOps(DPS, d.problem.substitutions)

    def carried(self, id: str) -> tuple[Grid | None, frozenset[str]]:
        """A stage as the student's answers make it: their answer where given, else computed
        from their own answers further back (through stages they skipped), else exact; with
        the answered stages it rests on."""
        cache = self.__dict__.setdefault("_carried", {})
        if id not in cache:
            if id in self.answers:
                cache[id] = (self.answers[id].values, frozenset([id]))
            else:
                grid, used = self.follow_through(id)
                cache[id] = (grid, used) if used and grid is not None else (self.exact(id), frozenset())
        return cache[id]

    def exact(self, id: str) -> Grid:
        return self.d.evaluate(id, DPS)

    def matches(self, answer: Answer, target: Grid | None, slack: mpmath.mpf = mpmath.mpf(0)) -> list[tuple[int, int]]:
        """The entries of ``answer`` that do not match ``target`` (all of them if shapes differ)."""
        rows, cols = len(answer.entries), len(answer.entries[0])
        if not _same_shape(target, answer.values):
            return [(i, j) for i in range(rows) for j in range(cols)]
        bad = []
        for i, row in enumerate(answer.entries):
            for j, entry in enumerate(row):
                if not self.entry_matches(entry, target[i][j], slack):
                    bad.append((i, j))
        return bad

    def entry_matches(self, entry: Entry, want: mpmath.mpf, slack: mpmath.mpf) -> bool:
        got = entry.approx
        if want == NINF or got == NINF:
            return want == got
        with mpmath.workdps(DPS + 10):
            error = abs(got - want)
            if self.tolerance is not None:
                return error <= self.tolerance
            if entry.half_unit is None and slack == 0:
                # an exact answer must be equal: equal to 25 digits, then exactly where it can be decided
                return error <= mpmath.mpf(10) ** (-25) * max(1, abs(want))
            limit = (entry.half_unit or 0) + slack * max(1, abs(want))
            return error <= limit * (1 + mpmath.mpf(10) ** -20)

    # -- one stage ---------------------------------------------------------------------

    def stage(self, id: str) -> StageMark:
        answer = self.answers[id]
        exact = self.exact(id)
        wrong = self.matches(answer, exact)
        if not wrong:
            return StageMark(id, "right")
        follow, used = self.follow_through(id)
        # only an earlier answer that is itself not right can carry an error forward
        carriers = sorted(u for u in used if self.matches(self.answers[u], self.exact(u)))
        if follow is not None and carriers:
            slack = 4 * max(self.answers[u].coarsest for u in used)
            if not self.matches(answer, follow, slack):
                return StageMark(id, "follows", note=f"right when computed from your {', '.join(carriers)}")
        step = self.d.step(id)
        shown = []
        for i, j in wrong[:MAX_WRONG_SHOWN]:
            value = step.lazy[i, j]
            shown.append(
                WrongEntry(
                    i, j, answer.entries[i][j].text,
                    "-oo" if value == sympy.S.NegativeInfinity else sympy.sstr(value, order="none"),
                    None if exact[i][j] == NINF else float(exact[i][j]),
                )
            )
        return StageMark(id, "wrong", tuple(shown), len(wrong), self.diagnose(id, answer, exact, wrong))

    def follow_through(self, id: str) -> tuple[Grid | None, frozenset[str]]:
        """The stage computed by its relation from the student's own earlier answers, and which
        answers it rests on."""
        step = self.d.step(id)
        kind = step.kind_of
        if step.given or kind.relation is None:
            return None, frozenset()
        c = stages.Context(self.d.problem, step.head)
        used: set[str] = set()

        def carried(key: str, head=...) -> Grid:
            grid, rests_on = self.carried(stages.resolve(key, c, head)[0])
            used.update(rests_on)
            return grid

        try:
            return self.ops.grid(kind.relation(self.ops, carried, c)), frozenset(used)
        except _CANNOT:
            return None, frozenset(used)

    # -- diagnosis --------------------------------------------------------------------

    def diagnose(self, id: str, answer: Answer, exact: Grid, wrong: list[tuple[int, int]]) -> str | None:
        step = self.d.step(id)
        slack = 4 * max([answer.coarsest] + [self.answers[a].coarsest for a in self.answers])
        for name, candidate in self.mistakes(step):
            if not self.matches(answer, candidate, slack):
                return name
        if len(wrong) == 1:
            i, j = wrong[0]
            given = answer.entries[i][j]
            off = given.approx - exact[i][j] if exact[i][j] != NINF and given.approx != NINF else None
            label = f"{id}[{i}][{j}]"
            if off is not None and given.half_unit is None and abs(off - round(off)) < 1e-20 and abs(off) <= 2:
                return f"arithmetic slip: {label} is off by {int(round(off)):+d}; everything else is right"
            return f"a single wrong entry: {label}; everything else is right"
        if step.kind_of.slips and all(
            answer.entries[i][j].approx != NINF
            and exact[i][j] != NINF
            and abs(abs(answer.entries[i][j].approx - exact[i][j]) - 1) < 1e-20
            for i, j in wrong
        ) and len(wrong) <= 3:
            places = ", ".join(f"{id}[{i}][{j}]" for i, j in wrong)
            return f"arithmetic slips: {places} are each off by 1"
        return None

    def mistakes(self, step):
        """(name, values) for each of the stage's common mistakes (see the registry) that can be
        computed for this problem, in the registry's order."""
        c = stages.Context(self.d.problem, step.head)

        def exact(key: str, head=...) -> Grid:
            return self.exact(stages.resolve(key, c, head)[0])

        for mistake in step.kind_of.mistakes:
            try:
                candidate = mistake.relation(self.ops, exact, c)
            except Undefined:
                continue  # this candidate has no value here; the next may
            except _CANNOT:
                return
            if candidate is not None:
                yield mistake.name, self.ops.grid(candidate)


# -- reports --------------------------------------------------------------------------------


def _approx(w: WrongEntry) -> str:
    """`` ≈ 0.4231`` after an expected value that is not a plain number already."""
    if w.expected_approx is None or re.fullmatch(r"-?[0-9]+", w.expected):
        return ""
    return f" ≈ {w.expected_approx:.6g}"


def report_text(m: Marking) -> str:
    lines = []
    for s in m.stages:
        mark_ = {"right": "✓", "follows": "✓ (follows)", "wrong": "✗"}[s.status]
        line = f"{mark_} {s.id}"
        if s.note:
            line += f": {s.note}"
        if s.status == "wrong":
            line += f": {s.wrong_count} wrong " + ("entry" if s.wrong_count == 1 else "entries")
        lines.append(line)
        for w in s.wrong:
            lines.append(f"    [{w.row}][{w.col}]: you wrote {w.given}, expected {w.expected}{_approx(w)}")
        if s.wrong_count > len(s.wrong):
            lines.append(f"    ... and {s.wrong_count - len(s.wrong)} more")
        if s.diagnosis:
            lines.append(f"    likely cause: {s.diagnosis}")
    count = {k: sum(s.status == k for s in m.stages) for k in ("right", "follows", "wrong")}
    summary = f"{count['right']} of {len(m.stages)} stages right"
    if count["follows"]:
        summary += f", {count['follows']} right from your own earlier answers"
    if count["wrong"]:
        summary += f", {count['wrong']} wrong"
    lines.append(summary)
    return "\n".join(lines) + "\n"


def report_markdown(m: Marking) -> str:
    from .render.markdown import escape

    lines = ["| stage | verdict | details |", "|---|---|---|"]
    for s in m.stages:
        verdict = {"right": "✓ right", "follows": "✓ follows", "wrong": "✗ wrong"}[s.status]
        details = []
        if s.note:
            details.append(s.note)
        for w in s.wrong:
            details.append(f"[{w.row}][{w.col}]: {escape(w.given)} → {escape(w.expected)}{_approx(w)}")
        if s.diagnosis:
            details.append(f"likely cause: {s.diagnosis}")
        lines.append(f"| {s.id.replace('_', chr(92) + '_')} | {verdict} | {'<br>'.join(details)} |")
    return "\n".join(lines) + "\n"


def report_latex(m: Marking) -> str:
    from .render._grid import escape_tex

    rows = []
    for s in m.stages:
        verdict = {"right": "right", "follows": "follows", "wrong": "wrong"}[s.status]
        details = [escape_tex(s.note)] if s.note else []
        for w in s.wrong:
            details.append(f"[{w.row}][{w.col}]: {escape_tex(w.given)} $\\to$ \\texttt{{{escape_tex(w.expected)}}}")
        if s.diagnosis:
            details.append("likely cause: " + escape_tex(s.diagnosis))
        cell = " \\newline ".join(details) or "--"
        rows.append(f"{escape_tex(s.id)} & {verdict} & {cell} \\\\")
    body = "\n".join(rows)
    return (
        "\\begin{tabular}{l l p{0.6\\linewidth}}\n\\hline\nstage & verdict & details \\\\\n\\hline\n"
        + body
        + "\n\\hline\n\\end{tabular}\n"
    )
