"""Matrices from safetensors checkpoints: {file: X.safetensors, tensor:, rows:, cols:, transpose:}.

Every checkpoint is made here with safetensors (no download). Expected values are computed
independently: Fraction of each stored float (Python's exact conversion), slices taken with
NumPy's own indexing of the saved array.
"""

from __future__ import annotations

import json
import os
import struct
from fractions import Fraction

import numpy as np
import pytest
from sympy import Rational

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from symattn.problem.load import load_problem  # noqa: E402
from _child import SymattnCli  # noqa: E402


def _write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


def _qkv(spec):
    """A problem whose Q, K and V are all the matrix ``spec``: any n × d shape fits."""
    return f"Q: {spec}\nK: {spec}\nV: {spec}\n"


def _fractions(m):
    return [[Fraction(int(Rational(m[i, j]).p), int(Rational(m[i, j]).q)) for j in range(m.cols)] for i in range(m.rows)]


def _expected(array):
    return [[Fraction(float(v)) for v in row] for row in np.asarray(array, dtype=np.float64)]


@pytest.fixture
def ckpt(tmp_path):
    rng = np.random.default_rng(19)
    tensors = {
        "h.0.attn.c_attn.weight": rng.standard_normal((8, 24)).astype(np.float32),
        "h.0.attn.q_proj.weight": rng.standard_normal((4, 8)).astype(np.float16),
        "ints": np.arange(12, dtype=np.int32).reshape(3, 4),
        "bias": np.zeros(24, dtype=np.float32),
    }
    safetensors_numpy.save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path, tensors


def test_float32_column_slice_is_exact(ckpt):
    tmp_path, t = ckpt
    p = load_problem(_write(tmp_path, 'Q: {file: model.safetensors, tensor: h.0.attn.c_attn.weight, '
                                      'rows: "0:3", cols: "8:12"}\nK: [[1, 0, 0, 0]]\nV: [[1]]\n'))
    assert _fractions(p.Q) == _expected(t["h.0.attn.c_attn.weight"][0:3, 8:12])


@pytest.mark.parametrize("rows, cols", [("1:7:2", "::5"), ("-2:", "3"), ("::-1", "23:0:-4"), (None, "-1")])
def test_slices_follow_python(ckpt, rows, cols):
    tmp_path, t = ckpt
    w = t["h.0.attn.c_attn.weight"]
    spec = "tensor: h.0.attn.c_attn.weight" + (f', rows: "{rows}"' if rows else "") + f', cols: "{cols}"'
    p = load_problem(_write(tmp_path, _qkv(f"{{file: model.safetensors, {spec}}}")))
    def sl(text):
        if ":" not in text:
            return slice(int(text), int(text) + 1 or None)
        return slice(*(int(x) if x else None for x in text.split(":")))
    assert _fractions(p.Q) == _expected(w[sl(rows) if rows else slice(None), sl(cols)])


def test_transpose_float16_exact(ckpt):
    tmp_path, t = ckpt
    p = load_problem(_write(tmp_path, _qkv("{file: model.safetensors, tensor: h.0.attn.q_proj.weight, transpose: true}")))
    assert p.Q.shape == (8, 4)
    assert _fractions(p.Q) == _expected(t["h.0.attn.q_proj.weight"].T)


def test_integers(ckpt):
    tmp_path, t = ckpt
    p = load_problem(_write(tmp_path, _qkv('{file: model.safetensors, tensor: ints, cols: "1:3"}')))
    assert _fractions(p.Q) == [[Fraction(int(v)) for v in row] for row in t["ints"][:, 1:3]]


