"""Every shaded cell keeps WCAG AA contrast (4.5:1) between its digits and its background.

The colours are read from what symattn writes: the ``\\cellcolor``/``\\color`` greys of the committed
LaTeX solutions and of the shading function over the whole range of weights, the style sheet of
the web page (its ``td.g…`` greys, the hatching of masked entries, the text colour that applies by
the cascade) and the fills of the heat map's cells. Contrast is WCAG 2's: relative luminance of
sRGB, (L1 + 0.05) / (L2 + 0.05), written out here from the definition.
"""

from __future__ import annotations

import html as _html
import re
from pathlib import Path

import pytest

import symattn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
TEX = sorted(EXAMPLES.glob("**/*.tex"))
AA = 4.5
# examples with weights, masks and elided matrices, whose web pages are rendered here
PAGES = ["causal_4_tokens", "large/causal_64_tokens", "padding_mask", "sliding_window", "two_heads", "learned_sinks"]


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4


def luminance(rgb: tuple[float, float, float]) -> float:
    """WCAG 2 relative luminance of an sRGB colour with channels in 0..1."""
    r, g, b = (_linear(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a, b) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def css_colour(text: str) -> tuple[float, float, float]:
    text = text.strip().lower()
    m = re.fullmatch(r"#([0-9a-f]{3})", text)
    if m:
        return tuple(int(ch * 2, 16) / 255 for ch in m.group(1))
    m = re.fullmatch(r"#([0-9a-f]{6})", text)
    if m:
        return tuple(int(m.group(1)[k:k + 2], 16) / 255 for k in (0, 2, 4))
    m = re.fullmatch(r"rgb\((\d+),\s*(\d+),\s*(\d+)\)", text)
    if m:
        return tuple(int(v) / 255 for v in m.groups())
    raise ValueError(f"not a colour this test reads: {text!r}")


BLACK, WHITE = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)


def test_the_contrast_formula():
    assert contrast(BLACK, WHITE) == pytest.approx(21.0)
    assert contrast(css_colour("#767676"), WHITE) == pytest.approx(4.54, abs=0.01)  # WCAG's lightest AA grey
    assert contrast(css_colour("#777"), WHITE) < AA


# ------------------------------------------------------------------------------------------ the PDF


def _latex_pairs(tex: str) -> list[tuple[str, tuple, tuple]]:
    """(what, digits colour, background) of each shaded or greyed entry of a LaTeX solution."""
    pairs = []
    for level in re.findall(r"\\cellcolor\[gray\]\{([0-9.]+)\}", tex):  # black digits on the grey
        pairs.append((f"\\cellcolor[gray]{{{level}}}", BLACK, (float(level),) * 3))
    for level in re.findall(r"\\color\[gray\]\{([0-9.]+)\}", tex):  # grey digits on the white page
        pairs.append((f"\\color[gray]{{{level}}}", (float(level),) * 3, WHITE))
    return pairs


