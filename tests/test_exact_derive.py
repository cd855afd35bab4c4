"""The exact derivation, checked against references written here from scratch.

Nothing in this file trusts symattn's own numbers. Every worked example is
re-read from its YAML *text* (``yaml.BaseLoader`` keeps every scalar a string,
so ``0.1`` never becomes a binary float), every entry is turned into a
``fractions.Fraction`` by hand, and the whole forward pass
``softmax(Q Kᵀ·scale + M) V`` is recomputed three ways:

* exactly in ``Fraction`` up to the scores S (so Q, K, V and S can be compared
  with symattn's exact matrices by equality),
* in mpmath at 40 digits from there on (scale, mask, max-subtracted softmax, O),
* in NumPy float64, starting again from the float inputs.

symattn's exact entries are evaluated with ``sympy.N(entry, 40)`` directly,
never through symattn's own ``evaluate`` (which is checked separately).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn import SymattnError
from _reference import fmatmul, fmatrix, frac, ftranspose

ROOT = Path(__file__).resolve().parent.parent
# The single-head numeric examples; heads and symbols have their own references in test_exact_family.py,
# RoPE in test_exact_rope.py; positional encodings (sines and cosines, not fractions) in test_problem_positions.py;
# weights from a checkpoint's layout (from:) in test_problem_layouts.py; a norm (square roots of each row's
# variance) in test_norm.py; linear attention (no scores, no softmax) in test_exact_linear.py; soft-capping
# and the temperature (scores changed before the softmax) in test_score_changes.py, QK-norm in test_qk_norm.py,
# multi-head latent attention (Q, K, V assembled from a latent) in test_exact_mla.py; differential attention
# (two maps, O = (A₁ − λA₂)·V) in test_differential.py.
EXAMPLES = sorted(
    p for p in (ROOT / "worked_examples").glob("*.yaml")
    if not any(line.startswith(("heads:", "symbols:", "rope:", "positions:", "from:", "norm:", "linear:", "softcap:",
                                "temperature:", "qk_norm:", "mla:", "differential:"))
               for line in p.read_text("utf-8").splitlines())
)
EXAMPLE_IDS = [p.stem for p in EXAMPLES]

REF_DPS = 40  # digits of the mpmath reference
EXACT_TOL = mpmath.mpf("1e-25")  # exact (40 digits) against the mpmath reference
FLOAT_TOL = 1e-12  # anything against NumPy / PyTorch float64

NEG_INF_TEXT = {"-inf", "-.inf", "-.Inf", "-.INF", "-infinity", "-Infinity", "-oo"}


# ---------------------------------------------------------------------------
# An independent reading of a problem file
# ---------------------------------------------------------------------------


@dataclass
class Ref:
    """A problem read by the test: exact Fraction matrices and the mask as booleans."""

    raw: dict
    X: list | None
    context: list | None
    W_Q: list | None
    W_K: list | None
    W_V: list | None
    Q: list
    K: list
    V: list
    S: list  # Q Kᵀ, exact
    scale: str | Fraction  # "auto", "none" or a Fraction
    allowed: list[list[bool]]
    bias: list | None  # Fraction, or None for -inf

    @property
    def n_q(self):
        return len(self.Q)

    @property
    def n_k(self):
        return len(self.K)

    @property
    def d_k(self):
        return len(self.Q[0])


def _mask_entry(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise AssertionError(f"unexpected mask entry {text!r}")


def _allowed(mask, n_q: int, n_k: int) -> list[list[bool]]:
    """Which keys each query may see under one mask of the file (BaseLoader: every scalar a string)."""
    if mask == "none":
        return [[True] * n_k for _ in range(n_q)]
    if mask == "causal":
        return [[j <= i for j in range(n_k)] for i in range(n_q)]
    if mask == "causal-bottom-right":
        return [[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)]
    if isinstance(mask, dict) and "padding" in mask:  # a key-padding vector, the same for every query
        return [[mask["padding"][j] == "1" for j in range(n_k)] for _ in range(n_q)]
    if isinstance(mask, dict) and "valid-length" in mask:  # keys 1..n (1-based) are real
        return [[j < int(mask["valid-length"]) for j in range(n_k)] for _ in range(n_q)]
    if isinstance(mask, dict) and "sink" in mask:  # StreamingLLM: the first k keys and a causal window of w
        k, w = int(mask["sink"]), int(mask["window"])
        return [[j <= i and (j < k or i - j < w) for j in range(n_k)] for i in range(n_q)]
    if isinstance(mask, dict):
        w = int(mask["sliding-window"])
        return [[j <= i and i - j < w for j in range(n_k)] for i in range(n_q)]
    return [[_mask_entry(x) for x in row] for row in mask]


def read_ref(text: str) -> Ref:
    raw = yaml.load(text, Loader=yaml.BaseLoader)
    if "Q" in raw:
        X = context = W_Q = W_K = W_V = None
        Q, K, V = fmatrix(raw["Q"]), fmatrix(raw["K"]), fmatrix(raw["V"])
    else:
        X = fmatrix(raw["X"])
        context = fmatrix(raw["context"]) if "context" in raw else None
        W_Q, W_K, W_V = fmatrix(raw["W_Q"]), fmatrix(raw["W_K"]), fmatrix(raw["W_V"])
        kv = context if context is not None else X
        Q, K, V = fmatmul(X, W_Q), fmatmul(kv, W_K), fmatmul(kv, W_V)
    n_q, n_k = len(Q), len(K)

    scale_text = raw.get("scale", "auto")
    scale = scale_text if scale_text in ("auto", "none") else frac(scale_text)

    mask = raw.get("mask", "none")
    if isinstance(mask, list) and mask and not isinstance(mask[0], list):  # [causal, {valid-length: 3}]: AND
        parts = [_allowed(m, n_q, n_k) for m in mask]
        allowed = [[all(p[i][j] for p in parts) for j in range(n_k)] for i in range(n_q)]
    else:
        allowed = _allowed(mask, n_q, n_k)

    bias = None
    if "bias" in raw:
        bias = [[None if x.strip() in NEG_INF_TEXT else frac(x) for x in row] for row in raw["bias"]]

    return Ref(raw, X, context, W_Q, W_K, W_V, Q, K, V, fmatmul(Q, ftranspose(K)), scale, allowed, bias)


def usable(ref: Ref, i: int, j: int) -> bool:
    """Whether query i really attends to key j (mask allows it and bias is not -inf)."""
    return ref.allowed[i][j] and (ref.bias is None or ref.bias[i][j] is not None)


# ---------------------------------------------------------------------------
# The references: mpmath at 40 digits and NumPy float64
# ---------------------------------------------------------------------------


def _mpf(f: Fraction) -> mpmath.mpf:
    return mpmath.mpf(f.numerator) / f.denominator


def mp_reference(ref: Ref) -> dict[str, list[list]]:
    """S_scaled, Z (masked), A and O at 40 digits, with the max-subtracted softmax."""
    with mpmath.workdps(REF_DPS):
        if ref.scale == "auto":
            scale = 1 / mpmath.sqrt(ref.d_k)
        elif ref.scale == "none":
            scale = mpmath.mpf(1)
        else:
            scale = _mpf(ref.scale)
        S_scaled = [[_mpf(s) * scale for s in row] for row in ref.S]
        Z = []
        for i, row in enumerate(S_scaled):
            z_row = []
            for j, s in enumerate(row):
                if not usable(ref, i, j):
                    z_row.append(mpmath.ninf)
                else:
                    z_row.append(s + (_mpf(ref.bias[i][j]) if ref.bias is not None else 0))
            Z.append(z_row)
        A = []
        for i, z_row in enumerate(Z):
            finite = [z for z in z_row if z != mpmath.ninf]
            m = max(finite)
            e = [mpmath.mpf(0) if z == mpmath.ninf else mpmath.exp(z - m) for z in z_row]
            total = mpmath.fsum(e)
            A.append([x / total for x in e])
        V = [[_mpf(v) for v in row] for row in ref.V]
        O = [[mpmath.fsum(A[i][k] * V[k][j] for k in range(ref.n_k)) for j in range(len(V[0]))] for i in range(ref.n_q)]
    return {"S_scaled": S_scaled, "S_masked": Z, "A": A, "O": O}


def _f64(rows) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in rows], dtype=np.float64)


def np_reference(ref: Ref) -> dict[str, np.ndarray]:
    """A practitioner's float64 attention, from the float inputs."""
    if ref.X is not None:
        X = _f64(ref.X)
        C = _f64(ref.context) if ref.context is not None else X
        Q, K, V = X @ _f64(ref.W_Q), C @ _f64(ref.W_K), C @ _f64(ref.W_V)
    else:
        Q, K, V = _f64(ref.Q), _f64(ref.K), _f64(ref.V)
    if ref.scale == "auto":
        scale = 1.0 / np.sqrt(Q.shape[1])
    elif ref.scale == "none":
        scale = 1.0
    else:
        scale = float(ref.scale)
    Z = (Q @ K.T) * scale
    if ref.bias is not None:
        Z = Z + np.array([[-np.inf if b is None else float(b) for b in row] for row in ref.bias])
    Z = np.where(np.array(ref.allowed), Z, -np.inf)
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return {"A": A, "O": A @ V}