def test_bfloat16_exact(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    w = (torch.randn(5, 6, generator=torch.Generator().manual_seed(3)) * 7).to(torch.bfloat16)
    w[0, 0] = 2.0 ** -130  # a subnormal of float32: bfloat16 keeps float32's exponent range
    save_file({"w": w}, str(tmp_path / "b.safetensors"))
    p = load_problem(_write(tmp_path, _qkv('{file: b.safetensors, tensor: w, rows: "1:5", cols: "0:6:2", transpose: true}')))
    want = [[Fraction(float(v)) for v in row] for row in w[1:5, 0:6:2].T.tolist()]  # bf16 → float: exact
    assert _fractions(p.Q) == want
    assert Fraction(float(w[0, 0])) == Fraction(1, 2 ** 130)


def test_only_the_slice_is_read(tmp_path, monkeypatch):
    """A 64 MB tensor of which a 2×4 slice is asked for: the bytes read stay tiny."""
    big = np.zeros((4096, 4096), dtype=np.float32)
    big[4095, 4092:4096] = [1.5, -2.25, 3.0, 0.125]
    safetensors_numpy.save_file({"w": big}, str(tmp_path / "big.safetensors"))
    del big
    import difflib  # imported by the reader only for such a message

    import symattn.problem.checkpoints.safetensors as st

    read = []
    real_pread = os.pread
    monkeypatch.setattr(st.os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    p = load_problem(_write(tmp_path, 'X: {file: big.safetensors, tensor: w, rows: "4094:", cols: "-4:"}\n'
                                      "W_Q: [[1], [0], [0], [0]]\nW_K: [[1], [0], [0], [0]]\nW_V: [[1], [0], [0], [0]]\n"))
    assert _fractions(p.X) == [[0, 0, 0, 0], [Fraction(3, 2), Fraction(-9, 4), 3, Fraction(1, 8)]]
    assert sum(read) < 1000 and read[2:] == [16, 16]  # the header's length and bytes, then 2 rows × 4 float32


def test_derive_end_to_end(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    path = _write(tmp_path, "X: [[1, 0, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0, 1]]\n"
                            'W_Q: {file: model.safetensors, tensor: h.0.attn.c_attn.weight, cols: "0:2"}\n'
                            'W_K: {file: model.safetensors, tensor: h.0.attn.c_attn.weight, cols: "8:10"}\n'
                            'W_V: {file: model.safetensors, tensor: h.0.attn.c_attn.weight, cols: "16:18"}\n')
    r = symattn_cli.main("derive", path, "-f", "json")
    assert r.code == 0
    assert json.loads(r.stdout)["crosscheck"]["passed"] is True


# -- bad input: one line, the field's place ---------------------------------------------


def _error(tmp_path, text, cli: SymattnCli):
    path = _write(tmp_path, text)
    r = cli.main("derive", path, "-f", "json")
    assert r.code == 1
    err = r.stderr
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in err, err
    return lines[0].replace(str(path), "P")


def test_wrong_tensor_name_lists_close_names(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    line = _error(tmp_path, "Q: {file: model.safetensors, tensor: h.0.attn.c_atn.weight}\nK: [[1]]\nV: [[1]]\n", symattn_cli)
    assert line.startswith("Error: P:1:38: Q: ") and "has no tensor 'h.0.attn.c_atn.weight'" in line
    assert "'h.0.attn.c_attn.weight'" in line


@pytest.mark.parametrize("spec, col, fragment", [
    ('rows: "0:9"', 68, "out of range; the tensor has 8 rows"),
    ('cols: "30"', 68, "index 30 is out of range"),
    ('cols: "2:2"', 68, "selects no cols"),
    ('cols: "0:4:0"', 68, "step of 0"),
    ('cols: "__import__(1)"', 68, "is not a slice"),
])
def test_bad_slices(ckpt, symattn_cli, spec, col, fragment):
    tmp_path, _ = ckpt
    line = _error(tmp_path, f"X: {{file: model.safetensors, tensor: h.0.attn.c_attn.weight, {spec}}}\n", symattn_cli)
    assert line.startswith(f"Error: P:1:{col}: X: ") and fragment in line


def test_shape_that_does_not_fit(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    line = _error(tmp_path, "X: [[1, 2]]\nW_Q: {file: model.safetensors, tensor: h.0.attn.c_attn.weight}\n"
                            "W_K: [[1], [1]]\nW_V: [[1], [1]]\n", symattn_cli)
    assert "W_Q" in line and "8" in line


def test_one_dimensional_tensor(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    line = _error(tmp_path, "X: {file: model.safetensors, tensor: bias}\n", symattn_cli)
    assert line.startswith("Error: P:1:38: X: ") and "2-dimensional" in line


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth"])
def test_pickles_refused(tmp_path, symattn_cli, name):
    (tmp_path / name).write_bytes(b"\x80\x04PK")
    line = _error(tmp_path, f"X: {{file: {name}}}\n", symattn_cli)
    assert line.startswith("Error: P:1:11: X: ") and "pickle" in line and "save_file" in line


def test_truncated_header(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:40])
    line = _error(tmp_path, "X: {file: cut.safetensors, tensor: ints}\n", symattn_cli)
    assert line.startswith("Error: P:1:11: X: ") and "header is cut short" in line


def test_truncated_data(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    line = _error(tmp_path, "X: {file: cut.safetensors, tensor: h.0.attn.c_attn.weight}\n", symattn_cli)
    assert "not a valid safetensors file" in line


def test_not_a_regular_file(ckpt, symattn_cli):
    tmp_path, _ = ckpt
    os.mkfifo(tmp_path / "fifo.safetensors")
    line = _error(tmp_path, "X: {file: fifo.safetensors, tensor: w}\n", symattn_cli)
    assert "FIFO" in line


@pytest.mark.parametrize("text, fragment", [
    ("X: {file: model.safetensors}\n", "name one with tensor:"),
    ("X: {file: model.safetensors, tensor: ints, colz: '1:2'}\n", "did you mean 'cols'"),
    ("X: {file: model.safetensors, tensor: ints, transpose: yes please}\n", "true or false"),
    ("X: {file: m.npy, tensor: ints}\n", "read whole"),
])
def test_bad_keys(ckpt, symattn_cli, text, fragment):
    tmp_path, _ = ckpt
    np.save(tmp_path / "m.npy", np.eye(2))
    assert fragment in _error(tmp_path, text, symattn_cli)


def test_header_length_lie(tmp_path, symattn_cli):
    (tmp_path / "lie.safetensors").write_bytes(struct.pack("<Q", 2 ** 60) + b"{}")
    line = _error(tmp_path, "X: {file: lie.safetensors, tensor: w}\n", symattn_cli)
    assert "not a valid safetensors file" in line


@pytest.mark.parametrize("value, fragment", [(np.inf, "NaN or infinite"), (np.nan, "NaN or infinite"),
                                             (1e301, "larger than 10^300")])
def test_float64_values_refused_like_npy(tmp_path, symattn_cli, value, fragment):
    safetensors_numpy.save_file({"w": np.array([[1.0, value]])}, str(tmp_path / "f.safetensors"))
    line = _error(tmp_path, "X: {file: f.safetensors, tensor: w}\n", symattn_cli)
    assert line.startswith("Error: P:1:34: X: ") and fragment in line


def test_float64_exact(tmp_path):
    w = np.array([[0.1, -1e-300], [2.0 ** 60 + 1, 3.5]])
    safetensors_numpy.save_file({"w": w}, str(tmp_path / "f.safetensors"))
    p = load_problem(_write(tmp_path, _qkv("{file: f.safetensors, tensor: w}")))
    assert _fractions(p.Q) == _expected(w)


def _gpt2_reference(torch, x, c_attn_w, c_attn_b, n_head):
    """GPT-2's attention written out by hand (Conv1D: x @ W + b, W is in × out; Q|K|V side by
    side; heads packed in each), split by head: each head's weights and output."""
    n, d_model = x.shape
    qkv = x @ c_attn_w + c_attn_b
    q, k, v = qkv.split(d_model, dim=1)
    hd = d_model // n_head
    q, k, v = (t.view(n, n_head, hd).transpose(0, 1) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return att, att @ v  # (n_head, n, n) and (n_head, n, hd)


@pytest.mark.parametrize("head", [0, 3])
def test_gpt2_head_by_slices_matches_a_pytorch_reference(tmp_path, head):
    """One head of a GPT-2-shaped block (4 heads of 3, float32, Conv1D layout) cut out by
    columns as the README shows, against GPT-2's attention written in PyTorch."""
    torch = pytest.importorskip("torch")
    import symattn

    d_model, n_head, hd, n = 12, 4, 3, 5
    rng = np.random.default_rng(124)
    w = rng.standard_normal((d_model, 3 * d_model)).astype(np.float32)
    safetensors_numpy.save_file({"h.0.attn.c_attn.weight": w, "h.0.attn.c_attn.bias": np.zeros(3 * d_model, np.float32)},
                                str(tmp_path / "model.safetensors"))
    x = rng.integers(-3, 4, size=(n, d_model))
    lines = ["X: " + json.dumps(x.tolist())]
    for name, part in (("W_Q", 0), ("W_K", 1), ("W_V", 2)):
        lo = part * d_model + head * hd
        lines.append(f'{name}: {{file: model.safetensors, tensor: h.0.attn.c_attn.weight, cols: "{lo}:{lo + hd}"}}')
    lines.append("mask: causal")
    d = symattn.derive(load_problem(_write(tmp_path, "\n".join(lines) + "\n")))
    att, out = _gpt2_reference(torch, torch.tensor(x, dtype=torch.float64), torch.tensor(w, dtype=torch.float64),
                               torch.zeros(3 * d_model, dtype=torch.float64), n_head)
    got_a = np.array([[float(v) for v in row] for row in d.evaluate("A", 20)])
    got_o = np.array([[float(v) for v in row] for row in d.evaluate("O", 20)])
    np.testing.assert_allclose(got_a, att[head].numpy(), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(got_o, out[head].numpy(), rtol=1e-12, atol=1e-12)


# -- X from an embedding table, learned positions from a table -----------------------------------------


@pytest.fixture
def tables(tmp_path):
    rng = np.random.default_rng(50257)
    t = {"wte.weight": rng.standard_normal((300, 6)).astype(np.float32),
         "wpe.weight": rng.standard_normal((8, 6)).astype(np.float16),
         "wpe_wide": rng.standard_normal((8, 5)).astype(np.float32),
         "c_attn": rng.standard_normal((6, 6)).astype(np.float32),
         "vector": np.zeros(6, np.float32)}
    safetensors_numpy.save_file(t, str(tmp_path / "model.safetensors"))
    return tmp_path, t


_HEAD = ('W_Q: {file: model.safetensors, tensor: c_attn, cols: "0:2"}\n'
         'W_K: {file: model.safetensors, tensor: c_attn, cols: "2:4"}\n'
         'W_V: {file: model.safetensors, tensor: c_attn, cols: "4:6"}\n')


def test_embeddings_rows_by_token_id_and_labels(tables):
    tmp_path, t = tables
    p = load_problem(_write(tmp_path, "X: {file: model.safetensors, embeddings: wte.weight, tokens: [299, 0, 17, 0]}\n" + _HEAD))
    assert _fractions(p.X) == _expected(t["wte.weight"][[299, 0, 17, 0]])
    assert p.tokens == ("#299", "#0", "#17", "#0")  # no labels given: the ids
    p = load_problem(_write(tmp_path, "tokens: [a, b]\nX: {file: model.safetensors, embeddings: wte.weight, "
                                      'tokens: [3, 4], cols: "1:4"}\n'
                                      "W_Q: [[1], [0], [0]]\nW_K: [[1], [0], [0]]\nW_V: [[1], [0], [0]]\n"))
    assert p.tokens == ("a", "b") and _fractions(p.X) == _expected(t["wte.weight"][3:5, 1:4])


def test_embeddings_read_only_their_rows(tmp_path, monkeypatch):
    """Three rows of a 16 MB table: a read of one row each, nothing else of the table."""
    table = np.zeros((50257, 80), dtype=np.float32)
    table[50256] = 0.5
    safetensors_numpy.save_file({"wte": table}, str(tmp_path / "e.safetensors"))
    del table
    import difflib  # imported by the reader only for such a message

    import symattn.problem.checkpoints.safetensors as st

    read = []
    real_pread = os.pread
    monkeypatch.setattr(st.os, "pread", lambda fd, n, off: read.append(n) or real_pread(fd, n, off))
    p = load_problem(_write(tmp_path, _qkv("{file: e.safetensors, embeddings: wte, tokens: [50256, 1, 50256]}")))
    assert p.Q.shape == (3, 80) and p.Q[0, 0] == Rational(1, 2) and p.Q[1, 79] == 0
    # Q, K and V each: the header's length and JSON, then 3 rows × 80 float32
    assert [n for n in read if n > 100] == [320] * 9 and sum(read) < 3 * (960 + 100)


def test_learned_positions_from_a_table_gpt2_input(tables):
    """X + positions as GPT-2 forms its first block's input (before ln_1): wte[ids] + wpe[0:n]."""
    torch = pytest.importorskip("torch")
    tmp_path, t = tables
    p = load_problem(_write(tmp_path, "X: {file: model.safetensors, embeddings: wte.weight, tokens: [7, 250, 7]}\n"
                                      "positions: {file: model.safetensors, tensor: wpe.weight}\n" + _HEAD))
    assert p.positions.kind == "learned"
    assert _fractions(p.positions.matrix) == _expected(t["wpe.weight"][0:3])
    import symattn

    d = symattn.derive(p)
    wte = torch.nn.Embedding.from_pretrained(torch.tensor(t["wte.weight"], dtype=torch.float64))
    wpe = torch.nn.Embedding.from_pretrained(torch.tensor(t["wpe.weight"].astype(np.float64)))
    ids = torch.tensor([7, 250, 7])
    want = (wte(ids) + wpe(torch.arange(3))).numpy()
    got = np.array([[float(v) for v in row] for row in d.evaluate("X_pos", 20)])
    np.testing.assert_array_equal(got, want)  # sums of float32 and float16 values: exact in float64
    from symattn.exact.lazy import fmpq_matrix

    # X + PE of numbers is one flint matrix, so Q = X_pos·W_Q is a flint product (a GPT-2 head in a second)
    assert fmpq_matrix(d.step("X_pos").lazy) is not None and fmpq_matrix(d.step("Q").lazy) is not None


@pytest.mark.parametrize("text, where, fragment", [
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [1, 300]}\n", "1:66",
     "X.tokens item 2: token id 300 is past the table's 300 rows"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [1, 2.5]}\n", "1:66",
     "X.tokens item 2: a token id is a whole number ≥ 0"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [-1]}\n", "1:63", "X.tokens item 1: a token id"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: 3}\n", "1:62", "X.tokens: the token ids are a list"),
    ("X: {file: model.safetensors, embeddings: wte.weight}\n", "1:30", "X: embeddings: needs tokens:"),
    ("X: {file: model.safetensors, embeddings: vector, tokens: [1]}\n", "1:42", "2-dimensional"),
    ("X: {file: model.safetensors, embeddings: wte.weihgt, tokens: [1]}\n", "1:42", "close: 'wte.weight'"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [1], rows: '0:1'}\n", "1:67", "rows: unknown key"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [1,2,3,4,5,6,7,8,9]}\n"
     "positions: {file: model.safetensors, tensor: wpe.weight}\n", "2:46",
     "positions: tensor 'wpe.weight' has 8 rows, fewer than the 9 positions needed"),
    ("X: {file: model.safetensors, embeddings: wte.weight, tokens: [1, 2]}\n"
     "positions: {file: model.safetensors, tensor: wpe_wide}\n", "2:12",
     "the learned positions are 2×5 but X is 2×6"),
])
def test_embedding_and_position_errors(tables, symattn_cli, text, where, fragment):
    tmp_path, _ = tables
    line = _error(tmp_path, text + _HEAD, symattn_cli)
    assert line.startswith(f"Error: P:{where}: ") and fragment in line, line


# -- the header, checked whole for every dtype, at a bounded cost ---------------------------------


def _raw(tmp_path, header: str, data: bytes = b"", name="h.safetensors"):
    text = header.encode()
    (tmp_path / name).write_bytes(struct.pack("<Q", len(text)) + text + data)


def _one(dtype='"F32"', shape="[2, 1]", offsets="[0, 8]", rest=""):
    return f'{{"w": {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}{rest}}}'


_MALFORMED = "is not a valid safetensors file: the header's entry for 'w' is malformed: "


@pytest.mark.parametrize("header, fragment", [
    (_one(dtype='["F32"]'), _MALFORMED + "its dtype is ['F32'], not a name such as \"F32\""),
    (_one(dtype="32"), _MALFORMED + "its dtype is 32, not a name"),
    (_one(dtype="null"), _MALFORMED + "its dtype is null, not a name"),
    (_one(dtype='{"F32": 1}'), _MALFORMED + "its dtype is {...}, not a name"),
    (_one(shape="[true, 1]"), _MALFORMED + "its shape is [true, 1], not a list of whole numbers ≥ 0"),
    (_one(shape="[2.0, 1]"), _MALFORMED + "its shape is [2.0, 1], not a list of whole numbers"),
    (_one(shape='["2", 1]'), _MALFORMED + "its shape is ['2', 1], not a list of whole numbers"),
    (_one(shape="[-2, 1]"), _MALFORMED + "its shape is [-2, 1], not a list"),
    (_one(shape="[NaN, 1]"), _MALFORMED + "its shape is [NaN, 1], not a list"),
    (_one(shape="[18446744073709551616, 1]"), _MALFORMED + "its shape is [18446744073709551616, 1], not a list"),
    (_one(shape="[[2], 1]"), _MALFORMED + "its shape is [[...], 1], not a list"),
    (_one(shape="2"), _MALFORMED + "its shape is 2, not a list"),
    (_one(shape="[1, 1, 1, 1, 1, 1, 1, 2]"), "tensor 'w' has shape [1, 1, 1, 1, ...]; a matrix is a 2-dimensional"),
    (_one(offsets="[0, 8.0]"), _MALFORMED + "its data_offsets are [0, 8.0], not two whole numbers [start, end] ≥ 0"),
    (_one(offsets="[0, 4, 8]"), _MALFORMED + "its data_offsets are [0, 4, 8], not two whole numbers"),
    (_one(offsets="[8, 0]"), _MALFORMED + "its data_offsets [8, 0] end before they start"),
    (_one(offsets='"0:8"'), _MALFORMED + "its data_offsets are '0:8', not two whole numbers"),
    ('{"w": 5}', _MALFORMED + "it is 5, not a JSON object"),
    ('{"w": {"dtype": "F32", "shape": [2, 1]}}', _MALFORMED + "it has no data_offsets"),
    (_one(rest=', "__metadata__": {"format": 1}'), "its __metadata__ is {...}, not a mapping of names to strings"),
    (_one(rest=', "__metadata__": ["pt"]'), "its __metadata__ is ['pt'], not a mapping of names to strings"),
    (_one(rest=', "w": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]}'), "its header names 'w' twice"),
    (_one(shape="[" + "1" * 21 + ", 1]"), "its header holds a number of 21 digits; a safetensors header's numbers are "
                                          "sizes and offsets below 2^64 (at most 20 digits)"),
    (_one(offsets="[0, 1" + "0" * 3_000_000 + ".5]"),  # never converted: kept as an excerpt of its text
     _MALFORMED + "its data_offsets are [0, 100000000000000000000...], not two whole numbers"),
    (_one(offsets="[0, 8]", rest=', "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}'),
     "tensor 'v''s data_offsets [4, 8] overlap another tensor's or leave a gap before them"),
    (_one(offsets="[4, 12]"), "tensor 'w''s data_offsets [4, 12] overlap another tensor's or leave a gap before them"),
    (_one(shape="[3, 1]"), "tensor 'w''s bytes do not fit its shape or run past the end of the file"),
    (_one(shape="[4294967296, 4294967296, 4294967296, 4294967296]"), "tensor 'w''s bytes do not fit its shape"),
])
def test_every_field_of_the_header_is_checked(tmp_path, symattn_cli, header, fragment):
    """Each entry's dtype a name, its shape and data_offsets whole numbers below 2^64, the metadata
    strings, no name twice, the tensors end to end: one line each, of any JSON type."""
    _raw(tmp_path, header, b"\0" * 8)
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: w}"), symattn_cli)
    assert line.startswith("Error: P:1:") and fragment in line, line


def test_bytes_past_the_last_tensor_are_refused(tmp_path, symattn_cli):
    """As the safetensors package: the header accounts for the whole file."""
    _raw(tmp_path, _one(), b"\0" * 12)
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: w}"), symattn_cli)
    assert "it holds 4 bytes after its last tensor's (the header does not account for the whole file)" in line


@pytest.mark.parametrize("dtype, size", [("F16", 2), ("BF16", 2), ("F32", 4), ("F64", 8), ("I32", 4), ("U8", 1)])
def test_overlapping_tensors_are_refused_for_every_dtype(tmp_path, symattn_cli, dtype, size):
    """bfloat16 is read by symattn itself, as every dtype is: its offsets are checked the same."""
    n = 2 * size
    _raw(tmp_path, f'{{"w": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {n}]}}, '
                   f'"v": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {n}]}}}}', b"\0" * n)
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: w}"), symattn_cli)
    assert f"tensor 'v''s data_offsets [0, {n}] overlap another tensor's" in line, line
    _raw(tmp_path, f'{{"w": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {n}]}}, '
                   f'"v": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [{n}, {2 * n}]}}}}', b"\0" * 2 * n)
    assert load_problem(_write(tmp_path, _qkv("{file: h.safetensors, tensor: v}"))).Q.shape == (2, 1)


