"""Exercises for the platforms courses run on: ``symattn generate --count N --out-dir d --lms NAME``.

Each platform's writer turns the generated variants into the files that platform imports:

=============  ====================================================================
``moodle``     one Moodle XML question bank (:mod:`.moodle`)
``qti``        a QTI 1.2 package for Canvas, Blackboard, D2L (:mod:`.qti`)
=============  ====================================================================

A writer is a module with ``files(count) -> list[str]`` (the names it writes into the
folder, relative to it) and ``write(run, batch)``, which writes them with ``batch.write(name,
bytes)``. :class:`Run` holds what every writer reads: the variants, their questions
(:mod:`.question`), the asked stages, the places and the run's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import SymattnError
from ..text import shown
from .question import DEFAULT_PLACES, MAX_PLACES, MIN_PLACES, Question, check_places, question

if TYPE_CHECKING:
    from ..generate.batch import GeneratedProblem

LMS = ("moodle", "qti")

__all__ = ["DEFAULT_PLACES", "LMS", "MAX_PLACES", "MIN_PLACES", "Run", "lms_files", "write_course", "write_lms"]


@dataclass(frozen=True)
class Run:
    """One ``--lms`` run: ``problems`` (from :func:`symattn.generate`), ``ask`` (stage kinds, None:
    each problem's last stage), ``places``, ``name`` (the run's name: the folder's, for a
    question bank's category), ``command`` (the command line or call that made the variants)."""

    problems: tuple["GeneratedProblem", ...]
    ask: frozenset[str] | None
    places: int
    name: str
    command: str

    def questions(self) -> list[Question]:
        from ..generate.batch import derivation_of

        return [question(p, derivation_of(p), self.ask, self.places) for p in self.problems]


def _writer(lms: str):
    if lms not in LMS:
        raise SymattnError(f"unknown LMS {shown(lms)}; choose {', '.join(LMS)}")
    return import_module(f".{lms}", __name__)


def lms_files(lms: str, count: int) -> list[str]:
    """The files ``--lms lms`` writes for ``count`` variants, relative to the folder."""
    return _writer(lms).files(count)


def write_lms(lms: str, run: Run, batch) -> None:
    """Write ``run`` as platform ``lms`` imports it, into ``batch`` (:class:`symattn.writing.Batch`)."""
    check_places(run.places)
    _writer(lms).write(run, batch)


def write_course(problems: Sequence["GeneratedProblem"], folder: str | os.PathLike, lms: str, *,
                 ask: "frozenset[str] | set[str] | None" = None, places: int | None = None, sheets: str | None = None,
                 force: bool = False, paper: str = "a4", one_file: bool = False) -> list[Path]:
    """:func:`symattn.write_exercises` (the variants' files, ``index.csv``, the ``sheets``), and the
    files course platform ``lms`` imports (``symattn generate --count N --out-dir d --lms LMS``),
    each question asking the stages ``ask`` (stage names such as {"S", "A"}; None: each variant's
    last stage) to ``places`` decimal places (default 4). All of them or nothing; returns the
    paths written."""
    from ..generate.batch import write_exercises

    _writer(lms)
    if ask is not None:
        if isinstance(ask, str) or not all(isinstance(a, str) for a in ask):
            raise SymattnError(f"ask is a set of stage names such as {{'S', 'A'}} (or None), not {shown(ask)}")
        ask = frozenset(ask)
    places = DEFAULT_PLACES if places is None else places
    check_places(places)
    problems = tuple(problems) if isinstance(problems, (list, tuple)) else problems
    if not isinstance(problems, tuple) or not problems:
        raise SymattnError(f"write_course needs a list of problems from symattn.generate, not {shown(problems)}")
    run = Run(problems=problems, ask=ask, places=places, name=Path(folder).resolve().name,
              command=_command(problems[0]))
    run.questions()  # every asked stage checked before any file is made
    names = lms_files(lms, len(problems))
    written = write_exercises(list(problems), folder, sheets=sheets, force=force, paper=paper, one_file=one_file,
                              also=(names, lambda batch: write_lms(lms, run, batch)))
    return written + [Path(folder) / name for name in names]


def _command(p: "GeneratedProblem") -> str:
    """The command or call that made the batch, from its first problem file's header."""
    made_by = p.to_yaml().partition("# Made by: ")[2].partition("\n")[0]
    return made_by.rpartition("  (variant ")[0] or made_by  # without the variant's own part