def exact_as_mpf(m: sympy.MatrixBase) -> list[list]:
    """symattn's exact entries evaluated by SymPy itself at 40 digits."""
    out = []
    with mpmath.workdps(REF_DPS + 5):
        for i in range(m.rows):
            row = []
            for j in range(m.cols):
                v = sympy.N(m[i, j], REF_DPS)
                assert v.is_number and v.is_real is not False, f"entry [{i}][{j}] = {m[i, j]} is not a real number"
                row.append(mpmath.mpf(str(v)))
            out.append(row)
    return out


def assert_close(got, want, tol, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} rows, expected {len(want)}"
    for i, (g_row, w_row) in enumerate(zip(got, want)):
        assert len(g_row) == len(w_row), f"{what}[{i}]: {len(g_row)} entries, expected {len(w_row)}"
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            if mpmath.isinf(w) or mpmath.isinf(g):
                assert g == w, f"{what}[{i}][{j}]: got {g}, expected {w}"
                continue
            assert not mpmath.isnan(g), f"{what}[{i}][{j}] is NaN"
            err = abs(g - w)
            assert err <= tol, f"{what}[{i}][{j}]: got {g}, expected {w} (|diff| = {mpmath.nstr(err, 5)} > {tol})"


def to_sympy(rows) -> sympy.ImmutableMatrix:
    return sympy.ImmutableMatrix([[sympy.Rational(f.numerator, f.denominator) for f in row] for row in rows])


