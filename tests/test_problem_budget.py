"""The size budget (issue 21): problems that would run for minutes are refused before the derivation.

The figures behind the defaults come from benchmarks/stress_limits.py; here only
the rules: which budget a problem meets, that the refusal is one line naming
the budget and how to raise it, and that --max-size raises it. Nothing large
is derived, so these tests are fast.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy

import symattn
from symattn import SymattnError
from symattn.problem.budget import (DEARER, HEADS, PDF_HEADS, ROPE_WORK, SCORE_CELLS, SCORE_CELLS_IRRATIONAL, SCORE_WORK_IRRATIONAL,
                             check_budget, layer_refusal, score_cells)
from symattn.problem.budget import MAX_SIZE, fast_rope
from _child import run_cli

ROOT = Path(__file__).resolve().parent.parent


def qkv(n: int, d: int, n_k: int | None = None, scale: str = "none") -> str:
    n_k = n_k or n
    row = "[" + ", ".join(["1"] * d) + "]"
    rows = lambda k: "[" + ", ".join([row] * k) + "]"  # noqa: E731
    return f"Q: {rows(n)}\nK: {rows(n_k)}\nV: {rows(n_k)}\nscale: {scale}\n"


def problem(n: int, d: int = 1, n_k: int | None = None, scale: str = "none"):
    return symattn.load_problem(qkv(n, d, n_k, scale))


def test_defaults_are_what_the_readme_says():
    readme = (ROOT / "README.md").read_text("utf-8")
    assert f"{SCORE_CELLS:,}" in readme and f"{SCORE_CELLS_IRRATIONAL:,}" in readme
    assert f"{SCORE_WORK_IRRATIONAL:,}" in readme
    assert f"{ROPE_WORK:,}" in readme and f"{HEADS:,}" in readme and f"{PDF_HEADS:,} in a PDF" in readme


@pytest.mark.parametrize("kind, backward, limit", [
    ("latex", False, SCORE_CELLS),
    ("markdown", False, SCORE_CELLS),
    ("pdf", False, SCORE_CELLS),
    ("json", False, SCORE_CELLS // DEARER),
    ("latex", True, SCORE_CELLS // DEARER),
    ("json", True, SCORE_CELLS // DEARER // DEARER),
])
def test_score_cells_up_to_the_limit_pass_and_one_more_row_does_not(kind, backward, limit):
    rows = limit // 1000
    check_budget(problem(rows, n_k=1000), kind, backward)  # exactly at the limit
    with pytest.raises(SymattnError) as info:
        check_budget(problem(rows + 1, n_k=1000), kind, backward, file="p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml: the problem has")
    assert f"{(rows + 1) * 1000:,} attention scores ({rows + 1:,} query × 1,000 key tokens)" in message
    assert f"more than the {limit:,} the size budget allows" in message
    assert "--max-size" in message
    if kind == "json":
        assert "JSON" in message
    if backward:
        assert "the backward pass" in message


def test_max_size_raises_the_budget_in_proportion():
    p = problem(1001, n_k=1000)
    with pytest.raises(SymattnError, match=r"--max-size 1001000\b"):
        check_budget(p, "latex", False)
    check_budget(p, "latex", False, max_size=1_001_000)  # the suggested value is enough


def test_an_irrational_scale_has_its_own_budget():
    p = problem(201, 2, n_k=200, scale="auto")  # d_k = 2: scale 1/√2
    assert score_cells(p) == 40_200
    with pytest.raises(SymattnError, match="an irrational scale"):
        check_budget(p, "latex", False)
    check_budget(problem(201, 4, n_k=200, scale="auto"), "latex", False)  # 1/√4 = 1/2 is rational
    check_budget(problem(200, 2, scale="auto"), "latex", False)


def test_an_irrational_scale_with_a_wide_d_k_is_budgeted_by_score_terms():
    p = problem(10, 1001, scale="auto")  # 100 scores, but 100,100 score terms
    with pytest.raises(SymattnError) as info:
        check_budget(p, "latex", False)
    assert "100,100 score terms (100 attention scores × d_k = 1,001)" in str(info.value)
    check_budget(problem(10, 1000, scale="auto"), "latex", False)


def test_the_suggested_max_size_admits_the_problem_under_every_budget():
    p = problem(201, 3, n_k=200, scale="auto")  # beyond 40,000 scores, and beyond 100,000 score terms more so
    with pytest.raises(SymattnError, match=r"--max-size (\d+)") as info:
        check_budget(p, "latex", False)
    needed = int(re.search(r"--max-size (\d+)", str(info.value)).group(1))
    assert needed == 1_206_000  # 201 × 200 × 3 = 120,600 score terms against 100,000
    check_budget(p, "latex", False, max_size=needed)


def test_every_head_counts():
    head = "{W_Q: [[1]], W_K: [[1]], W_V: [[1]]}"
    x = "[" + ", ".join(["[1]"] * 600) + "]"
    p = symattn.load_problem(f"X: {x}\nheads: [{head}, {head}, {head}]\nW_O: [[1], [1], [1]]\nscale: none\n")
    assert score_cells(p) == 3 * 600 * 600
    with pytest.raises(SymattnError, match="× 3 heads"):
        check_budget(p, "latex", False)


def rope_problem(n: int, d: int, rope: str):
    return symattn.load_problem(f"rope: {rope}\n" + qkv(n, d))


def test_rope_on_the_fast_path_is_budgeted_like_rational_scores():
    """Rational queries and keys turned by a base's angles take RoPE's fast path (values in balls,
    exact entries built only where shown): the ordinary score budgets apply, an irrational scale
    included (d_k = 2: 1/√2), and no budget of rotated score terms."""
    assert fast_rope(rope_problem(36, 4, "{base: 10000}"))
    check_budget(rope_problem(200, 4, "{base: 10000}"), "latex", False)
    scaled = symattn.load_problem("rope: {base: 10000}\n" + qkv(200, 2, scale="auto"))
    assert scaled.scale_value == 1 / sympy.sqrt(2)
    check_budget(scaled, "latex", False)  # 1/√2: no SymPy softmax on the fast path
    check_budget(rope_problem(200, 4, '{angles: ["1/2", "1/3"]}'), "json", False)
    with pytest.raises(SymattnError, match="1,000,000 the size budget allows"):
        check_budget(rope_problem(1001, 4, "{base: 10000}"), "latex", False)


def test_rope_on_the_general_path_is_budgeted_by_rotated_score_terms():
    """Angles the fast path does not read (π/6 beside 1/3) keep cos 1/3, sin 1/3, ... in every
    SymPy score: 35 tokens with d_k = 4 is 4,900 rotated score terms, within 5,000; 36 tokens
    (5,184) is not; π/6 and π/3 alone give algebraic cosines (√3/2): the ordinary budgets apply."""
    mixed = '{angles: ["pi/6", "1/3"]}'
    assert not fast_rope(rope_problem(36, 4, mixed))
    check_budget(rope_problem(35, 4, mixed), "latex", False)
    with pytest.raises(SymattnError) as info:
        check_budget(rope_problem(36, 4, mixed), "latex", False, file="p.yaml")
    message = str(info.value)
    assert "5,184 rotated score terms (1,296 attention scores × d_k = 4, with RoPE's cos and sin kept exact)" in message
    assert f"more than the {ROPE_WORK:,} the size budget allows," in message
    assert "--max-size 1037000" in message  # 5,184 / 5,000 of the default, rounded up to a thousand
    check_budget(rope_problem(36, 4, mixed), "latex", False, max_size=1_037_000)
    with pytest.raises(SymattnError, match="more than the 1,250 the size budget allows with JSON"):
        check_budget(rope_problem(18, 4, mixed), "json", False)  # 1,296 terms
    check_budget(rope_problem(36, 4, '{angles: ["pi/6", "pi/3"]}'), "latex", False)


def many_heads(count: int) -> str:
    head = "{W_Q: [[1], [1]], W_K: [[1], [1]], W_V: [[1], [1]]}"
    w_o = "[" + ", ".join(["[1, 0]"] * count) + "]"
    return f"X: [[1, 2], [3, 1]]\nscale: none\nheads: [{', '.join([head] * count)}]\nW_O: {w_o}\n"


def test_heads_have_a_budget_of_their_own():
    """Each head has a fixed cost (its stages and steps) however small its scores: 4,097 heads of
    two tokens are 16,388 scores, far within the score budget, and still refused."""
    check_budget(symattn.load_problem(many_heads(HEADS)), "latex", False)
    p = symattn.load_problem(many_heads(HEADS + 1))
    with pytest.raises(SymattnError) as info:
        check_budget(p, "latex", False, file="p.yaml")
    assert f"the problem has {HEADS + 1:,} heads, each with stages of its own, more than the {HEADS:,}" in str(info.value)
    with pytest.raises(SymattnError, match=f"more than the {HEADS // DEARER:,} the size budget allows with JSON"):
        check_budget(symattn.load_problem(many_heads(HEADS // DEARER + 1)), "json", False)
    check_budget(symattn.load_problem(many_heads(PDF_HEADS)), "pdf", False)
    with pytest.raises(SymattnError, match=f"{PDF_HEADS + 1:,} heads, each with stages of its own and pages of a PDF, "
                                           f"more than the {PDF_HEADS:,} the size budget allows"):
        check_budget(symattn.load_problem(many_heads(PDF_HEADS + 1)), "pdf", False)
    check_budget(symattn.load_problem(many_heads(HEADS // DEARER)), "html", False)
    with pytest.raises(SymattnError, match="and sections of a web page, more than the 1,024"):
        check_budget(symattn.load_problem(many_heads(HEADS // DEARER + 1)), "html", False)


def test_a_checkpoints_layer_is_charged_for_its_heads_before_any_is_read():
    assert layer_refusal(2, 2, HEADS) is None
    why = layer_refusal(2, 2, HEADS + 1)
    assert why.startswith(f"the layer's {HEADS + 1:,} heads are more than the {HEADS:,} the size budget allows")
    assert layer_refusal(2, 2, HEADS + 1, max_size=2 * 1_000_000) is None


@pytest.mark.parametrize("args", [["derive", "p.yaml", "-f", "json"], ["derive", "p.yaml", "--backward"],
                                  ["check", "p.yaml", "a.yaml"]])
def test_the_command_line_refuses_before_deriving(tmp_path, args):
    """501 tokens: within the LaTeX budget, beyond JSON's, the backward pass's and check's
    (which derives the gradients with --backward; here its text budget suffices, so add it)."""
    (tmp_path / "p.yaml").write_text(qkv(501, 1), "utf-8")
    (tmp_path / "a.yaml").write_text("S: [[1]]\n", "utf-8")
    if args[0] == "check":
        args = [*args, "--backward"]
    done = run_cli(args, cwd=tmp_path)
    done.assert_bounded(5.0)  # CPU seconds: refused from the sizes, nothing derived
    assert done.code == 1, done.err
    assert done.out == ""
    lines = done.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: p.yaml: the problem has 251,001 attention scores"), lines
    assert "raise the budget with --max-size" in lines[0]


def test_max_size_default_is_unchanged():
    assert MAX_SIZE == 1_000_000
