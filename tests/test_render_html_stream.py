"""The web page's picture of the residual stream, without a browser: what it draws, for each kind of block.

Each problem's expected picture is written here by hand from its problem file (which norms, where,
which sums, which head); the page is parsed with the strict little parser of test_render_html.py.
test_render_html_block_browser.py opens the pictures in Chromium.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import symattn
from symattn.render.html import render_html
from symattn.render.stream import picture
from test_render_html import Tree

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"

# A BERT-order layer by hand: the attention's sum R = X + O and its LayerNorm H, then the MLP's
# sum Y_sum = H + F and its LayerNorm Y (post-norm both times), no head.
BERT = """\
title: A BERT-order layer by hand
tokens: ["[CLS]", cat, "[SEP]"]
X: [[1, 0], [0, 1], [1, 1]]
W_Q: [[1, 0], [0, 1]]
W_K: [[0, 0], [0, 0]]
W_V: [[1, 0], [0, 2]]
mask: none
norm: {type: layernorm, place: post, eps: 0}
mlp:
  norm: {type: layernorm, place: post, eps: 0}
  W_1: [[1, -1, 0], [0, 1, -1]]
  b_1: [0, -1, 1]
  W_2: [[1, 0], [0, 1], [-1, 1]]
  activation: relu
"""


def _derive(source):
    return symattn.derive(symattn.load_problem(source))


def _figure(page: str):
    """The page's tree, and its one picture of the stream."""
    tree = Tree(page)
    assert not tree.errors, tree.errors[:5]
    figures = [f for f in tree.root.find("figure") if "stream" in f.classes()]
    assert len(figures) == 1
    return tree, figures[0]


def _columns(figure) -> list[tuple[str, list[str]]]:
    """Each column beside the stream: its kind, and the names of its boxes top to bottom."""
    out = []
    for g in figure.find("g"):
        if "data-sub-block" in g.attrs:
            names = [t.all_text() for t in g.find("text") if "name" in t.classes()
                     and "side" in t.parent.classes()]
            out.append((g.attrs["data-sub-block"], names))
    return out


def _sums(figure) -> dict[str, str]:
    """Each ⊕: the stage it makes -> the sum written beside it."""
    return {n.attrs["data-stage"]: next(t for t in n.find("text")).all_text()
            for n in figure.walk() if "plus" in n.classes()}


def _on_stream(figure) -> list[str]:
    """The boxes the stream passes through (its input and any post norm), top to bottom."""
    return [next(t for t in n.find("text") if "name" in t.classes()).all_text()
            for n in figure.walk() if n.classes() & {"start", "on-stream"}]


def _links(tree, figure) -> list[str]:
    """The targets of the picture's links, each checked to be a step heading on the page."""
    ids = {n.attrs["id"] for n in tree.root.walk() if "id" in n.attrs}
    targets = [n.attrs["href"][1:] for n in figure.walk() if n.tag == "a"]
    for target in targets:
        assert target in ids, target
        (heading,) = [n for n in tree.root.walk() if n.attrs.get("id") == target]
        assert heading.tag == "h3"
    return targets


@pytest.mark.parametrize("name, start, columns, sums", [
    ("block_by_hand", "X",
     [("attention", ["O"]), ("mlp", ["F"]), ("next-token", ["logits", "P", "L"])],
     {"H": "H = X + O", "Y": "Y = H + F"}),
    ("tiny_gpt2_model", "X_pos",  # positions added, ln_1, ln_2, ln_f
     [("attention", ["X_norm", "O"]), ("mlp", ["H_norm", "F"]), ("next-token", ["Y_final", "logits", "P", "L"])],
     {"H": "H = X_pos + O", "Y": "Y = H + F"}),
    ("tiny_llama_block", "X",  # RMSNorms, rows: last
     [("attention", ["X_norm", "O"]), ("mlp", ["H_norm", "F"]),
      ("next-token", ["Y_last", "Y_final", "logits", "P", "L"])],
     {"H": "H = X + O", "Y": "Y = H + F"}),
    ("rmsnorm_head", "X", [("attention", ["X_norm", "O"])], {"H": "H = X + O"}),  # no MLP, no head
    ("layernorm_backward", "X", [("attention", ["X_norm", "O"])], {"H": "H = X + O"}),  # the backward pass is not drawn
])
def test_a_column_per_sub_block_and_a_sum_per_addition(name, start, columns, sums):
    tree, figure = _figure(render_html(_derive(EXAMPLES / f"{name}.yaml")))
    assert _on_stream(figure) == [start]
    assert _columns(figure) == columns
    assert _sums(figure) == sums
    targets = _links(tree, figure)
    for stage in sums:  # each ⊕ links to the step that makes its sum
        assert f"stage-{stage}" in targets


