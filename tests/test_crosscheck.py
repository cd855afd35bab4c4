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
import symattn.numeric
from symattn._crosscheck import TOLERANCE

ROOT = Path(__file__).resolve().parent.parent
# Single-head examples: the corruption tests name stages without a head prefix
# (test_family.py checks the multi-head ones).
EXAMPLES = sorted(
    p for p in (ROOT / "worked_examples").glob("*.yaml")
    if not any(line.startswith("heads:") for line in p.read_text("utf-8").splitlines())
)
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
    stages = symattn.numeric.numeric_stages(d.problem)
    if d.problem.backward is not None:  # the gradients have their own NumPy reference
        from symattn.numeric_backward import numeric_gradients

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
    source = inspect.getsource(symattn.numeric)
    imported = _imported_modules(source)
    forbidden = [n for n in imported if n.split(".")[-1] in ("_exact", "derivation") or n.endswith(("._exact", ".derivation"))]
    assert not forbidden, f"symattn.numeric imports {forbidden}"
    func = inspect.getsource(symattn.numeric.numeric_stages)
    assert "_exact" not in func and "derivation" not in func and "Derivation" not in func
    # nothing of the exact path leaks in through the module's globals
    for value in vars(symattn.numeric).values():
        mod = getattr(value, "__module__", None) or getattr(value, "__name__", "")
        assert mod not in ("symattn._exact", "symattn.derivation"), value


def test_import_checker_would_see_such_imports():
    """The checker above is not vacuous."""
    for line in ("from ._exact import matmul", "from . import _exact", "from .derivation import Derivation",
                 "import symattn._exact", "from symattn import derivation"):
        imported = _imported_modules(line)
        assert any(n.split(".")[-1] in ("_exact", "derivation") for n in imported), (line, imported)


def test_comparison_in_blocks_of_rows_is_the_whole_comparison(monkeypatch):
    """The comparison runs a block of rows at a time (bounded temporaries for long contexts): with
    blocks of one row it finds the same differences, in the same order, as in one block."""
    from symattn import _crosscheck

    d = derive((ROOT / "worked_examples" / "causal_4_tokens.yaml").read_text("utf-8"))
    reference = symattn.numeric.numeric_stages(d.problem)
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
