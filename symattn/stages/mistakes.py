"""The common mistakes: for each, the name said to the student and a relation that computes the
stage the mistake would give from the exact values (``ex(key)``), or None where it does not apply."""

from __future__ import annotations

from typing import Callable

from .ids import A, K, M, M_TILED, Q, Q_ROT, S, S_MASKED, S_SCALED, V
from .kinds import Context, Mistake, Relation
from .relations import row_t
from .scores import cap, finish, temper
from .shapes import is_square


def pe_slip(**slip) -> Relation:
    def relation(ops, ex, c):
        m = c.p.positions.variant(**slip)
        return None if m is None else ops.given(m)

    return relation


_TRANSPOSED = "the product's rows and columns are swapped (the answer is the transpose)"
NO_SCALING = "no scaling: the scores were not divided by √d_k"
BY_D_K = "scaled by d_k instead of √d_k"
MASK_MISSING = "mask missing: the masked positions were not set to −∞"
_MASK_AFTER = "mask applied after the softmax (masked weights zeroed, rows not renormalised)"
_COLUMNS = "softmax taken over columns instead of rows"


def transposed(key: str, square_only: bool = False) -> Mistake:
    def relation(ops, ex, c):
        exact = ex(key)
        return None if square_only and not is_square(exact) else ops.T(exact)

    return Mistake(_TRANSPOSED, relation)


def by_d_k(ops, ex, c: Context):
    return ops.scale(ex(S), ops.rational(1, c.d_k))


def score_variants(kind: str) -> tuple[Mistake, ...]:
    """Mistakes before the softmax, carried to the weights (``kind`` A) or the output (O)."""

    def carried(weights_of: Callable) -> Relation:
        def relation(ops, ex, c):
            a = weights_of(ops, ex, c)
            return a if kind == A or a is None else ops.matmul(a, ex(V))

        return relation

    def columns(ops, ex, c):
        z = ex("a_in")
        if not ops.columns_attend(z):
            return None
        return ops.T(ops.softmax(ops.T(z)))

    def unmasked(ops, ex, c):  # the scores as the softmax reads them, with no mask
        return temper(ops, cap(ops, ex(S_SCALED), c), c)

    def after(ops, ex, c):
        return ops.zero_masked(ops.softmax(unmasked(ops, ex, c), sink=c.sink), ex(M))

    def with_sink(weights_of: Callable) -> Callable:
        def relation(ops, ex, c):
            return None if c.sink is None else weights_of(ops, ex, c)

        return relation

    return (
        Mistake(NO_SCALING, carried(lambda ops, ex, c: ops.softmax(finish(ops, ex(S), ex(M), c), sink=c.sink))),
        Mistake(BY_D_K, carried(lambda ops, ex, c: ops.softmax(finish(ops, by_d_k(ops, ex, c), ex(M), c), sink=c.sink))),
        Mistake(MASK_MISSING, carried(lambda ops, ex, c: ops.softmax(unmasked(ops, ex, c), sink=c.sink))),
        Mistake(_MASK_AFTER, carried(after)),
        Mistake(_COLUMNS, carried(columns)),
        Mistake(SINK_MISSING, carried(with_sink(lambda ops, ex, c: ops.softmax(ex(S_MASKED))))),
        Mistake(SINK_NUMERATOR, carried(with_sink(sink_in_numerator))),
    )


SINK_MISSING = ("the sink was left out: the weights were normalised over the keys alone, so each row sums to 1; "
                "with a learned sink Z_i has one more term e^(s − m_i)")
SINK_NUMERATOR = ("the sink was added to the numerator: each allowed weight got e^(s − m_i)/Z_i on top of its "
                  "own e^(Ŝ_ij − m_i)/Z_i; the sink's term belongs in Z_i only")


def sink_in_numerator(ops, ex, c):
    """Each allowed weight plus the row's sink weight, as a student who put e^{s − m_i} in every
    numerator gets it."""
    a = ops.softmax(ex(S_MASKED), sink=c.sink)
    allowed = ops.table([[1 if ok else 0 for ok in row] for row in c.p.mask.allowed])
    spread = ops.matmul(ops.sink_weight(a), ops.ones(1, c.p.n_k))
    return ops.hadamard(ops.sum([a, spread]), allowed)


