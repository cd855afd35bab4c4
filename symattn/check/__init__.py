"""``symattn.check(derivation, answers)``: mark a hand calculation, as ``symattn check`` does.

>>> import symattn
>>> d = symattn.derive(symattn.load_problem("Q: [[0, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[2], [4]]\\n"))
>>> m = symattn.check(d, {"A": [["1/2", 0.5]], "O": [[4]]})
>>> m.passed, [s.status for s in m.stages]
(False, ['right', 'wrong'])
>>> print(m, end="")
✓ A: 1 exact, 1 rounded to the places written
✗ O: 1 wrong entry
    O[1,1]: you wrote 4, expected 3
    likely cause: arithmetic slip: O[1,1] is off by +1; everything else is right
1 of 2 stages right, 1 wrong

``answers`` is a mapping of stage ids to rows (each entry a string as an answers file writes
it, an int, a Fraction or a float), YAML text, or the path of an answers file. The rules are
:mod:`symattn.check.marker`'s. ``symattn.check`` is this module and that function at once: calling
the module calls :func:`check`, and ``from symattn.check import ...`` reaches the module.
"""

from __future__ import annotations

import decimal
import json
import math
import numbers
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import mpmath

from . import reports as check_reports
from ..callable_package import make_callable
from ..errors import SymattnError
from ..text import excerpt
from .reports import StageSummary, class_summary
from ..exact.derivation import Derivation
# the names ``from symattn.check import ...`` has always reached
from .answers import (  # noqa: F401
    ANSWER_BYTES_PER_ENTRY, ANSWERS_BYTES, DPS, Answer, Entry, answers_limit, load_answers, parse_answers, read_mapping,
)
from .marker import FLOAT_ULPS, FLOAT_UNITS, PRECISIONS, mark  # noqa: F401
from .verdicts import MAX_WRONG_SHOWN, RULES, Diagnosis, StageMark, WrongEntry, entry_name  # noqa: F401
from .verdicts import Marking as _Verdicts

TEXT_NAME = "<answers>"  # YAML text given as answers, in messages

Answers = Mapping | str | os.PathLike


@dataclass(frozen=True)
class Marking(_Verdicts):
    """The marking of one set of answers: ``passed``, and ``stages`` (a :class:`StageMark` per
    answered stage: ``id``, ``status``, ``wrong`` entries, ``diagnosis``, ``rules``, ...), with the
    reports of ``symattn check``: ``str()`` the text report, :meth:`to_json`, :meth:`to_markdown`,
    :meth:`to_latex`, :meth:`to_gradescope`, and in a notebook a table. ``derivation`` is the one
    the answers were marked against (it names the stages for Gradescope)."""

    derivation: Derivation | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> str:
        """What ``symattn check --format json`` prints."""
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"

    def to_gradescope(self, *, points: int = 1, visibility: str = "visible", ask: Iterable[str] | None = None,
                      expected: bool = True) -> str:
        """What ``symattn check --format gradescope`` writes: Gradescope's ``results.json``, a test
        per stage worth ``points`` (see :mod:`symattn.check.gradescope` for the rules, ``visibility``,
        ``ask`` and ``expected``)."""
        from . import gradescope

        return gradescope.to_json(gradescope.results(self, self.derivation, points=points, visibility=visibility,
                                                     ask=ask, expected=expected))

    def __str__(self) -> str:
        return check_reports.report_text(self)

    def to_markdown(self) -> str:
        return check_reports.report_markdown(self)

    def to_latex(self) -> str:
        return check_reports.report_latex(self)

    def _repr_html_(self) -> str:
        return check_reports.report_html(self)

    def __repr__(self) -> str:
        return f"<symattn.Marking: {str(self).splitlines()[-1]}>"


@dataclass(frozen=True)
class Marked:
    """One answers set of a class: its name, and its marking or the one-line error that stopped it."""

    name: str
    marking: Marking | None
    error: str | None = None


@dataclass(frozen=True)
class ClassMarking:
    """A class's answers marked together: ``files`` (a :class:`Marked` each, in the order given),
    ``summary`` (a :class:`~symattn.check.reports.StageSummary` per stage answered, in the
    formula's order), with the reports of ``symattn check`` on several files: ``str()``,
    :meth:`to_json`, :meth:`to_csv`, and in a notebook the summary as a table."""

    files: tuple[Marked, ...]
    summary: tuple[StageSummary, ...]
    ids: tuple[str, ...]  # the stages any file answered, in the formula's order

    @property
    def passed(self) -> bool:
        """Every set read and every stage of it right."""
        return all(f.marking is not None and f.marking.passed for f in self.files)

    def _triples(self) -> list[tuple[str, Marking | None, str | None]]:
        return [(f.name, f.marking, f.error) for f in self.files]

    def __str__(self) -> str:
        return check_reports.class_text(self._triples(), list(self.ids), list(self.summary))

    def to_csv(self) -> str:
        return check_reports.class_csv(self._triples(), list(self.ids))

    def to_json(self) -> str:
        out = {"files": [{"file": f.name, **(f.marking.as_dict() if f.marking else {"error": f.error})} for f in self.files],
               "summary": [s.as_dict() for s in self.summary]}
        return json.dumps(out, indent=2, ensure_ascii=False) + "\n"

    def _repr_html_(self) -> str:
        return check_reports.summary_html(list(self.summary))


