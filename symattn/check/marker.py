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

from dataclasses import dataclass

import mpmath
import sympy

from .. import stages
from ..errors import SymattnError
from ..exact.numeric_ops import NumericOps
from ..exact.derivation import Derivation
from .answers import DPS, NINF, Answer, Entry, Grid
from .diagnosis import CANNOT, diagnose
from .verdicts import Marking, StageMark, WrongEntry


def _same_shape(a: Grid | None, b: Grid) -> bool:
    return a is not None and len(a) == len(b) and len(a[0]) == len(b[0])


# -- marking ------------------------------------------------------------------------------

# The unit roundoff of each binary format, and how many of its units a computation in it may
# carry (times the size of the stage's largest entry, at least 1): summing a few dozen rounded
# products, exp and a division.
FLOAT_UNITS = {"float64": mpmath.mpf(2) ** -53, "float32": mpmath.mpf(2) ** -24}
FLOAT_ULPS = 32
PRECISIONS = ("auto", "exact", "float32", "float64")
_EXACT_DIGITS = mpmath.mpf(10) ** -25  # an exact answer is equal to 25 digits, then exactly where it can be decided
with mpmath.workdps(DPS + 10):  # made once: each entry of each file is compared with them
    _MARGIN = 1 + mpmath.mpf(10) ** -20  # a decimal's own rounding, carried slack and the digits kept
    _TINY = mpmath.mpf(10) ** -60  # the least an entry may be off by, for misfit's ratio


def mark(derivation: Derivation, answers: dict[str, Answer], tolerance: float | None = None, source: str = "",
         precision: str = "auto", shared: dict | None = None) -> Marking:
    """Mark every answered stage, in the derivation's order (see the module's rules). ``shared``
    (a dict, empty at first) keeps the comparisons of entries for the next answers marked against
    the same derivation, tolerance and precision: a class's files write the same numbers."""
    if not derivation.can_evaluate:
        raise SymattnError("the problem has symbols without values; give values to check answers against it")
    if precision not in PRECISIONS:
        raise SymattnError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    marker = _Marker(derivation, answers, tolerance, precision, shared)
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
    def __init__(self, d: Derivation, answers: dict[str, Answer], tolerance: float | None, precision: str = "auto",
                 shared: dict | None = None) -> None:
        self.d = d
        self.rules: dict = {} if shared is None else shared
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
        key = (entry.text, want, slack, float_allowance, fmt)  # the entry's text is its value and places
        if key not in self.rules:
            self.rules[key] = self.compare(entry, want, slack, float_allowance, fmt)
        return self.rules[key]

    def compare(self, entry: Entry, want: mpmath.mpf, slack: mpmath.mpf, float_allowance: mpmath.mpf | None,
                fmt: str | None) -> str | None:
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
            if error <= limit * _MARGIN:
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
                    worst = max(worst, abs(got - want) / max(self.allowance(entry, want), _TINY))
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
        return StageMark(id, "wrong", tuple(shown), len(wrong), diagnose(self, step, answer, exact, wrong), rules=fit.rules)

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
        except CANNOT:
            return None, frozenset(used)

    # -- diagnosis --------------------------------------------------------------------
