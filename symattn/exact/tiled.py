"""FlashAttention's online (tiled) softmax: one pass over the keys, block by block.

For one query row with masked scores ``s_1 … s_n`` and the keys in blocks of ``B``, the pass
keeps a running maximum ``m``, a running sum ``ℓ`` and an accumulator ``acc`` (a row of width
d_v), starting from ``m⁽⁰⁾ = −∞``, ``ℓ⁽⁰⁾ = 0``, ``acc⁽⁰⁾ = 0``:

    m⁽ᵇ⁾   = max(m⁽ᵇ⁻¹⁾, max_{j∈b} s_j)
    ℓ⁽ᵇ⁾   = e^{m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾} ℓ⁽ᵇ⁻¹⁾ + Σ_{j∈b} e^{s_j − m⁽ᵇ⁾}
    acc⁽ᵇ⁾ = e^{m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾} acc⁽ᵇ⁻¹⁾ + Σ_{j∈b} e^{s_j − m⁽ᵇ⁾} v_j

and the output row is ``acc⁽ᴺ⁾ / ℓ⁽ᴺ⁾``. A masked key (−∞) adds exactly 0; while the running
maximum is still −∞ (every key so far masked) nothing has been added, and the factor
``e^{−∞ − m}`` is 0 as a limit.

:func:`exact_rows` runs it exactly (SymPy: the e^{…} terms collected, never rounded), and
:func:`numeric_rows` at high precision with mpmath, also from given maxima (a student's own,
for follow-through marking) and without the rescaling (the common mistake).
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import sympy

from ..numbers.matrices import NEG_INF, tidy
from .evaluation import row_max

NINF = mpmath.ninf


def blocks(n_k: int, block: int) -> list[range]:
    """The key positions (0-based) of each block."""
    return [range(start, min(start + block, n_k)) for start in range(0, n_k, block)]


@dataclass(frozen=True)
class TileStep:
    """One block of one row: its keys (0-based), the block's own maximum (−∞ when all masked), the
    running maximum before and after, the rescale factor ``e^{m_prev − m}`` (0 while ``m_prev`` is
    −∞; None while ``m`` is still −∞: nothing to rescale), the block's terms ``e^{s_j − m}`` (0 for
    a masked key), and the running sum and accumulator after the block."""

    keys: range
    block_max: sympy.Expr
    m_prev: sympy.Expr
    m: sympy.Expr
    factor: sympy.Expr | None
    terms: tuple[sympy.Expr, ...]
    l: sympy.Expr
    acc: tuple[sympy.Expr, ...]

    @property
    def rescaled(self) -> bool:
        """Whether the maximum changed after something had been summed (the factor is not 0 or 1)."""
        return self.factor is not None and self.factor not in (0, 1)


@dataclass(frozen=True)
class TiledRow:
    """The pass over one query row, block by block."""

    steps: tuple[TileStep, ...]

    @property
    def maxima(self) -> list[sympy.Expr]:
        return [t.m for t in self.steps]

    @property
    def sums(self) -> list[sympy.Expr]:
        return [t.l for t in self.steps]

    @property
    def output(self) -> tuple[sympy.Expr, ...]:
        last = self.steps[-1]
        return tuple(a / last.l for a in last.acc)


def _maximum(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    return row_max([a, b])


def exact_row(scores: list[sympy.Expr], values, block: int) -> TiledRow:
    """The pass over one row exactly: ``scores`` the row's masked scores (−∞ where masked),
    ``values`` the value matrix (n_k × d_v, indexable ``values[j, c]``)."""
    d_v = values.cols
    m_prev, l_prev, acc_prev = NEG_INF, sympy.Integer(0), (sympy.Integer(0),) * d_v
    steps = []
    for keys in blocks(len(scores), block):
        allowed = [scores[j] for j in keys if scores[j] != NEG_INF]
        block_max = row_max(allowed) if allowed else NEG_INF
        m = _maximum(m_prev, block_max)
        if m == NEG_INF:  # every key so far masked: nothing summed yet
            steps.append(TileStep(keys, block_max, m_prev, m, None, (sympy.Integer(0),) * len(keys), l_prev, acc_prev))
            continue
        factor = sympy.Integer(0) if m_prev == NEG_INF else sympy.exp(tidy(m_prev - m))
        terms = tuple(sympy.Integer(0) if scores[j] == NEG_INF else sympy.exp(tidy(scores[j] - m)) for j in keys)
        l = tidy(factor * l_prev + sympy.Add(*terms))
        acc = tuple(tidy(factor * acc_prev[c] + sympy.Add(*[t * values[j, c] for t, j in zip(terms, keys) if t != 0]))
                    for c in range(d_v))
        steps.append(TileStep(keys, block_max, m_prev, m, factor, terms, l, acc))
        m_prev, l_prev, acc_prev = m, l, acc
    return TiledRow(tuple(steps))


def exact_maxima(masked, block: int) -> list[list[sympy.Expr]]:
    """The running maximum of each row after each block, exactly (−∞ while every key so far is masked)."""
    out = []
    for i in range(masked.rows):
        m, maxima = NEG_INF, []
        for keys in blocks(masked.cols, block):
            allowed = [masked[i, j] for j in keys if masked[i, j] != NEG_INF]
            m = _maximum(m, row_max(allowed) if allowed else NEG_INF)
            maxima.append(m)
        out.append(maxima)
    return out


def exact_rows(masked, values, block: int) -> list[TiledRow]:
    """:func:`exact_row` for every row of the masked scores."""
    return [exact_row([masked[i, j] for j in range(masked.cols)], values, block) for i in range(masked.rows)]


def exact_difference(row: TiledRow, normaliser: sympy.Expr, numerators: list[sympy.Expr]) -> list[sympy.Expr]:
    """``acc_c/ℓ − N_c/Z`` for each column c, simplified exactly: the numerator of the difference,
    ``acc_c·Z − N_c·ℓ``, expanded (the exponentials multiply out as e^a·e^b = e^{a+b})."""
    last = row.steps[-1]
    return [sympy.simplify(tidy(a * normaliser - n * last.l)) for a, n in zip(last.acc, numerators)]


# -- at high precision (mpmath), for the relations' numeric side and for marking ----------------


def numeric_maxima(scores: list[list[mpmath.mpf]], block: int, running: bool = True) -> list[list[mpmath.mpf]]:
    """The running maximum after each block (``running=False``: each block's own maximum)."""
    out = []
    for row in scores:
        m, maxima = NINF, []
        for keys in blocks(len(row), block):
            own = max((row[j] for j in keys), default=NINF)
            m = max(m, own) if running else own
            maxima.append(m)
        out.append(maxima)
    return out


def numeric_rows(scores, maxima, values, block: int, dps: int, rescale: bool = True):
    """``(sums, accumulators)``: ℓ after each block and the final accumulator of each row, from the
    given running maxima (which need not be right: a student's own). ``values`` None: sums only.
    ``rescale=False`` leaves out the factor e^{m_prev − m} (the common mistake)."""
    sums, accs = [], []
    with mpmath.workdps(dps + 10):
        for i, row in enumerate(scores):
            d_v = len(values[0]) if values is not None else 0
            m_prev, l, acc = NINF, mpmath.mpf(0), [mpmath.mpf(0)] * d_v
            row_sums = []
            for b, keys in enumerate(blocks(len(row), block)):
                m = maxima[i][b]
                if m == NINF:
                    row_sums.append(l)
                    continue
                if m_prev == NINF:
                    factor = mpmath.mpf(0)
                else:
                    factor = mpmath.exp(m_prev - m) if rescale else mpmath.mpf(1)
                terms = [(j, mpmath.mpf(0) if row[j] == NINF else mpmath.exp(row[j] - m)) for j in keys]
                l = factor * l + mpmath.fsum(t for _, t in terms)
                acc = [factor * acc[c] + mpmath.fsum(t * values[j][c] for j, t in terms) for c in range(d_v)]
                row_sums.append(l)
                m_prev = m
            sums.append(row_sums)
            accs.append(acc)
    return sums, accs
