"""Whole-block exercises (``symattn generate --block``): the attention with a norm in front and the
residual, then the MLP with its own norm, the logits over a small vocabulary and the loss.

The attention part is drawn by :mod:`symattn.generate.exercises` (with its guarantees); this
module adds the sentence (the tokens, the vocabulary, each row's next word), the MLP's and the
unembedding's weights, the guarantees past the attention and the problem file's ``mlp:``,
``logits:`` and ``loss:``. Both norms have ε = 0, γ of 1s and 2s and β of 0s and 1s.

========  ==========================================================================
level     guarantees of a block, past those of the attention
========  ==========================================================================
all       the MLP's and the unembedding's weights are in the range, integers (easy)
          or integers and halves; no pre-activation of the MLP is 0 (at hard, none
          within 0.1 of 0), ReLU cuts some and passes some; the MLP's output is not
          0; no row of logits is constant; |U| ≤ 6, 8, 16 and |logits| ≤ 10, 16, 32
easy,     the attention is uniform (each query's visible scores are equal, so each
medium    weight is 1/k), and every row of H = X + O has a variance (RMSNorm: mean
          square) that is the square of a fraction: every stage up to the logits is
          a fraction, those from H on with denominators of at most 12 (easy) or 24
          (medium); P, the cross-entropy and L are exact in e^(…) and log
hard      the attention as at hard (not uniform), so the stages from H on carry its
          exponentials and the norm's roots: certified decimals where they are long
========  ==========================================================================

The vocabulary is the different words of the tokens and the next word, with words of the default
sentence added up to 4 (or ``--vocab``: 4 to 6 words holding those); each row's target is the
next word, the last row's the word after the tokens. At easy and medium the stages are computed
here with :class:`fractions.Fraction`; at hard the margins are checked on floats (the generator's
own test: the derivation is exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import SymattnError
from ..text import excerpt

# weight step (1: integers, 1/2: halves), |U| and |logit| bounds, the largest denominator of a
# stage up to the logits (None: hard, whose stages hold the softmax's exponentials)
LEVELS = {
    "easy": (Fraction(1), 6, 10, 12),
    "medium": (Fraction(1, 2), 8, 16, 24),
    "hard": (Fraction(1, 2), 16, 32, None),
}
HARD_MARGIN = 0.1  # at hard, how far from 0 every ReLU pre-activation is, and how far apart two logits of a row
ACTIVATIONS = ("relu", "relu2")
NOT_BY_HAND = {"gelu": "GELU's Φ (erf)", "gelu-tanh": "GELU's tanh", "silu": "SiLU's e^(−u)"}
VOCAB_SIZES = (4, 6)
D_FF_MAX = 8
ROWS = ("last", "all")
BATCH = 256  # key or value weights tried at once for one attention part
VALUE_ROUNDS = 8  # batches of value weights for one attention part before it is drawn again
INNER_TRIES = 100  # MLP weights for one attention part before it is drawn again


@dataclass(frozen=True)
class Mlp:
    """The drawn numbers past the attention: the MLP's norm (γ, β as 1 × d_model integer rows; β
    None for RMSNorm), its weights and biases and the unembedding, as arrays of Fractions."""

    gamma: np.ndarray
    beta: np.ndarray | None
    W_1: np.ndarray
    b_1: np.ndarray
    W_2: np.ndarray
    b_2: np.ndarray
    W_U: np.ndarray

    def key(self) -> tuple:
        parts = [self.gamma] + ([self.beta] if self.beta is not None else [])
        parts += [self.W_1, self.b_1, self.W_2, self.b_2, self.W_U]
        return tuple(tuple(Fraction(x) for x in p.ravel()) + (p.shape,) for p in parts)


def validate(spec) -> None:
    """Refuse what ``--block`` cannot honour, with the reason."""
    if spec.cross is not None:
        raise SymattnError("--block cannot go with --cross: the block's loss takes each row's next token, "
                           "so its attention is self-attention over the tokens")
    if spec.activation not in ACTIVATIONS:
        why = NOT_BY_HAND.get(spec.activation)
        if why is None:
            raise SymattnError(f"unknown activation {excerpt(str(spec.activation))}; choose relu or relu2")
        raise SymattnError(f"--activation {spec.activation} is not for a hand exercise: {why} is not a fraction, "
                           "so every stage after it would be decimals; choose relu or relu2")
    if not 1 <= spec.d_ff <= D_FF_MAX:
        raise SymattnError(f"--d-ff must be from 1 to {D_FF_MAX} for a hand exercise, not {spec.d_ff}")
    if spec.rows not in ROWS:
        raise SymattnError(f"rows is 'last' (the last position's logits) or 'all', not {excerpt(str(spec.rows))}")
    if spec.heads == 1 and spec.d_v != spec.d_model:
        raise SymattnError(f"--block adds the attention's output to X, so it needs the output as wide as X: --d-v "
                           f"{spec.d_v} is not --d-model {spec.d_model} (or use several --heads, whose W_O gives "
                           "d_model columns)")
    sentence(spec)  # raises for a vocabulary that cannot be made


def sentence(spec) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """The token words, the vocabulary and the targets (the next word of each row of the logits).

    The word after the tokens is the next one of ``--words`` (or of the default sentence); when
    ``--words`` has no more, the first word of ``--vocab`` that is not a token (without ``--vocab``,
    the first default word that is not). The vocabulary is ``--vocab``, or the different words of
    the tokens and the next word, with default words added until there are 4."""
    from .exercises import DEFAULT_WORDS, token_words

    tokens = token_words(spec)
    words = spec.words or DEFAULT_WORDS
    if len(words) > spec.tokens:
        after = words[spec.tokens]
    else:
        pool = spec.vocab if spec.vocab is not None else DEFAULT_WORDS
        after = next((w for w in pool if w not in tokens), None)
        if after is None:
            after = next(f"w{k}" for k in range(1, 100) if f"w{k}" not in tokens)
    different = list(dict.fromkeys(tokens + [after]))
    if any(not w.strip() for w in different + list(spec.vocab or ())):
        raise SymattnError("a word of the sentence or the vocabulary is empty; each is a word of text")
    if spec.vocab is not None:
        vocab = tuple(spec.vocab)
        if len(set(vocab)) != len(vocab):
            twice = next(w for w in vocab if vocab.count(w) > 1)
            raise SymattnError(f"--vocab names {excerpt(twice)} twice; each word of the vocabulary once")
        missing = [w for w in different if w not in vocab]
        if missing:
            raise SymattnError(f"--vocab needs every word of the sentence, the tokens and the next word "
                               f"{excerpt(after)}: {excerpt(' '.join(missing))} {'is' if len(missing) == 1 else 'are'} "
                               "not in it")
    else:
        extra = [w for w in DEFAULT_WORDS if w not in different]
        vocab = tuple(different + extra[:max(0, VOCAB_SIZES[0] - len(different))])
    lo, hi = VOCAB_SIZES
    if not lo <= len(vocab) <= hi:
        if spec.vocab is not None:
            raise SymattnError(f"--vocab has {len(vocab)} words; a hand exercise's vocabulary has {lo} to {hi}")
        raise SymattnError(f"the vocabulary holds the tokens' words and the next word ({excerpt(' '.join(different))}"
                           f"): {len(vocab)} words, more than the {hi} of a hand exercise; use fewer --tokens or "
                           "repeat words in --words")
    targets = tuple(tokens[1:] + [after]) if spec.rows == "all" else (after,)
    return tokens, vocab, targets


def steps(spec) -> list[Fraction]:
    """The values a weight of the MLP or the unembedding takes: the range in the level's steps."""
    lo, hi = spec.lo_hi
    step = LEVELS[spec.level][0]
    count = int((hi - lo) / step) + 1
    return [lo + k * step for k in range(count)]