def load(path_or_text):
    text = path_or_text.read_text("utf-8") if isinstance(path_or_text, Path) else path_or_text
    return read_ref(text), symattn.derive(symattn.load_problem(path_or_text))


@pytest.fixture(scope="module", params=EXAMPLES, ids=EXAMPLE_IDS)
def example(request):
    return load(request.param)


def test_there_are_worked_examples():
    assert len(EXAMPLES) >= 5, EXAMPLES


# ---------------------------------------------------------------------------
# 1. Every worked example against the references
# ---------------------------------------------------------------------------


def test_example_A_and_O_match_mpmath_reference(example):
    ref, d = example
    want = mp_reference(ref)
    assert_close(exact_as_mpf(d.step("S_scaled").exact), want["S_scaled"], EXACT_TOL, "S_scaled")
    assert_close(exact_as_mpf(d.step("A").exact), want["A"], EXACT_TOL, "A")
    assert_close(exact_as_mpf(d.step("O").exact), want["O"], EXACT_TOL, "O")


def test_example_evaluate_O_matches_mpmath_reference(example):
    ref, d = example
    want = mp_reference(ref)
    got = d.evaluate("O", 30)
    with mpmath.workdps(REF_DPS):
        assert_close(got, want["O"], EXACT_TOL, "evaluate('O', 30)")
        assert_close(d.evaluate("A", 30), want["A"], EXACT_TOL, "evaluate('A', 30)")


def test_example_matches_numpy_float64(example):
    ref, d = example
    numeric = np_reference(ref)
    want = mp_reference(ref)
    for stage in ("A", "O"):
        exact = [[float(x) for x in row] for row in exact_as_mpf(d.step(stage).exact)]
        np.testing.assert_allclose(exact, numeric[stage], rtol=0, atol=FLOAT_TOL, err_msg=f"symattn {stage} vs NumPy")
        mp = [[float(x) for x in row] for row in want[stage]]
        np.testing.assert_allclose(mp, numeric[stage], rtol=0, atol=FLOAT_TOL, err_msg=f"mpmath {stage} vs NumPy")


