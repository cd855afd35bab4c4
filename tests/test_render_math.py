"""The Markdown's math as readers see it: rendered by MathJax 3 (GitHub, Jupyter) and KaTeX.

``tests/node/render_math.mjs`` renders each ``$$`` block with MathJax 3 as GitHub
configures it, with MathJax 3 and its textmacros package, and with KaTeX
(``throwOnError``). Every block must render without an error, and the text a reader
sees must show each token as written, never LaTeX such as ``\\textless{}``.

The Node packages are installed by ``npm ci --prefix tests/node`` (the README's test
command does it); ``SYMATTN_NODE_MODULES`` names another ``node_modules`` folder. Without node or
the packages these tests are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import symattn
from symattn.render.display import NOTEBOOK_SHOWN
from symattn.render.escape import MATH_SPECIALS, tex_token
from symattn.render.grid import MAX_SHOWN, shown

ROOT = Path(__file__).resolve().parent.parent
# One worker of pytest-xdist runs this file: Node renders every document once (the rendered fixture).
pytestmark = pytest.mark.xdist_group("node")
EXAMPLES = ROOT / "worked_examples"
MARKDOWN_FILES = sorted(EXAMPLES.glob("**/*.md"))
SCRIPT = ROOT / "tests" / "node" / "render_math.mjs"
NODE_MODULES = Path(os.environ.get("SYMATTN_NODE_MODULES") or ROOT / "tests" / "node" / "node_modules")
RENDERERS = ("mathjax", "mathjax_textmacros", "katex")

# Tokens full of characters that LaTeX, Markdown or MathJax treat specially.
SPECIAL_TOKENS = ["<pad>", "a_b", "50%", "#1", "x&y", "~", "\\input{x}", "$", "{}"]
# More (8, so none is elided): beyond ASCII, a ligature (--), the characters that are math in
# LaTeX's labels too (^ |), an apostrophe, one of symattn's own symbols, and a space.
MORE_TOKENS = ["é", "猫", "a--b", "x^y", "<|endoftext|>", "don't", "√2", "## ing"]

# How the renderers print the math symbols of tex_token: MathJax draws \backslash with
# U+2216, \sim is U+223C in both, and KaTeX writes | as U+2223.
GLYPHS = str.maketrans({"\u2216": "\\", "\u223c": "~", "\u2223": "|", "\u00a0": " "})
# LaTeX that a reader must never see (the backslash is checked apart from the tokens).
LATEX_WORDS = re.compile(r"\\[A-Za-z]+|text(less|greater|backslash|ascii|bar)|ensuremath")


def node_renderer():
    """A function that renders a list of LaTeX strings, or a skip with the reason."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    missing = [name for name in ("mathjax-full", "katex") if not (NODE_MODULES / name / "package.json").is_file()]
    if missing:
        pytest.skip(f"the Node packages {', '.join(missing)} are not installed in {NODE_MODULES} "
                    "(npm ci --prefix tests/node, or name their node_modules in SYMATTN_NODE_MODULES)")

    def render(blocks: list[str]) -> list[dict]:
        done = subprocess.run(
            [node, str(SCRIPT)], input=json.dumps(blocks), capture_output=True, text=True, timeout=600,
            env={**os.environ, "SYMATTN_NODE_MODULES": str(NODE_MODULES.resolve())},
        )
        assert done.returncode == 0, f"render_math.mjs failed: {done.stderr[-2000:]}"
        results = json.loads(done.stdout)
        assert len(results) == len(blocks)
        return results

    return render


def math_blocks(markdown: str) -> list[str]:
    """The bodies of the ``$$ ... $$`` blocks (on lines of their own, or inline as a step's display)."""
    return [m.strip() for m in re.findall(r"\$\$(.+?)\$\$", markdown, flags=re.DOTALL)]


