"""``symattn check --format gradescope``: Gradescope's results.json, through the command line.

The fields and their types are held to Gradescope's autograder specification
(https://gradescope-autograders.readthedocs.io/en/latest/specs/, "Output format"), written out
below as :data:`TOP` and :data:`TEST`. The stages of the problem are computed here with
fractions and mpmath (tests/_reference.py), wrong answers are made from them, and every score
is counted by hand from what was made wrong.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import mpmath
import pytest
from _child import SymattnCli, child_env
from _reference import answers_text, fmatmul, fmatrix, ftranspose, rounded_grid

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "docs" / "gradescope"
TWO_HEADS = ROOT / "worked_examples" / "two_heads.yaml"
CLI = SymattnCli()

# Three tokens, d_k = 4 (the scale 1/√4 = 1/2 is rational), causal.
PROBLEM = """\
title: Three tokens for Gradescope
Q: [[1, 2, 0, 1], [0, 1, 3, 1], [2, 0, 1, 0]]
K: [[1, 0, 2, 0], [3, 1, 0, 1], [0, 2, 1, 1]]
V: [[1, 0], [0, 1], [2, 1]]
mask: causal
"""
Q = fmatrix([["1", "2", "0", "1"], ["0", "1", "3", "1"], ["2", "0", "1", "0"]])
K = fmatrix([["1", "0", "2", "0"], ["3", "1", "0", "1"], ["0", "2", "1", "1"]])
S = fmatmul(Q, ftranspose(K))
S_SCALED = [[s / 2 for s in row] for row in S]


def _softmax_causal(z) -> list[list[mpmath.mpf]]:
    with mpmath.workdps(50):
        out = []
        for i, row in enumerate(z):
            e = [mpmath.exp(mpmath.mpf(v.numerator) / v.denominator) if j <= i else mpmath.mpf(0)
                 for j, v in enumerate(row)]
            total = mpmath.fsum(e)
            out.append([x / total for x in e])
        return out


A = rounded_grid(_softmax_causal(S_SCALED), 4)


def text(m) -> list[list[str]]:
    return [[str(x) for x in row] for row in m]


# -- Gradescope's specification, field by field ------------------------------------------------

NUMBER = (int, float)
FORMATS = {"text", "html", "simple_format", "md", "ansi"}
VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
TOP = {"score": NUMBER, "execution_time": NUMBER, "output": str, "output_format": FORMATS,
       "test_output_format": FORMATS, "test_name_format": FORMATS, "visibility": VISIBILITY,
       "stdout_visibility": VISIBILITY, "extra_data": dict, "tests": list, "leaderboard": list}
TEST = {"score": NUMBER, "max_score": NUMBER, "status": {"passed", "failed"}, "name": str, "name_format": FORMATS,
        "number": str, "output": str, "output_format": FORMATS, "tags": list, "visibility": VISIBILITY,
        "extra_data": dict}


def _fields(obj: dict, spec: dict, where: str) -> None:
    assert isinstance(obj, dict), where
    for key, value in obj.items():
        assert key in spec, f"{where}: {key!r} is not a field of the specification"
        kind = spec[key]
        if isinstance(kind, set):
            assert value in kind, f"{where}.{key}: {value!r} is not one of {sorted(kind)}"
        else:
            assert isinstance(value, kind) and not isinstance(value, bool), f"{where}.{key}: {value!r}"


def assert_spec(doc: dict) -> None:
    """``doc`` is a results.json as the specification describes it, and as symattn promises:
    plain text everywhere, the score the sum of the tests', a test passed when it scored in full."""
    _fields(doc, TOP, "results")
    assert "score" in doc or all("score" in t for t in doc.get("tests", []))
    for k, t in enumerate(doc["tests"]):
        _fields(t, TEST, f"tests[{k}]")
        assert all(isinstance(tag, str) for tag in t.get("tags", []))
        if "max_score" in t:
            assert 0 <= t["score"] <= t["max_score"]
            assert (t["status"] == "passed") == (t["score"] == t["max_score"]), t
    assert doc["score"] == sum(t.get("score", 0) for t in doc["tests"])
    formats = [doc[k] for k in ("output_format", "test_output_format", "test_name_format")]
    formats += [t[k] for t in doc["tests"] for k in ("output_format", "name_format")]
    assert set(formats) == {"text"}, "a text that is not plain text could run a student's or a title's HTML"