def test_example_inputs_and_products_are_exact(example):
    """Q, K, V, Kᵀ and S equal the test's own Fraction arithmetic, entry for entry."""
    ref, d = example
    if ref.X is not None:
        assert d.step("X").exact == to_sympy(ref.X)
        for name in ("W_Q", "W_K", "W_V"):
            assert d.step(name).exact == to_sympy(getattr(ref, name))
    assert d.step("Q").exact == to_sympy(ref.Q)
    assert d.step("K").exact == to_sympy(ref.K)
    assert d.step("V").exact == to_sympy(ref.V)
    assert d.step("K_T").exact == to_sympy(ref.K).T
    assert d.step("S").exact == to_sympy(ref.S)
    n_v = len(ref.V[0])
    assert d.dims == {"n_q": ref.n_q, "n_k": ref.n_k, "d_model": len(ref.X[0]) if ref.X else None,
                      "d_k": ref.d_k, "d_v": n_v, "heads": 1}
    assert d.step("A").exact.shape == (ref.n_q, ref.n_k)
    assert d.step("O").exact.shape == (ref.n_q, n_v)


# ---------------------------------------------------------------------------
# 2. Exactness
# ---------------------------------------------------------------------------


def test_rows_of_A_sum_to_exactly_one(example):
    _, d = example
    A = d.step("A").exact
    for i in range(A.rows):
        total = sum(A.row(i))
        assert sympy.simplify(total) == 1, f"row {i} of A sums to {total}"


def test_masked_positions_are_exact(example):
    ref, d = example
    A, M, Z = d.step("A").exact, d.step("M").exact, d.step("S_masked").exact
    bias = d.problem.bias
    for i in range(ref.n_q):
        for j in range(ref.n_k):
            if ref.allowed[i][j] and (bias is None or bias[i, j] != -sympy.oo):
                # an allowed position holds the bias (0 without one) and adds it to the score
                want = 0 if bias is None else bias[i, j]
                assert M[i, j] == want, f"M[{i}][{j}] = {M[i, j]} at an allowed position"
                assert Z[i, j] == d.step("S_scaled").exact[i, j] + want
                assert A[i, j] != 0 and A[i, j].is_positive, f"A[{i}][{j}] = {A[i, j]}"
            else:
                assert M[i, j] == -sympy.oo, f"M[{i}][{j}] = {M[i, j]}"
                assert Z[i, j] == -sympy.oo, f"S_masked[{i}][{j}] = {Z[i, j]}"
                assert A[i, j] == sympy.Integer(0) and A[i, j].is_Integer, f"A[{i}][{j}] = {A[i, j]!r}"


def test_softmax_structure_subtracts_the_row_maximum(example):
    """Each row keeps m_i = max of its allowed scores and exponents z_ij - m_i <= 0."""
    ref, d = example
    want = mp_reference(ref)
    rows = d.step("A").softmax
    assert len(rows) == ref.n_q
    with mpmath.workdps(REF_DPS):
        for i, row in enumerate(rows):
            z = want["S_masked"][i]
            m_ref = max(x for x in z if x != mpmath.ninf)
            m_got = exact_as_mpf(sympy.ImmutableMatrix([[row.maximum]]))[0][0]
            assert abs(m_got - m_ref) <= EXACT_TOL, f"row {i}: maximum {row.maximum} but the reference max is {m_ref}"
            assert len(row.exponents) == ref.n_k
            zero_seen = False
            for j, e in enumerate(row.exponents):
                if not usable(ref, i, j):
                    assert e is None, f"row {i}: masked position {j} has exponent {e}"
                    continue
                value = exact_as_mpf(sympy.ImmutableMatrix([[e]]))[0][0]
                assert value <= 0, f"row {i}: exponent {j} = {e} is positive"
                assert abs(value - (z[j] - m_ref)) <= EXACT_TOL, (i, j, e)
                zero_seen = zero_seen or e == 0
            assert zero_seen, f"row {i}: no exponent is exactly 0 ({row.exponents})"
            total = mpmath.fsum(mpmath.exp(x - m_ref) for x in z if x != mpmath.ninf)
            got = exact_as_mpf(sympy.ImmutableMatrix([[row.normaliser]]))[0][0]
            assert abs(got - total) <= EXACT_TOL, f"row {i}: normaliser {row.normaliser}"


