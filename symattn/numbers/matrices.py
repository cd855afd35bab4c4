"""Exact matrices from numbers: rational matrices (flint's fmpq_mat under SymPy), NumPy floats
as the dyadic rationals they are, and the canonical form of an exact entry.

These are what a problem's matrices are made of; the stages' arithmetic on them is in
:mod:`symattn.exact.products` and its neighbours.
"""

from __future__ import annotations

import flint as _flint  # exact rational matrices (a required dependency)
import sympy
from sympy import QQ

from .parse import keep_float64
from .sympy_internals import FLINT_QQ, QQMatrix, is_rational_matrix, matrix_from_domain, matrix_from_fmpq_mat, qq_dense

NEG_INF = sympy.S.NegativeInfinity
Matrix = sympy.ImmutableMatrix


def tidy(x: sympy.Expr) -> sympy.Expr:
    """``x`` in canonical expanded form (a no-op for rationals, the common case)."""
    if x.is_Rational or x.is_Atom:
        return x
    # Never split e^(a+b) into e^a·e^b: the exponents are the softmax's structure.
    x = sympy.expand(x, power_exp=False, power_base=False, log=False)
    if x.has(sympy.sin):  # positional encodings: sin²u + cos²u = 1 collected
        x = sympy.expand(x.replace(_is_sin_squared, _one_minus_cos_squared), power_exp=False, power_base=False, log=False)
    return x


def _is_sin_squared(e) -> bool:
    return e.is_Pow and e.exp == 2 and isinstance(e.base, sympy.sin)


def _one_minus_cos_squared(e) -> sympy.Expr:
    return 1 - sympy.cos(e.base.args[0]) ** 2


# -- rational matrices ------------------------------------------------------------------
#
# A matrix of rationals is a :class:`QQMatrix` (see :mod:`symattn.numbers.sympy_internals`): an ImmutableMatrix
# over a dense QQ DomainMatrix, python-flint's fmpq_mat under SymPy's flint ground types.

is_rational = is_rational_matrix  # whether a matrix is rational, held as a DomainMatrix (no entry read)
_dm = qq_dense  # the QQ DomainMatrix of a rational matrix (dense; fmpq_mat under flint)


def qq_to_sympy(x) -> sympy.Rational:
    """A ``QQ`` number (flint's fmpq, or SymPy's PythonMPQ) as the SymPy rational of the same value."""
    return sympy.Rational(int(x.numerator), int(x.denominator))


def rational_matrix(rows: int, cols: int, flat: list) -> Matrix:
    """The exact matrix with these ``QQ`` entries (row by row)."""
    from sympy.polys.matrices import DomainMatrix

    return matrix_from_domain(DomainMatrix([flat[i * cols:(i + 1) * cols] for i in range(rows)], (rows, cols), QQ))


def scaled_integer_matrix(rows: int, cols: int, numerators, denominator: int) -> Matrix:
    """The exact matrix with entries ``numerators[k] / denominator`` (row by row; ``numerators``
    a list of ints or a NumPy int64 array).

    Given an int64 array (the NumPy reader of decimals), the matrix keeps it (see
    :func:`scaled_integers`), and, when the numerators and the denominator are float64 numbers (at
    most 2^53), each entry's float64: one IEEE division, correctly rounded (the cross-check reads
    them instead of rounding each fraction again later)."""
    array = None if isinstance(numerators, list) else numerators
    if array is not None:
        numerators = array.tolist()
    if FLINT_QQ:
        m = matrix_from_fmpq_mat(_flint.fmpq_mat(_flint.fmpz_mat(rows, cols, numerators)) / denominator)
    else:
        m = rational_matrix(rows, cols, [QQ(x, denominator) for x in numerators])
    if array is not None and isinstance(m, QQMatrix) and array.size:
        import numpy as np

        kept = array.reshape(rows, cols)
        kept.flags.writeable = False
        m.__dict__[_SCALED] = (kept, denominator)
        if denominator <= 2**53 and int(np.abs(kept).max()) <= 2**53:
            keep_float64(m, kept.astype(np.float64) / float(denominator))
    return m


_SCALED = "_scaled_int64"  # where a matrix read as int64 numerators over 10^k keeps them


def scaled_integers(m) -> "tuple[numpy.ndarray, int] | None":
    """``(numerators, denominator)`` that :func:`scaled_integer_matrix` made a matrix from, when
    given them as an int64 array (read-only, not necessarily in lowest terms); else None."""
    return getattr(m, "__dict__", {}).get(_SCALED)


def binary_float_matrix(array) -> Matrix:
    """The exact matrix of a 2-d NumPy float array: each binary float is the dyadic rational
    it stands for (never its decimal print)."""
    import numpy as np

    array = np.array(array, dtype=np.float64)  # float16 and float32 values are exact in float64
    rows, cols = array.shape
    if FLINT_QQ:
        fmpq = _flint.fmpq
        m = matrix_from_fmpq_mat(_flint.fmpq_mat(rows, cols, [fmpq(*v.as_integer_ratio()) for v in array.ravel().tolist()]))
    else:
        m = rational_matrix(rows, cols, [QQ(*v.as_integer_ratio()) for v in array.ravel().tolist()])
    keep_float64(m, array)  # each entry is its own correctly rounded float
    return m


def tidy_trig(x: sympy.Expr) -> sympy.Expr:
    """``x`` with its products of sines and cosines written as sums (cos a·cos b = (cos(a − b) +
    cos(a + b))/2, ...), expanded: RoPE's rotated dot products then collapse exactly to terms in
    the relative angles. Anything without sin or cos is returned as it is."""
    if x.is_Atom or not x.has(sympy.sin, sympy.cos):
        return x
    from sympy.simplify.fu import TR8

    return tidy(TR8(x))
