"""Exact products and sums of matrices, and the matrices they reshape.

Rational matrices are multiplied as QQ DomainMatrix objects: python-flint's ``fmpq_mat`` under
SymPy's flint ground types (its fastest); anything with square roots or exponentials is
multiplied entry by entry in SymPy and expanded (or, for a gradient, kept as a sum of products).
"""

from __future__ import annotations

import bisect

import sympy
from sympy import QQ

from ..numbers.dyadic import deferred_floats, float_matrix
from ..numbers.matrices import Matrix, is_rational, rational_matrix, tidy, tidy_trig
from ..numbers.sympy_internals import matrix_from_domain, matrix_from_fmpq_mat, qq_dense
from .lazy import LazyMatrix, fmpq_matrix

_dm = qq_dense  # the QQ DomainMatrix of a rational matrix (dense; fmpq_mat under flint)


def hstack(*parts) -> "LazyMatrix | Matrix":
    """Matrices side by side (lazy when any part is lazy)."""
    if not any(isinstance(p, LazyMatrix) for p in parts):
        return Matrix.hstack(*parts)
    starts, col = [], 0
    for part in parts:
        starts.append(col)
        col += part.cols

    def entry(i: int, j: int) -> sympy.Expr:
        h = bisect.bisect_right(starts, j) - 1  # the part holding column j (a concat of many heads)
        return parts[h][i, j - starts[h]]

    return LazyMatrix(parts[0].rows, col, entry)


def rational_sum(parts) -> Matrix:
    """The sum of rational matrices of one shape, exactly (by flint where it holds them)."""
    total = _dm(parts[0])
    for m in parts[1:]:
        total = total + _dm(m)
    return matrix_from_domain(total)


def matmul(a, b) -> "Matrix | LazyMatrix":
    """The exact product ``a·b``."""
    assert a.cols == b.rows, (a.shape, b.shape)
    if is_rational(a) and is_rational(b):
        return matrix_from_domain(_dm(a) * _dm(b))

    def entry(i: int, j: int) -> sympy.Expr:
        return tidy_trig(tidy(sympy.Add(*[a[i, k] * b[k, j] for k in range(a.cols)])))

    if isinstance(a, LazyMatrix) or isinstance(b, LazyMatrix):
        return LazyMatrix(a.rows, b.cols, entry)
    return Matrix(a.rows, b.cols, entry)



def product(a, b):
    """``a·b`` exactly, unexpanded: a rational product, or a lazy matrix of sums of products."""
    if is_rational(a) and is_rational(b):
        return matmul(a, b)

    def entry(i: int, j: int) -> sympy.Expr:
        return sympy.Add(*[x * y for x, y in ((a[i, k], b[k, j]) for k in range(a.cols)) if x != 0 and y != 0])

    return LazyMatrix(a.rows, b.cols, entry)


def add_row(m, row) -> "Matrix | LazyMatrix":
    """``m`` with the 1 × cols matrix ``row`` added to every row (a projection's bias); rational
    stays rational."""
    assert row.rows == 1 and row.cols == m.cols, (m.shape, row.shape)
    if is_rational(m) and is_rational(row):
        ones = rational_matrix(m.rows, 1, [QQ(1)] * m.rows)
        return matrix_from_domain(_dm(m) + _dm(ones) * _dm(row))

    def entry(i: int, j: int) -> sympy.Expr:
        return tidy(m[i, j] + row[0, j])

    if isinstance(m, LazyMatrix):
        return LazyMatrix(m.rows, m.cols, entry)
    return Matrix(m.rows, m.cols, entry)


def transpose(m):
    """``mᵀ``; a rational matrix held as flint's fmpq_mat is transposed by flint (SymPy's own
    transpose goes through its sparse form, entry by entry), and a big one still held as its
    binary floats (a checkpoint's W_U, W_1, W_2) as their transposed floats, its fmpq_mat not made."""
    floats = deferred_floats(m)
    if floats is not None:
        return float_matrix(floats.T)
    dense = fmpq_matrix(m)
    if dense is None:
        return m.T
    return matrix_from_fmpq_mat(dense.transpose())


def scale(m: Matrix, factor: sympy.Expr) -> Matrix:
    if is_rational(m) and factor.is_Rational:
        return matrix_from_domain(_dm(m) * QQ(int(factor.p), int(factor.q)))
    if isinstance(m, LazyMatrix):  # built when read (the loss of a block: its entries are long)
        return LazyMatrix(m.rows, m.cols, lambda i, j: tidy(m[i, j] * factor))
    return m.applyfunc(lambda x: tidy(x * factor))



def vstack(parts) -> "LazyMatrix | Matrix":
    """The matrices ``parts`` one above the other (rational stays rational)."""
    from .lazy import rational_rows

    if all(is_rational(m) for m in parts):
        flat = [x for m in parts for row in rational_rows(m) for x in row]
        return rational_matrix(sum(m.rows for m in parts), parts[0].cols, flat)
    where = [(m, i) for m in parts for i in range(m.rows)]
    return LazyMatrix(len(where), parts[0].cols, lambda i, j: where[i][0][where[i][1], j])


def softcap(m, cap: sympy.Expr) -> LazyMatrix:
    """``cap · tanh(m / cap)`` of each entry, exactly (SymPy keeps tanh of an exact argument); −∞ gives −cap."""
    return LazyMatrix(m.rows, m.cols, lambda i, j: tidy(cap * sympy.tanh(m[i, j] / cap)))
