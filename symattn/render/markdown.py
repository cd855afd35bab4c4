"""Markdown worked solutions: math in ``$$`` blocks that GitHub and KaTeX render."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..text import show_bidi
from . import prose
from .blocks import blocks
from .grid import MAX_SHOWN

if TYPE_CHECKING:
    from ..exact.derivation import Derivation

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~$&])")


def escape(text: str) -> str:
    """User text shown literally in Markdown (no links, emphasis, HTML or math).

    >>> escape("*bold* <b>")
    '\\\\*bold\\\\* \\\\<b\\\\>'
    """
    return _MD_SPECIAL.sub(r"\\\1", show_bidi(text).replace("\n", " "))


def _prose(text: str) -> str:
    """symattn's own sentences: the marked math (⟦…⟧, see :mod:`.prose`) as inline ``$…$``, the rest escaped."""
    return prose.render(text, escape, prose.markdown)


def render_markdown(
    derivation: Derivation,
    *,
    digits: int | None = None,
    check=None,
    max_shown: int = MAX_SHOWN,
    first: str | None = None,
    last: str | None = None,
    exercise: bool = False,
    ask: frozenset[str] | None = None,
) -> str:
    """The worked solution as Markdown (or, with ``exercise``, the exercise sheet)."""
    title = ("Exercise: " if exercise else "") + derivation.problem.title
    lines = [f"# {escape(title)}", ""]
    parts = blocks(derivation, digits, check, max_shown=max_shown, first=first, last=last, exercise=exercise, ask=ask)
    for block in parts:
        if block.kind == "section":
            lines.append(f"## {escape(block.text)}")
        elif block.kind == "step":
            lines.append(f"**{escape(block.text)}.** {_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(_prose(block.text))
        else:
            lines.append(f"$$\n{block.text}\n$$")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