def test_no_float_in_any_step(example):
    ref, d = example
    assert not isinstance(d.problem.scale_value, sympy.Float)
    assert not d.problem.scale_value.atoms(sympy.Float)
    for step in d.steps:
        floats = step.exact.atoms(sympy.Float)
        assert not floats, f"step {step.id} holds floats {floats}"


def test_a_masked_example_exists():
    masked = [p.stem for p in EXAMPLES if not all(all(r) for r in read_ref(p.read_text("utf-8")).allowed)]
    assert masked, "no worked example has a mask, the masked-position tests check nothing"


EQUAL_SCORES = {
    # a zero query: every score is 0
    "zero-query": ("Q: [[0, 0], [1, 2]]\nK: [[1, 0], [0, 1], [3, -1]]\nV: [[3, 0], [6, 1], [0, 2]]\nmask: none\n", 0, 3),
    # a non-zero query with three keys it matches equally (scores 2, 2, 2)
    "equal-dots": ('Q: [[1, 1]]\nK: [[2, 0], [0, 2], ["3/2", "1/2"]]\nV: [[1], [2], [4]]\nscale: auto\n', 0, 3),
    # the third row of a causal problem whose first three scores are equal, plus a masked fourth
    "causal-row": ("Q: [[1, 0], [0, 1], [1, 1], [2, 2]]\nK: [[1, 1], [1, 1], [1, 1], [5, 0]]\n"
                   "V: [[1, 0], [0, 1], [1, 1], [9, 9]]\nmask: causal\n", 2, 3),
    # two of four keys masked by a 0/1 matrix, the other two equal
    "matrix-mask": ("X: [[1, 1], [0, 1]]\nW_Q: [[1], [0]]\nW_K: [[2], [0]]\nW_V: [[1, 0], [0, 1]]\n"
                    "context: [[1, 0], [5, 7], [1, 3], [9, 9]]\nmask: [[1, 0, 1, 0], [1, 1, 1, 1]]\n", 0, 2),
}


@pytest.mark.parametrize("name", sorted(EQUAL_SCORES))
def test_equal_scores_give_exactly_one_over_k(name):
    text, row, k = EQUAL_SCORES[name]
    ref, d = load(text)
    A = d.step("A").exact
    allowed = [j for j in range(ref.n_k) if ref.allowed[row][j]]
    assert len(allowed) == k
    assert len({ref.S[row][j] for j in allowed}) == 1, "the test problem itself must have equal scores"
    for j in range(ref.n_k):
        want = sympy.Rational(1, k) if j in allowed else sympy.Integer(0)
        assert A[row, j] == want and isinstance(A[row, j], sympy.Rational), f"A[{row}][{j}] = {A[row, j]!r}"
    # the output row is then exactly the mean of the allowed value rows
    mean = [sum((ref.V[j][c] for j in allowed), Fraction(0)) / k for c in range(len(ref.V[0]))]
    assert d.step("O").exact.row(row) == to_sympy([mean])


CAUSAL_EXAMPLES = [p for p in EXAMPLES if read_ref(p.read_text("utf-8")).raw.get("mask") == "causal"]


@pytest.mark.parametrize("path", CAUSAL_EXAMPLES, ids=[p.stem for p in CAUSAL_EXAMPLES])
def test_first_row_of_a_causal_problem_is_exactly_the_first_value(path):
    ref, d = load(path)
    A, O = d.step("A").exact, d.step("O").exact
    assert A[0, 0] == 1 and A[0, 0].is_Integer
    assert all(A[0, j] == sympy.Integer(0) for j in range(1, A.cols))
    assert O.row(0) == d.step("V").exact.row(0)
    assert O.row(0) == to_sympy(ref.V).row(0)


def test_there_are_causal_examples():
    assert CAUSAL_EXAMPLES


def test_dk2_scale_keeps_sqrt2_exact():
    path = ROOT / "worked_examples" / "causal_dk2.yaml"
    ref, d = load(path)
    assert ref.d_k == 2 and ref.scale == "auto"
    assert d.problem.scale_value == 1 / sympy.sqrt(2)
    S, S_scaled = d.step("S").exact, d.step("S_scaled").exact
    assert any(e.has(sympy.sqrt(2)) for e in S_scaled), S_scaled
    for i in range(S.rows):
        for j in range(S.cols):
            want = sympy.Rational(ref.S[i][j].numerator, ref.S[i][j].denominator) * sympy.sqrt(2) / 2
            assert sympy.simplify(S_scaled[i, j] - want) == 0, (i, j, S_scaled[i, j], want)
            if ref.S[i][j] != 0:
                assert S_scaled[i, j].has(sympy.sqrt(2)), (i, j, S_scaled[i, j])
    for step in d.steps:
        assert not step.exact.atoms(sympy.Float), step.id


