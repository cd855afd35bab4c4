"""The outline of a worked solution: its numbered stages, and which steps a selection shows."""

from __future__ import annotations

from dataclasses import dataclass

from ..derivation import Derivation, Step

# The eight stages of the walk-through, and which step ids each one shows.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The input", ("X", "context")),
    ("Project to queries, keys and values", ("W_Q", "Q", "W_K", "K", "W_V", "V")),
    ("Transpose the keys", ("K_T",)),
    ("Score every query against every key", ("S",)),
    ("Scale the scores", ("S_scaled",)),
    ("Apply the mask", ("M", "S_masked")),
    ("Softmax on each row", ("A",)),
    ("Weighted sum of the values", ("O",)),
)
_GIVEN_STAGE = ("The input: queries, keys and values given", ("Q", "K", "V"))


_HEADS_STAGES = (
    ("Concatenate the heads", ("concat",)),
    ("Output projection", ("W_O", "O")),
)


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    steps: tuple[Step, ...]
    head: int | None = None


def stages(d: Derivation) -> tuple[Stage, ...]:
    """The derivation's steps grouped into numbered stages, in order.

    With several heads: the input, then stages 2 to 8 for each head, then the
    concatenation and the output projection.
    """
    by_id = {s.id: s for s in d.steps}
    p = d.problem
    groups: list[tuple[str, tuple[str, ...], int | None]] = []
    if not p.projected:
        groups.append((*_GIVEN_STAGE, None))
        groups += [(title, ids, None) for title, ids in STAGES[2:]]
    elif not p.multi_head:
        groups += [(title, ids, None) for title, ids in STAGES]
    else:
        groups.append((*STAGES[0], None))
        for h in range(1, len(p.heads) + 1):
            groups += [(title, tuple(f"head{h}.{i}" for i in ids), h) for title, ids in STAGES[1:]]
        groups += [(title, ids, None) for title, ids in _HEADS_STAGES]
    out = []
    for title, ids, head in groups:
        steps = tuple(by_id[i] for i in ids if i in by_id)
        if steps:
            # Each head's stages keep the walk-through's numbers 2 to 8.
            number = [t for t, _ in STAGES].index(title) + 1 if head else len(out) + 1
            if p.multi_head and not head and out:
                number = len(STAGES) + (2 if "projection" in title else 1)
            out.append(Stage(number, title, steps, head))
    if p.backward is not None:
        out += _backward_stages(p, by_id, max((s.number for s in out), default=0))
    return tuple(out)


# The backward pass, stage by stage (per head where the forward pass was per head).
_BACKWARD_HEAD = (
    ("Back through the weighted sum", ("dV", "dA")),
    ("Back through the softmax", ("dS_masked",)),
    ("Back through the scaling", ("dS",)),
    ("Back to the queries and keys", ("dQ", "dK")),
    ("Back to the projection weights", ("dW_Q", "dW_K", "dW_V")),
)


def _backward_stages(p, by_id: dict, last: int) -> list[Stage]:
    """The gradient stages, numbered on from the forward pass's ``last``."""
    groups: list[tuple[str, tuple[str, ...], int | None, int]] = [("Backward: the upstream gradient", ("dO",), None, 1)]
    per_head = _BACKWARD_HEAD
    if p.multi_head:
        groups.append(("Back through the output projection", ("dW_O", "dconcat"), None, 2))
        per_head = (("This head's upstream gradient", ("dO",)),) + _BACKWARD_HEAD
        for h in range(1, len(p.heads) + 1):
            groups += [(title, tuple(f"head{h}.{i}" for i in ids), h, 3 + k) for k, (title, ids) in enumerate(per_head)]
        after = 3 + len(per_head)
    else:
        groups += [(title, ids, None, 2 + k) for k, (title, ids) in enumerate(per_head)]
        after = 2 + len(per_head)
    groups.append(("Back to the input", ("dX", "dcontext"), None, after))
    out = []
    for title, ids, head, number in groups:
        steps = tuple(by_id[i] for i in ids if i in by_id)
        if steps:
            out.append(Stage(last + number, title, steps, head))
    return out


# The stage kinds in the order of the formula, for --from/--to and --ask.
KIND_ORDER = (
    "X", "context", "W_Q", "Q", "W_K", "K", "W_V", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O",
    "concat", "W_O", "O_final",
    "dO", "dW_O", "dconcat", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX", "dcontext",
)
# What each computed stage is made from, stated as given when a selection starts there.
_INPUTS = {
    "Q": ("X", "W_Q"), "K": ("kv", "W_K"), "V": ("kv", "W_V"), "K_T": ("K",), "S": ("Q", "K_T"),
    "S_scaled": ("S",), "S_masked": ("S_scaled", "M"), "A": ("S_masked",), "O": ("A", "V"),
    "concat": ("heads",), "O_final": ("concat", "W_O"),
}


def kind_key(d: Derivation, step: Step) -> str:
    """The stage kind of a step, telling the projected output of several heads (O_final) from a head's O."""
    if step.kind == "O" and d.problem.multi_head and step.head is None:
        return "O_final"
    return step.kind


def select(d: Derivation, first: str | None = None, last: str | None = None) -> list[Step]:
    """The steps from stage kind ``first`` to ``last`` (inclusive, in the formula's order)."""
    if last == "O" and d.problem.multi_head:
        last = "O_final"  # the output of the whole layer, after W_O
    if first == "O" and d.problem.multi_head:
        first = "O_final"
    lo = KIND_ORDER.index(first) if first else 0
    hi = KIND_ORDER.index(last) if last else len(KIND_ORDER) - 1
    if hi < lo:
        raise ValueError(f"--from {first} comes after --to {last}")
    return [s for s in d.steps if lo <= KIND_ORDER.index(kind_key(d, s)) <= hi]


def _given_inputs(d: Derivation, chosen: list[Step]) -> list[Step]:
    """What the first shown computed step of each head is made from, when that is not shown."""
    ids = {s.id for s in chosen}
    firsts: dict[str, Step] = {}
    for s in chosen:
        if not s.given:
            firsts.setdefault(s.id[: -len(s.kind)], s)  # keyed by the head prefix
    names: list[str] = []
    for prefix, first in firsts.items():
        for name in _INPUTS.get(kind_key(d, first), ()):
            if name == "kv":
                names.append("context" if d.problem.context is not None else "X")
            elif name == "heads":
                names += [f"head{h}.O" for h in range(1, len(d.problem.heads) + 1)]
            elif name in ("X", "context", "concat", "W_O"):
                names.append(name)
            else:
                names.append(prefix + name)
    unique = list(dict.fromkeys(n for n in names if n not in ids))
    return [d.step(n) for n in unique]