def test_a_dtype_safetensors_does_not_know_is_refused_only_when_read(tmp_path, symattn_cli):
    """A newer dtype beside the tensor read: its offsets are checked, its values never read."""
    _raw(tmp_path, '{"w": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]}, '
                   '"z": {"dtype": "F3_NEW", "shape": [2, 1], "data_offsets": [8, 9]}}', b"\0\0\x80\x3f" + b"\0" * 5)
    p = load_problem(_write(tmp_path, _qkv("{file: h.safetensors, tensor: w}")))
    assert _fractions(p.Q) == [[1], [0]]
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: z}"), symattn_cli)
    assert "tensor 'z' holds F3_NEW values; symattn reads F16, BF16, F32, F64, I8, I16, I32, I64 and U8" in line


@pytest.mark.parametrize("dtype", ["U16", "U32", "U64", "BOOL", "C64", "F8_E5M2"])
def test_the_dtypes_read_are_named_exactly(tmp_path, symattn_cli, dtype):
    size = {"U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "C64": 8, "F8_E5M2": 1}[dtype]
    _raw(tmp_path, f'{{"w": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {2 * size}]}}}}',
         b"\0" * 2 * size)
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: w}"), symattn_cli)
    assert f"tensor 'w' holds {dtype} values; symattn reads F16, BF16, F32, F64, I8, I16, I32, I64 and U8" in line


