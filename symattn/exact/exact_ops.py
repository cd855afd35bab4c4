"""The relations' operations on exact values (see :class:`symattn.exact.ops.Ops`): SymPy and flint
matrices, and the softmax kept as structure (:mod:`symattn.exact.structures`)."""

from __future__ import annotations

import functools

import sympy
from sympy import QQ

from ..numbers.matrices import Matrix, is_rational, rational_matrix, tidy
from . import block as _block
from . import linear as _linear
from . import norms as _norms
from . import products as _products
from . import rotary as _rotary
from . import tiled as _tiled
from .lazy import LazyMatrix, rational_rows
from .masks import add_mask, mask_matrix
from .ops import Ops
from .softmax import softmax_rows
from .structures import (
    STRUCTURES,
    OverRows,
    OverZ2,
    Output,
    ScoresT,
    Softmax,
    WeightsT,
    gathered,
    matrix_of,
    over_rows,
    shape_of,
)


def _over(x) -> bool:
    """Whether ``x`` is a gradient over the rows' ``Z_i`` whose form an operation can carry on."""
    return isinstance(x, OverZ2) or isinstance(x, OverRows) and x.plain is None


def _stacked(parts):
    """``parts`` one above the other; rows of softmax weights stay structure (e^{s − m_i}/Z_i)."""
    if all(isinstance(p, Softmax) for p in parts):
        return Softmax(tuple(row for p in parts for row in p.rows))
    return _products.vstack([matrix_of(p) for p in parts])


def _weights_times(a, factor: sympy.Expr) -> LazyMatrix:
    """A map's weights (or their row sums) times a number, differential attention's λ·A_2: each entry
    kept as written, not expanded, so A_1 − λ·A_2 of two equal rows collects to (1 − λ)·A_1."""
    m = matrix_of(a)
    return LazyMatrix(m.rows, m.cols, lambda i, j: factor * m[i, j])


