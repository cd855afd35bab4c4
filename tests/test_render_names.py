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
    assert "head3.K_T" in d and "head2.K_T" not in d  # a grouped head reads its group's K_T: it has none
    assert symbol_text(d.step(registry.stage_id("Q_rot", 1))).endswith("⁽¹⁾")


# -- the names in a decoding step and a head's step are the full computation's ----------------------


def _normaliser_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if re.match(r"\s+m\S*_\d+ [=≈]", line)]


@pytest.mark.parametrize("name", ["decode_step", "sink_window"])
def test_the_decoded_row_is_named_as_the_full_computations_row(derivations, name):
    """Token t's m and Z in the decoding step are row t's of the full A (same name, same value), and
    its formula speaks of a_t and s_t, not A and Ŝ."""
    d = derivations[name]
    t = d.problem.decode
    text = symattn.render_text(d)
    decoded = _normaliser_lines(text.split("Its weights")[1].split("Its output")[0])
    assert len(decoded) == 1 and decoded[0].startswith(f"m_{t} ")
    assert decoded[0] in _normaliser_lines(text.split("Its weights")[0])  # the full A's row t: the same line
    tex = symattn.render_latex(d)
    assert "m_t = \\max_k s_{t,k}" in tex and f"Z_{{{t}}} &= \\sum_k e^{{s_{{{t},k}} - m_{{{t}}}}}" in tex
    assert "Z_{1}" not in tex.split("Its weights")[1].split("Its output")[0]


def test_every_head_names_its_normalisers_per_head_from_the_start(derivations):
    """A head's weights, its m and Z lines, and the concatenation all write Z^{(h)}_i: the name does
    not change between a head's softmax and the step that reads it."""
    d = derivations["two_heads"]
    tex = symattn.render_latex(d)
    for h in (1, 2):
        assert f"A^{{({h})}}_{{ij}} = \\frac{{e^{{\\hat{{S}}^{{({h})}}_{{ij}} - m^{{({h})}}_i}}}}{{Z^{{({h})}}_i}}" in tex
        assert f"Z^{{({h})}}_{{3}} &= \\sum_k" in tex
    before, concat = tex.split("\\paragraph{Concatenate the heads.}")
    names_in_a = set(re.findall(r"Z\^\{\((\d)\)\}_\{(\d)\}", before))
    names_in_concat = set(re.findall(r"Z\^\{\((\d)\)\}_\{(\d)\}", concat))
    assert names_in_concat and names_in_concat <= names_in_a
    assert not re.search(r"Z_\{\d\}", tex)  # no head-less Z in a problem of heads


# -- one notation in the text format ------------------------------------------------------------------


def test_text_writes_powers_of_e_and_block_indices_one_way(derivations):
    """The text format writes a power of e as e⁻⁴ or exp(…), never e^(…), and the online softmax's block
    index as m⁽ᵇ⁾ everywhere (its formulas, its prose and its table's headings), never m(b) or m^(b)."""
    found = []
    for name, d in derivations.items():
        text = symattn.render_text(d)
        found += [f"{name}: {m.group(0)!r}" for m in re.finditer(r"\be\^\(|\b(m|ℓ|acc)(\^)?\((b|b−1|0)\)", text)]
    assert not found, found[:10]
    tiled = symattn.render_text(derivations["tiled_softmax"])
    assert "exp(m⁽ᵇ⁻¹⁾ − m⁽ᵇ⁾)" in tiled and re.search(r"^\s+b\s+keys\s+m⁽ᵇ⁾", tiled, re.M)  # the column headed b


def test_the_text_notation_check_can_fail():
    from symattn.render import prose

    assert prose.text_of("e^{s_j - m^{(b)}}") == "exp(sⱼ − m⁽ᵇ⁾)"
    assert prose.text_of("e^{-4}") == "e⁻⁴" and prose.text_of("x_{i-1}") == "xᵢ₋₁"
    assert re.search(r"\be\^\(", "Z = 1 + e^(−4)") and re.search(r"\b(m|ℓ|acc)(\^)?\((b|b−1|0)\)", "m(b−1)")


# -- a shared thing said once --------------------------------------------------------------------------


def test_heads_say_a_shared_thing_once(derivations):
    """Over every worked example of several heads: no reason of 60 characters or more is written again,
    word for word under a later head: it is pointed back to, and a head says only what it adds."""
    for name, d in derivations.items():
        if not d.problem.multi_head:
            continue
        from symattn.render import prose

        text = symattn.render_text(d)
        whys = {step.why for step in d.steps if step.head is not None and len(step.why) >= 60}
        repeated = [w for w in whys if text.count(prose.plain(w)) > 1]
        assert not repeated, (name, repeated[:2])
    gqa = symattn.render_text(derivations["gqa_4_heads_2_kv"])
    assert "As for head 1. The keys are K/V group 2's, head 3's K⁽³⁾ᵀ." in gqa
