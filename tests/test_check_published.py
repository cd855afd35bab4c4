"""symattn check on answers published by others: textbooks, tutorials, an autograder, homework.

Each pair in tests/published/ is a problem and the values its source printed, digit for digit,
with the source named in the files' first comment: rounded (PyTorch's 4 decimals, NumPy's up to
8) or float32 results printed with 7 to 17 significant digits. Every published right answer must
be marked right, by the rule its printing calls for, with no diagnosis; the two published
mistakes (Raschka's first causal attempt, and the weights before masking) must be named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _child import SymattnCli

PUBLISHED = Path(__file__).resolve().parent / "published"
CLI = SymattnCli()  # the conftest's symattn_cli, for the helper below


def check(problem: str, answers: str, *extra) -> tuple[int, dict]:
    r = CLI("check", PUBLISHED / f"{problem}.problem.yaml", PUBLISHED / f"{problem}.{answers}.yaml", "--format",
            "json", *extra, catch_exceptions=False)
    return r.exit_code, json.loads(r.stdout)


def by_id(report: dict) -> dict[str, dict]:
    return {s["id"]: s for s in report["stages"]}


# (problem, answers, the stages answered, the rules their entries are right by, precision)
RIGHT = [
    # PyTorch float32 printed to 4 decimals: the exact values rounded to the places written
    ("raschka_ch3_3", "answers", ["S", "A", "O"], {"rounding"}, None),
    # NumPy float64, trailing zeros dropped: 0.7 is exact, 1.064 rounded
    ("christoschr97_numpy", "answers", ["Q", "S", "S_scaled", "A", "O"], {"exact", "rounding"}, None),
    # float32 results printed with 7-8 significant digits (0.42693272 for 0.4269327007...)
    ("dlai_c5w4_unmasked", "answers", ["A", "O"], {"rounding", "float32"}, "float32"),
    # the same float32 results printed as Python floats, 16-17 digits (0.3836517333984375)
    ("dlai_c5w4_masked", "answers", ["A", "O"], {"exact", "rounding", "float32"}, "float32"),
    # TensorFlow float32, numpy's shortest repr (0.26894143 for 0.2689414213...)
    ("homework_tf_float32", "answers", ["A", "O"], {"rounding", "float32"}, "float32"),
]


@pytest.mark.parametrize("problem, answers, ids, rules, precision", RIGHT, ids=[r[0] for r in RIGHT])
def test_published_right_answers_are_right(problem, answers, ids, rules, precision):
    code, report = check(problem, answers)
    stages = by_id(report)
    assert code == 0 and report["passed"] is True
    assert list(stages) == ids
    for sid, s in stages.items():
        assert s["status"] == "right" and "diagnosis" not in s, (sid, s)
        assert set(s["rule_counts"]) <= rules, (sid, s["rule_counts"])
        if precision is not None and set(s["rule_counts"]) - {"exact", "rounding"}:
            assert s["precision"] == precision and s["note"] == f"matches a {precision} computation"


@pytest.mark.parametrize("problem", ["dlai_c5w4_unmasked", "dlai_c5w4_masked", "homework_tf_float32"])
def test_float32_prints_are_not_the_exact_values_rounded(problem):
    """Those printings carry float32's error in their last digits: under the rounding rule alone
    (--precision exact) they fail, which is why the float32 rule exists, and why it says so."""
    code, report = check(problem, "answers", "--precision", "exact")
    assert code == 1
    assert any(s["status"] == "wrong" for s in report["stages"])
    code, report = check(problem, "answers", "--precision", "float32")
    assert code == 0


def test_raschka_causal_weights_are_right_and_its_masked_scores_are_unscaled():
    """The book masks the unscaled scores and scales afterwards: filed as S_masked (which is
    S/√d_k + M here), its printed matrix is the scores not divided by √d_k; its weights are right."""
    code, report = check("raschka_ch3_5_causal", "scores_masked_before_scaling")
    stages = by_id(report)
    assert stages["A"]["status"] == "right"
    s = stages["S_masked"]
    assert s["status"] == "wrong" and s["wrong_count"] == 21  # every allowed score of the 6×6 causal matrix
    assert s["diagnosis_detail"]["kind"] == "mistake"
    assert s["diagnosis"].startswith("no scaling")


@pytest.mark.parametrize("answers, mistake", [
    ("mask_after_softmax", "mask applied after the softmax"),  # the book's deliberate first attempt, 3.5.1
    ("unmasked_weights", "mask missing"),  # the weights printed before the mask, filed as the causal A
])
def test_raschka_published_mistakes_are_named(answers, mistake):
    code, report = check("raschka_ch3_5_causal", answers)
    a = by_id(report)["A"]
    assert code == 1 and a["status"] == "wrong"
    assert a["diagnosis_detail"]["kind"] == "mistake" and a["diagnosis"].startswith(mistake)
