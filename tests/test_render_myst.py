"""``-f myst``: the worked solution as MyST Markdown, built by the real mystmd (tests/node).

``myst build --html`` downloads its site theme from the network at build time, so these tests build
the site content (``myst build --site``, the same parse, label resolution, numbering and KaTeX) with
a local stub template, offline, and read mystmd's resolved document (its mdast JSON). They skip
without node or mystmd.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

import symattn

ROOT = Path(__file__).resolve().parent.parent
MYST = ROOT / "tests" / "node" / "node_modules" / ".bin" / "myst"
EXAMPLES = ROOT / "worked_examples"
needs_myst = pytest.mark.skipif(shutil.which("node") is None or not MYST.exists(),
                                reason="node or mystmd (npm ci --prefix tests/node) not installed")


def build(tmp_path: Path, text: str) -> tuple[str, dict]:
    """mystmd's output and resolved mdast of ``text`` as a one-page project."""
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "template.yml").write_text("jtex: v1\n")
    (tmp_path / "myst.yml").write_text("version: 1\nproject:\n  title: T\n  toc:\n    - file: sol.md\n"
                                       "site:\n  template: ./tpl\n")
    (tmp_path / "sol.md").write_text(text, encoding="utf-8")
    r = subprocess.run([str(MYST), "build", "--site"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (page,) = (tmp_path / "_build" / "site" / "content").glob("*.json")
    return r.stdout + r.stderr, json.loads(page.read_text(encoding="utf-8"))


def nodes(tree: dict):
    yield tree
    for child in tree.get("children", []):
        yield from nodes(child)


def clean(output: str) -> None:
    assert "⚠" not in output and "warning" not in output.lower() and "error" not in output.lower(), output


@needs_myst
def test_causal_builds_with_labels_and_the_exact_weight(tmp_path):
    d = symattn.derive(symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml"))
    output, page = build(tmp_path, symattn.render(d, "myst"))
    clean(output)
    tree = list(nodes(page["mdast"]))
    equations = [n for n in tree if n["type"] == "math"]
    assert equations and all(n.get("label", "").startswith("eq-") and n.get("enumerator") for n in equations)
    assert [n["enumerator"] for n in equations] == [str(k) for k in range(1, len(equations) + 1)]
    headings = {n.get("label") for n in tree if n["type"] == "heading"}
    assert {"stage-S", "stage-A", "stage-O"} <= headings
    # Row 2 of A: scores 4·2/2... worked by hand: Ŝ_2 = (6, 4) so a_21 = 1/(1 + e^-2) ≈ 0.8808.
    assert f"{1 / (1 + math.exp(-2)):.4f}" == "0.8808"
    assert any("0.8808" in n.get("html", "") for n in equations)  # KaTeX's HTML, as the page shows it
    assert not [n for n in tree if n["type"] in ("html", "mystRole", "mystDirective")]


@needs_myst
@pytest.mark.parametrize("name", ["two_heads", "rope_base", "gqa_4_heads_2_kv"])
def test_other_examples_build_cleanly(tmp_path, name):
    d = symattn.derive(symattn.load_problem(EXAMPLES / f"{name}.yaml"))
    output, page = build(tmp_path, symattn.render(d, "myst"))
    clean(output)
    labels = [n["label"] for n in nodes(page["mdast"]) if n.get("label") and n["type"] in ("math", "heading")]
    assert len(labels) == len(set(label.lower() for label in labels))


HOSTILE = ["<script>alert(1)</script>", "{math}", ":::", "`x`", "$y$", "{abbr}`a`", "(t)="]


@needs_myst
def test_hostile_tokens_and_title_are_text(tmp_path):
    tokens = ", ".join(json.dumps(t) for t in HOSTILE)
    source = (f"title: {json.dumps('<script>alert(2)</script> {eval}`1` :::')}\ntokens: [{tokens}]\n"
              "Q: [[1], [0], [1], [0], [1], [0], [1]]\nK: [[1], [0], [1], [0], [1], [0], [1]]\n"
              "V: [[1], [2], [3], [4], [5], [6], [7]]\nscale: none\n")
    d = symattn.derive(symattn.load_problem(source))
    output, page = build(tmp_path, symattn.render(d, "myst"))
    clean(output)
    tree = list(nodes(page["mdast"]))
    assert not [n for n in tree if n["type"] in ("html", "mystRole", "mystDirective", "inlineCode", "code")]
    assert page["frontmatter"]["title"].startswith("<script>alert(2)</script>")
    # the tokens label the matrices: math that KaTeX prints, its < as &lt; in the page's HTML
    shown = "".join(n.get("html", "") for n in tree if n["type"] == "math")
    assert "<script" not in shown and "&lt;" in shown and "alert" in shown and "abbr" in shown


@needs_myst
def test_exercise_and_solution_resolve(tmp_path):
    d = symattn.derive(symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml"))
    output, page = build(tmp_path, symattn.render(d, "myst", exercise=True, ask=frozenset({"S", "A"})))
    clean(output)
    tree = list(nodes(page["mdast"]))
    exercises = [n for n in tree if n["type"] == "exercise"]
    solutions = [n for n in tree if n["type"] == "solution"]
    assert [n["label"] for n in exercises] == ["ex-stage-S", "ex-stage-A"]
    assert len(solutions) == 2
    refs = [c for s in solutions for c in nodes(s) if c["type"] == "crossReference"]
    assert [r["label"] for r in refs][:2] == ["ex-stage-S", "ex-stage-A"] and all(r["resolved"] for r in refs[:2])
    assert any("0.8808" in n.get("html", "") for s in solutions[1:] for n in nodes(s) if n["type"] == "math")
