"""Gradescope's ``results.json`` from a marking: what ``symattn check --format gradescope`` writes.

The format is Gradescope's autograder specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/). There is a test per stage,
in the formula's order, named as the worked solution names the stage (``Step 3: Scores (S)``;
with heads ``Head 2 · Step 3: Scores (head2.S)``):

* a stage right, or right when computed from the student's own earlier answers (follow-through),
  scores its ``points``; a wrong stage scores 0. There is no credit per entry: the follow-through
  already marks one slip once, and a common mistake changes every entry it touches;
* its ``output`` is the stage's feedback as ``symattn check`` prints it (entries counted from 1,
  up to :data:`MAX_ENTRIES` of them, and the likely cause), or with ``expected=False`` without
  the values expected (see :func:`feedback`);
* with ``ask`` (the stages the exercise asks for, as ``derive --exercise --ask`` takes them),
  the tests are the asked stages: one not answered is a failed test scoring 0, and one answered
  but not asked is named in the top-level output and not scored. Without it, a test per stage
  answered.

The first test, ``Your answers file``, scores nothing and is always visible: it says whether the
file could be read and, if not, why (the score is then 0), so a student can correct a malformed
file before the due date whatever ``visibility`` hides. Every text is plain (``output_format``
and ``name_format`` ``text``): Gradescope shows a ``<script>`` in a title as those characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import SymattnError
from ..text import excerpt, show_bidi
from .reports import detail_lines, verdict_line
from .verdicts import StageMark, entry_name

if TYPE_CHECKING:
    from ..exact.derivation import Derivation
    from .verdicts import Marking

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")
MAX_ENTRIES = 50  # wrong entries listed in one stage's output
READING = "Your answers file"  # the first test's name


def results(marking: "Marking", derivation: "Derivation | None", *, points: int = 1, visibility: str = "visible",
            ask: Iterable[str] | None = None, expected: bool = True) -> dict:
    """The results of ``marking`` (made against ``derivation``) as Gradescope reads them; with
    ``expected=False``, the wrong entries without their expected values (see :func:`feedback`)."""
    _options(points, visibility)
    if not isinstance(expected, bool):
        raise SymattnError(f"expected is True or False, not {excerpt(repr(expected))}")
    marks = {s.id: s for s in marking.stages}
    names = stage_names(derivation)
    ids = [s.id for s in marking.stages] if ask is None else asked_ids(derivation, ask)
    tests = [_test(READING, None, "passed", "Read: " + (", ".join(marks) or "no stage") + " answered.",
                   {"verdict": "read"}, visible=True)]
    for id in ids:
        s = marks.get(id)
        if s is None:
            tests.append(_test(names.get(id, id), points, "failed", f"✗ {id}: not answered (your answers file has no {id})",
                               {"stage": id, "verdict": "not answered"}, score=0, tag=_kind(derivation, id)))
            continue
        passed = s.status != "wrong"
        text = "\n".join(feedback(s, expected))
        tests.append(_test(names.get(id, id), points, "passed" if passed else "failed", text,
                           {"stage": id, "verdict": s.status}, score=points if passed else 0,
                           tag=_kind(derivation, id)))
    scored = [t for t in tests if "max_score" in t]
    count = {v: sum(t["extra_data"]["verdict"] == v for t in scored) for v in ("right", "follows", "wrong", "not answered")}
    lines = [f"{count['right']} of {len(scored)} stages right"]
    lines += [f"{count[v]} {words}" for v, words in (("follows", "right from your own earlier answers"),
                                                      ("wrong", "wrong"), ("not answered", "not answered")) if count[v]]
    summary = ", ".join(lines) + "."
    unasked = [id for id in marks if id not in ids]
    if unasked:
        summary += f"\nNot asked, so not marked: {', '.join(unasked)}."
    score = sum(t["score"] for t in scored)
    return _top(derivation, score, f"Score {score} of {points * len(scored)}: {summary}", visibility, tests)


def unreadable(message: str, derivation: "Derivation | None", *, points: int = 1, visibility: str = "visible",
               ask: Iterable[str] | None = None) -> dict:
    """The results of an answers file that could not be read (``message`` says why): score 0, with
    the message in the top-level output and the first test's, and each asked stage failed."""
    _options(points, visibility)
    ids = [] if ask is None else asked_ids(derivation, ask)
    tests = [_test(READING, None, "failed", message, {"verdict": "unreadable"}, visible=True)]
    names = stage_names(derivation)
    tests += [_test(names.get(id, id), points, "failed", f"✗ {id}: not marked: your answers file could not be read",
                    {"stage": id, "verdict": "not marked"}, score=0, tag=_kind(derivation, id)) for id in ids]
    total = f" of {points * len(ids)}" if ids else ""
    text = f"Score 0{total}: your answers file could not be read, so nothing was marked.\n{message}"
    return _top(derivation, 0, text, visibility, tests)


