"""The verdicts of a marking: a :class:`StageMark` per answered stage, its wrong entries and diagnosis,
and the :class:`Marking` of one set of answers (``as_dict`` gives the JSON of ``symattn check``)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_WRONG_SHOWN = 5


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

