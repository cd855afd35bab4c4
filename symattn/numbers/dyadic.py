"""Matrices of binary floats (a checkpoint's float32, bfloat16 or float64 numbers), each entry the
dyadic rational it stands for, and exact products of such a matrix in float64.

A big one (a model's embedding table, an MLP's weights) is kept as its float64 array: its
exact QQ form (python-flint's ``fmpq_mat``) is made only when an operation needs it whole (see
:func:`~symattn.numbers.sympy_internals.deferred_matrix`); an entry, a row or a block is read
from the floats exactly. Its product with integers (:func:`integer_product`) is computed exactly
by float64 matrix products of short slices of both, each slice product an integer below 2^53
and so exact in any order of summation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import flint

from .parse import keep_float64
from .sympy_internals import FLINT_QQ, deferred_matrix, deferred_source, matrix_from_fmpq_mat

if TYPE_CHECKING:
    import numpy

DEFER_FROM = 1 << 18  # entries from which a float matrix keeps its floats and makes its fmpq_mat on demand
EXACT_FLOATS = "_floats_are_exact"  # the mark of a matrix whose kept float64 values are its entries exactly


def float_matrix(array):
    """The exact matrix of a 2-d NumPy array of finite binary floats, each the dyadic rational it
    stands for; from :data:`DEFER_FROM` entries (under flint) its fmpq_mat is made only when needed."""
    import numpy as np

    values = np.array(array, dtype=np.float64)  # float16, bfloat16 and float32 values are exact in float64
    rows, cols = values.shape
    if FLINT_QQ and values.size >= DEFER_FROM:
        m = deferred_matrix(rows, cols, DyadicFloats(values))
    else:
        m = made_float_matrix(values)
    keep_float64(m, values)  # each entry is its own correctly rounded float
    m.__dict__[EXACT_FLOATS] = True
    return m


def made_float_matrix(values):
    """The matrix of the float64 array ``values`` as an fmpq_mat now.

    Floats of few significant bits over a modest range of sizes (a checkpoint's float32 or
    bfloat16 weights) are integers over one power of two, 2^K: their numerators are read as one
    int64 array, and flint reduces each fraction, with no Python number made per entry.
    Anything else goes entry by entry."""
    import numpy as np

    from .matrices import binary_float_matrix

    power = common_power(values) if FLINT_QQ and values.size else None
    if power is None:
        return binary_float_matrix(values)
    rows, cols = values.shape
    numerators = np.ldexp(values, power).astype(np.int64)  # exact: each an integer below 2^62
    return matrix_from_fmpq_mat(flint.fmpq_mat(flint.fmpz_mat(rows, cols, numerators.ravel().tolist())) / (1 << power))


def common_power(values) -> "int | None":
    """The least K ≥ 0 with every value times 2^K an integer below 2^62 in size, or None when
    there is none (53-bit floats over a wide range of sizes)."""
    import numpy as np

    nonzero = values[values != 0]
    if not nonzero.size:
        return 0
    mantissas, exponents = np.frexp(nonzero)  # value = m·2^e, 1/2 ≤ |m| < 1, m·2^53 an integer
    whole = np.abs(np.ldexp(mantissas, 53)).astype(np.int64)
    low = whole & -whole  # the lowest set bit: 2^(trailing zeros)
    bits = 53 - np.log2(low).astype(np.int64)  # significant bits of each value
    needed = bits - exponents.astype(np.int64)  # value·2^k is an integer for k ≥ needed
    power = max(0, int(needed.max()))
    if int(exponents.max()) + power > 62 or power > 1000:
        return None
    return power


class DyadicFloats:
    """What a deferred float matrix is made from: its float64 array (read-only, every entry finite)."""

    __slots__ = ("values",)

    def __init__(self, values) -> None:
        self.values = values

    def dense(self):
        from .sympy_internals import qq_dense

        return qq_dense(made_float_matrix(self.values))

    def entry(self, i: int, j: int) -> tuple[int, int]:
        return float(self.values[i, j]).as_integer_ratio()

    def part(self, rows: slice, cols: slice):
        return float_matrix(self.values[rows, cols])


def exact_floats(m) -> "numpy.ndarray | None":
    """The float64 array of a matrix read from binary floats (:func:`float_matrix`), whose entries
    are exactly those floats; None for any other matrix."""
    d = getattr(m, "__dict__", None)
    if not d or not d.get(EXACT_FLOATS):
        return None
    from .parse import matrix_float64

    return matrix_float64(m)


def deferred_floats(m) -> "numpy.ndarray | None":
    """The float64 array of a float matrix whose fmpq_mat is not made (yet), else None."""
    source = deferred_source(m)
    return source.values if isinstance(source, DyadicFloats) else None


# -- exact products in float64 ---------------------------------------------------------------

_CHUNK = 1 << 13  # columns of the float matrix sliced at a time (few, big products: BLAS calls cost)
_RANGE = 900  # the most bits of range (and of size) of the numbers integer_product takes


def integer_product(a: list[list[int]], b) -> "tuple[list[list[int]], int] | None":
    """``a·b`` exactly, for rows of Python integers ``a`` (n × k) and a float64 array ``b`` (k × m)
    of floats: ``(rows, power)``, rows of Python integers with ``a·b = rows·2^-power``; None when an
    entry of b is not finite or b's nonzero numbers span too wide a range of sizes (more than 900
    bits, or beyond 2^±900).

    Both sides are cut into signed slices of ``w`` bits (b's entries as integers over one power
    of two), ``w`` chosen so that a product of two slices summed over the k terms stays below
    2^52: a float64 matrix product of slices (a classical one, as NumPy's BLAS computes it) is then
    exact whatever order it sums in, and the slices' products are put back together in Python
    integers."""
    import numpy as np

    k, m = b.shape
    sizes = _exponent_range(b)
    if sizes is None:
        return None
    low, high = sizes
    if high - low > _RANGE or low < -_RANGE or high > _RANGE:
        return None
    power = 53 - low  # every entry of b times 2^power is an integer, below 2^(53 + high − low)
    width = max(1, (52 - math.ceil(math.log2(max(k, 2)))) // 2)
    top = max((abs(x).bit_length() for row in a for x in row), default=0)
    a_slices = _int_slices(a, k, width, max(1, -(-top // width)))  # (slices·n) × k
    b_count = max(1, -(-(53 + high - low) // width))
    n = len(a)
    out = np.empty((n, m), dtype=object)
    for first in range(0, m, _CHUNK):
        block = b[:, first:first + _CHUNK] * 2.0**power  # exact integers as float64 (a power of two)
        sums: dict[int, object] = {}
        for t, piece in enumerate(_float_slices(block, width, b_count)):
            products = (a_slices @ piece).astype(np.int64).reshape(-1, n, piece.shape[1])  # exact
            for s, part in enumerate(products):
                sums[s + t] = part if s + t not in sums else sums[s + t] + part
        total = np.zeros((n, block.shape[1]), dtype=object)
        for q, part in sums.items():
            total += part.astype(object) * (1 << (width * q))
        out[:, first:first + _CHUNK] = total
    return out.tolist(), power


def _exponent_range(b) -> "tuple[int, int] | None":
    """The least and the largest binary exponent e of b's nonzero entries (x = f·2^e, 1/2 ≤ |f| < 1);
    None when an entry is not finite."""
    import numpy as np

    low, high = None, None
    for first in range(0, b.shape[1], _CHUNK):
        block = np.abs(b[:, first:first + _CHUNK])
        largest = float(block.max()) if block.size else 0.0
        if not math.isfinite(largest):
            return None
        if largest:
            block[block == 0] = np.inf
            lo, hi = math.frexp(float(block.min()))[1], math.frexp(largest)[1]
            low = lo if low is None else min(low, lo)
            high = hi if high is None else max(high, hi)
    return (0, 0) if low is None else (low, high)


def _int_slices(a: list[list[int]], k: int, width: int, count: int):
    """The rows of integers ``a`` as ``count`` signed slices of ``width`` bits, stacked: a float64
    array of ``count·n`` rows, slice s of row i in row ``s·n + i`` (x = Σ_s slice_s·2^(width·s))."""
    import numpy as np

    n, mask = len(a), (1 << width) - 1
    out = np.zeros((count, n, k), dtype=np.float64)
    for i, row in enumerate(a):
        for j, x in enumerate(row):
            if x:
                sign, x = (-1, -x) if x < 0 else (1, x)
                s = 0
                while x:
                    out[s, i, j] = sign * (x & mask)
                    x >>= width
                    s += 1
    return out.reshape(count * n, k)


def _float_slices(block, width: int, count: int):
    """The integers of the float64 array ``block`` (taken over) as ``count`` signed slices of
    ``width`` bits, lowest first (x = Σ_t slice_t·2^(width·t)), each taken from the top by exact
    float64 steps: scaling by a power of two, dropping a fraction, subtracting the top bits."""
    import numpy as np

    rest, scratch = block, np.empty_like(block)
    pieces = []
    for t in range(count - 1, 0, -1):
        piece = np.multiply(rest, 2.0 ** (-width * t))
        np.trunc(piece, out=piece)
        np.multiply(piece, 2.0 ** (width * t), out=scratch)
        rest -= scratch  # the low bits of each number, an integer below 2^(width·t)
        pieces.append(piece)
    pieces.append(rest)
    return pieces[::-1]
