"""``symattn check`` for a PrairieLearn question: what the ``server.py`` of ``symattn generate --lms
prairielearn`` (:mod:`.prairielearn_server`) calls when it can import symattn.

:func:`verdicts` marks a submission with :func:`symattn.check` against the variant's own problem,
so a stage computed right from the student's own wrong earlier answers is right (follow-through),
and reuses the stage feedback of :mod:`symattn.check.gradescope` (the same job for Gradescope):
a line for the verdict, one per wrong entry (counted from 1, without the value expected, since a
student may submit again) and the likely cause. As there, a stage scores 1 when right or right
from the earlier answers, 0 when wrong: no credit per entry, the follow-through already marks
one slip once. The answer is plain data (lists, strings, numbers): the server.py uses nothing
else of symattn, so it also runs where symattn is missing.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from ..check import check
from ..check.gradescope import feedback
from ..errors import SymattnError

if TYPE_CHECKING:
    from ..exact.derivation import Derivation


@lru_cache(maxsize=8)  # a worker grades one variant again and again
def _derivation(problem: str) -> "Derivation":
    from ..exact.derivation import derive
    from ..problem.load import load_problem

    return derive(load_problem(problem))


def verdicts(problem: str, answers: dict[str, list[list[str]]]) -> dict:
    """``answers`` (stage id: rows of entries as the student wrote them) marked against ``problem``
    (the variant's YAML): ``{"stages": {id: {"status", "wrong": [[row, col], ...] from 0, "lines",
    "score"}}}``, or ``{"error": message}`` when an entry cannot be read."""
    try:
        marking = check(_derivation(problem), answers)
    except SymattnError as exc:
        return {"error": str(exc)}
    return {"stages": {s.id: {"status": s.status, "wrong": [[w.row, w.col] for w in s.wrong],
                              "lines": feedback(s, expected=False), "score": 0 if s.status == "wrong" else 1}
                       for s in marking.stages}}
