"""A problem with one more pass to derive: the backward pass, FlashAttention's online softmax
over blocks of keys, or decoding one token from the KV cache.

>>> import symattn
>>> p = symattn.load_problem("Q: [[0, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[2], [4]]\\n")
>>> symattn.with_backward(p, {"weights": [["1/2"]]}).backward.matrix
Matrix([[1/2]])
>>> symattn.with_tiling(p, 1).tiling
Tiling(block=1, rows=None)

Each returns a new :class:`~symattn.problem.model.Problem` (problems are frozen); the command line's
``--backward``, ``--tiled B`` and ``--decode T`` are these calls.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import sympy

from ..errors import SymattnError
from ..numbers.parse import NumberError, check_size, parse_number
from ..text import excerpt, shown
from .masks import Mask
from .scores import score_change_refusal
from .model import CROSS_ENTROPY, SUM_LOSS, Backward, block_backward_refusal, Matrix, Problem, Tiling
from .places import entry_field, row_field

__all__ = ["decode_problem", "with_backward", "with_decode", "with_tiling"]

_LOSSES = "sum, {'weights': rows}, {'target': rows} or 'cross-entropy'"


def with_backward(problem: Problem, loss=None) -> Problem:
    """``problem`` with its backward pass derived too, from the loss ``loss``.

    ``loss`` is what a problem file's ``backward: {loss: ...}`` takes: ``"sum"`` (L = Σ O),
    ``{"weights": rows}`` (L = Σ W ∘ O) or ``{"target": rows}`` (L = ½‖O − T‖²), with one entry
    per output entry, each an int, a :class:`fractions.Fraction`, an exact SymPy number or a
    string as in a problem file (``"1/2"``, ``"0.25"``, ``"exp(2)"``). None (``--backward``) keeps
    the problem's own ``backward:`` section, else takes the problem's cross-entropy (``loss:``) when
    it has one, else L = Σ O; ``"cross-entropy"`` goes back from the cross-entropy of the logits.
    """
    if getattr(problem, "mla", None) is not None:
        raise SymattnError("the backward pass of multi-head latent attention is not derived (a problem with mla:)",
                           file=problem.source, field="backward")
    if getattr(problem, "linear", None) is not None:
        raise SymattnError("the backward pass of linear attention is not derived (a problem with linear:)",
                           file=problem.source, field="backward")
    if getattr(problem, "differential", None) is not None:
        raise SymattnError("the backward pass of differential attention is not derived (a problem with differential:)",
                           file=problem.source, field="backward")
    if loss is None:
        if problem.backward is not None:
            return problem
        # a problem with its own cross-entropy goes back from it; an MLP or logits without one is refused
        loss = CROSS_ENTROPY if problem.loss is not None or problem.mlp is not None or problem.logits is not None \
            else "sum"
    if problem.sinks is not None:
        raise SymattnError("the backward pass with learned sinks is not supported yet; remove sink or --backward",
                           file=problem.source, field="--backward")
    _score_changes(problem, "backward", "backward")
    backward = _loss(problem, loss)
    refusal = block_backward_refusal(backward, problem.mlp, problem.logits, problem.loss)
    if refusal:
        raise SymattnError(refusal, file=problem.source, field="backward")
    return dataclasses.replace(problem, backward=backward)


def with_tiling(problem: Problem, block: int) -> Problem:
    """``problem`` with the online softmax over blocks of ``block`` keys (``--tiled B``); the rows
    its ``tiling:`` section works block by block are kept."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise SymattnError(f"the block must be a whole number of keys, 1 or more, not {shown(block)}",
                           field="--tiled")
    if problem.sinks is not None:
        raise SymattnError("the tiled softmax with learned sinks is not supported yet; remove sink or --tiled",
                           file=problem.source, field="--tiled")
    if problem.symbols:
        raise SymattnError("the tiled softmax needs numbers: the running maximum of scores with symbols cannot be "
                           "decided; remove symbols or --tiled", file=problem.source, field="--tiled")
    if getattr(problem, "mla", None) is not None:
        raise SymattnError("the tiled softmax is not derived with mla (a problem with mla:)", file=problem.source,
                           field="--tiled")
    if getattr(problem, "linear", None) is not None:
        raise SymattnError("the tiled (online) softmax is the softmax's: linear attention has none to tile, and "
                           "shows its own recurrent form", file=problem.source, field="--tiled")
    if getattr(problem, "differential", None) is not None:
        raise SymattnError("the tiled (online) softmax of two maps and their difference is not derived (a problem "
                           "with differential:)", file=problem.source, field="--tiled")
    _score_changes(problem, "tiling", "--tiled")
    rows = problem.tiling.rows if problem.tiling is not None else None
    return dataclasses.replace(problem, tiling=Tiling(block, rows))


def _score_changes(problem: Problem, passing: str, field: str) -> None:
    """Refuse the pass ``passing`` (backward, tiling, decode) on a problem with soft-capping or a temperature."""
    for name in ("softcap", "temperature"):
        if getattr(problem, name) is not None:
            raise SymattnError(score_change_refusal(name, **{passing: True}), file=problem.source, field=field)



