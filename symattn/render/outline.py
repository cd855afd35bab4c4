"""The outline of a worked solution: its numbered stages, and which steps a selection shows.

Which stages there are, their titles and numbers come from the stage registry
(:func:`symattn.stages.outline.sections`); this module groups a derivation's steps under them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import stages as registry
from ..errors import SymattnError

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    steps: tuple["Step", ...]
    head: int | None = None


def stages(d: "Derivation") -> tuple[Stage, ...]:
    """The derivation's steps grouped into numbered stages, in order.

    With several heads: the input, then stages 2 to 8 for each head, then the
    concatenation and the output projection; the backward pass numbers on.
    """
    p = d.problem
    groups: dict[tuple[str, int | None], list] = {}
    for step in d.steps:
        section = registry.section_of(step.kind_of, registry.Context(p, step.head))
        groups.setdefault((section, step.head), []).append(step)
    out = []
    for section, number, head in registry.sections(p):
        steps = sorted(groups.get((section.key, head), ()), key=lambda s: s.kind_of.order)
        if steps:
            out.append(Stage(number, section.title_for(registry.Context(p, head)), tuple(steps), head))
    return tuple(out)


def _order(name: str, d: "Derivation") -> int:
    if name not in registry.NAMES:
        raise SymattnError(registry.unknown_stage(name, registry.NAMES))
    return registry.order_of(name, d.problem)


def select(d: "Derivation", first: str | None = None, last: str | None = None) -> list["Step"]:
    """The steps from stage ``first`` to ``last`` (inclusive, in the formula's order; with several
    heads ``O`` is the output after W_O)."""
    lo = _order(first, d) if first else 0
    hi = _order(last, d) if last else max(k.order for k in registry.KINDS)
    if hi < lo:
        raise SymattnError(f"stage {first} comes after {last} in the formula; give the earlier stage first")
    return [s for s in d.steps if lo <= s.kind_of.order <= hi]


def given_inputs(d: "Derivation", chosen: list["Step"]) -> list["Step"]:
    """What the shown computed steps are made from, when that is not shown (the forward pass's
    inputs: ``--from A`` states Ŝ, and V for O; a gradient's are not restated)."""
    ids = {s.id for s in chosen}
    names: list[str] = []
    for s in chosen:
        if not s.given and not s.kind_of.gradient:
            names += registry.input_ids(s.kind_of, registry.Context(d.problem, s.head))
    unique = list(dict.fromkeys(n for n in names if n not in ids))
    return [d.step(n) for n in unique]
