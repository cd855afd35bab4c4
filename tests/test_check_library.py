"""``symattn.check`` and ``symattn.check_class``: marking from Python, as ``symattn check`` marks.

Every report is compared byte for byte with the real command line (``python -m symattn check``,
a child process) on the same answers; the values a mapping gives are computed here with
Python's Fractions from the problem file, not by symattn.
"""

from __future__ import annotations

import html.parser
import json
import os
import subprocess
import sys
from fractions import Fraction

import pytest
import yaml

import symattn
from _child import ROOT, run_cli

PROBLEM = ROOT / "worked_examples" / "causal_4_tokens.yaml"

# The README's answers: S[2,1] slipped, S_scaled follows from it, A right (exact and rounded).
README_ANSWERS = """\
S: [[2, 12, 8, 6], [10, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]
S_scaled: [[1, 6, 4, 3], [5, 4, 8, 2], [4, 8, 8, 4], [3, 2, 4, 1]]
A:
  - [1, 0, 0, 0]
  - ["1/(1 + e^(-2))", 0.1192, 0, 0]
  - [0.0091, 0.4955, 0.4955, 0]
  - [0.237, 0.087, 0.644, 0.032]
"""


def _matmul(a, b):
    return [[sum(x * y for x, y in zip(row, col)) for col in zip(*b)] for row in a]


def _by_hand() -> dict[str, list[list[Fraction]]]:
    """Q, K, V, S, S_scaled of the problem, from its file, in Fractions."""
    p = yaml.safe_load(PROBLEM.read_text(encoding="utf-8"))
    X = [[Fraction(v) for v in row] for row in p["X"]]
    Q, K, V = (_matmul(X, [[Fraction(v) for v in row] for row in p[w]]) for w in ("W_Q", "W_K", "W_V"))
    S = _matmul(Q, [list(col) for col in zip(*K)])
    d_k = len(Q[0])
    assert d_k == 4  # the scale 1/√d_k is 1/2
    return {"Q": Q, "K": K, "V": V, "S": S, "S_scaled": [[s / 2 for s in row] for row in S]}


@pytest.fixture(scope="module")
def d():
    return symattn.derive(symattn.load_problem(PROBLEM))


@pytest.fixture()
def answers_file(tmp_path):
    path = tmp_path / "answers.yaml"
    path.write_text(README_ANSWERS, encoding="utf-8")
    return path


# -- the reports are the command line's, byte for byte -------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "text", "markdown", "latex"])
def test_reports_are_the_cli_output_byte_for_byte(d, answers_file, fmt):
    run = run_cli(["check", PROBLEM, answers_file, "--format", fmt])
    assert run.code == 1 and not run.err, run.err  # S is wrong: exit 1
    report = {"json": "to_json", "markdown": "to_markdown", "latex": "to_latex"}
    for given in (answers_file, str(answers_file), README_ANSWERS):
        marking = symattn.check(d, given)
        out = str(marking) if fmt == "text" else getattr(marking, report[fmt])()
        assert out == run.out, given
    assert not marking.passed


def test_the_readme_marking_read_from_python(d, answers_file):
    m = symattn.check(d, answers_file)
    assert isinstance(m, symattn.Marking)
    assert [(s.id, s.status) for s in m.stages] == [("S", "wrong"), ("S_scaled", "follows"), ("A", "right")]
    s = m.stages[0]
    assert [(w.row, w.col, w.given, w.expected) for w in s.wrong] == [(1, 0, "10", "12")]
    assert s.diagnosis.kind == "arithmetic slip"
    assert m.stages[1].follows_from == ("S",)
    assert m.stages[2].rule_counts == {"exact": 8, "rounding": 8}
    assert json.loads(m.to_json()) == m.as_dict()


@pytest.mark.parametrize("options", [["--tolerance", "0.001"], ["--precision", "exact"], ["--precision", "float32"]])
def test_options_mark_as_the_cli_marks(d, answers_file, options):
    run = run_cli(["check", PROBLEM, answers_file, "--format", "json", *options])
    kwargs = {options[0][2:]: float(options[1]) if options[0] == "--tolerance" else options[1]}
    assert symattn.check(d, answers_file, **kwargs).to_json() == run.out


# -- a mapping -------------------------------------------------------------------------------


