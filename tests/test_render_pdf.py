"""The compiled PDFs are legible: nothing shrunk below 85 %, outline fonts, rows of fractions apart.

These compile the worked examples with a real pdflatex and read the result with poppler
(pdffonts, pdftotext -bbox); without them the tests skip.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

import symattn
from symattn.render.pdf import compile_latex, display_scales
from symattn.render.measure import MIN_SCALE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("**/*.yaml"))
FOUR = ROOT / "worked_examples" / "causal_4_tokens.yaml"

needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
needs_poppler = pytest.mark.skipif(
    shutil.which("pdftotext") is None or shutil.which("pdffonts") is None, reason="poppler-utils is not installed"
)

# Between the lowest glyph of one row of a fraction matrix and the highest of the next. Word boxes
# span the font's whole ascent and descent, so the ink gap is larger still. 4 pt is about a third
# of the 11 pt text's line gap: rows read as separate lines, as in a printed table; before this
# standard, rows of \dfrac in A touched (about 0 to 1 pt).
MIN_ROW_GAP = 4.0


@lru_cache(maxsize=None)
def compiled(path: Path) -> tuple[bytes, str]:
    d = symattn.derive(symattn.load_problem(path))
    return compile_latex(symattn.render_latex(d, standalone=True))


@needs_pdflatex
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_no_display_is_scaled_below_85_percent(example):
    _, log = compiled(example)
    scales = display_scales(log)
    d = symattn.derive(symattn.load_problem(example))
    latex = symattn.render_latex(d, standalone=True)
    assert len(scales) == latex.count("\\symattnfit{$"), "every display reports its width"
    too_small = [(k, round(s, 3)) for k, s in enumerate(scales) if s < MIN_SCALE]
    assert not too_small, f"displays scaled below {MIN_SCALE}: {too_small}"


def test_display_scales_reads_the_widths_written_to_the_log():
    log = "symattn: display 250.0pt of 500.0pt\nOverfull\nsymattn: display 625.0pt of 500.0pt\n"
    assert display_scales(log) == [1.0, 0.8]


@needs_pdflatex
@needs_poppler
def test_the_solution_uses_no_type3_fonts(tmp_path):
    pdf, _ = compiled(FOUR)
    (tmp_path / "s.pdf").write_bytes(pdf)
    fonts = subprocess.run(["pdffonts", str(tmp_path / "s.pdf")], capture_output=True, text=True, check=True).stdout
    assert "Type 3" not in fonts, fonts


_WORD = re.compile(r'<word xMin="([-0-9.]+)" yMin="([-0-9.]+)" xMax="([-0-9.]+)" yMax="([-0-9.]+)">(.*?)</word>')


def _pages(pdf: bytes, tmp_path: Path) -> list[list[tuple[float, float, float, float, str]]]:
    (tmp_path / "s.pdf").write_bytes(pdf)
    out = subprocess.run(["pdftotext", "-bbox", str(tmp_path / "s.pdf"), "-"], capture_output=True, text=True,
                         check=True).stdout
    return [
        [(float(a), float(b), float(c), float(d), html.unescape(t)) for a, b, c, d, t in _WORD.findall(page)]
        for page in out.split("<page ")[1:]
    ]


def row_gaps(words) -> list[float]:
    """The gaps between consecutive rows of a fraction matrix, found column by column from its
    denominators' Z: from the bottom of one row's Z (and its subscript) to the top of the word
    highest in the next row's entry (its numerator)."""
    zs = [w for w in words if w[4].startswith("Z")]
    columns: dict[int, list] = {}
    for z in zs:
        columns.setdefault(round(z[0] / 4), []).append(z)
    gaps = []
    for col in columns.values():
        col.sort(key=lambda w: w[1])
        for a, b in zip(col, col[1:]):
            if b[1] - a[1] > 60:  # not consecutive rows of one matrix
                continue
            left, right = min(a[0], b[0]) - 12, max(a[2], b[2]) + 12
            inside = [w for w in words if w[2] > left and w[0] < right and a[1] <= w[1] < b[1] and w is not a]
            bottom = max([a[3]] + [w[3] for w in inside if w[1] <= a[3]])  # Z and its subscript
            above_next = [w[1] for w in inside if w[1] > a[3]]  # the next entry's numerator
            gaps.append((min(above_next) if above_next else b[1]) - bottom)
    return gaps


@needs_pdflatex
@needs_poppler
def test_rows_of_fractions_are_apart(tmp_path):
    pdf, _ = compiled(FOUR)
    pages = _pages(pdf, tmp_path)
    text = [" ".join(w[4] for w in page) for page in pages]
    softmax = next(k for k, t in enumerate(text) if "Softmax on each row" in t)
    weighted = next(k for k, t in enumerate(text) if "Weighted sum of the values" in t)
    for name, page in (("A", pages[softmax]), ("O", pages[weighted])):
        gaps = row_gaps(page)
        assert len(gaps) >= 2, f"{name}: found {len(gaps)} pairs of rows of fractions"
        assert min(gaps) >= MIN_ROW_GAP, f"{name}: rows of fractions {min(gaps):.1f} pt apart: {gaps}"


_BOX = re.compile(r"\\boxed\{\\rule\[-([0-9.]+)em\]\{0pt\}\{([0-9.]+)em\}\\rule\{([0-9.]+)em\}\{0pt\}\}")


def test_answer_boxes_are_sized_to_the_answer():
    d = symattn.derive(symattn.load_problem(FOUR))
    sheet = symattn.render_latex(d, exercise=True, ask=frozenset({"Q", "O"}))
    q, a = sheet.split("\\section*{Step 8")
    q_boxes = [tuple(map(float, m)) for m in _BOX.findall(q)]
    a_boxes = [tuple(map(float, m)) for m in _BOX.findall(a)]
    assert len(q_boxes) == 16 and len(a_boxes) == 8
    # Q holds integers, O fractions over Z_i such as (1 + e^{-1} + 2e^{-2} + e^{-3})/Z_4:
    # O's boxes are taller, and some are wider
    assert max(h for _, h, _ in a_boxes) > max(h for _, h, _ in q_boxes)
    assert max(w for _, _, w in a_boxes) > max(w for _, _, w in q_boxes)
    # every box holds at least a decimal of the problem's digits (4): 0.xxxx
    assert min(w for _, _, w in q_boxes + a_boxes) >= 2.5


def test_the_64_token_heat_map_is_slide_sized():
    pytest.importorskip("matplotlib")
    import struct

    from symattn.render.plot import plot_weights

    d = symattn.derive(symattn.load_problem(ROOT / "worked_examples" / "large" / "causal_64_tokens.yaml"))
    png = plot_weights(d, ".png")
    w, h = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert w <= 2000 and h <= 2000, (w, h)
