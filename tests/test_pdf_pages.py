"""Page breaks of the worked solutions: a step does not start at the foot of a page, and the
softmax's exact weights A are on the page of its shaded decimal table.

Every worked example is compiled on A4 and on Letter (all at once, one pdflatex per core) and
each page's text is read with poppler's ``pdftotext -layout``. Without them the tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

import symattn
from symattn.render.pdf import latex_to_pdfs

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml"))
PAPERS = ("a4", "letter")

pytestmark = pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdftotext") is None,
                                reason="pdflatex and poppler's pdftotext are needed")

HEADING = re.compile(r"^\s*(Head \d+ . )?Step \d+: ")  # a stage's heading, "Step 8: Softmax on each row"
EXACT_A = re.compile(r"softmax\(")  # the exact display's left side: A = softmax(Ŝ) =
DECIMAL_A = re.compile(r"(^|\s)A\s*≈")  # the decimal table's: A ≈
FOOT = 4  # text lines at the foot of a page in which no step may start


@lru_cache(maxsize=1)
def _pages() -> dict[tuple[str, str], list[list[str]]]:
    """Each example's pages on each paper: the page's text lines (blank ones and the page number dropped)."""
    jobs = [(p.stem, paper) for p in EXAMPLES for paper in PAPERS]
    derived = {p.stem: symattn.derive(symattn.load_problem(p)) for p in EXAMPLES}
    sources = (symattn.render_latex(derived[stem], standalone=True, paper=paper) for stem, paper in jobs)
    pdfs = latex_to_pdfs(sources, len(jobs))
    out = {}
    for job, pdf in zip(jobs, pdfs):
        text = subprocess.run(["pdftotext", "-layout", "-", "-"], input=pdf, capture_output=True, check=True).stdout
        pages = text.decode("utf-8").split("\f")[:-1]
        out[job] = [[line for line in page.splitlines() if line.strip()][:-1] for page in pages]
    return out


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


@pytest.mark.parametrize("paper", PAPERS)
def test_no_step_starts_at_the_foot_of_a_page(paper):
    bad = {stem: b for (stem, p), pages in _pages().items() if p == paper and (b := late_headings(pages))}
    assert not bad, bad


@pytest.mark.parametrize("paper", PAPERS)
def test_the_exact_softmax_is_on_the_page_of_its_decimals(paper):
    checked, bad = 0, {}
    for (stem, p), pages in _pages().items():
        split = split_softmax(pages) if p == paper else None
        if split is not None:
            checked += 1
            if split:
                bad[stem] = split
    assert checked >= 20, f"only {checked} examples have one softmax to check"
    assert not bad, bad
