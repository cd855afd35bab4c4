"""People count from 1: every message and worked solution names row 2, column 1 the way
the solution's subscripts do (S₂₁ is row 2, column 1); only JSON keeps 0-based indices.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy

import symattn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
GOLDEN = sorted(EXAMPLES.glob("**/*.tex")) + sorted(EXAMPLES.glob("**/*.md"))
PROBLEMS = sorted(EXAMPLES.glob("**/*.yaml"))

ZERO_BASED = [
    re.compile(r"\[\d+\]\[\d+\]"),  # X[2][1]: an entry indexed from 0, as in code
    re.compile(r"\brow 0\b"),
    re.compile(r"\bcolumn 0\b"),
]

# A 3×2 X whose row 3, column 2 is not a number: "  - [5, " is 8 characters, so the entry
# starts in column 9 of line 4.
BAD_X = (
    "X:\n"
    "  - [1, 2]\n"
    "  - [3, 4]\n"
    "  - [5, abc]\n"
    "W_Q: [[1, 0], [0, 1]]\n"
    "W_K: [[1, 0], [0, 1]]\n"
    "W_V: [[1], [0]]\n"
)
GOOD_X = BAD_X.replace("abc", "6")


@pytest.mark.parametrize(
    "text, where, field",
    [
        pytest.param(BAD_X, "4:9", "X row 3, column 2", id="X"),
        # "mask: [[1, 0, 0], [1, 1, 0], [1, " is 33 characters: the 7 starts in column 34.
        # The mask is plain numbers, so it is cut out of the text and its nodes composed only
        # for this message.
        pytest.param(GOOD_X + "mask: [[1, 0, 0], [1, 1, 0], [1, 7, 1]]\n", "8:34", "mask row 3, column 2", id="mask"),
        # "W_Q: [[1, 0], [" is 15 characters: the x starts in column 16
        pytest.param(GOOD_X.replace("W_Q: [[1, 0], [0, 1]]", "W_Q: [[1, 0], [x, 1]]"), "5:16", "W_Q row 2, column 1",
                     id="W_Q"),
        # "  - {W_Q: [[1], [0]], W_K: [[1], [" is 34 characters: the y starts in column 35
        pytest.param("X: [[1, 0]]\nheads:\n  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
                     "  - {W_Q: [[1], [0]], W_K: [[1], [y]], W_V: [[1], [0]]}\nW_O: [[1], [1]]\n",
                     "4:35", "head2.W_K row 2, column 1", id="head2.W_K"),
        pytest.param(GOOD_X.replace("  - [3, 4]", "  - [3, 4, 9]"), "3:5", "X row 2", id="ragged-row"),
        pytest.param("tokens: [a, ~, c]\n" + GOOD_X, "1:13", "tokens item 2", id="tokens"),
        pytest.param("symbols: [a, exp]\n" + GOOD_X, "1:14", "symbols item 2", id="symbols"),
    ],
)
def test_the_error_line_counts_from_1(symattn_cli, tmp_path, text, where, field):
    path = tmp_path / "p.yaml"
    path.write_text(text, "utf-8")
    r = symattn_cli.main("derive", path, "-f", "json")
    code, err = r.code, r.stderr
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"Error: {path}:{where}: {field}: "), lines[0]
    for pattern in ZERO_BASED:
        assert not pattern.search(lines[0]), lines[0]


def test_the_error_line_through_the_real_entry_point(symattn_cli, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BAD_X, "utf-8")
    r = symattn_cli.entry("derive", "p.yaml", cwd=tmp_path, how="python-m")
    assert r.returncode == 1, r.stderr
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "Error: p.yaml:4:9: X row 3, column 2: 'abc' is not a number or a declared symbol; "
        "declare it under 'symbols' to use it as a symbol"
    ]


def test_the_readme_error_example_is_what_symattn_prints(symattn_cli, tmp_path, monkeypatch):
    """README's broken.yaml line: 'abc' at row 2, column 2 of W_Q, line 7, column 9."""
    monkeypatch.chdir(tmp_path)
    Path("broken.yaml").write_text(
        "tokens: [The, cat]\nX:\n  - [1, 0]\n  - [0, 1]\nW_Q:\n  - [1, 0]\n  - [0, abc]\n"
        "W_K: [[1, 0], [0, 1]]\nW_V: [[1, 0], [0, 1]]\n",
        "utf-8",
    )
    r = symattn_cli.main("derive", "broken.yaml")
    code, err = r.code, r.stderr
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith("Error: broken.yaml:7:9: W_Q row 2, column 2: "), line
    readme = (ROOT / "README.md").read_text("utf-8")
    assert f"$ symattn derive broken.yaml\n{line}\n" in readme


