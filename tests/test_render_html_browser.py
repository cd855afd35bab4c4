"""The HTML worked solution in a real browser: headless Chromium driven by Selenium.

Every worked example is rendered (with the cross-check) and opened in Chromium at 1280 px. The
page must load without a console error, a Content-Security-Policy violation or any network
request; its MathML must render (no ``<merror>``, no visible ``<math>`` of zero width); pages of
up to 8 tokens must not scroll sideways; pointing at any entry of a traced table must highlight
exactly the input entries its ``data-traces`` names. The four-token example is driven by mouse
and keyboard as a reader would (S[2,1] lights row 2 of Q and column 1 of Kᵀ, and so on), and its
exact/decimal toggle is switched. A second browser with JavaScript off checks that the static
page still holds every stage. A problem with hostile tokens and title must leave no active
content. A full-page screenshot of each page is saved in ``$SYMATTN_ARTIFACTS`` (default
``tests/artifacts/``, not committed) with ``browser-report.txt``, the figures and anything that
needs a look (a display that scrolls sideways, the 64-token page's size and load time).

Needs the ``selenium`` package, Chromium and its driver (Debian: ``apt-get install chromium
chromium-driver``; the README's test command does it). Without them the browser tests skip; the check that the
registry's traces agree with the arithmetic runs anyway.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import time
from pathlib import Path

import numpy
import pytest
import yaml

import symattn
from symattn import stages as registry
from symattn.render.page_style import PAGE_SCRIPT
from symattn.render.html import render_html

try:
    from selenium import webdriver
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
except ImportError:  # pragma: no cover - the browser tests skip
    webdriver = None

ROOT = Path(__file__).resolve().parent.parent
# One worker of pytest-xdist runs this file: one browser, and one browser-report.txt in ARTIFACTS.
pytestmark = pytest.mark.xdist_group("browser")
EXAMPLE_FILES = sorted((ROOT / "worked_examples").glob("**/*.yaml"))
EXAMPLES = {path.stem: path for path in EXAMPLE_FILES}
ARTIFACTS = Path(os.environ.get("SYMATTN_ARTIFACTS") or ROOT / "tests" / "artifacts")
WIDTH = 1280
SMALL = 8  # up to this many tokens a page must not scroll sideways
LARGE = "causal_64_tokens"

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
CHROMEDRIVER = shutil.which("chromedriver")

# Which input entries make entry (i, j) of a stage, for each ``how`` of ``data-traces``
# (symattn.stages.traces.TRACES): (row, col) of an input entry of ``n`` rows -> whether it is one of them.
RULES = {
    "row": lambda i, j, r, c, n: r == i,
    "col": lambda i, j, r, c, n: c == j,
    "row_j": lambda i, j, r, c, n: r == j,
    "col_i": lambda i, j, r, c, n: c == i,
    "entry": lambda i, j, r, c, n: (r, c) == (i, j),
    "T": lambda i, j, r, c, n: (r, c) == (j, i),
    "last": lambda i, j, r, c, n: (r, c) == (n - 1, j),
}

# Recorded while pointing at entries, for the report: [(page, message)].
REPORT: list[tuple[str, str]] = []


@functools.lru_cache(maxsize=None)
def derivation(name: str):
    return symattn.derive(symattn.load_problem(EXAMPLES[name]))


def tokens(d) -> int:
    """The most tokens on either side of the scores (queries or keys)."""
    return max(max(d.step(i).shape) for i in d.ids if i.split(".")[-1] in ("S", "S_lin"))  # linear attention: S_lin


# -- the registry's traces against the arithmetic (no browser) ---------------------------------

def _vector(values: numpy.ndarray, how: str, i: int, j: int) -> numpy.ndarray:
    if how == "row":
        return values[i, :]
    if how == "col":
        return values[:, j]
    return values[j, :] if how == "row_j" else values[:, i]


@pytest.mark.parametrize("name", [n for n in EXAMPLES if n != LARGE])
def test_traces_are_the_inputs_of_each_entry(name):
    """Every stage traced to two vectors is their dot product, entry by entry; Kᵀ is K transposed.

    This is what the page highlights: if the registry named the wrong row or column, the page
    would point a reader at numbers that did not make the entry.
    """
    d = derivation(name)
    if not d.can_evaluate:
        pytest.skip("symbols without values")
    checked = 0
    for step in d:
        c = registry.Context(d.problem, step.head)
        traces = registry.traces(step.kind_of, c)
        value = d.approx(step.id)
        if [how for _, how in traces] == ["T"]:
            assert numpy.array_equal(value, d.approx(traces[0][0]).T), step.id
            checked += 1
        if step.kind_of.key == registry.DS_MASKED:  # A ∘ (dA − rowsum(A ∘ dA)): rows i of A and dA
            (a, _), (b, _) = traces
            a, b = numpy.nan_to_num(d.approx(a)), numpy.nan_to_num(d.approx(b))
            assert numpy.allclose(a * (b - (a * b).sum(axis=1, keepdims=True)), value), step.id
            checked += 1
        elif step.kind_of.key == registry.L_TILED:
            continue  # the running sum: a recurrence over row i of Ŝ and its running maxima, not a product
        elif step.kind_of.key == registry.REC_NUM:
            continue  # φ(q_t) against the d_k × d_v state read row by row: a contraction, not one dot product
        elif step.kind_of.key == registry.S_LIN:  # φ(q_i)·φ(k_j) where the mask allows, else 0
            (a, _), (b, _) = traces
            made = numpy.where(numpy.array(d.problem.mask.allowed), d.approx(a) @ d.approx(b).T, 0.0)
            assert numpy.allclose(made, value), step.id
            checked += 1
        elif step.kind_of.key in (registry.X_HAT, registry.R_HAT, registry.X_EMB_HAT, registry.H_HAT, registry.Y_HAT,
                                  registry.Y_FINAL_HAT, registry.Q_HAT, registry.K_HAT):  # row i over its root: not a product
            (inp, how), *stats = traces
            assert how == "row" and all(h == "row" for _, h in stats), step.id
            checked += 1
        elif traces and len(traces) % 2 == 0 and all(how in ("row", "col", "row_j", "col_i") for _, how in traces):
            # a product, or a K/V group's sum of products (one pair per head that reads it)
            rows, cols = value.shape
            made = numpy.zeros(value.shape)
            for (a, how_a), (b, how_b) in zip(traces[::2], traces[1::2]):
                left, right = d.approx(a), d.approx(b)
                made += numpy.array([[_vector(left, how_a, i, j) @ _vector(right, how_b, i, j) for j in range(cols)]
                                     for i in range(rows)])
            assert numpy.allclose(made, value, rtol=1e-9, atol=1e-12), (
                f"{step.id} is not the sum of the products of {traces}")
            checked += 1
    assert checked >= 3


# -- the browsers ------------------------------------------------------------------------------

def _driver(javascript: bool):
    if webdriver is None:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("Chromium or chromedriver is not installed (Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={WIDTH},900", "--force-device-scale-factor=1", "--lang=en-US",
                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    options.set_capability("unhandledPromptBehavior", "ignore")
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    # Nothing may leave the machine: block every remote scheme (the performance log still
    # records an attempt, which fails the test).
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]})
    if javascript:
        # Injected by DevTools before the page's own script (and outside its CSP): record CSP
        # violations and any alert() a hostile token might run.
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
            window.__csp = [];
            document.addEventListener("securitypolicyviolation", function (e) {
              window.__csp.push(e.violatedDirective + " " + e.blockedURI);
            });
            window.alert = window.confirm = window.prompt = function () { window.__pwned = true; };
        """})
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = _driver(javascript=True)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def static_browser():
    driver = _driver(javascript=False)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Each worked example's page (cross-checked, as ``symattn derive -o x.html`` writes it)."""
    folder = tmp_path_factory.mktemp("pages")
    out = {}
    for name in EXAMPLES:
        d = derivation(name)
        check = symattn.crosscheck(d)
        assert check.passed is not False
        path = folder / f"{name}.html"
        path.write_text(render_html(d, check=check), "utf-8")
        out[name] = path
    return out