@pytest.mark.parametrize("path", TEX, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_shade_of_the_committed_pdfs_has_aa_contrast(path):
    tex = path.read_text("utf-8")
    low = [(what, round(contrast(fg, bg), 2)) for what, fg, bg in _latex_pairs(tex) if contrast(fg, bg) < AA]
    assert not low, low


def test_every_shade_a_weight_can_get_in_the_pdf_has_aa_contrast():
    from symattn.render.matrices import _shade

    pairs = []
    for k in range(1001):
        pairs += _latex_pairs(_shade(False, k / 1000))
    pairs += _latex_pairs(_shade(True, 0))
    assert len(pairs) == 1002
    worst = min(contrast(fg, bg) for _, fg, bg in pairs)
    assert worst >= AA, worst
    # and the shading still tells weights apart: 1 is visibly darker than 0
    assert luminance(pairs[1000][2]) < luminance(pairs[0][2]) - 0.3


# ------------------------------------------------------------------------------------------ the page


def _rules(css: str) -> list[tuple[list[str], dict[str, str]]]:
    rules = []
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        decls = {}
        for decl in re.split(r";(?![^(]*\))", body):
            if ":" in decl:
                name, value = decl.split(":", 1)
                decls[name.strip()] = value.strip()
        rules.append(([s.strip() for s in selectors.split(",")], decls))
    return rules


def _cell_colours(rules, classes: set[str]) -> tuple[str, str | None]:
    """The text colour and background of a ``td`` of a matrix with ``classes``, by the cascade
    (later rules of the same specificity win; every rule here is ``.symattn-page`` and a cell)."""
    colour, background = None, None
    for selectors, decls in rules:
        if selectors == [".symattn-page"]:
            colour = decls.get("color", colour)
        for s in selectors:
            m = re.fullmatch(r"\.symattn-page td\.([\w-]+)", s)
            if m and m.group(1) in classes:
                colour = decls.get("color", colour)
                background = decls.get("background", background)
    return colour, background


def _background_colours(background: str | None) -> list[tuple]:
    """Every colour a background shows: a plain colour, or each stripe of a gradient."""
    if background is None:
        return [WHITE]  # the page's
    found = re.findall(r"#[0-9a-fA-F]{6}\b|#[0-9a-fA-F]{3}\b|rgb\(\d+,\s*\d+,\s*\d+\)", background)
    assert found, background
    return [css_colour(c) for c in found]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    out = {}
    for name in PAGES:
        d = symattn.derive(symattn.load_problem(EXAMPLES / f"{name}.yaml"))
        out[name] = symattn.render_html(d)
    return out


@pytest.mark.parametrize("name", PAGES)
def test_every_cell_of_the_page_has_aa_contrast(pages, name):
    page = pages[name]
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    rules = _rules(css)
    assert _cell_colours(rules, set())[0] is not None, "the page's text colour"
    kinds = {frozenset(c.split()) for c in re.findall(r'<td class="([^"]*)"', page)}
    assert any(any(c.startswith("g") and c[1:].isdigit() for c in k) for k in kinds), "shaded cells"
    assert any("masked" in k for k in kinds), "masked cells"
    # every shade the style sheet defines, used here or not
    kinds |= {frozenset({m}) for m in re.findall(r"td\.(g\d+)\{", css)}
    low = []
    for k in kinds:
        colour, background = _cell_colours(rules, set(k))
        for bg in _background_colours(background):
            ratio = contrast(css_colour(colour), bg)
            if ratio < AA:
                low.append((sorted(k), colour, bg, round(ratio, 2)))
    assert not low, low


@pytest.mark.parametrize("name", PAGES)
def test_every_heat_map_cell_has_aa_contrast(pages, name):
    page = pages[name]
    css = re.search(r"<style>(.*?)</style>", page, re.S).group(1)
    fill = next(d["fill"] for s, d in _rules(css) if ".symattn-page figure.heatmap text" in s and "fill" in d)
    cells = re.findall(r'<g><title>([^<]*)</title><rect [^>]*fill="([^"]+)"[^>]*/>(.*?)</g>', page)
    assert cells, "the page has a heat map"
    written = 0
    for title, background, inside in cells:
        if background.startswith("url("):  # hatched: a masked cell, no digits on it
            assert "<text" not in inside and _html.unescape(title).endswith(": masked"), title
            continue
        assert "<text" in inside, title
        written += 1
        ratio = contrast(css_colour(fill), css_colour(background))
        assert ratio >= AA, (title, background, round(ratio, 2))
    assert written


def test_the_hatching_runs_across_masked_gaps(pages):
    """In a causal matrix elided to 8 columns, row 1 is masked from column 2 on, the '⋯' between them
    included: the hatching fills the row, and stops where the row's entries are not all masked."""
    page = pages["large/causal_64_tokens"]
    table = re.search(r'<table [^>]*data-stage="A" data-form="decimal".*?</table>', page, re.S).group(0)
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]  # after the header
    first = re.findall(r'<td class="([^"]*)"', rows[0])
    assert first == ["entry g65"] + ["entry masked"] * 5 + ["gap masked", "entry masked"], first
    last = re.findall(r'<td class="([^"]*)"', rows[-1])
    assert "masked" not in " ".join(last) and last[6] == "gap", last
    elided = re.findall(r'<td class="([^"]*)"', rows[6])  # the ⋮ row: only the last column is masked throughout
    assert elided == ["gap"] * 7 + ["gap masked"], elided


def test_the_heat_map_hatches_the_gaps_of_masked_entries(pages):
    """The heat map of a causal 64-token head, elided to 8 × 8: the '⋯' column of rows 1-6 and the '⋮'
    row of the last column stand for masked entries only, so they are hatched; no other gap is."""
    page = pages["large/causal_64_tokens"]
    svg = re.search(r'<figure class="heatmap">.*?</figure>', page, re.S).group(0)
    gaps = re.findall(r'<rect x="(\d+)" y="(\d+)"[^>]*fill="url\(#hatch\d+\)"[^>]*class="gap"/>', svg)
    xs = sorted({int(x) for x, _ in gaps})
    ys = sorted(int(y) for _, y in gaps)
    assert len(gaps) == 7 and len(xs) == 2, gaps
    cell = ys[1] - ys[0]
    # six rows at the '⋯' column (the 7th drawn column), then the '⋮' row at the last column
    assert [(int(x), int(y)) for x, y in gaps] == [(xs[0], ys[0] + cell * r) for r in range(6)] + [(xs[1], ys[0] + cell * 6)]
    assert xs[1] - xs[0] == cell


@pytest.mark.parametrize("name", PAGES)
def test_every_digit_on_the_plot_has_aa_contrast(name):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    from symattn.render.plot import figure

    fig = figure(symattn.derive(symattn.load_problem(EXAMPLES / f"{name}.yaml")))
    try:
        checked = []
        for ax in fig.axes:
            for image in ax.get_images():
                values = image.get_array()
                for text in ax.texts:
                    j, i = (round(v) for v in text.get_position())
                    background = image.cmap(image.norm(values[i][j]))[:3]
                    checked.append((text.get_text(), contrast(to_rgb(text.get_color()), background)))
    finally:
        plt.close(fig)
    if name == "large/causal_64_tokens":  # more than 16 tokens: no digits are written
        assert checked == []
        return
    assert checked
    low = [(t, round(r, 2)) for t, r in checked if r < AA]
    assert not low, low


def test_the_plots_text_colour_has_aa_contrast_on_every_shade():
    """Over the whole colour map, the digit colour --plot picks keeps 4.5:1."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    from symattn.render.plot import figure
    from symattn.render.shades import on

    fig = figure(symattn.derive(symattn.load_problem(EXAMPLES / "causal_4_tokens.yaml")))
    cmap = fig.axes[0].get_images()[0].cmap  # the colour map the plot draws with
    plt.close(fig)
    worst = min(contrast(to_rgb(on(cmap(k / 1000)[:3])), cmap(k / 1000)[:3]) for k in range(1001))
    assert worst >= AA, worst
