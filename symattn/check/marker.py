"""Marking a hand calculation: stage by stage, entry by entry, with diagnosis.

An answers file is a YAML mapping from stage ids (``Q``, ``S_scaled``, ``A``,
``head1.A``, ...) to matrices. Each entry is right by one of these rules, and the
marking says which:

* ``exact``: an integer, a fraction or an expression (``"1/3"``,
  ``"e^(1/2)/(1 + e^(1/2))"``, ``"-inf"``) equal to the exact value;
* ``rounding``: a decimal (``0.4231``) that is the exact value rounded to the places
  written: within half a unit in the last written place;
* ``float32`` / ``float64``: a decimal that a computation in that binary format gives
  (an autograder's ``0.42693272`` for 0.4269327007…): within half a unit in the last
  written place plus the format's rounding (32 units of its last place, times the size
  of the stage's largest entry, at least 1). With ``precision="auto"`` (the default) a
  stage is marked this way only when *every* entry of it fits one format, and the
  marking says "matches a float32 computation"; ``precision="float32"`` or ``"float64"``
  accepts any entry that fits; ``precision="exact"`` never does;
* ``tolerance``: with ``tolerance`` given, any entry within that absolute difference
  (instead of every rule above).

Each wrong stage is also compared with the same stage computed from the student's
*own* earlier answers by the stage's relation (follow-through marking): one early slip
is marked once. That comparison allows, besides each entry's own rule, the rounding
carried in from the earlier answers it rests on: two units in the last place of the
coarsest of them, times the size of the value (at least 1).

A stage that is still wrong is compared with the registry's common mistakes. A mistake
is named only when it reproduces every entry under that entry's own rule and differs
from the right answer at the precision written (a mistake that changes nothing here,
such as a missing mask on a problem without one, is never named); when two reproduce
it equally, both are named. Otherwise one wrong entry is called an arithmetic slip or a
single wrong entry, and entries off by a unit or two in the last written place are
called rounding slips.
"""

from __future__ import annotations

import decimal
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import mpmath
import sympy
import yaml

from ..problem import located_yaml as _yaml
from .. import stages
from ..errors import SymattnError
from ..reading import FileError, read_regular
from ..numbers.parse import MAX_TEXT, NumberError, parse_number
from ..text import did_you_mean, excerpt
from ..exact.numeric_ops import NumericOps
from ..exact.ops import Undefined
from ..exact.derivation import Derivation

DPS = 30
# The size of an answers file: this much, plus so much per entry of the problem's computed stages.
ANSWERS_BYTES = 1_000_000
ANSWER_BYTES_PER_ENTRY = 64
MAX_WRONG_SHOWN = 5
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?\Z")
_E = {"e": sympy.E}
_LONGEST_ID = 100  # characters: a longer key is no misspelt stage id, and difflib is not run over it
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
    line: int | None  # of its stage id in the answers file (None for Python values)

    @cached_property
    def values(self) -> Grid:  # computed once: marking compares it with many candidates
        return [[e.approx for e in row] for row in self.entries]

    @property
    def coarsest(self) -> mpmath.mpf:
        """The largest half-unit among the entries (0 when all are exact)."""
        units = [e.half_unit for row in self.entries for e in row if e.half_unit is not None]
        return max(units, default=mpmath.mpf(0))


def entry_name(stage: str, i: int, j: int) -> str:
    """How a person names entry (i, j) (0-based) of a stage: ``S[2,1]``, counting from 1 as the
    worked solution's subscripts do."""
    return f"{stage}[{i + 1},{j + 1}]"


@dataclass(frozen=True)
class WrongEntry:
    """A wrong entry: ``row`` and ``col`` count from 0 (JSON); :func:`entry_name` names it for people."""

    row: int
    col: int
    given: str
    expected: str
    expected_approx: float | None

    def as_dict(self) -> dict:
        return {"row": self.row, "col": self.col, "given": self.given, "expected": self.expected,
                "expected_approx": self.expected_approx}


@dataclass(frozen=True)
class Diagnosis:
    """Why a stage is likely wrong: ``kind`` is ``mistake`` (a common mistake reproduces the
    answer; ``mistakes`` names it, or the several that reproduce it equally), ``arithmetic slip``,
    ``single entry`` or ``rounding slips`` (``entries``: 0-based positions)."""

    kind: str
    text: str
    mistakes: tuple[str, ...] = ()
    entries: tuple[tuple[int, int], ...] = ()

    def as_dict(self) -> dict:
        out: dict = {"kind": self.kind, "text": self.text}
        if self.mistakes:
            out["mistakes"] = list(self.mistakes)
        if self.entries:
            out["entries"] = [{"row": i, "col": j} for i, j in self.entries]
        return out