@pytest.fixture(scope="module")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield ARTIFACTS
    text = "".join(f"{page}: {message}\n" for page, message in REPORT)
    (ARTIFACTS / "browser-report.txt").write_text(text, "utf-8")
    print("\n" + text)


def load(driver, path: Path) -> None:
    """Open ``path`` with fresh logs."""
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(path.as_uri())


def requests(driver, page: str) -> list[str]:
    """What the page asked the network for, from the performance log (the page itself excepted)."""
    asked = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
            url = message["params"].get("request", {}).get("url") or message["params"].get("url", "")
            if url != page and not url.startswith(("data:", "about:")):
                asked.append(url)
    return asked


def screenshot(driver, target: Path) -> None:
    """The whole page (beyond the window) as a PNG."""
    width, height = driver.execute_script(
        "var e = document.documentElement; return [e.scrollWidth, Math.ceil(e.scrollHeight)];")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}})
    target.write_bytes(base64.b64decode(shot["data"]))


# What the page is made of once loaded: MathML, sizes, the enhancement, traced tables.
SURVEY = """
var root = document.querySelector(".symattn-page");
var maths = Array.prototype.slice.call(document.querySelectorAll("math"));
var rendered = maths.filter(function (m) { return m.getClientRects().length > 0; });
function where(e) {
  var t = e.closest("table.matrix"), s = e.closest("section");
  return (s ? s.id : "") + (t ? " " + t.getAttribute("data-stage") + "/" + t.getAttribute("data-form") : "");
}
var tables = Array.prototype.slice.call(document.querySelectorAll("table.matrix[data-traces]"));
return {
  merror: document.querySelectorAll("merror").length,
  maths: maths.length,
  zero: rendered.filter(function (m) { return m.getBoundingClientRect().width < 1; })
                .map(function (m) { return where(m) + ": " + m.outerHTML.slice(0, 200); }),
  scrollWidth: document.documentElement.scrollWidth,
  clientWidth: document.documentElement.clientWidth,
  sideways: Array.prototype.slice.call(document.querySelectorAll(".display, .explain, figure.heatmap"))
    .filter(function (e) { return e.scrollWidth > e.clientWidth + 1; })
    .map(function (e) { return where(e.querySelector("table.matrix") || e) + " " + e.className + " needs "
                          + e.scrollWidth + " px of " + e.clientWidth; }),
  enhanced: root.dataset.enhanced || null,
  csp: window.__csp || [],
  pwned: !!window.__pwned,
  roving: tables.filter(function (t) { return t.querySelectorAll('td[tabindex="0"]').length !== 1; })
                .map(function (t) { return t.getAttribute("data-stage") + "/" + t.getAttribute("data-form"); }),
  heatmaps: document.querySelectorAll("figure.heatmap > svg").length,
  weights: Array.prototype.filter.call(document.querySelectorAll("table.matrix[data-form=decimal]"), function (t) {
    return /(^|\\.)(A|A_2|a_t|cap_row|temp_row)$/.test(t.getAttribute("data-stage")); }).length  // the softmax steps: A, a differential problem's second map A_2, a decoded row's a_t, one row without and with a cap or temperature
};
"""

