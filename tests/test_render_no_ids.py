"""What a person reads names a stage as the solution writes it (V⁽³⁾, "head 3's weights A⁽³⁾"), never by
its stage id (head3.V, a_t): prose, step titles, captions, SVG titles and screen-reader labels, in every
format, over every worked example. The ids stay where programs read them (JSON, data-* attributes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import symattn
from symattn import stages as registry

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parent.parent / "worked_examples").glob("*.yaml"))
RENDERERS = {"text": symattn.render_text, "markdown": symattn.render_markdown, "latex": symattn.render_latex,
             "html": symattn.render_html}
HEAD_ID = re.compile(r"\bhead\d+\.\w+")
# ids that are no symbol a solution writes (W_Q and S_scaled are also symbols, W_Q and S_{scaled}, so
# they cannot tell here)
PLAIN_IDS = re.compile(r"(?<![\\\w{])(S_masked|S_capped|K_T|O_rec_diff|A_sink)(?![\w}])")


def _read(html: str) -> str:
    """A web page's text as people meet it: everything but scripts, styles and the attributes made
    for programs (data-*, ids, classes, links); titles, captions and aria-labels are kept."""
    html = re.sub(r"<(script|style)\b.*?</\1>", "", html, flags=re.S)
    return re.sub(r'\s(data-[\w-]+|id|href|class|for|headers|aria-labelledby|aria-describedby)="[^"]*"', "", html)


@pytest.fixture(scope="module")
def derivations():
    return {p.stem: symattn.derive(symattn.load_problem(p)) for p in EXAMPLES}


@pytest.mark.parametrize("fmt", sorted(RENDERERS))
def test_no_stage_id_in_what_people_read(derivations, fmt):
    found = []
    for name, d in derivations.items():
        out = RENDERERS[fmt](d)
        if fmt == "html":
            out = _read(out)
        for pattern in (HEAD_ID, PLAIN_IDS):
            found += [f"{name}.{fmt}: …{out[max(0, m.start() - 60):m.end() + 10]!r}" for m in pattern.finditer(out)]
    assert not found, "\n".join(found[:20])


def test_the_check_can_fail():
    """The patterns catch the slips the test is for."""
    assert HEAD_ID.search("The values are K/V group 2's (head3.V).")
    assert PLAIN_IDS.search("the keys (head1.K_T) and S_masked") and not PLAIN_IDS.search("S_{masked}")
    assert "head1.W_Q" not in _read('<table data-stage="head1.W_Q" aria-label="W_Q⁽¹⁾">')
    assert "head1.W_Q" in _read('<table aria-label="column j of head1.W_Q">')


def test_grouped_heads_name_the_group_by_its_symbols(derivations):
    text = symattn.render_text(derivations["gqa_4_heads_2_kv"])
    assert "Head 3 reads K/V group 2 (K⁽³⁾ and V⁽³⁾)" in text
    assert "The values are K/V group 2's, head 3's V⁽³⁾." in text
    assert "concat = [O⁽¹⁾ | O⁽²⁾ | O⁽³⁾ | O⁽⁴⁾]" in text


def test_heat_map_captions_name_the_head_and_say_hatched_only_when_masked(derivations):
    page = symattn.render_html(derivations["gqa_4_heads_2_kv"])
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert len(captions) == 4 and all(f"Head {h}'s weights" in c for h, c in zip(range(1, 5), captions))
    assert all("hatched cells are masked" in c for c in captions)  # causal: every map has masked cells
    decode = symattn.render_html(derivations["decode_step"])
    titles = re.findall(r'<title id="hatch\d+-t">(.*?)</title>', decode)
    step_title = [t for t in titles if "aₜ" in t]
    assert step_title and "hatched" not in step_title[0]  # the decoded row sees its whole cache: nothing masked
    assert not any("a_t" in t for t in titles)
    unmasked = symattn.render_html(derivations["bert_unmasked"])
    assert "hatched" not in "".join(re.findall(r"<figcaption>(.*?)</figcaption>", unmasked))


def test_symbols_with_heads():
    d = symattn.derive(symattn.load_problem(EXAMPLES[0].parent / "tiny_llama_block.yaml"))
    from symattn.render.blocks import symbol_of, symbol_text

    assert symbol_of(d.step(registry.stage_id(registry.K_T, 3))) == "K^{(3)\\top}"
    assert symbol_text(d.step(registry.stage_id(registry.K_T, 3))) == "K⁽³⁾ᵀ"
    assert symbol_text(d.step(registry.stage_id(registry.Q, 1))) == "Q⁽¹⁾"
    assert symbol_text(d.step(registry.stage_id("Q_rot", 1))).endswith("⁽¹⁾")
