"""The stage names users write (--from, --to, --ask, an answers file): in the order of the formula,
the gradients' and the tiled pass's, and the message for a name that is no stage's."""

from __future__ import annotations

from ..text import did_you_mean
from .ids import ACC_TILED, L_TILED, M_TILED, O, O_FINAL, O_TILED
from .registry import BY_KEY, KINDS


# The stage names --from, --to and --ask take, in the order of the formula (with heads they
# apply to every head).
NAMES: tuple[str, ...] = tuple(dict.fromkeys(k.name for k in sorted(KINDS, key=lambda k: k.order)))
GRADIENT_NAMES = frozenset(k.name for k in KINDS if k.gradient)
TILED_NAMES = frozenset((M_TILED, L_TILED, ACC_TILED, O_TILED))  # the online softmax's, with tiling: only


def order_of(name: str, problem=None) -> int:
    """The place of stage ``name`` in the formula; with several heads ``O`` is the projected output."""
    if name == O and problem is not None and problem.multi_head:
        return BY_KEY[O_FINAL].order
    return min(k.order for k in KINDS if k.name == name)


def unknown_stage(word: str, choices) -> str:
    """The message for a stage name that is not one of ``choices``."""
    return f"{word!r} is not a stage{did_you_mean(word, choices)}; the stages are {', '.join(choices)}"