def test_a_mapping_of_fractions_ints_strings_and_minus_inf_is_right(d):
    hand = _by_hand()
    masked = [[v if j <= i else "-inf" for j, v in enumerate(row)] for i, row in enumerate(hand["S_scaled"])]
    answers = {
        "Q": [[int(v) for v in row] for row in hand["Q"]],        # ints
        "K": [tuple(str(v) for v in row) for row in hand["K"]],   # strings, rows as tuples
        "S": hand["S"],                                           # Fractions (whole)
        "S_scaled": hand["S_scaled"],                             # Fractions
        "S_masked": masked,                                       # Fractions and '-inf'
        "A": [[1, 0, 0, 0], ["1/(1 + e^(-2))", 0.1192, 0, 0],                     # floats as typed
              [0.0091, 0.4955, 0.4955, 0], [0.237, 0.087, 0.644, 0.032]],
    }
    m = symattn.check(d, answers)
    assert m.passed, str(m)
    assert [s.id for s in m.stages] == ["Q", "K", "S", "S_scaled", "S_masked", "A"]
    assert all(s.status == "right" for s in m.stages)
    assert m.stages[4].rules[0] == ("exact",) * 4  # -inf is exactly -inf


def test_a_fraction_is_exact_and_a_float_is_the_decimal_typed(d, tmp_path):
    """A Fraction 1192/10000 is an exact value (wrong: the weight is irrational); the float 0.1192
    is the decimal 0.1192 with four places, right by rounding, as the same file marks it."""
    hand = _by_hand()
    row2 = ["1/(1 + e^(-2))", Fraction(1192, 10000), 0, 0]
    rest = [[1, 0, 0, 0], row2, [0.0091, 0.4955, 0.4955, 0], [0.237, 0.087, 0.644, 0.032]]
    m = symattn.check(d, {"A": rest})
    assert [(w.row, w.col, w.given) for w in m.stages[0].wrong] == [(1, 1, "149/1250")]
    m = symattn.check(d, {"A": [rest[0], ["1/(1 + e^(-2))", 0.1192, 0, 0], *rest[2:]]})
    assert m.passed and m.stages[0].rules[1][1] == "rounding"
    # the same answers as a file, through the command line
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump({"S_scaled": [[str(v) for v in row] for row in hand["S_scaled"]],
                                    "A": [[str(v) for v in row] for row in
                                          [rest[0], ["1/(1 + e^(-2))", "0.1192", 0, 0], *rest[2:]]]}), encoding="utf-8")
    mapping = {"S_scaled": hand["S_scaled"], "A": [rest[0], ["1/(1 + e^(-2))", 0.1192, 0, 0], *rest[2:]]}
    assert symattn.check(d, mapping).to_json() == run_cli(["check", PROBLEM, path, "-f", "json"]).out


def test_a_wrong_answer_gets_the_cli_diagnosis(d, tmp_path):
    """S_scaled left unscaled: the command line names the mistake, and so does the library."""
    hand = _by_hand()
    unscaled = {"S": hand["S"], "S_scaled": hand["S"]}
    path = tmp_path / "unscaled.yaml"
    path.write_text(yaml.safe_dump({k: [[int(v) for v in row] for row in m] for k, m in unscaled.items()}),
                    encoding="utf-8")
    cli = json.loads(run_cli(["check", PROBLEM, path, "-f", "json"]).out)
    m = symattn.check(d, unscaled)
    stage = m.stages[1]
    assert stage.status == "wrong" and stage.diagnosis.kind == "mistake"
    assert "no scaling" in stage.diagnosis.text
    assert m.as_dict() == cli
    assert str(m) == run_cli(["check", PROBLEM, path]).out


def test_numpy_rows_are_read_as_their_numbers(d):
    np = pytest.importorskip("numpy")
    hand = _by_hand()
    m = symattn.check(d, {"S": np.array([[int(v) for v in row] for row in hand["S"]]),
                          "S_scaled": np.array([[float(v) for v in row] for row in hand["S_scaled"]])})
    assert m.passed, str(m)


# -- bad input: one line, the command line's ------------------------------------------------------


