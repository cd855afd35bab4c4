"""The LaTeX and Markdown renderings: they compile, and user text is printed, never run.

LaTeX is compiled with the real ``pdflatex``. Without it these tests are
skipped, except on CI (the environment variable ``CI`` set), where a missing
pdflatex is a failure: CI must have it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import symattn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("**/*.yaml"))  # large/ too: every example must compile

PDFLATEX = shutil.which("pdflatex")
PDFTOTEXT = shutil.which("pdftotext")
PDFLATEX_FLAGS = ["-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode"]

# \write18{touch MARKER} would create MARKER in the folder pdflatex runs in.
HOSTILE_TITLE = r"\input{/etc/passwd} \write18{touch MARKER} 50% & $x$ #1 ~ ^ _"
HOSTILE_TOKENS = ["a_b", "c&d", "{}"]

MINIMAL_DOCUMENT = r"""\documentclass{article}
\usepackage{amsmath,amssymb}
\begin{document}
\input{fragment}
\end{document}
"""


def need_pdflatex() -> str:
    if PDFLATEX is None:
        if os.environ.get("CI"):
            pytest.fail("pdflatex is not installed, and CI must have it (apt-get install texlive-latex-base texlive-latex-recommended)")
        pytest.skip("pdflatex is not installed")
    return PDFLATEX


def compile_latex(folder: Path, name: str, source: str, *, flags=PDFLATEX_FLAGS) -> Path:
    """Compile ``source`` as ``folder/name.tex``; assert success; return the PDF's path."""
    pdflatex = need_pdflatex()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.tex").write_text(source, encoding="utf-8")
    done = subprocess.run(
        [pdflatex, *flags, f"{name}.tex"],
        cwd=folder,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    log = done.stdout.decode("utf-8", "replace")
    errors = [line for line in log.splitlines() if line.startswith("!")]
    assert done.returncode == 0, f"pdflatex failed on {name}.tex: {errors or log[-2000:]}"
    pdf = folder / f"{name}.pdf"
    assert pdf.is_file(), f"pdflatex made no {pdf.name}"
    assert pdf.read_bytes().startswith(b"%PDF")
    return pdf


def pdf_text(pdf: Path) -> str:
    """The PDF's text with all runs of whitespace made one space (pdftotext breaks lines)."""
    if PDFTOTEXT is None:
        pytest.skip("pdftotext is not installed")
    done = subprocess.run([PDFTOTEXT, "-enc", "UTF-8", str(pdf), "-"], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.decode("utf-8").split())


def visible(text: str) -> str:
    """``text`` as pdftotext reads it back from the T1-encoded PDF: runs of whitespace are one space."""
    return " ".join(text.split())


def hostile_problem(folder: Path) -> Path:
    """A problem whose title and tokens are full of LaTeX specials."""
    problem = {
        "title": HOSTILE_TITLE,
        "tokens": HOSTILE_TOKENS,
        "X": [[1, 0], [0, 1], [1, 1]],
        "W_Q": [[1, 0], [0, 1]],
        "W_K": [[1, 0], [0, 1]],
        "W_V": [[1], [2]],
        "mask": "causal",
    }
    path = folder / "hostile.yaml"
    path.write_text(yaml.safe_dump(problem, allow_unicode=True), encoding="utf-8")
    assert symattn.load_problem(path).title == HOSTILE_TITLE  # the YAML round trip kept the text
    return path


def derivation_of(path: Path):
    return symattn.derive(symattn.load_problem(path))


# -- every worked example compiles ------------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_worked_example_compiles(tmp_path, example):
    d = derivation_of(example)
    source = symattn.render_latex(d)
    assert source.startswith("\\documentclass")
    assert "[U+" not in source, "symattn's own prose holds a character the LaTeX renderer does not map"
    pdf = compile_latex(tmp_path, example.stem, source)
    if PDFTOTEXT is not None:
        # the titles of the worked examples are plain words: they come out verbatim
        assert visible(d.problem.title) in pdf_text(pdf)


def test_worked_example_with_cross_check_compiles(tmp_path):
    d = derivation_of(EXAMPLES / "causal_dk2.yaml")
    source = symattn.render_latex(d, check=symattn.crosscheck(d))
    assert "\\section*{Cross-check}" in source
    compile_latex(tmp_path, "checked", source)


# -- user text is escaped -----------------------------------------------------------------


def test_hostile_title_and_tokens_are_escaped_in_the_source(tmp_path):
    source = symattn.render_latex(derivation_of(hostile_problem(tmp_path)))
    title_line = next(line for line in source.splitlines() if line.startswith("\\title{"))
    assert title_line == (
        "\\title{\\textbackslash{}input\\{/etc/passwd\\} \\textbackslash{}write18\\{touch MARKER\\} "
        "50\\% \\& \\$x\\$ \\#1 \\textasciitilde{} \\textasciicircum{} \\_}"
    )
    assert "\\write18" not in source
    assert "\\input{" not in source
    # the tokens are listed in the introduction
    assert ", c\\&d, \\{\\}) with" in source


def test_token_with_underscore_is_printed_as_written(tmp_path):
    source = symattn.render_latex(derivation_of(hostile_problem(tmp_path)))
    assert "(a\\_b, c\\&d, \\{\\})" in source


@pytest.mark.parametrize("shell_escape", ["-no-shell-escape", "-shell-escape"])
def test_hostile_title_compiles_and_runs_nothing(tmp_path, shell_escape):
    """Even with shell escape switched on, an escaped \\write18 cannot run: MARKER never appears."""
    source = symattn.render_latex(derivation_of(hostile_problem(tmp_path)))
    flags = [shell_escape, "-halt-on-error", "-interaction=nonstopmode"]
    build = tmp_path / "build"
    pdf = compile_latex(build, "hostile", source, flags=flags)
    assert not (build / "MARKER").exists(), "\\write18 in the title was executed"
    assert not (tmp_path / "MARKER").exists()
    if PDFTOTEXT is None:
        return
    text = pdf_text(pdf)
    assert "root:" not in text, "/etc/passwd was \\input"
    # Everything up to the last three characters is printed exactly as written
    # (for '~ ^ _' see test_hostile_title_is_in_the_pdf_text_verbatim) ...
    assert "\\input{/etc/passwd} \\write18{touch MARKER} 50% & $x$ #1 " in text
    # ... and so are the tokens the introduction lists.
    assert "c&d, {})" in text


def test_hostile_title_is_in_the_pdf_text_verbatim(tmp_path):
    source = symattn.render_latex(derivation_of(hostile_problem(tmp_path)))
    pdf = compile_latex(tmp_path / "build", "hostile", source)
    assert HOSTILE_TITLE in pdf_text(pdf)


SPECIAL_TOKENS = ["<pad>", "a_b", "50%", "#1", "x&y", "~", "\\input{x}", "$", "{}", "x^y", "<|eot|>", "é"]


def test_special_tokens_label_the_matrices_as_written(tmp_path):
    """Tokens are math in the labels (so MathJax shows them too): the PDF still reads as written."""
    n = len(SPECIAL_TOKENS)
    text = yaml.safe_dump({"tokens": SPECIAL_TOKENS, "Q": [[1, 0]] * n, "K": [[0, 1]] * n, "V": [[1]] * n},
                          allow_unicode=True)
    d = symattn.derive(symattn.load_problem(text))
    source = symattn.render_latex(d, max_shown=n)
    assert "{<}\\text{pad}{>} & " in source
    pdf = compile_latex(tmp_path, "tokens", source)
    (tmp_path / "fragment").mkdir()
    (tmp_path / "fragment" / "fragment.tex").write_text(symattn.render_latex(d, standalone=False), encoding="utf-8")
    compile_latex(tmp_path / "fragment", "main", MINIMAL_DOCUMENT)  # OT1, where \text{<} would be ¡
    if PDFTOTEXT is None:
        return
    labels = pdf_text(pdf).translate(str.maketrans({"∼": "~", "ˆ": "^"}))  # \sim and \hat in math
    for token in SPECIAL_TOKENS:
        assert f" {token} " in labels, token


def test_every_character_of_a_token_compiles(tmp_path):
    """Each character tex_token writes as math, and a few it keeps as text, in T1 and OT1 documents."""
    from symattn.render.escape import MATH_SPECIALS, tex_token
    from symattn.render.latex import _PREAMBLE

    math = " \\; ".join(tex_token(f"a{ch}b") for ch in [*MATH_SPECIALS, *"–—é猫\x07'\"`-", "--"])
    body = f"\\begin{{document}}\n\\[ {math} \\]\n\\end{{document}}\n"
    compile_latex(tmp_path / "t1", "tokens", _PREAMBLE + body)
    compile_latex(tmp_path / "ot1", "tokens", "\\documentclass{article}\n\\usepackage{amsmath,amssymb}\n" + body)


@pytest.mark.parametrize(
    "title",
    [
        pytest.param("«Aufmerksamkeit» auf vier Token", id="guillemets"),
        pytest.param("Þórr and Ðóra", id="thorn-eth"),
        pytest.param("C1 control \x80 character", id="c1-control"),
    ],
)
def test_latin1_title_compiles(tmp_path, title):
    text = yaml.safe_dump({"title": title, "Q": [[1, 0]], "K": [[1, 0], [0, 1]], "V": [[1], [2]]})
    d = symattn.derive(symattn.load_problem(text))
    assert d.problem.title == title
    compile_latex(tmp_path, "latin1", symattn.render_latex(d))


def test_characters_beyond_latin1_are_shown_as_code_points(tmp_path):
    text = yaml.safe_dump({"title": "Attention 注意 ≠ α", "Q": [[1, 0]], "K": [[1, 0], [0, 1]], "V": [[1], [2]]})
    source = symattn.render_latex(symattn.derive(symattn.load_problem(text)))
    assert "\\title{Attention [U+6CE8][U+610F] [U+2260] [U+03B1]}" in source
    compile_latex(tmp_path, "unicode", source)


# -- the fragment -------------------------------------------------------------------------


@pytest.mark.parametrize("example", [*EXAMPLE_FILES, "hostile"], ids=lambda p: getattr(p, "stem", p))
def test_fragment_inputs_into_a_minimal_document(tmp_path, example):
    path = hostile_problem(tmp_path) if example == "hostile" else example
    d = derivation_of(path)
    fragment = symattn.render_latex(d, standalone=False)
    for wrapper in ("\\documentclass", "\\begin{document}", "\\end{document}", "\\usepackage", "\\title", "\\maketitle"):
        assert wrapper not in fragment
    assert "\\section*{Step 1:" in fragment
    # the fragment is exactly the body of the standalone document
    assert fragment in symattn.render_latex(d)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "fragment.tex").write_text(fragment, encoding="utf-8")
    compile_latex(tmp_path / "build", "main", MINIMAL_DOCUMENT)