def special_problem(tokens: list[str]) -> symattn.Problem:
    """Queries, keys and values given for ``tokens``, with a causal mask."""
    n = len(tokens)
    text = yaml.safe_dump({
        "title": "Tokens with special characters",
        "tokens": tokens,
        "Q": [[1, i % 2] for i in range(n)],
        "K": [[i % 3, 1] for i in range(n)],
        "V": [[i, 1] for i in range(n)],
        "mask": "causal",
        "scale": "none",
    }, allow_unicode=True)
    return symattn.load_problem(text)


def backward_problem(tokens: list[str]) -> symattn.Problem:
    """A small head with a backward pass, so the softmax Jacobian is labelled with ``tokens``."""
    text = (EXAMPLES / "backward_causal.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    data["tokens"] = tokens
    return symattn.load_problem(yaml.safe_dump(data, allow_unicode=True))


def documents() -> dict[str, str]:
    """Every Markdown a reader can be shown, by name."""
    docs = {f"file:{path.relative_to(EXAMPLES)}": path.read_text("utf-8") for path in MARKDOWN_FILES}
    docs["README"] = (ROOT / "README.md").read_text("utf-8")
    for name in ("padding_mask", "qkv_given", "backward_causal", "two_heads"):
        d = symattn.derive(symattn.load_problem(EXAMPLES / f"{name}.yaml"))
        docs[f"notebook:{name}"] = d._repr_markdown_()
        docs[f"notebook-step:{name}"] = "\n\n".join(step._repr_markdown_() for step in d.steps)
    special = symattn.derive(special_problem(SPECIAL_TOKENS))
    docs["special"] = symattn.render_markdown(special)
    docs["special-exercise"] = symattn.render_markdown(special, exercise=True)
    docs["special-notebook-step"] = "\n\n".join(step._repr_markdown_() for step in special.steps)
    docs["more"] = symattn.render_markdown(symattn.derive(special_problem(MORE_TOKENS)))
    docs["backward"] = symattn.render_markdown(symattn.derive(backward_problem(["<pad>", "a_b", "~"])))
    return docs


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[tuple[str, dict]]]:
    """Each document's blocks with what each renderer made of them (one run of node for all)."""
    render = node_renderer()
    docs = {name: math_blocks(text) for name, text in documents().items()}
    unique = sorted({block for blocks in docs.values() for block in blocks})
    results = dict(zip(unique, render(unique)))
    return {name: [(block, results[block]) for block in blocks] for name, blocks in docs.items()}


def errors(blocks: list[tuple[str, dict]]) -> list[str]:
    return [
        f"{renderer}: {result[renderer]['error']} in {block[:300]!r}"
        for block, result in blocks
        for renderer in RENDERERS
        if result[renderer]["error"]
    ]


def seen(blocks: list[tuple[str, dict]], renderer: str) -> str:
    """The text a reader sees in all the blocks, with the renderers' glyphs read back as ASCII."""
    return "\n".join(result[renderer]["text"] for _, result in blocks).translate(GLYPHS)


def drawn(tokens, max_shown: int = MAX_SHOWN) -> list[str]:
    """The tokens a matrix draws: all, or (elided) the first ones and the last."""
    return [tokens[i] for i in shown(len(tokens), max_shown) if i is not None]


def assert_tokens_as_written(blocks, tokens: list[str]) -> None:
    for renderer in RENDERERS:
        text = seen(blocks, renderer)
        for token in tokens:
            assert token in text, f"{renderer} does not show the token {token!r}: {text[:1500]!r}"
        rest = text
        for token in sorted(tokens, key=len, reverse=True):
            rest = rest.replace(token, "")
        assert "\\" not in rest, f"{renderer} shows a backslash that no token has: {rest[:1500]!r}"
        assert not LATEX_WORDS.search(rest), f"{renderer} shows LaTeX: {LATEX_WORDS.search(rest)[0]!r} in {rest[:1500]!r}"


