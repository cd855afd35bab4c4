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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st


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


def run(cli, argv):
    start = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    r = cli.main(*argv)  # main() returns the exit code: a SystemExit escaping it fails the test
    elapsed = time.process_time() - start
    code, out, err = r.code, r.stdout, r.stderr
    assert "Traceback" not in out + err
    assert code in (0, 1), f"exit {code}: {err}"
    assert elapsed < LIMIT_S, f"took {elapsed:.1f} s of CPU time"
    return code, out, err


def check_derive(cli, path):
    code, out, err = run(cli, ["derive", str(path), "-f", "json"])
    if code == 1:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
    else:
        check = json.loads(out)["crosscheck"]
        if check["passed"] is None:
            # declined, never failed: float64 cannot hold this problem (an entry near 2^53, say);
            # the JSON and the note on standard error say why
            assert "float64" in check["skipped"] and "no numeric cross-check" in err, (check, err)
        else:
            assert check["passed"] is True, err


# (a) random bytes ------------------------------------------------------------------

@FUZZ
@given(data=st.one_of(
    st.binary(max_size=400),
    st.binary(max_size=200).map(lambda b: SEEDS[0].encode()[:200] + b),
))
def test_random_bytes(symattn_cli, workdir, data):
    path = workdir / "bytes.yaml"
    try:
        data = clean(data.decode("utf-8")).encode("utf-8")
    except UnicodeDecodeError:
        pass  # not UTF-8: rejected before YAML reads it
    path.write_bytes(data)
    check_derive(symattn_cli, path)


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


# Found by this test: an entry of W_K near 2^53, which float64 rounds to a multiple of 4.
NEAR_2_53 = SEEDS[0].replace("W_K:\n  - [0, 1, 0, 1]", "W_K:\n  - [9007199254740985, 1, 0, 1]")


@FUZZ
@given(text=mutated())
@example(text=NEAR_2_53)
def test_mutated_problems(symattn_cli, workdir, text):
    path = workdir / "mutated.yaml"
    path.write_text(clean(text), "utf-8")
    check_derive(symattn_cli, path)


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
def test_random_answers(symattn_cli, workdir, text):
    path = workdir / "answers.yaml"
    path.write_text(clean(text), "utf-8")
    code, out, err = run(symattn_cli, ["check", str(CAUSAL), str(path)])
    if err:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
    if code == 0:
        assert err == "" and out.strip()


@pytest.mark.parametrize("command", ["derive", "check"])
def test_control_character_is_one_line_with_its_place(symattn_cli, workdir, command):
    path = workdir / "ctrl.yaml"
    path.write_bytes(b"Q: [[1, 0], [0, 1]]\n\x01\n")
    argv = ["derive", str(path), "-f", "json"] if command == "derive" else ["check", str(CAUSAL), str(path)]
    code, out, err = run(symattn_cli, argv)
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {path}:2:1: "), err


def test_check_returns_exit_code(symattn_cli, workdir):
    path = workdir / "wrong.yaml"
    path.write_text("Q: [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]\n", "utf-8")
    assert symattn_cli.main("check", CAUSAL, path).code == 1


# (d) hostile families: expressions, nesting, answers bytes, .npy and .csv bytes -------------------
#
# Each strategy runs in-process (many examples, fast) and through the real command line in a
# child process capped at 1 GiB and bounded in CPU time (a few examples; tests/_child.py). SYMATTN_FUZZ_EXAMPLES
# sets both counts for a long run.

import os as _os  # noqa: E402
import struct as _struct  # noqa: E402

from _child import GIB  # noqa: E402

_LONG = int(_os.environ.get("SYMATTN_FUZZ_EXAMPLES", "0"))
HOSTILE = settings(FUZZ, max_examples=_LONG or 40)
IN_CHILD = settings(FUZZ, max_examples=_LONG or 3)
REST = "K: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\n"

_LEAVES = st.sampled_from(["1", "2", "0", "-1", "3/7", "0.5", "1e400", "1e-400", "9" * 60, "e", "exp(1)",
                           "log(2)", "sqrt(2)", "1000", "10^20", "2^1000", "0.0001"])


