"""The mask matrix ``M`` (0 where a query may attend, −∞ where it may not, plus any bias) and the
masked scores ``S + M``, exactly, as lazy matrices with their rational entries kept as ``QQ``."""

from __future__ import annotations

import sympy
from sympy import QQ

from ..numbers.matrices import NEG_INF, Matrix, is_rational, tidy
from .lazy import LazyMatrix, made_rows, rational_rows


def _qq(x: sympy.Expr):
    """``x`` as a QQ number, or None when it is not rational."""
    return QQ(int(x.p), int(x.q)) if isinstance(x, sympy.Rational) else None


def mask_matrix(allowed, bias) -> LazyMatrix:
    """``M``: 0 where a query may attend, −∞ where it may not, plus the bias if any."""
    n_q, n_k = len(allowed), len(allowed[0])

    def entry(i: int, j: int) -> sympy.Expr:
        if not allowed[i][j]:
            return NEG_INF
        return bias[i, j] if bias is not None else sympy.Integer(0)

    if bias is None:
        zero = QQ(0)  # one number for every allowed position (a causal mask has n²/2 of them)
        qq = made_rows(n_q, n_k, lambda i: [zero if ok else None for ok in allowed[i]])
    else:
        b = [[bias[i, j] for j in range(n_k)] for i in range(n_q)]
        qq = [[None if (not ok or x == NEG_INF) else _qq(x) for ok, x in zip(row, brow)]
              for row, brow in zip(allowed, b)]
        if any(x is None and ok and brow_x != NEG_INF
               for row, qrow, brow in zip(allowed, qq, b) for ok, x, brow_x in zip(row, qrow, brow)):
            qq = None  # an irrational or symbolic bias
    return LazyMatrix(n_q, n_k, entry, qq)


def add_mask(scores: Matrix, mask: LazyMatrix) -> LazyMatrix:
    """``scores + mask`` where a −∞ in the mask stays −∞ (never 0·∞ or ∞ − ∞)."""

    def entry(i: int, j: int) -> sympy.Expr:
        m = mask[i, j]
        return NEG_INF if m == NEG_INF else tidy(scores[i, j] + m)

    qq = None
    if mask.qq_rows is not None and is_rational(scores):
        score_rows, mask_rows = rational_rows(scores), mask.qq_rows
        qq = made_rows(scores.rows, scores.cols,
                       lambda i: [None if b is None else s + b for s, b in zip(score_rows[i], mask_rows[i])])
    return LazyMatrix(scores.rows, scores.cols, entry, qq)

