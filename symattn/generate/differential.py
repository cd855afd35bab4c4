"""``symattn generate --differential LAMBDA``: differential attention's second map (W_Q2, W_K2 of each
head), drawn from the same range as the first map's weights, with the same guarantees on its
projections and scores, and λ a fraction between 0 and 1 (1/2 keeps the hand numbers small)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..errors import SymattnError
from ..text import excerpt


def lam(spec) -> Fraction:
    try:
        value = Fraction(str(spec.differential))
    except (ValueError, ZeroDivisionError):
        raise SymattnError(f"--differential takes λ, a fraction such as 1/2, not {excerpt(str(spec.differential))}") from None
    if not 0 < value < 1:
        raise SymattnError(f"--differential takes λ between 0 and 1 (such as 1/2), not {excerpt(str(spec.differential))}")
    return value


def validate(spec) -> None:
    """λ, and the options differential attention does not go with."""
    lam(spec)
    for given, what in ((spec.cross is not None, "--cross (differential attention is derived for self-attention)"),
                        (spec.sink is not None, "--sink"), (spec.linear is not None, "--linear"),
                        (spec.block, "--block (the block's attention is the softmax's)"),
                        (any(line.startswith(("softcap", "temperature")) for line in spec.extra),
                         "--softcap or --temperature")):
        if given:
            raise SymattnError(f"--differential cannot go with {what}")


def draw(spec, ints, heads) -> tuple:
    """Each head's (W_Q2, W_K2), the shapes of its W_Q and W_K."""
    return tuple((ints(spec.d_model, W_Q.shape[1]), ints(spec.d_model, W_K.shape[1])) for W_Q, W_K, _ in heads)


def niceness(spec, drawn, X: np.ndarray, mask: np.ndarray, bounds: tuple[int, int], denominators) -> str | None:
    """The second map's guarantees, as the first map's: its projections and scores bounded, its scaled
    scores of the level's denominators, at easy at most two distinct exponents a row; and a second map
    that differs from the first where the mask allows (else the difference is (1 − λ)·A₁ alone)."""
    proj_bound, score_bound = bounds
    for (W_Q, W_K, _), (W_Q2, W_K2) in zip(drawn.heads, drawn.maps):
        Q2, K2 = X @ W_Q2, X @ W_K2
        if max(abs(Q2).max(), abs(K2).max()) > proj_bound:
            return f"a projection of the second map is larger than {proj_bound} in size"
        S2 = Q2 @ K2.T
        if abs(S2).max() > score_bound:
            return f"a score of the second map is larger than {score_bound} in size"
        root = math.isqrt(W_Q2.shape[1]) if spec.scale else 1
        if denominators is not None and any(Fraction(int(s), root).denominator not in denominators for s in S2.ravel()):
            return "a scaled score of the second map is not of the level's denominators"
        distinct = [len({int(s) for s, ok in zip(S2[i], mask[i]) if ok}) for i in range(S2.shape[0])]
        if spec.level == "easy" and max(distinct) > 2:
            return "a row of the second map has more than two distinct exponents"
        S1 = (X @ W_Q) @ (X @ W_K).T
        if all(S1[i, j] - S1[i].max() == S2[i, j] - S2[i].max() for i in range(S2.shape[0])
               for j in range(S2.shape[1]) if mask[i, j]):
            return "the second map equals the first"
    return None


def yaml_lines(spec, drawn) -> list[str]:
    """The problem file's differential: section."""

    def matrix(m: np.ndarray, indent: str) -> str:
        return "\n".join(f"{indent}- [{', '.join(str(int(v)) for v in row)}]" for row in m)

    lines = ["differential:", f"  lambda: {lam(spec)}"]
    if spec.heads == 1:
        W_Q2, W_K2 = drawn.maps[0]
        lines += ["  W_Q2:\n" + matrix(W_Q2, "    "), "  W_K2:\n" + matrix(W_K2, "    ")]
    else:
        lines.append("  heads:")
        for W_Q2, W_K2 in drawn.maps:
            lines.append("    - W_Q2:\n" + matrix(W_Q2, "        ") + "\n      W_K2:\n" + matrix(W_K2, "        "))
    return ["\n".join(lines)]