@pytest.mark.parametrize("name", [f"file:{p.relative_to(EXAMPLES)}" for p in MARKDOWN_FILES])
def test_worked_example_markdown_renders(rendered, name):
    blocks = rendered[name]
    assert len(blocks) >= 10
    assert not errors(blocks), "\n".join(errors(blocks))
    path = EXAMPLES / name.removeprefix("file:")
    problem = symattn.load_problem(path.with_suffix(".yaml"))
    assert_tokens_as_written(blocks, [*drawn(problem.tokens), *drawn(problem.key_tokens)])


@pytest.mark.parametrize("name", ["padding_mask", "qkv_given", "backward_causal", "two_heads"])
def test_notebook_display_renders(rendered, name):
    for kind in ("notebook", "notebook-step"):
        blocks = rendered[f"{kind}:{name}"]
        assert blocks
        assert not errors(blocks), "\n".join(errors(blocks))
        problem = symattn.load_problem(EXAMPLES / f"{name}.yaml")
        assert_tokens_as_written(blocks, list(problem.tokens))


@pytest.mark.parametrize("name", ["special", "special-exercise", "special-notebook-step"])
def test_special_tokens_render_as_written(rendered, name):
    blocks = rendered[name]
    assert not errors(blocks), "\n".join(errors(blocks))
    assert len(drawn(SPECIAL_TOKENS)) < len(SPECIAL_TOKENS)  # 9 tokens: the matrices are elided
    # a step in a notebook is drawn more compactly than in the worked solution
    limit = NOTEBOOK_SHOWN if name.endswith("notebook-step") else MAX_SHOWN
    assert_tokens_as_written(blocks, drawn(SPECIAL_TOKENS, limit))


def test_readme_math_renders(rendered):
    blocks = rendered["README"]
    assert blocks
    assert not errors(blocks), "\n".join(errors(blocks))
    assert_tokens_as_written(blocks, ["The", "cat", "sat", "down"])


def test_special_tokens_label_the_softmax_jacobian(rendered):
    blocks = rendered["backward"]
    assert any(block.startswith("J^{(") for block, _ in blocks)
    assert not errors(blocks), "\n".join(errors(blocks))
    assert_tokens_as_written(blocks, ["<pad>", "a_b", "~"])


def test_more_tokens_render(rendered):
    blocks = rendered["more"]
    assert not errors(blocks), "\n".join(errors(blocks))
    # pdflatex knows no 猫, so the math of every format shows its code point (as the PDF
    # does); LaTeX's apostrophe is typographic (’) except in MathJax without textmacros.
    for renderer in RENDERERS:
        text = seen(blocks, renderer).replace("’", "'")
        for token in ["[U+732B]", "a--b", "x^y", "<|endoftext|>", "don't", "√2", "## ing"]:
            assert token in text, f"{renderer} does not show {token!r}"
    # KaTeX draws é as an e with an accent
    assert "é" in seen(blocks, "mathjax") and "é" in seen(blocks, "mathjax_textmacros")


def test_every_character_of_a_token_renders():
    """Each character tex_token writes as math, and a few it keeps as text."""
    render = node_renderer()
    chars = [*MATH_SPECIALS, *"–—é猫\x07'\"`-", "--"]
    results = render([tex_token(f"a{ch}b") for ch in chars])
    for ch, result in zip(chars, results):
        for renderer in RENDERERS:
            assert not result[renderer]["error"], (ch, renderer, result[renderer]["error"])
        if ch in "\\&%$#_{}~^<>|-" or ch == "--":
            for renderer in RENDERERS:
                assert result[renderer]["text"].translate(GLYPHS) == f"a{ch}b", (ch, renderer)


def test_renderers_catch_the_old_labels():
    """The check can fail: the labels this test was written for did not render."""
    render = node_renderer()
    old = r"\begin{array}{r|c} & \text{\textless{}pad\textgreater{}} \\ \hline \text{a\_b} & 1 \end{array}"
    result = render([old])[0]
    assert result["mathjax_textmacros"]["error"] == "Undefined control sequence \\textless"
    assert "\\textless" in result["mathjax"]["text"]
    with pytest.raises(AssertionError):
        assert_tokens_as_written([(old, result)], ["<pad>", "a_b"])
