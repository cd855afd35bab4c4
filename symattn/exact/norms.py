"""A layer normalisation, exactly: each row's mean and variance (or mean square), and the rows
divided by their own root √(σ_i² + ε).

The mean and the variance of a rational row are rational. The normalised row is a rational row
times one number, 1/√r_i with r_i = σ_i² + ε, so what follows it is kept in that form:
:class:`RowScaled` holds U, the roots and C for the entries ``U_ij/√r_i + C_ij``, and γ, β, the
projections and their biases act on U and C alone, by flint. The scores of two such matrices are
four rational products (:func:`scores`): ``S_ij = (P_ij/√(r_i r_j)) + Q_ij/√r_i + R_ij/√r_j + T_ij``.
Anything else (a norm of irrational rows, such as the residual sum behind the attention) is
written out entry by entry in SymPy.
"""

from __future__ import annotations

import mpmath
import sympy
from sympy import QQ

from ..numbers.matrices import NEG_INF, is_rational, qq_to_sympy, rational_matrix, tidy
from . import products as _products
from .evaluation import mpf_of_qq, to_mpf
from .lazy import LazyMatrix, rational_rows


def row_mean(m):
    """The n × 1 means of the rows of ``m``."""
    if is_rational(m):
        rows = rational_rows(m)
        d = QQ(m.cols)
        return rational_matrix(m.rows, 1, [sum(row, QQ(0)) / d for row in rows])
    # built when read: behind the softmax each entry is a long sum, and a stage far down the block
    # (the final norm of the logit lens) shows its decimals without building them
    return LazyMatrix(m.rows, 1, lambda i, j: sympy.Add(*[m[i, k] for k in range(m.cols)]) / m.cols)


def row_spread(m, mu, ddof: int = 0):
    """The n × 1 ``Σ_k (m_ik − μ_i)² / (d − ddof)`` (``mu`` None: the mean square)."""
    d = m.cols - ddof
    if is_rational(m) and (mu is None or is_rational(mu)):
        rows = rational_rows(m)
        centres = [QQ(0)] * m.rows if mu is None else [r[0] for r in rational_rows(mu)]
        out = []
        for row, c in zip(rows, centres):
            total = QQ(0)
            for x in row:
                total += (x - c) * (x - c)
            out.append(total / QQ(d))
        return rational_matrix(m.rows, 1, out)
    def entry(i: int, j: int) -> sympy.Expr:
        centre = 0 if mu is None else mu[i, 0]
        return sympy.Add(*[(m[i, k] - centre) ** 2 for k in range(m.cols)]) / d

    return LazyMatrix(m.rows, 1, entry)


def inverse_root(r: sympy.Expr) -> sympy.Expr:
    """1/√r, as SymPy writes it (2√3/3 for r = 3/4)."""
    _not_zero(r)
    return 1 / sympy.sqrt(r)


def _not_zero(r: sympy.Expr) -> None:
    """A norm's σ_i² + ε that is exactly 0 (a constant row with ε = 0: the MLP's norm of a rational
    stream) is refused: the norm would divide by 0."""
    if r == 0:
        from ..errors import SymattnError

        raise SymattnError("a row of a norm's input has variance 0 (every entry equal, or all 0 for RMSNorm) and "
                           "that norm's eps is 0, so it would divide by 0: give it eps > 0")


def normalise(m, mu, spread, eps: sympy.Expr, inside: bool = True):
    """``(m_ik − μ_i)/√(spread_i + ε)`` (``mu`` None: no mean taken away); ``inside`` False puts ε
    outside the root. A rational row with ε inside gives a :class:`RowScaled` matrix."""
    n = m.rows
    if inside and eps.is_Rational and is_rational(m) and is_rational(spread) and (mu is None or is_rational(mu)):
        centred = _centred(m, mu)
        roots = tuple(inverse_root(qq_to_sympy(r[0]) + eps) for r in rational_rows(spread))
        return RowScaled(centred, roots)
    dividers: dict[int, sympy.Expr] = {}

    def entry(i: int, j: int) -> sympy.Expr:
        if i not in dividers:
            _not_zero(spread[i, 0] + eps if inside else spread[i, 0] + eps)
            dividers[i] = sympy.sqrt(spread[i, 0] + eps) if inside else sympy.sqrt(spread[i, 0]) + eps
        return (m[i, j] - (0 if mu is None else mu[i, 0])) / dividers[i]

    return LazyMatrix(n, m.cols, entry)


