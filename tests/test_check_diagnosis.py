"""symattn check: verdicts and diagnoses a teacher can trust, float-printed answers, a class summary.

Every expected value here is computed in the test, independently of symattn: the stages
with mpmath at 50 digits (from the problem's integers), float32/float64 runs with NumPy,
and each common mistake written out again by hand.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import mpmath
import numpy as np
import pytest

from _child import SymattnCli
from _reference import answers_text, rounded, rounded_grid

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
NINF = mpmath.ninf
mpmath.mp.dps = 50


CLI = SymattnCli()  # the conftest's symattn_cli, for the helpers below


def run(*args) -> tuple[int, str]:
    r = CLI("check", *args, catch_exceptions=False)
    return r.exit_code, r.stdout + r.stderr


def check_json(problem, answers, *extra) -> tuple[int, dict]:
    r = CLI("check", problem, answers, "--format", "json", *extra, catch_exceptions=False)
    return r.exit_code, json.loads(r.stdout)


def stage(report: dict, id: str) -> dict:
    return next(s for s in report["stages"] if s["id"] == id)


# -- an independent reference: one head, integer inputs -------------------------------------


def mm(a, b):
    return [[mpmath.fsum(x * row[j] for x, row in zip(r, b)) for j in range(len(b[0]))] for r in a]


def tr(a):
    return [list(c) for c in zip(*a)]


def softmax_rows(z):
    out = []
    for row in z:
        finite = [v for v in row if v != NINF]
        if not finite:
            return None
        m = max(finite)
        e = [mpmath.mpf(0) if v == NINF else mpmath.exp(v - m) for v in row]
        out.append([x / mpmath.fsum(e) for x in e])
    return out


def add_mask(z, allowed):
    return [[v if ok else NINF for v, ok in zip(r, a)] for r, a in zip(z, allowed)]


class Head:
    """Q, K, V given as integers, a mask, the scale 1/√d_k."""

    def __init__(self, Q, K, V, allowed):
        self.Q, self.K, self.V = ([[mpmath.mpf(x) for x in r] for r in m] for m in (Q, K, V))
        self.allowed = allowed
        self.ints = (Q, K, V)
        self.d_k = len(Q[0])
        self.S = mm(self.Q, tr(self.K))
        self.scale = 1 / mpmath.sqrt(self.d_k)
        self.S_scaled = [[x * self.scale for x in r] for r in self.S]
        self.A = softmax_rows(add_mask(self.S_scaled, allowed))
        self.O = mm(self.A, self.V)

    def problem(self, mask_text: str) -> str:
        Q, K, V = self.ints
        return f"Q: {Q}\nK: {K}\nV: {V}\nmask: {mask_text}\n"

    # the common mistakes, written again here
    def mistakes(self) -> dict[str, dict[str, list]]:
        out: dict[str, dict[str, list]] = {"S": {}, "S_scaled": {}, "A": {}, "O": {}}
        out["S"]["K·Qᵀ instead of Q·Kᵀ"] = mm(self.K, tr(self.Q))
        out["S_scaled"]["no scaling"] = self.S
        out["S_scaled"]["scaled by d_k instead of √d_k"] = [[x / self.d_k for x in r] for r in self.S]
        weights = {
            "no scaling": softmax_rows(add_mask(self.S, self.allowed)),
            "scaled by d_k instead of √d_k": softmax_rows(add_mask([[x / self.d_k for x in r] for r in self.S], self.allowed)),
            "mask missing": softmax_rows(self.S_scaled),
            "mask applied after the softmax": [[x if ok else mpmath.mpf(0) for x, ok in zip(r, a)]
                                               for r, a in zip(softmax_rows(self.S_scaled), self.allowed)],
        }
        masked = add_mask(self.S_scaled, self.allowed)
        if all(any(v != NINF for v in col) for col in tr(masked)):
            weights["softmax taken over columns"] = tr(softmax_rows(tr(masked)))
        for name, a in weights.items():
            if a is not None:
                out["A"][name] = a
                out["O"][name] = mm(a, self.V)
        out["O"]["Aᵀ·V instead of A·V"] = mm(tr(self.A), self.V)
        return out


def causal(n: int) -> list[list[bool]]:
    return [[j <= i for j in range(n)] for i in range(n)]


# -- a diagnosis only when it explains the answer ------------------------------------------------


def test_no_mask_near_right_names_no_mask_mistake(tmp_path):
    """On a problem without a mask, 'mask missing' changes nothing, so it is never the cause:
    a 2-decimal answer with errors up to 0.011 is wrong, and at most called rounding slips."""
    h = Head([[1, 0], [0, 2], [1, 1]], [[1, 1], [0, 1], [2, 0]], [[1, 0], [0, 1], [1, 1]], [[True] * 3] * 3)
    (tmp_path / "p.yaml").write_text(h.problem("none"))
    written = rounded_grid(h.A, 2)
    # push three entries off by up to 0.011 (one hundredth and a little)
    for (i, j), delta in {(0, 0): 0.011, (1, 2): -0.009, (2, 1): 0.008}.items():
        written[i][j] = f"{float(written[i][j]) + delta:.3f}"
    (tmp_path / "a.yaml").write_text(answers_text({"A": written}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    a = stage(report, "A")
    assert code == 1 and a["status"] == "wrong"
    assert "mask" not in a.get("diagnosis", "")
    assert a.get("diagnosis_detail", {}).get("kind") in (None, "rounding slips", "single entry")
    code, text = run(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert "mask missing" not in text


def test_a_mistake_that_changes_nothing_is_never_named(tmp_path):
    """No mask: the answer computed 'without the mask' is the right answer, and is marked right."""
    h = Head([[1, 0], [0, 2]], [[1, 1], [0, 1]], [[1, 0], [0, 1]], [[True] * 2] * 2)
    (tmp_path / "p.yaml").write_text(h.problem("none"))
    (tmp_path / "a.yaml").write_text(answers_text({"A": rounded_grid(h.mistakes()["A"]["mask missing"], 4)}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert code == 0 and stage(report, "A") == {**stage(report, "A"), "status": "right"}
    assert "diagnosis" not in stage(report, "A")


def test_one_coarse_entry_does_not_widen_the_slack_of_the_rest(tmp_path):
    """A single `0` written as `0.0` (half a unit: 0.05) must not let a wrong answer elsewhere
    pass for a mistake: each entry is judged at its own precision."""
    h = Head([[1, 2], [0, 1], [2, 1]], [[1, 0], [1, 1], [0, 2]], [[2, 0], [1, 1], [0, 3]], causal(3))
    (tmp_path / "p.yaml").write_text(h.problem("causal"))
    written = rounded_grid(h.A, 8)
    written[0][1] = "0.0"  # masked: exactly 0, written coarsely
    i, j = 2, 0
    written[i][j] = rounded(h.A[i][j] + mpmath.mpf("2e-8"), 8)  # 4 units off in the 8th place
    (tmp_path / "a.yaml").write_text(answers_text({"A": written}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml", "--precision", "exact")
    a = stage(report, "A")
    assert a["status"] == "wrong" and [(w["row"], w["col"]) for w in a["wrong"]] == [(i, j)]
    assert a["diagnosis_detail"]["kind"] != "mistake", a["diagnosis"]
    assert "scaling" not in a["diagnosis"] and "mask" not in a["diagnosis"]
    # by default the same answer is what a float32 computation prints: right, and said so
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    a = stage(report, "A")
    assert code == 0 and a["status"] == "right" and a["precision"] == "float32"
    assert a["note"] == "matches a float32 computation" and a["rules"][i][j] == "float32"
    assert a["rules"][0][1] == "rounding"


def test_json_lists_every_wrong_entry(tmp_path):
    h = Head([[1, 0, 2], [0, 1, 1], [2, 1, 0]], [[1, 1, 0], [0, 2, 1], [1, 0, 1]], [[1], [2], [3]], [[True] * 3] * 3)
    (tmp_path / "p.yaml").write_text(h.problem("none"))
    S = [[str(int(x) + 7) for x in r] for r in h.S]  # all 9 entries wrong, no common mistake
    (tmp_path / "a.yaml").write_text(answers_text({"S": S}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    s = stage(report, "S")
    assert s["wrong_count"] == 9 and len(s["wrong"]) == 9
    assert sorted((w["row"], w["col"]) for w in s["wrong"]) == [(i, j) for i in range(3) for j in range(3)]
    for w in s["wrong"]:
        assert w["given"] == str(int(h.S[w["row"]][w["col"]]) + 7) and w["expected"] == str(int(h.S[w["row"]][w["col"]]))
    code, text = run(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert "... and 4 more" in text  # the text report elides; JSON does not


# -- float-printed answers -------------------------------------------------------------------------


def _float_run(h: Head, dtype):
    """The head computed in a binary format the way an autograder would (max-subtracted softmax)."""
    Q, K, V = (np.array(m, dtype=dtype) for m in h.ints)
    S = Q @ K.T
    Z = S / np.sqrt(dtype(h.d_k))
    Z = np.where(np.array(h.allowed), Z, -np.inf).astype(dtype)
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return A, A @ V


@pytest.mark.parametrize("dtype, digits, fmt", [(np.float32, 8, "float32"), (np.float64, 17, "float64")])
def test_float_printed_answers_are_right_as_that_computation(tmp_path, dtype, digits, fmt):
    h = Head([[1, 2, 0], [0, 1, 3], [2, 1, 1], [1, 0, 1]], [[1, 0, 1], [2, 1, 0], [0, 1, 1], [1, 1, 1]],
             [[1, 2], [0, 1], [3, 0], [1, 1]], causal(4))
    (tmp_path / "p.yaml").write_text(h.problem("causal"))
    A, O = _float_run(h, dtype)
    text = lambda m: [[f"{x:.{digits}g}" for x in r] for r in m.tolist()]  # noqa: E731
    (tmp_path / "a.yaml").write_text(answers_text({"A": text(A), "O": text(O)}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml", "--precision", "exact")
    assert code == 1  # their digits go beyond the exact values rounded to the places written
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert code == 0, report
    for sid in ("A", "O"):
        s = stage(report, sid)
        assert s["status"] == "right" and s["note"] == f"matches a {fmt} computation"
        assert set(s["rule_counts"]) <= {"exact", "rounding", fmt} and s["rule_counts"].get(fmt, 0) > 0
    code, text_report = run(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert f"matches a {fmt} computation" in text_report and f"to {fmt}'s rounding" in text_report
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml", "--precision", fmt)
    assert code == 0


def test_a_real_error_is_not_excused_as_float32(tmp_path):
    h = Head([[1, 2], [0, 1], [2, 1]], [[1, 0], [1, 1], [0, 2]], [[2, 0], [1, 1], [0, 3]], causal(3))
    (tmp_path / "p.yaml").write_text(h.problem("causal"))
    A, _ = _float_run(h, np.float32)
    written = [[f"{x:.8g}" for x in r] for r in A.tolist()]
    written[2][1] = f"{A[2][1] + 1e-4:.8g}"  # a slip of 1e-4: far beyond float32's rounding
    (tmp_path / "a.yaml").write_text(answers_text({"A": written}))
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml", "--precision", "float32")
    a = stage(report, "A")
    assert code == 1 and [(w["row"], w["col"]) for w in a["wrong"]] == [(2, 1)]
    assert all(r == "float32" or r in ("exact", "rounding") for row in a["rules"] for r in row if r is not None)


# -- rounded answers pass, mistaken answers are named (property) ---------------------------------


def _random_head(rng: random.Random) -> tuple[Head, str]:
    n, d_k, d_v = rng.randint(2, 4), rng.choice([1, 2, 4]), rng.randint(1, 3)
    m = lambda r, c: [[rng.randint(-2, 2) for _ in range(c)] for _ in range(r)]  # noqa: E731
    mask = rng.choice(["none", "causal"])
    return Head(m(n, d_k), m(n, d_k), m(n, d_v), causal(n) if mask == "causal" else [[True] * n] * n), mask


def test_rounded_answers_pass_without_diagnosis(tmp_path):
    rng = random.Random(15)
    for case in range(40):
        h, mask = _random_head(rng)
        places = rng.randint(1, 6)
        (tmp_path / "p.yaml").write_text(h.problem(mask))
        stages = {"S": rounded_grid(h.S, places), "S_scaled": rounded_grid(h.S_scaled, places),
                  "A": rounded_grid(h.A, places), "O": rounded_grid(h.O, places)}
        (tmp_path / "a.yaml").write_text(answers_text(stages))
        code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
        assert code == 0, (case, places, report)
        assert all(s["status"] == "right" and "diagnosis" not in s for s in report["stages"])


def _named(diagnosis: str, mistake: str) -> bool:
    key = {"mask applied after the softmax": "mask applied after the softmax",
           "softmax taken over columns": "softmax taken over columns"}.get(mistake, mistake)
    return key in diagnosis


MISTAKE_RATE = 0.95


def test_each_mistake_is_named(tmp_path):
    """Answers made by one listed mistake (rounded to 2 to 6 places) are diagnosed as that mistake,
    or a tie that includes it, in at least 95% of the cases where the mistake changes the answer."""
    rng = random.Random(1515)
    tried = named = 0
    misses = []
    for case in range(60):
        h, mask = _random_head(rng)
        (tmp_path / "p.yaml").write_text(h.problem(mask))
        right = {"S": h.S, "S_scaled": h.S_scaled, "A": h.A, "O": h.O}
        places = rng.randint(2, 6)
        for sid, mistakes in h.mistakes().items():
            for name, values in mistakes.items():
                written = rounded_grid(values, places)
                if written == rounded_grid(right[sid], places):
                    continue  # the mistake changes nothing at these places: the answer is right
                (tmp_path / "a.yaml").write_text(answers_text({sid: written}))
                code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
                s = stage(report, sid)
                tried += 1
                if s["status"] == "wrong" and _named(s.get("diagnosis", ""), name):
                    named += 1
                else:
                    misses.append((case, sid, name, s.get("diagnosis")))
    rate = named / tried
    print(f"\nmistakes named: {named} of {tried} ({rate:.1%})")
    assert tried > 200
    assert rate >= MISTAKE_RATE, misses[:10]


# -- a class ---------------------------------------------------------------------------------------


def test_class_summary(tmp_path, symattn_cli):
    h = Head([[1, 0], [0, 2], [1, 1]], [[1, 1], [0, 1], [2, 0]], [[1, 0], [0, 1], [1, 1]], causal(3))
    (tmp_path / "p.yaml").write_text(h.problem("causal"))
    good = {"S": rounded_grid(h.S, 0), "A": rounded_grid(h.A, 4)}
    unscaled = {"S": rounded_grid(h.S, 0), "A": rounded_grid(h.mistakes()["A"]["no scaling"], 4)}
    files = []
    for k, answers in enumerate([good, good, unscaled, unscaled, unscaled]):
        files.append(tmp_path / f"s{k}.yaml")
        files[-1].write_text(answers_text(answers))
    r = symattn_cli("check", tmp_path / "p.yaml", *files, "--format", "json")
    data = json.loads(r.stdout)
    assert r.exit_code == 1 and [f["file"] for f in data["files"]] == list(map(str, files))
    summary = {s["id"]: s for s in data["summary"]}
    assert summary["S"] == {"id": "S", "answered": 5, "right": 5, "follows": 0, "wrong": 0}
    assert summary["A"]["right"] == 2 and summary["A"]["wrong"] == 3
    assert summary["A"]["most_common_diagnosis"]["count"] == 3
    assert "no scaling" in summary["A"]["most_common_diagnosis"]["text"]
    r = symattn_cli("check", tmp_path / "p.yaml", *files)
    table = r.stdout.split("The class, stage by stage:", 1)[1].splitlines()
    row = next(line for line in table if line.startswith("A "))
    assert re.match(r"A\s+2\s+0\s+3\s+no scaling.*\(3\)$", row), row


# -- people count from 1 ---------------------------------------------------------------------------


def test_check_reports_count_from_1(tmp_path, symattn_cli):
    h = Head([[1, 0], [0, 2], [1, 1]], [[1, 1], [0, 1], [2, 0]], [[1, 0], [0, 1], [1, 1]], causal(3))
    (tmp_path / "p.yaml").write_text(h.problem("causal"))
    S = rounded_grid(h.S, 0)
    S[1][0] = str(int(S[1][0]) + 1)  # row 2, column 1
    (tmp_path / "a.yaml").write_text(answers_text({"S": S}))
    for fmt in ("text", "markdown", "latex"):
        r = symattn_cli("check", tmp_path / "p.yaml", tmp_path / "a.yaml", "--format", fmt)
        shown = r.stdout.replace("\\[", "[").replace("\\]", "]")  # Markdown escapes the brackets
        assert "S[2,1]" in shown, r.stdout
        assert not re.search(r"\[\d+\]\[\d+\]", r.stdout)
    code, report = check_json(tmp_path / "p.yaml", tmp_path / "a.yaml")
    assert stage(report, "S")["wrong"][0]["row"] == 1 and stage(report, "S")["wrong"][0]["col"] == 0  # JSON: from 0
