"""``symattn generate --lms prairielearn``: the question folder, and its server.py loaded as
PrairieLearn loads it (a module whose generate/parse/grade are called with PrairieLearn's ``data``
dict: apps/prairielearn/src/question-servers/freeform.ts builds it, python/zygote.py calls the
function). Submissions are shaped as pl-matrix-component-input leaves them after its parse():
each entry's text in ``raw_submitted_answers[name + str(i*cols + j + 1)]``, its float in
``submitted_answers``. Expected values come from NumPy on the variant's own matrices."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from fractions import Fraction
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MUSTACHE = ROOT / "tests" / "node" / "node_modules" / "mustache" / "mustache.js"
FILES = ("info.json", "question.html", "server.py", "variants.json")


def _run(symattn_cli, out: Path, *extra: str, seed: int = 3, count: int = 2):
    r = symattn_cli.entry("generate", "--count", str(count), "--out-dir", str(out), "--lms", "prairielearn",
                          "--seed", str(seed), *extra)
    assert r.code == 0, r.output
    return r


def _server(out: Path):
    spec = importlib.util.spec_from_file_location(f"pl_server_{out.name}", out / "server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _generated(server, seed: int) -> dict:
    data = {"params": {}, "correct_answers": {}, "variant_seed": seed, "options": {}, "preferences": {}}
    server.generate(data)
    return data


def _submission(generated: dict, matrices: list) -> dict:
    """``data`` for parse()/grade(): each asked stage's matrix typed entry by entry (text; None: left empty)."""
    raw, parsed = {}, {}
    for stage, m in zip(generated["params"]["stages"], matrices):
        for i, row in enumerate(m):
            for j, text in enumerate(row):
                name = stage["name"] + str(stage["cols"] * i + j + 1)
                raw[name] = "" if text is None else text
                parsed[name] = 0.0 if text is None else float(Fraction(text) if "/" in text else text)
    return {**json.loads(json.dumps(generated)), "submitted_answers": parsed, "raw_submitted_answers": raw,
            "format_errors": {}, "partial_scores": {}, "score": 0, "feedback": {}, "gradable": True}


def _problem(out: Path, variant: int) -> dict:
    return yaml.safe_load((out / f"variant-{variant + 1:02d}.yaml").read_text(encoding="utf-8"))


def _scores(p: dict) -> np.ndarray:
    X, WQ, WK = (np.array(p[k], dtype=float) for k in ("X", "W_Q", "W_K"))
    return (X @ WQ) @ (X @ WK).T