def _centred(m, mu):
    """``m`` with each row's mean ``mu_i`` taken away, exactly (rational)."""
    if mu is None:
        return m
    rows, centres = rational_rows(m), [r[0] for r in rational_rows(mu)]
    return rational_matrix(m.rows, m.cols, [x - c for row, c in zip(rows, centres) for x in row])


def times_row(m, row):
    """``m`` with column k multiplied by ``row``'s entry k."""
    if isinstance(m, RowScaled) and is_rational(row):
        return m.times_row(row)
    if is_rational(m) and is_rational(row):
        return _times_row_qq(m, row)
    g = [row[0, k] for k in range(row.cols)]
    return LazyMatrix(m.rows, m.cols, lambda i, j: tidy(m[i, j] * g[j]))


def _times_row_qq(m, row):
    g = rational_rows(row)[0]
    g = [g[k] for k in range(row.cols)]
    return rational_matrix(m.rows, m.cols, [x * g[k] for r in rational_rows(m) for k, x in enumerate(r)])


def rational_rows_of(value) -> bool:
    """Whether normalised rows are rational: a rational matrix, or a RowScaled one whose every row
    number is rational (each root √(σ_i² + ε) rational)."""
    if isinstance(value, RowScaled):
        return all(x.is_Rational for x in value.scales)
    return is_rational(value)


def as_rational(x):
    """Normalised rows (or their transpose) whose every root is rational, as the rational matrix they
    are; anything else as it is."""
    of = x.of if isinstance(x, RowScaledT) else x
    if not isinstance(of, RowScaled) or not all(s.is_Rational for s in of.scales):
        return x
    scales = [QQ(int(s.p), int(s.q)) for s in of.scales]
    u = rational_rows(of.U)
    c = rational_rows(of.C) if of.C is not None else None
    m = rational_matrix(of.rows, of.cols, [u[i][j] * scales[i] + (c[i][j] if c is not None else QQ(0))
                                           for i in range(of.rows) for j in range(of.cols)])
    return _products.transpose(m) if isinstance(x, RowScaledT) else m


def backward_matrix(hat_row: list, inverse: sympy.Expr, centred: bool) -> list[list[sympy.Expr]]:
    """The rational d × d matrix M with ``dx_i = dx̂_i · M`` for one row (x̂ its normalised row, 1/√r its
    ``inverse`` root): ``M_lk = (δ_lk − [centred]/d − x̂_l x̂_k/d) / √r``, symmetric."""
    d = len(hat_row)
    c = sympy.Rational(1 if centred else 0, d)
    return [[inverse * ((1 if l == k else 0) - c - hat_row[l] * hat_row[k] / d) for k in range(d)] for l in range(d)]


def hadamard(a, b):
    """The entrywise product ``a ∘ b``."""
    return LazyMatrix(a.rows, a.cols, lambda i, j: tidy(a[i, j] * b[i, j]))