# Point at the first and the last shown entry of every traced table (a mouseover, as the
# mouse gives) and record what lights up.
POINT_ALL = """
var out = [];
var root = document.querySelector(".symattn-page");
function cell(td) {
  var t = td.closest("table.matrix");
  return [t.getAttribute("data-stage"), t.getAttribute("data-form"), +td.getAttribute("data-row"), +td.getAttribute("data-col")];
}
Array.prototype.forEach.call(document.querySelectorAll("table.matrix[data-traces]"), function (table) {
  var entries = table.querySelectorAll("td.entry");
  [entries[0], entries[entries.length - 1]].forEach(function (td) {
    td.dispatchEvent(new MouseEvent("mouseover", {bubbles: true}));
    var traces = table.getAttribute("data-traces").split(" ");
    var inputs = {};
    traces.forEach(function (trace) {
      var id = trace.slice(0, trace.lastIndexOf(":"));
      inputs[id] = Array.prototype.filter.call(document.querySelectorAll("table.matrix"), function (t) {
        return t.getAttribute("data-stage") === id;
      }).reduce(function (all, t) {
        return all.concat(Array.prototype.map.call(t.querySelectorAll("td.entry"), cell));
      }, []);
    });
    var panel = table.nextElementSibling;
    var template = null;
    for (var node = panel && panel.nextElementSibling; node && node.tagName === "TEMPLATE"; node = node.nextElementSibling) {
      if (node.getAttribute("data-row") === td.getAttribute("data-row") &&
          node.getAttribute("data-col") === td.getAttribute("data-col")) { template = node; }
    }
    out.push({
      at: cell(td), traces: traces, inputs: inputs,
      active: Array.prototype.map.call(root.querySelectorAll(".active"), cell),
      hl: Array.prototype.map.call(root.querySelectorAll(".hl"), cell),
      template: !!template,
      explained: !!(panel && panel.classList.contains("explain") && panel.querySelector("math")),
    });
  });
});
return out;
"""


