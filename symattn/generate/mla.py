"""Exercises of multi-head latent attention (``symattn generate --mla``): 2 heads, a latent of d_c = 2,
d_h = d_R = d_v = 2, RoPE in quarter turns (θ = π/2, so every rotated entry is a whole number) and the
scores scaled by 1/√(d_h + d_R) = 1/2.

Guarantees, at every level: the entries of X, the weights and W_O are whole numbers in the level's
range; the queries, keys, values and scores are whole numbers with |Q|, |K|, |V| ≤ PROJ and |S| ≤ SCORE
of the level; in each head some softmax row that has a choice is not uniform; and in each head the
scores differ from those with RoPE applied to the compressed part too (so ``symattn check`` can tell
that mistake apart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import SymattnError
from .exercises import LINE_BREAK, Spec, allowed, quote, token_words

HEADS, D_C, D_H, D_R, D_V = 2, 2, 2, 2, 2
# the options --mla cannot go with (their defaults), each refused in one line
FIXED = {"d_k": 4, "d_v": 4, "heads": 1, "cross": None, "scale": True, "norm": None, "residual": False,
         "block": False, "sink": None, "linear": None, "softcap": None, "temperature": None}
_FLAGS = {"d_k": "--d-k", "d_v": "--d-v", "heads": "--heads", "cross": "--cross", "scale": "--no-scale",
          "norm": "--norm", "residual": "--residual", "block": "--block", "sink": "--sink", "linear": "--linear",
          "softcap": "--softcap", "temperature": "--temperature"}
_TRIES = 10_000  # draws tried for one seed before the options are deemed impossible


def refuse(options: dict) -> None:
    """One line for the first option --mla does not go with (its widths are fixed)."""
    for name, default in FIXED.items():
        if options.get(name, default) != default:
            raise SymattnError(f"--mla cannot go with {_FLAGS[name]}: its shape is fixed (2 heads, d_c = d_h = d_R = "
                               "d_v = 2, scaled by 1/√(d_h + d_R) = 1/2)")
    if options.get("mask", "causal").partition(":")[0] not in ("causal", "none"):
        raise SymattnError(f"--mla follows --mask causal or none, not {options['mask']!r}")


@dataclass(frozen=True)
class Drawn:
    """The whole-number matrices of one MLA exercise."""

    X: np.ndarray
    weights: dict  # W_DKV, W_UK, W_UV, W_KR, W_Q, W_QR
    W_O: np.ndarray

    def key(self) -> tuple:
        parts = [self.X, *self.weights.values(), self.W_O]
        return tuple(tuple(map(int, p.ravel())) + (p.shape,) for p in parts)


def _turn(m: np.ndarray) -> np.ndarray:
    """Row p of an n × 2 part turned by p quarter turns (RoPE with θ = π/2), exactly in integers."""
    out = m.copy()
    for p in range(len(m)):
        for _ in range(p % 4):
            out[p] = [-out[p][1], out[p][0]]
    return out


def scores(drawn: Drawn, compressed_too: bool = False) -> list[np.ndarray]:
    """Each head's Q·Kᵀ (with ``compressed_too``, RoPE applied to q_C and K_C as well)."""
    w, X = drawn.weights, drawn.X
    c_kv, k_rot = X @ w["W_DKV"], _turn(X @ w["W_KR"])
    out = []
    for h in range(HEADS):
        q_c, k_c = X @ w["W_Q"][:, 2 * h:2 * h + 2], c_kv @ w["W_UK"][:, 2 * h:2 * h + 2]
        if compressed_too:
            q_c, k_c = _turn(q_c), _turn(k_c)
        Q = np.hstack([q_c, _turn(X @ w["W_QR"][:, 2 * h:2 * h + 2])])
        out.append(Q @ np.hstack([k_c, k_rot]).T)
    return out


def _nice(spec: Spec, drawn: Drawn) -> bool:
    proj, bound = spec.proj_score_bounds
    w, X = drawn.weights, drawn.X
    c_kv = X @ w["W_DKV"]
    parts = [X @ w["W_Q"], X @ w["W_QR"], c_kv @ w["W_UK"], c_kv @ w["W_UV"], X @ w["W_KR"]]
    if any(np.abs(p).max() > proj for p in parts):
        return False
    ok = np.array(allowed(spec), dtype=bool)
    wrong = scores(drawn, compressed_too=True)
    for S, S_wrong in zip(scores(drawn), wrong):
        if np.abs(S).max() > bound or np.array_equal(np.where(ok, S, 0), np.where(ok, S_wrong, 0)):
            return False
        if not any(ok[i].sum() > 1 and len(set(S[i][ok[i]])) > 1 for i in range(len(S))):
            return False
    return True


def generate(spec: Spec, seed: int) -> Drawn:
    """The first draw from ``seed`` that meets the guarantees above."""
    rng = np.random.default_rng(seed)
    lo, hi = spec.lo_hi
    d = spec.d_model

    def ints(rows: int, cols: int) -> np.ndarray:
        return rng.integers(lo, hi + 1, size=(rows, cols), dtype=np.int64)

    for _ in range(_TRIES):
        drawn = Drawn(ints(spec.tokens, d), {"W_DKV": ints(d, D_C), "W_UK": ints(D_C, HEADS * D_H),
                                             "W_UV": ints(D_C, HEADS * D_V), "W_KR": ints(d, D_R),
                                             "W_Q": ints(d, HEADS * D_H), "W_QR": ints(d, HEADS * D_R)},
                      ints(HEADS * D_V, d))
        if _nice(spec, drawn):
            return drawn
    raise SymattnError("no multi-head latent attention exercise meets the level's guarantees with these options; "
                       "try another --range or --level")


def to_yaml(spec: Spec, drawn: Drawn, command: str, title: str) -> str:
    """The problem file: a comment header with the command that made it, then X, mla: and W_O."""
    def matrix(m: np.ndarray) -> str:
        return "[" + ", ".join("[" + ", ".join(str(int(v)) for v in row) + "]" for row in m) + "]"

    made_by = "\n#   ".join(LINE_BREAK.split(command))  # a line break in an argument stays in the comment
    out = [f"# Made by: {made_by}", f"# Level {spec.level}: see `symattn generate --help` for its guarantees.",
           f"title: {quote(title)}", "tokens: [" + ", ".join(quote(t) for t in token_words(spec)) + "]",
           f"X: {matrix(drawn.X)}", "mla:", f"  heads: {HEADS}"]
    out += [f"  {name}: {matrix(m)}" for name, m in drawn.weights.items()]
    out += ['  rope: {angles: ["pi/2"]}', f"W_O: {matrix(drawn.W_O)}", f"mask: {spec.mask.partition(':')[0]}"]
    return "\n".join(out) + "\n"
