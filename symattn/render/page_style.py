"""The web page's style sheet and script (see :mod:`.html`), kept apart from the page's structure.

Every rule is scoped to ``.symattn-page``, so the same page can sit in a notebook's output
beside other content. The script only enhances: without it the page is complete. It highlights
the entries that make the entry a reader points at (mouse, or the keyboard: Tab into a matrix,
arrow keys inside it) and shows its explanation, and switches exact values to decimals.
"""

from .shades import HATCH, TEXT, grey_percent, rgb

_GREYS = "\n".join(f".symattn-page td.g{k}{{background:{rgb(k / 100)}}}" for k in range(grey_percent(1), 101))
# Masked entries: hatched, the stripes fixed to the page so that they run on unbroken across a row of
# masked cells (and the gaps standing for masked entries only), the digits in the page's own colour.
_MASKED = (f".symattn-page td.masked{{background:repeating-linear-gradient(45deg,{HATCH[0]} 0 4px,{HATCH[1]} 4px 6px) "
           f"fixed;color:{TEXT}}}")

PAGE_STYLE = """
.symattn-page{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
line-height:1.5;color:#1a1a1a;background:#fff;max-width:72rem;margin:0 auto;padding:1rem 1.5rem 3rem}
.symattn-page math{font-family:"Latin Modern Math","STIX Two Math","Cambria Math",math;font-size:1.1em}
.symattn-page h1{font-size:1.8rem;margin:.5rem 0 1rem}
.symattn-page h2{font-size:1.35rem;margin:2rem 0 .5rem;border-bottom:1px solid #ccc;padding-bottom:.2rem}
.symattn-page h3{font-size:1.1rem;margin:1.2rem 0 .3rem}
.symattn-page details.same>summary{cursor:pointer;color:#333;margin:.3rem 0}
.symattn-page .toc h2{font-size:1.1rem;border:0;margin:0 0 .3rem}
.symattn-page .toc{background:#f5f5f5;border:1px solid #ddd;border-radius:4px;padding:.6rem 1rem;margin-bottom:1rem}
.symattn-page .toc ol{margin:0;padding-left:1.5rem;columns:2 22rem}
.symattn-page .display{display:flex;flex-wrap:wrap;align-items:center;gap:.4rem 1.2rem;margin:.6rem 0;
overflow-x:auto;overflow-y:hidden;max-width:100%;padding:.2rem 0}
.symattn-page .display>.lhs{flex:0 0 auto}
.symattn-page table.matrix{border-collapse:collapse;margin:.2rem 0}
.symattn-page table.matrix td,.symattn-page table.matrix th{padding:.25rem .55rem;text-align:center;
vertical-align:middle;white-space:nowrap}
.symattn-page table.matrix thead th{border-bottom:1px solid #333;font-weight:600}
.symattn-page table.matrix tbody th{border-right:1px solid #333;text-align:right;font-weight:600}
.symattn-page table.bracketed{border-left:2px solid #333;border-right:2px solid #333;
background:linear-gradient(#333,#333) left top/.45rem 2px no-repeat,linear-gradient(#333,#333) left bottom/.45rem 2px no-repeat,
linear-gradient(#333,#333) right top/.45rem 2px no-repeat,linear-gradient(#333,#333) right bottom/.45rem 2px no-repeat}
.symattn-page td.entry math{math-style:normal}
.symattn-page td.gap,.symattn-page th.gap{color:#555}
.symattn-page td.answer .box{display:inline-block;min-width:3.5em;min-height:1.6em;border:1px solid #666}
.symattn-page td.entry[tabindex]{cursor:pointer}
.symattn-page td.entry:focus{outline:3px solid #1a56c4;outline-offset:-3px}
.symattn-page td.active{outline:3px solid #1a56c4;outline-offset:-3px}
.symattn-page td.hl{box-shadow:inset 0 0 0 3px #c05a00;font-weight:700;text-decoration:underline}
.symattn-page td.hl::after{content:"\\25C6";font-size:.6em;vertical-align:super;color:#c05a00}
.symattn-page .dec{display:none}
.symattn-page.decimal .x{display:none}
.symattn-page.decimal .dec{display:inline}
.symattn-page .explain:empty{display:none}
.symattn-page .explain{border-left:4px solid #c05a00;background:#fff8f0;padding:.4rem .8rem;margin:.3rem 0 .8rem;
overflow-x:auto}
.symattn-page table.normalisers{border-collapse:collapse}
.symattn-page table.normalisers caption{text-align:left;font-size:.9em;color:#444}
.symattn-page table.normalisers td,.symattn-page table.normalisers th{padding:.2rem .8rem;text-align:left}
.symattn-page figure.heatmap{margin:.6rem 0;overflow-x:auto}
.symattn-page figure.heatmap text{font:12px system-ui,sans-serif;fill:#1a1a1a}
.symattn-page figure.heatmap text.row{text-anchor:end}
.symattn-page figure.heatmap text.up{text-anchor:middle}
.symattn-page figure.heatmap text.v{text-anchor:middle;font-size:11px}
.symattn-page figcaption{font-size:.9em;color:#444}
.symattn-page figure.stream{margin:1rem 0 1.5rem}
.symattn-page figure.stream svg{display:block;max-width:100%;height:auto}
.symattn-page figure.stream figcaption{margin-top:.5rem;max-width:40rem}
.symattn-page figure.stream text{font:12.5px system-ui,sans-serif;fill:#1a1a1a}
.symattn-page figure.stream text.name{font-size:14px;font-weight:700}
.symattn-page figure.stream text.steps{text-anchor:end;fill:#4d4d4d}
.symattn-page figure.stream text.detail{fill:#4d4d4d}
.symattn-page figure.stream text.label{font-weight:700;font-size:13px;letter-spacing:.02em}
.symattn-page figure.stream text.sum{font-size:14px;font-weight:700}
.symattn-page figure.stream .stream-line{stroke:#1a56c4;stroke-width:5}
.symattn-page figure.stream .edge{stroke:#333;stroke-width:1.5;fill:none}
.symattn-page figure.stream marker path{fill:#333}
.symattn-page figure.stream .stream-end{fill:#1a56c4}
.symattn-page figure.stream rect{fill:#fff;stroke:#333;stroke-width:1.2}
.symattn-page figure.stream [data-sub-block="attention"] .side rect{fill:#eef3fc}
.symattn-page figure.stream [data-sub-block="mlp"] .side rect{fill:#f6f0fb}
.symattn-page figure.stream [data-sub-block="next-token"] .side rect{fill:#eef8ef}
.symattn-page figure.stream .on-stream rect,.symattn-page figure.stream .start rect{fill:#f5f5f5;stroke-width:2}
.symattn-page figure.stream circle{fill:#fff;stroke:#1a1a1a;stroke-width:2}
.symattn-page figure.stream .cross{stroke:#1a1a1a;stroke-width:2}
.symattn-page figure.stream a:hover rect,.symattn-page figure.stream a:focus rect,
.symattn-page figure.stream a:hover circle,.symattn-page figure.stream a:focus circle{stroke:#c05a00;stroke-width:3}
.symattn-page figure.stream a:focus{outline:none}
.symattn-page figure.stream a:hover text.name,.symattn-page figure.stream a:focus text.name,
.symattn-page figure.stream a:hover text.sum,.symattn-page figure.stream a:focus text.sum{text-decoration:underline}
.symattn-page h3[id]{scroll-margin-top:1rem}
.symattn-page .controls{margin:.5rem 0}
.symattn-page button{font:inherit;padding:.3rem .8rem;border:1px solid #333;border-radius:4px;background:#f5f5f5;
cursor:pointer}
.symattn-page button[aria-pressed="true"]{background:#1a1a1a;color:#fff}
@media print{.symattn-page .toc,.symattn-page .controls,.symattn-page .explain{display:none}}
""" + _GREYS + "\n" + _MASKED + "\n"

