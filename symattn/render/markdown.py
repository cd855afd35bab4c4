"""Markdown worked solutions: math in ``$$`` blocks that GitHub and KaTeX render."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import prose
from .blocks import blocks
from .escape import escape_markdown
from .grid import MAX_SHOWN
from .options import RenderOptions

if TYPE_CHECKING:
    from ..exact.derivation import Derivation


def markdown_prose(text: str) -> str:
    """symattn's own sentences: the marked math (⟦…⟧, see :mod:`.prose`) as inline ``$…$``, the rest escaped."""
    return prose.render(text, escape_markdown, prose.markdown)


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
    """The worked solution as Markdown (or, with ``exercise``, the exercise sheet): :func:`document`
    with these options (see :class:`~symattn.RenderOptions`)."""
    return document(derivation, RenderOptions(digits=digits, check=check, max_shown=max_shown, first=first, last=last,
                                              exercise=exercise, ask=ask))


def document(derivation: Derivation, options: RenderOptions) -> str:
    """The worked solution as Markdown (or, with ``options.exercise``, the exercise sheet)."""
    title = ("Exercise: " if options.exercise else "") + derivation.problem.title
    lines = [f"# {escape_markdown(title)}", ""]
    parts = blocks(derivation, options)
    for block in parts:
        if block.kind == "section":
            lines.append(f"## {escape_markdown(block.text)}")
        elif block.kind == "step":
            lines.append(f"**{escape_markdown(block.text)}.** {markdown_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(markdown_prose(block.text))
        else:
            lines.append(f"$$\n{block.text}\n$$")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
