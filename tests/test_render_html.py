"""The web page (``-o solution.html``) without a browser: its structure, safety and values.

The page is parsed with Python's own HTML parser into a small tree; its numbers are compared
with values computed here with NumPy, its Content-Security-Policy with hashes computed here.
``test_render_html_browser.py`` drives it in a real Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

import symattn
from symattn.render.html import render_html

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml")) + sorted((ROOT / "worked_examples" / "large").glob("*.yaml"))
VOID = {"meta", "br", "input", "img", "hr", "link", "area", "base", "col", "embed", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict, parent: "Node | None") -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.text: list[str] = []

    def all_text(self) -> str:
        return "".join(self.text) + "".join(c.all_text() for c in self.children)

    def walk(self):
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, tag: str | None = None, **attrs):
        for n in self.walk():
            if (tag is None or n.tag == tag) and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items()):
                yield n

    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())


class Tree(HTMLParser):
    """A strict little DOM: every element must be closed where HTML does not close it by itself."""

    SELF_CLOSING_MATH = {"mspace"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", {}, None)
        self.cur = self.root
        self.errors: list[str] = []
        self.feed(text)
        self.close()
        if self.cur is not self.root:
            self.errors.append(f"unclosed <{self.cur.tag}>")

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), self.cur)
        self.cur.children.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, dict(attrs), self.cur))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if self.cur.tag != tag:
            self.errors.append(f"</{tag}> closes <{self.cur.tag}>")
            return
        self.cur = self.cur.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def _page(path: Path, **kw) -> tuple[str, "symattn.Derivation"]:
    d = symattn.derive(symattn.load_problem(path))
    return render_html(d, check=symattn.crosscheck(d), **kw), d


def _sha(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _cells(tree: Tree, stage: str, form: str) -> dict[tuple[int, int], Node]:
    tables = [t for t in tree.root.find("table") if t.attrs.get("data-stage") == stage and t.attrs.get("data-form") == form]
    assert len(tables) == 1, (stage, form, len(tables))
    return {(int(td.attrs["data-row"]), int(td.attrs["data-col"])): td
            for td in tables[0].find("td") if "entry" in td.classes()}


# -- every worked example --------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_worked_example_is_a_well_formed_self_contained_page(path):
    text, d = _page(path)
    tree = Tree(text)
    assert not tree.errors, tree.errors[:5]
    # one style and one script, both allowed by their hashes and by nothing else
    styles = list(tree.root.find("style"))
    scripts = list(tree.root.find("script"))
    assert len(styles) == 1 and len(scripts) == 1
    (meta,) = [m for m in tree.root.find("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy"]
    csp = dict(part.strip().split(" ", 1) for part in meta.attrs["content"].split(";"))
    assert csp["default-src"] == "'none'"
    assert csp["style-src"] == f"'{_sha(styles[0].all_text())}'"
    assert csp["script-src"] == f"'{_sha(scripts[0].all_text())}'"
    # nothing is loaded: no src or href leaves the page
    for node in tree.root.walk():
        for name, value in node.attrs.items():
            assert not name.startswith("on"), (node.tag, name)
            if name in ("src", "href", "action", "srcset"):
                assert value.startswith("#"), (node.tag, name, value)
    assert not list(tree.root.find("merror"))
    for math in tree.root.find("math"):
        assert not re.search(r"\\[A-Za-z]", math.all_text()), math.all_text()[:200]
    # every stage of the derivation has its matrix
    shown = {t.attrs["data-stage"] for t in tree.root.find("table") if "data-stage" in t.attrs}
    assert shown == set(d.ids)
    # the table of contents links every section, and only them
    links = [a.attrs["href"][1:] for a in next(tree.root.find("nav")).find("a")]
    sections = [s.attrs["id"] for s in tree.root.find("section")]
    assert links == sections and len(set(sections)) == len(sections)


def test_the_page_is_deterministic(symattn_cli, tmp_path):
    """The same problem gives the same bytes: from the real entry point and from click's runner
    (the golden page, rendered without the cross-check, is checked by test_render_golden.py)."""
    out = tmp_path / "solution.html"
    problem = str(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    done = symattn_cli.entry("derive", problem, "-o", out, how="python-m")
    assert done.code == 0, done.stderr
    again = symattn_cli("derive", problem, "-f", "html")
    assert again.exit_code == 0, again.output
    assert out.read_text("utf-8") == again.output
    assert "Every stage agrees with an independent NumPy float64 evaluation" in again.output


# -- the numbers ---------------------------------------------------------------------------


def _number(td: Node) -> float:
    text = td.all_text().replace("\u2212", "-").replace("\u00d7", "*")
    m = re.fullmatch(r"(-?[0-9.]+)(?:\*10(-?[0-9]+))?", text.strip())
    assert m, text
    return float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1)


def test_the_scores_and_weights_on_the_page_are_numpys():
    from symattn.render.shades import DARKEST

    path = ROOT / "worked_examples" / "causal_4_tokens.yaml"
    raw = yaml.safe_load(path.read_text())
    X, WQ, WK, WV = (np.array(raw[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    S = (X @ WQ) @ (X @ WK).T
    n = len(X)
    masked = np.triu(np.ones((n, n), bool), 1)
    Sh = np.where(masked, -np.inf, S / np.sqrt(WQ.shape[1]))
    A = np.exp(Sh - Sh.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    O = A @ (X @ WV)
    text, _ = _page(path)
    tree = Tree(text)
    for (i, j), td in _cells(tree, "S", "exact").items():
        assert _number(td) == S[i, j]
    weights = _cells(tree, "A", "decimal")
    assert len(weights) == n * n
    for (i, j), td in weights.items():
        assert _number(td) == pytest.approx(A[i, j], rel=5e-4, abs=1e-12)
        # shaded as in the PDF (1 − (1 − DARKEST)·w of white, in hundredths), masked entries hatched instead
        if masked[i, j]:
            assert "masked" in td.classes()
        else:
            assert f"g{round(100 * (1 - (1 - DARKEST) * A[i, j]))}" in td.classes()
    for (i, j), td in _cells(tree, "O", "decimal").items():
        assert _number(td) == pytest.approx(O[i, j], rel=5e-4)
    # the exact weights carry their decimals for the toggle
    exact = _cells(tree, "A", "exact")
    dec = [n for n in exact[1, 0].find("span") if "dec" in n.classes()]
    assert _number(dec[0]) == pytest.approx(A[1, 0], rel=5e-4)


def test_what_each_entry_is_made_of():
    text, _ = _page(ROOT / "worked_examples" / "two_heads.yaml")
    tree = Tree(text)
    traces = {t.attrs["data-stage"]: t.attrs.get("data-traces") for t in tree.root.find("table")
              if t.attrs.get("data-form") == "exact"}
    assert traces["head2.S"] == "head2.Q:row head2.K_T:col"
    assert traces["head1.A"] == "head1.S_masked:row"
    assert traces["head1.O"] == "head1.A:row head1.V:col"
    assert traces["head2.K_T"] == "head2.K:T"
    assert traces["O"] == "concat:row W_O:col"
    assert traces["W_O"] is None and traces["X"] is None  # given
    # the dot product of S[1,2] of head 2 (1-based) is explained entry by entry
    table = [t for t in tree.root.find("table") if t.attrs.get("data-stage") == "head2.S"][0]
    parent = table.parent
    k = parent.children.index(table)
    templates = [n for n in parent.children[k + 1:] if n.tag == "template"]
    (one,) = [t for t in templates if t.attrs["data-row"] == "0" and t.attrs["data-col"] == "1"]
    assert "q" in one.all_text() and "k" in one.all_text()


# -- hostile text ----------------------------------------------------------------------------

HOSTILE = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "javascript:alert(1)", "a&amp;b"]


def _hostile_problem(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump({
        "title": "</title><script>alert(2)</script>",
        "tokens": HOSTILE,
        "X": [[1, 0], [0, 1], [1, 1], [0, 2]],
        "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]],
        "mask": "causal",
    }), "utf-8")
    return path


def test_hostile_tokens_are_text_and_leave_no_active_content(tmp_path):
    text, _ = _page(_hostile_problem(tmp_path))
    tree = Tree(text)
    assert not tree.errors
    assert len(list(tree.root.find("script"))) == 1
    assert not list(tree.root.find("img"))
    for node in tree.root.walk():
        for name, value in node.attrs.items():
            assert not name.startswith("on")
            assert "javascript:" not in (value or "") or name == "aria-label" or name == "title"
    assert next(tree.root.find("title")).all_text() == "</title><script>alert(2)</script>"
    heads = [th.all_text() for th in tree.root.find("th") if th.attrs.get("scope") == "col"]
    for token in HOSTILE:
        assert token in heads
    # no token reached MathML: they are table headers and prose, never math
    for math in tree.root.find("math"):
        assert "alert" not in math.all_text()


# -- the other ways to get a page --------------------------------------------------------------


def test_exercise_page_has_boxes_and_no_answers():
    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    tree = Tree(render_html(d, exercise=True, ask=frozenset({"S", "A"})))
    forms = {(t.attrs["data-stage"], t.attrs["data-form"]) for t in tree.root.find("table") if "data-stage" in t.attrs}
    assert ("S", "answer") in forms and ("A", "answer") in forms
    assert not any(stage in ("S", "A", "O") and form != "answer" for stage, form in forms)
    for td in _cells(tree, "S", "answer").values():
        assert td.all_text() == ""


def test_notebook_shows_the_page_as_a_fragment():
    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "causal_4_tokens.yaml"))
    fragment = d._repr_html_()
    assert fragment.startswith('<div class="symattn-page">') and "<html" not in fragment
    tree = Tree(fragment)
    assert not tree.errors and len(list(tree.root.find("style"))) == 1
    assert "Cross-check" not in fragment
    symattn.crosscheck(d)
    assert "Every stage agrees with an independent NumPy float64 evaluation" in d._repr_html_()


def test_generate_writes_html_sheets(symattn_cli, tmp_path):
    r = symattn_cli("generate", "--count", "2", "--out-dir", str(tmp_path / "g"), "--sheets", "html")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (tmp_path / "g").iterdir())
    assert names == ["index.csv", "variant-01-exercise.html", "variant-01-solution.html", "variant-01.yaml",
                     "variant-02-exercise.html", "variant-02-solution.html", "variant-02.yaml"]
    for name in names:
        if name.endswith(".html"):
            tree = Tree((tmp_path / "g" / name).read_text("utf-8"))
            assert not tree.errors
            forms = {t.attrs.get("data-form") for t in tree.root.find("table")}
            assert ("answer" in forms) == ("exercise" in name)


def test_a_64_token_page_stays_small():
    text, _ = _page(ROOT / "worked_examples" / "large" / "causal_64_tokens.yaml")
    assert len(text.encode()) < 3_000_000
    tree = Tree(text)
    # elided like the other formats: 8 shown rows of 64 (6, a gap, the last)
    rows = {td.attrs["data-row"] for td in _cells(tree, "A", "decimal").values()}
    assert rows == {"0", "1", "2", "3", "4", "5", "63"}


def test_fragment_and_part_of_the_pipeline(symattn_cli):
    problem = str(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    r = symattn_cli("derive", problem, "-f", "html", "--fragment", "--from", "S", "--to", "A")
    assert r.exit_code == 0, r.output
    assert r.output.startswith('<div class="symattn-page">') and "<html" not in r.output
    tree = Tree(r.output)
    assert not tree.errors
    stages = {t.attrs["data-stage"] for t in tree.root.find("table") if "data-stage" in t.attrs}
    # S to A, and what S is made from stated as given
    assert stages == {"Q", "K_T", "S", "S_scaled", "M", "S_masked", "A"}


def test_mathml_sets_signs_and_symbols_as_latex_does_and_lets_only_math_through():
    from symattn.render.mathml import MathMLError, _check, mathml

    sign = '<mo form="prefix">&#x02212;</mo>'
    assert mathml("-3").count(sign) == 1
    assert mathml(r"0 \cdot \left(-1\right) = -3").count(sign) == 2
    assert sign not in mathml(r"\left(x\right) - 1") and sign not in mathml("a - b")
    assert "<mi>&#x0221E;</mi>" in mathml(r"-\infty")
    assert "merror" not in mathml(r"\dfrac{e^{-2}}{Z_{2}}") and "rule" not in mathml(r"\rule[-1em]{0pt}{2em}1")
    for bad in ('<math><script>x</script></math>', '<math><mi onclick="x">a</mi></math>',
                '<math><mi>\\cellcolor</mi></math>', '<math><mi>a</mi><img src="x"></math>'):
        with pytest.raises(MathMLError):
            _check(bad, "test")


def test_from_a_states_everything_the_shown_steps_are_made_of(symattn_cli):
    # O = A·V: with --from A, V is given beside Ŝ (not only what the first shown step reads)
    problem = str(ROOT / "worked_examples" / "causal_4_tokens.yaml")
    r = symattn_cli("derive", problem, "-f", "html", "--from", "A")
    assert r.exit_code == 0, r.output
    tree = Tree(r.output)
    stages = {t.attrs["data-stage"] for t in tree.root.find("table") if "data-stage" in t.attrs}
    assert stages == {"S_masked", "V", "A", "O"}
