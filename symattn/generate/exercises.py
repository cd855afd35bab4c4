"""Fresh exercises with hand-friendly numbers, reproducible from a seed: the specification
(:class:`Spec`), the drawing, the guarantees of each level (:func:`niceness`, documented with
:func:`symattn.generate`) and the problem file text (:func:`to_yaml`).

:mod:`symattn.generate.batch` builds on these: distinct variants of a batch and their folder.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from ..errors import SymattnError
from ..text import LongNumber, excerpt, whole_number
from ..problem.masks import mask_rule
from . import differential as _differential

LEVELS = {
    # range, |projection| bound, |score| bound, allowed denominators of scaled scores
    "easy": ((0, 1), 4, 8, (1,)),
    "medium": ((-1, 1), 6, 16, (1, 2, 3)),
    "hard": ((-2, 2), 12, 48, None),
}
MAX_TRIES = 200_000
LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")  # what YAML reads as the end of a line
DEFAULT_WORDS = ("the", "cat", "sat", "on", "a", "warm", "mat", "today", "and", "then", "slept", "well")


@dataclass(frozen=True)
class Spec:
    """What to generate."""

    tokens: int = 4
    d_model: int = 4
    d_k: int = 4
    d_v: int = 4
    mask: str = "causal"  # none, causal, causal-bottom-right, sliding-window:W, sink-window:K,W, padding:P
    heads: int = 1
    cross: int | None = None  # n_k of a context (cross-attention)
    scale: bool = True
    level: str = "easy"
    range: tuple[int, int] | None = None
    words: tuple[str, ...] | None = None
    vary: str | None = None  # with a base problem: "weights" or "inputs"
    extra: tuple[str, ...] = ()  # YAML lines kept from a base problem (an exact scale, a bias)
    bounds: tuple[int, int] | None = None  # |projection| and |score| bounds instead of the level's
    norm: str | None = None  # "layernorm" or "rmsnorm" in front of the attention (eps: 0, whole normalised rows)
    residual: bool = False  # H = X + O (the output as wide as X)
    block: bool = False  # the whole block: the MLP, the logits and the loss too (symattn.generate.block)
    d_ff: int = 3  # with block: the MLP's hidden units
    activation: str = "relu"  # with block: relu or relu2
    vocab: tuple[str, ...] | None = None  # with block: the vocabulary (else the sentence's words and a few)
    rows: str = "last"  # with block: the logits of the last position, or of every one ("all")
    # --sink: gpt-oss's learned sink logit, the same whole number (−9 to 9) in every head; at easy each
    # softmax row has at most two distinct exponents counting the sink's. mask "sink-window:K,W" is
    # StreamingLLM's: the first K keys and a causal window of W
    sink: int | None = None
    linear: str | None = None  # linear attention's feature map (relu, elu1, identity) instead of the softmax
    mla: bool = False  # multi-head latent attention of a fixed shape (symattn.generate.mla)
    differential: str | None = None  # differential attention's λ (text such as "1/2"): a second map drawn too

    @property
    def proj_score_bounds(self) -> tuple[int, int]:
        return self.bounds or LEVELS[self.level][1:3]

    @property
    def lo_hi(self) -> tuple[int, int]:
        if self.range is None and self.linear == "relu" and self.level == "easy":
            return -1, 1  # relu has something to cut only with negative entries
        return self.range or LEVELS[self.level][0]

    @property
    def n_k(self) -> int:
        return self.cross or self.tokens


@dataclass(frozen=True)
class Drawn:
    """The integer matrices of one generated problem."""

    X: np.ndarray
    context: np.ndarray | None
    heads: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]
    W_O: np.ndarray | None
    gamma: np.ndarray | None = None  # the norm's weight (1 × d_model), with a norm
    beta: np.ndarray | None = None  # the norm's bias (1 × d_model), with a LayerNorm
    mlp: object = None  # with a block: its symattn.generate.block.Mlp (the MLP's norm and weights, W_U)
    maps: tuple = ()  # with --differential: each head's (W_Q2, W_K2)

    def key(self) -> tuple:
        parts = [self.X] + ([self.context] if self.context is not None else []) + [w for h in self.heads for w in h]
        parts += [m for m in (self.W_O, self.gamma, self.beta) if m is not None] + [w for m in self.maps for w in m]
        key = tuple(tuple(map(int, p.ravel())) + (p.shape,) for p in parts)
        return key + (self.mlp.key() if self.mlp is not None else ())

    def attention_input(self) -> np.ndarray:
        """What the projections read: X, or with a norm X_norm = X̂ ∘ γ + β, whole numbers by
        construction (each row of X is a·z + b with z a row of ±1, so X̂ = z exactly at ε = 0)."""
        if self.gamma is None:
            return self.X
        if self.beta is not None:  # LayerNorm: μ = b, σ = a
            centred = self.X - self.X.mean(axis=1, keepdims=True).astype(np.int64)
            scale = np.sqrt((centred ** 2).mean(axis=1, keepdims=True)).astype(np.int64)
        else:  # RMSNorm: √(mean x²) = a
            centred, scale = self.X, np.sqrt((self.X ** 2).mean(axis=1, keepdims=True)).astype(np.int64)
        return (centred // scale) * self.gamma + (self.beta if self.beta is not None else 0)


def validate(spec: Spec) -> None:
    """Reject option combinations that cannot be generated, with the reason."""
    if spec.level not in LEVELS:
        raise SymattnError(f"unknown level {spec.level!r}; choose easy, medium or hard")
    for name in ("tokens", "d_model", "d_k", "d_v", "heads"):
        value = getattr(spec, name)
        if not 1 <= value <= 16:
            raise SymattnError(f"--{name.replace('_', '-')} must be from 1 to 16 for a hand exercise, not {value}")
    if spec.cross is not None and not 1 <= spec.cross <= 16:
        raise SymattnError(f"--cross must be from 1 to 16, not {spec.cross}")
    lo, hi = spec.lo_hi
    if lo > hi:
        raise SymattnError(f"--range {lo}..{hi}: the low end is above the high end; write LOW..HIGH")
    if max(abs(lo), abs(hi)) > 9:
        raise SymattnError(f"--range {lo}..{hi} must be a range of small integers (at most 9 in size)")
    if spec.norm not in (None, "layernorm", "rmsnorm"):
        raise SymattnError(f"unknown norm {excerpt(str(spec.norm))}; choose layernorm or rmsnorm")
    if spec.norm == "layernorm" and spec.d_model % 2:
        raise SymattnError(f"--norm layernorm needs an even --d-model (each row's normalised entries are +1 and −1, "
                           f"half each, so that its variance is a perfect square), not {spec.d_model}")
    if spec.residual and not spec.block and spec.heads == 1 and spec.d_v != spec.d_model:
        raise SymattnError(f"--residual adds the output to X, so it needs the output as wide as X: --d-v {spec.d_v} "
                           f"is not --d-model {spec.d_model} (or use several --heads, whose W_O gives d_model columns)")
    if spec.differential is not None:
        _differential.validate(spec)
    if spec.linear is not None:
        _validate_linear(spec)
    elif spec.scale and spec.level != "hard" and math.isqrt(spec.d_k) ** 2 != spec.d_k:
        raise SymattnError(
            f"d_k = {spec.d_k} is not a perfect square, so the scaled scores carry √{spec.d_k}; "
            "use --level hard, --no-scale, or a d_k such as 1, 4 or 9"
        )
    if spec.sink is not None and not -9 <= spec.sink <= 9:
        raise SymattnError(f"--sink must be a small whole number (at most 9 in size), not {spec.sink}")
    if spec.sink is not None and spec.block:
        raise SymattnError("--sink does not go with --block yet (a block's attention is uniform by design)")
    if spec.block:
        if spec.norm is None:
            raise SymattnError("a block exercise has a norm in front of the attention: choose layernorm or rmsnorm")
    allowed(spec)  # raises for a bad mask


def _validate_linear(spec: Spec) -> None:
    """Linear attention: a known feature map, a mask its state can follow, no scale, self-attention."""
    from ..problem.model import FEATURES

    if spec.linear not in FEATURES:
        raise SymattnError(f"unknown feature {excerpt(str(spec.linear))}; choose relu, elu1 or identity")
    if spec.mask.partition(":")[0] not in ("none", "causal", "padding"):
        raise SymattnError(f"linear attention follows --mask none, causal or padding:P, not {excerpt(spec.mask)}")
    for given, what in ((not spec.scale, "--no-scale (linear attention takes no scale)"),
                        (spec.cross is not None, "--cross (linear attention is derived for self-attention)"),
                        (spec.block, "--block (the block's attention is the softmax's)")):
        if given:
            raise SymattnError(f"--linear cannot go with {what}")


def _linear_niceness(spec: Spec, Q: np.ndarray, K: np.ndarray, mask: np.ndarray, score_bound: int) -> str | None:
    """Linear attention's guarantees: every normaliser positive (never a division by 0, and weights that
    are a share of the row); with relu, some entry cut, no key whose features all vanish, and the
    table's entries within the score bound."""
    if spec.linear == "elu1":  # positive features: every normaliser is; the powers of e are kept exact
        return None
    fq, fk = (np.maximum(m, 0) for m in (Q, K)) if spec.linear == "relu" else (Q, K)
    if spec.linear == "relu" and (Q >= 0).all() and (K >= 0).all():
        return "relu cuts no entry of Q or K (nothing to compute)"
    if spec.linear == "relu" and not fk.any(axis=1).all():
        return "a key's features all vanish (it would take no weight anywhere)"
    table = np.where(mask, fq @ fk.T, 0)
    if abs(table).max() > score_bound:
        return f"an entry of the table is larger than {score_bound} in size"
    if (table < 0).any() or (table.sum(axis=1) <= 0).any():
        return "a normaliser is 0 or a weight negative"
    return None