@pytest.fixture(scope="module")
def visits(browser, pages, artifacts):
    """Each page opened once at 1280 px: console, requests, the survey, a screenshot, pointing."""
    done = {}

    def visit(name: str) -> dict:
        if name not in done:
            path = pages[name]
            browser.set_window_size(WIDTH, 900)
            load(browser, path)
            timing = browser.execute_script("""
                var n = performance.getEntriesByType("navigation")[0];
                var p = performance.getEntriesByName("first-contentful-paint")[0];
                return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd, paint: p ? p.startTime : null};""")
            console = browser.get_log("browser")
            asked = requests(browser, path.as_uri())
            survey = browser.execute_script(SURVEY)
            screenshot(browser, artifacts / f"{name}.png")
            pointed = browser.execute_script(POINT_ALL)
            done[name] = dict(timing=timing, console=console, requests=asked, survey=survey, pointed=pointed)
            for line in survey["sideways"]:
                REPORT.append((name, "scrolls sideways: " + line))
        return done[name]

    return visit


# -- every worked example ----------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_loads_without_errors_or_requests(visits, name):
    v = visits(name)
    severe = [e["message"] for e in v["console"] if e["level"] == "SEVERE"]
    assert severe == [], severe
    assert v["survey"]["csp"] == [], "Content-Security-Policy violations"
    assert v["requests"] == [], "the page made network requests"
    assert v["survey"]["enhanced"] == "1", "the page's script did not run"
    assert not v["survey"]["pwned"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_mathml_renders(visits, name):
    survey = visits(name)["survey"]
    assert survey["maths"] > 0
    assert survey["merror"] == 0
    assert survey["zero"] == [], "math that Chromium draws with no width"
    assert survey["heatmaps"] == survey["weights"], "a heat map after each table of weights in decimals"


@pytest.mark.parametrize("name", EXAMPLES)
def test_no_horizontal_scroll(visits, name):
    survey = visits(name)["survey"]
    if tokens(derivation(name)) > SMALL:
        REPORT.append((name, f"document {survey['scrollWidth']} px wide in {survey['clientWidth']} (not asserted)"))
        return
    assert survey["scrollWidth"] <= survey["clientWidth"], (
        f"the page is {survey['scrollWidth']} px wide at a {survey['clientWidth']} px window")


@pytest.mark.parametrize("name", EXAMPLES)
def test_pointing_highlights_exactly_the_traced_inputs(visits, name):
    """For every traced table, its first and last shown entry light exactly what data-traces names."""
    v = visits(name)
    assert v["survey"]["roving"] == [], "traced tables without exactly one cell in the tab order"
    assert v["pointed"], "no traced table"
    for p in v["pointed"]:
        stage, form, i, j = p["at"]
        assert p["active"] == [p["at"]]
        expected = set()
        for trace in p["traces"]:
            id, how = trace.rsplit(":", 1)
            assert how in RULES, trace
            assert p["inputs"][id], f"{stage} is traced to {id}, which has no table on the page"
            n = derivation(name).step(id).shape[0]
            lit = {(id, f, r, c) for f, r, c in ((x[1], x[2], x[3]) for x in p["inputs"][id])
                   if RULES[how](i, j, r, c, n)}
            assert lit, f"{stage}[{i},{j}]: the {how} of {id} it is made from is not shown"
            expected |= lit
        assert {tuple(x) for x in p["hl"]} == expected, f"{stage}/{form}[{i},{j}]"
        assert p["explained"] == p["template"], f"{stage}/{form}[{i},{j}]: explanation panel"


@pytest.mark.parametrize("name", EXAMPLES)
def test_static_page_holds_every_stage(static_browser, pages, name):
    """With JavaScript off the page is complete: a table of every stage, exact values shown."""
    d = derivation(name)
    load(static_browser, pages[name])
    found = static_browser.execute_script("""
        var root = document.querySelector(".symattn-page");
        function shown(sel) { return Array.prototype.filter.call(root.querySelectorAll(sel), function (e) {
          return getComputedStyle(e).display !== "none"; }).length; }
        return {
          stages: Array.prototype.map.call(root.querySelectorAll("table.matrix"), function (t) {
            return t.getAttribute("data-stage"); }),
          enhanced: root.dataset.enhanced || null,
          toggle: shown("button.toggle-decimal"), exact: root.querySelectorAll(".x").length,
          exactShown: shown(".x"), decimalShown: shown(".dec"), lit: root.querySelectorAll(".hl, .active").length,
          sections: root.querySelectorAll("main section[id] > h2").length,
          toc: Array.prototype.map.call(root.querySelectorAll("nav.toc a"), function (a) { return a.hash.slice(1); }),
          ids: Array.prototype.map.call(root.querySelectorAll("main section[id]"), function (s) { return s.id; }),
          heatmaps: root.querySelectorAll("figure.heatmap svg").length
        };""")
    assert found["enhanced"] is None, "JavaScript ran"
    missing = [id for id in d.ids if id not in found["stages"]]
    assert missing == [], f"stages without a table: {missing}"
    assert found["toc"] == found["ids"] and found["sections"] == len(found["ids"]) > 0
    assert found["toggle"] == 0, "the toggle shows though it cannot work"
    assert found["exactShown"] == found["exact"] and found["decimalShown"] == 0
    assert found["lit"] == 0
    assert not [e for e in static_browser.get_log("browser") if e["level"] == "SEVERE"]


def test_static_page_from_to_holds_its_stages(static_browser, tmp_path):
    """``--from S --to A``: the stages from S to A, and the inputs S is made from as given."""
    d = derivation("two_heads")
    path = tmp_path / "part.html"
    path.write_text(render_html(d, first="S", last="A"), "utf-8")
    load(static_browser, path)
    stages = set(static_browser.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('table.matrix'), "
        "function (t) { return t.getAttribute('data-stage'); });"))
    order = {k.key: k.order for k in registry.KINDS}
    wanted = {id for id in d.ids if order[registry.S] <= order[d.step(id).kind_of.key] <= order[registry.A]}
    assert wanted and wanted <= stages
    assert {"head1.Q", "head1.K_T", "head2.Q", "head2.K_T"} <= stages  # given
    assert not {"O", "head1.O", "X"} & stages