def draw(spec, rng: np.random.Generator, vocab_size: int) -> Mlp:
    """The MLP's norm, weights and biases and the unembedding, fresh from ``rng``."""
    values = np.array(steps(spec), dtype=object)
    d, f = spec.d_model, spec.d_ff

    def pick(rows: int, cols: int) -> np.ndarray:
        return values[rng.integers(0, len(values), size=(rows, cols))]

    gamma = rng.integers(1, 3, size=(1, d), dtype=np.int64)
    beta = rng.integers(0, 2, size=(1, d), dtype=np.int64) if spec.norm == "layernorm" else None
    return Mlp(gamma, beta, pick(d, f), pick(1, f), pick(f, d), pick(1, d), pick(d, vocab_size))


def generate(spec, seed: int, avoid: set | None = None):
    """The first whole block from ``seed`` that meets every guarantee (and is not in ``avoid``): a
    :class:`symattn.generate.exercises.Drawn` with its ``mlp``."""
    from . import exercises as ex

    ex.validate(spec)
    validate(spec)
    if seed < 0:
        raise SymattnError(f"the seed must be 0 or more, not {seed}")
    drawn, reason = search(spec, np.random.default_rng(seed), set(avoid or ()))
    if drawn is None:
        raise SymattnError(f"no problem met the {spec.level} guarantees in {ex.MAX_TRIES:,} tries (last failure: "
                           f"{reason}); try a smaller size, another --range or --level")
    return drawn


