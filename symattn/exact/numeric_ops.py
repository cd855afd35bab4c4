"""The relations' operations at high precision (see :class:`symattn.exact.ops.Ops`): a value is a
list of rows of mpmath numbers (−∞ for masked positions) or a rational matrix, which products
read exactly (into arb). Also the operations only the common mistakes use."""

from __future__ import annotations

import mpmath
import sympy

from ..numbers.matrices import is_rational
from . import block as _block
from . import tiled as _tiled
from .arb import mp_matmul
from .evaluation import evaluate, to_mpf
from .ops import Ops, Undefined
from .softmax import softmax_backward

NINF = mpmath.ninf
Values = list[list[mpmath.mpf]]


class NumericOps(Ops):
    """The relations' operations at ``dps`` digits. A value is a list of rows of mpmath numbers
    (−∞ for masked positions) or a rational matrix, which products read exactly (into arb)."""

    def __init__(self, dps: int, subs=None) -> None:
        self.dps = dps
        self.subs = subs

    def grid(self, x) -> Values:
        return x if isinstance(x, list) else evaluate(x, self.dps, self.subs)

    def matmul(self, a, b) -> Values:
        return mp_matmul(a, b, self.dps)

    def T(self, a):
        return [list(col) for col in zip(*a)] if isinstance(a, list) else a.T

    def add_row(self, m, row) -> Values:
        m, row = self.grid(m), self.grid(row)
        with mpmath.workdps(self.dps + 10):
            return [[x + b for x, b in zip(r, row[0])] for r in m]

    def col_sums(self, m) -> Values:
        with mpmath.workdps(self.dps + 10):
            return [[mpmath.fsum(col) for col in zip(*self.grid(m))]]

    def scale(self, a, factor) -> Values:
        a = self.grid(a)
        with mpmath.workdps(self.dps + 10):
            f = to_mpf(factor, self.dps, self.subs)
            return [[x * f for x in row] for row in a]

    def mask(self, allowed, bias) -> Values:
        b = None if bias is None else evaluate(bias, self.dps, self.subs)
        return [[(b[i][j] if b is not None else mpmath.mpf(0)) if ok else NINF for j, ok in enumerate(row)]
                for i, row in enumerate(allowed)]

    def add_mask(self, scores, mask) -> Values:
        scores, mask = self.grid(scores), self.grid(mask)
        with mpmath.workdps(self.dps + 10):
            return [[NINF if b == NINF else a + b for a, b in zip(r1, r2)] for r1, r2 in zip(scores, mask)]

    def softmax(self, z, sink=None) -> Values:
        """Row by row, the maximum subtracted; a row with nothing allowed has no softmax. A learned
        ``sink`` logit s adds e^{s − m} to each row's sum (m the maximum over the row and s)."""
        with mpmath.workdps(self.dps + 10):
            s = None if sink is None else to_mpf(sink, self.dps, self.subs)
            out = []
            for row in self.grid(z):
                finite = [v for v in row if v != NINF]
                if not finite:
                    raise Undefined("a row of scores with every key masked has no softmax")
                m = max(finite + ([s] if s is not None else []))
                e = [mpmath.mpf(0) if v == NINF else mpmath.exp(v - m) for v in row]
                total = mpmath.fsum(e + ([mpmath.exp(s - m)] if s is not None else []))
                out.append([x / total for x in e])
            return out

    def sink_weight(self, a) -> Values:
        """``1 − Σ_j a_ij`` of each row, in a column."""
        with mpmath.workdps(self.dps + 10):
            return [[1 - mpmath.fsum(row)] for row in self.grid(a)]

    def softmax_backward(self, a, dA) -> Values:
        return softmax_backward(self.grid(a), self.grid(dA), self.dps)

    def hstack(self, parts) -> Values:
        blocks = [self.grid(p) for p in parts]
        return [sum((block[i] for block in blocks), []) for i in range(len(blocks[0]))]

    def vstack(self, parts) -> Values:
        return [list(row) for p in parts for row in self.grid(p)]

    def softcap(self, a, cap) -> Values:
        a = self.grid(a)
        with mpmath.workdps(self.dps + 10):
            c = to_mpf(cap, self.dps, self.subs)
            return [[c * mpmath.tanh(x / c) for x in row] for row in a]

    def block(self, m, first: int, width: int) -> Values:
        return [row[first:first + width] for row in self.grid(m)]

    def sum(self, parts) -> Values:
        total = None
        for part in map(self.grid, parts):  # gradients, or given exact matrices (X + PE)
            with mpmath.workdps(self.dps + 10):
                total = part if total is None else [[x + y for x, y in zip(r, s)] for r, s in zip(total, part)]
        return total

    def rows(self, m, first: int, count: int) -> Values:
        return self.grid(m)[first:first + count]

    def table(self, rows: list[list[int]]) -> Values:
        return [[mpmath.mpf(x) for x in row] for row in rows]

    def sub(self, a, b) -> Values:
        a, b = self.grid(a), self.grid(b)
        with mpmath.workdps(self.dps + 10):
            return [[x - y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]

    def difference(self, a, b) -> Values:
        return self.sub(a, b)

    def ones(self, rows: int, cols: int) -> Values:
        return [[mpmath.mpf(1)] * cols for _ in range(rows)]

    def given(self, m) -> Values:
        return evaluate(m, self.dps, self.subs)

    def is_rational(self, x) -> bool:
        return not isinstance(x, list) and is_rational(x)

    def rational(self, p: int, q: int) -> sympy.Rational:
        return sympy.Rational(p, q)

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0) -> Values:
        """RoPE at ``dps`` digits: row ``p`` with each pair turned by ``sign·(p + offset)·θ_i``."""
        rows = self.grid(m)
        with mpmath.workdps(self.dps + 10):
            angles = [to_mpf(t, self.dps + 10) for t in thetas]
            out = []
            for p, row in enumerate(rows):
                new = list(row)
                for (a, b), theta in zip(pairs, angles):
                    phi = sign * (p + offset) * theta
                    c, s = mpmath.cos(phi), mpmath.sin(phi)
                    new[a], new[b] = row[a] * c - row[b] * s, row[a] * s + row[b] * c
                out.append(new)
            return out

    def row_mean(self, m) -> Values:
        with mpmath.workdps(self.dps + 10):
            return [[mpmath.fsum(row) / len(row)] for row in self.grid(m)]

    def row_spread(self, m, mu, ddof: int = 0) -> Values:
        m = self.grid(m)
        centres = [r[0] for r in self.grid(mu)] if mu is not None else [0] * len(m)
        with mpmath.workdps(self.dps + 10):
            return [[mpmath.fsum((x - c) ** 2 for x in row) / (len(row) - ddof)] for row, c in zip(m, centres)]

    def normalise(self, m, mu, spread, eps, inside: bool = True) -> Values:
        m, spread = self.grid(m), self.grid(spread)
        centres = [r[0] for r in self.grid(mu)] if mu is not None else [0] * len(m)
        with mpmath.workdps(self.dps + 10):
            e = to_mpf(eps, self.dps + 10)
            out = []
            for row, c, (s,) in zip(m, centres, spread):
                root = mpmath.sqrt(s + e) if inside else mpmath.sqrt(s) + e
                if root == 0:
                    raise Undefined("a row with no spread and ε = 0 has no norm")
                out.append([(x - c) / root for x in row])
            return out

    def times_row(self, m, row) -> Values:
        m, row = self.grid(m), self.grid(row)
        with mpmath.workdps(self.dps + 10):
            return [[x * g for x, g in zip(r, row[0])] for r in m]

    def hadamard(self, a, b) -> Values:
        a, b = self.grid(a), self.grid(b)
        with mpmath.workdps(self.dps + 10):
            return [[x * y for x, y in zip(r, s)] for r, s in zip(a, b)]

    def normalise_backward(self, d, hat, spread, eps, centred: bool) -> Values:
        d, hat, spread = self.grid(d), self.grid(hat), self.grid(spread)
        with mpmath.workdps(self.dps + 10):
            e = to_mpf(eps, self.dps + 10)
            out = []
            for g, h, (s,) in zip(d, hat, spread):
                first = mpmath.fsum(g) / len(g) if centred else 0
                second = mpmath.fsum(x * y for x, y in zip(g, h)) / len(g)
                root = mpmath.sqrt(s + e)
                out.append([(x - first - y * second) / root for x, y in zip(g, h)])
            return out

    def activate(self, m, name: str) -> Values:
        balls = _block.arb_activated(self.grid(m), name, self.dps)
        if balls is not None:
            return balls
        f = _block.NUMERIC[name]
        with mpmath.workdps(self.dps + 10):
            return [[f(x) for x in row] for row in self.grid(m)]

    def row_softmax(self, z) -> Values:
        return _block.numeric_row_softmax(self.grid(z), self.dps)

    def nll(self, z, targets, rows, base=None) -> Values:
        return _block.numeric_nll(self.grid(z), targets, rows, self.dps, base)

    def column_softmax(self, z) -> Values:
        """The softmax of each column (over the wrong axis: a slip)."""
        return self.T(self.softmax(self.T(self.grid(z))))

    def divide_rows(self, m, d) -> Values:
        m, d = self.grid(m), self.grid(d)
        with mpmath.workdps(self.dps + 10):
            if any(row[0] == 0 for row in d):
                raise Undefined("a normaliser of 0 has nothing to divide by")
            return [[x / z[0] for x in row] for row, z in zip(m, d)]

    def tiled_max(self, z, block: int, running: bool = True) -> Values:
        return _tiled.numeric_maxima(self.grid(z), block, running)

    def tiled_sums(self, z, m, block: int, rescale: bool = True) -> Values:
        return _tiled.numeric_rows(self.grid(z), self.grid(m), None, block, self.dps, rescale)[0]

    def tiled_acc(self, z, m, v, block: int, rescale: bool = True) -> Values:
        return _tiled.numeric_rows(self.grid(z), self.grid(m), self.grid(v), block, self.dps, rescale)[1]

    def tiled_output(self, acc, sums) -> Values:
        acc, sums = self.grid(acc), self.grid(sums)
        with mpmath.workdps(self.dps + 10):
            return [[x / s[-1] for x in row] for row, s in zip(acc, sums)]

    # -- for the common mistakes -----------------------------------------------------------

    def jacobian_diagonal(self, a, dA) -> Values:
        """``a_ij (1 − a_ij) dA_ij``: the softmax Jacobian's diagonal alone."""
        with mpmath.workdps(self.dps + 10):
            return [[x * (1 - x) * g for x, g in zip(ra, rg)] for ra, rg in zip(self.grid(a), self.grid(dA))]

    def zero_masked(self, a, mask) -> Values:
        """The weights with the masked positions set to 0 (and the rows not renormalised)."""
        return [[mpmath.mpf(0) if m == NINF else x for x, m in zip(r, mr)] for r, mr in zip(self.grid(a), self.grid(mask))]

    def columns_attend(self, z) -> bool:
        """Whether every column has an allowed entry (so a softmax over columns exists)."""
        return all(any(v != NINF for v in col) for col in zip(*self.grid(z)))