RULES = ("exact", "rounding", "float64", "float32", "tolerance")


@dataclass(frozen=True)
class StageMark:
    """The verdict on one stage: ``right``, ``wrong`` or ``follows`` (error carried forward).

    ``wrong`` lists every wrong entry (reports may elide, JSON does not); ``rules`` gives, for
    each entry, the rule that made it right (see :data:`RULES`; None where it is wrong);
    ``follows_from`` names the earlier answers a ``follows`` verdict rests on; ``precision``
    is ``float32`` or ``float64`` when the stage was accepted as that format's computation.
    """

    id: str
    status: str
    wrong: tuple[WrongEntry, ...] = ()
    wrong_count: int = 0
    diagnosis: Diagnosis | None = None
    note: str | None = None
    rules: tuple[tuple[str | None, ...], ...] = ()
    follows_from: tuple[str, ...] = ()
    precision: str | None = None

    @property
    def rule_counts(self) -> dict[str, int]:
        """How many entries each rule made right."""
        flat = [r for row in self.rules for r in row if r is not None]
        return {rule: flat.count(rule) for rule in RULES if rule in flat}

    def as_dict(self) -> dict:
        out: dict = {"id": self.id, "status": self.status}
        if self.wrong:
            out["wrong"] = [w.as_dict() for w in self.wrong]
            out["wrong_count"] = self.wrong_count
        if self.diagnosis:
            out["diagnosis"] = self.diagnosis.text
            out["diagnosis_detail"] = self.diagnosis.as_dict()
        if self.note:
            out["note"] = self.note
        if self.follows_from:
            out["follows_from"] = list(self.follows_from)
        if self.precision:
            out["precision"] = self.precision
        if self.rules:
            out["rules"] = [list(row) for row in self.rules]
            out["rule_counts"] = self.rule_counts
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
        data = read_regular(path, answers_limit(derivation),
                            "the file is {size} bytes, more than the {limit} an answers file of this problem may be",
                            noun="answers file")
    except FileError as exc:
        raise SymattnError(str(exc), file=name) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SymattnError(f"the file is not UTF-8 text (bad byte at offset {exc.start})", file=name) from None
    if "\x00" in text:
        raise SymattnError("the file holds a NUL byte; it is not a text file", file=name)
    return parse_answers(text, name, derivation)


def answers_limit(derivation: Derivation) -> int:
    """The most bytes an answers file of this derivation's problem may hold."""
    return ANSWERS_BYTES + ANSWER_BYTES_PER_ENTRY * _entries(derivation)


def _entries(derivation: Derivation) -> int:
    """How many entries all the stages an answers file may answer hold together."""
    return sum(rows * cols for rows, cols in (s.shape for s in derivation.steps if not s.given))


def parse_answers(text: str, name: str, derivation: Derivation) -> dict[str, Answer]:
    # every entry, a stage id per row at most, and room for the rest
    root = _yaml.compose(text, name, max_values=2 * _entries(derivation) + 10_000)
    if root is None or _yaml.is_null(root):
        raise SymattnError("the answers file is empty; write stage ids with your matrices, e.g. S: [[1, 2], [3, 4]]", file=name)
    _yaml.check_tags(root, name)
    if not isinstance(root, yaml.MappingNode):
        raise _yaml.where(name, root).error(f"an answers file is a mapping of stage ids to matrices, not {_yaml.kind(root)}")
    out = _read_answers(root.value, _Nodes(name), derivation)
    if not out:
        raise SymattnError("the answers file has no answers", file=name)
    return out


def read_mapping(answers: Mapping, derivation: Derivation) -> dict[str, Answer]:
    """Validate answers given as Python values, ``{stage id: rows}``, with the rules and messages of
    an answers file (an entry is named by its stage, row and column, counting from 1): each entry
    a string as a file writes it, an int, a Fraction, or a float (read as its shortest decimal,
    ``0.4231``, as it was typed)."""
    out = _read_answers(answers.items(), _Values(), derivation)
    if not out:
        raise SymattnError('the answers have no stages; give stage ids with matrices, e.g. {"S": [[1, 2], [3, 4]]}')
    return out