PAGE_SCRIPT = """
(function () {
  "use strict";
  var script = document.currentScript;
  var root = (script && script.closest(".symattn-page")) || document.querySelector(".symattn-page");
  if (!root || root.dataset.enhanced) { return; }
  root.dataset.enhanced = "1";
  var toggle = root.querySelector("button.toggle-decimal");
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      var on = root.classList.toggle("decimal");
      toggle.setAttribute("aria-pressed", on ? "true" : "false");
      toggle.textContent = on ? "Show exact values" : "Show decimals";
    });
  }
  function tables(id) {
    return Array.prototype.filter.call(root.querySelectorAll("table.matrix"), function (t) {
      return t.getAttribute("data-stage") === id;
    });
  }
  function clear() {
    Array.prototype.forEach.call(root.querySelectorAll(".hl, .active"), function (e) {
      e.classList.remove("hl", "active");
    });
    Array.prototype.forEach.call(root.querySelectorAll(".explain"), function (e) {
      e.textContent = "";
    });
  }
  function matches(td, how, r, c) {
    var tr = td.getAttribute("data-row"), tc = td.getAttribute("data-col");
    if (how === "row") { return tr === r; }
    if (how === "col") { return tc === c; }
    if (how === "row_j") { return tr === c; }
    if (how === "col_i") { return tc === r; }
    if (how === "entry") { return tr === r && tc === c; }
    if (how === "T") { return tr === c && tc === r; }
    if (how === "last") { return tc === c && !td.parentElement.nextElementSibling; }
    return false;
  }
  function point(td) {
    var table = td.closest("table.matrix");
    var traces = table && table.getAttribute("data-traces");
    if (!traces) { return; }
    clear();
    td.classList.add("active");
    var r = td.getAttribute("data-row"), c = td.getAttribute("data-col");
    traces.split(" ").forEach(function (trace) {
      var at = trace.lastIndexOf(":");
      var id = trace.slice(0, at), how = trace.slice(at + 1);
      tables(id).forEach(function (t) {
        Array.prototype.forEach.call(t.querySelectorAll("td.entry"), function (cell) {
          if (matches(cell, how, r, c)) { cell.classList.add("hl"); }
        });
      });
    });
    var panel = table.nextElementSibling;
    if (panel && panel.classList.contains("explain")) {
      var node = panel.nextElementSibling;
      while (node && node.tagName === "TEMPLATE") {
        if (node.getAttribute("data-row") === r && node.getAttribute("data-col") === c) {
          panel.appendChild(node.content.cloneNode(true));
          break;
        }
        node = node.nextElementSibling;
      }
    }
  }
  root.addEventListener("mouseover", function (e) {
    var td = e.target.closest && e.target.closest("td.entry[data-row]");
    if (td && root.contains(td)) { point(td); }
  });
  root.addEventListener("focusin", function (e) {
    var td = e.target.closest && e.target.closest("td.entry[data-row]");
    if (td && root.contains(td)) { point(td); }
  });
  root.addEventListener("keydown", function (e) {
    var td = e.target.closest && e.target.closest("td.entry[tabindex]");
    if (!td) { return; }
    var step = {ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0]}[e.key];
    if (e.key === "Escape") { clear(); return; }
    if (!step) { return; }
    var tr = td.parentElement, table = td.closest("table");
    var rows = Array.prototype.slice.call(table.querySelectorAll("tbody tr"));
    var y = rows.indexOf(tr) + step[0];
    var x = Array.prototype.indexOf.call(tr.children, td) + step[1];
    while (y >= 0 && y < rows.length) {
      var cell = rows[y].children[x];
      if (cell && cell.matches("td.entry[tabindex]")) {
        td.tabIndex = -1; cell.tabIndex = 0; cell.focus(); e.preventDefault(); return;
      }
      if (!cell || step[0] === 0) {
        x += step[1];
        if (!cell || x < 0 || x >= rows[y].children.length) { return; }
      } else { y += step[0]; }
    }
  });
})();
"""
