"""Masks: which keys each query may attend to (:class:`Mask`), and the named masks' rules."""

from __future__ import annotations

from dataclasses import dataclass

MASK_WORDS = ("none", "causal", "causal-bottom-right")


@dataclass(frozen=True)
class Mask:
    """Which positions each query may attend to.

    ``kind`` is ``none``, ``causal``, ``causal-bottom-right``,
    ``sliding-window`` (with ``window``), ``sink-window`` (StreamingLLM's: ``sink`` first keys
    and a causal ``window``) or ``matrix`` (given 0/1 entries);
    ``allowed[i][j]`` says whether query i may attend to key j.
    """

    kind: str
    allowed: tuple[tuple[bool, ...], ...]
    window: int | None = None
    keys: tuple[bool, ...] | None = None  # padding and valid-length: which keys are real tokens
    valid_length: int | None = None
    parts: tuple["Mask", ...] = ()  # combined: the masks whose allowed sets are intersected
    sink: int | None = None  # sink-window: the number of sink tokens (the first keys), kept by every query

    def cache_rows(self, t: int) -> tuple[int, ...]:
        """The 0-based keys a KV cache holds when token ``t`` (1-based) is decoded: keys ``1..t``
        under the causal mask; under a sink window only the sink tokens and the last ``window``."""
        if self.kind == "sink-window":
            return tuple(j for j in range(t) if j < self.sink or t - 1 - j < self.window)
        return tuple(range(t))

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds this mask is made of (its parts' for a combined mask)."""
        return frozenset(p.kind for p in self.parts) if self.parts else frozenset({self.kind})

    def rule(self) -> str:
        """The mask's rule in words, for the worked solution (math marked ⟦…⟧, see symattn.render.prose)."""
        if self.kind == "combined":
            return (f"the AND of {len(self.parts)} masks (a key is allowed only where every one allows it): "
                    + "; and ".join(part.rule() for part in self.parts))
        if self.kind == "padding":
            vector = ", ".join("1" if k else "0" for k in self.keys)
            pads = [str(j + 1) for j, k in enumerate(self.keys) if not k]
            which = (f"key{'s' if len(pads) > 1 else ''} {_and(pads)} {'are' if len(pads) > 1 else 'is'} padding"
                     if pads else "no key is padding")
            return (f"key padding ⟦p = ({vector})⟧: every query may attend to key ⟦j⟧ only when ⟦p_j = 1⟧ "
                    f"(a real token), never to padding (⟦p_j = 0⟧); {which}")
        if self.kind == "valid-length":
            n = self.valid_length
            return (f"valid length ⟦{n}⟧: every query may attend to keys ⟦j \\le {n}⟧ only; "
                    + (f"the keys after the first ⟦{n}⟧ are padding" if n < len(self.keys) else "no key is padding"))
        return {
            "none": "no mask: every query may attend to every key",
            "causal": "causal: query ⟦i⟧ may attend to keys ⟦j \\le i⟧ (no looking ahead)",
            "causal-bottom-right": "causal, aligned bottom-right: query ⟦i⟧ may attend to keys ⟦j \\le i + (n_k - n_q)⟧",
            "sliding-window": (f"sliding window of ⟦{self.window}⟧: query ⟦i⟧ may attend to keys ⟦j \\le i⟧ "
                               f"with ⟦i - j < {self.window}⟧"),
            "sink-window": (f"sink tokens and a sliding window (StreamingLLM's): query ⟦i⟧ may attend to keys "
                            f"⟦j \\le i⟧ that are one of the first ⟦{self.sink}⟧ (the sink tokens) or have "
                            f"⟦i - j < {self.window}⟧ (the window, the query itself included)"),
            "matrix": "given matrix: ⟦1⟧ = may attend, ⟦0⟧ = may not",
        }[self.kind]


def mask_rule(kind: str, n_q: int, n_k: int, window: int | None = None,
              sink: int | None = None) -> tuple[tuple[bool, ...], ...]:
    """Which keys each query may attend to under a named mask (query i, key j, 0-based)."""
    rule = {
        "none": lambda i, j: True,
        "causal": lambda i, j: j <= i,  # top-left aligned, as PyTorch's is_causal
        "causal-bottom-right": lambda i, j: j <= i + n_k - n_q,  # as FlashAttention
        "sliding-window": lambda i, j: j <= i and i - j < window,
        "sink-window": lambda i, j: j <= i and (j < sink or i - j < window),
    }[kind]
    return tuple(tuple(bool(rule(i, j)) for j in range(n_k)) for i in range(n_q))


def _and(items: list[str]) -> str:
    """``1, 2 and 3``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

