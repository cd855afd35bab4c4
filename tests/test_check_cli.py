"""``symattn check``: marking a student's hand calculation.

Every expected value here is worked out in this file, independently of
symattn: the problem's numbers are read with ``yaml.BaseLoader`` (or written
out below), the stages are computed with exact fractions and mpmath at 50
digits, and the exact answers are written as our own expressions
(``"e^(-4)/(e^(-4) + 1 + 1)"``, ``"12/2"``, ``"(-2)*sqrt(2)"``...). Wrong
answers are made by applying a mistake to those values. symattn's own
derivation is never used to produce an answers file.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
import sympy
import yaml
from _child import CliResult, SymattnCli
from _reference import answers_text, rounded, rounded_grid

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
CAUSAL4 = EXAMPLES / "causal_4_tokens.yaml"
CAUSAL_DK2 = EXAMPLES / "causal_dk2.yaml"
TWO_HEADS = EXAMPLES / "two_heads.yaml"
PADDING = EXAMPLES / "padding_mask.yaml"

DPS = 50
NINF = mpmath.ninf
STAGES = ["Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]

# A problem of our own with Q, K, V given as 3×3 matrices: d_k == n_k, so Q·K
# has the shape of Q·Kᵀ, and the scores are not symmetric (K·Qᵀ ≠ Q·Kᵀ).
SQUARE_PROBLEM = """\
title: Three tokens, Q K V given
Q: [[1, 2, 0], [0, 1, 3], [2, 0, 1]]
K: [[1, 0, 2], [3, 1, 0], [0, 2, 1]]
V: [[1, 0, 2], [0, 1, 1], [2, 1, 0]]
"""


# -- an independent reference: exact strings and 50-digit values ----------------------------


@dataclass
class Grid:
    """One stage: the exact entries as answers-file text, and their values."""

    exact: list[list[str]]
    value: list[list[mpmath.mpf]]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.value), len(self.value[0])


def _ints(rows) -> list[list[Fraction]]:
    return [[Fraction(x) for x in row] for row in rows]


def _fmatmul(a, b):
    return [[sum((x * row[j] for x, row in zip(r, b)), Fraction(0)) for j in range(len(b[0]))] for r in a]


def _t(a):
    return [list(c) for c in zip(*a)]


def _rational_grid(m) -> Grid:
    return Grid([[str(x) for x in row] for row in m], [[mpmath.mpf(x.numerator) / x.denominator for x in row] for row in m])


def _is_square(n: int) -> bool:
    return math.isqrt(n) ** 2 == n


def _unit(d_k: int):
    """1/√d_k as (text, value, rational-or-None)."""
    with mpmath.workdps(DPS):
        if _is_square(d_k):
            r = Fraction(1, math.isqrt(d_k))
            return str(r), mpmath.mpf(r.numerator) / r.denominator, r
        return f"1/sqrt({d_k})", 1 / mpmath.sqrt(d_k), None


class Reference:
    """All stages of one head, computed here from the raw numbers of the problem."""

    def __init__(self, Q, K, V, mask, d_k: int | None = None) -> None:
        mpmath.mp.dps = DPS
        self.Qf, self.Kf, self.Vf = Q, K, V
        n_q, n_k = len(Q), len(K)
        self.d_k = d_k or len(Q[0])
        self.allowed = mask  # n_q × n_k booleans
        self.stage: dict[str, Grid] = {}
        self.stage["Q"] = _rational_grid(Q)
        self.stage["K"] = _rational_grid(K)
        self.stage["V"] = _rational_grid(V)
        self.stage["K_T"] = _rational_grid(_t(K))
        S = _fmatmul(Q, _t(K))
        self.Sf = S
        self.stage["S"] = _rational_grid(S)
        self.stage["S_scaled"] = self.scaled_grid(S)
        self.stage["M"] = Grid(
            [["0" if a else "-inf" for a in row] for row in mask],
            [[mpmath.mpf(0) if a else NINF for a in row] for row in mask],
        )
        sc = self.stage["S_scaled"]
        self.stage["S_masked"] = Grid(
            [[sc.exact[i][j] if mask[i][j] else "-inf" for j in range(n_k)] for i in range(n_q)],
            [[sc.value[i][j] if mask[i][j] else NINF for j in range(n_k)] for i in range(n_q)],
        )
        self.stage["A"], self.stage["O"] = self.softmax_and_output(S)

    def scaled_grid(self, S) -> Grid:
        text, value, r = _unit(self.d_k)
        if r is not None:
            # unreduced fractions on purpose: "12/2", "7/2" are expressions the student may write
            exact = [[f"{s}/{r.denominator}" if r.numerator == 1 else str(s * r) for s in row] for row in S]
        else:
            exact = [[f"{s}/sqrt({self.d_k})" for s in row] for row in S]
        vals = [[mpmath.mpf(s.numerator) / s.denominator * value for s in row] for row in S]
        return Grid(exact, vals)

    def _exponent_text(self, diff: Fraction) -> str:
        """e^(diff/√d_k) as text, 1 for diff == 0."""
        if diff == 0:
            return "1"
        _, _, r = _unit(self.d_k)
        if r is not None:
            return f"e^({diff * r})"
        return f"e^(({diff})/sqrt({self.d_k}))"

    def softmax_and_output(self, S) -> tuple[Grid, Grid]:
        _, unit, _ = _unit(self.d_k)
        n_q, n_k, d_v = len(S), len(S[0]), len(self.Vf[0])
        A_ex, A_val, O_ex, O_val = [], [], [], []
        for i in range(n_q):
            keys = [j for j in range(n_k) if self.allowed[i][j]]
            top = max(S[i][j] for j in keys)
            terms = {j: self._exponent_text(S[i][j] - top) for j in keys}
            weights = {j: mpmath.exp((mpmath.mpf(S[i][j].numerator) / S[i][j].denominator - mpmath.mpf(top.numerator) / top.denominator) * unit) for j in keys}
            total = mpmath.fsum(weights.values())
            if all(t == "1" for t in terms.values()):
                den = str(len(keys))
            else:
                den = "(" + " + ".join(terms[j] for j in keys) + ")"
            A_ex.append([(("1" if den == "1" else f"1/{den}") if terms[j] == "1" else f"{terms[j]}/{den}") if j in terms else "0" for j in range(n_k)])
            A_val.append([weights[j] / total if j in weights else mpmath.mpf(0) for j in range(n_k)])
            o_ex, o_val = [], []
            for c in range(d_v):
                num = [
                    terms[j] if self.Vf[j][c] == 1 else f"({self.Vf[j][c]})" if terms[j] == "1" else f"({self.Vf[j][c]})*{terms[j]}"
                    for j in keys
                    if self.Vf[j][c] != 0
                ]
                o_ex.append("0" if not num else "(" + " + ".join(num) + f")/{den}")
                o_val.append(mpmath.fsum(weights[j] * self.Vf[j][c] for j in keys) / total)
            O_ex.append(o_ex)
            O_val.append(o_val)
        return Grid(A_ex, A_val), Grid(O_ex, O_val)


def _bools(rows) -> list[list[bool]]:
    return [[str(x).lower() in ("true", "1", "yes") for x in row] for row in rows]


def _mask(raw, n_q: int, n_k: int) -> list[list[bool]]:
    m = raw.get("mask")
    if m is None:
        return [[True] * n_k for _ in range(n_q)]
    if m == "causal":
        return [[j <= i for j in range(n_k)] for i in range(n_q)]
    return _bools(m)


def reference_for(path: Path) -> Reference:
    """The reference stages of a single-head problem file, from its raw numbers."""
    raw = yaml.load(path.read_text("utf-8"), Loader=yaml.BaseLoader)  # every scalar stays a string
    if "Q" in raw:
        Q, K, V = _ints(raw["Q"]), _ints(raw["K"]), _ints(raw["V"])
    else:
        X = _ints(raw["X"])
        Q, K, V = (_fmatmul(X, _ints(raw[w])) for w in ("W_Q", "W_K", "W_V"))
    return Reference(Q, K, V, _mask(raw, len(Q), len(K)))


# -- numeric helpers for building wrong answers ------------------------------------------------


def mp_matmul(a, b):
    return [[mpmath.fsum(x * row[j] for x, row in zip(r, b)) for j in range(len(b[0]))] for r in a]


def mp_softmax_rows(z):
    out = []
    for row in z:
        top = max(v for v in row if v != NINF)
        e = [mpmath.mpf(0) if v == NINF else mpmath.exp(v - top) for v in row]
        total = mpmath.fsum(e)
        out.append([x / total for x in e])
    return out


def mp_add_mask(z, m):
    return [[NINF if b == NINF else a + b for a, b in zip(r1, r2)] for r1, r2 in zip(z, m)]


# -- running the command ---------------------------------------------------------------------


CLI = SymattnCli()  # the conftest's symattn_cli, for the helpers below
Result = CliResult


def run(*args, cwd: Path | None = None) -> Result:
    return CLI("check", *args, cwd=cwd, catch_exceptions=False)


def check_json(problem: Path, answers: Path, *extra) -> tuple[int, dict]:
    r = run(problem, answers, "--format", "json", *extra)
    assert r.stderr == "", r.stderr
    return r.code, json.loads(r.stdout)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, "utf-8")
    return p


def statuses(report: dict) -> dict[str, str]:
    return {s["id"]: s["status"] for s in report["stages"]}


def stage_of(report: dict, sid: str) -> dict:
    (s,) = [s for s in report["stages"] if s["id"] == sid]
    return s


@pytest.fixture(scope="module")
def c4() -> Reference:
    return reference_for(CAUSAL4)


@pytest.fixture(scope="module")
def dk2() -> Reference:
    return reference_for(CAUSAL_DK2)


@pytest.fixture
def square(tmp_path) -> tuple[Path, Reference]:
    return write(tmp_path, "square.yaml", SQUARE_PROBLEM), reference_for_text(SQUARE_PROBLEM)


def reference_for_text(text: str) -> Reference:
    raw = yaml.load(text, Loader=yaml.BaseLoader)
    Q, K, V = _ints(raw["Q"]), _ints(raw["K"]), _ints(raw["V"])
    return Reference(Q, K, V, _mask(raw, len(Q), len(K)))


# -- sanity of the reference itself (hand-checked numbers) ---------------------------------------


def test_reference_matches_hand_computed_numbers(c4):
    assert c4.stage["S"].exact == [["2", "12", "8", "6"], ["12", "8", "16", "4"], ["8", "16", "16", "8"], ["6", "4", "8", "2"]]
    assert c4.stage["A"].exact[1] == ["1/(1 + e^(-2))", "e^(-2)/(1 + e^(-2))", "0", "0"]
    assert rounded(c4.stage["A"].value[1][0], 4) == "0.8808"
    assert rounded(mpmath.mpf("0.125"), 2) == "0.13"  # half away from zero
    assert rounded(mpmath.mpf("-0.125"), 2) == "-0.13"
    for row in c4.stage["A"].value:
        assert abs(mpmath.fsum(row) - 1) < mpmath.mpf(10) ** -40


# -- 1. correct answers pass -------------------------------------------------------------------


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2, PADDING], ids=lambda p: p.stem)
@pytest.mark.parametrize("form", ["exact", 2, 3, 4])
def test_correct_answers_pass(tmp_path, problem, form):
    ref = reference_for(problem)
    if form == "exact":
        stages = {s: ref.stage[s].exact for s in STAGES}
    else:
        stages = {s: rounded_grid(ref.stage[s].value, form) for s in STAGES}
    answers = write(tmp_path, "answers.yaml", answers_text(stages))
    code, report = check_json(problem, answers)
    assert statuses(report) == {s: "right" for s in STAGES}, report
    assert report["passed"] is True
    assert code == 0


def test_exact_forms_from_the_brief(tmp_path, c4):
    """ "1/2"-style fractions, "e^(-2)/(1+e^(-2))" and "-inf" written by hand."""
    text = (
        "S_scaled: [[\"2/2\", \"12/2\", 4, 3], [6, 4, 8, 2], [4, 8, 8, 4], [3, 2, 4, \"1/2 + 1/2\"]]\n"
        "M: [[0, -inf, -inf, -inf], [0, 0, -inf, -inf], [0, 0, 0, -inf], [0, 0, 0, 0]]\n"
        "S_masked: [[1, -inf, -inf, -inf], [6, 4, -inf, -inf], [4, 8, 8, -inf], [3, 2, 4, 1]]\n"
        "A:\n"
        "  - [1, 0, 0, 0]\n"
        "  - [\"1/(1+e^(-2))\", \"e^(-2)/(1+e^(-2))\", 0, 0]\n"
        "  - [\"e^(-4)/(2+e^(-4))\", \"1/(2+e^(-4))\", \"1/(2+e^(-4))\", 0]\n"
        "  - [\"e^3/(e^3+e^2+e^4+e^1)\", \"e^2/(e^3+e^2+e^4+e)\", \"exp(4)/(exp(3)+exp(2)+exp(4)+exp(1))\", \"e/(e^3+e^2+e^4+e)\"]\n"
    )
    answers = write(tmp_path, "a.yaml", text)
    code, report = check_json(CAUSAL4, answers)
    assert statuses(report) == dict.fromkeys(["S_scaled", "M", "S_masked", "A"], "right"), report
    assert code == 0


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_decimal_just_outside_half_a_unit_is_wrong(tmp_path, problem):
    ref = reference_for(problem)
    A = ref.stage["A"].value
    # the entry whose nearest wrong 4-place neighbour is closest to the exact value
    best = None
    for i, row in enumerate(A):
        for j, v in enumerate(row):
            r = rounded(v, 4)
            if v in (0, 1):
                continue
            resid = v - mpmath.mpf(r)
            step = Decimal("0.0001") if resid > 0 else Decimal("-0.0001")
            neighbour = format(Decimal(r) + step, "f")
            gap = abs(mpmath.mpf(neighbour) - v)
            if best is None or gap < best[0]:
                best = (gap, i, j, neighbour)
    gap, i, j, neighbour = best
    assert mpmath.mpf("0.00005") < gap < mpmath.mpf("0.0001")
    written = rounded_grid(A, 4)
    written[i][j] = neighbour
    answers = write(tmp_path, "a.yaml", answers_text({"A": written}))
    code, report = check_json(problem, answers)
    a = stage_of(report, "A")
    assert a["status"] == "wrong"
    assert [(w["row"], w["col"], w["given"]) for w in a["wrong"]] == [(i, j, neighbour)]
    assert f"A[{i + 1},{j + 1}]" in a["diagnosis"]  # named as the solution does, counting from 1
    assert code == 1
    code, report = check_json(problem, answers, "--tolerance", "0.01")
    assert statuses(report) == {"A": "right"} and code == 0


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_decimal_just_outside_is_wrong_when_earlier_stages_are_right(tmp_path, problem):
    ref = reference_for(problem)
    stages = {s: rounded_grid(ref.stage[s].value, 4) for s in STAGES}
    v = ref.stage["A"].value[1][0]
    written = stages["A"][1][0]
    step = Decimal("0.0001") if v > mpmath.mpf(written) else Decimal("-0.0001")
    stages["A"][1][0] = format(Decimal(written) + step, "f")  # off by 0.5..1 unit in the last place
    assert abs(mpmath.mpf(stages["A"][1][0]) - v) > mpmath.mpf("0.00005")
    answers = write(tmp_path, "a.yaml", answers_text(stages))
    code, report = check_json(problem, answers)
    assert code == 1
    assert stage_of(report, "S_masked")["status"] == "right"
    a = stage_of(report, "A")
    assert a["status"] == "wrong", a
    assert [(w["row"], w["col"]) for w in a["wrong"]] == [(1, 0)]


def test_0_8795_for_0_8808_is_wrong_unless_tolerance(tmp_path, c4):
    stages = {s: rounded_grid(c4.stage[s].value, 4) for s in STAGES}
    assert stages["A"][1][0] == "0.8808"
    stages["A"][1][0] = "0.8795"
    answers = write(tmp_path, "a.yaml", answers_text(stages))
    code, report = check_json(CAUSAL4, answers)
    a = stage_of(report, "A")
    assert a["status"] == "wrong" and code == 1
    assert [(w["row"], w["col"], w["given"]) for w in a["wrong"]] == [(1, 0, "0.8795")]
    assert abs(a["wrong"][0]["expected_approx"] - float(c4.stage["A"].value[1][0])) < 1e-12
    assert {k: v for k, v in statuses(report).items() if k != "A"} == {s: "right" for s in STAGES if s != "A"}
    code, report = check_json(CAUSAL4, answers, "--tolerance", "0.01")
    assert report["passed"] is True and code == 0


# -- 2. diagnosed mistakes ---------------------------------------------------------------------


def _diagnosis(tmp_path, problem, stages: dict[str, list[list[str]]], sid: str) -> str:
    answers = write(tmp_path, "mistake.yaml", answers_text(stages))
    code, report = check_json(problem, answers)
    s = stage_of(report, sid)
    assert s["status"] == "wrong", report
    assert code == 1
    assert "diagnosis" in s, report
    return s["diagnosis"]


def _values(ref: Reference, sid: str):
    return ref.stage[sid].value


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_no_scaling_in_S_scaled(tmp_path, problem):
    ref = reference_for(problem)
    d = _diagnosis(tmp_path, problem, {"S_scaled": ref.stage["S"].exact}, "S_scaled")
    assert "no scaling" in d


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_no_scaling_in_A(tmp_path, problem):
    ref = reference_for(problem)
    A = mp_softmax_rows(mp_add_mask(_values(ref, "S"), _values(ref, "M")))
    d = _diagnosis(tmp_path, problem, {"A": rounded_grid(A)}, "A")
    assert "no scaling" in d


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_scaled_by_d_k_instead_of_its_root(tmp_path, problem):
    ref = reference_for(problem)
    wrong = [[str(s / ref.d_k) for s in row] for row in ref.Sf]
    d = _diagnosis(tmp_path, problem, {"S_scaled": wrong}, "S_scaled")
    assert "scaled by d_k instead of √d_k" in d


def test_scaled_by_d_k_in_A(tmp_path, c4):
    z = mp_add_mask([[v / c4.d_k for v in row] for row in _values(c4, "S")], _values(c4, "M"))
    d = _diagnosis(tmp_path, CAUSAL4, {"A": rounded_grid(mp_softmax_rows(z))}, "A")
    assert "scaled by d_k instead of √d_k" in d


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_mask_missing(tmp_path, problem):
    ref = reference_for(problem)
    A = mp_softmax_rows(_values(ref, "S_scaled"))
    d = _diagnosis(tmp_path, problem, {"A": rounded_grid(A)}, "A")
    assert "mask missing" in d


def test_mask_missing_in_S_masked(tmp_path, c4):
    d = _diagnosis(tmp_path, CAUSAL4, {"S_masked": c4.stage["S_scaled"].exact}, "S_masked")
    assert "mask missing" in d
    code, report = check_json(CAUSAL4, tmp_path / "mistake.yaml")
    s = stage_of(report, "S_masked")
    masked = [(i, j) for i in range(4) for j in range(4) if not c4.allowed[i][j]]
    assert s["wrong_count"] == len(masked) == 6
    for w in s["wrong"]:  # an expected −∞ is "-oo" with a null approximation, as in derive's JSON
        assert (w["row"], w["col"]) in masked
        assert w["expected"] == "-oo" and w["expected_approx"] is None


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_mask_applied_after_softmax(tmp_path, problem):
    ref = reference_for(problem)
    A = mp_softmax_rows(_values(ref, "S_scaled"))
    A = [[v if ref.allowed[i][j] else mpmath.mpf(0) for j, v in enumerate(row)] for i, row in enumerate(A)]
    d = _diagnosis(tmp_path, problem, {"A": rounded_grid(A)}, "A")
    assert "mask applied after the softmax" in d


@pytest.mark.parametrize("problem", [CAUSAL4, CAUSAL_DK2], ids=lambda p: p.stem)
def test_softmax_over_columns(tmp_path, problem):
    ref = reference_for(problem)
    A = _t(mp_softmax_rows(_t(_values(ref, "S_masked"))))
    d = _diagnosis(tmp_path, problem, {"A": rounded_grid(A)}, "A")
    assert "softmax taken over columns instead of rows" in d


def test_K_times_Q_transposed(tmp_path, square):
    problem, ref = square
    wrong = _fmatmul(ref.Kf, _t(ref.Qf))
    assert wrong != ref.Sf
    d = _diagnosis(tmp_path, problem, {"S": [[str(x) for x in row] for row in wrong]}, "S")
    assert "K·Qᵀ instead of Q·Kᵀ" in d


def test_Q_times_K_not_transposed(tmp_path, square):
    problem, ref = square
    wrong = _fmatmul(ref.Qf, ref.Kf)
    assert wrong not in (ref.Sf, _fmatmul(ref.Kf, _t(ref.Qf)))
    d = _diagnosis(tmp_path, problem, {"S": [[str(x) for x in row] for row in wrong]}, "S")
    assert "Q·K instead of Q·Kᵀ" in d


def test_transposed_product_Q(tmp_path, c4):
    Qt = _t(c4.stage["Q"].exact)
    assert Qt != c4.stage["Q"].exact
    d = _diagnosis(tmp_path, CAUSAL4, {"Q": Qt}, "Q")
    assert "rows and columns are swapped" in d and "transpose" in d


def test_A_transposed_times_V(tmp_path, c4):
    O = mp_matmul(_t(_values(c4, "A")), _values(c4, "V"))
    d = _diagnosis(tmp_path, CAUSAL4, {"O": rounded_grid(O)}, "O")
    assert "Aᵀ·V instead of A·V" in d


def test_single_wrong_entry(tmp_path, c4):
    A = rounded_grid(_values(c4, "A"))
    A[2][1] = format(Decimal(A[2][1]) + Decimal("0.0100"), "f")
    d = _diagnosis(tmp_path, CAUSAL4, {"A": A}, "A")
    assert "a single wrong entry: A[3,2]" in d  # row 3, column 2, counting from 1


@pytest.mark.parametrize("delta", [1, -1])
def test_arithmetic_slip(tmp_path, c4, delta):
    S = [[str(x) for x in row] for row in c4.Sf]
    S[1][2] = str(c4.Sf[1][2] + delta)
    d = _diagnosis(tmp_path, CAUSAL4, {"S": S}, "S")
    assert "arithmetic slip" in d and f"S[2,3] is off by {delta:+d}" in d  # counting from 1


# -- 3. follow-through -------------------------------------------------------------------------


def _slipped(ref: Reference, i: int, j: int, delta: int = 1):
    """The stages after S recomputed numerically from S with S[i][j] off by delta."""
    S = [list(row) for row in ref.Sf]
    S[i][j] += delta
    _, unit, _ = _unit(ref.d_k)
    S_val = [[mpmath.mpf(x.numerator) / x.denominator for x in row] for row in S]
    S_scaled = [[x * unit for x in row] for row in S_val]
    S_masked = mp_add_mask(S_scaled, _values(ref, "M"))
    A = mp_softmax_rows(S_masked)
    O = mp_matmul(A, _values(ref, "V"))
    return [[str(x) for x in row] for row in S], {"S_scaled": S_scaled, "S_masked": S_masked, "A": A, "O": O}


FOLLOWS_FROM = {"S_scaled": "S", "S_masked": "S_scaled", "A": "S_masked", "O": "A"}


def _follow_through_file(tmp_path, ref) -> Path:
    S, later = _slipped(ref, 2, 1)
    stages = {"S": S, **{k: rounded_grid(v, 4) for k, v in later.items()}}
    return write(tmp_path, "follow.yaml", answers_text(stages))


def test_follow_through(tmp_path, c4):
    answers = _follow_through_file(tmp_path, c4)
    code, report = check_json(CAUSAL4, answers)
    assert statuses(report) == {"S": "wrong", **dict.fromkeys(FOLLOWS_FROM, "follows")}, report
    for sid, source in FOLLOWS_FROM.items():
        note = stage_of(report, sid)["note"]
        assert re.search(rf"\byour {source}\b", note), note
    assert "off by +1" in stage_of(report, "S")["diagnosis"]
    assert report["passed"] is False and code == 1


def test_follow_through_later_stages_right_from_the_correct_values(tmp_path, c4):
    S, _ = _slipped(c4, 2, 1)
    stages = {"S": S, **{k: c4.stage[k].exact for k in FOLLOWS_FROM}}
    answers = write(tmp_path, "a.yaml", answers_text(stages))
    code, report = check_json(CAUSAL4, answers)
    assert statuses(report) == {"S": "wrong", **dict.fromkeys(FOLLOWS_FROM, "right")}
    assert code == 1


def test_follow_through_across_skipped_stages(tmp_path, c4):
    S, later = _slipped(c4, 2, 1)
    answers = write(tmp_path, "a.yaml", answers_text({"S": S, "A": rounded_grid(later["A"])}))
    code, report = check_json(CAUSAL4, answers)
    assert statuses(report) == {"S": "wrong", "A": "follows"}, report


# -- 4. a published illustration with wrong numbers ------------------------------------------------


def test_illustration_with_wrong_rows(tmp_path, c4):
    A = rounded_grid(_values(c4, "A"), 4)
    published = [list(r) for r in A]
    published[1][0], published[1][1] = A[1][1], A[1][0]  # swapped entries
    published[2][0], published[2][1] = A[2][1], A[2][0]
    differ = {(i, j) for i in (1, 2) for j in range(4) if published[i][j] != A[i][j]}
    assert differ == {(1, 0), (1, 1), (2, 0), (2, 1)}
    answers = write(tmp_path, "figure.yaml", answers_text({"A": published}))
    code, report = check_json(CAUSAL4, answers)
    a = stage_of(report, "A")
    assert a["status"] == "wrong" and code == 1
    reported = {(w["row"], w["col"]): w for w in a["wrong"]}
    assert set(reported) == differ
    assert a.get("wrong_count", len(a["wrong"])) == len(differ)
    for (i, j), w in reported.items():
        assert w["given"] == published[i][j]
        assert isinstance(w["expected_approx"], float)
        assert abs(w["expected_approx"] - float(c4.stage["A"].value[i][j])) < 1e-4
        # the exact text reads back (as SymPy) to the same number
        assert abs(float(sympy.sympify(w["expected"])) - float(c4.stage["A"].value[i][j])) < 1e-12
    assert not any(i in (0, 3) for i, _ in reported)


# -- 5. output formats -------------------------------------------------------------------------


def test_json_contract(tmp_path, c4):
    answers = _follow_through_file(tmp_path, c4)
    code, report = check_json(CAUSAL4, answers)
    assert set(report) == {"passed", "stages"}
    assert report["passed"] is False and code == 1
    assert [s["id"] for s in report["stages"]] == ["S", *FOLLOWS_FROM]  # the formula's order
    allowed = {"id", "status", "wrong", "wrong_count", "diagnosis", "diagnosis_detail", "note", "follows_from",
               "precision", "rules", "rule_counts"}
    for s in report["stages"]:
        assert {"id", "status"} <= set(s) <= allowed
        assert s["status"] in ("right", "wrong", "follows")
        if s["status"] == "follows":
            assert isinstance(s["note"], str) and "wrong" not in s
            # machine-readable: the earlier answers (themselves not right) it rests on
            earlier = [t["id"] for t in report["stages"]][: [t["id"] for t in report["stages"]].index(s["id"])]
            assert s["follows_from"] and set(s["follows_from"]) <= set(earlier)
            assert all(r in ("exact", "rounding") for row in s["rules"] for r in row)
    s = stage_of(report, "S")
    assert s["wrong"] == [{"row": 2, "col": 1, "given": "17", "expected": "16", "expected_approx": 16.0}]
    assert isinstance(s["wrong"][0]["expected_approx"], float)
    assert isinstance(s["diagnosis"], str)
    assert s["diagnosis_detail"] == {"kind": "arithmetic slip", "text": s["diagnosis"], "entries": [{"row": 2, "col": 1}]}
    assert s["rules"][2][1] is None and s["rules"][0][0] == "exact"


def test_json_passed_true(tmp_path, c4):
    answers = write(tmp_path, "a.yaml", answers_text({"S": c4.stage["S"].exact, "A": rounded_grid(_values(c4, "A"))}))
    code, report = check_json(CAUSAL4, answers)
    A = rounded_grid(_values(c4, "A"))
    rules_A = [["rounding" if "." in x else "exact" for x in row] for row in A]  # 1 and 0 are written exactly
    assert report == {"passed": True, "stages": [
        {"id": "S", "status": "right", "rules": [["exact"] * 4] * 4, "rule_counts": {"exact": 16}},
        {"id": "A", "status": "right", "rules": rules_A,
         "rule_counts": {k: n for k in ("exact", "rounding") if (n := sum(r == k for row in rules_A for r in row))}},
    ]}
    assert code == 0


def test_markdown_table(tmp_path, c4):
    answers = _follow_through_file(tmp_path, c4)
    r = run(CAUSAL4, answers, "--format", "markdown")
    assert r.code == 1
    rows = [l for l in r.stdout.splitlines() if l.startswith("|")]
    assert len(rows) == 2 + 5  # header, separator, one row per stage
    assert "---" in rows[1]
    body = rows[2:]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in body]
    assert [c[0].replace("\\_", "_") for c in cells] == ["S", *FOLLOWS_FROM]
    assert "✗" in cells[0][1]
    for c in cells[1:]:
        assert "✓" in c[1] and "✗" not in c[1]


def _latex_report(tmp_path, c4) -> str:
    # a follow-through file plus a diagnosed mistake whose text has √, ·, ᵀ
    S, later = _slipped(c4, 2, 1)
    wrong_scaled = [[str(s / c4.d_k) for s in row] for row in c4.Sf]
    stages = {"Q": _t(c4.stage["Q"].exact), "S": S, "S_scaled": wrong_scaled, "A": rounded_grid(later["A"])}
    answers = write(tmp_path, "a_b%c.yaml", answers_text(stages))
    r = run(CAUSAL4, answers, "--format", "latex")
    assert r.code == 1 and r.stderr == ""
    return r.stdout


def test_latex_is_a_tabular(tmp_path, c4):
    tex = _latex_report(tmp_path, c4)
    assert tex.lstrip().startswith("\\begin{tabular}") and tex.rstrip().endswith("\\end{tabular}")
    assert "√" not in tex and "ᵀ" not in tex  # nothing pdflatex cannot read


def test_latex_compiles(tmp_path, c4):
    if shutil.which("pdflatex") is None:
        if os.environ.get("CI"):
            pytest.fail("pdflatex is required on CI")
        pytest.skip("pdflatex not installed")
    tex = _latex_report(tmp_path, c4)
    doc = tmp_path / "report.tex"
    doc.write_text(
        "\\documentclass{article}\n\\usepackage[utf8]{inputenc}\n\\usepackage[T1]{fontenc}\n"
        "\\begin{document}\n" + tex + "\\end{document}\n",
        "utf-8",
    )
    p = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape", doc.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stdout[-3000:]
    assert (tmp_path / "report.pdf").stat().st_size > 0


def test_text_report(tmp_path, c4):
    answers = _follow_through_file(tmp_path, c4)
    r = run(CAUSAL4, answers)
    assert r.code == 1
    lines = r.stdout.splitlines()
    assert any(l.startswith("✗ S") for l in lines)
    for sid in FOLLOWS_FROM:
        assert any(l.startswith("✓") and re.search(rf"\b{sid}\b", l) for l in lines), (sid, lines)
    assert "S[3,2]: you wrote 17" in r.stdout  # row 3, column 2, counting from 1
    good = write(tmp_path, "good.yaml", answers_text({"S": c4.stage["S"].exact}))
    r = run(CAUSAL4, good)
    assert r.code == 0 and r.stdout.startswith("✓ S") and "✗" not in r.stdout


# -- 6. batch ------------------------------------------------------------------------------------


def _batch_files(tmp_path, c4):
    a = write(tmp_path, "a.yaml", answers_text({s: rounded_grid(c4.stage[s].value, 3) for s in ("S", "A", "O")}))
    b = _follow_through_file(tmp_path, c4)
    b = b.rename(tmp_path / "b.yaml")
    c = write(tmp_path, "c.yaml", "S: [[2, 12, 8, 6],\nA: [1, 2\n")
    return a, b, c


def test_batch_text(tmp_path, c4):
    a, b, c = _batch_files(tmp_path, c4)
    shutil.copy(CAUSAL4, tmp_path / "p.yaml")
    r = run("p.yaml", "a.yaml", "b.yaml", "c.yaml", cwd=tmp_path)
    assert r.code == 1
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    by_file = {name: [l for l in lines if l.startswith(name + ":")] for name in ("a.yaml", "b.yaml", "c.yaml")}
    assert all(len(v) == 1 for v in by_file.values()), lines
    assert "all right" in by_file["a.yaml"][0]
    assert "wrong" in by_file["b.yaml"][0] and "S" in by_file["b.yaml"][0]
    assert "ERROR" in by_file["c.yaml"][0] and "c.yaml:" in by_file["c.yaml"][0].split("ERROR", 1)[1]
    assert any(re.search(r"\b1 of 3 files\b", l) for l in lines), lines
    assert "Traceback" not in r.stdout + r.stderr


def test_batch_csv(tmp_path, c4):
    _batch_files(tmp_path, c4)
    r = run(CAUSAL4, "a.yaml", "b.yaml", "c.yaml", "--format", "csv", cwd=tmp_path)
    assert r.code == 1
    rows = list(csv.reader(io.StringIO(r.stdout)))
    header, body = rows[0], rows[1:]
    assert header[:2] == ["file", "passed"]
    assert [row[0] for row in body] == ["a.yaml", "b.yaml", "c.yaml"]
    rec = {row[0]: dict(zip(header, row)) for row in body}
    assert rec["a.yaml"]["passed"] == "true" and rec["b.yaml"]["passed"] == "false"
    assert rec["a.yaml"]["S"] == "right" and rec["b.yaml"]["S"] == "wrong" and rec["b.yaml"]["A"] == "follows"
    assert rec["c.yaml"]["passed"] == "" and "c.yaml" in rec["c.yaml"]["error"]


def test_batch_all_right_exits_0(tmp_path, c4):
    a = write(tmp_path, "a.yaml", answers_text({"S": c4.stage["S"].exact}))
    b = write(tmp_path, "b.yaml", answers_text({"A": rounded_grid(_values(c4, "A"), 2)}))
    r = run(CAUSAL4, a, b)
    assert r.code == 0, r.stdout
    assert "2 of 2 files" in r.stdout


# -- 7. bad answers files ------------------------------------------------------------------------


def _one_error(r: Result, prefix: str) -> str:
    assert r.code == 1
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(prefix), (lines[0], prefix)
    return lines[0]


S_ROW = "[[2, 12, 8, 6], [12, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]"


def test_error_unknown_stage(tmp_path):
    write(tmp_path, "bad.yaml", f"S: {S_ROW}\nS_scale: [[1, 6, 4, 3], [6, 4, 8, 2], [4, 8, 8, 4], [3, 2, 4, 1]]\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:2:1: ")
    assert "S_scale" in line and "did you mean 'S_scaled'" in line


def test_error_too_few_rows(tmp_path):
    write(tmp_path, "bad.yaml", f"S: {S_ROW}\nA:\n  - [1, 0, 0, 0]\n  - [0.8808, 0.1192, 0, 0]\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:3:3: ")
    assert "4×4" in line and "2 rows" in line


def test_error_row_too_short(tmp_path):
    write(tmp_path, "bad.yaml", "A:\n  - [1, 0, 0, 0]\n  - [0.8808, 0.1192, 0]\n  - [0, 0, 0, 0]\n  - [0, 0, 0, 0]\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:3:5: ")
    assert "4 columns" in line and "3 entries" in line


def test_error_not_a_number(tmp_path):
    write(tmp_path, "bad.yaml", "S: [[2, 12, 8, 6], [12, abc, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:1:25: ")
    assert "S row 2, column 2" in line and "abc" in line


def test_error_given_stage(tmp_path):
    write(tmp_path, "bad.yaml", f"S: {S_ROW}\n\nX: [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1], [0, 1, 0, 1]]\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:3:1: ")
    assert "'X'" in line and "computed stage" in line


def test_error_yaml_syntax(tmp_path):
    write(tmp_path, "bad.yaml", "S: [[2, 12, 8, 6],\nA: [1, 2\n")
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml:")
    assert re.match(r"Error: bad\.yaml:\d+:\d+: invalid YAML", line)


@pytest.mark.parametrize("text", ["", "# nothing yet\n"], ids=["empty", "comment-only"])
def test_error_empty_file(tmp_path, text):
    write(tmp_path, "bad.yaml", text)
    # an empty file has no line or column to point at
    line = _one_error(run(CAUSAL4, "bad.yaml", cwd=tmp_path), "Error: bad.yaml: ")
    assert "empty" in line


def test_errors_through_the_console_script(tmp_path, c4, symattn_cli):
    """The real entry point: exit codes, stdout and a one-line error, no traceback."""
    write(tmp_path, "good.yaml", answers_text({s: c4.stage[s].exact for s in STAGES}))
    write(tmp_path, "bad.yaml", f"S: {S_ROW}\nS_scale: [[1]]\n")
    p = symattn_cli.entry("check", CAUSAL4, "good.yaml", "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["passed"] is True
    p = symattn_cli.entry("check", CAUSAL4, "bad.yaml", cwd=tmp_path)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert p.stderr.startswith("Error: bad.yaml:2:1: ") and "Traceback" not in p.stderr


# -- 8. multi-head ids -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def heads():
    raw = yaml.load(TWO_HEADS.read_text("utf-8"), Loader=yaml.BaseLoader)
    X = _ints(raw["X"])
    n = len(X)
    refs = []
    for h in raw["heads"]:
        Q, K, V = (_fmatmul(X, _ints(h[w])) for w in ("W_Q", "W_K", "W_V"))
        refs.append(Reference(Q, K, V, _mask(raw, n, n)))
    concat = [sum((r.stage["O"].value[i] for r in refs), []) for i in range(n)]
    W_O = [[mpmath.mpf(x.numerator) / x.denominator for x in row] for row in _ints(raw["W_O"])]
    return refs, mp_matmul(concat, W_O)


def test_two_heads_right(tmp_path, heads):
    refs, O = heads
    answers = write(tmp_path, "a.yaml", answers_text({"head1.A": rounded_grid(_values(refs[0], "A")), "O": rounded_grid(O)}))
    code, report = check_json(TWO_HEADS, answers)
    assert statuses(report) == {"head1.A": "right", "O": "right"}, report
    assert code == 0
    exact = write(tmp_path, "e.yaml", answers_text({"head2.A": refs[1].stage["A"].exact, "head1.O": refs[0].stage["O"].exact}))
    code, report = check_json(TWO_HEADS, exact)
    assert statuses(report) == {"head2.A": "right", "head1.O": "right"}, report


def test_two_heads_follow_through(tmp_path, heads):
    refs, _ = heads
    h1 = refs[0]
    A = [list(r) for r in _values(h1, "A")]
    assert A[2][0] != A[2][1]
    A[2][0], A[2][1] = A[2][1], A[2][0]
    O1 = mp_matmul(A, _values(h1, "V"))
    answers = write(tmp_path, "a.yaml", answers_text({"head1.A": rounded_grid(A), "head1.O": rounded_grid(O1)}))
    code, report = check_json(TWO_HEADS, answers)
    assert statuses(report) == {"head1.A": "wrong", "head1.O": "follows"}, report
    assert "head1.A" in stage_of(report, "head1.O")["note"]
    assert {(w["row"], w["col"]) for w in stage_of(report, "head1.A")["wrong"]} == {(2, 0), (2, 1)}
    assert code == 1


def _two_heads_output(refs, O1, W_O):
    concat = [O1[i] + refs[1].stage["O"].value[i] for i in range(len(O1))]
    return concat, mp_matmul(concat, W_O)


def test_two_heads_follow_through_to_the_output(tmp_path, heads):
    refs, _ = heads
    raw = yaml.load(TWO_HEADS.read_text("utf-8"), Loader=yaml.BaseLoader)
    W_O = [[mpmath.mpf(x) for x in row] for row in raw["W_O"]]
    A = [list(r) for r in _values(refs[0], "A")]
    A[2][0], A[2][1] = A[2][1], A[2][0]
    O1 = mp_matmul(A, _values(refs[0], "V"))
    concat, O = _two_heads_output(refs, O1, W_O)
    stages = {"head1.A": A, "head1.O": O1, "concat": concat, "O": O}
    answers = write(tmp_path, "a.yaml", answers_text({k: rounded_grid(v) for k, v in stages.items()}))
    code, report = check_json(TWO_HEADS, answers)
    assert statuses(report) == {"head1.A": "wrong", "head1.O": "follows", "concat": "follows", "O": "follows"}
    assert "your head1.O" in stage_of(report, "concat")["note"]
    assert "your concat" in stage_of(report, "O")["note"]
    assert code == 1


@pytest.mark.parametrize("sid", ["O", "concat"])
def test_two_heads_wrong_final_stage_is_marked(tmp_path, heads, sid):
    refs, O = heads
    raw = yaml.load(TWO_HEADS.read_text("utf-8"), Loader=yaml.BaseLoader)
    W_O = [[mpmath.mpf(x) for x in row] for row in raw["W_O"]]
    concat, O = _two_heads_output(refs, _values(refs[0], "O"), W_O)
    grid = rounded_grid(O if sid == "O" else concat)
    grid[0][0] = format(Decimal(grid[0][0]) + 1, "f")  # one wrong entry
    answers = write(tmp_path, "a.yaml", answers_text({sid: grid}))
    r = run(TWO_HEADS, answers, "--format", "json")
    assert r.code == 1, r.stderr
    s = stage_of(json.loads(r.stdout), sid)
    assert s["status"] == "wrong" and [(w["row"], w["col"]) for w in s["wrong"]] == [(0, 0)]