@pytest.mark.parametrize("spec, shape", [
    ("X: {file: h.safetensors, tensor: w}\n", "[0, 2]"),
    ("X: {file: h.safetensors, tensor: w}\n", "[2, 0]"),
    ("X: {file: h.safetensors, embeddings: w, tokens: [0]}\n", "[0, 2]"),
    ("X: [[1, 0]]\nW_Q: [[1], [0]]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\nb_Q: {file: h.safetensors, tensor: w}\n", "[0]"),
])
def test_a_tensor_of_no_numbers_is_refused(tmp_path, symattn_cli, spec, shape):
    _raw(tmp_path, _one(shape=shape, offsets="[0, 0]"))
    line = _error(tmp_path, spec, symattn_cli)
    assert f"tensor 'w' has shape {shape}: it holds no numbers, and a matrix has at least one row and one column" \
        in line, line


def test_a_long_name_is_quoted_in_part(tmp_path, symattn_cli):
    name = "x" * 100_000
    _raw(tmp_path, f'{{"{name}": {{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}}}', b"\0" * 4)
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: " + "y" * 5000 + "}"), symattn_cli)
    assert "has no tensor 'yyyyyyyy" in line and "(it holds 1 tensor, e.g. 'xxxx" in line and len(line) < 400, line


def test_close_names_are_looked_for_among_a_bounded_set(tmp_path, monkeypatch):
    """100,000 tensors: difflib compares the missing name with at most 1,000 of them, those of its
    own layer first, and the header is parsed once."""
    import difflib  # imported by the reader only for such a message

    import symattn.problem.checkpoints.safetensors as st

    names = [f"model.layers.{i // 100}.mlp.experts.{i % 100}.w" for i in range(100_000)]
    _raw(tmp_path, json.dumps({n: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for n in names}))
    compared, parsed = [], []
    real_close, real_loads = difflib.get_close_matches, st.json.loads
    monkeypatch.setattr(difflib, "get_close_matches",
                        lambda word, possibilities, **kw: compared.append(len(possibilities)) or
                        real_close(word, possibilities, **kw))
    monkeypatch.setattr(st.json, "loads", lambda *a, **kw: parsed.append(1) or real_loads(*a, **kw))
    with st.Checkpoint(tmp_path / "h.safetensors") as f:
        why = f.missing("model.layers.999.mlp.experts.42.v")
    assert why.startswith("has no tensor 'model.layers.999.mlp.experts.42.v' (close: "
                          "'model.layers.999.mlp.experts.42.w'"), why
    assert compared == [1000] and parsed == [1]