def square_product(name: str, left: Callable, right: Callable, when: Callable = is_square) -> Mistake:
    def relation(ops, ex, c):
        a = left(ops, ex)
        return ops.matmul(a, right(ops, ex)) if when(ex) else None

    return Mistake(name, relation)


SCALE_MISSING_DQDK = "the scale factor is missing: dŜ was used instead of dS = scale·dŜ"


def rope_mistakes(key: str) -> tuple[Mistake, ...]:
    from_ = "q_pre" if key == Q_ROT else "k_pre"  # the queries (keys) RoPE turns: normalised first under QK-norm

    def swapped(ops, ex, c):
        from ..problem.rope import other

        return ops.rotate(ex(from_), *c.rotation(other(c.rope.pairing)))

    return (
        Mistake("the pairing is swapped: the other pairing's components were rotated together "
                "(half pairs i with i + d_k/2, interleaved 2i − 1 with 2i)", swapped),
        Mistake("rotated the wrong way (by −p·θ_i): the signs of the sines are swapped",
                lambda ops, ex, c: ops.rotate(ex(from_), *c.rotation(), sign=-1)),
        Mistake("positions counted from 1: the first token was rotated by θ_i, but RoPE counts positions from 0",
                lambda ops, ex, c: ops.rotate(ex(from_), *c.rotation(), offset=1)),
        Mistake("not rotated: the unrotated " + ("queries" if key == Q_ROT else "keys") + " were copied",
                lambda ops, ex, c: ex(from_)),
    )


def _rope_on_v(ops, ex, c: Context):
    """V with each row rotated as the keys are (None without RoPE, or when d_v is odd)."""
    if c.rope is None:
        return None
    v = ex(V)
    if (v.cols if hasattr(v, "cols") else len(v[0])) != c.d_k:
        return None
    return ops.rotate(v, *c.rotation())


_ROPE_ON_V = "the rotation was applied to V as well: RoPE rotates only the queries and the keys"
ROPE_V_MISTAKES = (Mistake(_ROPE_ON_V, _rope_on_v),)
ROPE_O_MISTAKES = (Mistake(_ROPE_ON_V, lambda ops, ex, c: None if _rope_on_v(ops, ex, c) is None
                           else ops.matmul(ex(A), _rope_on_v(ops, ex, c))),)
ROPE_SCORE_MISTAKES = (
    Mistake("the rotation was left out: Q·Kᵀ of the unrotated queries and keys",
            lambda ops, ex, c: None if c.rope is None else ops.matmul(ex("q_pre"), ops.T(ex("k_pre")))),
)


NO_RESCALE = ("forgotten rescale: the running sum and accumulator were updated without the factor "
              "e^(m_old − m_new) when the maximum grew")
BLOCK_MAX = "each block's own maximum instead of the running maximum over every block so far"


def output_without_rescale(ops, ex, c: Context):
    block = c.p.tiling.block
    return ops.tiled_output(ops.tiled_acc(ex(S_MASKED), ex(M_TILED), ex(V), block, rescale=False),
                            ops.tiled_sums(ex(S_MASKED), ex(M_TILED), block, rescale=False))


EVICTED = ("the cache kept every earlier key: a sink window keeps only the sink tokens and the last w "
           "keys, and the keys between them were evicted")
FUTURE_KEY = ("the cache row used a future key: the weights were normalised over every key, "
              "including keys after t, as if the row were unmasked")


def kept_every_key(ops, ex, c: Context):
    """The decoded output with every key 1..t in the cache, as a student who evicted nothing from a
    sink window's cache gets it; None when the window evicted nothing."""
    if c.p.mask.kind != "sink-window" or len(c.p.mask.cache_rows(c.t)) == c.t:
        return None
    weights = ops.softmax(ops.block(row_t(ops, ex(S_SCALED), c), 0, c.t), sink=c.sink)
    return ops.matmul(weights, ops.rows(ex(V), 0, c.t))


def future_weights(ops, ex, c: Context):
    """The decoded row's weights over all n keys (unmasked), as a student who used future keys gets
    them (under the causal mask, whose cache is keys 1..t: a sink window's is not a prefix)."""
    return ops.softmax(row_t(ops, ex(S_SCALED), c), sink=c.sink)
