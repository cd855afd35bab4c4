"""The web page of a whole block: what each entry of the MLP, the sums, the head and the loss is
traced to, and the picture of the residual stream, in headless Chromium (as
test_render_html_browser.py, whose helpers this uses).

Without a browser: each block stage's traces are checked against the arithmetic, with NumPy here
(a sum of its traced entries, a row times a column plus a bias, the activation of its entry, a
row's softmax, its cross-entropy, a column's mean, a row's norm). In the browser: pointing at an
entry of each stage lights exactly the entries it is made from; the picture has a size, raises
no console error, keeps every box's text inside its box, fits a 360 px window, and its links go
to their steps.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import symattn
from symattn import stages as registry
from symattn.render.html import render_html
from test_render_html_browser import ARTIFACTS, EXAMPLES, WIDTH, col_of, entry, forms, lit, load, row_of, screenshot
import test_render_html_browser
from test_render_html_stream import BERT

try:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
except ImportError:  # pragma: no cover - the browser tests skip (see _driver)
    pass

pytestmark = pytest.mark.xdist_group("browser")
browser = test_render_html_browser.browser  # the fixture: one Chromium for this module
PAGES = ("block_by_hand", "tiny_gpt2_model", "tiny_llama_block", "bert")


@functools.lru_cache(maxsize=None)
def derivation(name: str):
    return symattn.derive(symattn.load_problem(BERT if name == "bert" else EXAMPLES[name]))


# -- the traces against the arithmetic (no browser) ----------------------------------------------

def _activation(name: str, u):
    if name == "relu":
        return np.maximum(u, 0)
    if name == "silu":
        return u / (1 + np.exp(-u))
    if name == "gelu-tanh":
        return u / 2 * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    return u / 2 * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))  # gelu (erf)


_NORM_OF = {registry.H_HAT: lambda c: c.mlp.norm, registry.Y_HAT: lambda c: c.mlp.norm,
            registry.Y_FINAL_HAT: lambda c: c.logits.norm}


def _made(step, d, traces, c):
    """What step's value must be, from the stages it is traced to (None: not a rule checked here)."""
    key, v = step.key, {id: np.nan_to_num(d.approx(id)) for id, _ in traces}
    hows = [how for _, how in traces]
    ids = [id for id, _ in traces]
    if key in (registry.H, registry.R, registry.Y, registry.Y_SUM):
        assert hows == ["entry", "entry"]
        return v[ids[0]] + v[ids[1]]
    if key in (registry.U, registry.U_GATE, registry.U_UP, registry.F, registry.LOGITS):
        assert hows[:2] == ["row", "col"] and all(h == "col" for h in hows[2:])
        return v[ids[0]] @ v[ids[1]] + sum(v[b] for b in ids[2:])  # a bias: one row, added to every row
    if key == registry.G:
        assert set(hows) == {"entry"}
        out = _activation(c.mlp.activation, v[ids[0]])
        return out * v[ids[1]] if c.mlp.gated else out
    if key in (registry.P, registry.NLL):
        assert hows == ["row"]  # a row's softmax and its cross-entropy read the whole row of logits
    if key == registry.P:
        z = v[ids[0]]
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if key == registry.NLL:
        z = v[ids[0]]
        return np.array([[np.log(np.exp(z[r]).sum()) - z[r, t]] for r, t in zip(c.ce.rows, c.ce.targets)])
    if key == registry.LOSS:
        assert hows == ["col"]
        return v[ids[0]].mean(axis=0, keepdims=True)
    if key == registry.Y_LAST:
        assert hows == ["last"]
        return v[ids[0]][-1:]
    if key in _NORM_OF:  # a row over its root, from the row alone
        assert set(hows) == {"row"}
        n, x = _NORM_OF[key](c), v[ids[0]]
        eps = float(n.eps)
        if n.rms:
            return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
        mu = x.mean(axis=1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    return None


@pytest.mark.parametrize("name", PAGES)
def test_the_block_stages_are_made_of_what_they_are_traced_to(name):
    d = derivation(name)
    checked = set()
    for step in d:
        c = registry.Context(d.problem, step.head)
        want = _made(step, d, registry.traces(step.kind_of, c), c)
        if want is not None:
            assert np.allclose(d.approx(step.id), want, rtol=1e-9, atol=1e-12), step.id
            checked.add(step.key)
    c = registry.Context(d.problem, None)
    expected = {registry.G, registry.F, registry.Y_SUM if c.mlp.post else registry.Y}
    if c.logits is not None:
        expected |= {registry.LOGITS, registry.P, registry.NLL, registry.LOSS}
    assert expected <= checked, expected - checked


# -- in the browser -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("block-pages")
    out = {}
    for name in PAGES:
        path = folder / f"{name}.html"
        path.write_text(render_html(derivation(name)), "utf-8")
        out[name] = path
    return out


def _open(browser, pages, name: str, width: int = WIDTH):
    browser.set_window_size(width, 900)
    load(browser, pages[name])
    return browser, derivation(name)


def point(driver, stage: str, i: int, j: int, form: str) -> None:
    ActionChains(driver).move_to_element(entry(driver, stage, i, j, form)).perform()
    assert lit(driver, ".symattn-page .active") == {(stage, form, i, j)}


def entries(driver, stage: str, i: int, j: int) -> set:
    return {(stage, f, i, j) for f in forms(driver, stage)}


def test_hand_block_entries_light_what_makes_them(browser, pages):
    driver, d = _open(browser, pages, "block_by_hand")
    point(driver, "U", 2, 1, "exact")  # U[3,2]: row 3 of H, column 2 of W_1 and of b_1
    assert lit(driver) == row_of(driver, d, "H", 2) | col_of(driver, d, "W_1", 1) | col_of(driver, d, "b_1", 1)
    point(driver, "G", 1, 2, "exact")  # ReLU of U[2,3] alone
    assert lit(driver) == entries(driver, "U", 1, 2)
    point(driver, "F", 0, 1, "exact")
    assert lit(driver) == row_of(driver, d, "G", 0) | col_of(driver, d, "W_2", 1) | col_of(driver, d, "b_2", 1)
    point(driver, "Y", 2, 0, "decimal")  # Y = H + F, entry by entry
    assert lit(driver) == entries(driver, "H", 2, 0) | entries(driver, "F", 2, 0)
    point(driver, "logits", 1, 3, "exact")
    assert lit(driver) == row_of(driver, d, "Y", 1) | col_of(driver, d, "W_U", 3)
    point(driver, "P", 1, 2, "exact")  # a row's softmax reads the whole row of logits
    assert lit(driver) == row_of(driver, d, "logits", 1)
    point(driver, "nll", 2, 0, "exact")
    assert lit(driver) == row_of(driver, d, "logits", 2)
    point(driver, "L", 0, 0, "exact")  # the mean of every row's cross-entropy
    assert lit(driver) == col_of(driver, d, "nll", 0) and len(col_of(driver, d, "nll", 0)) == 6


def test_gpt2_norms_and_head_light_what_makes_them(browser, pages):
    driver, d = _open(browser, pages, "tiny_gpt2_model")
    point(driver, "H_hat", 1, 3, "decimal")  # the MLP's norm: row 2 of H and its statistics
    assert lit(driver) == (row_of(driver, d, "H", 1) | row_of(driver, d, "mlp_mean", 1)
                           | row_of(driver, d, "mlp_var", 1))
    text = driver.execute_script(
        "var t = document.querySelector('table.matrix[data-stage=\"H_hat\"]'); return t.nextElementSibling.textContent;")
    assert "μ" in text and "≈" in text  # the explanation: (h − μ)/√(σ² + ε) in decimals
    point(driver, "H_norm", 0, 7, "decimal")
    assert lit(driver) == (entries(driver, "H_hat", 0, 7) | col_of(driver, d, "mlp_gamma", 7)
                           | col_of(driver, d, "mlp_beta", 7))
    point(driver, "Y_final", 2, 0, "decimal")
    assert lit(driver) == (entries(driver, "Y_final_hat", 2, 0) | col_of(driver, d, "final_gamma", 0)
                           | col_of(driver, d, "final_beta", 0))
    point(driver, "logits", 0, 5, "decimal")  # the tied unembedding: column 6 of W_U (drawn up to #5 and the last)
    assert lit(driver) == row_of(driver, d, "Y_final", 0) | col_of(driver, d, "W_U", 5)


def test_the_last_row_lights_the_last_row_of_y(browser, pages):
    driver, d = _open(browser, pages, "tiny_llama_block")
    point(driver, "Y_last", 0, 4, "decimal")
    last = d.step("Y").shape[0] - 1
    assert lit(driver) == entries(driver, "Y", last, 4) and last == 2


# What the picture looks like once drawn: its size, and every box's text against its box.
PICTURE = """
var f = document.querySelector("figure.stream"), svg = f && f.querySelector("svg");
if (!svg) { return null; }
var r = svg.getBoundingClientRect();
var spill = [];
Array.prototype.forEach.call(svg.querySelectorAll(".box"), function (box) {
  var b = box.querySelector("rect").getBBox();
  Array.prototype.forEach.call(box.querySelectorAll("text"), function (t) {
    var x = t.getBBox();
    if (x.x < b.x || x.y < b.y || x.x + x.width > b.x + b.width || x.y + x.height > b.y + b.height) {
      spill.push(t.textContent);
    }
  });
});
return {width: r.width, height: r.height, figure: f.clientWidth, spill: spill,
        page: document.documentElement.clientWidth, links: svg.querySelectorAll("a").length,
        csp: window.__csp || []};
"""


@pytest.mark.parametrize("name", PAGES)
@pytest.mark.parametrize("width", [WIDTH, 360])
def test_the_picture_renders_and_fits(browser, pages, name, width):
    driver, _ = _open(browser, pages, name, width)
    found = driver.execute_script(PICTURE)
    assert found is not None, "no picture of the stream"
    assert found["width"] > 100 and found["height"] > 100
    assert found["width"] <= found["figure"] + 0.5, "the picture is wider than its figure"
    assert found["spill"] == [], "text outside its box"
    assert found["links"] >= 4 and found["csp"] == []
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot(driver, ARTIFACTS / f"stream-{name}-{width}.png")


def test_a_link_in_the_picture_goes_to_its_step(browser, pages):
    driver, _ = _open(browser, pages, "tiny_gpt2_model")
    link = driver.find_element(By.CSS_SELECTOR, 'figure.stream a.plus[data-stage="Y"]')
    assert link.get_attribute("aria-label").startswith("Y = H + F")
    driver.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}));", link)
    where = driver.execute_script("""
        var h = document.getElementById("stage-Y").getBoundingClientRect();
        return [location.hash, h.top, window.innerHeight, document.getElementById("stage-Y").textContent];""")
    assert where[0] == "#stage-Y" and 0 <= where[1] < where[2]
    assert where[3] == "Add the MLP's output to the residual stream"
