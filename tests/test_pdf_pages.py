"""Page breaks of the worked solutions: a step (its heading, its exact display and its shaded
decimal table) is on one page unless it is taller than a page, and no step starts at the foot of
a page.

Every worked example (``worked_examples/*.yaml`` and ``worked_examples/large/``) is compiled on A4
and on Letter, all at once, one pdflatex per core. The test marks the source it compiles: each
step's first line and each display write their page and height on the page to the log when the
page is shipped out (``\\pdfsavepos`` in the line, where the marks move nothing: in the
vertical list they would be places to break), and each
page's text is read with poppler's ``pdftotext -layout``. Without pdflatex or pdftotext the tests
skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

import symattn
from symattn.render.pdf import compile_latexes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml")) + sorted((ROOT / "worked_examples" / "large").glob("*.yaml"))
PAPERS = ("a4", "letter")

pytestmark = pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdftotext") is None,
                                reason="pdflatex and poppler's pdftotext are needed")

HEADING = re.compile(r"^\s*(Head \d+ . )?Step \d+: ")  # a stage's heading, "Step 8: Softmax on each row"
EXACT_A = re.compile(r"softmax\(")  # the exact display's left side: A = softmax(Ŝ) =
DECIMAL_A = re.compile(r"(^|\s)A\s*≈")  # the decimal table's: A ≈
FOOT = 4  # text lines at the foot of a page in which no step may start

# The marks: the test's own macros, defined before the solution's \providecommand's.
MARKS = r"""\makeatletter
\newcommand{\symattnmark}[1]{\pdfsavepos\edef\symattnmarknow{\write-1{symattn-mark #1 \noexpand\thepage\space\noexpand\the\noexpand\pdflastypos}}\symattnmarknow}
\AtBeginDocument{\typeout{symattn-text \the\textheight\space\the\dimexpr\paperheight-1in-\voffset-\topmargin-\headheight-\headsep\relax}}
\makeatother
"""
STEP = re.compile(r"^(\\paragraph\{.*?\.\} )")  # a step's heading, run in: \paragraph{Scores.} reason
DISPLAY = re.compile(r"^\\symattnfit\{\$\\displaystyle ")
DECIMAL = re.compile(r"^\\symattnfit\{\$\\displaystyle [^=]*?\\approx \\begin\{array\}")  # Q \approx [table]
FIT = r"\providecommand{\symattnfit}[1]{\sbox{\symattnbox}{#1}"
MARK = re.compile(r"^symattn-mark (step|display) ([0-9.]+)pt (\d+) (\d+)$", re.MULTILINE)
TEXT = re.compile(r"^symattn-text ([0-9.]+)pt ([0-9.]+)pt$", re.MULTILINE)


def marked(source: str) -> str:
    """``source`` with each step's first line and each display marked (see :data:`MARKS`)."""
    assert source.count(FIT) == 1 and "\n\\title{" in source
    source = source.replace(FIT, FIT + r"\symattnmark{display \the\dp\symattnbox}")
    source = source.replace("\n\\title{", "\n" + MARKS + "\\title{", 1)
    return "\n".join(STEP.sub(lambda m: m.group(1) + r"\leavevmode\symattnmark{step 0pt}", line) for line in source.split("\n"))


@dataclass(frozen=True)
class Mark:
    kind: str  # "step" (its first line), "display" or "decimal" (a shaded decimal table)
    page: int
    y: float  # the baseline's height above the paper's foot, in pt
    depth: float  # below the baseline, in pt


def marks(source: str, log: str) -> list[Mark]:
    """The marks of a compiled :func:`marked` source, in its order, decimal tables told apart."""
    kinds = ["step" if STEP.match(line) else "decimal" if DECIMAL.match(line) else "display"
             for line in source.split("\n") if STEP.match(line) or DISPLAY.match(line)]
    found = MARK.findall(log)
    assert [k for k, *_ in found] == [("step" if k == "step" else "display") for k in kinds]
    return [Mark(kind, int(page), int(sp) / 65536, float(depth))
            for kind, (_, depth, page, sp) in zip(kinds, found)]


@dataclass(frozen=True)
class Sheet:
    pages: list[list[str]]  # each page's text lines (blank ones and the page number dropped)
    marks: list[Mark]
    text_height: float  # pt
    text_top: float  # the text's top edge, above the paper's foot, in pt


@lru_cache(maxsize=1)
def _sheets() -> dict[tuple[str, str], Sheet]:
    """Each example's compiled sheet on each paper."""
    jobs = [(p, paper) for p in EXAMPLES for paper in PAPERS]
    derived = {p: symattn.derive(symattn.load_problem(p)) for p in EXAMPLES}
    sources = [marked(symattn.render_latex(derived[p], standalone=True, paper=paper)) for p, paper in jobs]
    out = {}
    for (path, paper), source, (pdf, log) in zip(jobs, sources, compile_latexes(iter(sources), len(jobs))):
        text = subprocess.run(["pdftotext", "-layout", "-", "-"], input=pdf, capture_output=True, check=True).stdout
        pages = [[line for line in page.splitlines() if line.strip()][:-1] for page in text.decode("utf-8").split("\f")[:-1]]
        height, top = map(float, TEXT.search(log).groups())
        out[path.stem, paper] = Sheet(pages, marks(source, log), height, top)
    return out


def split_steps(sheet: Sheet) -> list[str]:
    """The steps whose heading and decimal tables (or, without one, first display) are not on one
    page although they would fit on one: what they take of the two pages they are on, from the
    heading's line down and down to the last table's foot, is less than a page."""
    bad = []
    starts = [k for k, m in enumerate(sheet.marks) if m.kind == "step"]
    for n, k in enumerate(starts):
        body = sheet.marks[k + 1:starts[n + 1] if n + 1 < len(starts) else len(sheet.marks)]
        tables = [j for j, m in enumerate(body) if m.kind == "decimal"]
        kept = body[:tables[-1] + 1] if tables else body[:1]
        if not kept:
            continue
        head, last = sheet.marks[k], kept[-1]
        if head.page == last.page:
            continue
        taken = (head.y - (sheet.text_top - sheet.text_height)) + (sheet.text_top - (last.y - last.depth))
        if last.page == head.page + 1 and taken < sheet.text_height:
            bad.append(f"the step {n + 1} (of {len(starts)}) on pages {head.page} and {last.page}, {taken:.0f}pt")
    return bad


def late_headings(pages: list[list[str]]) -> list[str]:
    """The stages that start in the last FOOT lines of a page and go on on the next."""
    bad = []
    for k, lines in enumerate(pages[:-1]):
        following = pages[k + 1]
        for i, line in enumerate(lines):
            if HEADING.match(line) and i >= len(lines) - FOOT and following and not HEADING.match(following[0]):
                bad.append(f"page {k + 1}: {line.strip()}")
    return bad


def split_softmax(pages: list[list[str]]) -> list[str] | None:
    """The softmax steps whose exact A and decimal A are on different pages (None: the markers do
    not pair up, as in a problem with several heads or none of A's decimals)."""
    exact = [k for k, page in enumerate(pages) for line in page if EXACT_A.search(line)]
    decimal = [k for k, page in enumerate(pages) for line in page if DECIMAL_A.search(line)]
    if len(exact) != len(decimal) or not exact:
        return None
    return [f"A on page {a + 1}, its decimals on page {b + 1}" for a, b in zip(exact, decimal) if a != b]


def test_the_markers_are_found():
    lines = ["Step 8: Softmax on each row", "Head 2 · Step 6: Score every query", "   A = softmax(Ŝ) =", "  A≈  0.5"]
    assert [bool(HEADING.match(x)) for x in lines] == [True, True, False, False]
    assert late_headings([["x"] * 5 + [lines[0]], ["  A = softmax(Ŝ) ="]]) == ["page 1: " + lines[0]]
    assert late_headings([["x"] * 5 + [lines[0]], [lines[1]]]) == []  # the stage ended on its page
    assert split_softmax([[lines[2]], [lines[3]]]) == ["A on page 1, its decimals on page 2"]
    assert split_softmax([[lines[2], lines[3]]]) == []


def test_a_split_step_is_found_unless_taller_than_a_page():
    def sheet(*marks):  # text 600pt high, its top 700pt above the paper's foot (its foot at 100pt)
        return Sheet([], [Mark(*m) for m in marks], 600.0, 700.0)
    # heading near the foot of page 1, its table at the top of page 2: 150pt in all
    split = sheet(("step", 1, 200.0, 0.0), ("display", 1, 150.0, 20.0), ("decimal", 2, 680.0, 30.0))
    assert split_steps(split) == ["the step 1 (of 1) on pages 1 and 2, 150pt"]
    # the same on one page; a display after the table may go on the next page
    assert split_steps(sheet(("step", 1, 400.0, 0.0), ("decimal", 1, 300.0, 30.0), ("display", 2, 650.0, 5.0))) == []
    # 500pt on page 1 and 200pt on page 2: taller than a page, it has to break
    assert split_steps(sheet(("step", 1, 600.0, 0.0), ("display", 1, 150.0, 20.0), ("decimal", 2, 510.0, 10.0))) == []
    # without a decimal table the heading and the first display are kept together
    assert split_steps(sheet(("step", 1, 120.0, 0.0), ("display", 2, 650.0, 20.0))) == [
        "the step 1 (of 1) on pages 1 and 2, 90pt"]


def test_the_marks_are_read_from_the_source():
    source = "\n".join([r"\documentclass{article}", r"\title{x}", r"\begin{document}", FIT + "}", r"\paragraph{Scores.} Each query.",
                        r"\symattnfit{$\displaystyle S = Q K^{\top} = \begin{array}{r|c} x \end{array}$}",
                        r"\symattnfit{$\displaystyle S \approx \begin{array}{r|c} x \end{array}$}"])
    out = marked(source)
    assert r"\paragraph{Scores.} \leavevmode\symattnmark{step 0pt}Each query." in out
    log = "symattn-mark step 0pt 3 6553600\nx\nsymattn-mark display 12.5pt 3 3276800\nsymattn-mark display 4.0pt 4 65536\n"
    assert marks(out, log) == [Mark("step", 3, 100.0, 0.0), Mark("display", 3, 50.0, 12.5), Mark("decimal", 4, 1.0, 4.0)]


@pytest.mark.parametrize("paper", PAPERS)
def test_no_step_is_split_across_pages(paper):
    sheets = {stem: sheet for (stem, p), sheet in _sheets().items() if p == paper}
    assert len(sheets) == len(EXAMPLES) and sum(len(s.marks) for s in sheets.values()) > 1000
    bad = {stem: b for stem, sheet in sheets.items() if (b := split_steps(sheet))}
    assert not bad, bad


@pytest.mark.parametrize("paper", PAPERS)
def test_no_step_starts_at_the_foot_of_a_page(paper):
    bad = {stem: b for (stem, p), sheet in _sheets().items() if p == paper and (b := late_headings(sheet.pages))}
    assert not bad, bad


@pytest.mark.parametrize("paper", PAPERS)
def test_the_exact_softmax_is_on_the_page_of_its_decimals(paper):
    checked, bad = 0, {}
    for (stem, p), sheet in _sheets().items():
        split = split_softmax(sheet.pages) if p == paper else None
        if split is not None:
            checked += 1
            if split:
                bad[stem] = split
    assert checked >= 20, f"only {checked} examples have one softmax to check"
    assert not bad, bad
