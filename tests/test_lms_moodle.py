"""``symattn generate --lms moodle``: the Moodle XML question bank, read back with an independent
XML parser (xml.etree) and with Moodle's own cloze regex (ported from
question/type/multianswer/questiontype.php, ``ANSWER_REGEX``), each blank's key checked against
NumPy from the variant's YAML."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import yaml

from symattn.cli import main

# Moodle's ANSWER_REGEX; PHP's (?<!\\|&|&amp;) is three fixed-width lookbehinds in Python.
_FRACTION = r"=|%(-?[0-9]+(?:[.,][0-9]*)?)%"
_ANSWER = r".+?(?<!\\)(?<!&)(?<!&amp;)(?=[~#}]|$)"
_FEEDBACK = r".*?(?<!\\)(?=[~}]|$)"
_ALT = f"({_FRACTION})?({_ANSWER})(#({_FEEDBACK}))?"
_TYPES = (r"(NUMERICAL|NM)|(MULTICHOICE|MC)|(MULTICHOICE_V|MCV)|(MULTICHOICE_H|MCH)|(SHORTANSWER|SA|MW)"
          r"|(SHORTANSWER_C|SAC|MWC)|(MULTICHOICE_S|MCS)|(MULTICHOICE_VS|MCVS)|(MULTICHOICE_HS|MCHS)"
          r"|(MULTIRESPONSE|MR)|(MULTIRESPONSE_H|MRH)|(MULTIRESPONSE_S|MRS)|(MULTIRESPONSE_HS|MRHS)")
ANSWER_REGEX = re.compile(r"\{([0-9]*):(" + _TYPES + r"):(" + _ALT + "(~" + _ALT + r")*)\}", re.S)
NUMBER = r"-?(?:(?:[0-9]+[.,]?[0-9]*|[.,][0-9]+)(?:[eE][-+]?[0-9]+)?)"  # Moodle's NUMBER_REGEX

SHAPE = ["--tokens", "3", "--d-model", "2", "--d-k", "4", "--d-v", "2"]


class Result:
    def __init__(self, exit_code, output):
        self.exit_code, self.output = exit_code, output


_CAPSYS = []


@pytest.fixture(autouse=True)
def _capture(capsys):
    _CAPSYS[:] = [capsys]


def run(tmp_path, *args, name="bank"):
    out = tmp_path / name
    code = main(["generate", "--count", "2", "--out-dir", str(out), "--lms", "moodle", *args])
    captured = _CAPSYS[0].readouterr()
    return Result(code, captured.out + captured.err), out


def blanks(text: str) -> list[tuple[float, float]]:
    found = []
    for m in ANSWER_REGEX.finditer(text):
        assert m.group(2) == "NUMERICAL"
        at = 3 + _TYPES.count("(")  # the first alternative's groups: fraction, its number, answer
        assert m.group(at) == f"={m.group(at + 3)}#{m.group(at + 5)}", "one alternative per blank"
        answer = m.group(at + 3)
        num = re.fullmatch(f"({NUMBER})(:({NUMBER}))?", answer)
        assert m.group(at + 1) == "=" and num, answer
        found.append((float(num.group(1)), float(num.group(3))))
    return found


def expected(problem: dict, ask: list[str]) -> list[float]:
    """S (unscaled Q·Kᵀ), A (softmax of the scaled, causally masked scores), O = A·V, row by row."""
    X, WQ, WK, WV = (np.array(problem[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ WQ, X @ WK, X @ WV
    S = Q @ K.T
    n = len(S)
    scaled = S / np.sqrt(Q.shape[1]) + np.where(np.tril(np.ones((n, n))) > 0, 0, -np.inf)
    A = np.exp(scaled - scaled.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    stages = {"S": S, "A": A, "O": A @ V}
    return [float(x) for k in ask for x in stages[k].ravel()]


def questions(out):
    root = ET.parse(out / "moodle.xml").getroot()
    assert root.tag == "quiz"
    first, *rest = root.findall("question")
    assert first.get("type") == "category"
    assert first.findtext("category/text") == f"$course$/top/symattn/{out.name}"
    for q in rest:
        assert q.get("type") == "cloze"
        assert q.find("questiontext").get("format") == "html"
        for tag in ("name/text", "questiontext/text", "generalfeedback/text", "penalty", "defaultgrade"):
            assert q.findtext(tag), tag
    return rest


@pytest.mark.parametrize("places", [3, 6])
def test_blanks_match_numpy(tmp_path, places):
    result, out = run(tmp_path, "--seed", "5", "--ask", "S,A,O", "--places", str(places), *SHAPE)
    assert result.exit_code == 0, result.output
    qs = questions(out)
    assert len(qs) == 2
    for i, q in enumerate(qs, 1):
        problem = yaml.safe_load((out / f"variant-{i:02d}.yaml").read_text())
        got = blanks(q.findtext("questiontext/text"))
        want = expected(problem, ["S", "A", "O"])
        assert len(got) == len(want) == 9 + 9 + 6  # S, A 3×3, O 3×2; no −∞ among them (the mask acts inside A)
        assert int(q.findtext("defaultgrade")) == len(got)
        for (key, tol), w in zip(got, want):
            assert tol == 0.5 * 10 ** -places
            assert abs(key - w) < 10 ** -(places + 5)
        assert "seed" in q.findtext("name/text") and f"variant-{i:02d}" in q.findtext("name/text")
        assert "row 3" in q.findtext("questiontext/text") and "column 3" in q.findtext("questiontext/text")


def test_hostile_words_stay_text(tmp_path):
    words = "<script> ]]> {1:NUMERICAL:=0} $x$ &"
    result, out = run(tmp_path, "--seed", "2", "--ask", "A", "--tokens", "5", "--d-model", "2", "--d-k", "4",
                      "--d-v", "2", "--words", words)
    assert result.exit_code == 0, result.output
    for q in questions(out):
        text = q.findtext("questiontext/text")
        assert len(blanks(text)) == 25  # the 5×5 A, and no blank from the token
        assert "<script>" not in text and "&lt;script&gt;" in text
        assert "]]&gt;" in text
        assert "<script>" not in q.findtext("generalfeedback/text")


def test_feedback_text_cannot_end_a_blank():
    import html

    from symattn.lms.moodle import cloze_text

    text = "a}b#c~d\\e{f<g"
    got = cloze_text(text)
    assert not re.search(r"[{}#~\\<]", got.replace("&#", "").replace(";", ""))
    assert html.unescape(got) == text  # Moodle html_entity_decode()s the feedback


def test_cdata_survives_its_end_marker():
    from symattn.lms.moodle import cdata

    root = ET.fromstring(f"<t>{cdata('a]]>b<i>')}</t>")
    assert root.text == "a]]>b<i>"


def test_same_seed_same_bytes(tmp_path):
    _, a = run(tmp_path, "--seed", "9", *SHAPE, name="one")
    _, b = run(tmp_path, "--seed", "9", *SHAPE, name="one2")
    ta = (a / "moodle.xml").read_text().replace("/one", "/X")
    tb = (b / "moodle.xml").read_text().replace("/one2", "/X")
    assert ta == tb


def test_unknown_stage_refused(tmp_path):
    result, out = run(tmp_path, "--seed", "1", "--ask", "S,dO", *SHAPE)
    assert result.exit_code == 1
    assert result.output.count("Error:") == 1 and "Traceback" not in result.output
    assert not out.exists() or not any(out.iterdir())


def test_places_out_of_range(tmp_path):
    result, out = run(tmp_path, "--seed", "1", "--places", "11", *SHAPE)
    assert result.exit_code != 0 and "places" in result.output.lower()
    assert not out.exists()


def test_minus_infinity_shown_not_asked(tmp_path):
    result, out = run(tmp_path, "--seed", "4", "--ask", "S_masked", *SHAPE)  # causal mask: 3 of 9 masked
    assert result.exit_code == 0, result.output
    for q in questions(out):
        text = q.findtext("questiontext/text")
        assert len(blanks(text)) == 6
        assert len(re.findall(r"<td>[^<{]*\\infty[^<]*</td>", text)) == 3