def test_decimal_entries_are_exact_rationals():
    path = ROOT / "worked_examples" / "decimal_entries.yaml"
    ref, d = load(path)
    X = d.step("X").exact
    assert ref.raw["X"][0][0] == "0.1"
    assert X[0, 0] == sympy.Rational(1, 10) and isinstance(X[0, 0], sympy.Rational)
    assert X[1, 0] == sympy.Rational(-5, 4)  # -1.25
    assert X[1, 1] == sympy.Rational(1, 5)  # 2e-1
    assert X == to_sympy(ref.X)
    assert d.step("W_K").exact[1, 0] == sympy.Rational(2, 5)  # 0.4


def test_decimal_entry_in_a_made_up_problem():
    _, d = load('Q: [[0.1, "1/3"]]\nK: [[0.1, 0.2], [0.3, -0.7]]\nV: [[0.1], [1e-3]]\nscale: none\n')
    assert d.step("Q").exact[0, 0] == sympy.Rational(1, 10)
    assert d.step("Q").exact[0, 1] == sympy.Rational(1, 3)
    assert d.step("V").exact[1, 0] == sympy.Rational(1, 1000)
    assert d.step("S").exact[0, 0] == sympy.Rational(1, 100) + sympy.Rational(2, 30)


@pytest.mark.parametrize(
    "text",
    [
        (ROOT / "worked_examples" / "decimal_entries.yaml"),
        "Q: [[1, 2], [3, 5]]\nK: [[1, 1], [2, 7]]\nV: [[1], [2]]\nscale: none\n",
    ],
    ids=["decimal_entries", "made-up"],
)
def test_scale_none_leaves_the_scores_unchanged(text):
    ref, d = load(text)
    assert ref.scale == "none"
    assert d.problem.scale_value == 1
    assert d.step("S_scaled").exact == d.step("S").exact
    assert d.step("S_scaled").exact == to_sympy(ref.S)


@pytest.mark.parametrize(
    "text",
    [
        (ROOT / "worked_examples" / "qkv_given.yaml"),
        'Q: [[1, 2], [3, 5]]\nK: [[1, 1], [2, 7]]\nV: [[1], [2]]\nscale: "1/2"\n',
    ],
    ids=["qkv_given", "made-up"],
)
def test_custom_scale_one_half(text):
    ref, d = load(text)
    assert ref.scale == Fraction(1, 2)
    assert d.problem.scale_value == sympy.Rational(1, 2)
    S, S_scaled = d.step("S").exact, d.step("S_scaled").exact
    assert S_scaled == S / 2
    assert S_scaled == to_sympy([[s / 2 for s in row] for row in ref.S])
    assert all(isinstance(x, sympy.Rational) for x in S_scaled)


@pytest.mark.parametrize("row", [0, 1, 2])
def test_a_fully_masked_row_is_an_error_naming_the_row(row):
    mask = [[1, 1, 0], [1, 1, 1], [0, 1, 1]]
    mask[row] = [0, 0, 0]
    text = (
        "Q: [[1, 0], [0, 1], [1, 1]]\nK: [[1, 0], [0, 1], [1, 1]]\nV: [[1], [2], [3]]\n"
        f"mask: {mask}\n"
    )
    with pytest.raises(SymattnError, match=rf"\brow {row + 1} with no key to attend to") as info:
        symattn.derive(symattn.load_problem(text))
    assert "nan" not in str(info.value).lower()


