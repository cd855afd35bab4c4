"""``--lms qti`` read by what Canvas runs on a QTI 1.2 import: Instructure's QTIMigrationTool
(``migrate.py``, which converts the package to QTI 2.1 items), then Canvas's own reading of a
numerical question from that (the importer's ``Qti::NumericInteraction``: a range answer is
``responseIf > and > customOperator[class=vargte]`` and ``[class=varlte]``, their ``baseValue``
read as floats). Every range must hold the value NumPy computes from the variant's YAML, rounded
to the places asked, and nothing a unit off.

The tool is not on PyPI: set SYMATTN_QTI_MIGRATION_TOOL to a checkout of
github.com/instructure/QTIMigrationTool (it needs lxml in this Python); without it, this skips."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pytest
import yaml

TOOL = os.environ.get("SYMATTN_QTI_MIGRATION_TOOL")
pytestmark = pytest.mark.skipif(not TOOL or not (Path(TOOL) / "migrate.py").is_file(),
                                reason="SYMATTN_QTI_MIGRATION_TOOL is not a QTIMigrationTool checkout")
V2 = "{http://www.imsglobal.org/xsd/imsqti_v2p1}"


def _stages(path: Path) -> dict[str, np.ndarray]:
    p = yaml.safe_load(path.read_text(encoding="utf-8"))
    X, WQ, WK, WV = (np.array(p[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ WQ, X @ WK, X @ WV
    S = Q @ K.T / np.sqrt(K.shape[1])
    S[np.triu(np.ones_like(S, dtype=bool), 1)] = -np.inf
    P = np.exp(S - S.max(axis=1, keepdims=True))
    A = P / P.sum(axis=1, keepdims=True)
    return {"Softmax on each row": A, "Weighted sum of the values": A @ V}


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        self.tags.add(tag)


def test_canvas_reads_every_range_and_the_value_is_in_it(symattn_cli, tmp_path: Path) -> None:
    out = tmp_path / "quiz"
    r = symattn_cli.entry("generate", "--count", "2", "--out-dir", str(out), "--lms", "qti", "--ask", "A,O",
                          "--words", "a <script> ]]> &", "--tokens", "4", "--seed", "3")
    assert r.code == 0, r.output
    unz, conv = tmp_path / "unz", tmp_path / "conv"
    zipfile.ZipFile(out / "qti.zip").extractall(unz)
    run = subprocess.run([sys.executable, "migrate.py", "--ucvars", "--nogui", "--overwrite", f"--cpout={conv}/",
                          f"{unz}/"], cwd=TOOL, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "error" not in (run.stdout + run.stderr).lower(), run.stdout + run.stderr
    assert sorted(p.name for p in (conv / "assessmentTests").glob("*.xml")) == [
        "symattn_variant-01.xml", "symattn_variant-02.xml"]  # a quiz per variant
    items = sorted((conv / "assessmentItems").glob("*.xml"))
    stages = {n: _stages(out / f"variant-{n:02d}.yaml") for n in (1, 2)}
    assert len(items) == 2 + sum(m.size for s in stages.values() for m in s.values())  # the statement, each entry
    unit = Decimal("0.0001")
    for path in items:
        root = ET.parse(path).getroot()
        fields = {f.get("name"): f.get("value") for f in root.iter(f"{V2}instructureField")}
        shown = [div.text or "" for div in root.iter(f"{V2}div")]  # HTML as text, as Canvas shows it
        for html in shown:
            tags = _Tags()
            tags.feed(html)
            assert "script" not in tags.tags, html
        if path.name.endswith("_000.xml"):
            assert fields["question_type"] == "text_only_question"
            assert "W_{Q}" in shown[0] and "&lt;script&gt;" in shown[0]  # the token, as text
            continue
        assert fields["question_type"] == "numerical_question"
        title = re.fullmatch(r"variant-(\d+): (.+), row (\d+), column (\d+)", root.get("title"))
        assert title, root.get("title")
        value = stages[int(title[1])][title[2]][int(title[3]) - 1, int(title[4]) - 1]
        (cond,) = root.findall(f".//{V2}responseIf/{V2}and")
        start, end = (float(cond.find(f"{V2}customOperator[@class='{c}']/{V2}baseValue").text)
                      for c in ("vargte", "varlte"))  # as Canvas reads them: to_f
        rounded = Decimal(f"{value:.4f}")
        assert Decimal(start) <= rounded <= Decimal(end), (path.name, value, start, end)
        assert not Decimal(start) <= rounded + unit <= Decimal(end), (path.name, value, start, end)
        assert not Decimal(start) <= rounded - unit <= Decimal(end), (path.name, value, start, end)