def feedback(s: StageMark, expected: bool = True) -> list[str]:
    """A stage's output, a line each: its verdict, its wrong entries and their likely cause. Without
    ``expected`` a wrong entry is named without the value it should have, and an arithmetic
    slip without how far it is off (which would give the value away): a student who may submit
    again is not handed the answers."""
    if expected:
        return [verdict_line(s), *detail_lines(s, MAX_ENTRIES, " wrong entries")]
    lines = [verdict_line(s)]
    lines += [f"{entry_name(s.id, w.row, w.col)}: you wrote {w.given}, which is not right" for w in s.wrong[:MAX_ENTRIES]]
    if s.wrong_count > MAX_ENTRIES:
        lines.append(f"... and {s.wrong_count - MAX_ENTRIES} more wrong entries")
    if s.diagnosis:
        lines.append("likely cause: " + ("an arithmetic slip" if s.diagnosis.kind == "arithmetic slip" else s.diagnosis.text))
    return lines


def to_json(results: dict) -> str:
    """``results`` as ``results.json``: UTF-8 text, keys in a fixed order, a newline at the end."""
    return json.dumps(results, indent=2, ensure_ascii=False) + "\n"


def stage_names(derivation: "Derivation | None") -> dict[str, str]:
    """Each stage's name for people, as the worked solution heads it: ``Step 5: Add the mask (S_masked)``."""
    if derivation is None:
        return {}
    from ..render.outline import stages

    names = {}
    for stage in stages(derivation):
        head = f"Head {stage.head} · " if stage.head else ""
        for step in stage.steps:
            names[step.id] = f"{head}Step {stage.number}: {show_bidi(step.title)} ({step.id})"
    return names


def asked_ids(derivation: "Derivation | None", ask: Iterable[str]) -> list[str]:
    """The stages of ``derivation`` that ``ask`` names (stage names such as ``S_scaled``, for every
    head with heads; given stages are not asked), in the formula's order."""
    from ..stages.names import GRADIENT_NAMES, NAMES, unknown_stage

    if isinstance(ask, str) or not all(isinstance(a, str) for a in ask):
        raise SymattnError(f"ask is a set of stage names such as {{'S', 'A'}}, not {excerpt(repr(ask))}")
    if derivation is None:
        raise SymattnError("ask needs the derivation the answers were marked against")
    asked = set(ask)
    for name in sorted(asked):
        if name not in NAMES:
            raise SymattnError(f"ask: {unknown_stage(name, NAMES)}")
        steps = [s for s in derivation.steps if s.kind == name]
        if not steps:
            hint = " (a gradient: mark the backward pass too)" if name in GRADIENT_NAMES else ""
            raise SymattnError(f"ask: the problem has no stage {name}{hint}")
        if all(s.given for s in steps):
            raise SymattnError(f"ask: {name} is given by the problem, not computed")
    return [s.id for s in derivation.steps if s.kind in asked and not s.given]


def _options(points, visibility) -> None:
    if isinstance(points, bool) or not isinstance(points, int) or points < 1:
        raise SymattnError(f"points is a whole number, 1 or more, not {excerpt(repr(points))}")
    if visibility not in VISIBILITIES:
        shown = excerpt(visibility if isinstance(visibility, str) else repr(visibility))
        raise SymattnError(f"visibility {shown} is not one of {', '.join(VISIBILITIES)}")


def _kind(derivation: "Derivation | None", id: str) -> str:
    return derivation.step(id).kind if derivation is not None and id in derivation else id


def _test(name: str, points: int | None, status: str, output: str, extra: dict, *, score: int | None = None,
          tag: str | None = None, visible: bool = False) -> dict:
    """One test as the specification orders its fields (score and max_score only when it scores)."""
    test: dict = {}
    if points is not None:
        test.update(score=score, max_score=points)
    test.update(status=status, name=name, name_format="text", output=output, output_format="text")
    if tag is not None:
        test["tags"] = [tag]
    if visible:
        test["visibility"] = "visible"  # over the top level's: a student always sees it
    test["extra_data"] = extra
    return test


def _top(derivation: "Derivation | None", score: int, output: str, visibility: str, tests: list[dict]) -> dict:
    if derivation is not None:
        output = f"Problem: {show_bidi(derivation.problem.title)}\n{output}"
    return {"score": score, "output": output, "output_format": "text", "test_output_format": "text",
            "test_name_format": "text", "visibility": visibility, "stdout_visibility": "hidden", "tests": tests}