LARGE = {
    "Q-300": ("Q: [[300, 300], [300, -300], [1, 2]]\nK: [[300, 300], [299, 301], [-300, 300]]\n"
              "V: [[1, 2], [3, 4], [5, 6]]\nmask: none\n"),
    "Q-300-causal": ("Q: [[300, 0], [0, 300], [300, 300]]\nK: [[300, 1], [1, 300], [-300, -300]]\n"
                     "V: [[1, 0], [0, 1], [7, 7]]\nmask: causal\n"),
    "X-900-projected": ("X: [[900, -900, 1], [450, 900, -900], [1, 1, 1]]\n"
                        "W_Q: [[1, 0], [0, 1], [1, 1]]\nW_K: [[1, 1], [0, 1], [1, 0]]\n"
                        "W_V: [[1, -1], [0, 2], [3, 0]]\nscale: none\n"),
}


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_scores_do_not_overflow(name):
    ref, d = load(LARGE[name])
    assert max(abs(s) for row in ref.S for s in row) >= 90000  # exp of that overflows float64
    check = symattn.crosscheck(d)
    assert check.passed, check.mismatches
    assert all(np.isfinite(v) for v in check.per_stage.values()), check.per_stage
    for stage in d.ids:
        for row in d.evaluate(stage, 30):
            assert not any(mpmath.isnan(x) for x in row), (stage, row)
    want = mp_reference(ref)
    assert_close(exact_as_mpf(d.step("A").exact), want["A"], EXACT_TOL, "A")
    # the outputs can be large: compare relative to their size
    for i, (g_row, w_row) in enumerate(zip(exact_as_mpf(d.step("O").exact), want["O"])):
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            assert abs(g - w) <= EXACT_TOL * max(1, abs(w)), (i, j, g, w)
    numeric = np_reference(ref)
    assert np.isfinite(numeric["O"]).all()
    np.testing.assert_allclose([[float(x) for x in r] for r in want["O"]], numeric["O"], rtol=1e-12, atol=FLOAT_TOL)


def test_bias_is_added_to_the_mask():
    text = (
        "Q: [[1, 0], [0, 1], [1, 1]]\nK: [[1, 0], [0, 1], [1, 1]]\nV: [[1, 0], [0, 1], [2, 3]]\n"
        'mask: causal\nbias: [[0, 5, 5], ["-1/2", 0, -inf], [-1, -2, -3]]\nscale: none\n'
    )
    ref, d = load(text)
    M = d.step("M").exact
    assert M[1, 0] == sympy.Rational(-1, 2) and M[1, 2] == -sympy.oo and M[0, 1] == -sympy.oo
    assert M[2, :] == sympy.ImmutableMatrix([[-1, -2, -3]])
    want = mp_reference(ref)
    assert_close(exact_as_mpf(d.step("A").exact), want["A"], EXACT_TOL, "A")
    assert_close(exact_as_mpf(d.step("O").exact), want["O"], EXACT_TOL, "O")
    assert symattn.crosscheck(d).passed


@pytest.mark.parametrize("mask", ["causal", "causal-bottom-right", "{sliding-window: 2}"])
def test_cross_attention_with_fewer_queries_than_keys(mask):
    text = (
        "X: [[1, 0], [0, 1]]\ncontext: [[1, 1], [2, 0], [0, 3], [1, -1]]\n"
        'W_Q: [[1, 0], [0, 1]]\nW_K: [[1, "1/2"], [0, 1]]\nW_V: [[1], [2]]\n'
        f"mask: {mask}\n"
    )
    ref, d = load(text)
    want = mp_reference(ref)
    assert_close(exact_as_mpf(d.step("A").exact), want["A"], EXACT_TOL, "A")
    assert_close(exact_as_mpf(d.step("O").exact), want["O"], EXACT_TOL, "O")
    np.testing.assert_allclose([[float(x) for x in r] for r in want["O"]], np_reference(ref)["O"], atol=FLOAT_TOL)


# ---------------------------------------------------------------------------
# 3. Random problems
# ---------------------------------------------------------------------------

N_RANDOM = 60


def _yaml_matrix(rows) -> str:
    return "[" + ", ".join("[" + ", ".join(f'"{x}"' for x in row) + "]" for row in rows) + "]"