def allowed(spec: Spec) -> list[list[bool]]:
    """The mask of the spec as a boolean matrix (query i, key j)."""
    n_q, n_k = spec.tokens, spec.n_k
    kind, colon, arg = spec.mask.partition(":")
    if colon and kind in ("none", "causal", "causal-bottom-right"):
        raise SymattnError(f"the mask {kind} takes no argument; write --mask {kind}")
    width = None
    if kind == "sink-window":
        return _sink_window(spec, arg)
    if kind in ("sliding-window", "padding"):
        try:
            width = whole_number(arg)
        except LongNumber as exc:
            raise SymattnError(f"--mask {kind}:N: {exc}") from None
        if width is None:
            raise SymattnError(f"--mask {kind}:N needs a whole number N, not {excerpt(arg)}")
    if kind in ("none", "causal", "causal-bottom-right"):
        grid = mask_rule(kind, n_q, n_k)
    elif kind == "sliding-window" and width >= 1:
        grid = mask_rule(kind, n_q, n_k, width)
    elif kind == "padding":
        if not 1 <= width < n_k:
            raise SymattnError(f"--mask padding:{arg} must hide from 1 to {n_k - 1} of the {n_k} keys")
        grid = [[j < n_k - width for j in range(n_k)] for i in range(n_q)]
    else:
        import difflib

        close = difflib.get_close_matches(kind, ["none", "causal", "causal-bottom-right", "sliding-window", "sink-window",
                                                 "padding"], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SymattnError(
            f"unknown mask {excerpt(spec.mask)}{hint}; choose none, causal, causal-bottom-right, sliding-window:W, "
            "sink-window:K,W or padding:P"
        )
    for i, row in enumerate(grid):
        if not any(row):
            raise SymattnError(f"the mask {spec.mask} leaves query {i + 1} with no key to attend to; choose another mask or shape")
    return grid


def _sink_window(spec: Spec, arg: str) -> list[list[bool]]:
    """``sink-window:K,W``: StreamingLLM's mask, the first K keys and a causal window of W."""
    try:
        numbers = [whole_number(x) for x in arg.split(",")]
    except LongNumber as exc:
        raise SymattnError(f"--mask sink-window:K,W: {exc}") from None
    if len(numbers) != 2 or None in numbers or min(numbers) < 1:
        raise SymattnError(f"--mask sink-window:K,W needs two whole numbers ≥ 1 (K sink tokens, a window of W), "
                           f"not {excerpt(arg)}")
    if spec.cross is not None:
        raise SymattnError("--mask sink-window:K,W is for self-attention (its window is causal), not --cross")
    return [list(row) for row in mask_rule("sink-window", spec.tokens, spec.n_k, numbers[1], numbers[0])]


def niceness(spec: Spec, drawn: Drawn) -> str | None:
    """The first guarantee of the spec's level that ``drawn`` breaks, or None when it meets them all."""
    denominators = LEVELS[spec.level][3]
    proj_bound, score_bound = spec.proj_score_bounds
    lo, hi = spec.lo_hi
    inputs = [drawn.X] + ([drawn.context] if drawn.context is not None else [])
    weights = [w for h in drawn.heads for w in h] + ([drawn.W_O] if drawn.W_O is not None else [])
    drawn_now = {"weights": weights, "inputs": inputs}.get(spec.vary, inputs + weights)  # --from keeps the rest
    if drawn.gamma is not None:  # a norm's X is drawn as a·z + b, outside the range; its X_norm is bounded instead
        drawn_now = weights
    for m in drawn_now:
        if m.min() < lo or m.max() > hi:
            return f"an entry is outside the range {lo}..{hi}"
    mask = np.array(allowed(spec))
    X = drawn.attention_input()
    if drawn.gamma is not None and len({tuple(row) for row in X.tolist()}) < min(spec.tokens, 3):
        return "too many tokens normalise to the same row"
    C = drawn.context if drawn.context is not None else X
    for W_Q, W_K, W_V in drawn.heads:
        Q, K, V = X @ W_Q, C @ W_K, C @ W_V
        if max(abs(Q).max(), abs(K).max(), abs(V).max()) > proj_bound:
            return f"a projection is larger than {proj_bound} in size"
        if spec.linear is not None:
            reason = _linear_niceness(spec, Q, K, mask, score_bound)
            if reason is not None:
                return reason
            continue
        S = Q @ K.T
        if abs(S).max() > score_bound:
            return f"a score is larger than {score_bound} in size"
        if spec.scale:
            root = math.isqrt(W_Q.shape[1])
            if denominators is not None:
                if math.isqrt(W_Q.shape[1]) ** 2 != W_Q.shape[1]:
                    return "d_k is not a perfect square"
                for s in S.ravel():
                    if Fraction(int(s), root).denominator not in denominators:
                        return f"a scaled score is not {'an integer' if denominators == (1,) else 'an integer, half or third'}"
        root = math.isqrt(W_Q.shape[1]) if spec.scale else 1
        sink = set() if spec.sink is None else {Fraction(spec.sink) * root}  # the sink, on the scores' scale
        distinct = [len({int(s) for s, ok in zip(S[i], mask[i]) if ok} | sink) for i in range(S.shape[0])]
        if spec.block and spec.level != "hard":  # uniform attention: every softmax weight is 1/k
            if max(distinct) > 1:
                return "a query's visible scores differ (its softmax weights would not be fractions)"
            if not S.any():
                return "every score is 0 (nothing to compute)"
            continue
        if spec.level == "easy" and max(distinct) > 2:
            return "a softmax row has more than two distinct exponents"
        if max(distinct) < 2 and max(len(row) for row in mask.tolist()) > 1 and sum(mask.ravel()) > mask.shape[0]:
            return "every softmax row is uniform (nothing to compute)"
    if spec.differential is not None:
        return _differential.niceness(spec, drawn, X, mask, (proj_bound, score_bound), denominators)
    return None


def draw(spec: Spec, rng: np.random.Generator, base: Drawn | None = None) -> Drawn:
    """One candidate: fresh integers in the range (with ``base``, only the varied part is new)."""
    lo, hi = spec.lo_hi

    def ints(rows: int, cols: int) -> np.ndarray:
        return rng.integers(lo, hi + 1, size=(rows, cols), dtype=np.int64)

    gamma = beta = None
    if base is not None and spec.vary == "weights":
        X, context = base.X, base.context
    elif spec.norm is not None:
        X, gamma, beta = _normed_rows(spec, rng)
        context = ints(spec.cross, spec.d_model) if spec.cross else None
    else:
        X = ints(spec.tokens, spec.d_model)
        context = ints(spec.cross, spec.d_model) if spec.cross else None
    if base is not None and spec.vary == "inputs":
        return replace(base, X=X, context=context)
    # (d_k, d_v) of each head: the base problem's when varying one
    shapes = [(W_Q.shape[1], W_V.shape[1]) for W_Q, _, W_V in base.heads] if base is not None else None
    heads = []
    for h in range(spec.heads):
        d_k, d_v = shapes[h] if shapes else (spec.d_k, spec.d_v)
        heads.append((ints(spec.d_model, d_k), ints(spec.d_model, d_k), ints(spec.d_model, d_v)))
    W_O = None
    if spec.heads > 1:
        width = sum(h[2].shape[1] for h in heads)
        d_out = base.W_O.shape[1] if base is not None and base.W_O is not None else \
            spec.d_model if spec.residual else heads[0][2].shape[1]
        W_O = ints(width, d_out)
    maps = _differential.draw(spec, ints, heads) if spec.differential is not None else ()
    return Drawn(X, context, tuple(heads), W_O, gamma, beta, maps=maps)


def _normed_rows(spec: Spec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """X, γ and β for a norm with ε = 0 and whole normalised rows: each row a·z + b with z a row of
    ±1 (half each for LayerNorm, so μ = b and σ = a; b = 0 for RMSNorm, so √(mean x²) = a), γ of 1s
    and 2s, β of 0s and 1s."""
    d = spec.d_model
    rows = []
    for _ in range(spec.tokens):
        a = int(rng.integers(1, 3))
        if spec.norm == "layernorm":
            z = rng.permutation(np.array([1] * (d // 2) + [-1] * (d // 2), dtype=np.int64))
            rows.append(a * z + a + int(rng.integers(0, 2)))  # b ≥ a: every entry ≥ 0
        else:
            rows.append(a * rng.choice(np.array([1, -1], dtype=np.int64), size=d))
    gamma = rng.integers(1, 3, size=(1, d), dtype=np.int64)
    beta = rng.integers(0, 2, size=(1, d), dtype=np.int64) if spec.norm == "layernorm" else None
    return np.array(rows, dtype=np.int64), gamma, beta


def generate(spec: Spec, seed: int, base: Drawn | None = None, avoid: set | None = None) -> Drawn:
    """The first candidate from ``seed`` that meets every guarantee (and is not in ``avoid``).

    A variant of ``base`` is never the base itself.
    """
    validate(spec)
    if spec.block:
        raise SymattnError("a whole block is drawn by symattn.generate.block.generate")
    if seed < 0:
        raise SymattnError(f"the seed must be 0 or more, not {seed}")
    avoid = set(avoid or ())
    if base is not None:
        avoid.add(base.key())
    rng = np.random.default_rng(seed)
    reason = None
    for _ in range(MAX_TRIES):
        drawn = draw(spec, rng, base)
        reason = niceness(spec, drawn)
        if reason is None and (avoid is None or drawn.key() not in avoid):
            return drawn
    raise SymattnError(
        f"no problem met the {spec.level} guarantees in {MAX_TRIES:,} tries (last failure: {reason}); "
        "try a smaller size, another --range or --level"
    )


def to_yaml(spec: Spec, drawn: Drawn, command: str, title: str) -> str:
    """The problem file text: a comment header with the command that made it, then the fields."""

    def matrix(m: np.ndarray, indent: str = "  ") -> str:
        return "\n".join(f"{indent}- [{', '.join(str(int(v)) for v in row)}]" for row in m)

    words = spec.words or DEFAULT_WORDS
    tokens = token_words(spec)
    made_by = "\n#   ".join(LINE_BREAK.split(command))  # a line break in an argument stays in the comment
    out = [f"# Made by: {made_by}", f"# Level {spec.level}: see `symattn generate --help` for its guarantees.", f"title: {quote(title)}"]
    out.append("tokens: [" + ", ".join(quote(t) for t in tokens) + "]")
    out.append("X:\n" + matrix(drawn.X))
    if drawn.context is not None:
        ctx_words = words[spec.tokens:] if spec.words else DEFAULT_WORDS[::-1]
        ctx = [ctx_words[j] if j < len(ctx_words) else f"c{j + 1}" for j in range(spec.cross)]
        out.append("context_tokens: [" + ", ".join(quote(t) for t in ctx) + "]")
        out.append("context:\n" + matrix(drawn.context))
    if spec.heads == 1:
        W_Q, W_K, W_V = drawn.heads[0]
        out += ["W_Q:\n" + matrix(W_Q), "W_K:\n" + matrix(W_K), "W_V:\n" + matrix(W_V)]
    else:
        out.append("heads:")
        for W_Q, W_K, W_V in drawn.heads:
            out.append("  - W_Q:\n" + matrix(W_Q, "      ") + "\n    W_K:\n" + matrix(W_K, "      ") + "\n    W_V:\n" + matrix(W_V, "      "))
        out.append("W_O:\n" + matrix(drawn.W_O))
    kind, _, arg = spec.mask.partition(":")
    if kind == "sliding-window":
        out.append(f"mask: {{sliding-window: {arg}}}")
    elif kind == "sink-window":
        k, w = arg.split(",")
        out.append(f"mask: {{sink: {int(k)}, window: {int(w)}}}")
    elif kind == "padding" and spec.linear is not None:  # the keys' vector: a state skips padding keys
        out.append("mask: {padding: [" + ", ".join("1" if ok else "0" for ok in allowed(spec)[0]) + "]}")
    elif kind == "padding":
        out.append("mask:\n" + matrix(np.array(allowed(spec), dtype=int)))
    else:
        out.append(f"mask: {kind}")
    if not spec.scale:
        out.append("scale: none")
    if spec.sink is not None:
        out.append(f"sink: {spec.sink}" if spec.heads == 1 else f"sink: [{', '.join([str(spec.sink)] * spec.heads)}]")
    if drawn.gamma is not None:
        row = lambda m: "[" + ", ".join(str(int(v)) for v in m[0]) + "]"  # noqa: E731
        bias = f", bias: {row(drawn.beta)}" if drawn.beta is not None else ""
        out.append(f"norm: {{type: {spec.norm}, weight: {row(drawn.gamma)}{bias}, eps: 0}}")
    if spec.residual:
        out.append("residual: true")
    if spec.linear is not None:
        out.append(f"linear: {{feature: {spec.linear}}}")
    if spec.differential is not None:
        out += _differential.yaml_lines(spec, drawn)
    out.extend(spec.extra)
    return "\n".join(out) + "\n"


def token_words(spec: Spec) -> list[str]:
    """The tokens' labels: the first words of ``--words`` (or of the default sentence), then t5, t6, ..."""
    words = spec.words or DEFAULT_WORDS
    return [words[i] if i < len(words) else f"t{i + 1}" for i in range(spec.tokens)]


def from_problem(problem) -> tuple[Spec, Drawn]:
    """The structure and integers of an existing problem, for --from (integer entries only)."""
    import sympy

    def arr(m):
        if not all(isinstance(x, sympy.Integer) for x in m):
            raise SymattnError(f"{problem.source}: --from needs integer entries to vary (hand-friendly problems)")
        return np.array(m.tolist(), dtype=np.int64)

    if not problem.projected:
        raise SymattnError(f"{problem.source}: --from needs a problem with X and weights (not Q, K, V given)")
    if problem.positions is not None:
        raise SymattnError(f"{problem.source}: --from does not vary problems with positions (remove positions: first)")
    if getattr(problem, "differential", None) is not None:
        raise SymattnError(f"{problem.source}: --from does not vary differential attention yet (its second map would "
                           "be lost); use --differential LAMBDA")
    if problem.mlp is not None or problem.logits is not None:
        raise SymattnError(f"{problem.source}: --from does not vary problems with an MLP or logits yet (remove mlp:, "
                           "logits: and loss: first)")
    if problem.norm is not None or problem.residual or problem.embeddings_norm is not None:
        raise SymattnError(f"{problem.source}: --from does not vary problems with a norm or a residual (remove norm:, "
                           "embeddings_norm: and residual: first)")
    if problem.kv_heads:
        raise SymattnError(f"{problem.source}: --from does not vary grouped-query problems (kv_heads) yet")
    if problem.qk_norm is not None:
        raise SymattnError(f"{problem.source}: --from does not vary problems with qk_norm yet (remove qk_norm: first)")
    mask = problem.mask
    if mask.kind == "sliding-window":
        kind = f"sliding-window:{mask.window}"
    elif mask.kind == "sink-window":
        kind = f"sink-window:{mask.sink},{mask.window}"
    elif mask.kind in ("matrix", "padding", "valid-length"):
        last = [row.index(False) if False in row else len(row) for row in mask.allowed]
        if len(set(last)) != 1 or any(any(row[last[0]:]) for row in mask.allowed):
            raise SymattnError(f"{problem.source}: --from supports padding masks (the last keys hidden) among mask matrices")
        kind = f"padding:{problem.n_k - last[0]}"
    elif mask.kind == "combined":
        raise SymattnError(f"{problem.source}: --from supports one mask, not a list of masks")
    else:
        kind = mask.kind
    heads = tuple((arr(h.W_Q), arr(h.W_K), arr(h.W_V)) for h in problem.heads)
    drawn = Drawn(arr(problem.X), arr(problem.context) if problem.context is not None else None, heads,
                  arr(problem.W_O) if problem.W_O is not None else None)
    # the base problem's own sizes are acceptable for its variants
    C = drawn.context if drawn.context is not None else drawn.X
    proj = max(int(abs(m).max()) for W_Q, W_K, W_V in heads for m in (drawn.X @ W_Q, C @ W_K, C @ W_V))
    score = max(int(abs((drawn.X @ W_Q) @ (C @ W_K).T).max()) for W_Q, W_K, _ in heads)
    extra = []
    if not isinstance(problem.scale, str):
        extra.append(f"scale: {quote(sympy.sstr(problem.scale))}")
    if problem.bias is not None:
        def entry(x):
            if x == sympy.S.NegativeInfinity:
                return "-inf"
            return str(x) if isinstance(x, sympy.Integer) else quote(sympy.sstr(x))

        rows = ["  - [" + ", ".join(entry(x) for x in row) + "]" for row in problem.bias.tolist()]
        extra.append("bias:\n" + "\n".join(rows))
    if problem.decode is not None:
        extra.append(f"decode: {problem.decode}")
    if problem.sinks is not None:  # learned sinks are kept as they are (the numbers that vary are X or the weights)
        extra.append("sink: [" + ", ".join(quote(sympy.sstr(s)) for s in problem.sinks) + "]")
    for name in ("softcap", "temperature"):  # kept as they are: the variants change the numbers only
        if getattr(problem, name) is not None:
            extra.append(f"{name}: {quote(sympy.sstr(getattr(problem, name)))}")
    spec = Spec(
        extra=tuple(extra),
        bounds=(proj, score),
        tokens=problem.n_q, d_model=problem.d_model, d_k=problem.d_k, d_v=problem.d_v, mask=kind,
        heads=len(heads), cross=problem.n_k if problem.context is not None else None,
        scale=problem.scale != "none", words=problem.tokens + (problem.key_tokens if problem.context is not None else ()),
        linear=problem.linear.feature if problem.linear is not None else None,
    )
    return spec, drawn


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