def _combine(children):
    one = st.tuples(st.sampled_from(["exp({})", "log({})", "sqrt({})", "-({})", "({})", "e^({})", "e^{}"]), children)
    two = st.tuples(st.sampled_from(["{}^{}", "{}*{}", "{}+{}", "{}/{}", "{}-{}", "({})^({})", "{}^({})"]),
                    children, children)
    return st.one_of(one.map(lambda t: t[0].format(t[1])), two.map(lambda t: t[0].format(t[1], t[2])))


EXPRESSIONS = st.one_of(
    st.recursive(_LEAVES, _combine, max_leaves=12),
    # towers: the same function or power nested n deep
    st.tuples(st.sampled_from(["exp({})", "log({})", "sqrt({})", "e^({})", "2^({})", "({})^2"]),
              st.integers(1, 40), _LEAVES).map(lambda t: _tower(*t)),
    st.integers(1, 200).map(lambda n: "e" + "^e" * n),
)


def _tower(pattern: str, depth: int, leaf: str) -> str:
    text = leaf
    for _ in range(depth):
        text = pattern.format(text)
    return text


def _expression_problem(expr: str) -> str:
    return f'Q: [["{expr}", 0], [0, 1]]\n' + REST


def _expression_answers(expr: str) -> str:
    return f'A: [["{expr}", 0, 0, 0], [0.5, 0.5, 0, 0], [0.3, 0.3, 0.4, 0], [0.25, 0.25, 0.25, 0.25]]\n'


@st.composite
def nested_yaml(draw):
    """Deep or odd nesting in flow or block style, as a problem or an answers file's matrix."""
    depth = draw(st.integers(1, 1500))
    style = draw(st.sampled_from(["flow", "block", "indented", "mapping", "mixed"]))
    if style == "flow":
        body = " " + "[" * depth + "1" + "]" * depth
    elif style == "block":
        body = "\n" + "- " * depth + "1"
    elif style == "indented":
        body = "\n" + "".join(" " * (2 * i) + "-\n" for i in range(min(depth, 400))) + " " * (2 * min(depth, 400)) + "- 1"
    elif style == "mapping":
        body = " " + "{a: " * depth + "1" + "}" * depth
    else:
        body = " " + "".join(draw(st.sampled_from(["[", "{a: ", "[1, "])) for _ in range(min(depth, 300))) + "1"
    return body


