"""symattn generate --lms prairielearn: the question folder, and server.py's generate/grade called as PrairieLearn calls them."""

import importlib.util
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import yaml


def _run(out, seed=3):
    cmd = [sys.executable, "-m", "symattn", "generate", "--count", "2", "--out-dir", str(out), "--lms", "prairielearn",
           "--ask", "S,A", "--seed", str(seed)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr


def _server(out):
    spec = importlib.util.spec_from_file_location("pl_server", out / "server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _data(seed):
    return {"params": {}, "correct_answers": {}, "submitted_answers": {}, "format_errors": {}, "partial_scores": {},
            "score": 0, "feedback": {}, "variant_seed": seed, "options": {}, "raw_submitted_answers": {}}


def _expected(out, variant):
    p = yaml.safe_load((out / f"variant-{variant + 1:02d}.yaml").read_text())
    X, WQ, WK = (np.array(p[k], dtype=float) for k in ("X", "W_Q", "W_K"))
    S = (X @ WQ) @ (X @ WK).T  # S is QK^T; the softmax reads S/sqrt(d_k)
    masked = np.where(np.tril(np.ones_like(S)) > 0, S / np.sqrt(WQ.shape[1]), -np.inf)
    A = np.exp(masked - masked.max(axis=1, keepdims=True))
    return S, A / A.sum(axis=1, keepdims=True)


def test_folder_and_grading(tmp_path):
    out = tmp_path / "q"
    _run(out)
    info = json.loads((out / "info.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", info["uuid"])
    assert info["type"] == "v3" and info["title"] and info["topic"] and info["tags"]
    HTMLParser().feed((out / "question.html").read_text())
    server = _server(out)
    data = _data(11)
    server.generate(data)
    variant = data["params"]["variant"]
    assert variant == 11 % 2
    S, A = _expected(out, variant)
    right = {"s0": np.round(S, 4).tolist(), "s1": np.round(A, 4).tolist()}
    data["submitted_answers"] = right
    server.grade(data)
    assert data["score"] == 1
    assert data["partial_scores"]["s0"]["score"] == 1
    wrong = {"s0": [row[:] for row in right["s0"]], "s1": right["s1"]}
    wrong["s0"][1][0] += 1
    data["submitted_answers"] = wrong
    server.grade(data)
    assert data["partial_scores"]["s1"]["score"] == 1
    assert data["partial_scores"]["s0"]["score"] < 1
    assert "row 2, column 1" in data["partial_scores"]["s0"]["feedback"]


def test_same_seed_same_bytes(tmp_path):
    _run(tmp_path / "a")
    _run(tmp_path / "b")
    for name in ("info.json", "question.html", "server.py", "variants.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_hostile_words_stay_text(tmp_path):
    out = tmp_path / "h"
    hostile = '{{x}} <b>a" \'"""; import os #'
    cmd = [sys.executable, "-m", "symattn", "generate", "--count", "1", "--out-dir", str(out), "--lms", "prairielearn",
           "--tokens", "4", "--words", f"{hostile} b c d", "--seed", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert r.returncode == 0, r.stderr
    source = (out / "server.py").read_text()
    compile(source, "server.py", "exec")
    assert "import os #" not in source and "<b>" not in (out / "question.html").read_text()
    data = _data(5)
    _server(out).generate(data)
    statement = data["params"]["statement"]
    assert "<b>a" not in statement and "&lt;b&gt;a" in statement
    HTMLParser().feed(statement)