class _Nodes:
    """What :func:`_read_answers` needs to know of an answers file's YAML nodes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def where(self, node) -> _yaml.Where:
        return _yaml.where(self.name, node)

    def key(self, node) -> str | None:
        return node.value if isinstance(node, yaml.ScalarNode) else None

    def line(self, node) -> int | None:
        return node.start_mark.line + 1

    def rows(self, node) -> list | None:
        return node.value if isinstance(node, yaml.SequenceNode) else None

    def text(self, node) -> str | None:
        if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node) or _yaml.is_bool(node):
            return None
        return node.value

    kind = staticmethod(_yaml.kind)


class _Unplaced:
    """A place in Python values: messages name the field alone."""

    def error(self, message: str, field: str | None = None) -> SymattnError:
        return SymattnError(message, field=field)


class _Values:
    """The same for answers given as Python values (see :func:`read_mapping`)."""

    _HERE = _Unplaced()

    def where(self, value) -> _Unplaced:
        return self._HERE

    def key(self, value) -> str | None:
        return value if isinstance(value, str) else None

    def line(self, value) -> int | None:
        return None

    def rows(self, value) -> list | None:
        if isinstance(value, (list, tuple)):
            return list(value)
        if not isinstance(value, (str, bytes, Mapping)) and callable(getattr(value, "tolist", None)):
            listed = value.tolist()  # a NumPy array or a SymPy matrix
            return listed if isinstance(listed, list) else None
        return None

    def text(self, value) -> str | None:
        """An entry as an answers file would write it; None when it is no number."""
        if isinstance(value, str):
            return value
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, numbers.Integral):
            return _digits(int(value))
        if isinstance(value, numbers.Rational):
            top, bottom = _digits(int(value.numerator)), _digits(int(value.denominator))
            return top if bottom == "1" else f"{top}/{bottom}"
        if isinstance(value, float):
            return repr(value)  # the shortest decimal that is this float: what was typed
        if isinstance(value, (numbers.Real, decimal.Decimal)):
            return str(value)  # NumPy's float32 prints its own shortest decimal
        return None

    def kind(self, value) -> str:
        if isinstance(value, (list, tuple)):
            return "a list"
        if isinstance(value, Mapping):
            return "a mapping"
        if value is None:
            return "empty"
        return excerpt(value if isinstance(value, str) else repr(value))


def _digits(n: int) -> str:
    """An integer's decimal digits, or NumberError when it has more than an entry may (before
    Python is asked to print thousands of them)."""
    if n.bit_length() > 4 * MAX_TEXT:
        raise NumberError(f"the entry is longer than {MAX_TEXT} characters")
    return str(n)


def _read_answers(items, values, derivation: Derivation) -> dict[str, Answer]:
    """Each (stage id, matrix) pair checked against the derivation's stages, read by ``values``
    (:class:`_Nodes` for a file's YAML, :class:`_Values` for Python values)."""
    ids = [s.id for s in derivation.steps if not s.given]
    out: dict[str, Answer] = {}
    for key, node in items:
        where = values.where(key)
        stage = values.key(key)
        if stage is None:
            raise where.error(f"a stage id is a name such as S or head1.A, not {values.kind(key)}")
        if stage not in ids and derivation.problem.backward is None and stages.split_id(str(stage))[1] in stages.GRADIENT_NAMES:
            raise where.error(
                f"{stage} is a gradient of the backward pass, which this problem does not derive; "
                "add a backward: section to the problem or mark with --backward"
            )
        if stage not in ids and derivation.problem.tiling is None and stages.split_id(str(stage))[1] in stages.TILED_NAMES:
            raise where.error(
                f"{stage} is a stage of the online (tiled) softmax, which this problem does not derive; "
                "add tiling: {block: B} to the problem or mark with --tiled B"
            )
        head, kind = stages.split_id(str(stage))
        shared = stages.Context(derivation.problem, head).reads(kind, head) if head else head
        if stage not in ids and head and shared != head and head <= len(derivation.problem.heads):
            raise where.error(f"head {head} reads K/V group {derivation.problem.kv_group(head)}, whose {kind} is "
                              f"{stages.stage_id(kind, shared)} (a group's keys and values are written once, "
                              "with its first head)")
        if stage not in ids:
            hint = did_you_mean(stage, ids) if len(stage) <= _LONGEST_ID else ""
            raise where.error(f"{excerpt(stage)} is not a computed stage of this problem{hint}; "
                              f"the stages are {', '.join(ids)}")
        if stage in out:
            raise where.error(f"{stage} is answered twice")
        out[stage] = _read_matrix(values, stage, node, derivation.step(stage).shape, values.line(key))
    return out


def _read_matrix(values, stage: str, node, shape: tuple[int, int], line: int | None) -> Answer:
    where = values.where(node)
    matrix = values.rows(node)
    if not matrix:
        raise where.error(f"an answer is a matrix written as a list of rows, not {values.kind(node)}", stage)
    rows, cols = shape
    if len(matrix) != rows:
        raise where.error(f"{stage} is {rows}×{cols} but the answer has {len(matrix)} rows", stage)
    entries = []
    for i, row in enumerate(matrix):
        cells = values.rows(row)
        if cells is None or len(cells) != cols:
            n = len(cells) if cells is not None else "no"
            future = (" (the cache holds keys 1 to t only: an entry for a key after t used a future key)"
                      if stages.split_id(stage)[1] in (stages.S_T, stages.A_T) and isinstance(n, int) and n > cols else "")
            raise values.where(row).error(f"{stage} has {cols} columns but this row has {n} entries{future}",
                                          f"{stage} row {i + 1}")
        entries.append(tuple(_read_entry(values, f"{stage} row {i + 1}, column {j + 1}", e) for j, e in enumerate(cells)))
    return Answer(stage, tuple(entries), line)


def _read_entry(values, field_name: str, node) -> Entry:
    where = values.where(node)
    try:
        text = values.text(node)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if text is None:
        raise where.error(f"expected a number, not {values.kind(node)}", field_name)
    text = text.strip()
    try:
        value = parse_number(text, symbols=_E, allow_neg_inf=True)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if value.free_symbols:
        raise where.error(f"{excerpt(text)} is not a number", field_name)
    half = None
    if _DECIMAL.match(text):
        mantissa, _, exponent = text.lower().partition("e")
        places = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
        half = mpmath.mpf(10) ** (-places) / 2
    return Entry(text, value, half)


# -- numbers --------------------------------------------------------------------------


def _mp(x: sympy.Expr) -> mpmath.mpf:
    from ..exact.evaluation import to_mpf

    with mpmath.workdps(DPS + 10):
        return to_mpf(x, DPS)


def _same_shape(a: Grid | None, b: Grid) -> bool:
    return a is not None and len(a) == len(b) and len(a[0]) == len(b[0])


# -- marking ------------------------------------------------------------------------------

# A relation that cannot be computed from the values at hand (a shape that does not fit, a row
# with nothing allowed) gives no follow-through and no candidate mistake.
_CANNOT = (Undefined, ValueError, IndexError, TypeError, ZeroDivisionError)
# The unit roundoff of each binary format, and how many of its units a computation in it may
# carry (times the size of the stage's largest entry, at least 1): summing a few dozen rounded
# products, exp and a division.
FLOAT_UNITS = {"float64": mpmath.mpf(2) ** -53, "float32": mpmath.mpf(2) ** -24}
FLOAT_ULPS = 32
PRECISIONS = ("auto", "exact", "float32", "float64")
_EXACT_DIGITS = mpmath.mpf(10) ** -25  # an exact answer is equal to 25 digits, then exactly where it can be decided


def mark(derivation: Derivation, answers: dict[str, Answer], tolerance: float | None = None, source: str = "",
         precision: str = "auto") -> Marking:
    """Mark every answered stage, in the derivation's order (see the module's rules)."""
    if not derivation.can_evaluate:
        raise SymattnError("the problem has symbols without values; give values to check answers against it")
    if precision not in PRECISIONS:
        raise SymattnError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    marker = _Marker(derivation, answers, tolerance, precision)
    return Marking(source, tuple(marker.stage(step.id) for step in derivation.steps if step.id in answers))


@dataclass(frozen=True)
class _Fit:
    """How an answer compares with a target matrix: the rule that matches each entry (None: none),
    and the float format used for the whole stage, if any."""

    rules: tuple[tuple[str | None, ...], ...]
    precision: str | None = None

    @property
    def wrong(self) -> list[tuple[int, int]]:
        return [(i, j) for i, row in enumerate(self.rules) for j, r in enumerate(row) if r is None]


class _Marker:
    def __init__(self, d: Derivation, answers: dict[str, Answer], tolerance: float | None, precision: str = "auto") -> None:
        self.d = d
        self.answers = answers
        with mpmath.workdps(DPS + 10):  # a float is kept exactly, a finer tolerance to these digits
            self.tolerance = None if tolerance is None else mpmath.mpf(tolerance)
        self.precision = precision
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

    def size(self, id: str) -> mpmath.mpf:
        """The size of a stage's largest finite entry (at least 1): what a float computation's rounding scales with."""
        finite = [abs(v) for row in self.exact(id) for v in row if v != NINF]
        return max([mpmath.mpf(1)] + finite)

    # -- comparing entries -------------------------------------------------------------

    def rule(self, entry: Entry, want: mpmath.mpf, slack: mpmath.mpf = mpmath.mpf(0),
             float_allowance: mpmath.mpf | None = None, fmt: str | None = None) -> str | None:
        """The rule by which ``entry`` matches ``want``, or None. ``slack`` (relative) is rounding
        carried in from earlier answers; ``float_allowance`` lets a decimal be a ``fmt`` computation."""
        got = entry.approx
        if want == NINF or got == NINF:
            return "exact" if want == got else None
        with mpmath.workdps(DPS + 10):
            error = abs(got - want)
            if self.tolerance is not None:
                return "tolerance" if error <= self.tolerance else None
            if entry.half_unit is None and slack == 0:
                return "exact" if error <= _EXACT_DIGITS * max(1, abs(want)) else None
            limit = (entry.half_unit or 0) + slack * max(1, abs(want))
            if error <= limit * (1 + mpmath.mpf(10) ** -20):
                return "exact" if entry.half_unit is None else "rounding"
            if float_allowance is not None and entry.half_unit is not None and error <= limit + float_allowance:
                return fmt
        return None

    def fit(self, answer: Answer, target: Grid | None, slack: mpmath.mpf = mpmath.mpf(0)) -> _Fit:
        """Each entry of ``answer`` against ``target`` (every entry wrong if the shapes differ), with
        the float formats as ``precision`` allows."""
        rows, cols = len(answer.entries), len(answer.entries[0])
        if not _same_shape(target, answer.values):
            return _Fit(tuple((None,) * cols for _ in range(rows)))
        plain = _Fit(tuple(tuple(self.rule(e, target[i][j], slack) for j, e in enumerate(row))
                           for i, row in enumerate(answer.entries)))
        if not plain.wrong or self.tolerance is not None or self.precision == "exact":
            return plain
        size = max([mpmath.mpf(1)] + [abs(v) for row in target for v in row if v != NINF])
        formats = ("float64", "float32") if self.precision == "auto" else (self.precision,)
        for fmt in formats:
            allowance = FLOAT_ULPS * FLOAT_UNITS[fmt] * size
            rules = tuple(tuple(r or self.rule(e, target[i][j], slack, allowance, fmt) for j, (r, e) in enumerate(zip(rrow, row)))
                          for i, (rrow, row) in enumerate(zip(plain.rules, answer.entries)))
            trial = _Fit(rules, fmt)
            if not trial.wrong or self.precision != "auto":
                return trial  # auto: only when every entry fits the format
        return plain

    def allowance(self, entry: Entry, want: mpmath.mpf) -> mpmath.mpf:
        """How far an entry may be from a value and still be that value, as written."""
        if self.tolerance is not None:
            return self.tolerance
        if entry.half_unit is None:
            return _EXACT_DIGITS * max(1, abs(want))
        return entry.half_unit

    def same_as_written(self, answer: Answer, a: Grid, b: Grid) -> bool:
        """Whether two matrices agree at every entry to the precision the answer is written in."""
        if not (_same_shape(a, answer.values) and _same_shape(b, answer.values)):
            return False
        with mpmath.workdps(DPS + 10):
            for i, row in enumerate(answer.entries):
                for j, entry in enumerate(row):
                    x, y = a[i][j], b[i][j]
                    if x == NINF or y == NINF:
                        if x != y:
                            return False
                    elif abs(x - y) > self.allowance(entry, y):
                        return False
        return True

    def misfit(self, answer: Answer, target: Grid) -> mpmath.mpf:
        """The largest distance of an entry from ``target``, in units of what it may be off by."""
        worst = mpmath.mpf(0)
        with mpmath.workdps(DPS + 10):
            for i, row in enumerate(answer.entries):
                for j, entry in enumerate(row):
                    got, want = entry.approx, target[i][j]
                    if got == NINF or want == NINF:
                        continue
                    worst = max(worst, abs(got - want) / max(self.allowance(entry, want), mpmath.mpf(10) ** -60))
        return worst

    # -- one stage ---------------------------------------------------------------------

    def stage(self, id: str) -> StageMark:
        answer = self.answers[id]
        exact = self.exact(id)
        fit = self.fit(answer, exact)
        if not fit.wrong:
            note = f"matches a {fit.precision} computation" if fit.precision and self.precision == "auto" else None
            return StageMark(id, "right", note=note, rules=fit.rules, precision=fit.precision)
        follow, used = self.follow_through(id)
        # only an earlier answer that is itself not right can carry an error forward
        carriers = tuple(sorted(u for u in used if self.fit(self.answers[u], self.exact(u)).wrong))
        if follow is not None and carriers:
            slack = 4 * max(self.answers[u].coarsest for u in used)
            carried = self.fit(answer, follow, slack)
            if not carried.wrong:
                return StageMark(id, "follows", note=f"right when computed from your {', '.join(carriers)}",
                                 rules=carried.rules, follows_from=carriers, precision=carried.precision)
        step = self.d.step(id)
        wrong = fit.wrong
        shown = []
        for i, j in wrong:
            value = step.lazy[i, j]
            shown.append(
                WrongEntry(
                    i, j, answer.entries[i][j].text,
                    "-oo" if value == sympy.S.NegativeInfinity else sympy.sstr(value, order="none"),
                    None if exact[i][j] == NINF else float(exact[i][j]),
                )
            )
        return StageMark(id, "wrong", tuple(shown), len(wrong), self.diagnose(step, answer, exact, wrong), rules=fit.rules)

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

    def diagnose(self, step, answer: Answer, exact: Grid, wrong: list[tuple[int, int]]) -> Diagnosis | None:
        id = step.id
        fits = []
        for name, candidate in self.mistakes(step):
            if self.same_as_written(answer, candidate, exact):
                continue  # this mistake changes nothing here: it cannot be the cause
            if not self.fit(answer, candidate).wrong:
                fits.append((self.misfit(answer, candidate), name, candidate))
        if fits:
            fits.sort(key=lambda f: f[0])
            best = fits[0]
            equal = [f[1] for f in fits[1:] if self.same_as_written(answer, f[2], best[2])]
            if equal:
                names = (best[1], *equal)
                text = best[1] + "; or, giving the same numbers here, " + "; or ".join(equal)
                return Diagnosis("mistake", text, names)
            return Diagnosis("mistake", best[1], (best[1],))
        if len(wrong) == 1:
            i, j = wrong[0]
            given = answer.entries[i][j]
            off = given.approx - exact[i][j] if exact[i][j] != NINF and given.approx != NINF else None
            label = entry_name(id, i, j)
            if off is not None and given.half_unit is None and abs(off - round(off)) < 1e-20 and abs(off) <= 2:
                return Diagnosis("arithmetic slip",
                                 f"arithmetic slip: {label} is off by {int(round(off)):+d}; everything else is right",
                                 entries=((i, j),))
            if not self._rounding_slip(answer, exact, i, j):
                return Diagnosis("single entry", f"a single wrong entry: {label}; everything else is right",
                                 entries=((i, j),))
        if step.kind_of.slips and all(
            answer.entries[i][j].approx != NINF
            and exact[i][j] != NINF
            and abs(abs(answer.entries[i][j].approx - exact[i][j]) - 1) < 1e-20
            for i, j in wrong
        ) and len(wrong) <= 3:
            places = ", ".join(entry_name(id, i, j) for i, j in wrong)
            return Diagnosis("arithmetic slip", f"arithmetic slips: {places} are each off by 1", entries=tuple(wrong))
        if all(self._rounding_slip(answer, exact, i, j) for i, j in wrong):
            places = ", ".join(entry_name(id, i, j) for i, j in wrong[:MAX_WRONG_SHOWN])
            more = f" and {len(wrong) - MAX_WRONG_SHOWN} more" if len(wrong) > MAX_WRONG_SHOWN else ""
            what = "rounding slip" if len(wrong) == 1 else "rounding slips"
            verb = "is" if len(wrong) == 1 else "are"
            return Diagnosis("rounding slips",
                             f"{what}: {places}{more} {verb} within two units of the last written place of the exact "
                             "value; round the exact values, not values already rounded", entries=tuple(wrong))
        return None

    def _rounding_slip(self, answer: Answer, exact: Grid, i: int, j: int) -> bool:
        """Whether a wrong decimal is within two units of its last written place of the exact value."""
        entry, want = answer.entries[i][j], exact[i][j]
        if entry.half_unit is None or want == NINF or entry.approx == NINF or self.tolerance is not None:
            return False
        with mpmath.workdps(DPS + 10):
            return abs(entry.approx - want) <= 4 * entry.half_unit

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