def _softmax_causal(scaled: np.ndarray) -> np.ndarray:
    masked = np.where(np.tril(np.ones_like(scaled)) > 0, scaled, -np.inf)
    e = np.exp(masked - masked.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _text(m: np.ndarray) -> list:
    return [[f"{x:.4f}" for x in row] for row in m]


def test_folder_right_answers_score_one(symattn_cli, tmp_path):
    out = tmp_path / "q"
    _run(symattn_cli, out, "--ask", "S_scaled,A")
    info = json.loads((out / "info.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", info["uuid"])
    assert info["type"] == "v3" and info["title"] and info["topic"] and info["tags"]
    server = _server(out)
    generated = _generated(server, 11)
    variant = generated["params"]["variant"]
    assert variant == 11 % 2
    p = _problem(out, variant)
    scaled = _scores(p) / np.sqrt(np.array(p["W_Q"]).shape[1])
    assert [s["name"] for s in generated["params"]["stages"]] == ["stage1_", "stage2_"]
    assert np.allclose(generated["correct_answers"]["stage2_"]["_value"], _softmax_causal(scaled), atol=1e-9)
    data = _submission(generated, [_text(scaled), _text(_softmax_causal(scaled))])
    server.parse(data)
    assert data["format_errors"] == {}
    server.grade(data)
    assert data["score"] == 1
    for name in ("stage1_", "stage2_"):
        part = data["partial_scores"][name]
        assert part["score"] == 1 and part["weight"] == 1
        assert sorted(part["feedback"], key=lambda k: int(k.rpartition("_")[2])) == [f"{name}{k}" for k in range(1, 17)]
        assert set(part["feedback"].values()) == {"correct"}
    assert data["feedback"]["marking"].startswith("2 of 2 stages right.")
    json.dumps(data, allow_nan=False)  # what PrairieLearn's zygote sends back


def test_follow_through_and_diagnosis(symattn_cli, tmp_path):
    """S_scaled not divided by √d_k: that stage scores 0 with its cause named; A computed right
    from that wrong S_scaled scores 1 (follow-through)."""
    out = tmp_path / "q"
    _run(symattn_cli, out, "--ask", "S_scaled,A")
    server = _server(out)
    generated = _generated(server, 4)
    p = _problem(out, generated["params"]["variant"])
    unscaled = _scores(p)
    data = _submission(generated, [_text(unscaled), _text(_softmax_causal(unscaled))])
    server.parse(data)
    server.grade(data)
    assert data["partial_scores"]["stage1_"]["score"] == 0
    assert data["partial_scores"]["stage2_"]["score"] == 1
    assert data["score"] == 0.5
    d_k = np.array(p["W_Q"]).shape[1]
    wrong = {f"stage1_{4 * i + j + 1}" for i in range(4) for j in range(4)
             if abs(unscaled[i, j] - unscaled[i, j] / np.sqrt(d_k)) > 0.00005}
    assert wrong and {k for k, v in data["partial_scores"]["stage1_"]["feedback"].items() if v == "incorrect"} == wrong
    assert "likely cause: no scaling" in data["feedback"]["stage1_"] and "√d_k" in data["feedback"]["stage1_"]
    assert "expected" not in data["feedback"]["stage1_"]  # the student may submit again
    assert "computed from your S_scaled" in data["feedback"]["stage2_"]
    assert "1 right from your own earlier answers" in data["feedback"]["marking"]
    assert [s["heading"] for s in data["feedback"]["stages"]][1].endswith("(A)")


_WITHOUT = """
import importlib.util, json, sys
sys.modules["symattn"] = None  # import symattn fails, as where PrairieLearn cannot reach it
spec = importlib.util.spec_from_file_location("server", sys.argv[1])
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
data = json.loads(sys.stdin.read())
server.parse(data)
server.grade(data)
print(json.dumps(data, allow_nan=False))
"""


def test_without_symattn_marks_each_entry(symattn_cli, tmp_path):
    out = tmp_path / "q"
    _run(symattn_cli, out, "--ask", "S_scaled,A")
    generated = _generated(_server(out), 4)
    p = _problem(out, generated["params"]["variant"])
    unscaled = _scores(p)
    scaled = unscaled / np.sqrt(np.array(p["W_Q"]).shape[1])
    given = [_text(unscaled), _text(_softmax_causal(unscaled))]
    r = subprocess.run([sys.executable, "-c", _WITHOUT, str(out / "server.py")], cwd=tmp_path, capture_output=True,
                       text=True, input=json.dumps(_submission(generated, given)), env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    for name, typed, exact in (("stage1_", unscaled, scaled), ("stage2_", _softmax_causal(unscaled), _softmax_causal(scaled))):
        right = np.abs(np.round(typed, 4) - exact) <= 0.00005
        assert data["partial_scores"][name]["score"] == pytest.approx(right.mean())
        marks = data["partial_scores"][name]["feedback"]
        assert [marks[f"{name}{4 * i + j + 1}"] == "correct" for i in range(4) for j in range(4)] == right.ravel().tolist()
    assert data["partial_scores"]["stage2_"]["score"] < 1  # no follow-through
    assert "need symattn importable" in data["feedback"]["marking"]
    assert not any("likely cause" in data["feedback"][name] for name in ("stage1_", "stage2_"))


_COURSE = """
import importlib.util, json, sys
sys.path.append(sys.argv[2])  # the site-packages of the tests' Python (-S: no .pth, so no installed symattn)
try:
    import symattn
    sys.exit("symattn is importable before server.py runs")
except ImportError:
    pass
spec = importlib.util.spec_from_file_location("server", sys.argv[1])
server = importlib.util.module_from_spec(spec)
spec.loader.exec_module(server)
data = json.loads(sys.stdin.read())
server.parse(data)
server.grade(data)
print(json.dumps({"data": data, "symattn": sys.modules["symattn"].__file__}, allow_nan=False))
"""


def test_symattn_from_server_files_course(symattn_cli, tmp_path):
    """The README's recipe: symattn in serverFilesCourse/symattn-lib, found through
    data["options"]["server_files_course_path"] (as PrairieLearn passes it), follows through."""
    import sysconfig

    out = tmp_path / "q"
    _run(symattn_cli, out, "--ask", "S_scaled,A")
    lib = tmp_path / "course" / "serverFilesCourse" / "symattn-lib"
    lib.mkdir(parents=True)
    (lib / "symattn").symlink_to(ROOT / "symattn", target_is_directory=True)
    generated = _generated(_server(out), 4)
    generated["options"]["server_files_course_path"] = str(lib.parent)
    unscaled = _scores(_problem(out, generated["params"]["variant"]))
    data = _submission(generated, [_text(unscaled), _text(_softmax_causal(unscaled))])
    r = subprocess.run([sys.executable, "-S", "-c", _COURSE, str(out / "server.py"), sysconfig.get_paths()["purelib"]],
                       cwd=tmp_path, capture_output=True, text=True, input=json.dumps(data), env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr + r.stdout
    got = json.loads(r.stdout)
    assert got["symattn"].startswith(str(lib))
    assert {k: v["score"] for k, v in got["data"]["partial_scores"].items()} == {"stage1_": 0, "stage2_": 1}
    assert "need symattn" not in got["data"]["feedback"]["marking"]


def test_parse_format_errors_and_masked_entries(symattn_cli, tmp_path):
    out = tmp_path / "q"
    _run(symattn_cli, out, "--ask", "S_masked")
    server = _server(out)
    generated = _generated(server, 0)
    p = _problem(out, 0)
    scaled = _scores(p) / np.sqrt(np.array(p["W_Q"]).shape[1])
    above = np.triu(np.ones_like(scaled, dtype=bool), 1)
    typed = [[None if above[i, j] else f"{scaled[i, j]:.4f}" for j in range(4)] for i in range(4)]
    assert "stage1_" not in generated["correct_answers"]  # −∞ is no number the element holds: rows/columns size it
    data = _submission(generated, [typed])
    server.parse(data)
    assert data["format_errors"] == {}
    server.grade(data)
    assert data["score"] == 1
    for cell, message in ((None, "Row 2, column 1 is empty"), ("0.1", "Row 2, column 1 is written to 1 decimal place: write 4"),
                          ("1_000", "Row 2, column 1 is not a number"), ("nan", "Row 2, column 1 is not a number"),
                          ("1e-99999", "Row 2, column 1 is not a number"), ("9" * 61, "Row 2, column 1 is longer than 60")):
        bad = [row[:] for row in typed]
        bad[1][0] = cell
        data = _submission(generated, [bad])
        server.parse(data)
        assert data["format_errors"]["stage1_"].startswith(message)
    exact = [row[:] for row in typed]
    exact[1][0] = f"{int(_scores(p)[1, 0])}/{int(np.sqrt(np.array(p['W_Q']).shape[1]))}"  # S/√d_k as a fraction
    exact[0][1] = "-INF"  # a masked entry may be typed too
    data = _submission(generated, [exact])
    server.parse(data)
    assert data["format_errors"] == {}
    server.grade(data)
    assert data["score"] == 1


def test_same_seed_same_bytes(symattn_cli, tmp_path):
    _run(symattn_cli, tmp_path / "a", "--ask", "S,A")
    _run(symattn_cli, tmp_path / "b", "--ask", "S,A")
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    _run(symattn_cli, tmp_path / "c", "--ask", "S,A", seed=4)
    assert json.loads((tmp_path / "c" / "info.json").read_text())["uuid"] != \
        json.loads((tmp_path / "a" / "info.json").read_text())["uuid"]


class _Tree(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


HOSTILE = "<script>alert(1)</script>"


def test_hostile_words_stay_text(symattn_cli, tmp_path):
    out = tmp_path / "h"
    _run(symattn_cli, out, "--tokens", "4", "--words", f"{HOSTILE} {{{{mustache}}}} $x$ d", count=1, seed=1)
    plain = tmp_path / "p"
    _run(symattn_cli, plain, count=1, seed=1)
    for name in ("question.html", "server.py"):  # no user text in the template or the code
        assert (out / name).read_bytes() == (plain / name).read_bytes()
    compile((out / "server.py").read_text(), "server.py", "exec")
    generated = _generated(_server(out), 5)
    tree = _Tree()
    tree.feed(generated["params"]["statement"])
    assert "script" not in [t for t, _ in tree.tags]
    text = "".join(tree.text)
    assert HOSTILE in text and "{{mustache}}" in text


@pytest.mark.skipif(shutil.which("node") is None or not MUSTACHE.exists(),
                    reason="node or mustache.js (npm ci --prefix tests/node) not installed")
def test_question_html_rendered_by_mustache_js(symattn_cli, tmp_path):
    """question.html rendered with mustache.js, as PrairieLearn renders it (freeform.ts execTemplate):
    a hostile token stays text, {{mustache}} in it is not a tag, each stage has its input."""
    out = tmp_path / "h"
    _run(symattn_cli, out, "--tokens", "4", "--words", f"{HOSTILE} {{{{mustache}}}} b c", "--ask", "S,A", count=1,
         seed=1)
    server = _server(out)
    generated = _generated(server, 0)
    p = _problem(out, 0)
    data = _submission(generated, [_text(_scores(p)), _text(_scores(p))])
    server.grade(data)
    view = {**data, "mustache": "INJECTED"}  # a tag {{mustache}} would read this
    script = ("const m = require(process.argv[1]); const fs = require('fs');"
              "process.stdout.write(m.render(fs.readFileSync(process.argv[2], 'utf8'), JSON.parse(fs.readFileSync(0, 'utf8'))));")
    r = subprocess.run(["node", "-e", script, str(MUSTACHE), str(out / "question.html")], input=json.dumps(view),
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tree = _Tree()
    tree.feed(r.stdout)
    tags = [t for t, _ in tree.tags]
    assert "script" not in tags and "INJECTED" not in r.stdout
    text = "".join(tree.text)
    assert HOSTILE in text and "{{mustache}}" in text
    inputs = [a for t, a in tree.tags if t == "pl-matrix-component-input"]
    assert [(a["answers-name"], a["rows"], a["columns"], a["digits"]) for a in inputs] == \
        [("stage1_", "4", "4", "4"), ("stage2_", "4", "4", "4")]
    assert "1 of 2 stages right, 1 wrong." in text  # the feedback, in the submission panel
