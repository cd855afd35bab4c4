"""MyST Markdown worked solutions for Jupyter Book 2 (mystmd): the Markdown solution's blocks, each
step a heading with a target ``(stage-ID)=``, each display a ``{math}`` directive with a ``:label:``,
and with ``exercise`` each asked step an ``{exercise}`` whose ``{solution}`` holds its worked step."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from . import prose
from .blocks import blocks
from .escape import escape_myst
from .options import RenderOptions

if TYPE_CHECKING:
    from ..exact.derivation import Derivation

def myst_prose(text: str) -> str:
    return prose.render(text, escape_myst, prose.markdown)


def _label(step) -> str:
    return "stage-" + step.id.replace(".", "-")


def _math(tex: str, label: str) -> str:
    fence = "`" * max(3, max((len(r) for r in re.findall("`+", tex)), default=0) + 1)
    return f"{fence}{{math}}\n:label: {label}\n\n{tex}\n{fence}"


def _lines(parts, owner: str, counts: dict) -> list[str]:
    """The blocks as MyST; ``owner`` labels the displays before the first step."""
    lines = []
    for block in parts:
        if block.kind == "section":
            lines.append(f"## {escape_myst(block.text)}")
        elif block.kind == "step":
            owner = _label(block.source)
            lines.append(f"({owner})=\n### {escape_myst(block.text)}\n\n{myst_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(myst_prose(block.text))
        else:
            counts[owner] = counts.get(owner, 0) + 1
            lines.append(_math(block.text, f"eq-{owner}-{counts[owner]}"))
        lines.append("")
    return lines


def _by_step(parts) -> dict:
    """The blocks of each step (its title's block first), by step id."""
    out: dict = {}
    current = None
    for block in parts:
        if block.kind == "section":
            current = None
        elif block.kind == "step":
            current = out.setdefault(block.source.id, [])
        if current is not None:
            current.append(block)
    return out


def document(derivation: Derivation, options: RenderOptions) -> str:
    """The worked solution as MyST Markdown (or, with ``options.exercise``, the exercise sheet: each
    asked step an exercise, its worked step the solution beneath it, folded)."""
    title = ("Exercise: " if options.exercise else "") + derivation.problem.title
    lines = [f"# {escape_myst(title)}", ""]
    parts = blocks(derivation, options)
    counts: dict = {}
    if not options.exercise:
        return "\n".join(lines + _lines(parts, "intro", counts)).rstrip() + "\n"
    solved = _by_step(blocks(derivation, replace(options, exercise=False, ask=None)))
    asked = _by_step(parts)
    k = 0
    while k < len(parts):
        block = parts[k]
        if block.kind != "step":
            lines += _lines([block], "intro", counts)
            k += 1
            continue
        step = block.source
        mine = asked[step.id]
        label = "ex-" + _label(step)
        body = _lines(mine[1:], "ex-" + _label(step), counts)
        lines += [f"::::{{exercise}} {escape_myst(block.text)}", f":label: {label}", "", myst_prose(block.extra), "",
                  *body, "::::", "", f"::::{{solution}} {label}", ":class: dropdown", "",
                  *_lines(solved.get(step.id, [])[1:], _label(step), counts), "::::", ""]
        k += len(mine)
    return "\n".join(lines).rstrip() + "\n"