# -- Markdown ---------------------------------------------------------------------------------


def check_markdown_math(markdown: str) -> int:
    """Assert every $$ block is balanced and well formed; return the number of blocks."""
    inside = False
    blocks = 0
    opened_at = 0
    for number, line in enumerate(markdown.splitlines(), 1):
        if line == "$$":
            if not inside:
                opened_at = number
                blocks += 1
            else:
                assert number > opened_at + 1, f"empty $$ block at line {opened_at}"
            inside = not inside
            continue
        assert "$$" not in line, f"line {number}: $$ must stand on a line of its own: {line!r}"
        if inside:
            assert line.strip(), f"line {number}: a blank line inside the $$ block opened at line {opened_at}"
        else:
            # outside the blocks, an unescaped $ only opens or closes inline math: in pairs on one
            # line, each holding something and touching it ($x$, never "$ x$")
            dollars = [m.start() for m in re.finditer(r"(?<!\\)\$", line)]
            assert len(dollars) % 2 == 0, f"line {number}: an unpaired $ outside math: {line!r}"
            for start, end in zip(dollars[::2], dollars[1::2]):
                inner = line[start + 1:end]
                assert inner and inner == inner.strip(), f"line {number}: malformed inline math {inner!r}"
    assert not inside, f"the $$ block opened at line {opened_at} is never closed"
    return blocks