@pytest.mark.parametrize("text, where", [
    ("S: [[2, 12, 8, 6], [10, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, x]]\n", ":1:62: S row 4, column 4: "),
    ("A:\n  - [1, 0, 0, 0]\n  - [1, 0, 0]\n  - [1, 0, 0, 0]\n  - [1, 0, 0, 0]\n",
     ":3:5: A row 2: A has 4 columns but this row has 3 entries"),
    ("A: [[1, 0, 0, 0]]\n", ":1:4: A: A is 4×4 but the answer has 1 rows"),
    ("S_scaledd: [[1]]\n", ":1:1: 'S_scaledd' is not a computed stage of this problem (did you mean 'S_scaled'?); the stages are Q, K, V, "),
    ("- [1]\n", ":1:1: an answers file is a mapping of stage ids to matrices"),
    ("dV: [[1]]\n", ":1:1: dV is a gradient of the backward pass"),
])
def test_bad_answers_raise_the_cli_message(d, tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    run = run_cli(["check", PROBLEM, path])
    line = run.one_error_line()
    assert run.code == 1 and line.startswith(f"Error: {path}{where}"), line
    with pytest.raises(symattn.SymattnError) as exc:
        symattn.check(d, path)
    assert str(exc.value) == line.removeprefix("Error: ")
    with pytest.raises(symattn.SymattnError) as exc:  # the same text, given as text
        symattn.check(d, text)
    assert str(exc.value) == line.removeprefix("Error: ").replace(str(path), "<answers>", 1)


def test_a_missing_file_and_a_folder(d, tmp_path):
    for path in (tmp_path / "absent.yaml", tmp_path):
        line = run_cli(["check", PROBLEM, path]).one_error_line()
        with pytest.raises(symattn.SymattnError) as exc:
            symattn.check(d, path)
        assert str(exc.value) == line.removeprefix("Error: ")
    assert str(exc.value) == f"{tmp_path}: is a folder, not an answers file"


@pytest.mark.parametrize("answers, message", [
    ({"S": [[2, 12, 8, 6], [12, 8, 16, 4], [8, "x", 16, 8], [6, 4, 8, 2]]},
     "S row 3, column 2: 'x' is not a number or a declared symbol"),
    ({"S": [[2, 12, 8, 6], [12, True, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]},
     "S row 2, column 2: expected a number, not 'True'"),
    ({"S": [[2, 12, 8, 6], [12, None, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]},
     "S row 2, column 2: expected a number, not empty"),
    ({"A": [[1, 0, 0, 0], [float("nan"), 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]},
     "A row 2, column 1: 'nan' (not a number) is not allowed; write an exact number"),
    ({"A": [[1, 0, 0, 0], [[0.5], 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]},
     "A row 2, column 1: expected a number, not a list"),
    ({"S": [[10 ** 5000, 0, 0, 0], [0] * 4, [0] * 4, [0] * 4]},
     "S row 1, column 1: the entry is longer than 2000 characters"),
    ({"S": [[1, 2, 3, 4]]}, "S: S is 4×4 but the answer has 1 rows"),
    ({"S": [[1, 2, 3, 4], [1, 2, 3], [0] * 4, [0] * 4]}, "S row 2: S has 4 columns but this row has 3 entries"),
    ({"S": 3}, "S: an answer is a matrix written as a list of rows, not '3'"),
    ({"S": []}, "S: an answer is a matrix written as a list of rows, not a list"),
    ({"Ssacled": [[1]]}, "'Ssacled' is not a computed stage of this problem"),
    ({3: [[1]]}, "a stage id is a name such as S or head1.A, not '3'"),
    ({}, "the answers have no stages"),
])
def test_a_bad_mapping_names_the_stage_and_the_entry_from_1(d, answers, message):
    with pytest.raises(symattn.SymattnError) as exc:
        symattn.check(d, answers)
    assert str(exc.value).startswith(message), str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"tolerance": -1}, "tolerance: a tolerance is a number, 0 or more, not '-1'"),
    ({"tolerance": float("nan")}, "tolerance: a tolerance is a number, 0 or more, not 'nan'"),
    ({"tolerance": "0.1"}, "tolerance: a tolerance is a number, 0 or more, not '0.1'"),
    ({"precision": "float16"}, "precision 'float16' is not one of auto, exact, float32, float64"),
])
def test_bad_options_are_one_line(d, answers_file, kwargs, message):
    with pytest.raises(symattn.SymattnError) as exc:
        symattn.check(d, answers_file, **kwargs)
    assert str(exc.value) == message


def test_answers_of_another_type_are_refused(d):
    with pytest.raises(symattn.SymattnError, match="answers are a mapping of stage ids to matrices, YAML text or "
                                                   "the path of an answers file, not 'bytes'"):
        symattn.check(d, README_ANSWERS.encode())


def test_a_fraction_tolerance_is_kept_exactly(d):
    """Within 1/3 but not 1/3 + 10^-20 away: the boundary is the Fraction's, not a float's."""
    base = _by_hand()["S"]
    exact = {"S": [[v + (Fraction(1, 3) if (i, j) == (0, 0) else 0) for j, v in enumerate(row)]
                   for i, row in enumerate(base)]}
    assert symattn.check(d, exact, tolerance=Fraction(1, 3)).passed
    over = {"S": [[v + (Fraction(1, 3) + Fraction(1, 10 ** 20) if (i, j) == (0, 0) else 0) for j, v in enumerate(row)]
                  for i, row in enumerate(base)]}
    assert not symattn.check(d, over, tolerance=Fraction(1, 3)).passed


# -- a class ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["text", "json", "csv"])
def test_check_class_is_the_cli_class_summary(d, tmp_path, answers_file, fmt):
    right = tmp_path / "right.yaml"
    right.write_text(yaml.safe_dump({"S": [[int(v) for v in row] for row in _by_hand()["S"]]}), encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    bad.write_text("S: [[1]]\n", encoding="utf-8")
    files = [answers_file, right, bad, tmp_path / "absent.yaml", answers_file]
    run = run_cli(["check", PROBLEM, *files, "--format", fmt])
    assert run.code == 1 and not run.err
    pairs = [(str(p), p) for p in files]  # answers_file twice: pairs keep both
    marked = symattn.check_class(d, pairs)
    out = {"text": str, "json": type(marked).to_json, "csv": type(marked).to_csv}[fmt](marked)
    assert out == run.out
    assert not marked.passed
    summary = {s.id: (s.answered, s.right, s.follows, s.wrong) for s in marked.summary}
    assert summary == {"S": (3, 1, 0, 2), "S_scaled": (2, 0, 2, 0), "A": (2, 2, 0, 0)}


def test_check_class_takes_a_mapping_of_names(d, answers_file):
    marked = symattn.check_class(d, {"ada": answers_file, "bob": README_ANSWERS, "cy": {"S": _by_hand()["S"]}})
    assert [(f.name, f.marking.passed) for f in marked.files] == [("ada", False), ("bob", False), ("cy", True)]
    assert str(marked).splitlines()[:3] == ["ada: wrong: S (follows: S_scaled)", "bob: wrong: S (follows: S_scaled)",
                                            "cy: all right"]
    with pytest.raises(symattn.SymattnError, match="precision"):
        symattn.check_class(d, {"ada": answers_file}, precision="float8")


# -- in a notebook ----------------------------------------------------------------------------------


class _Table(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.rows[-1].append("")

    def handle_data(self, data):
        if self.rows and self.rows[-1]:
            self.rows[-1][-1] += data


def test_the_html_table_is_escaped(d, answers_file):
    m = symattn.check(d, answers_file)
    table = _Table()
    table.feed(m._repr_html_())
    assert [r[:2] for r in table.rows] == [["stage", "verdict"], ["S", "✗ wrong"], ["S_scaled", "✓ follows"],
                                           ["A", "✓ right"]]
    assert "S[2,1]: you wrote 10, expected 12" in table.rows[1][2]
    stage = m.stages[0]
    hostile = type(m)(m.source, (type(stage)(stage.id, stage.status, (type(stage.wrong[0])(
        1, 0, "<script>alert(1)</script>", "12", 12.0),), 1),))
    page = hostile._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;" in page
    table = _Table()
    table.feed(page)
    assert set(table.tags) == {"table", "thead", "tbody", "tr", "th", "td"}
    summary = _Table()
    summary.feed(symattn.check_class(d, {"a": answers_file})._repr_html_())
    assert summary.rows[1][:4] == ["S", "0", "0", "1"]


# -- symattn.check is the function, however symattn.check was first reached ----------------------


@pytest.mark.parametrize("first", [
    "import symattn",
    "import symattn.check as m",
    "from symattn.check import mark, parse_answers",
    "from symattn import check",
    "import symattn.cli",
])
def test_symattn_check_is_callable_in_any_import_order(first, answers_file):
    code = (f"{first}\n"
            "import symattn\n"
            "from symattn.check import load_answers, mark\n"
            f"d = symattn.derive(symattn.load_problem({str(PROBLEM)!r}))\n"
            f"m = symattn.check(d, {str(answers_file)!r})\n"
            "import symattn.check as module\n"
            "from symattn import check\n"
            "assert module is check is symattn.check\n"
            f"assert m.as_dict() == mark(d, load_answers({str(answers_file)!r}, d)).as_dict()\n"
            "assert isinstance(m, symattn.Marking)\n"
            "print(m.to_json(), end='')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout == run_cli(["check", PROBLEM, answers_file, "-f", "json"]).out


def test_the_exports():
    for name in ("check", "check_class", "Marking", "ClassMarking"):
        assert name in symattn.__all__ and name in dir(symattn)
    assert callable(symattn.check) and callable(symattn.check_class)
    assert symattn.Marking is symattn.check.Marking