# -- the four-token example, by mouse and keyboard ---------------------------------------------

LIT = """
return Array.prototype.map.call(document.querySelectorAll(arguments[0]), function (td) {
  var t = td.closest("table.matrix");
  return [t.getAttribute("data-stage"), t.getAttribute("data-form"), +td.getAttribute("data-row"), +td.getAttribute("data-col")];
});"""


def lit(driver, selector: str = ".symattn-page .hl") -> set:
    return {tuple(x) for x in driver.execute_script(LIT, selector)}


def forms(driver, stage: str) -> list[str]:
    return driver.execute_script(
        "var id = arguments[0]; return Array.prototype.filter.call(document.querySelectorAll('table.matrix'), function (t) {"
        " return t.getAttribute('data-stage') === id; }).map(function (t) { return t.getAttribute('data-form'); });",
        stage)


def row_of(driver, d, stage: str, i: int) -> set:
    return {(stage, f, i, c) for f in forms(driver, stage) for c in range(d.step(stage).shape[1])}


def col_of(driver, d, stage: str, j: int) -> set:
    return {(stage, f, r, j) for f in forms(driver, stage) for r in range(d.step(stage).shape[0])}


def entry(driver, stage: str, i: int, j: int, form: str = "exact"):
    return driver.find_element(
        By.CSS_SELECTOR, f'table.matrix[data-stage="{stage}"][data-form="{form}"] td.entry[data-row="{i}"][data-col="{j}"]')


