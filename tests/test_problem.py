"""Tests for symattn.problem (its reader, symattn.problem.reader): reading and validating problem files.

The binding contract is the problem-format specification. Every line and
column below was counted by hand in the YAML written inline in the test
(1-based, as in ``FILE:LINE:COL: FIELD: message``).

Run with:
    python -m pytest tests/test_problem.py -p no:cacheprovider -o addopts=""
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import sympy
from sympy import ImmutableMatrix, Integer, Rational, sqrt



from symattn.errors import SymattnError
from symattn.problem.load import load_problem, parse_problem
from symattn.problem.masks import Mask
from symattn.problem.model import Problem

T, F = True, False

# Three queries, three keys, d_k = 1 (lines 1-3); a fourth line is the field under test.
QKV3 = "Q: [[1], [2], [3]]\nK: [[1], [2], [3]]\nV: [[1], [2], [3]]\n"
# Two queries, three keys (n_q = 2 ≠ n_k = 3).
QKV23 = "Q: [[1], [2]]\nK: [[1], [2], [3]]\nV: [[1], [2], [3]]\n"
# Projection weights for a 2-column X (d_model = 2, d_k = d_v = 2).
W2 = "W_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1, 0], [0, 1]]\n"

SPEC_SMALLEST = """\
title: Causal self-attention on four tokens   # optional; document title
tokens: [The, cat, sat, down]                 # optional row labels for X (default t_1..t_n)
X:                                            # n × d_model, one row per token
  - [1, 0, 1, 0]
  - [0, 2, 0, 2]
  - [1, 1, 1, 1]
  - [0, 1, 0, 1]
