"""The numeric cross-check: it passes on good derivations and catches bad ones."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
from pathlib import Path

import pytest
import sympy

import symattn
import symattn.reference.numeric
from symattn.reference.crosscheck import TOLERANCE

ROOT = Path(__file__).resolve().parent.parent
# Single-head examples: the corruption tests name stages without a head prefix
# (test_exact_family.py checks the multi-head ones).
EXAMPLES = sorted(
    p for p in (ROOT / "worked_examples").glob("*.yaml")
    if not any(line.startswith(("heads:", "linear:", "mla:")) for line in p.read_text("utf-8").splitlines())
    and "heads: all" not in p.read_text("utf-8")
)  # (linear attention has no scores S: its cross-check is tested in test_exact_linear.py; mla's heads are
# per-head ids, tested in test_exact_mla.py)
EXAMPLE_IDS = [p.stem for p in EXAMPLES]


def derive(source):
    return symattn.derive(symattn.load_problem(source))


def corrupt(d, stage: str, matrix) -> symattn.Derivation:
    """A copy of ``d`` whose ``stage`` holds ``matrix`` instead of its exact matrix."""
    steps = tuple(dataclasses.replace(s, value=matrix) if s.id == stage else s for s in d.steps)
    bad = dataclasses.replace(d, steps=steps)
    assert bad.step(stage).exact == matrix, "the corruption did not take"
    return bad


def test_there_are_worked_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=EXAMPLE_IDS)
def test_crosscheck_passes_on_every_worked_example(path):
    d = derive(path)
    check = symattn.crosscheck(d)
    assert check.passed, [str(m) for m in check.mismatches]
    assert check.mismatches == ()
    assert tuple(check.per_stage) == d.ids
    assert check.max_abs_error < 1e-12, check.per_stage
    assert check.max_abs_error == max(check.per_stage.values())
    assert all(math.isfinite(v) and v >= 0 for v in check.per_stage.values()), check.per_stage
    assert check.tolerance == TOLERANCE
    summary = check.as_dict()
    assert summary["passed"] is True and summary["reference"] == "numpy float64"
    assert summary["per_stage"] == check.per_stage


@pytest.mark.parametrize("path", EXAMPLES, ids=EXAMPLE_IDS)
def test_numeric_reference_has_every_stage(path):
    d = derive(path)
    stages = symattn.reference.numeric.numeric_stages(d.problem)
    if d.problem.backward is not None:  # the gradients have their own NumPy reference
        from symattn.reference.numeric_backward import numeric_gradients

        stages.update(numeric_gradients(d.problem))
    assert set(d.ids) <= set(stages)
    for step in d.steps:
        assert stages[step.id].shape == step.exact.shape, step.id


@pytest.mark.parametrize("path", EXAMPLES, ids=EXAMPLE_IDS)
def test_scores_off_by_one_everywhere_fail(path):
    d = derive(path)
    S = d.step("S").exact
    bad = corrupt(d, "S", S + sympy.ones(*S.shape))
    check = symattn.crosscheck(bad)
    assert check.passed is False
    assert {(m.stage, m.row, m.col) for m in check.mismatches} == {
        ("S", i, j) for i in range(S.rows) for j in range(S.cols)
    }
    assert check.per_stage["S"] == pytest.approx(1.0, abs=1e-12)
    assert check.max_abs_error == pytest.approx(1.0, abs=1e-12)
    # every other stage is still right
    assert all(v < 1e-12 for k, v in check.per_stage.items() if k != "S"), check.per_stage
    # and the original derivation is untouched
    assert symattn.crosscheck(d).passed


def test_one_wrong_entry_is_named_by_stage_and_entry():
    d = derive(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    S = d.step("S").exact
    wrong = S.as_mutable()
    wrong[1, 2] += 1
    check = symattn.crosscheck(corrupt(d, "S", sympy.ImmutableMatrix(wrong)))
    assert not check.passed
    assert len(check.mismatches) == 1
    (m,) = check.mismatches
    assert (m.stage, m.row, m.col) == ("S", 1, 2)
    assert m.exact == pytest.approx(float(S[1, 2]) + 1)
    assert m.numeric == pytest.approx(float(S[1, 2]))
    assert str(m).startswith("S[2,3]:"), str(m)  # counted from 1, as S₂₃ in the solution


def test_a_lost_minus_infinity_is_caught():
    """A masked position turned into a finite number must fail, with infinity reported."""
    d = derive(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    M = d.step("M").exact
    assert M[0, 3] == -sympy.oo
    wrong = M.as_mutable()
    wrong[0, 3] = 0
    check = symattn.crosscheck(corrupt(d, "M", sympy.ImmutableMatrix(wrong)))
    assert not check.passed
    assert [(m.stage, m.row, m.col) for m in check.mismatches] == [("M", 0, 3)]
    assert check.mismatches[0].numeric == -math.inf
    assert check.per_stage["M"] == math.inf


def test_tolerance_is_respected():
    """A difference far below the tolerance passes; one far above it fails."""
    d = derive(ROOT / "worked_examples" / "qkv_given.yaml")
    S = d.step("S").exact
    tiny = symattn.crosscheck(corrupt(d, "S", S + sympy.ones(*S.shape) * sympy.Rational(1, 10**13)))
    assert tiny.passed and 1e-14 < tiny.per_stage["S"] < 1e-12
    big = symattn.crosscheck(corrupt(d, "S", S + sympy.ones(*S.shape) * sympy.Rational(1, 10**6)))
    assert not big.passed and {m.stage for m in big.mismatches} == {"S"}


def _imported_modules(source: str) -> set[str]:
    """Every module an ``import`` in ``source`` names, relative ones as written (``._exact``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.add(base)
            names.update(f"{base}.{alias.name}" if node.module else base + alias.name for alias in node.names)
    return names


def test_numeric_reference_never_imports_the_exact_path():
    source = inspect.getsource(symattn.reference.numeric)
    imported = _imported_modules(source)
    forbidden = [n for n in imported if {"exact", "derivation"} & set(n.split("."))]
    assert not forbidden, f"symattn.reference.numeric imports {forbidden}"
    func = inspect.getsource(symattn.reference.numeric.numeric_stages)
    assert "_exact" not in func and "derivation" not in func and "Derivation" not in func
    # nothing of the exact path leaks in through the module's globals
    for value in vars(symattn.reference.numeric).values():
        mod = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        assert not mod.startswith("symattn.exact"), value


def test_import_checker_would_see_such_imports():
    """The checker above is not vacuous."""
    for line in ("from ..exact.products import matmul", "from ..exact import products", "from ..exact.derivation import Derivation",
                 "import symattn.exact.products", "from symattn.exact import derivation", "from .. import exact"):
        imported = _imported_modules(line)
        assert any({"exact", "derivation"} & set(n.split(".")) for n in imported), (line, imported)


def test_comparison_in_blocks_of_rows_is_the_whole_comparison(monkeypatch):
    """The comparison runs a block of rows at a time (bounded temporaries for long contexts): with
    blocks of one row it finds the same differences, in the same order, as in one block."""
    from symattn.reference import crosscheck as _crosscheck

    d = derive((ROOT / "worked_examples" / "causal_4_tokens.yaml").read_text("utf-8"))
    reference = symattn.reference.numeric.numeric_stages(d.problem)
    A, S = reference["A"].copy(), reference["S"].copy()
    A[1, 0] += 1e-3  # a weight off
    A[3, 2] = math.nan  # NumPy gave NaN
    S[2, 1] = -math.inf  # an infinity where the exact value is finite
    reference.update(A=A, S=S)
    whole = _crosscheck.compare(d, reference, TOLERANCE, "numpy float64", every=True)
    monkeypatch.setattr(_crosscheck, "_COMPARE_ROWS", 1)
    rows = _crosscheck.compare(d, reference, TOLERANCE, "numpy float64", every=True)
    assert [(m.stage, m.row, m.col) for m in whole.mismatches] == [("S", 2, 1), ("A", 1, 0), ("A", 3, 2)]
    def seen(check):  # (NaN is not equal to itself: compared by its repr)
        return [(m.stage, m.row, m.col, m.exact, repr(m.numeric)) for m in check.mismatches]

    assert seen(rows) == seen(whole) and rows.per_stage == whole.per_stage
    assert whole.per_stage["S"] == math.inf and whole.per_stage["A"] == math.inf


# -- angles float64 cannot hold ----------------------------------------------------------------

U = 2.0 ** -53
EVALUATION = 8 * U  # cos, sin (the reference's) and atan2 (reading the angle back), each within 1 ulp


def _exact_angle_error(turned, positions, thetas) -> list[tuple[float, float]]:
    """(|error of the reference's angle, mod 2π|, |exact angle|) for each position and pair,
    the reference's angle read back from its cos and sin (columns a and b of ``turned``) and
    the exact p·θ_i worked out by mpmath to 60 digits beyond the angle's size."""
    import mpmath

    out = []
    for p in positions:
        for i, theta in enumerate(thetas):
            exact = sympy.Integer(p) * theta
            digits = 60 + max(0, int(sympy.log(abs(sympy.N(exact, 20)) + 1, 10)))
            with mpmath.workdps(digits):
                phi = mpmath.mpmathify(sympy.N(exact, digits))
                got = mpmath.atan2(turned[p][i][1], turned[p][i][0])
                off = (got - phi + mpmath.pi) % (2 * mpmath.pi) - mpmath.pi
                out.append((abs(float(off)), abs(float(phi))))
    return out


# (base or given angles, d, positions): the bound is far below π in each. Widths that are not
# powers of two: there the exponents -2i/d are rounded too, and ln(base) amplifies that.
ROPE_BOUNDS = [
    (sympy.Integer(10000), 128, 8192),
    (sympy.Integer(500000), 120, 8192),
    (sympy.Integer(10), 96, 4096),
    (sympy.Rational(1, 7), 12, 2048),  # 1/7 is rounded to float64, and θ_i grow with i
    (sympy.Rational(37, 10), 100, 4096),
    ((10 ** 5 + sympy.Rational(1, 3), 1000 * sympy.pi ** 2), 4, 4096),
]


@pytest.mark.parametrize("reference", ["numpy", "torch"])
@pytest.mark.parametrize(("base", "d", "n"), ROPE_BOUNDS, ids=["10000", "500000", "10", "1/7", "3.7", "given"])
def test_the_angle_rounding_bound_holds_for_the_references_own_rope(reference, base, d, n):
    """The bound the cross-check declines by (rounding_per_radian) against what the reference
    code really does: its rotation of (1, 0) pairs gives cos and sin of its float64 angles,
    whose error mod 2π must stay within δ = rounding_per_radian·|φ| (plus their evaluation)."""
    import numpy as np

    from symattn.reference.crosscheck import rounding_per_radian
    from symattn.problem.rope import Rope

    given = isinstance(base, tuple)
    rope = Rope("half", angles=base) if given else Rope("half", base=base)
    x = np.zeros((n, d))
    x[:, : d // 2] = 1.0  # pair i is (x_i, x_{i+d/2}) = (1, 0): turned, (cos φ, sin φ)
    if reference == "numpy":
        out = symattn.reference.numeric.rope_rotate(x, rope)
    else:
        torch = pytest.importorskip("torch")
        from symattn.reference.pytorch import torch_rope

        out = torch_rope(torch, torch.tensor(x, dtype=torch.float64), rope).numpy()
    turned = [[(out[p, i], out[p, i + d // 2]) for i in range(d // 2)] for p in range(n)]
    per_radian = rounding_per_radian(None if given else base)
    positions = sorted({1, 2, 3, 100, n // 2 + 1, n - 1})
    for error, phi in _exact_angle_error(turned, positions, rope.thetas(d)):
        bound = per_radian * phi + EVALUATION
        assert bound < 1e-6, bound  # a bound that says something
        assert error <= bound, (error, phi, bound)


@pytest.mark.parametrize(("base", "d", "n"), [(sympy.Integer(10000), 120, 4096), (sympy.Rational(1, 7), 12, 2048)],
                         ids=["10000", "1/7"])
def test_the_angle_rounding_bound_holds_for_the_sinusoidal_positions(base, d, n):
    """The same for numeric.sinusoidal_positions: sin in column 2i, cos in 2i + 1, of p/base^(2i/d)."""
    from symattn.reference.crosscheck import rounding_per_radian

    pe = symattn.reference.numeric.sinusoidal_positions(n, d, float(base))
    turned = [[(pe[p, 2 * i + 1], pe[p, 2 * i]) for i in range(d // 2)] for p in range(n)]
    thetas = [sympy.Pow(base, sympy.Rational(-2 * i, d)) for i in range(d // 2)]
    per_radian = rounding_per_radian(base)
    for error, phi in _exact_angle_error(turned, sorted({1, 2, 3, 100, n // 2 + 1, n - 1}), thetas):
        bound = per_radian * phi + EVALUATION
        assert bound < 1e-6 and error <= bound, (error, phi, bound)


def test_angles_float64_cannot_hold_excuse_no_difference_before_them():
    """θ = 10^30 + 1 leaves NumPy's rotated entries anyone's guess, so differences from Q_rot on
    are excused; a wrong V, which no angle touches, still fails the check."""
    d = derive("Q: [[1, 0], [0, 1], [1, 1]]\nK: [[1, 0], [0, 1], [1, 1]]\nV: [[1, 2], [3, 4], [5, 6]]\n"
               'rope: {angles: ["10^30 + 1"]}\n')
    declined = symattn.crosscheck(d)
    assert declined.passed is None and "RoPE's angles" in declined.skipped
    bad = corrupt(d, "V", sympy.ImmutableMatrix([[1, 2], [3, 4], [5, 7]]))
    result = symattn.crosscheck(bad)
    assert result.passed is False and result.skipped is None
    assert {m.stage for m in result.mismatches} >= {"V"}


# -- the gradients against central finite differences: each entry held to its own bound --------

LARGE_VALUES = """Q: [[1, 0], [0, 1], [1, 1]]
K: [[1, 0], [0, 1], [1, 1]]
V: [[1000000000, 1000000000], [1000000000, 1000000000], [1000000001, 1000000000]]
mask: causal
backward:
  loss: sum
"""


def test_a_large_loss_over_a_small_step_widens_the_bound_instead_of_failing():
    """L = Σ O is about 6·10^9, so each loss carries a rounding of about 10^-6 and the step of
    the scores' differences (10^-6) turns it into about 1: the differences of dS_masked are far
    from the exact values (a fixed tolerance of 10^-6 called this a bug in symattn). The bound
    from the step and the loss's rounding covers them, and the check passes."""
    from symattn.reference.crosscheck import FD_STEP
    from symattn.reference.numeric_backward import finite_difference_gradients

    d = derive(LARGE_VALUES)
    fd = finite_difference_gradients(d.problem, FD_STEP)
    exact = d.approx("dS_masked")
    assert abs(fd["dS_masked"] - exact).max() > 1e-3  # rounding, not the derivation, is off
    check = symattn.crosscheck(d)
    assert check.passed, check.all_mismatches[:3]
    assert check.finite_differences.tolerance > 1e-3  # and the check says how loose it had to be


def test_the_bound_stays_tight_and_catches_a_wrong_gradient(monkeypatch):
    """On the worked example every bound is below 10^-6, so a gradient off by 10^-4 in one entry
    is a mismatch naming that entry (counted from 1)."""
    from symattn.reference.crosscheck import _finite_differences
    from symattn.exact.derivation import Derivation

    d = derive((ROOT / "worked_examples" / "backward_causal.yaml").read_text("utf-8"))
    good = _finite_differences(d)
    assert good.passed and 0 < good.tolerance < 1e-6
    approx = Derivation.approx

    def off(self, stage_id):
        value = approx(self, stage_id)
        if stage_id == "dQ":
            value = value.copy()
            value[1, 0] += 1e-4
        return value

    monkeypatch.setattr(Derivation, "approx", off)
    bad = _finite_differences(d)
    assert [(m.stage, m.row, m.col) for m in bad.mismatches] == [("dQ", 1, 0)]
    assert str(bad.mismatches[0]).startswith("dQ[2,1]: exact value")