class ExactOps(Ops):
    """The relations' operations on exact values: a forward product expanded (``expand``), a gradient's kept."""

    def __init__(self, expand: bool = True) -> None:
        self.expand = expand

    def matmul(self, a, b):
        if not self.expand:  # a gradient's product: normalised rows with rational roots are rational rows
            a, b = _norms.as_rational(a), _norms.as_rational(b)
        if isinstance(a, Softmax):
            return Output(a.rows, b)
        if isinstance(a, OverZ2) and a.keyed:
            return self._over_z2_times(a, b)
        if isinstance(a, WeightsT) and not isinstance(b, STRUCTURES):
            return self._weights_t_times(a, b)
        if isinstance(a, ScoresT) and not isinstance(b, STRUCTURES):
            return self._scores_t_times(a, b)
        if _over(b) and is_rational(a):
            return self._timesover_rows(a, over_rows(b))
        if _over(a) and is_rational(b):
            return self._over_rows_times(over_rows(a), b)
        a, b = matrix_of(a), matrix_of(b)
        rotary = _rotary.scores(a, b)  # Q_rot·K_rotᵀ: kept as structure
        if rotary is not None:
            return rotary
        if isinstance(a, _norms.RowScaled) and is_rational(b):  # a normalised X times the weights
            return a.times(b)
        normed = _norms.scores(a, b)  # Q·Kᵀ of normalised rows: four rational products
        if normed is not None:
            return normed
        return _products.matmul(a, b) if self.expand else _products.product(a, b)

    @staticmethod
    def _weights_t_times(a: WeightsT, b) -> OverRows:
        """``Aᵀ·b``: entry (k, c) = Σ_i a_ik b_ic, each term ``e^{z_ik − m_i} b_ic / Z_i``."""
        rows = a.rows

        def tops(k: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            return [(i, 1, row.terms[k] * b[i, c]) for i, row in enumerate(rows)
                    if row.raw[k] is not None and b[i, c] != 0]

        return OverRows(rows, tops, _products.product(a.lazy, b))

    @staticmethod
    def _scores_t_times(a: ScoresT, b) -> OverRows:
        """``dSᵀ·b``: entry (k, c) = Σ_i dS_ik b_ic, each term over ``Z_i²``."""
        g = a.of

        def tops(k: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            return _column_tops(g, k, c, b)

        return OverRows(g.rows, tops, _products.product(a.lazy, b), operands=(a, b))

    @staticmethod
    def _over_rows_times(a: OverRows, b) -> OverRows:
        """``a·b`` for rational ``b``: each row's terms gather over the same power of ``Z_i``."""
        def tops(k: int, d: int) -> list[tuple[int, int, sympy.Expr]]:
            terms = []
            for c in range(b.rows):
                y = b[c, d]
                if y != 0:
                    terms += [(i, power, top * y) for i, power, top in a.tops(k, c)]
            return gathered(terms)

        return OverRows(a.rows, tops, _products.product(a.lazy, b))

    @staticmethod
    def _timesover_rows(a, b: OverRows) -> OverRows:
        """``a·b`` for rational ``a``: row i's terms gather over the same ``Z_i``."""
        def tops(d: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
            terms = []
            for k in range(a.cols):
                x = a[d, k]
                if x != 0:
                    terms += [(i, power, x * top) for i, power, top in b.tops(k, c)]
            return gathered(terms)

        return OverRows(b.rows, tops, _products.product(a, b.lazy))

    @staticmethod
    def _over_z2_times(a: OverZ2, b: Matrix) -> OverZ2:
        """Row i of ``a`` shares the denominator ``Z_i²``, so each entry of ``a·b`` is one fraction."""
        rows = a.rows

        def base(i: int, c: int) -> sympy.Expr:
            return sympy.expand(sympy.Add(*[a.base(i, j) * b[j, c] for j in range(b.rows) if rows[i].raw[j] is not None]))

        def entry(i: int, c: int) -> sympy.Expr:
            x = base(i, c)
            top = x if a.factor is None else tidy(a.factor * x)
            return top if top == 0 else top / rows[i].normaliser ** 2

        return OverZ2(rows, base, LazyMatrix(len(rows), b.cols, entry), a.factor, keyed=False, operands=(a, b))

    def add_row(self, m, row):
        """``m`` with the 1 × cols ``row`` added to every row (a projection's bias)."""
        if isinstance(m, _norms.RowScaled) and is_rational(row):
            return m.plus_row(row)
        return _products.add_row(matrix_of(m), matrix_of(row))

    def row_mean(self, m):
        return _norms.row_mean(matrix_of(m))

    def row_spread(self, m, mu, ddof: int = 0):
        return _norms.row_spread(matrix_of(m), None if mu is None else matrix_of(mu), ddof)

    def normalise(self, m, mu, spread, eps, inside: bool = True):
        return _norms.normalise(matrix_of(m), None if mu is None else matrix_of(mu), matrix_of(spread), eps, inside)

    def times_row(self, m, row):
        if _over(m) and is_rational(row):  # dX̂ = dX_norm ∘ γ: a product by diag(γ)
            g = rational_rows(row)[0]
            cols = len(g)
            diagonal = rational_matrix(cols, cols, [g[j] if j == k else QQ(0) for j in range(cols) for k in range(cols)])
            return self._over_rows_times(over_rows(m), diagonal)
        return _norms.times_row(matrix_of(m), matrix_of(row))

    def hadamard(self, a, b):
        return _over_hadamard(a, b)

    def normalise_backward(self, d, hat, spread, eps, centred: bool):
        return _over_normalise_backward(d, hat, spread, eps, centred)

    def col_sums(self, m):
        """``1ᵀ m``, the 1 × cols sums of the columns (a bias's gradient). A sum over the softmax
        rows keeps its form, and each entry is built from its gathered terms, so a sum that
        cancels (the key bias's gradient) is exactly 0."""
        total = self.matmul(self.ones(1, shape_of(m)[0]), m)
        if not isinstance(total, OverRows):
            return total

        def entry(k: int, c: int) -> sympy.Expr:
            return sympy.Add(*[top / total.rows[i].normaliser ** power for i, power, top in total.tops(k, c)])

        return OverRows(total.rows, total.tops, LazyMatrix(*total.shape, entry))

    def T(self, a):
        if isinstance(a, Softmax):
            return WeightsT(a.rows)
        if isinstance(a, OverZ2) and a.keyed:
            return ScoresT(a)
        if isinstance(a, (_rotary.Rotated, _norms.RowScaled, _norms.RowScaledT)):
            return a.T
        return _products.transpose(matrix_of(a))

    def scale(self, a, factor: sympy.Expr):
        if isinstance(a, OverZ2):
            parent = a.lazy
            return OverZ2(a.rows, a.base, LazyMatrix(parent.rows, parent.cols, lambda i, j: factor * parent[i, j]),
                          factor if a.factor is None else a.factor * factor, a.keyed)
        if isinstance(a, _rotary.RotaryScores):
            scaled = a.scaled(factor)
            if scaled is not None:
                return scaled
        if isinstance(a, _norms.NormedScores):
            return a.scaled(factor)
        return _weights_times(a, factor) if isinstance(a, (Softmax, Output)) else _products.scale(a, factor)

    def mask(self, allowed, bias):
        return mask_matrix(allowed, bias)

    def add_mask(self, scores, mask):
        if isinstance(scores, _norms.NormedScores):
            return scores.masked(matrix_of(mask))
        if isinstance(scores, _rotary.RotaryScores):
            masked = scores.masked(mask)
            if masked is not None:
                return masked
        return add_mask(scores, mask)

    def softmax(self, z, sink=None) -> Softmax:
        if isinstance(z, _rotary.RotaryScores) and z.allowed is not None and sink is None:
            return Softmax(_rotary.softmax_rows(z))
        return Softmax(softmax_rows(matrix_of(z) if isinstance(z, _rotary.RotaryScores) else z,
                                    expanded=isinstance(z, _norms.NormedMasked), sink=sink))

    def sink_weight(self, a: Softmax):
        return LazyMatrix(len(a.rows), 1, lambda i, j: a.rows[i].sink_weight())

    def softmax_backward(self, a: Softmax, dA) -> OverZ2:
        """dŜ_ij = e_ij (dA_ij Z_i − D_i) / Z_i² with D_i = Σ_k e_ik dA_ik (``e`` the row's terms):
        masked positions are exactly 0 and each row sums to exactly 0."""
        rows = a.rows
        dA = matrix_of(dA)
        numerators: dict[tuple[int, int], sympy.Expr] = {}
        D: dict[int, sympy.Expr] = {}

        def numerator(i: int, j: int) -> sympy.Expr:
            if (i, j) not in numerators:
                row = rows[i]
                if row.raw[j] is None:
                    numerators[(i, j)] = sympy.Integer(0)
                else:
                    if i not in D:
                        D[i] = sympy.expand(sympy.Add(*[t * dA[i, k] for k, t in enumerate(row.terms) if t != 0]))
                    numerators[(i, j)] = sympy.expand(row.terms[j] * (dA[i, j] * row.normaliser - D[i]))
            return numerators[(i, j)]

        def entry(i: int, j: int) -> sympy.Expr:
            top = numerator(i, j)
            return top if top == 0 else top / rows[i].normaliser ** 2

        return OverZ2(rows, numerator, LazyMatrix(len(rows), dA.cols, entry))

    def hstack(self, parts):
        return _products.hstack(*[matrix_of(p) for p in parts])

    def vstack(self, parts):
        return _stacked(parts)

    def softcap(self, a, cap):
        return _products.softcap(matrix_of(a), cap)

    def block(self, m, first: int, width: int):
        m = matrix_of(m)
        return LazyMatrix(m.rows, width, lambda i, j: m[i, first + j])

    def sum(self, parts):
        lazy = [matrix_of(p) for p in parts]
        if all(is_rational(m) for m in lazy):  # X + learned PE: one flint sum, and Q = X_pos·W_Q stays flint
            return _products.rational_sum(lazy)
        total = LazyMatrix(lazy[0].rows, lazy[0].cols, lambda i, j: sympy.Add(*[m[i, j] for m in lazy]))
        sums = [over_rows(p) for p in parts if _over(p)]
        rationals = [p for p in parts if not _over(p) and is_rational(p)]
        # one set of softmax rows (one head's, or its group's): the terms gather over the same Z_i;
        # the heads' Z_i differ, so a sum over heads is written entry by entry
        if not sums or len(sums) + len(rationals) != len(parts) or any(s.rows != sums[0].rows for s in sums):
            return total
        plain = _products.rational_sum(rationals) if rationals else None  # dX = the paths + dH
        return OverRows(sums[0].rows, lambda i, j: gathered(t for s in sums for t in s.tops(i, j)), total, plain=plain)

    def rows(self, m, first: int, count: int):
        """Rows ``first … first + count − 1`` (0-based) of ``m``; a rational matrix stays rational."""
        m = matrix_of(m)
        if is_rational(m):
            flat = [x for row in rational_rows(m)[first:first + count] for x in row]
            return rational_matrix(count, m.cols, flat)
        return LazyMatrix(count, m.cols, lambda i, j: m[first + i, j])

    def table(self, rows: list[list[int]]):
        """A matrix of whole numbers (a table of counts)."""
        return rational_matrix(len(rows), len(rows[0]), [QQ(x) for row in rows for x in row])

    def sub(self, a, b):
        a, b = matrix_of(a), matrix_of(b)
        return LazyMatrix(a.rows, a.cols, lambda i, j: tidy(a[i, j] - b[i, j]))

    def difference(self, a, b):
        return _linear.difference(matrix_of(a), matrix_of(b))

    def ones(self, rows: int, cols: int):
        return rational_matrix(rows, cols, [QQ(1)] * (rows * cols))

    def given(self, m):
        return m

    def is_rational(self, x) -> bool:
        return is_rational(matrix_of(x))

    def divide_rows(self, m, d):
        return _linear.divide_rows(matrix_of(m), matrix_of(d))

    # -- the MLP and the model's head (see symattn.exact.block) --------------------------------------

    def activate(self, m, name: str):
        return _block.activate(matrix_of(m), name)

    def row_softmax(self, z):
        return _block.row_softmax(matrix_of(z))

    def nll(self, z, targets, rows, base=None):
        return _block.nll(matrix_of(z), targets, rows, base)

    # -- the online (tiled) softmax (see symattn.exact.tiled) --------------------------------------

    def tiled_max(self, z, block: int) -> Matrix:
        """The running maximum of each row after each block of keys."""
        return Matrix(_tiled.exact_maxima(matrix_of(z), block))

    def tiled_sums(self, z, m, block: int) -> Matrix:
        """The running sum ℓ of each row after each block, rescaled at each new maximum (the exact
        pass finds the running maxima ``m`` again, the same)."""
        z = matrix_of(z)
        return Matrix([r.sums for r in _tiled.exact_rows(z, Matrix.zeros(z.cols, 0), block)])

    def tiled_acc(self, z, m, v, block: int) -> Matrix:
        """Each row's accumulator Σ e^{s_j − m} v_j after the last block."""
        return Matrix([list(r.steps[-1].acc) for r in _tiled.exact_rows(matrix_of(z), matrix_of(v), block)])

    def tiled_output(self, acc, sums):
        """``acc / ℓ``: each accumulator row over its row's last running sum."""
        acc, sums = matrix_of(acc), matrix_of(sums)
        return LazyMatrix(acc.rows, acc.cols, lambda i, c: acc[i, c] / sums[i, sums.cols - 1])

    def rational(self, p: int, q: int) -> sympy.Rational:
        return sympy.Rational(p, q)

    def rotate(self, m, thetas, pairs, sign: int = 1, offset: int = 0):
        """RoPE: row ``p`` with each pair ``pairs[i]`` turned by ``sign·(p + offset)·θ_i``, exactly."""
        return _rotate(m, thetas, pairs, sign, offset, gradient=not self.expand)


def _rotate(m, thetas, pairs, sign: int, offset: int, gradient: bool):
    """:meth:`ExactOps.rotate`: a gradient over the rows' Z_i keeps its denominators, rational rows take the
    fast path, a gradient kept entry by entry is turned lazily, anything else entry by entry now."""
    from ..problem.rope import rotate

    if isinstance(m, (OverZ2, OverRows)):  # a gradient turned back: row p keeps its denominators
        turns = [sign * (p + offset) for p in range(shape_of(m)[0])]
        relative = _turned_product(m, thetas, pairs, turns)
        return relative if relative is not None else _turned_rows(m, _turns(thetas, turns), pairs)
    m = matrix_of(m)
    positions = [p + offset for p in range(m.rows)]
    fast = _rotary.rotated(m, thetas, pairs, [sign * p for p in positions])
    if fast is None and gradient and isinstance(m, LazyMatrix):  # a K/V group's dK_rot, entry by entry
        fast = _turned_lazily(m, thetas, pairs, positions, sign)
    return fast if fast is not None else rotate(m, thetas, pairs, positions, sign)


def _turned_lazily(m: LazyMatrix, thetas, pairs, positions: list[int], sign: int) -> LazyMatrix:
    """``m`` with row ``p``'s pairs turned by ``sign·positions[p]·θ_i``, each entry made when asked for
    (the same entries as :func:`symattn.problem.rope.rotate`): a gradient kept entry by entry (a K/V
    group's dK_rot, summed over its heads' shares) is turned back without building its whole closed
    form, which through a block's MLP and norms is far too long to build."""
    from ..problem.rope import cos_sin

    partner = {}
    for (a, b), theta in zip(pairs, thetas):
        partner[a], partner[b] = (b, theta, True), (a, theta, False)

    def entry(r: int, k: int) -> sympy.Expr:
        if k not in partner:
            return m[r, k]  # a component in no pair stays
        other, theta, first = partner[k]
        c, s = cos_sin(sign * positions[r] * theta)
        return tidy(m[r, k] * c - m[r, other] * s) if first else tidy(m[r, other] * s + m[r, k] * c)

    return LazyMatrix(m.rows, m.cols, entry)


def _over_hadamard(a, b):
    """``a ∘ b``; a gradient over the rows' ``Z_i`` times rational normalised rows keeps its form."""
    if _over(a) and _norms.rational_rows_of(b):
        a = over_rows(a)
        lazy = _norms.hadamard(a.lazy, b)
        return OverRows(a.rows, lambda i, j: [(r, p, t * b[i, j]) for r, p, t in a.tops(i, j) if b[i, j] != 0], lazy)
    return _norms.hadamard(matrix_of(a), matrix_of(b))


def _over_normalise_backward(d, hat, spread, eps, centred: bool):
    """Back through a norm; a gradient over the rows' ``Z_i`` behind rational roots keeps its form
    (each row is its row of ``d`` times a rational matrix, see :func:`_norms.backward_matrix`)."""
    lazy = _norms.normalise_backward(matrix_of(d), matrix_of(hat), matrix_of(spread), eps, centred)
    if not (_over(d) and _norms.rational_rows_of(hat) and is_rational(spread)):
        return lazy
    spread = matrix_of(spread)
    inverse = [_norms.inverse_root(spread[i, 0] + eps) for i in range(spread.rows)]
    if not all(x.is_Rational for x in inverse):
        return lazy
    d = over_rows(d)
    kept: dict = {}

    def tops(i: int, k: int) -> list[tuple[int, int, sympy.Expr]]:
        if i not in kept:
            kept[i] = _norms.backward_matrix([hat[i, l] for l in range(hat.cols)], inverse[i], centred)
        m = kept[i]
        return gathered((r, p, t * m[l][k]) for l in range(hat.cols) if m[l][k] != 0 for r, p, t in d.tops(i, l))

    return OverRows(d.rows, tops, lazy)


def _turned_product(m, thetas, pairs, turns: list[int]):
    """``dS·K_rot`` or ``dSᵀ·Q_rot`` with row ``p`` turned by ``turns[p]``, made from the unrotated
    factor: R(t_p θ)·Σ_j dS_pj R(jθ) k_j = Σ_j dS_pj R((j + t_p)θ) k_j, so each entry is a sum over
    the relative angles (the form the scores have), never a product of two cosines. None when ``m``
    is no such product (the rows are then turned as they are: :func:`_turned_rows`)."""
    operands = getattr(m, "operands", None)
    if operands is None or not isinstance(operands[1], _rotary.Rotated):
        return None
    g, b = operands
    if b.thetas != tuple(thetas) or b.pairs != list(pairs):
        return None

    @functools.cache
    def turned(p: int) -> "_rotary.Rotated":  # b with each row's turn moved by row p's
        return _rotary.Rotated(b.base, b.thetas, b.pairs, [t + turns[p] for t in b.turns])

    rows = m.rows
    if isinstance(m, OverZ2):  # dS·K_rot: row p of dS times each key turned relative to p
        @functools.cache
        def base(p: int, c: int) -> sympy.Expr:
            k = turned(p)
            return sympy.expand(sympy.Add(*[g.base(p, j) * k[j, c] for j in range(k.rows) if rows[p].raw[j] is not None]))

        def entry(p: int, c: int) -> sympy.Expr:
            x = base(p, c)
            top = x if m.factor is None else tidy(m.factor * x)
            return top if top == 0 else top / rows[p].normaliser ** 2

        return OverZ2(rows, base, LazyMatrix(*m.shape, entry), m.factor, keyed=False)

    scores = g.of  # dSᵀ·Q_rot: column k of dS times each query turned relative to k

    @functools.cache
    def tops(k: int, c: int) -> list[tuple[int, int, sympy.Expr]]:
        return _column_tops(scores, k, c, turned(k))

    def sums(k: int, c: int) -> sympy.Expr:
        return sympy.Add(*[top / rows[i].normaliser ** power for i, power, top in tops(k, c)])

    return OverRows(rows, tops, LazyMatrix(*m.shape, sums))


def _column_tops(g, k: int, c: int, b) -> list[tuple[int, int, sympy.Expr]]:
    """Entry (k, c) of ``dSᵀ·b`` as its terms over each ``Z_i²``: Σ_i dS_ik b_ic, ``g`` the scores'
    gradient kept over the softmax rows."""
    terms = []
    for i in range(g.lazy.rows):
        if g.rows[i].raw[k] is not None and b[i, c] != 0:
            top = g.top(i, k)
            if top != 0:
                terms.append((i, 2, top * b[i, c]))
    return gathered(terms)


def _turns(thetas, turns: list[int]) -> list[list[tuple[sympy.Expr, sympy.Expr]]]:
    """cos and sin of ``turn·θ_i`` for each row's turn and each pair, exactly (a plain angle's made as
    the fast path makes them, without SymPy's evaluation)."""
    from ..problem.rope import cos_sin, plain_angles

    plain = plain_angles(thetas)
    return [[_rotary.plain_cos_sin(t, theta) if plain else cos_sin(t * theta) for theta in thetas] for t in turns]


def _turned_rows(m, turns, pairs):
    """A gradient over the softmax rows with each of its rows turned pair by pair (the backward pass
    through RoPE): a row's entries are combinations of that row's entries, so an OverZ2 stays one
    fraction over ``Z_i²`` per entry and an OverRows keeps its terms over each ``Z_i^power``."""
    partner = {}
    for i, (a, b) in enumerate(pairs):
        partner[a], partner[b] = (i, b, 1), (i, a, -1)  # out_a = c·x_a − s·x_b, out_b = c·x_b + s·x_a

    def combine(p: int, j: int, read):
        if j not in partner:
            return [(1, read(p, j))]  # a component in no pair stays
        i, other, sign = partner[j]
        c, s = turns[p][i]
        return [(c, read(p, j)), (-sign * s, read(p, other))]

    rows = m.rows
    if isinstance(m, OverZ2):
        @functools.cache  # each numerator made once: the entries and the products after read it
        def base(p: int, j: int) -> sympy.Expr:
            return sympy.expand(sympy.Add(*[w * x for w, x in combine(p, j, m.base) if w != 0]))

        def entry(p: int, j: int) -> sympy.Expr:
            x = base(p, j)
            top = x if m.factor is None else tidy(m.factor * x)
            return top if top == 0 else top / rows[p].normaliser ** 2

        return OverZ2(rows, base, LazyMatrix(*m.shape, entry), m.factor, keyed=False)

    @functools.cache
    def tops(p: int, j: int) -> list[tuple[int, int, sympy.Expr]]:
        return gathered((i, power, w * top) for w, terms in combine(p, j, m.tops) if w != 0
                        for i, power, top in terms)

    def sums(p: int, j: int) -> sympy.Expr:
        return sympy.Add(*[top / rows[i].normaliser ** power for i, power, top in tops(p, j)])

    return OverRows(rows, tops, LazyMatrix(*m.shape, sums))