def to_yaml(spec, drawn, command: str, title: str) -> str:
    """The problem file of a whole block: the attention's fields, then ``mlp:``, ``logits:`` and ``loss:``."""
    from . import exercises as ex

    return ex.to_yaml(spec, drawn, command, title) + "\n".join(yaml_lines(spec, drawn.mlp, ex.quote)) + "\n"


def search(spec, rng: np.random.Generator, avoid: set):
    """A whole block in stages, each part drawn again until it meets its guarantees: the attention
    (X, the norm, W_Q; at easy and medium W_K until it is uniform, then W_V and W_O until H
    normalises to fractions), then the MLP and the unembedding; up to MAX_TRIES candidates in all.
    Returns (the Drawn, None), or (None, the last guarantee broken)."""
    from dataclasses import replace

    from . import exercises as ex

    exact = LEVELS[spec.level][3] is not None
    vocab, rows = len(sentence(spec)[1]), 1 if spec.rows == "last" else spec.tokens
    tries, reason = 0, None
    while tries < ex.MAX_TRIES:
        tries += 1
        drawn = ex.draw(spec, rng)
        if exact:
            tries += BATCH * len(drawn.heads)
            drawn, reason = _uniform_keys(spec, drawn, rng)
            if drawn is None:
                continue
        for _ in range(VALUE_ROUNDS if exact else 1):
            if exact:
                tries += BATCH
                candidate, reason = _fraction_values(spec, drawn, rng)
                if candidate is None:
                    continue
            else:
                candidate = drawn
            reason = ex.niceness(spec, candidate)
            H, H_hat, reason = stream_niceness(spec, candidate) if reason is None else (None, None, reason)
            if reason is None:
                break
        for _ in range(INNER_TRIES if reason is None else 0):
            tries += 1
            mlp = draw(spec, rng, vocab)
            reason = mlp_niceness(spec, H, H_hat, mlp, rows)
            if reason is None and replace(candidate, mlp=mlp).key() not in avoid:
                return replace(candidate, mlp=mlp), None
            reason = reason or "the same problem as another variant"
    return None, reason


