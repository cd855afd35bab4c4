"""A matrix the web page has shown already is folded away, not drawn again for every head.

The grouped-query example's four heads share one causal mask, and with d_k = 1 each head's
scaled scores are its scores: the page says so in one line and keeps the table one click away
(a ``<details>``). Whether two matrices are equal is decided here with NumPy on the problem's own
numbers, not by symattn.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import yaml

import symattn
from symattn.render.html import render_html
from test_render_html import Tree

ROOT = Path(__file__).resolve().parent.parent
GQA = ROOT / "worked_examples" / "gqa_4_heads_2_kv.yaml"


def _folded(page: str) -> dict[str, str]:
    """Each folded table's stage id → the sentence its summary says."""
    tree = Tree(page)
    assert not tree.errors, tree.errors[:5]
    out = {}
    for details in tree.root.find("details"):
        assert details.classes() == {"same"}
        (summary,) = [c for c in details.children if c.tag == "summary"]
        tables = [t.attrs["data-stage"] for t in details.find("table") if "data-stage" in t.attrs]
        assert len(tables) == 1, tables  # one matrix folded per sentence, its table still on the page
        out[tables[0]] = summary.all_text()
    return out


def test_the_shared_mask_and_the_scale_by_one_are_folded():
    spec = yaml.safe_load(GQA.read_text())
    n = len(spec["X"])
    heads = len(spec["heads"])
    d = symattn.derive(symattn.load_problem(GQA))
    folded = _folded(render_html(d))
    # the causal mask, built here: every head's is the same, so heads 2..h fold theirs
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for h in range(1, heads + 1):
        assert np.array_equal(d.approx(f"head{h}.M"), causal)
    assert {f"head{h}.M" for h in range(2, heads + 1)} <= folded.keys()
    assert "head1.M" not in folded
    assert all("head 1's" in folded[f"head{h}.M"] for h in range(2, heads + 1))
    # d_k = 1: the scores divided by √1 are the scores, folded with a sentence pointing back
    assert all(len(w[0]) == 1 for w in (h["W_Q"] for h in spec["heads"]))
    for h in range(1, heads + 1):
        assert np.array_equal(d.approx(f"head{h}.S_scaled"), d.approx(f"head{h}.S"))
        assert "above" in folded[f"head{h}.S_scaled"]
    # nothing else: results that differ, and weights that only happen to be alike, stay in sight
    assert set(folded) == {f"head{h}.M" for h in range(2, heads + 1)} | {f"head{h}.S_scaled" for h in range(1, heads + 1)}


def test_weights_that_happen_to_match_an_earlier_heads_stay_in_sight():
    """Heads 1 and 2 of the example reach the same weights by different scores: head 2's softmax
    has its own m_i and Z_i, so its step is drawn, not folded as a repeat."""
    d = symattn.derive(symattn.load_problem(GQA))
    assert np.allclose(d.approx("head2.A"), d.approx("head1.A"), rtol=0, atol=1e-15)
    assert not np.array_equal(d.approx("head2.S"), d.approx("head1.S"))
    folded = _folded(render_html(d))
    assert not {"head2.A", "head2.O", "head2.S"} & folded.keys()


def test_an_exercise_sheet_folds_nothing():
    d = symattn.derive(symattn.load_problem(GQA))
    assert _folded(render_html(d, exercise=True)) == {}