def test_there_are_golden_files():
    assert len(GOLDEN) >= 20 and len(PROBLEMS) >= 10


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_golden_files_count_from_1(path):
    text = path.read_text("utf-8")
    for pattern in ZERO_BASED:
        assert not pattern.search(text), f"{pattern.pattern!r} in {path.name}: {pattern.search(text).group()}"
    # the worked entries are subscripted from 1: S_{12}, q_{1d}, (S_{lin})_{11}, never S_{01}
    assert re.search(r"[A-Za-z)]_\{1[0-9a-z]\}", text), f"no subscript counted from 1 in {path.name}"
    assert "_{0" not in text


@pytest.mark.parametrize("path", PROBLEMS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_text_solutions_count_from_1(symattn_cli, path):
    r = symattn_cli.main("derive", path, "--format", "text")
    assert r.code == 0
    text = r.stdout
    for pattern in ZERO_BASED:
        assert not pattern.search(text), f"{pattern.pattern!r} in the text of {path.name}: {pattern.search(text).group()}"
    # row and column labels start at 1 (t_1, d1, q1, ...), never at 0
    assert re.search(r"\b[A-Za-z]_?1\b", text), f"no label counted from 1 in the text of {path.name}"
    assert not re.search(r"\b[A-Za-z]_?0\b", text), f"a label counted from 0 in the text of {path.name}"


def corrupt(d, stage: str, matrix) -> symattn.Derivation:
    """A copy of ``d`` whose ``stage`` holds ``matrix`` (as tests/test_reference_crosscheck.py::corrupt)."""
    import dataclasses

    steps = tuple(dataclasses.replace(s, value=matrix) if s.id == stage else s for s in d.steps)
    bad = dataclasses.replace(d, steps=steps)
    assert bad.step(stage).exact == matrix
    return bad


def test_a_cross_check_mismatch_counts_from_1():
    d = symattn.derive(symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml"))
    wrong = d.step("S").exact.as_mutable()
    wrong[2, 0] += 1  # 0-based (2, 0): row 3, column 1, S₃₁ in the solution
    bad = corrupt(d, "S", sympy.ImmutableMatrix(wrong))
    check = symattn.crosscheck(bad)
    (m,) = check.mismatches
    assert (m.stage, m.row, m.col) == ("S", 2, 0)  # the fields stay 0-based, as JSON's
    assert str(m).startswith("S[3,1]: exact value "), str(m)
    assert " but NumPy gives " in str(m)
    # the solutions' sentence about it says the same
    for text in (symattn.render_text(bad, check=check), symattn.render_latex(bad, check=check)):
        assert "The cross-check FAILED: S[3,1]: exact value " in text


def test_the_readme_problem_snippet_is_the_worked_example_it_names():
    """README's "Problem files in short" shows worked_examples/causal_4_tokens.yaml: same
    numbers, so the S row the README shows elsewhere ([2, 12, 8, 6]) is the snippet's."""
    readme = (ROOT / "README.md").read_text("utf-8")
    snippet = re.search(r"```yaml\n(title: Causal self-attention on four tokens.*?)```", readme, re.S).group(1)
    shown = symattn.derive(symattn.load_problem(snippet))
    example = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    for sid in ("X", "W_Q", "W_K", "W_V", "S", "A", "O"):
        assert shown.step(sid).exact == example.step(sid).exact, sid
    assert [int(x) for x in example.step("S").exact.row(0)] == [2, 12, 8, 6]
    assert "[2, 12, 8, 6]" in readme