def normalise_backward(d, hat, spread, eps: sympy.Expr, centred: bool):
    """``(d_ik − mean_i(d) − x̂_ik·mean_i(d ∘ x̂)) / √(spread_i + ε)`` (no ``mean_i(d)`` unless
    ``centred``), each row's two means built once, when an entry of the row is first read."""
    cols, kept = d.cols, {}

    def row(i: int) -> list:
        if i not in kept:
            g = [d[i, k] for k in range(cols)]
            h = [hat[i, k] for k in range(cols)]
            first = sympy.Add(*g) / cols if centred else 0
            second = sympy.Add(*[x * y for x, y in zip(g, h)]) / cols
            inv = inverse_root(spread[i, 0] + eps)
            kept[i] = [tidy(inv * (x - first - y * second)) for x, y in zip(g, h)]
        return kept[i]

    return LazyMatrix(d.rows, cols, lambda i, j: row(i)[j])


class _Valued(LazyMatrix):
    """A lazy matrix that computes its values at any digits from its own structure (``_mp_values``),
    each number of digits once: :func:`symattn.exact.evaluation.evaluate` reads ``mp_values``."""

    def mp_values(self, dps: int) -> list[list[mpmath.mpf]]:
        kept = self.__dict__.setdefault("_mp", {})
        if dps not in kept:
            kept[dps] = self._mp_values(dps)
        return kept[dps]

    def _mp_values(self, dps: int) -> list[list[mpmath.mpf]]:
        raise NotImplementedError


class RowScaled(_Valued):
    """The exact matrix ``U_ij·s_i + C_ij``: a rational U with each row i times its own irrational
    number s_i (1/√r_i of a norm), plus a rational C (None: 0). γ, β, a projection and its bias
    act on U and C by flint; each entry is built from them when read."""

    def __init__(self, U, scales: tuple, C=None) -> None:
        self.U, self.scales, self.C = U, scales, C
        u = rational_rows(U)
        c = rational_rows(C) if C is not None else None

        def entry(i: int, j: int) -> sympy.Expr:
            x = qq_to_sympy(u[i][j]) * scales[i]
            return x + qq_to_sympy(c[i][j]) if c is not None else x

        super().__init__(U.rows, U.cols, entry)

    def times_row(self, row) -> "RowScaled":
        return RowScaled(_times_row_qq(self.U, row), self.scales, None if self.C is None else _times_row_qq(self.C, row))

    def plus_row(self, row) -> "RowScaled":
        zero = rational_matrix(self.U.rows, self.U.cols, [QQ(0)] * (self.U.rows * self.U.cols))
        return RowScaled(self.U, self.scales, _products.add_row(self.C if self.C is not None else zero, row))

    def times(self, W) -> "RowScaled":
        """``self·W`` for a rational W: ``(U·W)·s_i + C·W``."""
        return RowScaled(_products.matmul(self.U, W), self.scales,
                         None if self.C is None else _products.matmul(self.C, W))

    @property
    def T(self) -> "RowScaledT":
        return RowScaledT(self)

    def _mp_values(self, dps: int) -> list[list[mpmath.mpf]]:
        """The entries at ``dps`` digits, from U, C and the row numbers (no SymPy entry is built)."""
        with mpmath.workdps(dps + 10):
            s = [to_mpf(x, dps + 10) for x in self.scales]
            u = rational_rows(self.U)
            c = rational_rows(self.C) if self.C is not None else None
            return [[mpf_of_qq(u[i][j]) * s[i] + (mpf_of_qq(c[i][j]) if c is not None else 0)
                     for j in range(self.cols)] for i in range(self.rows)]


class RowScaledT(LazyMatrix):
    """The transpose of a :class:`RowScaled` matrix (the keys of a score product)."""

    def __init__(self, of: RowScaled) -> None:
        self.of = of
        super().__init__(of.cols, of.rows, lambda i, j: of[j, i])

    @property
    def T(self) -> RowScaled:
        return self.of

    def mp_values(self, dps: int) -> list[list[mpmath.mpf]]:
        return [list(col) for col in zip(*self.of.mp_values(dps))]