def check(derivation: Derivation, answers: Answers, *, precision: str = "auto",
          tolerance: float | None = None) -> Marking:
    """Mark ``answers`` against ``derivation``, stage by stage (see :mod:`symattn.check.marker` for the
    rules, ``precision`` and ``tolerance``). Bad answers raise :class:`~symattn.SymattnError` with
    the message ``symattn check`` prints."""
    tolerance = _tolerance(tolerance)
    _precision(precision)
    return _mark(derivation, answers, precision, tolerance)


def check_class(derivation: Derivation, answers: Mapping[str, Answers] | Iterable[tuple[str, Answers]], *,
                precision: str = "auto", tolerance: float | None = None) -> ClassMarking:
    """Mark a class's answers, ``{name: answers, ...}`` (or (name, answers) pairs), each as
    :func:`check` does; a set that cannot be read is reported by name and the rest still marked."""
    tolerance = _tolerance(tolerance)
    _precision(precision)
    files = []
    shared: dict = {}  # comparisons of entries, the same for every file
    for name, given in (answers.items() if isinstance(answers, Mapping) else answers):
        try:
            files.append(Marked(str(name), _mark(derivation, given, precision, tolerance, str(name), shared)))
        except SymattnError as exc:
            files.append(Marked(str(name), None, str(exc)))
    seen = {s.id for f in files if f.marking is not None for s in f.marking.stages}
    ids = [step.id for step in derivation.steps if step.id in seen]  # in the formula's order
    summary = class_summary([f.marking for f in files if f.marking is not None], ids)
    return ClassMarking(tuple(files), tuple(summary), tuple(ids))


def _mark(derivation: Derivation, answers: Answers, precision: str, tolerance, source: str | None = None,
          shared: dict | None = None) -> Marking:
    read, name = read_answers(answers, derivation)
    verdicts = mark(derivation, read, tolerance, source or name, precision, shared)
    return Marking(verdicts.source, verdicts.stages, derivation)


def read_answers(answers: Answers, derivation: Derivation) -> tuple[dict[str, Answer], str]:
    """The answers, validated against the derivation's stages, and how messages name them."""
    if isinstance(answers, Mapping):
        return read_mapping(answers, derivation), ""
    if isinstance(answers, str) and ("\n" in answers or answers.lstrip().startswith("{")):
        limit = answers_limit(derivation)
        if len(answers) > limit:
            raise SymattnError(f"the answers are {len(answers):,} characters, more than the {limit:,} an answers "
                               "file of this problem may be", file=TEXT_NAME)
        return parse_answers(answers, TEXT_NAME, derivation), TEXT_NAME
    if isinstance(answers, (str, os.PathLike)):
        if _is_folder(answers):
            raise SymattnError("is a folder, not an answers file", file=str(answers))
        return load_answers(answers, derivation), str(answers)
    raise SymattnError("answers are a mapping of stage ids to matrices, YAML text or the path of an answers file, "
                       f"not {excerpt(type(answers).__name__)}")


def _is_folder(path: str | os.PathLike) -> bool:
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False  # reading it says what is wrong


def _precision(precision) -> None:
    if precision not in PRECISIONS:
        shown = excerpt(precision if isinstance(precision, str) else repr(precision))
        raise SymattnError(f"precision {shown} is not one of {', '.join(PRECISIONS)}")


def _tolerance(value):
    """A tolerance as the marker compares with it (exactly, for a float as for a Fraction)."""
    if value is None:
        return None
    wrong = f"a tolerance is a number, 0 or more, not {excerpt(value if isinstance(value, str) else repr(value))}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise SymattnError(wrong, field="tolerance")
    if isinstance(value, numbers.Rational):
        exact = Fraction(int(value.numerator), int(value.denominator))
    elif isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise SymattnError(wrong, field="tolerance")
        exact = Fraction(value)
    else:
        if math.isnan(float(value)) or float(value) < 0:
            raise SymattnError(wrong, field="tolerance")
        if math.isinf(float(value)):
            return mpmath.inf  # every finite entry is within it
        exact = Fraction(float(value))
    if exact < 0:
        raise SymattnError(wrong, field="tolerance")
    with mpmath.workdps(DPS + 10):
        return mpmath.mpf(exact.numerator) / exact.denominator


make_callable(__name__, check)  # symattn.check is this package; calling it calls check()
