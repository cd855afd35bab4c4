"""The fast paths of symattn give exactly what the slow, general paths give.

Each test computes the same thing twice, once through the fast path and once
independently (plain SymPy matrices, ``fractions.Fraction``, mpmath at high
precision, PyYAML without the matrix cut, the problem reader with the cut
switched off), and compares the two. Random cases come from Hypothesis, run
derandomized so every run checks the same cases.

Run with:
    python -m pytest -q tests/test_exact_fast_paths.py
"""

from __future__ import annotations

import copy
import math
import pickle
import random
import re
from fractions import Fraction

import mpmath
import pytest
import sympy
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sympy import QQ, ImmutableMatrix, Rational

from symattn.exact import arb as _arb
from symattn.exact import evaluation as _evaluation
from symattn.exact import lazy as _lazy
from symattn.exact import masks as _masks
from symattn.exact import products as _products
from symattn.exact import softmax as _softmax
from symattn.numbers import matrices as _matrices
from symattn.problem import located_yaml as _yaml
from symattn.problem import matrix_spans
from symattn.errors import SymattnError
from symattn.exact.softmax import SoftmaxRow
from symattn.numbers.sympy_internals import QQMatrix, qq_dense
from symattn.numbers.parse import rationals_float64
from symattn.problem.load import parse_problem
from symattn.render.numbers import (
    exp_parts_tex,
    exp_parts_text,
    exp_sum_tex,
    exp_sum_text,
    qq_tex,
    qq_text,
)

CASES = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FEW = settings(CASES, max_examples=60)
# A test given ``reader`` runs twice: with the plain readers of decimals, and with the NumPy
# reader (symattn.problem.plain_numbers._decimal_numerators) taking every matrix, however small (it starts at
# 256 entries, past these random problems' sizes).
PATCHED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


@pytest.fixture(params=["plain reader", "numpy reader"])
def reader(request, monkeypatch):
    if request.param == "numpy reader":
        from symattn.problem import plain_numbers as _problem

        monkeypatch.setattr(_problem, "_NUMPY_FROM", 0)
    return request.param
RANDOMS = st.randoms(use_true_random=False)  # a seeded random.Random for the text generators


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def qq(f: Fraction):
    return QQ(f.numerator, f.denominator)


def rat(f: Fraction) -> sympy.Rational:
    return Rational(f.numerator, f.denominator)


def fractions(max_num: int = 10**6, max_den: int = 10**3) -> st.SearchStrategy[Fraction]:
    return st.builds(Fraction, st.integers(-max_num, max_num), st.integers(1, max_den))


# Small, medium and huge rationals; integers and zero come often.
ANY_FRACTION = st.one_of(
    st.integers(-5, 5).map(Fraction),
    fractions(20, 12),
    fractions(10**6, 10**4),
    fractions(10**40, 10**30),
)


@st.composite
def matrices(draw, max_rows: int = 5, max_cols: int = 5, entries=ANY_FRACTION):
    """(rows, cols, row-major list of Fractions)."""
    rows = draw(st.integers(1, max_rows))
    cols = draw(st.integers(1, max_cols))
    return rows, cols, draw(st.lists(entries, min_size=rows * cols, max_size=rows * cols))


def both(rows: int, cols: int, flat: list[Fraction]) -> tuple[QQMatrix, ImmutableMatrix]:
    """The fast QQMatrix and SymPy's own ImmutableMatrix with the same entries."""
    m = _matrices.rational_matrix(rows, cols, [qq(f) for f in flat])
    assert isinstance(m, QQMatrix), type(m)
    return m, ImmutableMatrix(rows, cols, [rat(f) for f in flat])


def outcome(f, *args):
    """``("ok", value)`` or ``("raises", exception type)``."""
    try:
        return "ok", f(*args)
    except Exception as exc:  # noqa: BLE001 - the type is what is compared
        return "raises", type(exc)


def assert_same_value(fast, slow, what: str) -> None:
    """Equal matrices (both ways, same shape) or identical SymPy scalars (same srepr)."""
    if isinstance(slow, sympy.MatrixBase):
        assert isinstance(fast, sympy.MatrixBase), f"{what}: {fast!r} is not a matrix"
        assert fast.shape == slow.shape, f"{what}: shape {fast.shape} != {slow.shape}"
        assert fast == slow and slow == fast, f"{what}: {fast} != {slow}"
        assert fast.tolist() == slow.tolist(), f"{what}: entries {fast.tolist()} != {slow.tolist()}"
    else:
        assert sympy.srepr(fast) == sympy.srepr(slow), f"{what}: {sympy.srepr(fast)} != {sympy.srepr(slow)}"


def assert_same_outcome(fast_m, slow_m, key) -> None:
    fast = outcome(lambda: fast_m[key])
    slow = outcome(lambda: slow_m[key])
    assert fast[0] == slow[0], f"m[{key!r}] on a {slow_m.shape} matrix: fast {fast}, SymPy {slow}"
    if fast[0] == "ok":
        assert_same_value(fast[1], slow[1], f"m[{key!r}]")
    else:
        assert fast[1] is slow[1], f"m[{key!r}]: fast raises {fast[1]}, SymPy raises {slow[1]}"


# --------------------------------------------------------------------------
# 1. QQMatrix behaves as the ImmutableMatrix with the same entries
# --------------------------------------------------------------------------


@CASES
@given(matrices(), st.data())
def test_qqmatrix_equality_and_hash(shape, data):
    rows, cols, flat = shape
    m, r = both(rows, cols, flat)
    assert m == r and r == m, f"{m} != {r}"
    assert not (m != r) and not (r != m)  # noqa: SIM202 - __ne__ itself is under test
    assert hash(m) == hash(r), f"hash {hash(m)} != {hash(r)} for {r}"
    assert {r: "slow"}[m] == "slow" and {m: "fast"}[r] == "fast"
    assert len({m, r}) == 1
    assert m == sympy.Matrix(r) and sympy.Matrix(r) == m, "a mutable Matrix with the same entries"
    # A different matrix is different, both ways.
    k = data.draw(st.integers(0, rows * cols - 1), label="changed entry")
    changed = list(flat)
    changed[k] += 1
    m2, r2 = both(rows, cols, changed)
    assert m != r2 and r2 != m and m2 != r and r != m2, f"{m} equals the changed {r2}"
    assert (m2 == r2) and hash(m2) == hash(r2)
    # The same entries in another shape are another matrix.
    if rows != cols:
        mt, rt = both(cols, rows, flat)
        assert m != rt and rt != m and mt != r


@settings(CASES, max_examples=80)
@given(matrices(max_rows=4, max_cols=4, entries=fractions(30, 8)), st.data())
def test_qqmatrix_indexing(shape, data):
    rows, cols, flat = shape
    m, r = both(rows, cols, flat)
    for i in range(-rows - 2, rows + 2):
        for j in range(-cols - 2, cols + 2):
            assert_same_outcome(m, r, (i, j))
    for k in range(-rows * cols - 2, rows * cols + 2):
        assert_same_outcome(m, r, k)
    for i in range(-rows - 1, rows + 1):
        assert_same_outcome(m, r, (i, slice(None)))
    for j in range(-cols - 1, cols + 1):
        assert_same_outcome(m, r, (slice(None), j))
    bound = max(rows, cols) + 2
    ends = st.one_of(st.none(), st.integers(-bound, bound))
    slices = st.builds(slice, ends, ends, st.sampled_from([None, 1, 2, 3, -1, -2]))
    keys = st.one_of(
        st.tuples(slices, slices),
        st.tuples(slices, st.integers(-cols - 1, cols)),
        st.tuples(st.integers(-rows - 1, rows), slices),
    )
    for key in data.draw(st.lists(keys, min_size=5, max_size=15), label="slice keys"):
        assert_same_outcome(m, r, key)
    assert_same_outcome(m, r, (slice(None, None, 2), min(1, cols - 1)))
    assert_same_outcome(m, r, (slice(None), slice(None)))
    for i in range(rows):
        assert_same_value(m.row(i), r.row(i), f"row({i})")
        assert_same_value(m.row(-1 - i), r.row(-1 - i), f"row({-1 - i})")
    for j in range(cols):
        assert_same_value(m.col(j), r.col(j), f"col({j})")
        assert_same_value(m.col(-1 - j), r.col(-1 - j), f"col({-1 - j})")
    fast_list, slow_list = list(m), list(r)
    assert [sympy.srepr(x) for x in fast_list] == [sympy.srepr(x) for x in slow_list]
    assert m.tolist() == r.tolist()
    assert len(m) == len(r) and m.shape == r.shape


@FEW
@given(matrices(max_rows=4, max_cols=4))
def test_qqmatrix_arithmetic_printing_pickling(shape):
    rows, cols, flat = shape
    m, r = both(rows, cols, flat)
    assert_same_value(m.T, r.T, "m.T")
    product = m * m.T
    assert_same_value(product, r * r.T, "m * m.T")
    assert isinstance(product, QQMatrix) and _matrices.is_rational(product), type(product)
    assert isinstance(m.T * m, QQMatrix), type(m.T * m)
    assert_same_value(m * 2, r * 2, "m * 2")
    assert_same_value(2 * m, 2 * r, "2 * m")
    assert_same_value(m * Rational(3, 7), r * Rational(3, 7), "m * 3/7")
    assert_same_value(m + m, r + r, "m + m")
    assert_same_value(m - r, sympy.zeros(rows, cols), "m - r")
    assert_same_value(-m, -r, "-m")
    root = m * sympy.sqrt(2)
    assert_same_value(root, r * sympy.sqrt(2), "m * sqrt(2)")
    assert not isinstance(root, QQMatrix), "a matrix with √2 entries is not rational"
    if any(flat):
        assert not _matrices.is_rational(root)
        assert any(x.has(sympy.sqrt(2)) for x in root), root
    assert sympy.latex(m) == sympy.latex(r)
    assert str(m) == str(r) and repr(m) == repr(r)
    assert sympy.sstr(m) == sympy.sstr(r)
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back == r and hash(back) == hash(r), f"{back} after pickling {m}"
    deep = copy.deepcopy(m)
    assert deep == m and deep == r and hash(deep) == hash(r)
    assert copy.copy(m) == r


@CASES
@given(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5), st.data())
def test_matmul_matches_fractions_and_sympy(n, k, p, data):
    a = data.draw(st.lists(ANY_FRACTION, min_size=n * k, max_size=n * k), label="a")
    b = data.draw(st.lists(ANY_FRACTION, min_size=k * p, max_size=k * p), label="b")
    fa, sa = both(n, k, a)
    fb, sb = both(k, p, b)
    product = _products.matmul(fa, fb)
    by_hand = ImmutableMatrix(
        n, p, [rat(sum((a[i * k + t] * b[t * p + j] for t in range(k)), Fraction(0))) for i in range(n) for j in range(p)]
    )
    assert_same_value(product, by_hand, "matmul(a, b) vs Fractions")
    assert_same_value(product, sa * sb, "matmul(a, b) vs SymPy")
    assert _matrices.is_rational(product)
    assert_same_value(fa * fb, sa * sb, "a * b")


# --------------------------------------------------------------------------
# 2. scaled_integer_matrix
# --------------------------------------------------------------------------