def decode_problem(t: int, n: int, mask: Mask, cross: bool, bias: bool) -> str | None:
    """What is wrong with decoding token ``t`` (1-based) of ``n``, or None."""
    if cross:
        return ("decoding from a KV cache is for causal self-attention; this problem is cross-attention "
                "(context), whose keys do not grow one token at a time")
    if mask.kind not in ("causal", "sink-window"):
        return (f"decoding from a KV cache needs the causal mask (mask: causal); this problem's mask is "
                f"{mask.kind}, so token {t}'s row would not be the cache's row (a cache that keeps sink tokens "
                "and a window is mask: {sink: k, window: w})")
    if bias:
        return "decoding with a bias is not supported; remove bias or decode"
    if not 1 <= t <= n:
        return f"token {t} is out of range: there are {n} tokens, so give a token number from 1 to {n}"
    return None


def with_decode(problem: Problem, t: int) -> Problem:
    """``problem`` decoding token ``t`` (``--decode t``), checked as the ``decode`` field is."""
    if isinstance(t, bool) or not isinstance(t, int):
        raise SymattnError(f"the token to decode is a whole number from 1, not {excerpt(repr(t))}",
                           file=problem.source, field="--decode")
    if getattr(problem, "mla", None) is not None:
        raise SymattnError("decoding from mla's latent cache is not derived yet (its cache per token is shown in "
                           "every mla solution): drop --decode", file=problem.source, field="--decode")
    if getattr(problem, "linear", None) is not None:
        raise SymattnError("linear attention decodes from its constant-size state, which its solution shows step "
                           "by step: drop --decode", file=problem.source, field="--decode")
    if getattr(problem, "differential", None) is not None:
        raise SymattnError("decoding from the KV cache with two maps is not derived (a problem with differential:)",
                           file=problem.source, field="--decode")
    _score_changes(problem, "decode", "--decode")
    wrong = decode_problem(t, problem.n_q, problem.mask, problem.context is not None, problem.bias is not None)
    if wrong:
        raise SymattnError(wrong, file=problem.source, field="--decode")
    return dataclasses.replace(problem, decode=t)

def _loss(problem: Problem, loss) -> Backward:
    """The :class:`Backward` of a ``loss`` given in Python, checked as ``backward: {loss: ...}`` is."""
    if isinstance(loss, str):
        if loss == "sum":
            return SUM_LOSS
        if loss == CROSS_ENTROPY:
            return Backward(CROSS_ENTROPY)
        raise SymattnError(f"unknown loss {excerpt(loss)}; give {_LOSSES}", field="loss")
    if not isinstance(loss, dict) or len(loss) != 1:
        raise SymattnError(f"the loss is {_LOSSES}, not {shown(loss)}", field="loss")
    ((kind, rows),) = loss.items()
    if kind not in ("weights", "target"):
        raise SymattnError(f"unknown loss {shown(kind)}; give {_LOSSES}", field="loss")
    return Backward(kind, _output_matrix(problem, rows, f"loss.{kind}"))


def _output_matrix(problem: Problem, rows, name: str) -> Matrix:
    """``rows`` as an exact matrix of the output's shape (sizes checked before any entry is read)."""
    n_q, d_out = problem.n_q, problem.d_out
    shape = f"the output O is {n_q}×{d_out}: it needs one entry per output entry"
    if not isinstance(rows, (list, tuple)) or len(rows) != n_q:
        count = _count(len(rows), "row") if isinstance(rows, (list, tuple)) else shown(rows)
        raise SymattnError(f"{count} given, but {shape}: a list of {_count(n_q, 'row')}", field=name)
    symbols = {s.name: s for s in problem.symbols}
    values = []
    for i, row in enumerate(rows):
        if not isinstance(row, (list, tuple)) or len(row) != d_out:
            count = _count(len(row), "entry") if isinstance(row, (list, tuple)) else shown(row)
            raise SymattnError(f"{count} given, but {shape}", field=row_field(name, i))
        values.append([_number(x, symbols, entry_field(name, i, j)) for j, x in enumerate(row)])
    return Matrix(values)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"


def _number(x, symbols: dict, field: str) -> sympy.Expr:
    """One exact entry: an int, a Fraction, an exact SymPy number or a problem file's text."""
    if isinstance(x, bool) or isinstance(x, float) or isinstance(x, sympy.Float):
        what = "a boolean" if isinstance(x, bool) else "a binary float, which is not exact"
        raise SymattnError(f"{shown(x)} is {what}; give an int, a Fraction or the number as text such as "
                           "'0.1' or '1/3'", field=field)
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, Fraction):
        return sympy.Rational(x.numerator, x.denominator)
    if isinstance(x, str):
        try:
            return check_size(x, parse_number(x, symbols=symbols))
        except NumberError as exc:
            raise SymattnError(str(exc), field=field) from None
    if isinstance(x, sympy.Expr) and not x.has(sympy.Float) and x.is_finite is not False \
            and x.free_symbols <= set(symbols.values()):
        return x
    raise SymattnError(f"{shown(x)} is not a number; give an int, a Fraction or the number as text",
                       field=field)
