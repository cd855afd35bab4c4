"""Hypothesis fuzzing of the CLI, in-process: random bytes, mutated valid problems,
random answers files. Never exit 3, never an exception escaping main(), one
`Error: ` line on exit 1, a passing cross-check on exit 0, and a few seconds at most.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
CAUSAL = ROOT / "worked_examples" / "causal_4_tokens.yaml"
QKV = ROOT / "worked_examples" / "qkv_given.yaml"
SEEDS = [CAUSAL.read_text("utf-8"), QKV.read_text("utf-8")]
LIMIT_S = 5.0
# Lone surrogates cannot be written to a UTF-8 file at all; every other character is fair game.
_BAD_CHARS = re.compile("[\ud800-\udfff]")


def clean(text: str) -> str:
    return _BAD_CHARS.sub("", text)

FUZZ = settings(
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def run(capsys, argv):
    capsys.readouterr()
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # known bug, pinned by test_check_returns_exit_code: `check` raises SystemExit
        code = exc.code
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in (0, 1), f"exit {code}: {err}"
    assert elapsed < LIMIT_S, f"took {elapsed:.1f} s"
    return code, out, err


def check_derive(capsys, path):
    code, out, err = run(capsys, ["derive", str(path), "-f", "json"])
    if code == 1:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
    else:
        assert json.loads(out)["crosscheck"]["passed"] is True, err


# (a) random bytes ------------------------------------------------------------------

@FUZZ
@given(data=st.one_of(
    st.binary(max_size=400),
    st.binary(max_size=200).map(lambda b: SEEDS[0].encode()[:200] + b),
))
def test_random_bytes(capsys, workdir, data):
    path = workdir / "bytes.yaml"
    try:
        data = clean(data.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        pass  # not UTF-8: rejected before YAML reads it
    path.write_bytes(data)
    check_derive(capsys, path)


# (b) mutated valid problems ---------------------------------------------------------

NASTY = st.one_of(
    st.sampled_from([
        "-inf", ".nan", ".inf", "true", "null", "~", "[]", "{}", "[[1]]", "&a 1", "*a", "!!binary AA==",
        "!!python/name:os.system", "'", '"', ":", "- ", "#", "|", ">", "\t", "\u00a0", "²", "١", "½", "ﬁ",
        '"sqrt(-1)"', '"log(0)"', '"exp(1)"', '"1/0"', '"0**-1"', '"2^1000"', '"10**10**10"', '"exp(700)"',
        '"a"', '"e"', '"__import__"', '"().__class__"', '"lambda: 1"', '"x if 1 else 2"', '"1 < 2"',
        "1e400", "1e-400", "0x10", "0o7", "1_000", "+.5", "-0", "9" * 500, '"' + "(" * 80 + "1" + ")" * 80 + '"',
        "causal", "casual", "{sliding-window: 2}", "{sliding-window: 0}", "{file: x.npy}", "{file: ../x.csv}",
    ]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.fractions().map(lambda f: f'"{f}"'),
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12),
    st.text(alphabet="0123456789+-*/^().eE sqrtexplog ab", min_size=1, max_size=20).map(lambda s: f'"{s}"'),
)


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "token"]))
        pos = draw(st.integers(0, len(text)))
        if kind == "insert":
            text = text[:pos] + draw(st.text(max_size=5)) + text[pos:]
        elif kind == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 10)):]
        elif kind == "replace":
            text = text[:pos] + draw(st.text(min_size=1, max_size=3)) + text[pos + 1:]
        else:  # replace one number/word token with something nasty
            import re

            spots = [m.span() for m in re.finditer(r'"[^"\n]*"|[A-Za-z0-9_./<>-]+', text)]
            a, b = draw(st.sampled_from(spots))
            text = text[:a] + draw(NASTY) + text[b:]
    return text


@FUZZ
@given(text=mutated())
def test_mutated_problems(capsys, workdir, text):
    path = workdir / "mutated.yaml"
    path.write_text(clean(text), "utf-8")
    check_derive(capsys, path)


# (c) random answers files -----------------------------------------------------------

STAGES = ["Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
SHAPE = {"Q": (4, 4), "K": (4, 4), "V": (4, 2), "K_T": (4, 4), "S": (4, 4), "S_scaled": (4, 4), "M": (4, 4),
         "S_masked": (4, 4), "A": (4, 4), "O": (4, 2)}
ENTRY = st.one_of(
    st.integers(-5, 20).map(str),
    st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-100, max_value=100).map(str),
    st.sampled_from(["-inf", "'-inf'", "inf", ".nan", "true", "null", "[]", '"e^(1/2)"', '"1/3"', '"e"', '"a"',
                     '"exp(1000)"', '"1/0"', '"sqrt(-1)"', '"log(0)"', "1e400", '"e^e^e^e"', '"2^1000"', "9" * 300]),
    NASTY,
)


@st.composite
def answers(draw):
    lines = []
    for stage in draw(st.lists(st.sampled_from(STAGES + ["B", "head1.A", "X"]), min_size=1, max_size=4, unique=True)):
        rows, cols = SHAPE.get(stage, (2, 2))
        if draw(st.booleans()):
            rows, cols = draw(st.integers(0, 5)), draw(st.integers(0, 5))
        matrix = [[draw(ENTRY) for _ in range(cols)] for _ in range(rows)]
        lines.append(f"{stage}: [" + ", ".join("[" + ", ".join(r) + "]" for r in matrix) + "]")
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=answers())
def test_random_answers(capsys, workdir, text):
    path = workdir / "answers.yaml"
    path.write_text(clean(text), "utf-8")
    code, out, err = run(capsys, ["check", str(CAUSAL), str(path)])
    if err:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
    if code == 0:
        assert err == "" and out.strip()


@pytest.mark.parametrize("command", ["derive", "check"])
def test_control_character_is_one_line_with_its_place(capsys, workdir, command):
    path = workdir / "ctrl.yaml"
    path.write_bytes(b"Q: [[1, 0], [0, 1]]\n\x01\n")
    argv = ["derive", str(path), "-f", "json"] if command == "derive" else ["check", str(CAUSAL), str(path)]
    code, out, err = run(capsys, argv)
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}:2:1: "), err


def test_check_returns_exit_code(capsys, workdir):
    path = workdir / "wrong.yaml"
    path.write_text("Q: [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]\n", "utf-8")
    assert main(["check", str(CAUSAL), str(path)]) == 1
