"""How a worked solution is written: :class:`RenderOptions`, one frozen set of options for every format.

>>> RenderOptions(digits=6, first="S", last="A")
RenderOptions(standalone=True, digits=6, check=None, max_shown=8, first='S', last='A', exercise=False, ask=None, paper='a4')
>>> RenderOptions(digits=0)
Traceback (most recent call last):
...
ValueError: digits must be a whole number from 1 to 50 (or None: the problem's), not 0
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from dataclasses import dataclass, fields

from ..text import shown as _shown
from .grid import MAX_SHOWN
from .paper import DEFAULT_PAPER, PAPERS

FORMATS = ("latex", "markdown", "myst", "text", "json", "html")
MAX_DIGITS = 50  # as a problem file's digits and --digits

# The options each format reads (standalone is read by LaTeX and HTML, and accepted by every format
# as the command line passes it); JSON holds every stage in full, so it has no layout.
_LAYOUT = ("max_shown", "first", "last")
_SHEET = ("exercise", "ask")
USED = {
    "latex": ("standalone", "digits", "check", *_LAYOUT, *_SHEET, "paper"),
    "markdown": ("standalone", "digits", "check", *_LAYOUT, *_SHEET),
    "myst": ("standalone", "digits", "check", *_LAYOUT, *_SHEET),
    "html": ("standalone", "digits", "check", *_LAYOUT, *_SHEET),
    "text": ("standalone", "digits", "check", *_LAYOUT),
    "json": ("standalone", "digits", "check"),
}


@dataclass(frozen=True)
class RenderOptions:
    """How :func:`symattn.render` writes a derivation, the same for every format.

    ``standalone``: a whole LaTeX document or web page (False: the fragment to ``\\input`` or
    paste). ``digits``: significant digits of the decimals (None: the problem's, else 4).
    ``check``: a :class:`~symattn.CrossCheck` to report at the end. ``max_shown``: above this
    many rows or columns a matrix is elided. ``first``/``last``: the stages the solution starts
    and ends at (``--from``/``--to``). ``exercise``: the exercise sheet instead, with empty boxes
    for the stages in ``ask`` (None: every computed stage). ``paper``: ``'a4'`` or ``'letter'``, the
    page of a LaTeX document (and so of its PDF). A value none of them can take is refused with a
    ValueError naming it.
    """

    standalone: bool = True
    digits: int | None = None
    check: object = None
    max_shown: int = MAX_SHOWN
    first: str | None = None
    last: str | None = None
    exercise: bool = False
    ask: frozenset[str] | None = None
    paper: str = DEFAULT_PAPER

    def __post_init__(self) -> None:
        for name in ("standalone", "exercise"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, not {_shown(getattr(self, name))}")
        if self.digits is not None and not (_whole(self.digits) and 1 <= self.digits <= MAX_DIGITS):
            raise ValueError(f"digits must be a whole number from 1 to {MAX_DIGITS} (or None: the problem's), "
                             f"not {_shown(self.digits)}")
        if not (_whole(self.max_shown) and self.max_shown >= 1):
            raise ValueError(f"max_shown must be a whole number from 1, not {_shown(self.max_shown)}")
        for name in ("first", "last"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a stage name such as 'S' (or None), not {_shown(getattr(self, name))}")
        if self.check is not None:
            from ..reference.crosscheck import CrossCheck  # already loaded: the check was made with it

            if not isinstance(self.check, CrossCheck):
                raise ValueError(f"check must be the CrossCheck symattn.crosscheck returns (or None), "
                                 f"not {_shown(self.check)}")
        if self.ask is not None:
            self._set_ask()
        if not isinstance(self.paper, str) or self.paper not in PAPERS:
            raise ValueError(f"paper must be one of {', '.join(repr(p) for p in PAPERS)}, not {_shown(self.paper)}")

    def _set_ask(self) -> None:
        ask = self.ask
        if isinstance(ask, str) or not isinstance(ask, Iterable) or not all(isinstance(a, str) for a in ask):
            raise ValueError(f"ask must be a set of stage names such as {{'S', 'A'}} (or None), not {_shown(ask)}")
        if not self.exercise:
            raise ValueError("ask goes with exercise=True: it names the stages an exercise sheet asks for")
        from ..stages.names import NAMES, unknown_stage

        for name in ask:
            if name not in NAMES:
                raise ValueError(f"ask: {unknown_stage(name, NAMES)}")
        object.__setattr__(self, "ask", frozenset(ask))  # frozen, and as hashable as the rest

    def refuse_unused(self, format: str) -> None:
        """A ValueError naming each option set that ``format`` would not read."""
        if format not in FORMATS:
            raise ValueError(f"unknown format {_shown(format)}; choose one of {', '.join(FORMATS)}")
        unused = [f.name for f in fields(self) if f.name not in USED[format] and getattr(self, f.name) != f.default]
        if unused:
            what = "an exercise sheet is LaTeX, Markdown, MyST or HTML" if set(unused) & set(_SHEET) else (
                "the paper is a LaTeX document's (and its PDF's)" if "paper" in unused else
                "JSON holds every stage in full")
            raise ValueError(f"{format} does not take {', '.join(unused)}: {what}")


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


__all__ = ["FORMATS", "RenderOptions"]