def scores(a, b) -> "NormedScores | None":
    """``a·bᵀ`` for a RowScaled ``a`` and the transpose ``b`` of one: four rational products, each
    entry ``s_i s'_j (U U'ᵀ)_ij + s_i (U C'ᵀ)_ij + s'_j (C U'ᵀ)_ij + (C C'ᵀ)_ij``. None for anything else."""
    if not (isinstance(a, RowScaled) and isinstance(b, RowScaledT)):
        return None
    k = b.of
    Kt = _products.transpose
    parts = [(_products.matmul(a.U, Kt(k.U)), True, True)]
    if k.C is not None:
        parts.append((_products.matmul(a.U, Kt(k.C)), True, False))
    if a.C is not None:
        parts.append((_products.matmul(a.C, Kt(k.U)), False, True))
    if a.C is not None and k.C is not None:
        parts.append((_products.matmul(a.C, Kt(k.C)), False, False))
    return NormedScores(tuple(parts), a.scales, k.scales)


class NormedScores(_Valued):
    """Scores of normalised rows: ``Σ_parts P_ij · (s_i if left) · (s'_j if right)`` with rational
    P (flint), ``s`` and ``s'`` the query and key rows' numbers, and one exact ``factor`` (the
    scale, 1 until scaled). Scaling by a rational multiplies the P's; the values at any digits
    come from the rationals and the row numbers, no SymPy entry built."""

    def __init__(self, parts: tuple, left: tuple, right: tuple, factor=sympy.Integer(1)) -> None:
        self.parts, self.left, self.right, self.factor = parts, left, right, factor
        rows = [(rational_rows(m), l, r) for m, l, r in parts]

        def entry(i: int, j: int) -> sympy.Expr:
            terms = []
            for qq, use_left, use_right in rows:
                x = qq_to_sympy(qq[i][j])
                if x == 0:
                    continue
                if use_left:
                    x = x * left[i]
                if use_right:
                    x = x * right[j]
                terms.append(x)
            total = sympy.Add(*terms)
            return total if factor == 1 else tidy(factor * total)

        m = parts[0][0]
        super().__init__(m.rows, m.cols, entry)

    def scaled(self, factor: sympy.Expr) -> "NormedScores":
        if factor.is_Rational:
            return NormedScores(tuple((_products.scale(m, factor), l, r) for m, l, r in self.parts), self.left,
                                self.right, self.factor)
        return NormedScores(self.parts, self.left, self.right, self.factor * factor)

    def masked(self, mask) -> LazyMatrix:
        """The scores plus the mask: −∞ where it is, else the score plus its 0 (or bias) entry; a
        score is already a sum of distinct terms, so adding 0 builds nothing new."""
        def entry(i: int, j: int) -> sympy.Expr:
            m = mask[i, j]
            if m == NEG_INF:
                return NEG_INF
            return self[i, j] if m == 0 else tidy(self[i, j] + m)

        # a rational mask (and bias) keeps every entry algebraic; anything else is an ordinary matrix
        return (NormedMasked if getattr(mask, "qq_rows", None) is not None else LazyMatrix)(self.rows, self.cols, entry)

    def _mp_values(self, dps: int) -> list[list[mpmath.mpf]]:
        with mpmath.workdps(dps + 10):
            s = [to_mpf(x, dps + 10) for x in self.left]
            t = [to_mpf(x, dps + 10) for x in self.right]
            f = to_mpf(self.factor, dps + 10)
            rows = [(rational_rows(m), l, r) for m, l, r in self.parts]
            out = []
            for i in range(self.rows):
                line = []
                for j in range(self.cols):
                    total = mpmath.mpf(0)
                    for qq, use_left, use_right in rows:
                        x = mpf_of_qq(qq[i][j])
                        if use_left:
                            x *= s[i]
                        if use_right:
                            x *= t[j]
                        total += x
                    line.append(total * f)
                out.append(line)
            return out


class NormedMasked(LazyMatrix):
    """Masked scores of normalised rows: each entry a sum of distinct algebraic terms (or −∞), so
    the softmax's exponents z − m need no further expanding (:func:`symattn.exact.softmax.softmax_rows`)."""