def npy_header(draw) -> bytes:
    shape = draw(st.one_of(
        st.tuples(st.integers(0, 4), st.integers(0, 4)),
        st.tuples(st.integers(0, 10**19)),
        st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)),
        st.lists(st.integers(-3, 5), max_size=4).map(tuple),
    ))
    descr = draw(st.sampled_from(["'<f8'", "'<i8'", "'|b1'", "'<c16'", "'|O'", "'<U3'", "'>f4'", "[('a', '<f8')]",
                                  "'<f8', (2,)", "f()", "'xx'", "1"]))
    fortran = draw(st.sampled_from(["False", "True", "1", "None"]))
    keys = draw(st.sampled_from(["full", "missing", "extra"]))
    header = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape!r}, "
    header += {"full": "}", "missing": "}".replace("'shape'", "'shap'"), "extra": "'x': 1}"}[keys]
    if draw(st.booleans()):
        header = draw(st.text(max_size=60)) if draw(st.booleans()) else "(" * draw(st.integers(1, 3000))
    raw = header.encode("utf-8", "replace")
    version = draw(st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x00"]))
    short = version == b"\x01\x00"  # version 1.0 writes the header's length in two bytes
    length = _struct.pack("<H" if short else "<I",
                          draw(st.one_of(st.just(min(len(raw), 65535)), st.integers(0, 65535 if short else 70000))))
    return b"\x93NUMPY" + version + length + raw


@st.composite
def npy_bytes(draw):
    kind = draw(st.sampled_from(["header", "random", "npz", "truncated"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "npz":
        return b"PK\x03\x04" + draw(st.binary(max_size=100))
    data = npy_header(draw) + draw(st.binary(max_size=200))
    if kind == "truncated":
        data = data[:draw(st.integers(0, len(data)))]
    return data


@st.composite
def csv_bytes(draw):
    rows = draw(st.lists(st.lists(st.one_of(
        st.integers(-10, 10).map(str), st.sampled_from(["1e400", "1e-400", "0.5", "", " ", "nan", "inf", "1/3", '"1"',
                                                        "é", "\x00", '"a""b"', "9" * 500]),
        st.text(max_size=6)), min_size=1, max_size=3), min_size=1, max_size=3))
    text = "\n".join(",".join(r) for r in rows) + "\n"
    if draw(st.booleans()):
        text = '"' + "1" * draw(st.integers(1000, 300_000)) + '",0\n' + text
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1", "utf-16", "utf-16-le", "cp1252"]))
    data = text.encode(encoding, "replace")
    if draw(st.booleans()):
        data += draw(st.binary(max_size=40))
    return data


_ST_DTYPES = ["F16", "BF16", "F32", "F64", "I32", "I64", "U8", "BOOL", "C64", "F8_E4M3", "", 5, None]
_ST_SIZES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "U8": 1}


@st.composite
def safetensors_bytes(draw):
    """A .safetensors file: a header of tensor entries, true or lying (dtype, shape, offsets),
    or JSON of any shape, or none; a length that fits or not; data, perhaps cut short."""
    kind = draw(st.sampled_from(["entries", "json", "random", "truncated"]))
    if kind == "random":
        return draw(st.binary(max_size=300))
    if kind == "json":
        header = json.dumps(draw(st.recursive(st.none() | st.integers() | st.text(max_size=5),
                                              lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                                                  max_size=3),
                                              max_leaves=10))).encode()
        data = b""
    else:
        entries, offset = {}, 0
        for name in draw(st.lists(st.sampled_from(["w", "wte", "__metadata__", "x"]), min_size=1, max_size=3, unique=True)):
            lie = draw(st.sampled_from(["none", "none", "dtype", "shape", "offsets", "key"]))  # at most one lie each
            dtype = draw(st.sampled_from(_ST_DTYPES if lie == "dtype" else list(_ST_SIZES)))
            shape = draw(st.lists(st.one_of(st.integers(0, 6), st.integers(-1, 10**13)), max_size=3)) if lie == "shape" \
                else [draw(st.integers(1, 4)), 2]
            size = _ST_SIZES[dtype] * shape[0] * shape[1] if lie in ("none", "offsets", "key") else draw(st.integers(0, 200))
            end = draw(st.integers(-5, 10**18)) if lie == "offsets" else offset + size
            entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
            if lie == "key":
                del entries[name][draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
            offset += size
        header = json.dumps(entries).encode()
        data = draw(st.binary(min_size=offset, max_size=offset))
    length = draw(st.sampled_from([len(header)] * 3 + [None]))
    if length is None:
        length = draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(header) + 16)))
    out = _struct.pack("<Q", length) + header + data
    if kind == "truncated":
        out = out[:draw(st.integers(0, len(out)))]
    return out


_ST_SPECS = st.sampled_from([
    "{file: m.safetensors, tensor: w}", '{file: m.safetensors, tensor: w, rows: "0:2", cols: "-1:"}',
    "{file: m.safetensors, tensor: wte, transpose: true}", "{file: m.safetensors, embeddings: wte, tokens: [0, 5, 1]}",
    '{file: m.safetensors, embeddings: w, tokens: [3], cols: "1:"}', "{file: m.safetensors, tensor: __metadata__}",
])


def _in_process(cli, argv) -> None:
    code, out, err = run(cli, argv)
    if code == 1 and not out.strip():
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), err


def _in_child(cli, cwd, argv) -> None:
    r = cli.bounded(*argv, cwd=cwd)
    r.assert_bounded()
    assert r.peak_bytes < GIB


@HOSTILE
@given(expr=EXPRESSIONS)
def test_expression_strings(symattn_cli, workdir, expr):
    (workdir / "expr.yaml").write_text(clean(_expression_problem(expr)), "utf-8")
    _in_process(symattn_cli, ["derive", str(workdir / "expr.yaml"), "-f", "json"])
    (workdir / "expr.answers.yaml").write_text(clean(_expression_answers(expr)), "utf-8")
    _in_process(symattn_cli, ["check", str(CAUSAL), str(workdir / "expr.answers.yaml")])


@HOSTILE
@given(body=nested_yaml(), where=st.sampled_from(["problem", "answers"]))
def test_nesting(symattn_cli, workdir, body, where):
    path = workdir / "nested.yaml"
    if where == "problem":
        path.write_text("Q:" + body + "\n" + REST, "utf-8")
        _in_process(symattn_cli, ["derive", str(path), "-f", "json"])
    else:
        path.write_text("A:" + body + "\n", "utf-8")
        _in_process(symattn_cli, ["check", str(CAUSAL), str(path)])