def panel_text(driver, stage: str, form: str = "exact") -> tuple[int, str]:
    return tuple(driver.execute_script(
        "var p = document.querySelector('table.matrix[data-stage=\"' + arguments[0] + '\"][data-form=\"' + arguments[1] + '\"]')"
        ".nextElementSibling; return [p.querySelectorAll('math').length, p.textContent];", stage, form))


@pytest.fixture
def four(browser, pages):
    browser.set_window_size(WIDTH, 900)
    load(browser, pages["causal_4_tokens"])
    return browser, derivation("causal_4_tokens")


def test_hover_score_lights_its_query_row_and_key_column(four, artifacts):
    driver, d = four
    ActionChains(driver).move_to_element(entry(driver, "S", 1, 0)).perform()  # S[2,1]
    assert lit(driver, ".symattn-page .active") == {("S", "exact", 1, 0)}
    expected = row_of(driver, d, "Q", 1) | col_of(driver, d, "K_T", 0)
    assert lit(driver) == expected
    assert {s for s, *_ in expected} == {"Q", "K_T"} and len(expected) == 8
    maths, text = panel_text(driver, "S")
    assert maths > 0 and str(d.step("S").exact[1, 0]) in text
    driver.save_screenshot(str(artifacts / "causal_4_tokens-hover-S.png"))


def test_hover_weight_lights_its_row_of_masked_scores(four):
    driver, d = four
    ActionChains(driver).move_to_element(entry(driver, "A", 2, 1)).perform()  # A[3,2]
    assert lit(driver) == row_of(driver, d, "S_masked", 2)
    maths, text = panel_text(driver, "A")
    assert maths >= 3 and "Z" in text and "m" in text


def test_hover_output_lights_its_weights_row_and_value_column(four):
    driver, d = four
    ActionChains(driver).move_to_element(entry(driver, "O", 3, 0)).perform()  # O[4,1]
    expected = row_of(driver, d, "A", 3) | col_of(driver, d, "V", 0)
    assert {f for s, f, *_ in expected if s == "A"} == {"exact", "decimal"}
    assert lit(driver) == expected
    maths, text = panel_text(driver, "O")
    assert maths > 0 and "A" in text and "V" in text and "≈" in text