@CASES
@given(
    st.integers(1, 5),
    st.integers(1, 5),
    st.data(),
    st.one_of(st.integers(0, 30).map(lambda d: 10**d), st.integers(1, 10**25)),
)
def test_scaled_integer_matrix(rows, cols, data, denominator):
    numerators = data.draw(
        st.lists(st.one_of(st.integers(-1000, 1000), st.integers(-(10**40), 10**40)),
                 min_size=rows * cols, max_size=rows * cols),
        label="numerators",
    )
    m = _matrices.scaled_integer_matrix(rows, cols, numerators, denominator)
    expected = ImmutableMatrix(rows, cols, [Rational(x, denominator) for x in numerators])
    assert_same_value(m, expected, f"scaled_integer_matrix(…, {denominator})")
    assert _matrices.is_rational(m)
    for idx, x in enumerate(numerators):
        assert_same_value(m[idx // cols, idx % cols], Rational(x, denominator), f"entry {idx}")


# --------------------------------------------------------------------------
# 3. rationals_float64: correctly rounded, NaN beyond float64
# --------------------------------------------------------------------------

TWO53 = 2**53


def reference_float(f: Fraction) -> float:
    try:
        return float(f)  # Fraction -> float is correctly rounded
    except OverflowError:
        return math.nan


def assert_floats(flat: list[Fraction], rows: int, cols: int) -> None:
    dm = qq_dense(_matrices.rational_matrix(rows, cols, [qq(f) for f in flat]))
    for form, matrix in (("dense", dm), ("sparse", dm.to_sparse())):
        got = rationals_float64(matrix)
        assert got.shape == (rows, cols), f"{form}: shape {got.shape}"
        for k, f in enumerate(flat):
            value, want = float(got[k // cols, k % cols]), reference_float(f)
            if math.isnan(want):
                assert math.isnan(value), f"{form}: {f} is beyond float64, expected NaN, got {value!r}"
            else:
                assert value.hex() == want.hex(), f"{form}: {f} gave {value!r}, correctly rounded is {want!r}"


FLOAT_FAMILIES = st.one_of(
    st.builds(lambda n, d: Fraction(n, 10**d), st.integers(-(10**9), 10**9), st.integers(0, 7)),
    st.builds(Fraction, st.integers(-TWO53, TWO53), st.integers(1, TWO53)),
    st.builds(Fraction, st.integers(-(2**80), 2**80), st.integers(1, 2**80)),
    st.sampled_from([Fraction(TWO53), Fraction(-TWO53), Fraction(TWO53 + 1), Fraction(-TWO53 - 1),
                     Fraction(TWO53 - 1, 3), Fraction(1, TWO53), Fraction(1, TWO53 + 1), Fraction(0),
                     Fraction(10**30 + 7, 3**40), Fraction(-(10**30 + 7), 3**40),
                     Fraction(10**400, 3), Fraction(-(10**400), 7), Fraction(1, 10**400),
                     Fraction(-1, 10**400), Fraction(2**1024), Fraction(2**1024 - 2**970)]),
)


@CASES
@given(matrices(max_rows=4, max_cols=4, entries=FLOAT_FAMILIES))
def test_rationals_float64_random(shape):
    rows, cols, flat = shape
    assert_floats(flat, rows, cols)


@pytest.mark.parametrize(
    "flat",
    [
        [Fraction(1, 10), Fraction(-2, 10), Fraction(3, 10), Fraction(0)],  # small decimals: one division
        [Fraction(TWO53 - 1, 7), Fraction(-1, 7), Fraction(5, 7), Fraction(TWO53, 7)],  # at the limit
        [Fraction(TWO53 + 1, 3), Fraction(1, 3), Fraction(2, 3), Fraction(-1, 3)],  # numerator past 2**53
        [Fraction(1, 3), Fraction(1, 5), Fraction(1, 7), Fraction(1, TWO53 // 105 + 1)],  # common den. > 2**53
        [Fraction(10**30 + 7, 3**40), Fraction(-(10**30 + 7), 3**40), Fraction(0), Fraction(1)],
        [Fraction(10**400, 3), Fraction(-(10**400), 3), Fraction(1, 10**400), Fraction(-7, 2)],
        [Fraction(0), Fraction(0), Fraction(0), Fraction(0)],
    ],
    ids=["decimals", "edge-2**53", "past-2**53", "big-common-denominator", "huge", "out-of-range", "zeros"],
)
def test_rationals_float64_cases(flat):
    assert_floats(flat, 2, 2)
    assert_floats(flat, 1, 4)


@CASES
@given(matrices(max_rows=5, max_cols=4, entries=FLOAT_FAMILIES), st.integers(1, 6))
def test_rationals_float64_by_blocks_of_rows(shape, block):
    """A big matrix is rounded a block of rows at a time, each block by its own way (one division,
    binary scaling, or each fraction): still every entry correctly rounded."""
    from symattn.numbers import parse as _numbers

    rows, cols, flat = shape
    saved, _numbers._FLOAT_BLOCK = _numbers._FLOAT_BLOCK, block
    try:
        assert_floats(flat, rows, cols)
    finally:
        _numbers._FLOAT_BLOCK = saved


# --------------------------------------------------------------------------
# 4. qq_tex / qq_text write what SymPy's printers write
# --------------------------------------------------------------------------


@CASES
@given(st.one_of(ANY_FRACTION, st.integers(-(10**60), 10**60).map(Fraction), fractions(10**80, 10**80)))
def test_qq_tex_and_text_match_sympy(f):
    x = rat(f)
    assert qq_tex(x) == sympy.latex(x), f"{x!r}: {qq_tex(x)!r} != {sympy.latex(x)!r}"
    assert qq_text(x) == sympy.sstr(x, order="none"), f"{x!r}: {qq_text(x)!r} != {sympy.sstr(x, order='none')!r}"
    assert qq_tex(qq(f)) == sympy.latex(x), f"QQ {f}: {qq_tex(qq(f))!r} != {sympy.latex(x)!r}"
    assert qq_text(qq(f)) == sympy.sstr(x, order="none")
    if f.denominator == 1:
        assert qq_tex(sympy.Integer(f.numerator)) == sympy.latex(sympy.Integer(f.numerator))


# --------------------------------------------------------------------------
# 5. Softmax rows: exp_parts_* (QQ pairs) == exp_sum_* (SymPy expressions)
# --------------------------------------------------------------------------

# Distinct as rationals means distinct as floats: denominators ≤ 12, numerators ≤ 40.
EXPONENTS = st.builds(lambda p, q: Fraction(-p, q), st.integers(1, 40), st.integers(1, 12))
VALUES = st.one_of(
    st.sampled_from([Fraction(v) for v in (-2, -1, 0, 0, 1, 1, 2)] + [Fraction(1, 2), Fraction(-1, 2), Fraction(3, 4)]),
    fractions(50, 9),
)


@st.composite
def softmax_rows(draw):
    """A rational SoftmaxRow (QQ exponents ≤ 0, one exactly 0, None where masked) and a column."""
    n = draw(st.integers(1, 9), label="n")
    pool = [Fraction(0)] + draw(st.lists(EXPONENTS, min_size=0, max_size=4, unique=True), label="pool")
    raw = draw(st.lists(st.one_of(st.none(), st.sampled_from(pool)), min_size=n, max_size=n), label="raw")
    zero_at = draw(st.integers(0, n - 1), label="where the maximum is")
    raw[zero_at] = Fraction(0)
    column = draw(st.lists(VALUES, min_size=n, max_size=n), label="column")
    if draw(st.booleans(), label="cancel a group"):  # make one exponent's values sum to 0
        e = raw[zero_at] if draw(st.booleans()) else draw(st.sampled_from([x for x in raw if x is not None]))
        group = [k for k, x in enumerate(raw) if x == e]
        column[group[-1]] -= sum(column[k] for k in group)
    row = SoftmaxRow(Rational(draw(st.integers(-5, 5))), tuple(None if x is None else qq(x) for x in raw))
    return row, raw, column


def collected(raw, column) -> list[tuple[Fraction, Fraction]]:
    """Σ e^x·v collected by exponent with Fractions, zero terms dropped, largest exponent first."""
    sums: dict[Fraction, Fraction] = {}
    for x, v in zip(raw, column):
        if x is not None:
            sums[x] = sums.get(x, Fraction(0)) + v
    return [(c, x) for x, c in sorted(sums.items(), reverse=True) if c != 0]


@CASES
@given(softmax_rows())
def test_numerator_parts_render_like_sympy(case):
    row, raw, column = case
    assert row.rational
    parts = row.numerator_parts([qq(v) for v in column])
    got = [(Fraction(int(c.numerator), int(c.denominator)), Fraction(int(x.numerator), int(x.denominator)))
           for c, x in parts]
    assert got == collected(raw, column), f"raw={raw} column={column}: parts {got}"
    numerator = row.weighted_numerator([rat(v) for v in column])
    assert (not parts) == (numerator == 0), f"raw={raw} column={column}: parts {parts}, SymPy {numerator}"
    for max_terms in (3, 6):
        fast, slow = exp_parts_tex(parts, max_terms), exp_sum_tex(numerator, max_terms)
        assert fast == slow, f"raw={raw} column={column} max_terms={max_terms}:\n fast {fast!r}\n sympy {slow!r}"
        fast, slow = exp_parts_text(parts, max_terms), exp_sum_text(numerator, max_terms)
        assert fast == slow, f"raw={raw} column={column} max_terms={max_terms}:\n fast {fast!r}\n sympy {slow!r}"


@CASES
@given(softmax_rows())
def test_normaliser_parts_render_like_sympy(case):
    row, raw, _ = case
    parts = row.numerator_parts()
    ones = [Fraction(1)] * len(raw)
    assert [(Fraction(int(c.numerator), int(c.denominator)), Fraction(int(x.numerator), int(x.denominator)))
            for c, x in parts] == collected(raw, ones)
    for max_terms in (3, 6):
        assert exp_parts_tex(parts, max_terms) == exp_sum_tex(row.normaliser, max_terms), f"raw={raw}"
        assert exp_parts_text(parts, max_terms) == exp_sum_text(row.normaliser, max_terms), f"raw={raw}"
    assert exp_parts_tex(parts) == exp_sum_tex(row.normaliser)
    assert row.normaliser_is_number == row.normaliser.is_Rational, (
        f"raw={raw}: normaliser_is_number={row.normaliser_is_number}, Z={row.normaliser}"
    )


@pytest.mark.parametrize(
    ("raw", "column"),
    [
        ((0,), (5,)),  # one position
        ((0, None, None), (Fraction(-3, 4), 9, 9)),  # one allowed position
        ((0, Fraction(-1, 2), Fraction(-1, 2), Fraction(-1, 3)), (1, 2, -2, 0)),  # a group cancels
        ((0, 0, Fraction(-1, 2)), (1, -1, 3)),  # the constant term cancels
        ((0, -1, -2, -3, -4, -5, -6, -7), (1, -1, 2, -2, 3, -3, 4, -4)),  # elided: more than 6 terms
        ((0, -1, -1, -2, -3), (0, 1, 1, -1, 1)),  # like terms collect to 2
        ((0, Fraction(-7, 12), None, Fraction(-40, 11)), (-1, -1, 4, Fraction(1, 2))),
    ],
)
def test_numerator_parts_cases(raw, column):
    raw = [None if x is None else Fraction(x) for x in raw]
    column = [Fraction(v) for v in column]
    row = SoftmaxRow(Rational(0), tuple(None if x is None else qq(x) for x in raw))
    parts = row.numerator_parts([qq(v) for v in column])
    numerator = row.weighted_numerator([rat(v) for v in column])
    for max_terms in (3, 6):
        assert exp_parts_tex(parts, max_terms) == exp_sum_tex(numerator, max_terms)
        assert exp_parts_text(parts, max_terms) == exp_sum_text(numerator, max_terms)
        assert exp_parts_tex(row.numerator_parts(), max_terms) == exp_sum_tex(row.normaliser, max_terms)
    assert row.normaliser_is_number == row.normaliser.is_Rational


@CASES
@given(softmax_rows())
def test_weighted_numerator_is_sympys_own_sum(case):
    """The numerator built from collected QQ parts is the very Add SymPy builds term by term:
    same args in the same order (so ==, hash and printing agree), also over Z_i."""
    row, raw, column = case
    values = [rat(v) for v in column]
    fast = row.weighted_numerator(values)
    slow = sympy.Add(*[t * v for t, v in zip(row.terms, values) if t != 0])
    assert type(fast) is type(slow) and fast.args == slow.args, f"raw={raw} column={column}: {fast} vs {slow}"
    assert fast == slow and hash(fast) == hash(slow)
    for a, b in zip(sympy.Add.make_args(fast), sympy.Add.make_args(slow)):
        assert type(a) is type(b) and a.args == b.args and a.is_commutative == b.is_commutative
    assert sympy.sstr(fast, order="none") == sympy.sstr(slow, order="none")
    assert sympy.sstr(fast / row.normaliser, order="none") == sympy.sstr(slow / row.normaliser, order="none")


@CASES
@given(softmax_rows())
def test_normaliser_is_sympys_own_sum(case):
    """``Z_i`` of a rational row, built from its collected QQ parts, is the very Add SymPy builds
    from the row's terms: same args in the same order (so ==, hash and printing agree)."""
    row, raw, _ = case
    fast = row.normaliser
    slow = sympy.Add(*row.terms)
    assert type(fast) is type(slow) and fast.args == slow.args, f"raw={raw}: {fast} vs {slow}"
    assert fast == slow and hash(fast) == hash(slow)
    for a, b in zip(sympy.Add.make_args(fast), sympy.Add.make_args(slow)):
        assert type(a) is type(b) and a.args == b.args and a.is_commutative == b.is_commutative
    assert sympy.sstr(fast, order="none") == sympy.sstr(slow, order="none")
    assert sympy.latex(fast) == sympy.latex(slow)
    weight = next(j for j, e in enumerate(row.raw) if e is not None)
    assert sympy.sstr(row.weight(weight), order="none") == sympy.sstr(row.terms[weight] / slow, order="none")


@CASES
@given(softmax_rows())
def test_weights_and_outputs_over_z_are_sympys_own_quotients(case):
    """A weight e^x / Z_i and an output Σ_j e^x v_j / Z_i, made with Z_i's inverse unevaluated,
    are the very expressions SymPy's own division gives: same tree (srepr), ==, hash, printing."""
    row, raw, column = case
    values = [rat(v) for v in column]
    pairs = [(row.weight(j), row.terms[j] / row.normaliser) for j, e in enumerate(row.raw) if e is not None]
    pairs.append((row.weighted_sum(values), row.weighted_numerator(values) / row.normaliser))
    for fast, slow in pairs:
        assert sympy.srepr(fast) == sympy.srepr(slow), f"raw={raw} column={column}: {fast} vs {slow}"
        assert fast == slow and hash(fast) == hash(slow)
        assert sympy.sstr(fast) == sympy.sstr(slow) and sympy.latex(fast) == sympy.latex(slow)


def _random_sum(rng: random.Random) -> sympy.Expr:
    r = lambda: Rational(rng.randint(-9, 9), rng.randint(1, 6))  # noqa: E731
    makers = [r, lambda: r() * sympy.exp(r()), lambda: sympy.exp(r()), lambda: -sympy.exp(r()),
              lambda: r() * sympy.sqrt(rng.randint(2, 7)), lambda: r() * sympy.Symbol("t")]
    return sympy.Add(*[rng.choice(makers)() for _ in range(rng.randint(1, 6))])


def test_json_printer_writes_what_sstr_writes():
    """The JSON writer's printer (sums remembered, c·e^x written directly) gives sympy.sstr's text."""
    from symattn.render.json_entries import exact_text as json_exact

    rng = random.Random(11)
    for _ in range(1500):
        num = _random_sum(rng)
        z = sympy.Add(1, *[sympy.exp(Rational(-rng.randint(1, 9), rng.randint(1, 4))) for _ in range(rng.randint(1, 4))])
        c = Rational(rng.randint(-5, 5) or 1, rng.randint(1, 5))
        for x in (num, num / z, -num / z, c * num / z, sympy.Add.make_args(num)[0] / z, z, c * sympy.exp(c)):
            assert json_exact(x) == sympy.sstr(x, order="none"), x
    assert json_exact(sympy.S.NegativeInfinity) == "-oo"


def test_numerator_parts_all_cancelled_is_empty():
    """A numerator that is 0: no parts, written "0" as SymPy's 0 is."""
    row = SoftmaxRow(Rational(0), (QQ(0), QQ(-1, 2), QQ(-1, 2)))
    parts = row.numerator_parts([QQ(0), QQ(1), QQ(-1)])
    numerator = row.weighted_numerator([Rational(0), Rational(1), Rational(-1)])
    assert parts == [] and numerator == 0, (parts, numerator)
    assert exp_parts_tex(parts) == exp_sum_tex(numerator) == "0"
    assert exp_parts_text(parts) == exp_sum_text(numerator) == "0"


def test_empty_parts_render_like_zero():
    assert exp_parts_tex([]) == exp_sum_tex(sympy.Integer(0))
    assert exp_parts_text([]) == exp_sum_text(sympy.Integer(0))


# --------------------------------------------------------------------------
# 6. weights_times: A·V from the structure, against mpmath at 60 digits
# --------------------------------------------------------------------------


@st.composite
def attention(draw):
    n_q = draw(st.integers(1, 4))
    n_k = draw(st.integers(1, 6))
    d_v = draw(st.integers(1, 4))
    exps = st.one_of(st.none(), fractions(300, 50).map(lambda f: -abs(f)))
    raws = []
    for _ in range(n_q):
        raw = draw(st.lists(exps, min_size=n_k, max_size=n_k))
        raw[draw(st.integers(0, n_k - 1))] = Fraction(0)
        raws.append(raw)
    values = draw(st.lists(fractions(10**6, 10**4), min_size=n_k * d_v, max_size=n_k * d_v))
    return raws, n_k, d_v, values


TOLERANCE = mpmath.mpf("1e-28")


def close(a, b, what: str) -> None:
    assert abs(a - b) <= TOLERANCE * max(1, abs(b)), f"{what}: {a} vs {b} (difference {abs(a - b)})"


@FEW
@given(attention())
def test_weights_times_matches_mpmath(case):
    raws, n_k, d_v, values = case
    rows = tuple(SoftmaxRow(Rational(0), tuple(None if x is None else qq(x) for x in raw)) for raw in raws)
    V = _matrices.rational_matrix(n_k, d_v, [qq(v) for v in values])
    fast = _softmax.weights_times(rows, V, 30)
    assert fast is not None, "weights_times gave None for rational rows and values"
    via_rows = _arb.mp_matmul([row.evaluate(30) for row in rows], _evaluation.evaluate(V, 30), 30)
    with mpmath.workdps(60):
        for i, raw in enumerate(raws):
            exps = [mpmath.mpf(0) if x is None else mpmath.exp(mpmath.mpf(x.numerator) / x.denominator) for x in raw]
            total = mpmath.fsum(exps)
            weights = [e / total for e in exps]
            for c in range(d_v):
                want = mpmath.fsum(w * (mpmath.mpf(values[k * d_v + c].numerator) / values[k * d_v + c].denominator)
                                   for k, w in enumerate(weights))
                close(fast[i][c], want, f"weights_times[{i}][{c}] raw={raw}")
                close(via_rows[i][c], want, f"mp_matmul[{i}][{c}] raw={raw}")
    assert len(fast) == len(raws) and all(len(r) == d_v for r in fast)


@FEW
@given(attention(), st.integers(1, 3))
def test_softmax_floats_match_mpmath(case, block):
    """A and A·V as float64 from one pass over blocks of rows (blocks of 1 to 3 rows here): each
    entry the float64 nearest its 60-digit mpmath value, as the whole-matrix paths give it."""
    raws, n_k, d_v, values = case
    rows = tuple(SoftmaxRow(Rational(0), tuple(None if x is None else qq(x) for x in raw)) for raw in raws)
    V = _matrices.rational_matrix(n_k, d_v, [qq(v) for v in values])
    kept_rows = tuple(SoftmaxRow(Rational(0), row.raw) for row in rows)
    saved = _softmax.FLOAT_BLOCK, _softmax.KEEP_WEIGHTS_BELOW
    try:
        _softmax.FLOAT_BLOCK, _softmax.KEEP_WEIGHTS_BELOW = block, 0  # a long context's way: nothing kept
        weights, product = _softmax.softmax_floats(rows, V, 30)
        _softmax.KEEP_WEIGHTS_BELOW = 10**9  # a small problem's: the rows keep their weights
        kept_weights, kept_product = _softmax.softmax_floats(kept_rows, V, 30)
    finally:
        _softmax.FLOAT_BLOCK, _softmax.KEEP_WEIGHTS_BELOW = saved
    assert weights.shape == (len(raws), n_k) and product.shape == (len(raws), d_v)
    assert not any("_arb" in row.__dict__ and row.__dict__["_arb"] for row in rows), "a row kept its arb weights"
    assert all(row.__dict__.get("_arb") for row in kept_rows), "a small problem's row did not keep its weights"
    assert (kept_weights == weights).all() and (kept_product == product).all()
    whole_a = [[_arb.arb_float(w) for w in row.arb_weights(30, keep=False)] for row in rows]
    whole_av = _softmax.weights_times(rows, V, 30, _arb.arb_float)
    with mpmath.workdps(60):
        for i, raw in enumerate(raws):
            exps = [mpmath.mpf(0) if x is None else mpmath.exp(mpmath.mpf(x.numerator) / x.denominator) for x in raw]
            total = mpmath.fsum(exps)
            for k, e in enumerate(exps):
                assert weights[i, k] == float(e / total) == whole_a[i][k], (i, k, raw)
            for c in range(d_v):
                want = mpmath.fsum(e / total * (mpmath.mpf(values[k * d_v + c].numerator) / values[k * d_v + c].denominator)
                                   for k, e in enumerate(exps))
                assert product[i, c] == float(want) == whole_av[i][c], (i, c, raw)
    again = _softmax.softmax_floats(rows, V, 30)
    assert again[0] is weights and again[1] is product, "the second call (the output after the weights) recomputed"
    alone = _softmax.softmax_floats(rows, None, 30)
    assert (alone[0] == weights).all() and alone[1] is None


@FEW
@given(st.integers(1, 5), st.integers(1, 5), st.data())
def test_rows_made_when_read_are_the_kept_rows(n_q, n_k, data):
    """The mask's and the masked scores' rows made when read (a long context) are the lists kept
    for a small problem: same entries, by index, negative index, slice and iteration."""
    allowed = [[data.draw(st.booleans()) for _ in range(n_k)] for _ in range(n_q)]
    scores = _matrices.rational_matrix(n_q, n_k, [qq(data.draw(fractions(10**6, 10**3))) for _ in range(n_q * n_k)])
    saved = _lazy.MADE_ROWS_FROM
    try:
        _lazy.MADE_ROWS_FROM = 0
        made_mask = _masks.mask_matrix(allowed, None)
        made = _masks.add_mask(scores, made_mask).qq_rows
        _lazy.MADE_ROWS_FROM = 10**9
        kept_mask = _masks.mask_matrix(allowed, None)
        kept = _masks.add_mask(scores, kept_mask).qq_rows
    finally:
        _lazy.MADE_ROWS_FROM = saved
    assert isinstance(made, _lazy.LazyRows) and isinstance(kept, list)
    assert len(made) == len(kept) == n_q and list(made) == kept and made[-1] == kept[-1] and made[1:] == kept[1:]
    assert list(made_mask.qq_rows) == kept_mask.qq_rows
    for i in range(n_q):
        for j in range(n_k):
            assert (kept[i][j] is None) == (not allowed[i][j])
            if allowed[i][j]:
                assert kept[i][j] == made[i][j] == scores[i, j]
    assert _evaluation.approx(_masks.add_mask(scores, made_mask)).tolist() == _evaluation.approx(_masks.add_mask(scores, kept_mask)).tolist()


# --------------------------------------------------------------------------
# 6b. The backward pass's lazy arb products: an entry, a row, a column or the whole, read a row
#     or a column of each factor at a time, equal the exact product of the fractions
# --------------------------------------------------------------------------


def _qq_matrix(rng: random.Random, rows: int, cols: int):
    entries = [[Fraction(rng.randint(-30, 30), rng.randint(1, 9)) for _ in range(cols)] for _ in range(rows)]
    m = _matrices.rational_matrix(rows, cols, [QQ(x.numerator, x.denominator) for row in entries for x in row])
    return m, entries


def _fraction_product(a, b):
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def _transpose(a):
    return [list(col) for col in zip(*a)]


@pytest.mark.parametrize("seed", range(30))
def test_lazy_arb_products_equal_the_exact_products(seed):
    """dW = Xᵀ·(dS·K) and dX = (dS·K)·Wᵀ + (dS'·K')·W'ᵀ, as the backward pass builds them with ArbOps
    (rational factors read a row or a column at a time, a transpose never made, products of
    products): every entry, row, column and the whole within 1e-40 of the fractions' product,
    whatever is asked for first."""
    from symattn.exact.arb_ops import ArbOps

    rng = random.Random(seed)
    n, k, d = rng.randint(1, 6), rng.randint(1, 6), rng.randint(1, 6)
    X, x = _qq_matrix(rng, n, d)
    S1, s1 = _qq_matrix(rng, n, n)
    S2, s2 = _qq_matrix(rng, n, n)
    K1, k1 = _qq_matrix(rng, n, k)
    K2, k2 = _qq_matrix(rng, n, k)
    W1, w1 = _qq_matrix(rng, d, k)
    W2, w2 = _qq_matrix(rng, d, k)
    ops = ArbOps(50)
    s1_arb = ops.grid(S1)  # a whole arb_mat, as dS is
    dq1, dq2 = ops.matmul(s1_arb, K1), ops.matmul(ops.grid(S2), K2)
    dW = ops.matmul(ops.T(X), dq1)
    dX = ops.sum([ops.matmul(dq1, ops.T(W1)), ops.matmul(dq2, ops.T(W2))])
    exact_dq1 = _fraction_product(s1, k1)
    expected = {
        "dW": _fraction_product(_transpose(x), exact_dq1),
        "dX": [[p + q for p, q in zip(r1, r2)] for r1, r2 in zip(_fraction_product(exact_dq1, _transpose(w1)),
                                                               _fraction_product(_fraction_product(s2, k2), _transpose(w2)))],
    }
    tolerance = mpmath.mpf(10) ** -40

    def close(ball, want: Fraction) -> bool:
        with mpmath.workdps(80):
            return abs(_arb.arb_to_mpf(ball) - mpmath.mpf(want.numerator) / want.denominator) <= tolerance

    for name, product in (("dW", dW), ("dX", dX)):
        want = expected[name]
        rows, cols = len(want), len(want[0])
        order = rng.choice(["entries", "rows", "cols", "whole"])
        if order == "rows":
            for i in rng.sample(range(rows), min(rows, 2)):
                line = product.row(i)
                assert all(close(line[0, j], want[i][j]) for j in range(cols)), (name, "row", i)
        elif order == "cols":
            for j in rng.sample(range(cols), min(cols, 2)):
                line = product.col(j)
                assert all(close(line[i, 0], want[i][j]) for i in range(rows)), (name, "col", j)
        elif order == "whole":
            whole = product.whole()
            assert (whole.nrows(), whole.ncols()) == (rows, cols)
            assert all(close(whole[i, j], want[i][j]) for i in range(rows) for j in range(cols)), (name, "whole")
        for i in range(rows):
            for j in range(cols):
                assert close(product[i, j], want[i][j]), (name, order, i, j)


def test_a_lazy_rational_factor_is_read_at_the_working_digits():
    """A factor that is neither a rational matrix nor an arb_mat (a lazy matrix whose entries are
    fractions, as _gradient_balls reads some stages) is read into arb at the product's digits,
    not at flint's 53-bit default, whatever precision is set when it is read."""
    from symattn.exact.arb_ops import ArbOps

    rng = random.Random(3)
    fractions = [[Fraction(rng.randint(-30, 30), rng.randint(3, 9)) for _ in range(3)] for _ in range(2)]
    qq_rows = [[QQ(f.numerator, f.denominator) for f in row] for row in fractions]
    lazy = _lazy.LazyMatrix(2, 3, lambda i, j: Rational(fractions[i][j].numerator, fractions[i][j].denominator),
                             qq_rows=qq_rows)
    X, x = _qq_matrix(rng, 3, 2)
    product = ArbOps(50).matmul(lazy, X)
    want = _fraction_product(fractions, x)
    for i in range(2):
        for j in range(2):
            with mpmath.workdps(80):
                exact = mpmath.mpf(want[i][j].numerator) / want[i][j].denominator
                assert abs(_arb.arb_to_mpf(product[i, j]) - exact) <= mpmath.mpf(10) ** -45, (i, j)


# --------------------------------------------------------------------------
# 7. mpf_of_qq: correctly rounded to prec bits
# --------------------------------------------------------------------------


def exact(x: mpmath.mpf) -> Fraction:
    """The value of a finite mpf, exactly."""
    sign, man, exp, _ = x._mpf_
    return (-1) ** sign * Fraction(int(man)) * Fraction(2) ** int(exp)


@CASES
@given(st.sampled_from([24, 53, 64, 113, 200]), st.integers(1, 10**30), st.data())
def test_mpf_of_qq_small_numerator_is_mpmath_division(prec, q, data):
    p = data.draw(st.integers(-(2**min(prec, 60)) + 1, 2**min(prec, 60) - 1), label="p")
    got = _evaluation.mpf_of_qq(QQ(p, q), prec)
    with mpmath.workprec(prec):
        want = mpmath.mpf(p) / q
    assert got._mpf_ == want._mpf_, f"{p}/{q} at {prec} bits: {got._mpf_} != {want._mpf_}"


@CASES
@given(st.sampled_from([24, 53, 64, 113, 200]), st.integers(-(10**200), 10**200), st.integers(1, 10**60))
def test_mpf_of_qq_huge_within_half_ulp(prec, p, q):
    got = _evaluation.mpf_of_qq(QQ(p, q), prec)
    x = Fraction(p, q)
    if x == 0:
        assert got == 0
        return
    _, man, exp, bc = got._mpf_
    assert bc == int(man).bit_length() <= prec, f"{got} has more than {prec} bits"
    ulp = Fraction(2) ** (int(exp) + bc - prec)
    assert abs(exact(got) - x) <= ulp / 2, f"{p}/{q} at {prec} bits: {got} is off by more than half an ulp"
    with mpmath.workprec(prec + 400):  # and at much higher precision, the same judgement
        err = abs(mpmath.mpf(exact(got).numerator) / exact(got).denominator - mpmath.mpf(p) / q)
        assert err <= mpmath.mpf(ulp.numerator) / ulp.denominator / 2 * (1 + mpmath.mpf(2) ** -300)


def test_mpf_of_qq_default_precision_is_mpmaths():
    with mpmath.workprec(53):
        assert _evaluation.mpf_of_qq(QQ(1, 3))._mpf_ == (mpmath.mpf(1) / 3)._mpf_
    with mpmath.workprec(150):
        assert _evaluation.mpf_of_qq(QQ(-2, 7))._mpf_ == (mpmath.mpf(-2) / 7)._mpf_


# --------------------------------------------------------------------------
# 8. YAML: the matrix cut composes the same nodes as libyaml on the whole text
# --------------------------------------------------------------------------


def marks(node) -> tuple:
    s, e = node.start_mark, node.end_mark
    return (s.name, s.line, s.column, s.index, e.name, e.line, e.column, e.index)


def dump(node, seen=None):
    """A node tree as plain data: kinds, tags, styles, values and every mark; aliases as references."""
    if node is None:
        return None
    seen = {} if seen is None else seen
    if id(node) in seen:
        return ("alias of", seen[id(node)])
    seen[id(node)] = len(seen)
    if isinstance(node, yaml.SequenceNode):
        return ("seq", node.tag, node.flow_style, marks(node), [dump(c, seen) for c in node.value])
    if isinstance(node, yaml.MappingNode):
        return ("map", node.tag, node.flow_style, marks(node), [(dump(k, seen), dump(v, seen)) for k, v in node.value])
    return ("scalar", node.value, node.tag, node.style, marks(node))


def flow_matrices(node, out=None, seen=None) -> list:
    """Every FlowMatrix in the tree (its lazy value not touched)."""
    out = [] if out is None else out
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:
        return out
    seen.add(id(node))
    if isinstance(node, _yaml.FlowMatrix):
        out.append(node)
    elif isinstance(node, yaml.SequenceNode):
        for c in node.value:
            flow_matrices(c, out, seen)
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            flow_matrices(k, out, seen)
            flow_matrices(v, out, seen)
    return out


def node_at(node, line: int, column: int, seen=None):
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode) and (node.start_mark.line, node.start_mark.column) == (line, column):
        return node
    children = node.value if isinstance(node, yaml.SequenceNode) else (
        [x for kv in node.value for x in kv] if isinstance(node, yaml.MappingNode) else [])
    for c in children:
        found = node_at(c, line, column, seen)
        if found is not None:
            return found
    return None


def compose_without_cut(text: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matrix_spans, "flow_matrices", lambda text, max_values=None: [])
        return _yaml.compose(text, "f.yaml")


def check_cut(text: str, expected_cuts: int | None) -> None:
    """The cut tree dumps as libyaml's tree of the whole text; ``expected_cuts`` FlowMatrix nodes
    (None: not checked)."""
    try:
        full = yaml.compose(text, Loader=_yaml._CLoader)
    except yaml.YAMLError:
        with pytest.raises(SymattnError) as cut_error:
            _yaml.compose(text, "f.yaml")
        with pytest.raises(SymattnError) as plain_error:
            compose_without_cut(text)
        assert str(cut_error.value) == str(plain_error.value), text
        return
    cut = _yaml.compose(text, "f.yaml")
    found = flow_matrices(cut)
    if expected_cuts is not None:
        assert len(found) == expected_cuts, f"{len(found)} FlowMatrix nodes, expected {expected_cuts}, in:\n{text}"
    # Each FlowMatrix: its rows' text are the entries libyaml reads, and its lazy value dumps the same.
    for fm in found:
        twin = node_at(full, fm.start_mark.line, fm.start_mark.column)
        assert twin is not None, f"no sequence at {fm.start_mark} in libyaml's tree of:\n{text}"
        assert [[x.strip(" \n") for x in row.split(",")] for row in fm.rows] == [
            [s.value for s in r.value] for r in twin.value
        ], f"rows {fm.rows} in:\n{text}"
        assert marks(fm) == marks(twin)
        assert dump(fm) == dump(twin), f"FlowMatrix.value differs at {fm.start_mark} in:\n{text}"
    assert dump(cut) == dump(full), f"the cut tree differs from libyaml's for:\n{text}"
    assert dump(cut) == dump(compose_without_cut(text))


# -- generated problem-like texts ------------------------------------------------------
#
# The texts are built by plain functions from a random.Random that Hypothesis supplies
# (st.randoms): far cheaper than a Hypothesis draw per character, and as reproducible.


def number_text(rng: random.Random, style: str) -> str:
    sign = rng.choice(["", "", "-"])
    if style == "int":
        return sign + str(rng.choice([rng.randint(0, 9), rng.randint(0, 10**6)]))
    if style.startswith("dec"):
        digits = int(style[3:]) if style[3:] else rng.randint(1, 6)
        return f"{sign}{rng.randint(0, 999)}.{rng.randint(0, 10**digits - 1):0{digits}d}"
    return f"{sign}{rng.randint(0, 999)}/{rng.randint(1, 99)}"


def matrix_text(rng: random.Random, rows: int | None = None, cols: int | None = None) -> tuple[str, list[list[str]]]:
    """(text, entries as written) of a flow matrix of plain numbers in some layout."""
    rows = rows or rng.randint(1, 4)
    cols = cols or rng.randint(1, 4)
    same = f"dec{rng.randint(1, 4)}"
    styles = rng.choice([["int"], ["dec"], [same], ["frac"], ["int", "dec", "frac", same]])
    entries = [[number_text(rng, rng.choice(styles)) for _ in range(cols)] for _ in range(rows)]
    layout = rng.choice(["line", "line", "rows", "open", "blank", "spaces", "entry-break"])
    indent = lambda: " " * rng.randint(0, 9)  # odd indentation, even column 0
    row_texts = ["[" + ", ".join(r) + "]" for r in entries]
    if layout == "line":
        text = "[" + ", ".join(row_texts) + "]"
    elif layout == "spaces":
        text = "[ " + " ,  ".join("[ " + " , ".join(r) + " ]" for r in entries) + " ]"
    elif layout == "rows":  # rows on continuation lines
        text = "[" + (",\n" + indent()).join(row_texts) + "]"
    elif layout == "open":  # [ alone, each row on its line, ] alone
        text = "[\n" + "".join(indent() + rt + ",\n" for rt in row_texts[:-1]) + indent() + row_texts[-1] + "\n" + indent() + "]"
    elif layout == "blank":  # blank lines inside
        text = "[" + (",\n\n" + indent()).join(row_texts) + "\n\n" + indent() + "]"
    else:  # a line break between entries
        text = "[" + (",\n" + indent()).join("[" + (",\n" + indent()).join(r) + "]" for r in entries) + "]"
    return text, entries


NOT_PLAIN = [  # not a matrix of plain numbers: never cut
    "[[1e3, 2]]", "[[sqrt(2), 1]]", "[[-inf, 0]]", "[[.5, 1]]", "[[1., 2]]", "[[1, 2,]]", "[[1, 2],]",
    "[[[1]]]", "[[[1, 2], [3, 4]]]", "[[1, [2, 3]]]", "[[1], 2]", "[[a, 1]]", "[[0x1F]]", "[[1_000]]",
    "[[+1]]", "[[1 2]]", "[[1, 2]]\t# a tab before the comment", '[["1", 2]]', "[[1, 2], # inside\n  [3, 4]]",
]
STRAY_PLAIN = ["[[1, 2], [3]]", "[[1.5/2, 007/3]]", "[[3/0]]", "[[-0, 0.000]]", "[[1, 2]\n]"]  # cut, then refused
AFTER = ["", "", "  ", "  # a comment", " # ]] [[ 1, 2", "   #"]


def document(rng: random.Random) -> tuple[str, int | None]:
    """(text, FlowMatrix count expected, or None where a matrix-like line sits in a string)."""
    pieces, cuts, trap = [], 0, False
    names = iter(f"F{k}" for k in range(100))
    matrix = lambda: matrix_text(rng)[0]
    after = lambda: rng.choice(AFTER)
    for _ in range(rng.randint(1, 6)):
        piece = rng.choice(
            ["matrix", "matrix", "heads", "nested", "list-of-lists", "block", "folded", "quoted", "multi-quoted",
             "anchor", "anchored-map", "not-plain", "stray", "flow-map", "scalars", "comment"])
        key = next(names)
        if piece == "matrix":
            pieces.append(f"{key}: {matrix()}{after()}\n")
            cuts += 1
        elif piece == "heads":  # matrices under list items: "  - W_Q: [[...]]"
            heads = rng.randint(1, 3)
            text = f"{key}:\n"
            for _h in range(heads):
                text += f"  - W_Q: {matrix()}{after()}\n    W_K: {matrix()}\n    W_V: {matrix()}{after()}\n"
            pieces.append(text)
            cuts += 3 * heads
        elif piece == "nested":
            pieces.append(f"{key}:\n  dO: {matrix()}{after()}\n  loss: sum\n")
            cuts += 1
        elif piece == "list-of-lists":
            pieces.append(f"{key}:\n  - - X: {matrix()}\n  - - Y: 1\n")
            cuts += 1
        elif piece == "block":  # a block scalar: its lines stay text
            inside = rng.random() < 0.7
            pieces.append(f"{key}: |\n  Notes\n  X: [[1, 2]]\n" if inside else f"{key}: |\n  just text\n")
            trap |= inside
        elif piece == "folded":
            pieces.append(f"{key}: >-\n  folded\n  W_Q: [[1, 2],\n    [3, 4]]\n  end\n")
            trap = True
        elif piece == "quoted":
            pieces.append(f"{key}: \"X: [[1, 2]]\"\n{next(names)}: 'Y: [[3, 4]]'\n")
        elif piece == "multi-quoted":
            pieces.append(f"{key}: \"first\n  X: [[1, 2]]\n  last\"\n")
            trap = True
        elif piece == "anchor":  # an anchored matrix is not cut; its alias is the same node
            other = next(names)
            pieces.append(f"{key}: &a{key} {matrix()}\n{other}: *a{key}\n")
        elif piece == "anchored-map":  # a matrix cut inside an anchored mapping, reached twice
            other = next(names)
            pieces.append(f"{key}: &m{key}\n  X: {matrix()}\n{other}: *m{key}\n")
            cuts += 1
        elif piece == "not-plain":
            pieces.append(f"{key}: {rng.choice(NOT_PLAIN)}{after()}\n")
        elif piece == "stray":
            pieces.append(f"{key}: {rng.choice(STRAY_PLAIN)}{after()}\n")
            cuts += 1
        elif piece == "flow-map":
            pieces.append(f"{key}: {{\n  a: 1,\n  X: {matrix()}\n}}\n")
            cuts += 1
        elif piece == "scalars":
            pieces.append(f"{key}: causal\n{next(names)}: 4\n{next(names)}: [a, b]\n{next(names)}:\n")
        else:
            pieces.append("# X: [[1, 2]]\n")
    text = "".join(pieces)
    if rng.random() < 0.3:
        text = text.rstrip("\n")  # no final line break
    if rng.random() < 0.1:  # other line breaks YAML knows: CRLF files, or one odd break in a comment
        brk = rng.choice(["\r\n", "\r", "\x85", "\u2028", "\u2029"])
        if brk == "\r\n":  # a CRLF file is cut as its LF twin is
            return text.replace("\n", "\r\n"), None if trap else cuts
        return f"# note{brk}Z: []\n" + text, None
    return text, None if trap else cuts


@settings(CASES, max_examples=200)
@given(RANDOMS.map(document))
def test_compose_cut_matches_libyaml(doc):
    text, cuts = doc
    check_cut(text, cuts)


@pytest.mark.parametrize(
    ("text", "cuts"),
    [
        ("X: [[1, 2], [3, 4]]\n", 1),
        ("X: [[1, 2],\n    [3, 4]]  # rows\nY: [[5]]", 2),
        ("X: [[1, 2],\n[3, 4]]\n", 1),  # continuation at column 0
        ("heads:\n  - W_Q: [[1, 2],\n [3, 4]]\n    W_K: [[1]]\n    W_V: [[1]]\n", 3),  # odd indentation
        ("X: [\n\n  [1, 2],\n\n  [3, 4]\n\n]\n", 1),  # blank lines inside
        ("X: [[0.10, -0.25], [3/4, -12]] # ]]\n", 1),
        ("title: |\n  X: [[1, 2]]\nY: [[1]]\n", None),  # stays text
        ("title: \"X: [[1, 2]]\"\nY: [[1]]\n", 1),
        ("X: &a [[1, 2]]\nY: *a\n", 0),
        ("base: &b\n  X: [[1, 2]]\ncopy: *b\n", 1),
        ("X: [[1, 2,]]\n", 0),
        ("X: [[1e3, sqrt(2), -inf, .5]]\n", 0),
        ("X: [[[1]]]\n", 0),
        ("X: [[1, 2]]]\n", None),  # invalid YAML: the same error either way
        ("X: [[1, 2],\n", None),
        ("X: [[1, 2]]\nX: [[3]]\n", 2),
        ("seq:\n  - - X: [[1]]\n", 1),
        ("m: {\n  X: [[1, 2]]\n}\n", 1),
        ("X: [[1, 2]] # c\n\nY: [[3]]", 2),
        ("X: [[1, 2], [3, 4]]", 1),  # the document ends on the matrix's line: its end mark too
        ("X: [[1, 2]]  # c", 1),
        ("a: [[1, 2]]\nb: [[1, 2],\n   [3, 4]]\nX:\n- - 1\n  - 2\n- - 3\n  - 4\nY:\n- [5, 6]\nZ: 7", 4),
        ("m:\n  X: [[1, 2], [3, 4]]\n  Y:\n  - [1, 2]\n  - [3, 4]\n  Z: [[5,\n      6]]\nafter: [1]\n", 3),
    ],
)
def test_compose_cut_cases(text, cuts):
    check_cut(text, cuts)


def test_the_cut_text_keeps_line_breaks_not_blanks():
    """A placeholder keeps its span's line breaks and its last line, so libyaml's two passes
    (the check, then composing) read a few bytes per row, not the matrix's width in blanks; the
    marks are still the whole text's (check_cut)."""
    rows = "\n".join(f"- [{', '.join(str(i * 100 + j) for j in range(50))}]" for i in range(40))
    text = f"title: t\nX:\n{rows}\nY: [[{'], ['.join(', '.join(['0.5'] * 50) for _ in range(40))}]]  # c\nZ: 1\n"
    spans = matrix_spans.flow_matrices(text)
    cut = _yaml._Cut(text, spans)
    assert len(spans) == 2
    assert cut.text.count("\n") == text.count("\n")
    assert len(cut.text) < len(text) / 20
    assert cut.text.splitlines()[-1] == "Z: 1"
    check_cut(text, 2)


@given(st.text(alphabet="a \r\n\x85\u2028\u2029\ufeff", max_size=40))
@CASES
def test_odd_breaks_as_the_pattern_finds_them(text):
    """_odd_breaks counts CRs against CRLFs instead of a regular expression at every character;
    the pattern it replaced is the reference."""
    assert matrix_spans._odd_breaks(text) == (re.search("\r(?!\n)|[\x85\u2028\u2029\ufeff]", text) is not None)


@pytest.mark.parametrize("brk", ["\r", "\r\n", "\x85", "\u2028", "\u2029"])
def test_compose_cut_with_other_line_breaks(brk):
    """YAML also breaks lines at CR, NEL, U+2028 and U+2029 (once found moving a matrix into the
    "Z: []" one line above it). The cut counts "\n" only, so such a text is composed whole."""
    odd = brk != "\r\n"  # (a CR before a LF is not a line break of its own: CRLF files are cut)
    check_cut(f"# note{brk}Z: []\nX: [[1, 2]]\n", 0 if odd else 1)
    check_cut(f"Y: [[3]]\n# note{brk}Z: []\nX: [[1, 2],{brk} [3, 4]]\nW: [[5]]\n", 0 if odd else 3)
    check_cut(f"Y:{brk}- [3]{brk}X:{brk}- - 1{brk}  - 2\n", 0 if odd else 2)


def test_compose_cut_after_byte_order_mark():
    """libyaml leaves a leading BOM out of its indexes (once found making every index inside a
    FlowMatrix one too large): such a text is composed whole."""
    check_cut("\ufeffa: 1\nX: [[1, 2]]\n", 0)


# --------------------------------------------------------------------------
# 9. Problems: matrices from the cut equal the numbers written; errors are unchanged
# --------------------------------------------------------------------------

MATRIX_NAMES = ("X", "context", "Q", "K", "V", "W_O", "bias")


def summary(p) -> dict:
    out = {name: getattr(p, name) for name in MATRIX_NAMES if getattr(p, name) is not None}
    for h, head in enumerate(p.heads):
        for name in ("W_Q", "W_K", "W_V"):
            out[f"heads[{h}].{name}"] = getattr(head, name)
    return out


def parse_outcome(text: str, cut: bool, max_size: int | None = None):
    kwargs = {} if max_size is None else {"max_size": max_size}
    with pytest.MonkeyPatch.context() as mp:
        if not cut:
            mp.setattr(matrix_spans, "flow_matrices", lambda text, max_values=None: [])
        try:
            return "ok", summary(parse_problem(text, "f.yaml", **kwargs))
        except SymattnError as exc:
            return "error", str(exc)


def assert_cut_changes_nothing(text: str, max_size: int | None = None) -> None:
    fast, slow = parse_outcome(text, True, max_size), parse_outcome(text, False, max_size)
    assert fast[0] == slow[0], f"with the cut: {fast}\nwithout: {slow}\nfor:\n{text}"
    if fast[0] == "error":
        assert fast[1] == slow[1], f"the message changed with the cut:\n {fast[1]}\n {slow[1]}\nfor:\n{text}"
    else:
        assert fast[1].keys() == slow[1].keys()
        for name in fast[1]:
            assert_same_value(fast[1][name], ImmutableMatrix(slow[1][name]), name)


def reference(entries: list[list[str]]) -> ImmutableMatrix:
    return ImmutableMatrix([[rat(Fraction(x)) for x in row] for row in entries])


def qkv_problem(rng: random.Random) -> tuple[str, dict]:
    """(text, reference matrices) of a problem giving Q, K, V."""
    n_q, n_k, d_k, d_v = (rng.randint(1, 5) for _ in range(4))
    text, refs = "", {}
    for name, (r, c) in {"Q": (n_q, d_k), "K": (n_k, d_k), "V": (n_k, d_v)}.items():
        m, entries = matrix_text(rng, r, c)
        text += f"{name}: {m}{rng.choice(['', '  # weights'])}\n"
        refs[name] = reference(entries)
    return text, refs


def head_problem(rng: random.Random) -> tuple[str, dict]:
    """(text, reference matrices) of a problem with X and one head, or heads and W_O."""
    n, d_model = rng.randint(1, 4), rng.randint(1, 4)
    x, x_entries = matrix_text(rng, n, d_model)
    text, refs = f"X: {x}\n", {"X": reference(x_entries)}
    if rng.random() < 0.5:
        d_k, d_v = rng.randint(1, 3), rng.randint(1, 3)
        for name, c in (("W_Q", d_k), ("W_K", d_k), ("W_V", d_v)):
            m, entries = matrix_text(rng, d_model, c)
            text += f"{name}: {m}\n"
            refs[f"heads[0].{name}"] = reference(entries)
        return text, refs
    text += "heads:\n"
    width = 0
    for h in range(rng.randint(1, 3)):
        d_k, d_v = rng.randint(1, 3), rng.randint(1, 3)
        width += d_v
        for k, (name, c) in enumerate((("W_Q", d_k), ("W_K", d_k), ("W_V", d_v))):
            m, entries = matrix_text(rng, d_model, c)
            text += ("  - " if k == 0 else "    ") + f"{name}: {m}\n"
            refs[f"heads[{h}].{name}"] = reference(entries)
    m, entries = matrix_text(rng, width, rng.randint(1, 3))
    text += f"W_O: {m}\n"
    refs["W_O"] = reference(entries)
    return text, refs



@settings(CASES, max_examples=100, suppress_health_check=PATCHED)
@given(st.one_of(RANDOMS.map(qkv_problem), RANDOMS.map(head_problem)))
def test_problem_matrices_from_the_cut(reader, case):
    text, refs = case
    assert len(flow_matrices(_yaml.compose(text, "f.yaml"))) == len(refs), f"not every matrix was cut:\n{text}"
    kind, got = parse_outcome(text, True)
    assert kind == "ok", f"{got}\nfor:\n{text}"
    assert got.keys() == refs.keys()
    for name, want in refs.items():
        assert_same_value(got[name], want, name)
    assert_cut_changes_nothing(text)


def test_big_problem_same_decimals():
    """A model-sized matrix with every entry at 4 decimals (the scaled-integer path)."""
    import random

    rng = random.Random(1234)
    n, d = 48, 32
    x = [[f"{rng.choice(['', '-'])}{rng.randint(0, 9)}.{rng.randint(0, 9999):04d}" for _ in range(d)] for _ in range(n)]
    w = [[f"{rng.choice(['', '-'])}0.{rng.randint(0, 9999):04d}" for _ in range(4)] for _ in range(d)]
    text = "X: [" + ",\n   ".join("[" + ", ".join(r) + "]" for r in x) + "]\n"
    for name in ("W_Q", "W_K", "W_V"):
        text += f"{name}: [" + ", ".join("[" + ", ".join(r) + "]" for r in w) + "]\n"
    assert len(flow_matrices(_yaml.compose(text, "f.yaml"))) == 4
    kind, got = parse_outcome(text, True)
    assert kind == "ok", got
    assert_same_value(got["X"], reference(x), "X")
    assert_same_value(got["heads[0].W_V"], reference(w), "W_V")
    assert_cut_changes_nothing(text)


def _mixed_entry(rng: random.Random) -> str:
    """A plain integer or decimal with 0 to 12 digits after the point (the 18-digit bound met and
    passed), perhaps negative."""
    sign = rng.choice(["", "-"])
    whole = str(rng.choice([0, 1, rng.randint(0, 99), rng.randint(0, 10**rng.randint(1, 9))]))
    places = rng.choice([0, 1, 2, 3, 10, rng.randint(0, 12)])
    return sign + whole + ("." + "".join(rng.choice("0123456789") for _ in range(places)) if places else "")


@pytest.mark.parametrize("seed", range(40))
def test_rows_the_reader_checked_are_read_as_unchecked_ones(seed, monkeypatch):
    """``checked=True`` (the YAML and .csv readers matched every entry already) skips the NumPy
    reader's own match; with powers of ten written out (as yaml.safe_dump writes 1.0e-05) and
    blanks around the commas, the matrix and its kept float64 are those of the checked path and
    each entry's own Fraction."""
    from symattn.problem import plain_numbers as _problem
    from symattn.numbers.parse import matrix_float64

    monkeypatch.setattr(_problem, "_NUMPY_FROM", 0)
    rng = random.Random(seed)
    rows, cols = rng.randint(1, 5), rng.randint(1, 6)

    def entry() -> str:
        e = _mixed_entry(rng)
        if rng.random() < 0.3 and "." in e:
            e = f"{float(e):.{rng.randint(1, 4)}e}"  # 1.2346e-05 style
        return e

    entries = [[entry() for _ in range(cols)] for _ in range(rows)]
    text_rows = [rng.choice([",", ", ", " ,  "]).join(row) for row in entries]
    checked = _problem.flow_rational_matrix(text_rows, checked=True)
    plain = _problem.flow_rational_matrix(text_rows)
    flat = [Fraction(e) for row in entries for e in row]
    assert [checked[i, j] for i in range(rows) for j in range(cols)] == [Rational(x.numerator, x.denominator) for x in flat]
    assert checked == plain
    got, want = matrix_float64(checked), matrix_float64(plain)
    assert (got is None) == (want is None)
    if got is not None:
        assert got.tolist() == want.tolist() == [[float(x) for x in flat[i * cols:(i + 1) * cols]] for i in range(rows)]


@pytest.mark.parametrize("seed", range(60))
def test_mixed_decimals_are_read_as_their_fractions(seed, monkeypatch):
    """Rows of numbers with differing counts of decimals (how safe_dump writes weights, or exact
    multiples of 1/1024) read with NumPy: every entry is its own Fraction, and the float64 the
    matrix keeps for the cross-check is that Fraction correctly rounded."""
    from symattn.problem import plain_numbers as _problem
    from symattn.numbers.parse import matrix_float64

    monkeypatch.setattr(_problem, "_NUMPY_FROM", 0)  # small matrices too, so each case is quick
    rng = random.Random(seed)
    rows, cols = rng.randint(1, 6), rng.randint(1, 7)
    entries = [[_mixed_entry(rng) for _ in range(cols)] for _ in range(rows)]
    blank = rng.choice(["", " ", "  ", "\n   "])
    text = ("," + blank).join(e for row in entries for e in row)
    decimals = max((len(e) - e.index(".") - 1 for row in entries for e in row if "." in e), default=0)
    read = _problem._decimal_numerators(blank + text + blank)
    flat = [Fraction(e) for row in entries for e in row]
    digits_before = max(len(e.split(".")[0]) for row in entries for e in row)
    if digits_before + decimals > 18:
        assert read is None  # past int64: the padding passes read it
    else:
        numerators, got = read
        assert got == decimals
        assert numerators.tolist() == [x * 10**decimals for x in flat]
    m = _problem.flow_rational_matrix([", ".join(row) for row in entries])
    assert m is not None
    assert [m[i, j] for i in range(rows) for j in range(cols)] == [Rational(x.numerator, x.denominator) for x in flat]
    kept = matrix_float64(m)
    assert kept.tolist() == [[float(Fraction(e)) for e in row] for row in entries]


def test_a_large_matrix_of_decimals_is_read_with_numpy_and_keeps_its_floats():
    """At the size the NumPy reader starts (and above), uniform and mixed decimals and integers:
    the entries and the kept float64 are each entry's own."""
    from symattn.problem import plain_numbers as _problem
    from symattn.numbers.parse import _FLOAT64

    rng = random.Random(11)
    for rows, cols, style in [(16, 16, "uniform"), (20, 30, "mixed"), (17, 17, "integers")]:
        assert rows * cols >= _problem._NUMPY_FROM
        if style == "uniform":
            entries = [[f"{rng.uniform(-5, 5):.4f}" for _ in range(cols)] for _ in range(rows)]
        elif style == "mixed":
            entries = [[str(rng.randint(-999, 999)) + rng.choice(["", "." + str(rng.randint(0, 10**rng.randint(1, 10) - 1))])
                        for _ in range(cols)] for _ in range(rows)]  # scaled: at most 13 digits, below 2^53
        else:
            entries = [[str(rng.randint(-10**6, 10**6)) for _ in range(cols)] for _ in range(rows)]
        m = _problem.flow_rational_matrix([", ".join(row) for row in entries])
        flat = [Fraction(e) for row in entries for e in row]
        assert [m[i, j] for i in range(rows) for j in range(cols)] == [Rational(x.numerator, x.denominator)
                                                                       for x in flat], style
        assert _FLOAT64 in m.__dict__, f"{style}: the float64 values were not kept"
        assert m.__dict__[_FLOAT64].tolist() == [[float(Fraction(e)) for e in row] for row in entries], style


@pytest.mark.parametrize("text", ["1.,2", ".5,1", "1e5,2", "--1,2", "1.2.3,4", "1,,2", "1 2,3", "+1,2", "0x1,2",
                                  "1,2,", "1\t,2", "1/2,3"])
def test_mixed_decimals_refuse_anything_else(text):
    from symattn.problem import plain_numbers as _problem

    assert _problem._decimal_numerators(text) is None


def test_int64s_reads_what_split_reads():
    from symattn.problem import plain_numbers as _problem

    text = "999999999999999999,-999999999999999999,0,-0,-5,7,9007199254740993"
    assert _problem._int64s(text, 7).tolist() == [int(x) for x in text.split(",")]
    assert _problem._int64s("12,-3", 2).tolist() == [12, -3]
    assert _problem._int64s("010,08,-010", 3).tolist() == [10, 8, -10]  # base ten, as symattn reads 010


QKV_TAIL = "K: [[1, 0], [0, 1]]\nV: [[1], [2]]\n"


@pytest.mark.parametrize(
    "text",
    [
        "Q: [[1, 2], [3]]\n" + QKV_TAIL,  # ragged
        "Q: [[1, 2],\n    [3, 4, 5]]\n" + QKV_TAIL,  # ragged on a continuation line
        "Q: [[1, abc]]\n" + QKV_TAIL,
        "Q: [[1.5/2, 1]]\n" + QKV_TAIL,  # a number after all: 3/4
        "Q: [[007/3, 1]]\n" + QKV_TAIL,
        "Q: [[3/0, 1]]\n" + QKV_TAIL,
        "Q: [[1/05, 1]]\n" + QKV_TAIL,
        "Q: [[1.25, 0.5]]\nK: [[1, 0], [0, 1], [2, 2]]\nV: [[1], [2]]\n",  # K and V disagree
        "Q: [[1, 2, 3]]\n" + QKV_TAIL,  # Q and K disagree
        "Q: [[1, 2]]\nK: [[1, 0],\n  [0, 1]]\nV: [[1], [2], [3]]\n",
        "X: [[1, 2]]\nheads:\n  - W_Q: [[1], [2]]\n    W_K: [[1], [2, 3]]\n    W_V: [[1], [2]]\nW_O: [[1]]\n",
        "X: [[1, 2]]\nheads:\n  - W_Q: [[1], [2]]\n    W_K: [[1], [2]]\n    W_V: [[1], [2]]\nW_O: [[1], [2]]\n",
        "X: [[1, 2]]\nW_Q: [[1], [2]]\nW_K: [[1], [2]]\nW_V: [[1], [x]]\n",
        "Q: [[1, 2]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nbias: [[0, 1, 2]]\n",
        "Q: [[1, 2]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nmask: [[0, 0]]\n",
        # an entry error inside a cut matrix: its nodes are composed for the message
        "Q: [[1, 2]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nmask: [[1, 0],\n       [1, 7]]\n",
        "X: [[1, 2]]\nheads:\n  - W_Q: [[1], [2]]\n    W_K: [[1], [2]]\n    W_V: [[1], [2]]\n"
        "  - W_Q: [[1], [2]]\n    W_K: [[1], [q]]\n    W_V: [[1], [2]]\nW_O: [[1], [2]]\n",
    ],
)
def test_problem_errors_unchanged_by_the_cut(text):
    assert_cut_changes_nothing(text)


@pytest.mark.parametrize("max_size", [0, 1, 2, 3, 5, 8, 9, 10, 11, 12, 13, 100])
def test_size_limit_message_unchanged_by_the_cut(max_size):
    text = "Q: [[1, 2], [3, 4]]\nK: [[1, 0],\n    [0, 1],\n    [2, 2]]\nV: [[1], [2], [3]]\n"  # 4 + 6 + 3 numbers
    fast = parse_outcome(text, True, max_size)
    assert fast[0] == ("ok" if max_size >= 13 else "error"), fast
    assert_cut_changes_nothing(text, max_size)


CORRUPTIONS = ["abc", "1.5/2", "", "1e3", "3/0", "007/3", "sqrt(2)", "-inf", "x", "0.1.2", "1/", "--1", "true"]


@settings(CASES, max_examples=80, suppress_health_check=PATCHED)
@given(RANDOMS.map(qkv_problem), st.data())
def test_corrupted_problems_unchanged_by_the_cut(reader, case, data):
    text, refs = case
    how = data.draw(st.sampled_from(["entry", "drop", "limit"]), label="corruption")
    if how == "entry":  # one entry replaced (the first row of one matrix)
        name = data.draw(st.sampled_from(["Q", "K", "V"]), label="matrix")
        start = text.index(f"{name}: [") + len(name) + 2
        first = text.index("[", start + 1) + 1
        end = min(i for i in (text.index(",", first) if "," in text[first:] else len(text), text.index("]", first)))
        text = text[:first] + data.draw(st.sampled_from(CORRUPTIONS), label="entry") + text[end:]
        assert_cut_changes_nothing(text)
    elif how == "drop":  # one row loses its last entry (ragged unless it had only one)
        name = data.draw(st.sampled_from(["Q", "K", "V"]), label="matrix")
        start = text.index(f"{name}: [")
        close = text.index("]", start)
        comma = text.rfind(",", start, close)
        if comma > text.index("[", start + len(name) + 3):
            text = text[:comma] + text[close:]
        assert_cut_changes_nothing(text)
    else:
        total = sum(m.rows * m.cols for m in refs.values())
        assert_cut_changes_nothing(text, data.draw(st.integers(0, total + 1), label="max_size"))


def test_problem_with_lone_carriage_return():
    """A lone CR in a comment once moved the last matrix into "symbols: []" one line above."""
    text = "X: [[1, 2]]\nW_Q: [[1], [0]]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\n# note\rsymbols: []\ncontext: [[1, 0]]\n"
    assert parse_outcome(text, False)[0] == "ok"
    assert_cut_changes_nothing(text)


def test_arb_float_is_the_midpoint_rounded_to_float64():
    """arb_float (flint's own rounding) against the midpoint's mantissa and exponent rounded by
    Python, over the whole range: subnormal results, and NaN beyond float64's range."""
    import flint

    def reference(x) -> float:
        man, exp = x.mid().man_exp()
        try:
            return math.ldexp(float(int(man)), int(exp))
        except OverflowError:
            return math.nan

    rng = random.Random(3)
    old = flint.ctx.prec
    flint.ctx.prec = 143
    try:
        for _ in range(20000):
            x = flint.arb(flint.fmpq(rng.randint(1, 10**40), rng.randint(1, 10**40))) * flint.arb(2) ** rng.randint(-1120, 1100)
            x = -x if rng.random() < 0.5 else x
            expected, got = reference(x), _arb.arb_float(x)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (x, got, expected)
    finally:
        flint.ctx.prec = old


def test_rational_rows_read_from_the_fmpq_mat_are_its_entries():
    """rational_rows over flint's fmpq_mat (rows read entry by entry) gives the entries to_list gives:
    indexing from either end, slices, iteration, zip(*rows), len."""
    rng = random.Random(4)
    for _ in range(30):
        rows, cols = rng.randint(1, 5), rng.randint(1, 5)
        m = _matrices.rational_matrix(rows, cols, [QQ(rng.randint(-50, 50), rng.randint(1, 9)) for _ in range(rows * cols)])
        expected = [[m[i, j] for j in range(cols)] for i in range(rows)]  # SymPy's Rationals
        got = _lazy.rational_rows(m)
        assert len(got) == rows and [list(r) for r in got] == expected
        assert [[got[i][j] for j in range(-cols, 0)] for i in range(-rows, 0)] == expected
        assert [list(c) for c in zip(*got)] == [list(c) for c in zip(*expected)]
        assert [list(r) for r in got[1:]] == expected[1:] and list(got[0][1:]) == expected[0][1:]
        with pytest.raises(IndexError):
            got[rows]
        with pytest.raises(IndexError):
            got[0][cols]


# --------------------------------------------------------------------------
# 10. YAML lists of rows (flow rows, safe_dump's block style), CRLF, and .csv files
# --------------------------------------------------------------------------


def list_text(rng: random.Random, entries: list[list[str]], indent: int, layout: str) -> str:
    """The lines of a list of rows at ``indent`` spaces (no key line, no final line break):
    ``- [1, 2]`` per row (``rows``) or ``- - 1`` then ``  - 2`` (``block``), perhaps with
    trailing spaces."""
    ind = " " * indent
    pad = lambda: rng.choice(["", "", "", " ", "   "])  # noqa: E731
    if layout == "rows":
        sep = lambda: rng.choice([", ", ", ", ",", " ,  "])  # noqa: E731
        lines = [f"{ind}- [{rng.choice(['', ' '])}" + "".join(x + sep() for x in r[:-1]) + r[-1] + "]" + pad()
                 for r in entries]
    else:
        lines = [f"{ind}{'- ' if j == 0 else '  '}- {x}{pad()}" for r in entries for j, x in enumerate(r)]
    return "\n".join(lines)


def safe_dump_entries(rng: random.Random, rows: int, cols: int) -> list[list[str]]:
    """Entries as yaml.safe_dump writes floats of a few decimals (trailing zeros dropped,
    1.0 for 1) and ints: mixed counts of decimals."""
    def one():
        if rng.random() < 0.15:
            return str(rng.randint(-50, 50))
        if rng.random() < 0.1:  # 1.5e-05, 2.0e+20: written with a power of ten
            return yaml.safe_dump(float(f"{rng.randint(-999, 999)}e{rng.choice([-9, -5, 17, 20])}")).split("\n")[0]
        return yaml.safe_dump(round(rng.uniform(-3, 3), rng.randint(0, 4))).split("\n")[0]
    return [[one() for _ in range(cols)] for _ in range(rows)]


# Lists that must not be cut (or must still compose as libyaml does): item lines with anchors,
# aliases, tags, comments, quotes, tabs, odd indentation, an exponent, a list that goes on.
LIST_TRAPS = [
    "X: &a\n- [1, 2]\nY: *a\n", "X:\n- &r [1, 2]\n- [3, 4]\nY: *r\n", "X:\n- [1, 2]  # first\n- [3, 4]\n",
    "X:\n- - 1\n  # inside\n  - 2\n", "X:\n- - !!float 1\n  - 2\n", "X:\n- !!python/object:os.system [1]\n",
    "X: !!python/tuple\n- [1, 2]\n", "X:\n- - '1'\n  - 2\n", "X:\n- [\"1\", 2]\n", "X:\n-\t[1, 2]\n",
    "X:\n- [1, 2]\n  - [3, 4]\n", "X:\n- - 1\n   - 2\n", "X:\n- - 1\n  - 2\n    3\n", "X:\n- [1e3, 2]\n",
    "X:\n- [1, 2]\n-\n", "X:\n- [1, 2]\n- [3, 4]\n\t\n", "X:\n- - 1\n  - 2\n-   - 3\n    - 4\n",
    "X:\n- [1, 2]\n-  [3, 4]\n", "X:\n- [1, [2]]\n", "X:\n- []\n", "X:\n- - 1\n- 2\n", "X:\n- [1, 2],\n",
    "heads:\n  - W_Q:\n  - [1, 2]\n", "X:\n- [1, 2]\n- - 3\n  - 4\n", "X:\n- - 1\n  - - 2\n",
    "X:\n- [1, 2]\n- [3, 4]\n# end\n  - [5, 6]\n", "t: |\n  X:\n  - [1, 2]\nY:\n- [3]\n",
    "t: \"a\n  X:\n  - [1, 2]\n  b\"\n", "X:\n- - *a\n", "X:\n- - -\n", "X:\n- - 1.\n", "X:\n- - .5\n",
    "X:\n- [1, 2]\n-1: 3\n", "X:\n- [1, 2]\n- [3, 4]]\n", "X:\n- - 1\n  - 2\n  Y: 3\n",
]


def list_document(rng: random.Random) -> tuple[str, int | None]:
    """(text, ListMatrix/FlowMatrix count expected, or None where a trap makes it unclear)."""
    pieces, cuts, unsure = [], 0, False
    names = iter(f"L{k}" for k in range(100))
    for _ in range(rng.randint(1, 5)):
        piece = rng.choice(["rows", "rows", "block", "block", "heads", "nested", "one-line", "trap", "trap",
                            "comment", "scalars"])
        key = next(names)
        rows, cols = rng.randint(1, 4), rng.randint(1, 4)
        entries = safe_dump_entries(rng, rows, cols) if rng.random() < 0.5 else matrix_text(rng, rows, cols)[1]
        layout = rng.choice(["rows", "block"])
        if piece in ("rows", "block"):
            indent = rng.choice([0, 0, 2])
            pieces.append(f"{key}:{rng.choice(['', '  '])}\n{list_text(rng, entries, indent, piece)}\n")
            cuts += 1
        elif piece == "heads":  # lists under keys of list items, indented or not
            text = f"{key}:\n"
            for _h in range(rng.randint(1, 2)):
                for k, name in enumerate(("W_Q", "W_K", "W_V")):
                    indent = 4 + rng.choice([0, 2])
                    text += ("  - " if k == 0 else "    ") + f"{name}:\n{list_text(rng, entries, indent, layout)}\n"
                    cuts += 1
            pieces.append(text)
        elif piece == "nested":  # a list in a mapping, then a comment and a blank line
            pieces.append(f"{key}:\n  dO:\n{list_text(rng, entries, 2, layout)}\n\n  # loss next\n  loss: sum\n")
            cuts += 1
        elif piece == "one-line":
            pieces.append(f"{key}: {matrix_text(rng, rows, cols)[0]}\n")
            cuts += 1
        elif piece == "trap":
            pieces.append(rng.choice(LIST_TRAPS).replace("X:", f"{key}:").replace("Y:", f"{next(names)}:")
                          .replace("heads:", f"{key}h:").replace("t:", f"{key}t:"))
            unsure = True
        elif piece == "comment":
            pieces.append(f"# {key}:\n# - [1, 2]\n")
        else:
            pieces.append(f"{key}: causal\n{next(names)}: [a, b]\n")
    text = "".join(pieces)
    if rng.random() < 0.3:
        text = text.rstrip("\n")
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    elif rng.random() < 0.1:  # a file with both line ends
        text = "\r\n".join(text.split("\n", 2)[:2]) + ("\n" + text.split("\n", 2)[2] if text.count("\n") >= 2 else "")
    return text, None if unsure else cuts


@settings(CASES, max_examples=300)
@given(RANDOMS.map(list_document))
def test_compose_cut_of_lists_matches_libyaml(doc):
    text, cuts = doc
    check_cut(text, cuts)


@pytest.mark.parametrize(
    ("text", "cuts"),
    [
        ("X:\n- [1, 2]\n- [3, 4]\n", 1),
        ("X:\n- - 1\n  - 2\n- - 3\n  - 4\n", 1),
        ("X:\n  - [1, 2]\n  - [3, 4]\nY:\n    - - 0.5\n      - -1.25\n", 2),
        ("heads:\n  - W_Q:\n    - [1]\n    W_K:\n      - - 2\n  - W_Q:\n    - [3]\n", 3),
        ("X:\r\n- [1, 2]\r\n- [3, 4]\r\nY: [[1, 2],\r\n  [3, 4]]\r\n", 2),
        ("X:\r\n- - 1\r\n  - 2\r\n", 1),
        ("X:\n- [1, 2]\n\n# weights\n\nY:\n- - 1\n", 2),
        ("X:\n- [1, 2]   \n- [3, 4] \n", 1),
        ("X:\n- [1, 2]\n# c\n  - [5, 6]\n", None),  # invalid YAML or not, as libyaml says
    ] + [(trap, None) for trap in LIST_TRAPS],
)
def test_compose_cut_of_lists_cases(text, cuts):
    check_cut(text, cuts)
    if "\r" not in text:
        check_cut(text.replace("\n", "\r\n"), cuts)


def test_tags_in_lists_are_refused_as_before():
    """A tag on an entry of a list of rows is never cut out of sight: refused where it stands."""
    for text in ["Q:\n- [1, 2]\n- !!python/object:os.system [3, 4]\nK:\n- [1, 0]\nV:\n- [1]\n",
                 "Q:\n- - 1\n  - !!python/name:os.system 2\nK:\n- [1, 0]\nV:\n- [1]\n",
                 "Q: !!python/tuple\n- [1, 2]\nK:\n- [1, 0]\nV:\n- [1]\n"]:
        kind, message = parse_outcome(text, True)
        assert kind == "error" and "is not allowed" in message and "f.yaml:" in message, message
        assert_cut_changes_nothing(text)


def layout_problem(rng: random.Random) -> tuple[str, dict]:
    """(text, reference matrices) of a Q, K, V problem, each matrix in its own layout."""
    n_q, n_k, d_k, d_v = (rng.randint(1, 4) for _ in range(4))
    text, refs = "mask: none\n", {}
    for name, (r, c) in {"Q": (n_q, d_k), "K": (n_k, d_k), "V": (n_k, d_v)}.items():
        entries = safe_dump_entries(rng, r, c) if rng.random() < 0.5 else matrix_text(rng, r, c)[1]
        layout = rng.choice(["rows", "block", "one-line"])
        if layout == "one-line" and any("e" in x for row in entries for x in row):
            layout = "block"  # a power of ten is read from the text in lists of rows only
        if layout == "one-line":
            text += f"{name}: [" + ", ".join("[" + ", ".join(row) + "]" for row in entries) + "]\n"
        else:
            text += f"{name}:\n{list_text(rng, entries, rng.choice([0, 2]), layout)}\n"
        refs[name] = reference(entries)
    if rng.random() < 0.3:
        text = text.replace("\n", "\r\n")
    return text, refs


@settings(CASES, max_examples=100, suppress_health_check=PATCHED)
@given(RANDOMS.map(layout_problem))
def test_problem_matrices_from_lists(reader, case):
    text, refs = case
    assert len(flow_matrices(_yaml.compose(text, "f.yaml"))) == len(refs), f"not every matrix was cut:\n{text}"
    kind, got = parse_outcome(text, True)
    assert kind == "ok", f"{got}\nfor:\n{text}"
    for name, want in refs.items():
        assert_same_value(got[name], want, name)
    assert_cut_changes_nothing(text)


LIST_CORRUPTIONS = CORRUPTIONS + ["!!float 1", "!!python/object:os.system 1", "&a 1", "*a", "'1'", "1 # c", "[1]",
                                  "1.5e-3", "+1", "1_0", "0x1F", "\t1"]


@settings(CASES, max_examples=120, suppress_health_check=PATCHED)
@given(RANDOMS.map(layout_problem), st.data())
def test_corrupted_lists_unchanged_by_the_cut(reader, case, data):
    """One entry replaced, a row made ragged, or the size limit tightened: the same message."""
    text, refs = case
    how = data.draw(st.sampled_from(["entry", "drop", "limit"]), label="corruption")
    if how == "limit":
        total = sum(m.rows * m.cols for m in refs.values())
        assert_cut_changes_nothing(text, data.draw(st.integers(0, total + 1), label="max_size"))
        return
    numbers = [m for m in re.finditer(r"(?<=[-\[ ,])-?[0-9][0-9./]*", text)
               if text.rfind("\n", 0, m.start()) > text.find("\n")]  # not the mask line
    m = numbers[data.draw(st.integers(0, len(numbers) - 1), label="entry")]
    if how == "entry":
        text = text[:m.start()] + data.draw(st.sampled_from(LIST_CORRUPTIONS), label="text") + text[m.end():]
    else:  # the entry and what separates it from the one before, gone
        line_start = text.rfind("\n", 0, m.start()) + 1
        cut_from = max(text.rfind(",", line_start, m.start()), line_start)
        text = text[:cut_from] + text[m.end():]
    assert_cut_changes_nothing(text)


@pytest.mark.parametrize("max_size", [0, 1, 2, 3, 5, 8, 9, 10, 11, 12, 13, 100])
@pytest.mark.parametrize("layout", ["rows", "block"])
def test_size_limit_message_unchanged_for_lists(max_size, layout):
    rng = random.Random(max_size)
    k = list_text(rng, [["1", "0"], ["0", "1"], ["2", "2"]], 0, layout)
    text = "Q: [[1, 2], [3, 4]]\nK:\n" + k + "\nV:\n" + list_text(rng, [["1"], ["2"], ["3"]], 2, layout) + "\n"
    assert_cut_changes_nothing(text, max_size)
    ragged = "Q: [[1, 2]]\nK:\n" + list_text(rng, [["1", "0"], ["0", "1", "5"]], 0, layout) + "\nV: [[1], [2]]\n"
    assert_cut_changes_nothing(ragged, max_size)


# -- .csv files ----------------------------------------------------------------------

def csv_text(rng: random.Random) -> tuple[str, list[list[str]]]:
    rows, cols = rng.randint(1, 5), rng.randint(1, 5)
    entries = safe_dump_entries(rng, rows, cols) if rng.random() < 0.5 else [
        [number_text(rng, rng.choice(["int", "dec", "dec3"])) for _ in range(cols)] for _ in range(rows)]
    sep = rng.choice([",", ",", ", ", " , "])
    lines = [rng.choice(["", "", " "]) + sep.join(r) + rng.choice(["", "", "  "]) for r in entries]
    for _ in range(rng.randint(0, 2)):  # blank lines anywhere
        lines.insert(rng.randint(0, len(lines)), rng.choice(["", "   "]))
    end = rng.choice(["\n", "\r\n"])
    text = end.join(lines) + rng.choice([end, ""])
    return text, entries


CSV_CORRUPTIONS = ["abc", "1/2", "", "1e3", "+1", ".5", "1.", '"1"', "\t1", "1 2", "-", "nan", "0x1F",
                   "1" * 31, "0." + "1" * 31, "1\r2", ",", "1;2", "\x00"]


def csv_outcome(text: str, fast: bool):
    import tempfile
    from pathlib import Path

    from symattn.problem import tables as problem_module

    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as mp:
        if not fast:
            mp.setattr(problem_module, "_plain_csv_matrix", lambda text: None)
        Path(folder, "m.csv").write_bytes(text.encode("utf-8"))
        try:
            p = parse_problem("Q: {file: m.csv}\nK: {file: m.csv}\nV: {file: m.csv}\nmask: none\n", "f.yaml",
                              base_dir=Path(folder).resolve())
            return "ok", p.Q
        except SymattnError as exc:
            return "error", str(exc)


@settings(CASES, max_examples=150, suppress_health_check=PATCHED)
@given(RANDOMS.map(csv_text), st.data())
def test_csv_fast_path_matches_the_csv_module(reader, case, data):
    text, entries = case
    if data.draw(st.booleans(), label="corrupt"):
        k = data.draw(st.integers(0, len(entries) * len(entries[0]) - 1), label="entry")
        old = entries[k // len(entries[0])][k % len(entries[0])]
        at = [m.start() for m in re.finditer(re.escape(old), text)]
        spot = at[data.draw(st.integers(0, len(at) - 1), label="where")]
        text = text[:spot] + data.draw(st.sampled_from(CSV_CORRUPTIONS), label="text") + text[spot + len(old):]
    fast, slow = csv_outcome(text, True), csv_outcome(text, False)
    assert fast[0] == slow[0], f"fast {fast}, slow {slow} for {text!r}"
    if fast[0] == "ok":
        assert_same_value(fast[1], ImmutableMatrix(slow[1]), "Q")
    else:
        assert fast[1] == slow[1]


def test_csv_fast_path_values():
    """The fast path's values, checked against Fraction on the written text (not the slow path)."""
    rng = random.Random(7)
    for _ in range(30):
        text, entries = csv_text(rng)
        kind, q = csv_outcome(text, True)
        assert kind == "ok", q
        assert type(q) is QQMatrix, "the fast path was not taken"
        assert_same_value(q, reference(entries), "Q")


@pytest.mark.parametrize(
    "text",
    [
        "- " * 1_000_000 + "x:\n- [1]\n",  # a key after a million "- " (the non-possessive prefix kept 146 MiB)
        "- " * 1_000_000 + "x: [[1]]\n",
        "a:\n- - 1\n" + "  - 1\n" * 300_000 + "  - 1 # a comment ends it\n",
        "a:\n" + "- [1, 2]\n" * 300_000 + "  - [3]\n",
        "a: [" + "[1, 2], " * 300_000 + "[3]]\n",
    ],
)
def test_scans_keep_no_state_per_item(text):
    """Looking for matrices holds a few bytes per item at most: every repeat is possessive."""
    import tracemalloc

    tracemalloc.start()
    try:
        matrix_spans.flow_matrices(text, 10**8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * len(text), f"{peak / 2**20:.0f} MiB for a {len(text) / 1e6:.1f} MB text"