W_Q: [[1, 0], [0, 1], [1, 0], [0, 1]]         # d_model × d_k
W_K: [[0, 1], [1, 0], [0, 1], [1, 0]]         # d_model × d_k
W_V: [[1, 2], [0, 1], [1, 0], [2, 1]]         # d_model × d_v
mask: causal
"""


def fail(text: str, file: str = "p.yaml") -> SymattnError:
    """The SymattnError that parsing ``text`` raises."""
    with pytest.raises(SymattnError) as info:
        parse_problem(text, file)
    return info.value


def assert_at(err: SymattnError, line, col, field=None, file="p.yaml") -> None:
    """The error names exactly this place and field, and its text starts with them."""
    assert (err.file, err.line, err.col, err.field) == (file, line, col, field), str(err)
    prefix = file
    if line is not None:
        prefix += f":{line}"
        if col is not None:
            prefix += f":{col}"
    prefix += ": "
    if field is not None:
        prefix += f"{field}: "
    assert str(err).startswith(prefix), str(err)
    assert str(err) == prefix + err.message


def ok(text: str, file: str = "p.yaml") -> Problem:
    return parse_problem(text, file)


def M(rows) -> ImmutableMatrix:
    return ImmutableMatrix(rows)


# ==========================================================================
# Valid problems
# ==========================================================================


def test_spec_smallest_complete_problem():
    p = ok(SPEC_SMALLEST, "smallest.yaml")
    assert p.title == "Causal self-attention on four tokens"
    assert p.tokens == ("The", "cat", "sat", "down")
    assert p.key_tokens == p.tokens
    assert p.projected
    assert (p.n_q, p.n_k, p.d_model, p.d_k, p.d_v) == (4, 4, 4, 2, 2)
    assert p.X == M([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1], [0, 1, 0, 1]])
    assert p.W_Q == M([[1, 0], [0, 1], [1, 0], [0, 1]])
    assert p.W_K == M([[0, 1], [1, 0], [0, 1], [1, 0]])
    assert p.W_V == M([[1, 2], [0, 1], [1, 0], [2, 1]])
    assert p.Q is None and p.K is None and p.V is None and p.context is None and p.bias is None
    assert p.mask.kind == "causal"
    assert p.mask.allowed == (
        (T, F, F, F),
        (T, T, F, F),
        (T, T, T, F),
        (T, T, T, T),
    )
    assert p.scale == "auto"
    assert p.scale_value == 1 / sqrt(2)
    assert p.digits == 4
    assert p.source == "smallest.yaml"


def test_worked_example_file_loads():
    path = Path(__file__).resolve().parent.parent / "worked_examples" / "causal_4_tokens.yaml"
    if not path.exists():
        pytest.skip("worked example not present")
    p = load_problem(path)
    assert p.title == "Causal self-attention on four tokens"
    assert p.tokens == ("The", "cat", "sat", "down")
    assert (p.n_q, p.n_k, p.d_k, p.d_v) == (4, 4, 4, 2)
    assert p.scale_value == Rational(1, 2)  # 1/√4
    assert p.mask.allowed == ((T, F, F, F), (T, T, F, F), (T, T, T, F), (T, T, T, T))
    assert p.source == str(path)


def test_yaml_numbers_reach_the_problem_exactly():
    text = (
        "Q: [[0.1, 1e-3, -2.50, '1/3', \"-2/5\", \"sqrt(2)/2\", 2^3 - 1, \"exp(1)\", 0.1*3, !!float 0.1, !!str 0.5, 7]]\n"
        "K: [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]\n"
        "V: [[1]]\n"
    )
    p = ok(text)
    row = list(p.Q.row(0))
    expected = [
        Rational(1, 10),
        Rational(1, 1000),
        Rational(-5, 2),
        Rational(1, 3),
        Rational(-2, 5),
        sqrt(2) / 2,
        Integer(7),
        sympy.E,
        Rational(3, 10),
        Rational(1, 10),
        Rational(1, 2),
        Integer(7),
    ]
    assert row == expected
    for i in (0, 1, 2, 3, 4, 6, 8, 9, 10, 11):
        assert isinstance(row[i], sympy.Rational), (i, row[i])
    assert not p.Q.atoms(sympy.Float)


def test_plain_decimal_in_matrix_is_rational_one_tenth():
    p = ok("X:\n  - [0.1, 0.2]\n  - [0.3, 1]\n" + W2)
    x00 = p.X[0, 0]
    assert isinstance(x00, sympy.Rational)
    assert not isinstance(x00, sympy.Float)
    assert x00 == Rational(1, 10)
    assert (int(x00.p), int(x00.q)) == (1, 10)
    assert p.X == M([[Rational(1, 10), Rational(1, 5)], [Rational(3, 10), 1]])
    assert all(isinstance(v, sympy.Rational) for v in p.X)


def test_matrices_are_immutable_sympy_matrices():
    p = ok(QKV3)
    assert isinstance(p.Q, ImmutableMatrix)
    with pytest.raises(TypeError):
        p.Q[0, 0] = 5


def test_problem_is_frozen():
    p = ok(QKV3)
    with pytest.raises(Exception):
        p.title = "changed"  # type: ignore[misc]


def test_q_k_v_given_directly():
    p = ok("Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nmask: causal\n")
    assert not p.projected
    assert p.X is None and p.W_Q is None and p.W_K is None and p.W_V is None
    assert p.Q == M([[1, 0]])
    assert p.K == M([[1, 0], [0, 1]])
    assert p.V == M([[1], [2]])
    assert (p.n_q, p.n_k, p.d_k, p.d_v, p.d_model) == (1, 2, 2, 1, None)
    assert p.mask.allowed == ((T, F),)
    assert p.tokens == ("t_1",)
    assert p.key_tokens == ("k_1", "k_2")


def test_direct_q_k_v_same_length_share_tokens():
    p = ok("tokens: [a, b]\nQ: [[1], [2]]\nK: [[1], [2]]\nV: [[3], [4]]\n")
    assert p.tokens == ("a", "b")
    assert p.key_tokens == ("a", "b")


def test_cross_attention_with_context():
    text = (
        "X: [[1, 0], [0, 1]]\n"
        "context: [[1, 0, 0], [0, 1, 0], [0, 0, 1]]\n"
        "context_tokens: [a, b, c]\n"
        "tokens: [x, y]\n"
        "W_Q: [[1], [0]]\n"
        "W_K: [[1], [0], [0]]\n"
        "W_V: [[1, 2], [0, 1], [0, 0]]\n"
        "mask: causal\n"
    )
    p = ok(text)
    assert (p.n_q, p.n_k, p.d_model, p.d_k, p.d_v) == (2, 3, 2, 1, 2)
    assert p.tokens == ("x", "y")
    assert p.key_tokens == ("a", "b", "c")
    assert p.mask.allowed == ((T, F, F), (T, T, F))
    assert p.context == M([[1, 0, 0], [0, 1, 0], [0, 0, 1]])


def test_context_without_tokens_gets_c_labels():
    p = ok("X: [[1]]\ncontext: [[1], [2]]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n")
    assert p.tokens == ("t_1",)
    assert p.key_tokens == ("c_1", "c_2")


def test_yaml_anchor_and_alias_are_followed():
    p = ok("Q: &w [[1, 2]]\nK: *w\nV: [[3]]\n")
    assert p.K == M([[1, 2]])


def test_title_tokens_and_defaults():
    p = ok(QKV3 + "title: '50% & more: x_1'\ntokens: [yes, no, 'on']\n", "some_file-name.yaml")
    assert p.title == "50% & more: x_1"  # kept verbatim; escaping is the renderer's job
    assert p.tokens == ("yes", "no", "on")  # labels are text, not YAML booleans
    q = ok(QKV3, "causal_4_tokens.yaml")
    assert q.title == "Causal 4 tokens"
    assert q.tokens == ("t_1", "t_2", "t_3")
    assert ok(QKV3, "<problem>").title == "Scaled dot-product attention"
    assert ok(QKV3 + "title: 42\n").title == "42"
    assert ok(QKV3 + "tokens: [1, 2, 3]\n").tokens == ("1", "2", "3")


# --------------------------------------------------------------------------
# Masks: allowed[i][j] for query i, key j (0-based), worked out by hand
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask_line", "kind", "window", "allowed"),
    [
        ("", "none", None, ((T, T, T), (T, T, T), (T, T, T))),
        ("mask: none\n", "none", None, ((T, T, T), (T, T, T), (T, T, T))),
        ("mask: causal\n", "causal", None, ((T, F, F), (T, T, F), (T, T, T))),
        # n_q = n_k: bottom-right equals top-left
        ("mask: causal-bottom-right\n", "causal-bottom-right", None, ((T, F, F), (T, T, F), (T, T, T))),
        # causal and i − j < 2
        ("mask: {sliding-window: 2}\n", "sliding-window", 2, ((T, F, F), (T, T, F), (F, T, T))),
        ("mask:\n  sliding-window: 1\n", "sliding-window", 1, ((T, F, F), (F, T, F), (F, F, T))),
        ("mask: {sliding-window: 3}\n", "sliding-window", 3, ((T, F, F), (T, T, F), (T, T, T))),
        ("mask: [[1, 0, 1], [0, 1, 0], [1, 1, 0]]\n", "matrix", None, ((T, F, T), (F, T, F), (T, T, F))),
        (
            "mask: [[true, false, false], [false, true, true], [true, true, true]]\n",
            "matrix",
            None,
            ((T, F, F), (F, T, T), (T, T, T)),
        ),
        (
            "mask:\n  - [True, False, 1]\n  - [0, yes, off]\n  - [\"1\", \"0\", on]\n",
            "matrix",
            None,
            ((T, F, T), (F, T, F), (T, F, T)),
        ),
    ],
)
def test_masks_3x3(mask_line, kind, window, allowed):
    p = ok(QKV3 + mask_line)
    assert isinstance(p.mask, Mask)
    assert p.mask.kind == kind
    assert p.mask.window == window
    assert p.mask.allowed == allowed
    assert isinstance(p.mask.rule(), str) and p.mask.rule()


@pytest.mark.parametrize(
    ("mask_line", "allowed"),
    [
        ("mask: none\n", ((T, T, T), (T, T, T))),
        # top-left aligned (PyTorch is_causal=True): j ≤ i
        ("mask: causal\n", ((T, F, F), (T, T, F))),
        # bottom-right aligned: j ≤ i + (n_k − n_q) = i + 1
        ("mask: causal-bottom-right\n", ((T, T, F), (T, T, T))),
        ("mask: {sliding-window: 2}\n", ((T, F, F), (T, T, F))),
        ("mask: {sliding-window: 1}\n", ((T, F, F), (F, T, F))),
        ("mask: [[0, 1, 0], [1, 0, 1]]\n", ((F, T, F), (T, F, T))),
    ],
)
def test_masks_2x3(mask_line, allowed):
    p = ok(QKV23 + mask_line)
    assert (p.n_q, p.n_k) == (2, 3)
    assert p.mask.allowed == allowed


def test_bias_with_neg_inf_is_allowed():
    text = QKV3 + "bias: [[0, -inf, '-inf'], [-.inf, 0, \"1/2\"], [0.5, -1, 0]]\n"
    p = ok(text)
    ninf = sympy.S.NegativeInfinity
    assert p.bias == M([[0, ninf, ninf], [ninf, 0, Rational(1, 2)], [Rational(1, 2), -1, 0]])


def test_bias_and_mask_together_leaving_one_key_is_fine():
    p = ok(QKV3 + "mask: causal\nbias: [[0, 0, 0], [-inf, 0, 0], [-inf, -inf, 0]]\n")
    assert p.mask.kind == "causal"


# --------------------------------------------------------------------------
# scale and digits
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scale_line", "scale", "value"),
    [
        ("", "auto", 1 / sqrt(2)),
        ("scale: auto\n", "auto", 1 / sqrt(2)),
        ("scale: none\n", "none", Integer(1)),
        ("scale: '1/2'\n", Rational(1, 2), Rational(1, 2)),
        ("scale: 1/2\n", Rational(1, 2), Rational(1, 2)),
        ("scale: 0.125\n", Rational(1, 8), Rational(1, 8)),
        ("scale: 3\n", Integer(3), Integer(3)),
        ("scale: \"sqrt(2)\"\n", sqrt(2), sqrt(2)),
        ("scale: 1e-3\n", Rational(1, 1000), Rational(1, 1000)),
    ],
)
def test_scale(scale_line, scale, value):
    p = ok("Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1]]\n" + scale_line)  # d_k = 2
    assert p.scale == scale
    assert p.scale_value == value
    if isinstance(scale, sympy.Rational):
        assert isinstance(p.scale, sympy.Rational)


def test_scale_auto_is_exact_for_d_k_4():
    p = ok("Q: [[1, 0, 0, 0]]\nK: [[1, 0, 0, 0]]\nV: [[1]]\n")
    assert p.scale_value == Rational(1, 2)


@pytest.mark.parametrize(("line", "digits"), [("", 4), ("digits: 1\n", 1), ("digits: 12\n", 12), ("digits: 50\n", 50)])
def test_digits(line, digits):
    assert ok(QKV3 + line).digits == digits


# --------------------------------------------------------------------------
# Matrices from files
# --------------------------------------------------------------------------


def write_problem(tmp_path: Path, body: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def test_matrix_from_csv_is_exact(tmp_path):
    (tmp_path / "m.csv").write_text("0.1, 2\n-2.50,1e-3\n\n", encoding="utf-8")
    p = load_problem(write_problem(tmp_path, "X: {file: m.csv}\n" + W2))
    assert p.X == M([[Rational(1, 10), 2], [Rational(-5, 2), Rational(1, 1000)]])
    assert all(isinstance(v, sympy.Rational) for v in p.X)


def test_matrix_from_npy_floats_are_exact_dyadic_rationals(tmp_path):
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "m.npy", np.array([[0.1, 0.5], [-2.0, 3.25]]))
    np.save(tmp_path / "f32.npy", np.array([[0.1]], dtype=np.float32))
    p = load_problem(write_problem(tmp_path, "X: {file: m.npy}\n" + W2))
    assert p.X[0, 0] == Rational(3602879701896397, 36028797018963968)
    assert p.X[0, 0] != Rational(1, 10)
    assert p.X == M([[Rational(3602879701896397, 36028797018963968), Rational(1, 2)], [-2, Rational(13, 4)]])
    assert all(isinstance(v, sympy.Rational) for v in p.X)
    q = load_problem(write_problem(tmp_path, "Q: {file: f32.npy}\nK: [[1]]\nV: [[1]]\n", "q.yaml"))
    assert q.Q[0, 0] == Rational(13421773, 134217728)  # float32(0.1) = 13421773 / 2**27


def test_matrix_from_npy_integers(tmp_path):
    np = pytest.importorskip("numpy")
    np.save(tmp_path / "i.npy", np.array([[1, 2], [3, -4]], dtype=np.int64))
    p = load_problem(write_problem(tmp_path, "X: {file: i.npy}\n" + W2))
    assert p.X == M([[1, 2], [3, -4]])
    assert all(isinstance(v, sympy.Integer) for v in p.X)


def test_matrix_file_in_subfolder(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "k.csv").write_text("1,0\n0,1\n", encoding="utf-8")
    p = load_problem(write_problem(tmp_path, "Q: [[1, 1]]\nK: {file: data/k.csv}\nV: [[1], [2]]\n"))
    assert p.K == M([[1, 0], [0, 1]])


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("../outside.csv", "'../outside.csv' must be a path inside the problem's folder (no absolute paths, no ..)"),
        ("sub/../../outside.csv", "must be a path inside the problem's folder (no absolute paths, no ..)"),
        ("ABSOLUTE", "must be a path inside the problem's folder (no absolute paths, no ..)"),
        ("link.csv", "'link.csv' leaves the problem's folder"),
        ("missing.csv", "cannot read 'missing.csv': No such file or directory"),
        ("missing.npy", "cannot read 'missing.npy' as a .npy file"),
        ("m.txt", "'m.txt': a matrix file must end in .npy, .csv or .safetensors"),
        ("ragged.csv", "'ragged.csv' line 2 has 1 entries but line 1 has 2"),
        ("fraction.csv", "'fraction.csv' line 1: '1/3' is not a decimal number"),
        ("nan.csv", "'nan.csv' line 1: 'nan' is not a decimal number"),
        ("empty.csv", "'empty.csv' holds no numbers"),
        ("nan.npy", "'nan.npy' holds NaN or infinite values"),
        ("bool.npy", "'bool.npy' holds bool values; expected integers or floats"),
        ("vector.npy", "'vector.npy' holds a 1-dimensional array of shape (2,); a matrix is 2-dimensional"),
    ],
)
def test_matrix_file_errors(tmp_path, name, fragment):
    np = pytest.importorskip("numpy")
    folder = tmp_path / "prob"
    folder.mkdir()
    outside = tmp_path / "outside.csv"
    outside.write_text("1,0\n0,1\n", encoding="utf-8")
    os.symlink(outside, folder / "link.csv")
    (folder / "m.txt").write_text("1,0\n0,1\n", encoding="utf-8")
    (folder / "ragged.csv").write_text("1,2\n3\n", encoding="utf-8")
    (folder / "fraction.csv").write_text("1,1/3\n", encoding="utf-8")
    (folder / "nan.csv").write_text("nan,1\n", encoding="utf-8")
    (folder / "empty.csv").write_text("\n \n", encoding="utf-8")
    np.save(folder / "nan.npy", np.array([[np.nan, 1.0]]))
    np.save(folder / "bool.npy", np.array([[True, False]]))
    np.save(folder / "vector.npy", np.array([1.0, 2.0]))
    if name == "ABSOLUTE":
        name = str(outside)
        fragment = repr(name) + " " + fragment
    # "X: {file: " is 10 characters, so the file name starts in column 11
    path = write_problem(folder, f"X: {{file: {name}}}\n" + W2)
    with pytest.raises(SymattnError) as info:
        load_problem(path)
    assert_at(info.value, 1, 11, "X", file=str(path))
    assert fragment in info.value.message


def test_matrix_file_needs_a_problem_file():
    err = fail("X: {file: m.csv}\n" + W2)
    assert_at(err, 1, 11, "X")
    assert err.message == "matrices from files need the problem to be read from a file"


def test_matrix_mapping_must_be_file_only(tmp_path):
    err = fail("Q: {rows: 2}\nK: [[1]]\nV: [[1]]\n")
    assert_at(err, 1, 4, "Q")
    assert "a matrix is a list of rows, or {file: NAME} naming a .npy, .csv or .safetensors file" in err.message
    err = fail("Q: {file: ~}\nK: [[1]]\nV: [[1]]\n")
    assert_at(err, 1, 11, "Q")  # "Q: {file: " is 10 characters
    assert err.message == "file: needs a file name"


# --------------------------------------------------------------------------
# load_problem: paths and text
# --------------------------------------------------------------------------


def test_load_problem_from_str_path_and_path(tmp_path):
    path = write_problem(tmp_path, QKV3 + "mask: causal\n", "my_problem.yaml")
    for source in (path, str(path)):
        p = load_problem(source)
        assert p.title == "My problem"
        assert p.source == str(path)
        assert p.mask.kind == "causal"


def test_load_problem_from_text():
    p = load_problem("Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nmask: causal\n")
    assert (p.n_q, p.n_k, p.d_k) == (1, 2, 2)
    assert p.mask.allowed == ((T, F),)
    assert p.source == "<problem>"
    p = load_problem("{Q: [[1]], K: [[1]], V: [[1]]}")
    assert p.Q == M([[1]])
    with pytest.raises(SymattnError) as info:
        load_problem("Q: [[abc]]\nK: [[1]]\nV: [[1]]\n")
    assert_at(info.value, 1, 6, "Q row 1, column 1", file="<problem>")


def test_load_problem_missing_file_and_folder(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SymattnError) as info:
        load_problem(missing)
    assert str(info.value) == f"{missing}: no such file"
    with pytest.raises(SymattnError) as info:
        load_problem(tmp_path)
    assert str(info.value) == f"{tmp_path}: is a folder, not a problem file"


def test_load_problem_bad_bytes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"Q: [[\xff]]\n")
    with pytest.raises(SymattnError) as info:
        load_problem(bad)
    assert str(info.value) == f"{bad}: the file is not UTF-8 text (bad byte at offset 5)"
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"Q: [[1]]\x00\n")
    with pytest.raises(SymattnError) as info:
        load_problem(nul)
    assert str(info.value) == f"{nul}: the file holds a NUL byte; it is not a text file"


def test_load_problem_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes("\ufeffQ: [[1]]\nK: [[1]]\nV: [[1]]\n".encode("utf-8"))
    assert load_problem(path).Q == M([[1]])


def test_load_problem_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_bytes(b"")
    with pytest.raises(SymattnError) as info:
        load_problem(path)
    err = info.value
    assert (err.line, err.col, err.field) == (None, None, None)
    assert str(err) == f"{path}: the file is empty; a problem needs at least X and the weights, or Q, K and V"


# ==========================================================================
# Errors: FILE:LINE:COL: FIELD: message
# ==========================================================================


def test_spec_example_error_position():
    text = (
        "title: spec example\n"  # 1
        "X:\n"  # 2
        "  - [1, 0]\n"  # 3
        "  - [0, 1]\n"  # 4
        "W_K: [[1], [0]]\n"  # 5
        "W_V: [[1], [0]]\n"  # 6
        "W_Q: [[1],[abc]]\n"  # 7: 'abc' starts at column 12
    )
    err = fail(text, "example.yaml")
    assert_at(err, 7, 12, "W_Q row 2, column 1", file="example.yaml")
    assert str(err).startswith("example.yaml:7:12: W_Q row 2, column 1: ")
    assert "'abc' is not a number or a declared symbol" in err.message


# Entry under test sits in "Q: [[1, ENTRY]]": "Q: [[1, " is 8 characters, so column 9.
@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        (".nan", "'.nan' (not a number) is not allowed; write an exact number"),
        ("nan", "'nan' (not a number) is not allowed; write an exact number"),
        (".NaN", "'.NaN' (not a number) is not allowed"),
        ("NaN", "'NaN' (not a number) is not allowed"),
        ("inf", "'inf' is not a finite number"),
        (".inf", "'.inf' is not a finite number"),
        ("-inf", "-inf is only allowed in a mask or bias matrix"),
        ("-.inf", "-inf is only allowed in a mask or bias matrix"),
        ('"-inf"', "-inf is only allowed in a mask or bias matrix"),
        ("true", "'true' is a boolean, not a number"),
        ("false", "'false' is a boolean, not a number"),
        ("True", "'True' is a boolean, not a number"),
        ("yes", "'yes' is a boolean, not a number"),
        ("off", "'off' is a boolean, not a number"),
        ("'true'", "'true' is not a number or a declared symbol"),
        ("abc", "'abc' is not a number or a declared symbol"),
        ("e", "write exp(1) for e"),
        ('"(1).real"', "attribute access (.) is not allowed in a number"),
        ('"lambda: 1"', "a lambda is not allowed in a number"),
        ('"sin(1)"', "the function sin is not allowed (only sqrt, exp, log)"),
        ('"floor(1/2)"', "the function floor is not allowed (only sqrt, exp, log)"),
        ("1+1j", "a complex number is not allowed in a number"),
        ("1j", "a complex number is not allowed in a number"),
        ('"log(-1)"', "is not a real number"),
        ('"sqrt(-1)"', "is not a real number"),
        ("1/0", "division by zero"),
        ('"log(0)"', "log(0) is not a finite number"),
        ("10**10**10", "the exponent 10000000000 is too large (at most 1000)"),
        ("~", "the entry is empty; write a number"),
        ("null", "the entry is empty; write a number"),
        ('""', "the entry is empty; write a number"),
        ("' '", "the entry is empty; write a number"),
        ("[1]", "expected a number, not a list"),
        ("{a: 1}", "expected a number, not a mapping"),
        ("0x10", "is not a decimal number"),
    ],
)
def test_bad_entries_name_file_line_col_and_field(entry, fragment):
    start = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    err = fail(f"Q: [[1, {entry}]]\nK: [[1, 1]]\nV: [[1]]\n")
    assert time.process_time() - start < 2.0
    assert_at(err, 1, 9, "Q row 1, column 2")
    assert fragment in err.message


def test_bad_entry_in_block_matrix_position():
    text = (
        "X:\n"  # 1
        "  - [1, 0]\n"  # 2
        "  - [0, .nan]\n"  # 3: "  - [0, " is 8 characters -> column 9
        + W2
    )
    err = fail(text)
    assert_at(err, 3, 9, "X row 2, column 2")
    assert "'.nan' (not a number) is not allowed" in err.message


def test_neg_inf_in_weights_rejected_but_in_bias_allowed():
    err = fail("X: [[1, 0]]\nW_Q: [[1], [-inf]]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\n")
    # "W_Q: [[1], [" is 12 characters -> column 13
    assert_at(err, 2, 13, "W_Q row 2, column 1")
    assert "-inf is only allowed in a mask or bias matrix" in err.message
    assert ok(QKV3 + "bias: [[0, 0, -inf], [0, 0, 0], [0, 0, 0]]\n").bias[0, 2] == sympy.S.NegativeInfinity


def test_bias_entries_still_checked():
    err = fail(QKV3 + "bias: [[0, 0, 0], [0, nan, 0], [0, 0, 0]]\n")
    # line 4: "bias: [[0, 0, 0], [0, " is 22 characters -> column 23
    assert_at(err, 4, 23, "bias row 2, column 2")
    assert "'nan' (not a number) is not allowed" in err.message
    err = fail(QKV3 + "bias: [[0, 0, 0], [0, .inf, 0], [0, 0, 0]]\n")
    assert_at(err, 4, 23, "bias row 2, column 2")
    assert "'.inf' is not a finite number" in err.message


# --------------------------------------------------------------------------
# Injection: nothing in a problem file runs code
# --------------------------------------------------------------------------


def test_injection_entry_is_rejected_and_runs_nothing(tmp_path):
    marker = tmp_path / "symattn_pwned_entry"
    text = f"Q: [[\"__import__('os').system('touch {marker}')\"]]\nK: [[1]]\nV: [[1]]\n"
    err = fail(text)
    assert_at(err, 1, 6, "Q row 1, column 1")
    assert "attribute access (.) cannot be called (only sqrt, exp, log)" in err.message
    assert not marker.exists()


def test_injection_entry_from_file_runs_nothing(tmp_path):
    marker = tmp_path / "symattn_pwned_file"
    path = write_problem(
        tmp_path, f"Q: [[1]]\nK: [[1]]\nV:\n  - [\"__import__('os').system('touch {marker}')\"]\n"
    )
    with pytest.raises(SymattnError) as info:
        load_problem(path)
    assert_at(info.value, 4, 6, "V row 1, column 1", file=str(path))
    assert not marker.exists()


def test_lambda_call_entry_is_rejected():
    err = fail('Q: [["(lambda: 1)()"]]\nK: [[1]]\nV: [[1]]\n')
    assert_at(err, 1, 6, "Q row 1, column 1")
    assert "a lambda cannot be called (only sqrt, exp, log)" in err.message


@pytest.mark.parametrize(
    ("template", "line", "col", "tag"),
    [
        # the tag on X's value: "X: " is 3 characters -> column 4
        ('X: !!python/object/apply:os.system ["touch {m}"]\n', 1, 4, "!!python/object/apply:os.system"),
        # the whole document is the tagged node
        ('!!python/object/apply:os.system ["touch {m}"]\n', 1, 1, "!!python/object/apply:os.system"),
        # inside a matrix: "Q: [[1, " is 8 characters -> column 9
        ('Q: [[1, !!python/object/apply:os.system ["touch {m}"]]]\nK: [[1, 1]]\nV: [[1]]\n', 1, 9,
         "!!python/object/apply:os.system"),
        ('Q: [[1]]\nK: [[1]]\nV: [[1]]\ntitle: !!python/object/new:os.system ["touch {m}"]\n', 4, 8,
         "!!python/object/new:os.system"),
        ('Q: [[1]]\nK: [[1]]\nV: [[1]]\ntitle: !!python/name:os.system ""\n', 4, 8, "!!python/name:os.system"),
        ('Q: [[1]]\nK: [[1]]\nV: [[1]]\ntitle: !custom "touch {m}"\n', 4, 8, "!custom"),
    ],
)
def test_yaml_python_tags_are_rejected_and_run_nothing(tmp_path, template, line, col, tag):
    marker = tmp_path / "symattn_pwned_tag"
    err = fail(template.format(m=marker))
    assert_at(err, line, col)
    assert err.message == (
        f"the YAML tag {tag!r} is not allowed; problem files hold plain numbers, strings, lists and mappings"
    )
    assert not marker.exists()


def test_yaml_python_tag_in_file_runs_nothing(tmp_path):
    marker = tmp_path / "symattn_pwned_tagfile"
    path = write_problem(tmp_path, f'X: !!python/object/apply:os.system ["touch {marker}"]\n')
    with pytest.raises(SymattnError) as info:
        load_problem(path)
    assert_at(info.value, 1, 4, file=str(path))
    assert not marker.exists()


# --------------------------------------------------------------------------
# Matrix structure
# --------------------------------------------------------------------------


def test_ragged_rows():
    text = (
        "X:\n"  # 1
        "  - [1, 2]\n"  # 2
        "  - [3]\n"  # 3: the row starts at "[" in column 5
        + W2
    )
    err = fail(text)
    assert_at(err, 3, 5, "X row 2")
    assert err.message == "row 2 has 1 entries but row 1 has 2; every row needs the same length"


def test_ragged_rows_flow_style():
    # "Q: [[1, 2], " is 12 characters -> row 1 starts in column 13
    err = fail("Q: [[1, 2], [3, 4, 5]]\nK: [[1, 2]]\nV: [[1]]\n")
    assert_at(err, 1, 13, "Q row 2")
    assert "row 2 has 3 entries but row 1 has 2" in err.message


def test_single_row_without_outer_brackets():
    err = fail("Q: [1, 2]\nK: [[1, 2]]\nV: [[1]]\n")
    assert_at(err, 1, 5, "Q row 1")
    assert err.message == "row 1 must be a list of numbers, not '1' (a single row is written [[...]])"


def test_matrix_not_a_list():
    err = fail("Q: 5\nK: [[1]]\nV: [[1]]\n")
    assert_at(err, 1, 4, "Q")
    assert "a matrix is a list of rows such as [[1, 0], [0, 1]], not '5'" in err.message
    err = fail("Q: []\nK: [[1]]\nV: [[1]]\n")
    assert_at(err, 1, 4, "Q")
    assert err.message == "the matrix is empty; it needs at least one row"
    err = fail("Q: [[1]]\nK: [[]]\nV: [[1]]\n")
    assert_at(err, 2, 5, "K row 1")
    assert err.message == "the row is empty"


# --------------------------------------------------------------------------
# Shapes, checked before any arithmetic
# --------------------------------------------------------------------------


def test_shape_x_w_q_message_of_the_spec():
    text = (
        "X: [[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]]\n"  # 1: X is 4×3
        "W_Q: [[1, 0], [0, 1]]\n"  # 2: W_Q is 2×2
        "W_K: [[1, 0], [0, 1], [1, 1]]\n"
        "W_V: [[1], [0], [1]]\n"
    )
    err = fail(text)
    assert_at(err, 2, 1, "W_Q")
    assert err.message == "X is 4×3 but W_Q is 2×2: X·W_Q needs W_Q to have 3 rows"
    assert str(err) == "p.yaml:2:1: W_Q: X is 4×3 but W_Q is 2×2: X·W_Q needs W_Q to have 3 rows"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "X: [[1, 2]]\nW_Q: [[1], [2]]\nW_K: [[1], [2], [3]]\nW_V: [[1], [2]]\n",
            3,
            "X is 1×2 but W_K is 3×1: X·W_K needs W_K to have 2 rows",
        ),
        (
            "X: [[1, 2]]\nW_Q: [[1], [2]]\nW_K: [[1], [2]]\nW_V: [[1]]\n",
            4,
            "X is 1×2 but W_V is 1×1: X·W_V needs W_V to have 2 rows",
        ),
        (
            "X: [[1, 2]]\nW_Q: [[1], [2]]\nW_K: [[1, 0], [2, 0]]\nW_V: [[1], [2]]\n",
            3,
            "W_Q is 2×1 but W_K is 2×2: Q·Kᵀ needs W_Q and W_K to have the same number of columns (d_k)",
        ),
        (
            "X: [[1, 2]]\ncontext: [[1, 2, 3]]\nW_Q: [[1], [2]]\nW_K: [[1], [2]]\nW_V: [[1], [2], [3]]\n",
            4,
            "context is 1×3 but W_K is 2×1: context·W_K needs W_K to have 3 rows",
        ),
        (
            "Q: [[1, 0]]\nK: [[1, 0, 0]]\nV: [[1]]\n",
            2,
            "Q is 1×2 but K is 1×3: Q·Kᵀ needs Q and K to have the same number of columns (d_k)",
        ),
        (
            "Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1], [2]]\n",
            3,
            "K is 1×2 but V is 2×1: each key needs one value row: K and V need the same number of rows",
        ),
    ],
)
def test_shape_mismatches(text, line, message):
    err = fail(text)
    second_operand = message.split(" but ")[1].split(" is ")[0]  # the field whose shape is wrong
    assert_at(err, line, 1, second_operand)
    assert err.message == message


def test_bias_shape_mismatch():
    err = fail(QKV3 + "bias: [[0, 0]]\n")
    assert_at(err, 4, 7, "bias")
    assert err.message == "bias is 1×2 but the scores are 3×3: bias needs one entry per query and key"


def test_mask_shape_mismatch():
    err = fail(QKV3 + "mask: [[1, 0], [1, 1]]\n")
    assert_at(err, 4, 7, "mask")
    assert err.message == "the mask is 2×2 but the scores are 3×3"


# --------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("W_q", "unknown field 'W_q' (did you mean 'W_Q'?)"),
        ("w_k", "unknown field 'w_k' (did you mean 'W_K'?)"),
        ("x", "unknown field 'x' (did you mean 'X'?)"),
        ("tokns", "unknown field 'tokns' (did you mean 'tokens'?)"),
        ("Mask", "unknown field 'Mask' (did you mean 'mask'?)"),
        ("scael", "unknown field 'scael' (did you mean 'scale'?)"),
        ("foo", "unknown field 'foo'"),
        ("1", "unknown field '1'"),
    ],
)
def test_unknown_field_with_did_you_mean(name, message):
    err = fail(QKV3 + f"{name}: [[1]]\n")
    assert_at(err, 4, 1)
    assert err.message == message


def test_field_name_must_be_a_word():
    err = fail(QKV3 + "~: 1\n")
    assert_at(err, 4, 1)
    assert err.message == "a field name must be a plain word such as X or W_Q"


def test_field_given_twice():
    text = "Q: [[1]]\nK: [[1]]\nV: [[1]]\nQ: [[2]]\n"
    err = fail(text)
    assert_at(err, 4, 1)
    assert err.message == "the field 'Q' is given twice (first at line 1)"
    err = fail("# comment\nX: [[1]]\nW_Q: [[1]]\nX: [[2]]\n")
    assert_at(err, 4, 1)
    assert err.message == "the field 'X' is given twice (first at line 2)"


def test_q_k_v_mixed_with_x():
    text = "X: [[1]]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\nQ: [[1]]\n"
    err = fail(text)
    assert_at(err, 5, 1)  # at the Q key
    assert err.message == "give either X with W_Q, W_K, W_V or Q, K, V directly, not both (X is also given)"
    err = fail("Q: [[1]]\nK: [[1]]\nV: [[1]]\nW_K: [[1]]\n")
    assert_at(err, 1, 1)
    assert err.message == "give either X with W_Q, W_K, W_V or Q, K, V directly, not both (W_K is also given)"


def test_missing_w_v():
    err = fail("X: [[1]]\nW_Q: [[1]]\nW_K: [[1]]\n")
    assert_at(err, 1, 1)
    assert err.message == "W_V is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly"
    # the document (and so the error) starts at the first key, after the comment line
    err = fail("# my problem\nX: [[1]]\nW_Q: [[1]]\nW_K: [[1]]\n")
    assert_at(err, 2, 1)
    assert err.message.startswith("W_V is missing")


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("W_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n", "X"),
        ("X: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n", "W_Q"),
        ("X: [[1]]\nW_Q: [[1]]\nW_V: [[1]]\n", "W_K"),
        ("title: only a title\n", "X"),
    ],
)
def test_missing_projection_fields(text, missing):
    err = fail(text)
    assert_at(err, 1, 1)
    assert err.message == f"{missing} is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly"


@pytest.mark.parametrize(("text", "missing"), [("Q: [[1]]\nV: [[1]]\n", "K"), ("K: [[1]]\nQ: [[1]]\n", "V")])
def test_missing_direct_fields(text, missing):
    err = fail(text)
    assert_at(err, 1, 1)
    assert err.message == f"Q, K and V go together: {missing} is missing"


def test_tokens_wrong_length():
    err = fail("tokens: [The, cat]\n" + QKV3)  # "tokens: " is 8 characters -> column 9
    assert_at(err, 1, 9, "tokens")
    assert err.message == "tokens has 2 labels but Q has 3 rows"
    err = fail("X: [[1, 0], [0, 1]]\n" + W2 + "tokens: [a, b, c]\n")
    assert_at(err, 5, 9, "tokens")
    assert err.message == "tokens has 3 labels but X has 2 rows"


def test_tokens_must_be_a_list_of_words():
    err = fail(QKV3 + "tokens: a b c\n")
    assert_at(err, 4, 9, "tokens")
    assert "tokens must be a list of labels such as [The, cat, sat], not 'a b c'" in err.message
    err = fail(QKV3 + "tokens: [a, ~, c]\n")  # "tokens: [a, " is 12 characters -> column 13
    assert_at(err, 4, 13, "tokens item 2")
    assert err.message == "a label must be a word, not empty"


def test_context_tokens_without_context():
    err = fail(QKV3 + "context_tokens: [a, b, c]\n")
    assert_at(err, 4, 1)
    assert err.message == "context_tokens label the rows of context, which is not given"


def test_context_tokens_wrong_length():
    text = "X: [[1]]\ncontext: [[1], [2]]\ncontext_tokens: [a]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n"
    err = fail(text)
    assert_at(err, 3, 17, "context_tokens")  # "context_tokens: " is 16 characters
    assert err.message == "context_tokens has 1 label but context has 2 rows"


def test_title_must_be_text():
    err = fail(QKV3 + "title: [a, b]\n")
    assert_at(err, 4, 8, "title")
    assert err.message == "the title must be text, not a list"
    err = fail(QKV3 + "title:\n")
    assert err.field == "title" and err.line == 4
    assert err.message == "the title must be text, not empty"


# --------------------------------------------------------------------------
# YAML documents
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "col", "message"),
    [
        # the flow list on line 1 is never closed; the parser notices at "W_Q" (2:1)
        ("X: [[1, 2]\nW_Q: [[1]]\n", 2, 1, "invalid YAML: expected ',' or ']', but got '<scalar>'"),
        # "X: [[1, " is 8 characters: the second comma is in column 9
        ("X: [[1, , 2]]\n", 1, 9, "invalid YAML: expected the node content, but found ','"),
        # "X: a" then ":" in column 5
        ("X: a: b\n", 1, 5, "invalid YAML: mapping values are not allowed here"),
        ("X:\n\t- [1]\n", 2, 1, "invalid YAML: found character '\\t' that cannot start any token"),
        # a second document starts at "---" on line 2
        ("Q: [[1]]\n---\nK: [[1]]\n", 2, 1, "invalid YAML: the file holds more than one YAML document"),
    ],
)
def test_yaml_syntax_errors_have_line_and_col(text, line, col, message):
    err = fail(text)
    assert_at(err, line, col)
    assert err.message.startswith(message), err.message


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("- [1]\n- [2]\n", "a list"),
        ("[[1, 0], [0, 1]]\n", "a list"),
        ("hello\n", "'hello'"),
        ("42\n", "'42'"),
    ],
)
def test_document_must_be_a_mapping(text, what):
    err = fail(text)
    assert_at(err, 1, 1)
    assert err.message == f"a problem file is a mapping of fields (X:, W_Q:, ...), not {what}"


@pytest.mark.parametrize("text", ["", "\n", "# just a comment\n", "  \n\n"])
def test_empty_document(text):
    err = fail(text, "empty.yaml")
    assert (err.file, err.line, err.col, err.field) == ("empty.yaml", None, None, None)
    assert str(err) == "empty.yaml: the file is empty; a problem needs at least X and the weights, or Q, K and V"


def test_document_with_only_a_marker_is_not_a_problem():
    err = fail("---\n")
    assert isinstance(err, SymattnError)
    assert err.file == "p.yaml"


def test_nul_byte_in_text():
    err = fail("Q: [[1]]\x00\n")
    assert str(err) == "p.yaml: the file holds a NUL byte; it is not a text file"


# --------------------------------------------------------------------------
# Mask errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("casual", " (did you mean 'causal'?)"),
        ("Causal", " (did you mean 'causal'?)"),
        ("causal-bottom-left", " (did you mean 'causal-bottom-right'?)"),
        ("None", " (did you mean 'none'?)"),
        ("diagonal", ""),
    ],
)
def test_unknown_mask_word_did_you_mean(word, hint):
    err = fail(QKV3 + f"mask: {word}\n")
    assert_at(err, 4, 7, "mask")  # "mask: " is 6 characters
    assert err.message == (
        f"unknown mask {word!r}{hint}; use none, causal, causal-bottom-right, {{sliding-window: w}}, "
        "{padding: [1, 1, 0]}, {valid-length: n}, a list of these or a 0/1 matrix"
    )


def test_unknown_mask_mapping_did_you_mean():
    err = fail(QKV3 + "mask: {sliding_window: 2}\n")
    assert_at(err, 4, 8, "mask")  # the key inside "{" starts in column 8
    assert err.message == ("unknown mask 'sliding_window' (did you mean 'sliding-window'?); the mapping forms are "
                           "{sliding-window: w}, {sink: k, window: w}, {padding: [1, 1, 0]} and {valid-length: n}")


@pytest.mark.parametrize("w", ["0", "-1", "two", "1.5", "'2'", "~"])
def test_sliding_window_must_be_positive_whole_number(w):
    err = fail(QKV3 + f"mask: {{sliding-window: {w}}}\n")
    assert_at(err, 4, 24, "mask")  # "mask: {sliding-window: " is 23 characters
    assert err.message.startswith("the window must be a whole number ≥ 1, not ")


def test_mask_entry_must_be_0_1_or_bool():
    err = fail(QKV3 + "mask: [[1, 2, 0], [1, 1, 1], [1, 1, 1]]\n")
    assert_at(err, 4, 12, "mask row 1, column 2")  # "mask: [[1, " is 11 characters
    assert err.message == "a mask entry is 1 (may attend) or 0 (may not), or true/false, not '2'"
    err = fail(QKV3 + "mask: [[1, 0, 0], [1, 1, 0], [1, 1, -inf]]\n")
    assert_at(err, 4, 37, "mask row 3, column 3")  # "mask: [[1, 0, 0], [1, 1, 0], [1, 1, " is 36 characters
    assert "not '-inf'" in err.message


def test_mask_from_file_rejected():
    err = fail(QKV3 + "mask: {file: m.csv}\n")
    assert_at(err, 4, 7, "mask")
    assert err.message == "a mask is a word or a 0/1 matrix written in the file"


def test_mask_empty_value():
    err = fail(QKV3 + "mask:\n")
    assert err.field == "mask" and err.line == 4
    assert "the mask must be none, causal, causal-bottom-right, {sliding-window: w} or a 0/1 matrix, not empty" in err.message


def test_fully_masked_row_is_an_error_naming_the_row():
    text = QKV3 + (
        "mask:\n"  # 4
        "  - [1, 0, 0]\n"  # 5: the mask's list starts at "-" in column 3
        "  - [0, 0, 0]\n"  # 6: row 2 lets query 2 attend to nothing
        "  - [1, 1, 1]\n"  # 7
    )
    err = fail(text)
    assert_at(err, 5, 3, "mask")
    assert "row 2 with no key to attend to" in err.message
    assert "0/0" in err.message


def test_fully_masked_row_flow_style_false_row():
    err = fail(QKV3 + "mask: [[true, false, false], [true, true, true], [false, false, false]]\n")
    assert_at(err, 4, 7, "mask")
    assert "row 3 with no key to attend to" in err.message


def test_causal_bottom_right_with_more_queries_than_keys_leaves_row_0_empty():
    # n_q = 3, n_k = 2: query 0 may attend to j ≤ 0 + (2 − 3) = −1, i.e. to nothing
    err = fail("Q: [[1], [2], [3]]\nK: [[1], [2]]\nV: [[1], [2]]\nmask: causal-bottom-right\n")
    assert_at(err, 4, 7, "mask")
    assert "row 1 with no key to attend to" in err.message


def test_bias_row_all_neg_inf_is_an_error_naming_the_row():
    err = fail(QKV3 + "mask: causal\nbias: [[0, 0, 0], [-inf, -inf, 0], [0, 0, 0]]\n")
    # row 1 under causal allows keys 0 and 1, both -inf in the bias
    assert_at(err, 5, 7, "bias")
    assert "the mask and bias together leave row 2 with no key to attend to" in err.message
    err = fail(QKV3 + "bias: [[-inf, -inf, -inf], [0, 0, 0], [0, 0, 0]]\n")
    assert_at(err, 4, 7, "bias")
    assert "row 1 with no key to attend to" in err.message


# --------------------------------------------------------------------------
# scale and digits errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "scale must be positive, not 0"),
        ("0.0", "scale must be positive, not 0"),
        ("-1", "scale must be positive, not -1"),
        ("-1/2", "scale must be positive, not -1/2"),
        ('"1 - sqrt(2)"', "scale must be positive, not 1 - sqrt(2)"),
        ("[1]", "scale must be auto, none or a number, not a list"),
        ("{a: 1}", "scale must be auto, none or a number, not a mapping"),
        ("~", "the entry is empty; write a number"),
        ("abc", "'abc' is not a number or a declared symbol"),
        ("Auto", "'Auto' is not a number or a declared symbol"),
        ("-inf", "-inf is only allowed in a mask or bias matrix"),
        (".inf", "'.inf' is not a finite number"),
        ("true", "'true' is a boolean, not a number"),
    ],
)
def test_scale_errors(value, message):
    err = fail(QKV3 + f"scale: {value}\n")
    assert_at(err, 4, 8, "scale")  # "scale: " is 7 characters
    assert message in err.message


@pytest.mark.parametrize("value", ["0", "51", "-1", "4.5", "'5'", "four", "~", "[4]", "1e1", "true"])
def test_digits_out_of_range_or_not_whole(value):
    err = fail(QKV3 + f"digits: {value}\n")
    assert_at(err, 4, 9, "digits")  # "digits: " is 8 characters
    assert err.message.startswith("digits must be a whole number from 1 to 50, not ")


def test_many_errors_are_fast():
    start = time.process_time()
    for _ in range(50):
        fail("Q: [[1, 10**10**10]]\nK: [[1, 1]]\nV: [[1]]\n")
    assert time.process_time() - start < 5.0


# ==========================================================================
# Regressions: bugs found by these tests and fixed
# ==========================================================================


def test_scale_with_undecidable_sign_gives_symattn_error():
    err = fail(QKV3 + "scale: 'log(4) - 2*log(2)'\n")  # this is 0, so it must be rejected
    assert_at(err, 4, 8, "scale")


@pytest.mark.parametrize(
    ("line", "col", "field"),
    [("digits: ²\n", 9, "digits"), ("mask: {sliding-window: ²}\n", 24, "mask")],
)
def test_superscript_digit_gives_symattn_error(line, col, field):
    err = fail(QKV3 + line)
    assert_at(err, 4, col, field)


def test_equals_sign_token_is_a_label():
    p = ok(QKV3 + "tokens: [x, =, y]\n")
    assert p.tokens == ("x", "=", "y")


def test_date_like_title_is_text():
    p = ok(QKV3 + "title: 2024-05-01\n")
    assert p.title == "2024-05-01"


def test_fully_masked_row_with_bias_points_at_the_mask():
    text = QKV3 + (
        "mask: [[1, 0, 0], [0, 0, 0], [1, 1, 1]]\n"  # 4: mask value at column 7
        "bias: [[0, 0, 0], [0, 0, 0], [0, 0, 0]]\n"  # 5
    )
    err = fail(text)
    assert_at(err, 4, 7, "mask")
    assert "row 2 with no key to attend to" in err.message


def test_aliases_cannot_blow_a_small_file_up_into_millions_of_numbers():
    """A 40 kB file repeating one 4000-entry row 4000 times through an alias is refused before parsing."""
    row = "&r [" + ", ".join(["1"] * 4000) + "]"
    text = "X: [" + row + ", " + ", ".join(["*r"] * 3999) + "]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n"
    start = time.process_time()
    err = fail(text)
    assert time.process_time() - start < 5
    assert_at(err, 1, 4, "X")
    assert "more than 1,000,000 numbers" in err.message and "--max-size" in err.message


def test_max_size_can_be_raised_and_lowered():
    text = "X: [[1, 2], [3, 4]]\nW_Q: [[1], [0]]\nW_K: [[0], [1]]\nW_V: [[1], [1]]\n"
    with pytest.raises(SymattnError, match="more than 5 numbers"):
        parse_problem(text, "p.yaml", max_size=5)
    assert parse_problem(text, "p.yaml", max_size=10).X.shape == (2, 2)


def test_matrices_from_files_count_towards_the_size_limit(tmp_path):
    import numpy as np

    np.save(tmp_path / "x.npy", np.ones((3, 4)))
    (tmp_path / "p.yaml").write_text("X: {file: x.npy}\nW_Q: [[1], [0], [0], [0]]\nW_K: [[1], [0], [0], [0]]\nW_V: [[1], [0], [0], [0]]\n")
    assert load_problem(tmp_path / "p.yaml", max_size=24).X.shape == (3, 4)
    with pytest.raises(SymattnError, match="more than 12 numbers.*--max-size"):
        load_problem(tmp_path / "p.yaml", max_size=12)
