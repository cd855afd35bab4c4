"""``symattn generate --lms qti``: the QTI 1.2 package read back with an independent XML parser
(xml.etree), its structure checked against QTI 1.2's (questestinterop / assessment / section /
item / presentation / resprocessing), every answer range checked against the value NumPy
computes from the variant's YAML."""

from __future__ import annotations

import io
import zipfile
from decimal import Decimal
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import yaml

QTI = "{http://www.imsglobal.org/xsd/ims_qtiasiv1p2}"
CP = "{http://www.imsglobal.org/xsd/imsccv1p1/imscp_v1p1}"


def _run(symattn_cli, tmp_path: Path, *extra: str, name: str = "out"):
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / name
    r = symattn_cli.entry("generate", "--count", "2", "--out-dir", str(out), "--lms", "qti",
                          "--words", "a <script> ]]> &", "--tokens", "4", "--seed", "3", *extra)
    return r, out


def _attention(path: Path) -> np.ndarray:
    p = yaml.safe_load(path.read_text(encoding="utf-8"))
    X, WQ, WK, WV = (np.array(p[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ WQ, X @ WK, X @ WV
    S = Q @ K.T / np.sqrt(K.shape[1])
    S[np.triu(np.ones_like(S, dtype=bool), 1)] = -np.inf
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return (P / P.sum(axis=1, keepdims=True)) @ V


def _read(out: Path):
    z = zipfile.ZipFile(out / "qti.zip")
    manifest = ET.fromstring(z.read("imsmanifest.xml"))
    hrefs = [f.get("href") for f in manifest.iter(f"{CP}file")]
    assert hrefs and all(h in z.namelist() for h in hrefs)
    assert [r.get("type") for r in manifest.iter(f"{CP}resource")] == ["imsqti_xmlv1p2"]
    return z, ET.fromstring(z.read(hrefs[0]))


def test_each_answer_range_holds_the_rounded_value_and_nothing_a_unit_off(symattn_cli, tmp_path: Path) -> None:
    r, out = _run(symattn_cli, tmp_path)
    assert r.code == 0, r.output
    z, root = _read(out)
    assert root.tag == f"{QTI}questestinterop"
    (assessment,) = root.findall(f"{QTI}assessment")
    variants = assessment.findall(f"{QTI}section/{QTI}section")
    assert len(variants) == 2
    for n, section in enumerate(variants, 1):
        O = _attention(out / f"variant-{n:02d}.yaml")
        items = section.findall(f"{QTI}item")
        assert len(items) == O.size  # the last stage, O, entry by entry
        for item, value in zip(items, O.flat):
            types = [f.findtext(f"{QTI}fieldentry") for f in item.iter(f"{QTI}qtimetadatafield")
                     if f.findtext(f"{QTI}fieldlabel") == "question_type"]
            assert types == ["numerical_question"]
            assert item.find(f"{QTI}presentation/{QTI}response_str/{QTI}render_fib").get("fibtype") == "Decimal"
            cond = item.find(f"{QTI}resprocessing/{QTI}respcondition/{QTI}conditionvar/{QTI}and")
            lo = Decimal(cond.findtext(f"{QTI}vargte"))
            hi = Decimal(cond.findtext(f"{QTI}varlte"))
            rounded = Decimal(f"{value:.4f}")
            unit = Decimal("0.0001")
            assert lo <= rounded <= hi, (value, lo, hi)
            assert not lo <= rounded + unit <= hi and not lo <= rounded - unit <= hi
            assert lo == 0 or abs(lo) >= unit and (hi == 0 or abs(hi) >= unit)  # Canvas zeroes below 1e-4
            assert item.find(f"{QTI}itemfeedback/{QTI}flow_mat/{QTI}material/{QTI}mattext") is not None


def test_more_than_four_places_are_asked_scaled(symattn_cli, tmp_path: Path) -> None:
    r, out = _run(symattn_cli, tmp_path, "--places", "6")
    assert r.code == 0, r.output
    _, root = _read(out)
    O = _attention(out / "variant-01.yaml")
    item = root.find(f".//{QTI}item")
    assert "10<sup>2</sup> times" in item.findtext(f".//{QTI}mattext")
    lo = Decimal(item.findtext(f".//{QTI}vargte"))
    hi = Decimal(item.findtext(f".//{QTI}varlte"))
    assert lo <= Decimal(f"{O[0, 0] * 100:.4f}") <= hi and hi - lo <= Decimal("0.0001")


def test_hostile_tokens_are_text_and_same_seed_same_bytes(symattn_cli, tmp_path: Path) -> None:
    r1, out1 = _run(symattn_cli, tmp_path / "a")  # the same folder name: it titles the assessment
    r2, out2 = _run(symattn_cli, tmp_path / "b")
    assert r1.code == r2.code == 0
    z, root = _read(out1)
    for el in root.iter():
        assert el.tag.rpartition("}")[2] not in ("script", "style")
    html = root.find(f".//{QTI}mattext").text
    assert "<script>" not in html and "&lt;script&gt;" in html  # the token, escaped once more as HTML
    data = (out1 / "qti.zip").read_bytes()
    assert data == (out2 / "qti.zip").read_bytes()
    assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zipfile.ZipFile(io.BytesIO(data)).infolist())


def test_bad_ask_is_one_error_line_and_nothing_written(symattn_cli, tmp_path: Path) -> None:
    r, out = _run(symattn_cli, tmp_path, "--ask", "H")  # a stage, but not of this problem (no residual)
    lines = r.stderr.splitlines()
    assert r.code == 1 and len(lines) == 1 and lines[0].startswith("Error: --ask: this problem has no stage H"), r.stderr
    assert not out.exists() or not any(out.iterdir())