def test_keyboard_focus_lights_the_same(four):
    driver, d = four
    body = driver.find_element(By.TAG_NAME, "body")
    body.click()
    for _ in range(300):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        stage = driver.execute_script(
            "var t = document.activeElement.closest('table.matrix'); return t && t.getAttribute('data-stage');")
        if stage == "S":
            break
    else:
        pytest.fail("Tab never reached S")
    assert lit(driver, ".symattn-page .active") == {("S", "exact", 0, 0)}
    assert lit(driver) == row_of(driver, d, "Q", 0) | col_of(driver, d, "K_T", 0)
    ActionChains(driver).send_keys(Keys.ARROW_RIGHT).perform()
    assert lit(driver, ".symattn-page .active") == {("S", "exact", 0, 1)}
    assert lit(driver) == row_of(driver, d, "Q", 0) | col_of(driver, d, "K_T", 1)
    ActionChains(driver).send_keys(Keys.ARROW_DOWN).perform()
    assert lit(driver, ".symattn-page .active") == {("S", "exact", 1, 1)}
    assert lit(driver) == row_of(driver, d, "Q", 1) | col_of(driver, d, "K_T", 1)
    assert lit(driver, 'table.matrix[data-stage="S"] td[tabindex="0"]') == {("S", "exact", 1, 1)}
    assert panel_text(driver, "S")[0] > 0
    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    assert lit(driver) == set()


DISPLAYS = """
var root = document.querySelector(".symattn-page");
function shown(sel) { return Array.prototype.filter.call(root.querySelectorAll(sel), function (e) {
  return getComputedStyle(e).display !== "none" && e.getBoundingClientRect().width > 0; }).length; }
return [root.querySelectorAll(".x").length, shown(".x"), shown(".dec"), root.classList.contains("decimal")];"""


def test_toggle_switches_exact_and_decimal(four):
    driver, _ = four
    button = driver.find_element(By.CSS_SELECTOR, "button.toggle-decimal")
    assert button.is_displayed() and button.get_attribute("aria-pressed") == "false"
    n, exact, decimal, on = driver.execute_script(DISPLAYS)
    assert n > 0 and (exact, decimal, on) == (n, 0, False)
    button.click()
    assert button.get_attribute("aria-pressed") == "true"
    assert tuple(driver.execute_script(DISPLAYS)) == (n, 0, n, True)
    button.click()
    assert button.get_attribute("aria-pressed") == "false"
    assert tuple(driver.execute_script(DISPLAYS)) == (n, n, 0, False)


def test_weights_are_shaded_hatched_and_mapped(four):
    driver, d = four
    cells = driver.execute_script("""
        return Array.prototype.map.call(document.querySelectorAll('table.matrix[data-stage="A"][data-form="decimal"] td.entry'),
          function (td) { return [+td.dataset.row, +td.dataset.col, td.className,
                                  getComputedStyle(td).backgroundImage !== "none"]; });""")
    assert len(cells) == 16
    for i, j, classes, image in cells:
        if j > i:
            assert "masked" in classes.split() and image, (i, j)
        else:
            assert re.search(r"\bg(5\d|[6-9]\d|100)\b", classes), (i, j, classes)
    assert driver.execute_script(
        "var t = document.querySelector('table.matrix[data-stage=\"A\"][data-form=\"decimal\"]');"
        "var f = t.parentElement.nextElementSibling; return !!(f && f.matches('figure.heatmap') && f.querySelector('svg'));")


# -- big and hostile pages ---------------------------------------------------------------------

def test_large_page_is_small_and_quick(browser, pages, visits):
    path = pages[LARGE]
    size = path.stat().st_size
    first = visits(LARGE)["timing"]
    load(browser, path)
    again = browser.execute_script("""
        var n = performance.getEntriesByType("navigation")[0];
        return {dcl: n.domContentLoadedEventEnd, load: n.loadEventEnd};""")
    message = (f"{size / 1e6:.2f} MB; first load: DOMContentLoaded {first['dcl']:.0f} ms, load {first['load']:.0f} ms, "
               f"first paint {first['paint'] or 0:.0f} ms; again: DOMContentLoaded {again['dcl']:.0f} ms, "
               f"load {again['load']:.0f} ms")
    REPORT.append((LARGE, message))
    print(message)
    assert size < 4e6
    assert max(first["load"], again["load"]) < 5000