# -- running it ------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, content: str) -> Path:
    p = tmp_path / name
    p.write_text(content, "utf-8")
    return p


def results(tmp_path: Path, answers: str | Path, *extra, problem: str | Path = PROBLEM) -> dict:
    """Mark ``answers`` (text, or a path) with --format gradescope -o; the results.json, checked."""
    p = problem if isinstance(problem, Path) else write(tmp_path, "problem.yaml", problem)
    a = answers if isinstance(answers, Path) else write(tmp_path, "answers.yaml", answers)
    out = tmp_path / "results" / "results.json"
    out.parent.mkdir(exist_ok=True)
    r = CLI("check", p, a, "--format", "gradescope", "-o", out, *extra)
    assert (r.code, r.stdout, r.stderr) == (0, "", ""), r.output
    doc = json.loads(out.read_text("utf-8"))
    assert_spec(doc)
    return doc


def scored(doc: dict) -> dict[str, dict]:
    """The stage tests by stage id (the first test is the reading check, which scores nothing)."""
    reading, *tests = doc["tests"]
    assert "max_score" not in reading and reading["visibility"] == "visible"
    return {t["extra_data"]["stage"]: t for t in tests}


# -- scores ----------------------------------------------------------------------------------


def test_every_stage_right_scores_every_point(tmp_path):
    doc = results(tmp_path, answers_text({"S": text(S), "S_scaled": text(S_SCALED), "A": A}))
    tests = scored(doc)
    assert list(tests) == ["S", "S_scaled", "A"]  # the formula's order
    assert [(t["score"], t["max_score"], t["status"]) for t in tests.values()] == [(1, 1, "passed")] * 3
    assert doc["score"] == 3
    assert doc["tests"][0]["status"] == "passed"
    assert "Score 3 of 3" in doc["output"] and "Three tokens for Gradescope" in doc["output"]


def _slip(m, i, j, by):
    out = [list(row) for row in m]
    out[i][j] += by
    return out


# (answers, each stage's score with 1 point a stage, the wrong entries (id, 0-based i, j, given, expected))
CASES = {
    "one slip in S, the rest right": (
        {"S": text(_slip(S, 1, 0, 1)), "S_scaled": text(S_SCALED), "A": A},
        {"S": 0, "S_scaled": 1, "A": 1}, [("S", 1, 0, S[1][0] + 1, S[1][0])]),
    "S_scaled follows from a slip in S": (
        {"S": text(_slip(S, 1, 0, 1)), "S_scaled": text([[s / 2 for s in row] for row in _slip(S, 1, 0, 1)]), "A": A},
        {"S": 0, "S_scaled": 1, "A": 1}, [("S", 1, 0, S[1][0] + 1, S[1][0])]),
    "S_scaled not scaled, two slips in S": (
        {"S": text(_slip(_slip(S, 0, 2, -3), 2, 1, 2)), "S_scaled": text(S)},
        {"S": 0, "S_scaled": 0}, [("S", 0, 2, S[0][2] - 3, S[0][2]), ("S", 2, 1, S[2][1] + 2, S[2][1])]),
}


