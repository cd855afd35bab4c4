"""Which stages a worked solution writes exactly and which in certified decimals: the rules of
size and length, by the stage's place in the formula (see :func:`written`)."""

from __future__ import annotations

from .. import stages
from ..problem.model import CROSS_ENTROPY, Problem
from . import lazy as _lazy
from . import norms as _norms
from . import rotary as _rotary
from . import structures as _structures

# Gradient entries are sums of fractions over the rows' normalisers, and their size grows
# quickly with n: above this many scores (n_q·n_k) a worked solution shows them in decimals.
EXACT_LIMIT = 64
NORMED_FROM = stages.BY_KEY[stages.EMU].order  # a norm's first stage: the exactness rules below apply from it on
NORMED_MIXES_FROM = stages.BY_KEY[stages.O].order  # O = A·V: the stages from it on mix the normalised value rows
NORMED_EXACT_LIMIT = 16  # n_k · d_model up to which they are written exactly (a hand-sized problem)
NORMED_EXACT_CHARS = 24  # the longest exact entry (as text) a stage over normalised rows is written with
NORMED_STREAM_FROM = stages.BY_KEY[stages.H].order  # the residual stream and a norm behind it: sums over the Z_i
NORMED_STREAM_CHARS = 160  # the longest exact entry they are written with (a post norm's roots of such sums: none)
BLOCK_FROM = stages.BY_KEY[stages.MLP_MU].order  # the MLP and the model's head: sums over the Z_i, through more
BLOCK_EXACT_LIMIT = 64  # the most entries (of the stage, and of its widest input) they are written exactly at
HEAD_NORM_FROM = stages.BY_KEY[stages.O_MS].order  # differential attention's per-head norm (diff_transformer:)


def _rational_norm(p: Problem, values: dict) -> bool:
    """Whether the problem has no norm, or one whose normalised rows are rational (every root
    √(σ_i² + ε) rational, as in a hand exercise)."""
    return all(hat is not None and _norms.rational_rows_of(hat) for hat in
               (values.get(key) for key in stages.hat_keys(p)))


def _short_entries(value, chars: int = NORMED_EXACT_CHARS) -> bool:
    """Whether the corners and the middle entry of ``value`` are each at most ``chars`` long as text
    (a few entries built: the rest are like them); for the softmax, the exponents z_ij − m_i that
    its weights are written with, each over its row's Z_i."""
    if isinstance(value, _structures.Softmax):
        rows = value.rows
        return all(e is None or len(str(e)) <= chars
                   for row in (rows[0], rows[len(rows) // 2], rows[-1]) for e in row.exponents)
    m = _structures.matrix_of(value)
    rows, cols = m.rows, m.cols
    if rows == 0 or cols == 0:
        return True
    spots = {(0, 0), (0, cols - 1), (rows - 1, 0), (rows - 1, cols - 1), (rows // 2, cols // 2)}
    return all(len(str(m[i, j])) <= chars for i, j in spots)


def _block_written(p: Problem, result) -> bool:
    """Whether a stage of the MLP or the model's head is written exactly: rational, or hand-sized with
    short entries (each a sum over the softmax's Z_i through norms and activations: past a hand-sized
    problem far too long to print, shown in certified decimals)."""
    if _lazy.qq_entries(_structures.matrix_of(result)) is not None:
        return True
    rows, cols = _structures.shape_of(result)
    widths = [p.X.cols, p.mlp.d_ff if p.mlp is not None else 0, p.logits.size if p.logits is not None else 0]
    if rows * cols > BLOCK_EXACT_LIMIT or p.n_k * p.X.cols > NORMED_EXACT_LIMIT or max(widths) * rows > BLOCK_EXACT_LIMIT:
        return False
    return _short_entries(result, NORMED_STREAM_CHARS)


def _rational_column(m) -> bool:
    """Whether every entry of the n × 1 ``m`` is rational (its n entries built: a hand-sized stage)."""
    m = _structures.matrix_of(m)
    return _lazy.qq_entries(m) is not None or all(m[i, 0].is_Rational for i in range(m.rows))


def _head_norm_written(kind, result, c, values: dict) -> bool:
    """Whether a stage of differential attention's per-head norm is written exactly (its inputs are).

    Each mean square ms_i sums the squares of an output row: sums of the two maps' weights, each a
    fraction over its row's sum of exponentials Z_i. It is written when rational, or hand-sized and
    short. Each normalised row is then divided by √(ms_i + ε): written only when every ms_i is rational
    (past that, the root of such a sum, distributed over the row's terms, runs to hundreds of thousands
    of characters at three tokens, and every stage behind it is longer still)."""
    p = c.p
    if kind.key == stages.O_MS:
        if _lazy.qq_entries(_structures.matrix_of(result)) is not None:
            return True
        width = _structures.shape_of(values[stages.resolve(stages.O, c)[0]])[1]
        return p.n_k * width <= NORMED_EXACT_LIMIT and _short_entries(result, NORMED_STREAM_CHARS)
    ms = values[stages.resolve(stages.O_MS, c)[0]]
    return _rational_column(ms) and _short_entries(result, NORMED_STREAM_CHARS)


def written(kind, result, c, values: dict, ops, given: bool, inputs_shown: bool = True) -> bool:
    """Whether the stage ``kind`` of value ``result`` is written exactly (else in certified decimals);
    ``inputs_shown``: whether the stages it is computed from are (a stage of the block behind one
    shown in decimals is longer still, and is not built to find that out)."""
    p = c.p
    written = True
    if kind.gradient and p.backward.kind == CROSS_ENTROPY:
        # back from the cross-entropy every gradient is a sum over the softmaxes' Z_i, through the MLP:
        # written exactly when rational or hand-sized and short, as the block's forward stages are (and
        # not built to find out when an input is in decimals)
        written = inputs_shown and _block_written(p, result)
    elif kind.gradient:
        short = kind.short is not None and kind.short(ops, result, c)
        written = p.n_q * p.n_k <= EXACT_LIMIT or short
        if written and not short and not _rational_norm(p, values):
            # behind a norm whose roots are irrational every gradient holds them, under the softmax's
            # exponentials: entries far too long to print, shown as certified decimals
            written = False
    elif not given and kind.order >= BLOCK_FROM:
        written = inputs_shown and _block_written(p, result)
    elif not given:
        terms = _rotary.terms_of(result)  # RoPE's long sums of cosines and sines: decimals past a size
        written = terms is None or terms <= _rotary.EXACT_TERMS
        if written and stages.has_norm(p) and kind.order >= NORMED_FROM:
            if kind.order >= NORMED_MIXES_FROM:
                # an output mixes value rows that each carry their own root 1/√(σ_j² + ε): past a
                # hand-sized problem its entries are sums of n_k such rows times exponentials
                written = p.n_k * p.X.cols <= NORMED_EXACT_LIMIT
                if written and kind.order >= NORMED_STREAM_FROM:  # the stream adds X: longer still
                    written = _short_entries(result, NORMED_STREAM_CHARS)
            else:  # rows of real floats over their roots: long numbers, shown in decimals past a width
                written = _short_entries(result)
        if written and c.differential is not None and c.differential.paper is not None and kind.order >= HEAD_NORM_FROM:
            # the per-head norm, and what reads it (concat, the projection, the residual stream)
            written = inputs_shown and (kind.key not in (stages.O_MS, stages.O_SUBLN)
                                        or _head_norm_written(kind, result, c, values))
    return written
