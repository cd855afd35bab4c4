"""Heat-map column labels: a token of at most three characters stays upright; a longer one may turn.

Turned 45°, "I" reads as a slash. Checked over every worked example's heat maps: the web page's
SVG (each column label's ``<text>`` and its transform) and ``--plot``'s matplotlib figure (each tick
label's rotation), against the token lengths read from the problem here.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from pathlib import Path

import pytest

import symattn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("**/*.yaml"))
SHORT = 3  # characters: the most a label may have and be required upright


@lru_cache(maxsize=None)
def _derived(path: Path):
    return symattn.derive(symattn.load_problem(path))


def _column_labels(page: str) -> list[tuple[str, bool]]:
    """(label, turned) of every heat map column label of a page."""
    out = []
    for attrs, text in re.findall(r'<text ([^>]*class="col[^"]*"[^>]*)>([^<]*)</text>', page):
        out.append((html.unescape(text), "rotate(" in attrs))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_short_labels_stay_upright_on_the_page(example):
    d = _derived(example)
    labels = _column_labels(symattn.render_html(d))
    tokens = {t for s in d.steps if s.is_softmax for t in s.cols}
    for text, turned in labels:
        if text == "⋯":
            assert not turned
            continue
        assert text in tokens or text.endswith("…"), text
        if len(text) <= SHORT:
            assert not turned, f"{text!r} is turned"
        else:
            assert turned, f"{text!r} is upright but too long for the column"  # today's rule: the longer turn


def test_the_worked_examples_have_both_kinds():
    kinds = {turned for e in EXAMPLES for _, turned in _column_labels(symattn.render_html(_derived(e)))}
    assert kinds == {True, False}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_short_labels_stay_upright_in_the_plot(example):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from symattn.errors import SymattnError
    from symattn.render.plot import figure

    d = _derived(example)
    try:
        fig = figure(d)
    except SymattnError:  # symbols without values: nothing to plot (the command says so)
        assert not d.can_evaluate
        return
    try:
        seen = 0
        for ax in fig.axes:
            if not ax.get_xlabel().startswith("key"):
                continue  # a colour bar
            n_k = len(ax.get_images()[0].get_array()[0])
            for tick in ax.get_xticklabels():
                text = tick.get_text()
                seen += 1
                if len(text.strip("\u2066\u2067\u2068\u2069")) <= SHORT or n_k <= 6:
                    assert tick.get_rotation() == 0, (text, tick.get_rotation())
                else:
                    assert tick.get_rotation() == 45, text
        assert seen
    finally:
        plt.close(fig)


def test_a_one_letter_token_is_upright_among_many_columns(tmp_path):
    """The issue's case: "I" among more than six columns, where longer tokens turn."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from symattn.render.plot import figure

    words = ["I", "really", "do", "like", "green", "tea", "a", "lot"]
    n = len(words)
    eye = [[int(i == j) for j in range(n)] for i in range(n)]
    import yaml

    p = symattn.load_problem(yaml.safe_dump({"tokens": words, "X": eye, "W_Q": eye, "W_K": eye, "W_V": eye,
                                             "mask": "causal"}))
    d = symattn.derive(p)
    fig = figure(d)
    try:
        turned = {t.get_text(): t.get_rotation() for t in fig.axes[0].get_xticklabels()}
    finally:
        plt.close(fig)
    assert {w for w, r in turned.items() if r == 0} == {"I", "do", "tea", "a", "lot"}
    assert {w for w, r in turned.items() if r == 45} == {"really", "like", "green"}
    page = dict(_column_labels(symattn.render_html(d)))
    assert [w for w in words if not page[w]] == ["I", "do", "tea", "a", "lot"]