@pytest.mark.parametrize("points", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_wrong_stages_score_nothing_and_say_why(tmp_path, case, points):
    answers, want, wrong = CASES[case]
    doc = results(tmp_path, answers_text(answers), *(["--points", str(points)] if points != 1 else []))
    tests = scored(doc)
    assert {sid: t["score"] for sid, t in tests.items()} == {sid: n * points for sid, n in want.items()}
    assert all(t["max_score"] == points for t in tests.values())
    assert doc["score"] == points * sum(want.values())
    assert f"Score {doc['score']} of {points * len(want)}" in doc["output"]
    for sid, i, j, given, expected in wrong:  # people count from 1
        assert f"{sid}[{i + 1},{j + 1}]: you wrote {given}, expected {expected}" in tests[sid]["output"]
    lines = tests["S"]["output"].splitlines()
    assert lines[0] == f"✗ S: {len(wrong)} wrong " + ("entry" if len(wrong) == 1 else "entries")
    assert sum(line.startswith("S[") for line in lines) == len(wrong)


def test_hide_expected_names_the_wrong_entries_without_their_values(tmp_path):
    """For students who may submit again: which entries are wrong, never what they should be
    (nor an arithmetic slip's offset, which gives the value away); the scores do not change."""
    answers = {"S": text(_slip(S, 1, 0, 1)), "A": [[x if (i, j) != (2, 0) else "0.9999" for j, x in enumerate(row)]
                                                   for i, row in enumerate(A)]}
    shown = results(tmp_path, answers_text(answers))
    hidden = results(tmp_path, answers_text(answers), "--hide-expected")
    assert [t.get("score") for t in hidden["tests"]] == [t.get("score") for t in shown["tests"]] == [None, 0, 0]
    tests = scored(hidden)
    assert tests["S"]["output"].splitlines()[1:] == [f"S[2,1]: you wrote {S[1][0] + 1}, which is not right",
                                                     "likely cause: an arithmetic slip"]
    assert "A[3,1]: you wrote 0.9999, which is not right" in tests["A"]["output"]
    out = (tmp_path / "results" / "results.json").read_text("utf-8")
    assert "expected" not in out and "off by" not in out and "≈" not in out and A[2][0] not in out
    assert "expected" in scored(shown)["S"]["output"]  # the same answers, shown in full by default


def test_follow_through_is_named_in_the_output(tmp_path):
    answers, _, _ = CASES["S_scaled follows from a slip in S"]
    t = scored(results(tmp_path, answers_text(answers)))["S_scaled"]
    assert t["extra_data"]["verdict"] == "follows" and "computed from your S" in t["output"]


def test_asked_stages_not_answered_score_nothing(tmp_path):
    doc = results(tmp_path, answers_text({"K_T": text(ftranspose(K)), "S": text(S)}), "--ask", "O,S,A,S_scaled")
    tests = scored(doc)
    assert list(tests) == ["S", "S_scaled", "A", "O"]  # the formula's order, whatever the option's
    assert [t["score"] for t in tests.values()] == [1, 0, 0, 0]
    assert [t["max_score"] for t in tests.values()] == [1] * 4 and doc["score"] == 1
    assert tests["A"]["status"] == "failed" and "not answered" in tests["A"]["output"]
    assert "Not asked, so not marked: K_T" in doc["output"]  # answered, but it scores nothing


def test_given_stages_are_no_answers(tmp_path):
    """Q, K and V are given by the problem: an answers file copying them cannot farm points; it is
    refused as the text report refuses it, a score of 0."""
    doc = results(tmp_path, answers_text({"Q": text(Q), "S": text(S)}), "--ask", "S")
    assert doc["score"] == 0 and "'Q' is not a computed stage" in doc["tests"][0]["output"]


def test_names_are_the_worked_solutions(tmp_path):
    """Each test is named ``Step n: title (id)`` as the text worked solution heads step n and titles
    the stage in it; with heads, ``Head h · Step n: ...`` for each head."""
    def check_names(problem: Path, doc: dict) -> None:
        solution = CLI("derive", problem, "--format", "text", "--no-check")
        assert solution.code == 0, solution.output
        sections = re.split(r"\n(?=(?:Head \d+ · )?Step \d+: )", solution.stdout)
        for sid, t in scored(doc).items():
            m = re.fullmatch(r"((?:Head \d+ · )?Step \d+): (.+) \((.+)\)", t["name"])
            assert m is not None and m.group(3) == sid, t["name"]
            (section,) = [s for s in sections if s.startswith(m.group(1) + ": ")]
            assert f"\n  {m.group(2)} (" in section, (t["name"], section[:300])

    doc = results(tmp_path, answers_text({"S": text(S)}), "--ask", "S,S_scaled,M,S_masked,A,O")
    check_names(tmp_path / "problem.yaml", doc)
    doc = results(tmp_path, write(tmp_path, "none.yaml", "{}\n"), "--ask", "S,A", problem=TWO_HEADS)
    heads = [t["name"].split(" · ")[0] for t in scored(doc).values()]
    assert heads == ["Head 1", "Head 1", "Head 2", "Head 2"]
    check_names(TWO_HEADS, doc)


def test_visibility_hides_the_stages_not_the_reading_check(tmp_path):
    doc = results(tmp_path, answers_text({"S": text(S)}), "--visibility", "after_due_date")
    assert doc["visibility"] == "after_due_date" and doc["stdout_visibility"] == "hidden"
    assert doc["tests"][0]["visibility"] == "visible"
    assert all("visibility" not in t for t in doc["tests"][1:])  # they take the top level's


# -- what a student may upload ---------------------------------------------------------------

MALFORMED = {
    "not YAML": "S: [[1, 2\n",
    "the wrong shape": "S: [[1, 2], [3, 4]]\n",
    "no such stage": "Sx: [[1]]\n",
    "not a number": 'S: [["two", 1, 1], [1, 1, 1], [1, 1, 1]]\n',
    "not a mapping": "- 1\n- 2\n",
    "hostile text": 'S: [["<img src=x onerror=alert(1)>", 1, 1], [1, 1, 1], [1, 1, 1]]\n',
}


@pytest.mark.parametrize("case", [*MALFORMED, "no file", "a folder"])
def test_an_answers_file_that_cannot_be_read_scores_zero_and_says_why(tmp_path, case):
    """results.json is written (exit 0) with a score of 0 and the message the text report would
    have printed as its Error: line, the reading check failed; each asked stage scores 0."""
    problem = write(tmp_path, "problem.yaml", PROBLEM)
    if case == "no file":
        answers = tmp_path / "answers.yaml"
    elif case == "a folder":
        answers = tmp_path / "answers"
        answers.mkdir()
    else:
        answers = write(tmp_path, "answers.yaml", MALFORMED[case])
    plain = CLI("check", problem, answers)
    assert plain.code == 1
    message = plain.stderr.strip().removeprefix("Error: ")
    assert str(answers) in message
    doc = results(tmp_path, answers, "--ask", "S,A", "--points", "2", problem=problem)
    reading = doc["tests"][0]
    assert (reading["status"], reading["output"]) == ("failed", message)
    assert doc["score"] == 0 and message in doc["output"] and "Score 0 of 4" in doc["output"]
    assert [(t["score"], t["max_score"]) for t in scored(doc).values()] == [(0, 2), (0, 2)]
    if case == "hostile text":
        assert "<img src=x onerror=alert(1)>" in reading["output"]  # shown as these characters, never run


def test_a_hostile_title_stays_text(tmp_path):
    title = '<script>alert("x")</script> & <b>bold</b> \u202eevil'
    problem = PROBLEM.replace("title: Three tokens for Gradescope", f"title: {json.dumps(title)}")
    problem += "tokens: ['<script>a</script>', '<i>b', '&amp;']\n"
    doc = results(tmp_path, answers_text({"S": text(S)}), problem=problem)
    out = (tmp_path / "results" / "results.json").read_text("utf-8")
    assert '<script>alert("x")</script> & <b>bold</b>' in doc["output"]  # verbatim: Gradescope shows text as text
    assert "&lt;" not in out and "&amp;lt;" not in out
    assert "\u202e" not in out  # a bidirectional control is shown, never obeyed


def test_same_input_same_bytes_through_the_entry_point(tmp_path):
    """Two runs of the console script write the same bytes, which are what the command run in
    process and the library's Marking.to_gradescope give."""
    import symattn

    answers, _, _ = CASES["S_scaled follows from a slip in S"]
    problem = write(tmp_path, "problem.yaml", PROBLEM)
    a = write(tmp_path, "answers.yaml", answers_text(answers))
    outs = []
    for k in range(2):
        out = tmp_path / f"r{k}.json"
        r = CLI.entry("check", problem, a, "--format", "gradescope", "--ask", "S,S_scaled,A,O", "-o", out)
        assert (r.code, r.stdout, r.stderr) == (0, "", ""), r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    printed = CLI("check", problem, a, "--format", "gradescope", "--ask", "S,S_scaled,A,O")
    assert printed.code == 0 and printed.stdout.encode("utf-8") == outs[0]
    marking = symattn.check(symattn.derive(symattn.load_problem(problem)), a)
    assert marking.to_gradescope(ask={"S", "S_scaled", "A", "O"}).encode("utf-8") == outs[0]


# -- what the teacher gave ---------------------------------------------------------------------

BAD_PROBLEMS = {
    "not YAML": ("Q: [[1, 2\n", ()),
    "symbols without values": ("Q: [[a, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [1]]\n", ()),
    "an asked stage it does not have": (PROBLEM, ("--ask", "dV")),
    "an asked stage it gives": (PROBLEM, ("--ask", "Q")),
}


@pytest.mark.parametrize("case", [*BAD_PROBLEMS, "no file"])
def test_a_problem_that_cannot_be_read_is_an_error_line_and_nothing_written(tmp_path, case):
    if case == "no file":
        problem, extra = tmp_path / "problem.yaml", ()
    else:
        content, extra = BAD_PROBLEMS[case]
        problem = write(tmp_path, "problem.yaml", content)
    answers = write(tmp_path, "answers.yaml", answers_text({"S": text(S)}))
    out = tmp_path / "results.json"
    r = CLI("check", problem, answers, "--format", "gradescope", "-o", out, *extra)
    assert r.code == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: "), r.stderr
    assert not out.exists()


def test_gradescope_options_need_the_format_and_one_file(tmp_path):
    problem = write(tmp_path, "problem.yaml", PROBLEM)
    answers = write(tmp_path, "answers.yaml", answers_text({"S": text(S)}))
    for extra in (["--points", "2"], ["--visibility", "hidden"], ["--ask", "S"], ["--hide-expected"]):
        r = CLI("check", problem, answers, *extra)
        assert r.code == 2 and f"{extra[0]} goes with --format gradescope" in r.stderr
    out = tmp_path / "r.json"
    r = CLI("check", problem, answers, answers, "--format", "gradescope", "-o", out)
    assert r.code == 2 and "one answers file" in r.stderr and not out.exists()


def test_output_option_writes_any_report(tmp_path):
    problem = write(tmp_path, "problem.yaml", PROBLEM)
    answers = write(tmp_path, "answers.yaml", answers_text({"S": text(_slip(S, 1, 0, 1))}))
    shown = CLI("check", problem, answers)
    r = CLI("check", problem, answers, "-o", tmp_path / "report.txt")
    assert (r.code, r.stdout) == (shown.code, "") and shown.code == 1  # a wrong answer still exits 1 here
    assert (tmp_path / "report.txt").read_text("utf-8") == shown.stdout
    before = answers.read_bytes()
    r = CLI("check", problem, answers, "--format", "gradescope", "-o", answers)
    assert r.code == 1 and "is an answers file" in r.stderr and answers.read_bytes() == before
    r = CLI("check", problem, answers, "--format", "gradescope", "-o", problem)
    assert r.code == 1 and "problem" in r.stderr and "Three tokens" in problem.read_text("utf-8")


# -- the library -------------------------------------------------------------------------------


def test_library_options_are_checked():
    import symattn
    from symattn.check import gradescope

    d = symattn.derive(symattn.load_problem(PROBLEM.replace("title:", "title: lib")))
    m = symattn.check(d, {"S": text(S)})
    for bad in ({"points": 0}, {"points": True}, {"points": 1.5}, {"visibility": "soon"}, {"ask": "S"},
                {"ask": {"Sx"}}, {"expected": "no"}):
        with pytest.raises(symattn.SymattnError):
            m.to_gradescope(**bad)
    doc = json.loads(m.to_gradescope(points=2, visibility="hidden"))
    assert_spec(doc)
    assert doc["score"] == 2 and doc["visibility"] == "hidden"
    assert set(gradescope.VISIBILITIES) == VISIBILITY
    from symattn.cli.check import VISIBILITIES  # the command line's copy

    assert VISIBILITIES == list(gradescope.VISIBILITIES)


# -- the template in docs/gradescope ---------------------------------------------------------


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("upload", ["answers.yaml", "my answers.yml", None])
def test_the_template_writes_results_json(tmp_path, upload):
    """docs/gradescope/run_autograder in a folder laid out as Gradescope's /autograder, with a
    ``symattn`` on PATH that runs this checkout."""
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    (root / "source" / "problem.yaml").write_text(PROBLEM, "utf-8")
    if upload is not None:
        answers, _, _ = CASES["one slip in S, the rest right"]
        (root / "submission" / upload).write_text(answers_text(answers), "utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "symattn"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m symattn "$@"\n', "utf-8")
    shim.chmod(0o755)
    env = child_env({"AUTOGRADER": str(root), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    r = subprocess.run(["bash", str(TEMPLATE / "run_autograder")], env=env, capture_output=True, text=True,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads((root / "results" / "results.json").read_text("utf-8"))
    assert_spec(doc)
    tests = scored(doc)
    assert list(tests) == ["S", "S_scaled", "A", "O"]  # the template's ASK
    if upload is None:
        assert doc["score"] == 0 and "answers.yaml: no such file" in doc["tests"][0]["output"]
    else:
        assert [t["score"] for t in tests.values()] == [0, 1, 1, 0]
        assert "which is not right" in tests["S"]["output"] and "expected" not in tests["S"]["output"]
        assert f"{upload}:" not in doc["output"]  # read, no message
    subprocess.run(["bash", "-n", str(TEMPLATE / "setup.sh")], check=True)