@HOSTILE
@given(data=st.one_of(st.binary(max_size=400), answers().map(lambda t: t.encode("utf-8", "replace")),
                      nested_yaml().map(lambda b: ("A:" + b + "\n").encode())))
def test_answers_bytes(symattn_cli, workdir, data):
    path = workdir / "answers.bin.yaml"
    path.write_bytes(data)
    _in_process(symattn_cli, ["check", str(CAUSAL), str(path)])


@HOSTILE
@given(data=npy_bytes())
def test_npy_bytes(symattn_cli, workdir, data):
    (workdir / "m.npy").write_bytes(data)
    (workdir / "npy.yaml").write_text("Q: {file: m.npy}\n" + REST, "utf-8")
    _in_process(symattn_cli, ["derive", str(workdir / "npy.yaml"), "-f", "json"])


@HOSTILE
@given(data=csv_bytes())
def test_csv_bytes(symattn_cli, workdir, data):
    (workdir / "m.csv").write_bytes(data)
    (workdir / "csv.yaml").write_text("Q: {file: m.csv}\n" + REST, "utf-8")
    _in_process(symattn_cli, ["derive", str(workdir / "csv.yaml"), "-f", "json"])


@HOSTILE
@given(data=safetensors_bytes(), spec=_ST_SPECS, positions=st.booleans())
def test_safetensors_bytes(symattn_cli, workdir, data, spec, positions):
    (workdir / "m.safetensors").write_bytes(data)
    text = f"Q: {spec}\n" + REST if "embeddings" not in spec else \
        f"X: {spec}\n" + ("positions: {file: m.safetensors, tensor: w}\n" if positions else "") + \
        "W_Q: [[1], [0]]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\n"
    (workdir / "st.yaml").write_text(text, "utf-8")
    _in_process(symattn_cli, ["derive", str(workdir / "st.yaml"), "-f", "json"])


@st.composite
def hostile_problem(draw):
    """A problem file of one hostile family, with its matrix file: (yaml text, file name, bytes)."""
    family = draw(st.sampled_from(["expression", "nesting", "npy", "csv", "safetensors"]))
    if family == "expression":
        return clean(_expression_problem(draw(EXPRESSIONS))), None, None
    if family == "nesting":
        return "Q:" + draw(nested_yaml()) + "\n" + REST, None, None
    if family == "npy":
        return "Q: {file: c.npy}\n" + REST, "c.npy", draw(npy_bytes())
    if family == "safetensors":
        return "Q: {file: c.safetensors, tensor: w}\n" + REST, "c.safetensors", draw(safetensors_bytes())
    return "Q: {file: c.csv}\n" + REST, "c.csv", draw(csv_bytes())


@IN_CHILD
@given(case=hostile_problem())
def test_hostile_problem_in_a_child_process(symattn_cli, workdir, case):
    """``python -m symattn derive`` under RLIMIT_AS (1 GiB), bounded in CPU time."""
    text, name, data = case
    if name is not None:
        (workdir / name).write_bytes(data)
    (workdir / "c_problem.yaml").write_text(text, "utf-8")
    _in_child(symattn_cli, workdir, ["derive", "c_problem.yaml", "-f", "json"])


@IN_CHILD
@given(expr=EXPRESSIONS, body=nested_yaml(), raw=st.binary(max_size=300))
def test_hostile_answers_in_a_child_process(symattn_cli, workdir, expr, body, raw):
    """``python -m symattn check`` with three hostile answers files at once: each is marked or
    reported on its own line, bounded."""
    (workdir / "c_a1.yaml").write_text(clean(_expression_answers(expr)), "utf-8")
    (workdir / "c_a2.yaml").write_text("A:" + body + "\n", "utf-8")
    (workdir / "c_a3.yaml").write_bytes(raw)
    r = symattn_cli.bounded("check", CAUSAL, "c_a1.yaml", "c_a2.yaml", "c_a3.yaml", cwd=workdir)
    r.assert_bounded()
    assert r.peak_bytes < GIB
    for name in ("c_a1.yaml", "c_a2.yaml", "c_a3.yaml"):
        assert sum(line.startswith(f"{name}: ") for line in r.out.splitlines()) == 1, r.out