def _uniform_keys(spec, drawn, rng: np.random.Generator):
    """``drawn`` with each head's W_K the first of BATCH candidates that makes its attention
    uniform (each query's visible scores equal, not all 0) within the level's bounds on K, the
    scores and the scaled scores' denominators; (None, why) when no candidate does. A prefilter:
    :func:`symattn.generate.exercises.niceness` has the last word."""
    from dataclasses import replace

    from .exercises import LEVELS as ATTENTION_LEVELS, allowed

    lo, hi = spec.lo_hi
    proj, score = spec.proj_score_bounds
    denominators = ATTENTION_LEVELS[spec.level][3]
    mask = np.array(allowed(spec))
    first = mask.argmax(axis=1)  # each query's first visible key
    X = drawn.attention_input()
    heads = []
    for W_Q, W_K, W_V in drawn.heads:
        Q = X @ W_Q
        if abs(Q).max() > proj:
            return None, f"a projection is larger than {proj} in size"
        keys = rng.integers(lo, hi + 1, size=(BATCH,) + W_K.shape, dtype=np.int64)
        K = X @ keys
        S = Q @ K.transpose(0, 2, 1)
        ok = (abs(K).max(axis=(1, 2)) <= proj) & (abs(S).max(axis=(1, 2)) <= score) & S.any(axis=(1, 2))
        if spec.scale:
            root = math.isqrt(W_Q.shape[1])
            ok &= np.isin(root // np.gcd(S, root), denominators).all(axis=(1, 2))
        ok &= np.where(mask, S == np.take_along_axis(S, np.broadcast_to(first[:, None], S.shape[:2] + (1,)), axis=2),
                       True).all(axis=(1, 2))
        found = np.flatnonzero(ok)
        if not found.size:
            return None, "no key weights made the attention uniform"
        heads.append((W_Q, keys[found[0]], W_V))
    return replace(drawn, heads=tuple(heads)), None


def _fraction_values(spec, drawn, rng: np.random.Generator):
    """``drawn`` with the first of BATCH candidate W_V (and W_O) whose V is within the level's
    bound and whose H = X + O (uniform attention) has rows that normalise to fractions (see
    :func:`_fraction_roots`); (None, why) when no candidate does."""
    from dataclasses import replace

    lo, hi = spec.lo_hi
    proj = spec.proj_score_bounds[0]
    X = drawn.attention_input()
    values = [rng.integers(lo, hi + 1, size=(BATCH,) + W_V.shape, dtype=np.int64) for _, _, W_V in drawn.heads]
    V = [X @ w for w in values]
    ok = np.all([abs(v).max(axis=(1, 2)) <= proj for v in V], axis=0)
    W_O = rng.integers(lo, hi + 1, size=(BATCH,) + drawn.W_O.shape, dtype=np.int64) if drawn.W_O is not None else None
    ok &= _fraction_roots(spec, drawn.X, V, W_O)
    found = np.flatnonzero(ok)
    if not found.size:
        return None, "a row of H has a variance that is not the square of a fraction (or is 0)"
    k = found[0]
    heads = tuple((W_Q, W_K, w[k]) for (W_Q, W_K, _), w in zip(drawn.heads, values))
    return replace(drawn, heads=heads, W_O=W_O[k] if W_O is not None else None), None


def uniform_output(spec, drawn) -> np.ndarray:
    """The attention's output O as Fractions, when every query's visible scores are equal (each
    softmax weight 1/k over the k keys it sees)."""
    from .exercises import allowed

    mask = allowed(spec)
    A = np.array([[Fraction(1, sum(row)) if ok else Fraction(0) for ok in row] for row in mask], dtype=object)
    X = drawn.attention_input()
    O = np.concatenate([A.dot(X @ W_V) for _, _, W_V in drawn.heads], axis=1)
    return O if drawn.W_O is None else O.dot(drawn.W_O)


def float_output(spec, drawn) -> np.ndarray:
    """O in floats, for the margins of the hard level (the softmax has exponentials)."""
    from .exercises import allowed

    mask = np.array(allowed(spec))
    X = drawn.attention_input().astype(float)
    outs = []
    for W_Q, W_K, W_V in drawn.heads:
        S = (X @ W_Q) @ (X @ W_K).T / (math.sqrt(W_Q.shape[1]) if spec.scale else 1.0)
        S = np.where(mask, S, -np.inf)
        E = np.exp(S - S.max(axis=1, keepdims=True))
        outs.append((E / E.sum(axis=1, keepdims=True)) @ (X @ W_V))
    O = np.concatenate(outs, axis=1)
    return O if drawn.W_O is None else O @ drawn.W_O


def _root(x: Fraction) -> Fraction | None:
    """√x when it is a fraction, else None."""
    n, d = math.isqrt(x.numerator), math.isqrt(x.denominator)
    return Fraction(n, d) if n * n == x.numerator and d * d == x.denominator else None


def normalised(spec, H: np.ndarray, exact: bool) -> tuple[np.ndarray | None, str | None]:
    """Each row of H over its own root (ε = 0): (H_hat, None), or (None, the reason it is not
    hand-friendly: a row of variance 0, or at easy and medium a root that is not a fraction)."""
    rows = []
    for h in H:
        centred = h - sum(h) / len(h) if spec.norm == "layernorm" else h
        spread = sum(x * x for x in centred) / len(h)
        if spread == 0 or (not exact and spread < HARD_MARGIN):
            return None, "a row of H is constant, so its norm would divide by 0"
        root = _root(Fraction(spread)) if exact else math.sqrt(spread)
        if root is None:
            return None, "a row of H has a variance that is not the square of a fraction"
        rows.append(centred / root)
    return np.array(rows, dtype=object if exact else float), None


def _fraction_roots(spec, X: np.ndarray, V: list[np.ndarray], W_O: np.ndarray | None) -> np.ndarray:
    """For each of a batch of value matrices (V: one (batch, n, d_v) array per head, W_O: (batch,
    ·, d_model) or None), whether every row of H = X + O (uniform attention) has a variance
    (RMSNorm: a mean square) that is the square of a fraction, not 0. In integers: with L the common
    multiple of the rows' key counts k, L·H is whole, and d·Σh² − (Σh)² (RMSNorm: d·Σh²) of each of
    its rows, d² times its variance, must be a square."""
    from .exercises import allowed

    mask = np.array(allowed(spec), dtype=np.int64)
    k = mask.sum(axis=1)
    L = math.lcm(*k.tolist())
    LO = np.concatenate([(mask * (L // k)[:, None]) @ v for v in V], axis=2)
    LH = L * X + (LO if W_O is None else LO @ W_O)
    d = LH.shape[2]
    squares = (LH * LH).sum(axis=2)
    q = d * squares - LH.sum(axis=2) ** 2 if spec.norm == "layernorm" else d * squares
    roots = np.round(np.sqrt(np.maximum(q, 0))).astype(np.int64)  # q is small: its float root is exact enough
    return ((q > 0) & (roots * roots == q)).all(axis=1)


def stream_niceness(spec, drawn) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """H = X + O and its normalised rows (H, H_hat, None), or (None, None, the first guarantee broken)."""
    exact = LEVELS[spec.level][3] is not None
    H = drawn.X + (uniform_output(spec, drawn) if exact else float_output(spec, drawn))
    H_hat, reason = normalised(spec, H, exact)
    if reason is None and exact:
        centred = H - H.sum(axis=1, keepdims=True) / H.shape[1] if spec.norm == "layernorm" else H
        spread = (centred * centred).sum(axis=1, keepdims=True) / H.shape[1]
        reason = _denominators(spec, {"H": H, "the norm's mean": H.sum(axis=1) / H.shape[1],
                                      "the norm's variance": spread, "H_hat": H_hat})
    return (None, None, reason) if reason else (H, H_hat, None)


def mlp_niceness(spec, H: np.ndarray, H_hat: np.ndarray, mlp: Mlp, rows: int) -> str | None:
    """The first guarantee of the MLP and the logits that ``mlp`` breaks, or None."""
    _, u_bound, z_bound, _ = LEVELS[spec.level]
    exact = H.dtype == object
    H_norm = H_hat * mlp.gamma + (mlp.beta if mlp.beta is not None else 0)
    W_1, b_1, W_2, b_2, W_U = ((m if exact else m.astype(float)) for m in (mlp.W_1, mlp.b_1, mlp.W_2, mlp.b_2, mlp.W_U))
    U = H_norm.dot(W_1) + b_1
    if (U == 0).any() if exact else (abs(U) < HARD_MARGIN).any():
        return "a pre-activation is 0, where ReLU has its kink" if exact else "a pre-activation is within 0.1 of 0"
    if not ((U < 0).any() and (U > 0).any()):
        return "ReLU cuts every pre-activation or none"
    if abs(U).max() > u_bound:
        return f"a pre-activation is larger than {u_bound} in size"
    G = np.where(U > 0, U, 0) ** (2 if spec.activation == "relu2" else 1)
    F = G.dot(W_2) + b_2
    if not F.any():
        return "the MLP's output is 0"
    Y = H + F
    z = Y[-rows:].dot(W_U)
    if abs(z).max() > z_bound:
        return f"a logit is larger than {z_bound} in size"
    spread = z.max(axis=1) - z.min(axis=1)
    if (spread == 0).any() if exact else (spread < HARD_MARGIN).any():
        return "every word of a row has the same logit"
    if exact:
        return _denominators(spec, {"H_norm": H_norm, "U": U, "G": G, "F": F, "Y": Y, "logits": z})
    return None


def _denominators(spec, stages: dict) -> str | None:
    largest = LEVELS[spec.level][3]
    for name, m in stages.items():
        if max(Fraction(x).denominator for x in m.ravel()) > largest:
            return f"an entry of {name} has a denominator above {largest}"
    return None


def number(x) -> str:
    """An integer or a half as YAML: 2, -1, 0.5, -1.5 (a half is exact in decimals)."""
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    assert x.denominator == 2, x
    return ("-" if x < 0 else "") + f"{abs(x.numerator) // 2}.5"


def yaml_lines(spec, mlp: Mlp, quote) -> list[str]:
    """``mlp:``, ``logits:`` and ``loss:`` of the problem file."""
    _, vocab, targets = sentence(spec)

    def row(m: np.ndarray) -> str:
        return "[" + ", ".join(number(v) for v in m.ravel()) + "]"

    def matrix(m: np.ndarray) -> str:
        return "\n".join(f"    - {row(r)}" for r in m)

    bias = f", bias: {row(mlp.beta)}" if mlp.beta is not None else ""
    out = ["mlp:", f"  norm: {{type: {spec.norm}, weight: {row(mlp.gamma)}{bias}, eps: 0}}",
           "  W_1:\n" + matrix(mlp.W_1), f"  b_1: {row(mlp.b_1)}", "  W_2:\n" + matrix(mlp.W_2),
           f"  b_2: {row(mlp.b_2)}", f"  activation: {spec.activation}",
           "logits:", "  W_U:\n" + matrix(mlp.W_U), f"  rows: {spec.rows}",
           "  vocab: [" + ", ".join(quote(w) for w in vocab) + "]",
           "loss: {targets: [" + ", ".join(quote(w) for w in targets) + "]}"]
    return out