@pytest.mark.parametrize("example", [*EXAMPLE_FILES, "hostile"], ids=lambda p: getattr(p, "stem", p))
def test_markdown_math_blocks_are_balanced(tmp_path, example):
    path = hostile_problem(tmp_path) if example == "hostile" else example
    d = derivation_of(path)
    markdown = symattn.render_markdown(d, check=symattn.crosscheck(d))
    assert check_markdown_math(markdown) >= 10


def test_markdown_escapes_the_title(tmp_path):
    text = yaml.safe_dump({"title": "*x* <b>", "Q": [[1, 0]], "K": [[1, 0], [0, 1]], "V": [[1], [2]]})
    markdown = symattn.render_markdown(symattn.derive(symattn.load_problem(text)))
    assert markdown.splitlines()[0] == "# \\*x\\* \\<b\\>"
    assert "<b>" not in markdown
    assert "*x*" not in markdown


def test_markdown_escapes_the_hostile_title_and_tokens(tmp_path):
    markdown = symattn.render_markdown(derivation_of(hostile_problem(tmp_path)))
    first = markdown.splitlines()[0]
    assert first == "# \\\\input{/etc/passwd} \\\\write18{touch MARKER} 50% \\& \\$x\\$ \\#1 \\~ ^ \\_"
    assert "(a\\_b, c\\&d, {})" in markdown


def test_markdown_shows_html_entities_literally():
    text = yaml.safe_dump({"title": "AT&amp;T &lt;b&gt;", "Q": [[1, 0]], "K": [[1, 0], [0, 1]], "V": [[1], [2]]})
    first = symattn.render_markdown(symattn.derive(symattn.load_problem(text))).splitlines()[0]
    # CommonMark reads a backslash-escaped '&' as itself, so no entity is formed
    assert re.search(r"(?<!\\)&", first) is None, first
    assert first == "# AT\\&amp;T \\&lt;b\\&gt;"


def test_the_concat_formula_of_many_heads_fits_a_latex_matrix():
    """amsmath's matrices hold MaxMatrixCols columns (64 here): the concat formula of 70 heads
    names the first two, ⋯ and the last, in LaTeX, text and the size line."""
    head = "{W_Q: [[1], [1]], W_K: [[1], [1]], W_V: [[1], [1]]}"
    source = (f"X: [[1, 2], [3, 1]]\nscale: none\nheads: [{', '.join([head] * 70)}]\n"
              f"W_O: [{', '.join(['[1, 0]'] * 70)}]\n")
    d = symattn.derive(symattn.load_problem(source))
    tex = symattn.render_latex(d)
    formula = re.search(r"\\operatorname\{concat\} = \\begin\{bmatrix\}(.*?)\\end\{bmatrix\}", tex).group(1)
    assert [part.strip() for part in formula.split("&")] == ["O^{(1)}", "O^{(2)}", "\\cdots", "O^{(70)}"]
    text = symattn.render_text(d)
    assert "concat = [O⁽¹⁾ | O⁽²⁾ | … | O⁽⁷⁰⁾]" in text
    assert "2×(1 + 1 + … + 1) = 2×70" in text