def test_a_header_of_too_many_values_is_refused_before_it_is_parsed(tmp_path, symattn_cli, monkeypatch):
    import difflib  # imported by the reader only for such a message

    import symattn.problem.checkpoints.safetensors as st

    _raw(tmp_path, '{"__metadata__": {"a": "b"}, "x": [' + "[]," * (st.MAX_VALUES // 2) + "[]]}")
    monkeypatch.setattr(st.json, "loads", None)  # never reached
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: w}"), symattn_cli)
    assert f"JSON values, more than {st.MAX_VALUES:,}; symattn reads a file of at most {st.MAX_TENSORS:,} tensors" \
        in line, line


def test_a_header_of_too_many_tensors_is_refused(tmp_path, symattn_cli, monkeypatch):
    import difflib  # imported by the reader only for such a message

    import symattn.problem.checkpoints.safetensors as st

    monkeypatch.setattr(st, "MAX_TENSORS", 3)
    _raw(tmp_path, json.dumps({f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(4)}))
    line = _error(tmp_path, _qkv("{file: h.safetensors, tensor: t0}"), symattn_cli)
    assert "its header lists 4 tensors, more than the 3 symattn reads in one file" in line, line


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "float64", "float16", "wide range", "zeros", "subnormal"])
def test_float_matrices_are_the_dyadic_rationals_they_stand_for(kind):
    """Each float is read as its exact fraction (Python's Fraction of the float), whether the
    matrix is taken as integers over one power of two or entry by entry."""
    from fractions import Fraction

    from symattn.numbers.sympy_internals import qq_dense
    from symattn.problem.tables import float_matrix

    rng = np.random.default_rng(7)
    a = rng.standard_normal((9, 13))
    a = {"float32": (a * 0.02).astype(np.float32),
         "bfloat16": ((a.astype(np.float32).view(np.uint32) >> 16) << 16).astype(np.uint32).view(np.float32),
         "float64": a, "float16": a.astype(np.float16), "wide range": a * 2.0 ** rng.integers(-80, 80, a.shape),
         "zeros": np.zeros((2, 3)), "subnormal": np.array([[5e-324, -1.5], [0.0, 2.0 ** -1074 * 3]])}[kind]
    got = [[Fraction(int(x.numerator), int(x.denominator)) for x in row] for row in qq_dense(float_matrix(a)).to_list()]
    assert got == [[Fraction(float(x)) for x in row] for row in a]
