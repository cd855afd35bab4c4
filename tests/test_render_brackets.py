"""The web page's brackets around one row of plain numbers (a value row v_j in a weighted sum
o_i = Σ_j a_ij v_j) are set at the text's size: stretched, Chromium drew them past the row and in
pieces, with seams. Checked over every worked example's page, and on the converter directly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import symattn
from symattn.render.mathml import mathml

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "worked_examples").glob("*.yaml"))
STRETCHED_ONE_ROW = re.compile(r"<mo>(?:&#x0005B;|&#x00028;)</mo><mtable>(<mtr>(?:(?!<mtr>|</mtable>).)*</mtr>)</mtable>")
TALL = re.compile(r"<(?:mfrac|msqrt|mroot|munder|mover)\b")


def test_a_row_of_numbers_keeps_its_brackets_at_text_size():
    out = mathml(r"0.25\,\begin{bmatrix} 1 & -2 \end{bmatrix} + 0.75\,\begin{bmatrix} 3 \end{bmatrix}", True)
    assert out.count('<mo stretchy="false">&#x0005B;</mo>') == 2 and out.count('<mo stretchy="false">&#x0005D;</mo>') == 2
    tall = mathml(r"0.5\,\begin{bmatrix} \dfrac{1}{2} \end{bmatrix}", True)  # a fraction: the brackets grow to it
    assert "<mo>&#x0005B;</mo>" in tall
    column = mathml(r"\begin{bmatrix} 1 \\ 2 \end{bmatrix}", True)  # two rows: stretched as a matrix's
    assert "<mo>&#x0005B;</mo>" in column


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_no_page_stretches_brackets_around_one_row_of_numbers(path):
    page = symattn.render_html(symattn.derive(symattn.load_problem(path)))
    bad = [m.group(0)[:120] for m in STRETCHED_ONE_ROW.finditer(page) if not TALL.search(m.group(1))]
    assert not bad, bad[:3]