def _random_problem(rng: random.Random) -> str:
    n = rng.randint(1, 5)
    d_model, d_k, d_v = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 3)

    def entries(r, c):
        return [[Fraction(rng.randint(-4, 4), rng.choice([1, 2, 3, 4])) for _ in range(c)] for _ in range(r)]

    lines = []
    if rng.random() < 0.75:
        lines += [f"X: {_yaml_matrix(entries(n, d_model))}", f"W_Q: {_yaml_matrix(entries(d_model, d_k))}",
                  f"W_K: {_yaml_matrix(entries(d_model, d_k))}", f"W_V: {_yaml_matrix(entries(d_model, d_v))}"]
    else:
        lines += [f"Q: {_yaml_matrix(entries(n, d_k))}", f"K: {_yaml_matrix(entries(n, d_k))}",
                  f"V: {_yaml_matrix(entries(n, d_v))}"]
    kind = rng.choice(["none", "causal", "matrix"])
    if kind == "matrix":
        rows = []
        for _ in range(n):
            row = [rng.randint(0, 1) for _ in range(n)]
            if not any(row):
                row[rng.randrange(n)] = 1
            rows.append(row)
        lines.append("mask: [" + ", ".join("[" + ", ".join(map(str, r)) + "]" for r in rows) + "]")
    else:
        lines.append(f"mask: {kind}")
    scale = rng.choice(["auto", "auto", "none", f'"{Fraction(rng.randint(1, 6), rng.randint(1, 4))}"'])
    lines.append(f"scale: {scale}")
    return "\n".join(lines) + "\n"


_rng = random.Random(20240531)
RANDOM_PROBLEMS = [_random_problem(_rng) for _ in range(N_RANDOM)]


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem(index):
    text = RANDOM_PROBLEMS[index]
    ref, d = load(text)
    check = symattn.crosscheck(d)
    assert check.passed, f"{text}\n{[str(m) for m in check.mismatches]}"
    want = mp_reference(ref)
    assert d.step("S").exact == to_sympy(ref.S), text
    assert_close(exact_as_mpf(d.step("O").exact), want["O"], EXACT_TOL, "O")
    with mpmath.workdps(REF_DPS):
        assert_close(d.evaluate("O", 30), want["O"], EXACT_TOL, "evaluate('O', 30)")
    A = d.step("A").exact
    for i in range(ref.n_q):
        for j in range(ref.n_k):
            if not ref.allowed[i][j]:
                assert A[i, j] == sympy.Integer(0)
    np.testing.assert_allclose([[float(x) for x in r] for r in want["O"]], np_reference(ref)["O"], atol=FLOAT_TOL)


def test_random_problems_cover_the_cases():
    texts = RANDOM_PROBLEMS
    assert sum("mask: causal" in t for t in texts) >= 5
    assert sum("mask: [" in t for t in texts) >= 5
    assert sum("mask: none" in t for t in texts) >= 5
    assert sum(t.startswith("Q:") for t in texts) >= 5
    assert sum(t.startswith("X:") for t in texts) >= 5


# ---------------------------------------------------------------------------
# 4. PyTorch's scaled_dot_product_attention
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=EXAMPLE_IDS)
def test_example_matches_torch_sdpa(path):
    torch = pytest.importorskip("torch")
    ref, d = load(path)

    def t(rows):
        return torch.tensor([[float(x) for x in row] for row in rows], dtype=torch.float64)

    if ref.X is not None:
        X = t(ref.X)
        C = t(ref.context) if ref.context is not None else X
        Q, K, V = X @ t(ref.W_Q), C @ t(ref.W_K), C @ t(ref.W_V)
    else:
        Q, K, V = t(ref.Q), t(ref.K), t(ref.V)
    if ref.scale == "auto":
        scale = 1.0 / float(np.sqrt(ref.d_k))
    elif ref.scale == "none":
        scale = 1.0
    else:
        scale = float(ref.scale)
    mask = torch.tensor(
        [[0.0 if usable(ref, i, j) else float("-inf") for j in range(ref.n_k)] for i in range(ref.n_q)],
        dtype=torch.float64,
    )
    if ref.bias is not None:
        mask = mask + torch.tensor([[0.0 if b is None else float(b) for b in row] for row in ref.bias], dtype=torch.float64)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    O_t = sdpa(Q[None], K[None], V[None], attn_mask=mask[None], scale=scale)[0]
    # with V = I the output is the weights themselves
    A_t = sdpa(Q[None], K[None], torch.eye(ref.n_k, dtype=torch.float64)[None], attn_mask=mask[None], scale=scale)[0]
    for stage, theirs in (("A", A_t), ("O", O_t)):
        exact = np.array([[float(x) for x in row] for row in exact_as_mpf(d.step(stage).exact)])
        np.testing.assert_allclose(exact, theirs.numpy(), rtol=0, atol=FLOAT_TOL, err_msg=f"{stage} vs torch SDPA")