def test_a_post_norm_block_adds_then_normalises():
    tree, figure = _figure(render_html(_derive(BERT)))
    assert _columns(figure) == [("attention", ["O"]), ("mlp", ["F"])]
    assert _sums(figure) == {"R": "R = X + O", "Y_sum": "Y_sum = H + F"}
    assert _on_stream(figure) == ["X", "H", "Y"]  # the stream passes through each norm after its sum
    texts = [t.all_text() for t in figure.find("text")]
    assert "H = LayerNorm(R)" in texts and "Y = LayerNorm(Y_sum)" in texts
    assert "Y: the block's output" in texts
    labels = [t.all_text() for t in figure.find("text") if "label" in t.classes()]
    assert labels == ["Attention (post-norm)", "MLP (post-norm)"]
    _links(tree, figure)


def test_the_boxes_are_named_and_numbered_as_the_solution_names_them():
    d = _derive(EXAMPLES / "tiny_llama_block.yaml")
    pic = picture(d, frozenset(d.ids))
    attention, mlp, head = pic.blocks
    norm, heads = attention.boxes
    assert (norm.title, norm.steps) == ("Normalise each token (RMSNorm)", "Step 2")
    assert heads.title == "Attention: 4 heads, 2 K/V groups, RoPE"
    assert mlp.boxes[1].title == "The MLP (gated: SwiGLU)"
    assert "G = SiLU(U_gate) ∘ U_up" in mlp.boxes[1].detail and "F = G·W_down" in mlp.boxes[1].detail
    assert [b.title for b in head.boxes] == ["The last position's row", "The final norm (RMSNorm)",
                                             "The logits: every word scored", "Next-token probabilities",
                                             "The cross-entropy loss"]
    assert "16 words" in head.boxes[3].detail and "over 1 row" in head.boxes[4].detail
    # the step numbers are the page's: each box's number is in a heading of the page
    headings = render_html(d)
    for box in (norm, *mlp.boxes, *head.boxes):
        number = box.steps.split()[-1]
        assert f"Step {number}: " in headings


def test_no_picture_without_the_residual_stream():
    page = render_html(_derive(EXAMPLES / "causal_4_tokens.yaml"))
    assert 'class="stream"' not in page
    assert picture(_derive(EXAMPLES / "causal_4_tokens.yaml")) is None


def test_part_of_the_solution_links_only_the_steps_it_shows():
    d = _derive(EXAMPLES / "block_by_hand.yaml")
    tree, figure = _figure(render_html(d, first="U", last="logits"))
    targets = _links(tree, figure)
    assert targets == ["stage-U", "stage-Y", "stage-W_U"]  # the MLP's box (its first step shown), its ⊕, the logits' box
    unlinked = [next(t for t in g.find("text")).all_text() for g in figure.find("g") if "box" in g.classes()]
    assert unlinked == ["X", "O", "P", "L"]  # drawn, but their steps are not on this page


def test_the_exercise_sheet_links_its_steps():
    d = _derive(EXAMPLES / "block_by_hand.yaml")
    tree, figure = _figure(render_html(d, exercise=True))
    assert "stage-H" in _links(tree, figure)


HOSTILE = "<script>alert(1)</script>"


def test_hostile_title_and_tokens_stay_text():
    text = yaml.safe_load(BERT)
    text.update(title=f"</title>{HOSTILE}", tokens=["&amp;", HOSTILE, '"><img src=x onerror=alert(1)>'])
    page = render_html(_derive(yaml.safe_dump(text)))
    tree, figure = _figure(page)
    assert not [n for n in figure.walk() if n.tag in ("script", "img", "foreignobject")]
    assert not [name for n in figure.walk() for name in n.attrs if name.startswith("on")]
    start = next(n for n in figure.walk() if "start" in n.classes())
    assert f"3 tokens: &amp;, {HOSTILE}" in start.all_text()  # the words, as text (cut to fit the box)
    raw = page[page.index('<figure class="stream"'):page.index("</figure>", page.index('<figure class="stream"'))]
    assert "<script" not in raw and "<img" not in raw and "&amp;amp;" in raw