HOSTILE_TOKENS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "javascript:alert(1)"]
HOSTILE_TITLE = "</title><script>alert(2)</script>"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hostile page, and the same page without its CSP (so the escaping alone is tested)."""
    text = yaml.safe_dump({
        "title": HOSTILE_TITLE, "tokens": HOSTILE_TOKENS,
        "Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 0], [0, 1], [1, 1]], "V": [[1, 2], [3, 4], [5, 6]],
        "mask": "causal",
    })
    page = render_html(symattn.derive(symattn.load_problem(text)))
    assert 'http-equiv="Content-Security-Policy"' in page
    bare = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    assert bare != page
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "hostile.html").write_text(page, "utf-8")
    (folder / "hostile-no-csp.html").write_text(bare, "utf-8")
    return folder


ACTIVE = """
var all = Array.prototype.slice.call(document.querySelectorAll("*"));
return {
  scripts: Array.prototype.map.call(document.scripts, function (s) { return s.textContent; }),
  handlers: all.filter(function (e) { return Array.prototype.some.call(e.attributes, function (a) {
    return /^on/i.test(a.name); }); }).map(function (e) { return e.outerHTML.slice(0, 120); }),
  embedded: document.querySelectorAll("img, iframe, object, embed, link, base, form, meta[http-equiv=refresh]").length,
  links: Array.prototype.map.call(document.querySelectorAll("[href], [src], [action]"), function (e) {
    return e.getAttribute("href") || e.getAttribute("src") || e.getAttribute("action"); }),
  headers: Array.prototype.map.call(document.querySelectorAll("table.matrix th"), function (th) {
    return th.textContent; }),
  title: document.title, h1: document.querySelector("h1").textContent,
  csp: (document.querySelector('meta[http-equiv="Content-Security-Policy"]') || {}).content || null,
  pwned: !!window.__pwned, violations: window.__csp || []
};"""


@pytest.mark.parametrize("file", ["hostile.html", "hostile-no-csp.html"])
def test_hostile_tokens_stay_text(browser, hostile, artifacts, file):
    browser.set_window_size(WIDTH, 900)
    load(browser, hostile / file)
    time.sleep(0.2)  # an onerror would fire after the load
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text
    found = browser.execute_script(ACTIVE)
    assert not found["pwned"]
    assert found["scripts"] == [PAGE_SCRIPT]
    assert found["handlers"] == []
    assert found["embedded"] == 0
    assert all(link.startswith("#") for link in found["links"]), found["links"]
    for token in HOSTILE_TOKENS:
        assert found["headers"].count(token) >= 2, token  # a column and a row label, as text
    assert found["title"] == HOSTILE_TITLE and found["h1"] == HOSTILE_TITLE
    if file == "hostile.html":
        assert "default-src 'none'" in found["csp"]
        assert found["violations"] == []
    assert requests(browser, (hostile / file).as_uri()) == []
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    screenshot(browser, artifacts / file.replace(".html", ".png"))


def test_the_checks_see_what_they_look_for(browser, pages, tmp_path):
    """The checks are not vacuous. A remote image is a request in the performance log (DevTools
    blocks it, before the CSP would); a local one is a CSP violation and a console error, and
    an attempted request in the log (blocked by the CSP), with the CSP or without it."""
    page = pages["causal_4_tokens"].read_text("utf-8")

    def opened(name: str, text: str) -> str:
        (tmp_path / name).write_text(text, "utf-8")
        load(browser, tmp_path / name)
        return (tmp_path / name).as_uri()

    remote = page.replace("</main>", '<img src="https://example.invalid/x.png" alt=""></main>', 1)
    assert requests(browser, opened("remote.html", remote)) == ["https://example.invalid/x.png"]
    local = page.replace("</main>", '<img src="x.png" alt=""></main>', 1)
    url = opened("local.html", local)
    time.sleep(0.2)  # the violation event is queued
    assert browser.execute_script("return window.__csp;") == ["img-src file"]  # the scheme only
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert requests(browser, url) == [url.rsplit("/", 1)[0] + "/x.png"]
    bare = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", local)
    url = opened("local-no-csp.html", bare)
    assert requests(browser, url) == [url.rsplit("/", 1)[0] + "/x.png"]
