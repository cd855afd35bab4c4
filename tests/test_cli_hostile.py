"""Every hostile input family of the reliability issue, through the real command line.

Each case runs ``python -m symattn`` in a child process capped at 1 GiB of address space
and bounded in CPU time (tests/_child.py), and must end in exit 0 or 1 with exactly one ``Error:`` line
naming what is wrong. Special files (FIFOs, sockets, links to devices, symlink loops) and
big files are made at test time in a temporary folder; nothing special is committed.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path

import pytest

from _child import GIB, run_cli

ROOT = Path(__file__).resolve().parent.parent
CAUSAL = ROOT / "worked_examples" / "causal_4_tokens.yaml"
REST = "K: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\n"
MB = 1 << 20
SHORT_LINE = 400  # characters in an error line: a hostile value is quoted by a short excerpt


def problem(q_entry: str) -> str:
    return f"Q: [[{q_entry}, 0], [0, 1]]\n{REST}"


def answer(entry: str) -> str:
    """An answers file for causal_4_tokens.yaml with ``entry`` as A[1,1]."""
    return f"A: [[{entry}, 0, 0, 0], [0.5, 0.5, 0, 0], [0.3, 0.3, 0.4, 0], [0.25, 0.25, 0.25, 0.25]]\n"


def npy(header: str, data: bytes = b"", version: tuple[int, int] = (1, 0)) -> bytes:
    text = header.encode("latin-1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(text)) + text + data


def npy_matrix(rows: int, cols: int) -> bytes:
    return npy(f"{{'descr': '<f8', 'fortran_order': False, 'shape': ({rows}, {cols}), }}", b"\0" * (8 * rows * cols))


def safetensors(tensors: dict, header: bytes | None = None, length: int | None = None) -> bytes:
    """A .safetensors file written by hand: ``tensors`` maps a name to (dtype, shape, data bytes);
    ``header`` replaces the JSON and ``length`` the 8-byte length in front of it."""
    entries, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        entries[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(entries).encode() if header is None else header
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def f32(rows: int, cols: int) -> tuple:
    return ("F32", (rows, cols), struct.pack(f"<{rows * cols}f", *range(rows * cols)))


def raw_header(text: str, data: bytes = b"") -> bytes:
    """A .safetensors file whose header is the JSON ``text``, then ``data``."""
    return safetensors({}, header=text.encode()) + data


def entry(dtype='"F32"', shape="[2, 1]", offsets="[0, 8]") -> str:
    """A header of one tensor 'w' with the JSON fields given as text; 8 bytes of data fit the defaults."""
    return f'{{"w": {{"dtype": {dtype}, "shape": {shape}, "data_offsets": {offsets}}}}}'


LLAMA = "model.layers.0.self_attn."
BERT = "bert.encoder.layer.0.attention."


def layer_file(names: list[str], **extra) -> bytes:
    """A layer of 2×2 float32 weights with the given names, and ``extra`` tensors (name → tensor)."""
    return safetensors({**{n: f32(2, 2) for n in names}, **extra})


def from_problem(layout: str, x: str = "[[1, 0], [0, 1]]", heads: str = "[1]", n_head: int = 1) -> str:
    return f"X: {x}\nfrom: {{file: m.safetensors, layout: {layout}, layer: 0, heads: {heads}, n_head: {n_head}}}\n"


def _llama_header(n_head: int, d_model: int, dtype: str = "I8"):
    """A LLaMA layer of ``n_head`` heads of width 1 on d_model inputs, the data a hole (a sparse
    file: 10^8 heads claim 400 MB that take no room on disk)."""
    def make(path: Path) -> None:
        shapes = {LLAMA + "q_proj.weight": [n_head, d_model], LLAMA + "k_proj.weight": [n_head, d_model],
                  LLAMA + "v_proj.weight": [n_head, d_model], LLAMA + "o_proj.weight": [d_model, n_head]}
        entries, end = {}, 0
        for name, shape in shapes.items():
            entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [end, end + n_head * d_model]}
            end += n_head * d_model
        text = json.dumps(entries).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            f.truncate(8 + len(text) + end)
    return make


def _many_tensors(count: int):
    """A header of ``count`` empty tensors named as a mixture of experts names them."""
    def make(path: Path) -> None:
        text = b"{" + b",".join(b'"model.layers.%d.mlp.experts.%d.w": {"dtype": "F32", "shape": [0], '
                                b'"data_offsets": [0, 0]}' % (i // 100, i % 100) for i in range(count)) + b"}"
        path.write_bytes(struct.pack("<Q", len(text)) + text)
    return make


ST = safetensors({"wte": f32(10, 2), "c_attn": f32(2, 6), "cube": ("F32", (2, 2, 2), b"\0" * 32)})
ST_REST = "W_K: [[1], [0]]\nW_V: [[1], [0]]\n"


def st_problem(spec: str, x: str = "[[1, 0], [0, 1]]") -> str:
    return f"X: {x}\nW_Q: {spec}\n{ST_REST}"


# -- the cases: (id, files to write, how to make special files, argv, fragment of the Error line) ------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    return s


def _link(target: str):
    def make(path: Path) -> None:
        os.symlink(target, path)
    return make


def _device(path: Path) -> None:
    """A character device like /dev/null (made with mknod when allowed, else a link to /dev/null)."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.symlink("/dev/null", path)


def _loop(path: Path) -> None:
    os.symlink(path.with_name("loop_b" + path.suffix), path)
    os.symlink(path, path.with_name("loop_b" + path.suffix))


def _big_row(path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("X: [[")
        chunk = "0.5, " * 200_000
        for _ in range(30):  # 30 MB
            f.write(chunk)
        f.write("1]]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n")


def _many_rows(path: Path, style: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        if style == "block":
            f.write("X:\n" + "- [1]\n" * 3_000_000)
        else:
            f.write("X: [[1],\n" + "    [1],\n" * 3_000_000 + "    [1]]\n")
        f.write("W_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n")


def _many_keys(path: Path) -> None:
    """Values that are neither list items nor numbers in a matrix: 1,100,000 mapping entries."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("X: [[1]]\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\ntitle: {" + ", ".join(f"k{i}: v" for i in range(1_100_000)) + "}\n")


def _aliased(path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("X:\n- &r [1, 2]\n" + "- *r\n" * 6_000_000 + "W_Q: [[1], [1]]\nW_K: [[1], [1]]\nW_V: [[1], [1]]\n")


DEEP_FLOW = "Q: " + "[" * 1000 + "1" + "]" * 1000 + "\n" + REST
DEEP_BLOCK = "Q:\n" + "- " * 3000 + "1\n" + REST
DEEP_BLOCK_INDENTED = "Q:\n" + "".join(" " * (2 * i) + "-\n" for i in range(3000)) + " " * 6000 + "- 1\n" + REST
LOG_11 = '"' + "log(" * 11 + "3" + ")" * 11 + '"'

# Problem files given to `symattn derive FILE -f json`: (id, files, special, fragment)
DERIVE = [
    ("deep-flow-1000", {"p.yaml": DEEP_FLOW}, {}, "p.yaml:1:"),
    ("deep-block-3000", {"p.yaml": DEEP_BLOCK}, {}, "nested more than 100 levels deep"),
    ("deep-block-indented-3000", {"p.yaml": DEEP_BLOCK_INDENTED}, {}, "nested more than 100 levels deep"),
    ("lone-surrogate", {"p.yaml": 'title: "a\\ud800b"\n' + problem("1")}, {},
     "p.yaml:1:8: invalid YAML: the escape of U+D800"),
    ("surrogate-key", {"p.yaml": '"\\udfff": 1\n' + problem("1")}, {}, "p.yaml:1:1: invalid YAML: the escape of U+DFFF"),
    ("nul-in-path", {"p.yaml": 'Q: {file: "quotes.csv\\0.npy"}\n' + REST}, {}, "the file name holds a NUL byte"),
    ("fifo-matrix", {"p.yaml": "Q: {file: fifo.csv}\n" + REST}, {"fifo.csv": _fifo},
     "'fifo.csv' is a FIFO (named pipe), not a regular file"),
    ("fifo-problem", {}, {"p.yaml": _fifo}, "p.yaml: is a FIFO (named pipe), not a regular file"),
    ("socket-problem", {}, {"p.yaml": _socket}, "p.yaml: is a socket, not a regular file"),
    ("dev-zero-problem", {}, {"p.yaml": _link("/dev/zero")}, "p.yaml: is a device, not a regular file"),
    ("device-node-problem", {}, {"p.yaml": _device}, "p.yaml: is a device, not a regular file"),
    ("device-matrix", {"p.yaml": "Q: {file: null.csv}\n" + REST}, {"null.csv": _device},
     "is a device, not a regular file"),
    ("folder-matrix", {"p.yaml": "Q: {file: d.csv}\n" + REST, "d.csv/x": "1\n"}, {},
     "'d.csv' is a folder, not a matrix file"),
    ("symlink-loop-matrix", {"p.yaml": "Q: {file: loop_a.csv}\n" + REST}, {"loop_a.csv": _loop},
     "'loop_a.csv': the path is a loop of symbolic links"),
    ("symlink-loop-problem", {}, {"loop_a.yaml": _loop}, "the path is a loop of symbolic links"),
    ("npy-shape-1e10", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                        "q.npy": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (10000000000,), }", b"\0" * 100)},
     {}, "'q.npy' holds a 1-dimensional array of shape (10000000000,)"),
    ("npy-shape-1e18", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                        "q.npy": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000, 1000000000), }",
                                     b"\0" * 100)},
     {}, "'q.npy' holds a 1,000,000,000×1,000,000,000 matrix: more numbers than the size limit allows"),
    ("npy-short-data", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                        "q.npy": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 10)},
     {}, "its header promises a 2×2 float64 matrix (32 bytes) but the file holds 10 bytes of data"),
    ("npz-named-npy", {"p.yaml": "Q: {file: q.npy}\n" + REST, "q.npy": b"PK\x03\x04" + b"\0" * 60}, {},
     "it is a zip archive (an .npz file?)"),
    ("npy-empty", {"p.yaml": "Q: {file: q.npy}\n" + REST, "q.npy": b""}, {}, "'q.npy' is empty"),
    ("npy-call-in-header", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                            "q.npy": npy("{'descr': f(), 'fortran_order': False, 'shape': (2, 2), }", b"\0" * 32)},
     {}, "the header is not a dictionary of plain values"),
    ("npy-deep-header", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                         "q.npy": npy("(" * 3000 + ")" * 3000, b"\0" * 32)}, {},
     "the header is not a dictionary of plain values"),
    ("npy-1e305", {"p.yaml": "Q: {file: q.npy}\n" + REST,
                   "q.npy": npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }", struct.pack("<2d", 1e305, 0))},
     {}, "holds a value larger than 10^300"),
    ("csv-latin1", {"p.yaml": "Q: {file: q.csv}\n" + REST, "q.csv": "1,2\n3,4 \xe9\n".encode("latin-1")}, {},
     "'q.csv' is not UTF-8 text (bad byte 0xE9 on line 2"),
    ("csv-utf16", {"p.yaml": "Q: {file: q.csv}\n" + REST, "q.csv": "1,0\n0,1\n".encode("utf-16")}, {},
     "'q.csv' is UTF-16 text; symattn expects UTF-8"),
    ("csv-200kB-field", {"p.yaml": "Q: {file: q.csv}\n" + REST, "q.csv": '"' + "1" * 200_000 + '",0\n0,1\n'}, {},
     "'q.csv' line 1: an entry is longer than 131,072 characters"),
    ("csv-1e400", {"p.yaml": "Q: {file: q.csv}\n" + REST, "q.csv": "1e400,0\n0,1\n"}, {},
     "'1e400' is larger than 10^300 in size"),
    ("exp-tower-5", {"p.yaml": problem('"exp(exp(exp(exp(exp(1)))))"')}, {},
     "exp, log and sqrt are nested more than 4 deep"),
    ("exp-tower-4", {"p.yaml": problem('"exp(exp(exp(exp(1))))"')}, {}, "is larger than 10^300 in size"),
    ("power-tower-of-e", {"p.yaml": problem('"exp(1)^exp(1)^exp(1)^exp(1)^exp(1)"')}, {},
     "this part is larger than 10^300 in size"),
    ("exp-1000", {"p.yaml": problem('"exp(1000)"')}, {}, "'exp(1000)' is larger than 10^300 in size"),
    ("exp-minus-2000", {"p.yaml": problem('"exp(-2000)"')}, {}, "e to a power below -1000 is too small"),
    ("log-11-deep", {"p.yaml": problem(LOG_11)}, {}, "exp, log and sqrt are nested more than 4 deep"),
    ("log2-power-4300-digits", {"p.yaml": 'Q: [["log(2)", 0], [0, 1]]\nK: [[15000, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\nscale: none\n'},
     {}, "the softmax needs e^(-15000*log(2)), which is an exact power of more than 4,000 bits"),
    ("power-of-14000-bits", {"p.yaml": problem('"(2^19/3^12)^1000"')}, {}, "holds a number of more than 14,000 bits"),
    ("unbounded-exponent", {"p.yaml": 'Q: [["log(2)"]]\nK: [["10^20"], [0]]\nV: [[1], [2]]\nscale: none\n'}, {},
     "the softmax needs e^(-100000000000000000000*log(2))"),
    ("decimal-1e400", {"p.yaml": "Q: [[1e400, 0], [0, 1]]\n" + REST}, {}, "'1e400' is larger than 10^300 in size"),
    ("integer-400-digits", {"p.yaml": problem("9" * 400)}, {}, "is larger than 10^300 in size"),
    ("big-one-line-row", {}, {"p.yaml": _big_row}, "X row 1: the row has more than 1,000,000 entries"),
    ("three-million-rows-block", {}, {"p.yaml": lambda p: _many_rows(p, "block")},
     "p.yaml: the file has 3,000,000 list items (lines starting with '- '), more than its size limit allows"),
    ("two-million-mapping-values", {}, {"p.yaml": _many_keys}, "values (numbers, words and aliases)"),
    ("three-million-rows-flow", {}, {"p.yaml": lambda p: _many_rows(p, "flow")}, "X: the matrix has more than 1,000,000 rows"),
    ("aliased-block-30MB", {}, {"p.yaml": _aliased}, "p.yaml: the file has 6,000,001 list items"),
    # checkpoints: each a file of a few bytes that lies about itself, or a problem asking too much of one
    ("st-wrong-tensor", {"p.yaml": st_problem('{file: m.safetensors, tensor: c_atn, cols: "0:1"}'),
                         "m.safetensors": ST}, {}, "p.yaml:2:36: W_Q: 'm.safetensors' has no tensor 'c_atn'"),
    ("st-slice-out-of-range", {"p.yaml": st_problem('{file: m.safetensors, tensor: c_attn, cols: "5:7"}'),
                               "m.safetensors": ST}, {}, "W_Q: cols: '5:7' is out of range; the tensor has 6 cols"),
    ("st-shape-mismatch", {"p.yaml": st_problem('{file: m.safetensors, tensor: c_attn, cols: "0:1"}', "[[1, 0, 0]]"),
                           "m.safetensors": ST}, {}, "W_Q: X is 1×3 but W_Q is 2×1"),
    ("st-three-dimensional", {"p.yaml": st_problem("{file: m.safetensors, tensor: cube}"), "m.safetensors": ST}, {},
     "tensor 'cube' has shape [2, 2, 2]; a matrix is a 2-dimensional tensor"),
    ("st-pickle", {"p.yaml": st_problem("{file: model.pt}"), "model.pt": b"\x80\x02c__builtin__\neval\n"}, {},
     "'model.pt' is a pickle (torch.save); symattn does not read pickles"),
    ("st-header-cut", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"), "m.safetensors": ST[:40]}, {},
     "is not a valid safetensors file: the header is cut short"),
    ("st-header-length-past-file", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"),
                                    "m.safetensors": safetensors({"c_attn": f32(2, 6)}, length=90_000_000)}, {},
     "the header is cut short (it claims 90,000,000 bytes"),
    ("st-header-length-2^64-1", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"),
                                 "m.safetensors": safetensors({}, length=2 ** 64 - 1)}, {},
     "its header claims 18,446,744,073,709,551,615 bytes, more than 100,000,000"),
    ("st-header-not-json", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"),
                            "m.safetensors": safetensors({}, header=b'{"c_attn": {"dtype": "F32",')}, {},
     "its header is not a JSON object"),
    ("st-header-not-utf8", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"),
                            "m.safetensors": safetensors({}, header=b'{"\xff": 1}')}, {}, "its header is not a JSON object"),
    ("st-header-deep-json", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn}"),
                             "m.safetensors": safetensors({}, header=b"[" * 200_000 + b"]" * 200_000)}, {},
     "its header is not a JSON object"),
    ("st-dtype-float8", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                         "m.safetensors": safetensors({"w": ("F8_E4M3", (2, 1), b"\1\2")})}, {},
     "tensor 'w' holds F8_E4M3 values; symattn reads F16, BF16, F32, F64, I8, I16, I32, I64 and U8"),
    ("st-dtype-u16", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                      "m.safetensors": safetensors({"w": ("U16", (2, 1), b"\1\0\2\0")})}, {},
     "tensor 'w' holds U16 values; symattn reads F16, BF16, F32, F64, I8, I16, I32, I64 and U8"),
    # the header is checked whole, for every dtype alike: two tensors on the same bytes are refused
    *((f"st-overlap-{dtype.lower()}", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                                       "m.safetensors": raw_header(
                                           f'{{"w": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {2 * n}]}}, '
                                           f'"v": {{"dtype": "{dtype}", "shape": [2, 1], "data_offsets": [0, {2 * n}]}}}}',
                                           b"\0" * 2 * n)},
       {}, "tensor 'v''s data_offsets [0, %d] overlap another tensor's" % (2 * n)) for dtype, n in (("BF16", 2), ("F32", 4))),
    ("st-zero-rows", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                      "m.safetensors": safetensors({"w": ("F32", (0, 2), b"")})}, {},
     "p.yaml:2:36: W_Q: tensor 'w' has shape [0, 2]: it holds no numbers, and a matrix has at least one row and one column"),
    ("st-zero-cols", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                      "m.safetensors": safetensors({"w": ("F32", (2, 0), b"")})}, {},
     "tensor 'w' has shape [2, 0]: it holds no numbers"),
    ("st-dtype-a-list", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                         "m.safetensors": raw_header(entry(dtype='["F32"]'), b"\0" * 8)}, {},
     "the header's entry for 'w' is malformed: its dtype is ['F32'], not a name such as \"F32\""),
    ("st-shape-a-bool", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                         "m.safetensors": raw_header(entry(shape="[true, 1]"), b"\0" * 8)}, {},
     "the header's entry for 'w' is malformed: its shape is [true, 1], not a list of whole numbers ≥ 0"),
    ("st-name-twice", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                       "m.safetensors": raw_header(entry()[:-1] + ', "w": {"dtype": "I32", "shape": [2, 1], '
                                                   '"data_offsets": [0, 8]}}', b"\0" * 8)}, {},
     "is not a valid safetensors file: its header names 'w' twice"),
    ("st-header-3000000-digits", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                                  "m.safetensors": raw_header(entry(shape="[" + "9" * 3_000_000 + ", 1]"), b"\0" * 8)},
     {}, "its header holds a number of 3,000,000 digits; a safetensors header's numbers are sizes and offsets below 2^64"),
    ("st-header-88MB", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}")},
     {"m.safetensors": _many_tensors(950_000)}, "has up to 10,450,001 JSON values, more than 1,600,000; symattn "
                                                "reads a file of at most 100,000 tensors"),
    ("st-100000-tensors-none-named-so", {"p.yaml": st_problem("{file: m.safetensors, tensor: model.layers.5.mlp.experts.7.v}")},
     {"m.safetensors": _many_tensors(100_000)},
     "has no tensor 'model.layers.5.mlp.experts.7.v' (close: 'model.layers.5.mlp.experts.7.w'"),
    # from: every bias's shape is checked before anything is read
    ("from-llama-2d-k-bias", {"p.yaml": from_problem("llama"),
                              "m.safetensors": layer_file([LLAMA + f"{p}_proj.weight" for p in "qkvo"],
                                                          **{LLAMA + "k_proj.bias": f32(2, 2)})}, {},
     "p.yaml:2:7: from.layout: model.layers.0.self_attn.k_proj.bias has shape [2, 2], not [2]"),
    ("from-bert-2d-value-bias", {"p.yaml": from_problem("bert"),
                                 "m.safetensors": layer_file([BERT + n + ".weight" for n in ("self.query", "self.key",
                                                                                             "self.value", "output.dense")],
                                                             **{BERT + "self.value.bias": f32(2, 1)})}, {},
     "bert.encoder.layer.0.attention.self.value.bias has shape [2, 1], not [2]"),
    ("from-layer-of-999999-digits", {"p.yaml": from_problem("gpt2", "[[1, 0]]"),
                                     "m.safetensors": safetensors({"h." + "9" * 999_999 + ".attn.c_attn.weight": f32(2, 6)})},
     {}, "'m.safetensors' has no tensor 'h.0.attn.c_attn.weight' (gpt2 layer 0's query weights); it holds 1 tensor, "
         "e.g. 'h.9999999999"),
    # heads: all of a header claiming many heads: charged before any head is read
    ("from-10^8-heads", {"p.yaml": from_problem("llama", "[[1]]", "all", 10 ** 8)},
     {"m.safetensors": _llama_header(10 ** 8, 1)},
     "from.heads: the 100,000,000 heads of layer 0 hold 400,000,000 numbers (d_model = 1, d_head = 1), more than the "
     "999,999 the size limit of 1,000,000 leaves for them"),
    ("from-100000-heads-of-10-inputs", {"p.yaml": from_problem("llama", "[[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]]", "all", 100_000)},
     {"m.safetensors": _llama_header(100_000, 10)}, "from.heads: the 100,000 heads of layer 0 hold 4,000,000 numbers"),
    ("from-100000-heads-of-4-tokens", {"p.yaml": from_problem("llama", "[[1], [2], [3], [4]]", "all", 100_000)},
     {"m.safetensors": _llama_header(100_000, 1)},
     "from.heads: the layer's 100,000 heads are more than the 4,096 the size budget allows for any output (each head "
     "has stages of its own), which keeps a run to about a minute and 2 GiB; list fewer heads, or if you mean it, "
     "raise the budget with --max-size 24415000"),
    ("from-101-heads-of-100-tokens", {"p.yaml": from_problem("llama", "[" + ", ".join(["[1]"] * 100) + "]", "all", 101)},
     {"m.safetensors": _llama_header(101, 1)},
     "from.heads: the 101 heads make 1,010,000 attention scores (100 query × 100 key tokens × 101 heads), more than "
     "the 1,000,000 the size budget allows for any output"),
    ("st-shape-1e12-squared", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                               "m.safetensors": safetensors({"w": ("F32", (10 ** 12, 10 ** 12), b"\0" * 8)})}, {},
     "tensor 'w''s bytes do not fit its shape or run past the end of the file"),
    ("st-offsets-past-end", {"p.yaml": st_problem("{file: m.safetensors, tensor: w}"),
                             "m.safetensors": safetensors({}, header=b'{"w": {"dtype": "F32", "shape": [1000, 1000], '
                                                                     b'"data_offsets": [0, 4000000]}}')}, {},
     "run past the end of the file (truncated?)"),
    ("st-token-id-20-digits", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: [1, 99999999999999999999]}\n"
                                         + 'W_Q: [[1], [0]]\n' + ST_REST, "m.safetensors": ST}, {},
     "p.yaml:1:55: X.tokens item 2: token id 99999999999999999999 is past the table's 10 rows"),
    ("st-embeddings-million-tokens", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: ["
                                                + "1, " * 600_000 + "1]}\n" + "W_Q: [[1], [0]]\n" + ST_REST,
                                      "m.safetensors": ST}, {}, "more numbers than the size limit allows"),
    ("st-token-id-5000-digits", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: [1, " + "7" * 5000 + "]}\n"
                                           + "W_Q: [[1], [0]]\n" + ST_REST, "m.safetensors": ST}, {},
     "p.yaml:1:55: X.tokens item 2: '" + "7" * 37 + "...' has 5,000 digits; a whole number here has at most 40"),
    ("st-token-id-superscript", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: [1, ²]}\n"
                                           + "W_Q: [[1], [0]]\n" + ST_REST, "m.safetensors": ST}, {},
     "X.tokens item 2: a token id is a whole number ≥ 0 (a row of the table, counted from 0 as the tokenizer does), "
     "not '²'"),
    ("st-token-id-arabic-indic", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: [1, ٣]}\n"
                                            + "W_Q: [[1], [0]]\n" + ST_REST, "m.safetensors": ST}, {},
     "X.tokens item 2: a token id is a whole number ≥ 0 (a row of the table, counted from 0 as the tokenizer does), "
     "not '٣'"),
    ("st-positions-too-few", {"p.yaml": "X: {file: m.safetensors, embeddings: wte, tokens: [1, 2, 3]}\n"
                                        "positions: {file: m.safetensors, tensor: c_attn}\nW_Q: [[1], [0]]\n" + ST_REST,
                              "m.safetensors": ST}, {}, "positions: tensor 'c_attn' has 2 rows, fewer than the 3 positions"),
]

# Whole numbers of a million digits (Python's conversion takes time quadratic in the length: 30 s
# for decode or tiling.block before they were bounded), or of 5,000 (an error line must not
# echo them in full), and digits other than 0-9.
MILLION = "7" * 1_000_000
MANY = "7" * 5000
DERIVE += [
    ("decode-million-digits", {"p.yaml": problem("1") + f"mask: causal\ndecode: {MILLION}\n"}, {},
     "p.yaml:5:9: decode: '" + "7" * 37 + "...' has 1,000,000 digits; a whole number here has at most 40"),
    ("tiling-block-million-digits", {"p.yaml": problem("1") + f"tiling: {{block: {MILLION}}}\n"}, {},
     "p.yaml:4:17: tiling.block: '" + "7" * 37 + "...' has 1,000,000 digits; a whole number here has at most 40"),
    ("tiling-rows-5000-digits", {"p.yaml": problem("1") + f"tiling: {{block: 1, rows: [{MANY}]}}\n"}, {},
     "p.yaml:4:27: tiling.rows item 1: '" + "7" * 37 + "...' has 5,000 digits"),
    ("digits-5000-digits", {"p.yaml": problem("1") + f"digits: {MANY}\n"}, {}, f"p.yaml:4:9: digits: '{'7' * 37}...' has 5,000"),
    ("digits-fullwidth", {"p.yaml": problem("1") + "digits: ３\n"}, {},
     "p.yaml:4:9: digits: digits must be a whole number from 1 to 50, not '３'"),
    ("sliding-window-5000-digits", {"p.yaml": problem("1") + f"mask: {{sliding-window: {MANY}}}\n"}, {},
     "p.yaml:4:24: mask: '" + "7" * 37 + "...' has 5,000 digits"),
    ("valid-length-5000-digits", {"p.yaml": problem("1") + f"mask: {{valid-length: {MANY}}}\n"}, {},
     "p.yaml:4:22: mask.valid-length: '" + "7" * 37 + "...' has 5,000 digits"),
    ("kv-heads-5000-digits", {"p.yaml": "X: [[1, 0], [0, 1]]\nheads:\n  - W_Q: [[1], [0]]\n"
                                        f"kv_heads: {MANY}\nkv:\n  - W_K: [[1], [0]]\n    W_V: [[1], [0]]\n"
                                        "W_O: [[1]]\n"}, {},
     "p.yaml:4:11: kv_heads: '" + "7" * 37 + "...' has 5,000 digits"),
    ("decode-quoted-5000-digits", {"p.yaml": problem("1") + f'mask: causal\ndecode: "{MANY}"\n'}, {},
     "p.yaml:5:9: decode: decode must be a token number from 1 to 2, not '" + "7" * 37 + "...'"),
    # a path, a layout word or a slice the checkpoint cannot take: quoted by an excerpt
    ("file-path-100000-characters", {"p.yaml": st_problem("{file: " + "a" * 100_000 + ".npy}")}, {},
     "p.yaml:2:13: W_Q: cannot read '" + "a" * 117 + "...' as a .npy file"),
    ("from-layout-100000-characters", {"p.yaml": "X: [[1, 0], [0, 1]]\nfrom: {file: m.safetensors, layout: "
                                                 + "b" * 100_000 + ", layer: 0, heads: [1]}\n", "m.safetensors": ST},
     {}, "p.yaml:2:37: from.layout: unknown layout '" + "b" * 37 + "...'; the layouts are gpt2, llama, bert"),
    ("st-slice-arabic-indic-digit", {"p.yaml": st_problem("{file: m.safetensors, tensor: c_attn, cols: '\u0663:4'}"),
                                     "m.safetensors": ST}, {},
     "cols: '\u0663:4' is not a slice like \"0:64\""),
    ("from-layer-5000-digits", {"p.yaml": "X: [[1, 0], [0, 1]]\nfrom: {file: m.safetensors, layout: gpt2, "
                                          f"layer: {MANY}, heads: [1]}}\n", "m.safetensors": ST}, {},
     "p.yaml:2:50: from.layer: layer is the number in the tensor names (h.0 is layer 0): a whole number ≥ 0, not '"
     + "7" * 37 + "...'"),
    ("rope-pairing-5000-characters", {"p.yaml": problem("1") + f"rope: {{pairing: {'h' * 5000}}}\n"}, {},
     "p.yaml:4:17: rope.pairing: unknown pairing '" + "h" * 37 + "...'"),
    ("symbol-5000-characters-twice", {"p.yaml": problem("1") + f"symbols: [{'a' * 5000}, {'a' * 5000}]\n"}, {},
     "symbols item 2: the symbol '" + "a" * 37 + "...' is declared twice"),
    ("fully-masked-query-5000-characters", {"p.yaml": problem("1") + f"tokens: [{'t' * 5000}, u]\n"
                                            "mask: [[0, 0], [1, 1]]\n"}, {},
     "(row 1 is the query '" + "t" * 37 + "...')"),
    ("unknown-mask-word-5000-characters", {"p.yaml": problem("1") + f"mask: causal{'x' * 5000}\n"}, {},
     "p.yaml:4:7: mask: unknown mask 'causalxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"),
]

# `symattn check causal_4_tokens.yaml ANSWERS`: (id, files, special, fragment)
CHECK = [
    ("deep-flow", {"a.yaml": "A: " + "[" * 1000 + "1" + "]" * 1000 + "\n"}, {}, "a.yaml:1:"),
    ("deep-block", {"a.yaml": "A:\n" + "- " * 3000 + "1\n"}, {}, "nested more than 100 levels deep"),
    ("lone-surrogate", {"a.yaml": 'A: [["\\ud800"]]\n'}, {}, "a.yaml:1:6: invalid YAML: the escape of U+D800"),
    ("fifo", {}, {"a.yaml": _fifo}, "a.yaml: is a FIFO (named pipe), not a regular file"),
    ("dev-zero", {}, {"a.yaml": _link("/dev/zero")}, "a.yaml: is a device, not a regular file"),
    ("symlink-loop", {}, {"loop_a.yaml": _loop}, "the path is a loop of symbolic links"),
    ("e-tower", {"a.yaml": answer('"e^e^e^e^e"')}, {}, "'e^e^e^e^e': this part is larger than 10^300 in size"),
    ("e-tower-nested", {"a.yaml": answer('"e^(e^(e^(e^(e^(1/9)))))"')}, {}, "nested more than 4 deep"),
    ("e-tower-4", {"a.yaml": answer('"e^e^e^e"')}, {}, "is larger than 10^300 in size"),
    ("exp-1000", {"a.yaml": answer('"exp(1000)"')}, {}, "'exp(1000)' is larger than 10^300 in size"),
    ("e-to-the-1000", {"a.yaml": answer('"e^1000"')}, {}, "'e^1000' is larger than 10^300 in size"),
    ("log-11-deep", {"a.yaml": answer(LOG_11)}, {}, "exp, log and sqrt are nested more than 4 deep"),
    ("power-of-14000-bits", {"a.yaml": answer('"(2^19/3^12)^1000"')}, {}, "holds a number of more than 14,000 bits"),
    ("big-file", {"a.yaml": "A: [[" + "0.25, " * 1_000_000 + "1]]\n"}, {}, "a.yaml: the file is"),
    ("many-list-items", {"a.yaml": "A:\n" + "- [1]\n" * 100_000}, {}, "a.yaml: the file has 100,000 list items"),
    ("many-values", {"a.yaml": "A: {" + ", ".join(f"k{i}: 1" for i in range(6000)) + "}\n"}, {},
     "values (numbers, words and aliases)"),
    # a head number in digits other than 0-9, or of a million digits (an explicit key: a plain
    # one is at most 1024 characters)
    ("stage-id-superscript", {"a.yaml": "head².S: [[1]]\n"}, {}, "a.yaml:1:1: 'head².S' is not a computed stage"),
    ("stage-id-fullwidth", {"a.yaml": "head３.S: [[1]]\n"}, {}, "a.yaml:1:1: 'head３.S' is not a computed stage"),
    ("stage-id-million-digits", {"a.yaml": f"? head{MILLION}.S\n: [[1]]\n"}, {},
     "a.yaml:1:3: 'head" + "7" * 33 + "...' is not a computed stage of this problem; the stages are Q, K, V,"),
    ("stage-id-a-list", {"a.yaml": "[S]: [[1]]\n"}, {}, "a.yaml:1:1: a stage id is a name such as S or head1.A, not a list"),
]


def _make(tmp_path: Path, files: dict, special: dict) -> list:
    keep = []
    for name, content in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    for name, make in special.items():
        made = make(tmp_path / name)
        if made is not None:
            keep.append(made)  # a socket stays bound while the child runs
    return keep


def _assert_refused(r, fragment: str) -> str:
    r.assert_bounded()
    assert r.code == 1, f"exit {r.code}: {r.err!r}"
    line = r.one_error_line()
    assert fragment in line, line
    assert len(line) <= SHORT_LINE, f"{len(line):,} characters: {line[:SHORT_LINE]}..."
    assert r.peak_bytes < GIB
    return line


@pytest.mark.parametrize(("case", "files", "special", "fragment"), DERIVE, ids=[c[0] for c in DERIVE])
def test_derive_refuses_hostile_input(tmp_path, case, files, special, fragment):
    keep = _make(tmp_path, files, special)
    target = "p.yaml" if "p.yaml" in files or "p.yaml" in special else next(iter(special))
    r = run_cli(["derive", target, "-f", "json"], cwd=tmp_path)
    for s in keep:
        s.close()
    line = _assert_refused(r, fragment)
    assert line.startswith(f"Error: {target}"), line
    assert len(line) < 500, len(line)  # a hostile value is quoted in part, never whole


@pytest.mark.parametrize(("case", "files", "special", "fragment"), CHECK, ids=[c[0] for c in CHECK])
def test_check_refuses_hostile_answers(tmp_path, case, files, special, fragment):
    _make(tmp_path, files, special)
    target = "a.yaml" if "a.yaml" in special or any(f.startswith("a.yaml") for f in files) else next(iter(special))
    r = run_cli(["check", CAUSAL, target], cwd=tmp_path)
    line = _assert_refused(r, fragment)
    assert line.startswith(f"Error: {target}"), line


def test_check_marks_the_other_files_when_one_is_special(tmp_path):
    """Several answers files: the FIFO is reported for itself, the others are still marked."""
    _fifo(tmp_path / "fifo.yaml")
    (tmp_path / "good.yaml").write_text(answer("1"), encoding="utf-8")  # well-formed; marked, not refused
    (tmp_path / "tower.yaml").write_text(answer('"e^e^e^e^e"'), encoding="utf-8")
    r = run_cli(["check", CAUSAL, "fifo.yaml", "good.yaml", "tower.yaml"], cwd=tmp_path)
    assert not r.killed and r.code == 1 and "Traceback" not in r.err, r.err
    assert "fifo.yaml: ERROR fifo.yaml: is a FIFO (named pipe)" in r.out
    assert "tower.yaml: ERROR" in r.out and "larger than 10^300" in r.out
    assert "good.yaml: wrong: A" in r.out or "good.yaml: all right" in r.out


def test_a_file_that_grows_past_the_limit_is_not_read_past_it(tmp_path):
    """--max-size 10 allows 640 bytes: a bigger file is refused from its size, before reading."""
    path = tmp_path / "p.yaml"
    path.write_text(problem("1") + "#" * 1000 + "\n", encoding="utf-8")
    r = run_cli(["derive", "p.yaml", "-f", "json", "--max-size", "10"], cwd=tmp_path)
    _assert_refused(r, f"p.yaml: the file is {path.stat().st_size:,} bytes, more than the limit of 640 for 10 numbers")


def test_the_cost_of_refusing_a_30_MB_file(tmp_path):
    """The issue's worst big-file rows, refused from a bounded reading: time and peak memory."""
    _big_row(tmp_path / "p.yaml")
    r = run_cli(["derive", "p.yaml", "-f", "json"], cwd=tmp_path)
    _assert_refused(r, "the row has more than 1,000,000 entries")
    assert r.cpu_seconds < 5 and r.peak_bytes < 512 * MB, (r.cpu_seconds, r.peak_bytes)


# Whole-number options, read in the digits 0-9 alone and bounded before converting. A bad option
# value is a usage error (exit 2, as for --digits 0); its line quotes a short excerpt.
ARGUMENT = "9" * 100_000  # within Linux's 128 KiB for one argument
OPTIONS = [
    ("generate-seed-arabic-indic", ["generate", "--seed", "٣"], 2, "Invalid value for '--seed': '٣' is not a whole number"),
    ("generate-count-fullwidth", ["generate", "--count", "３", "--out-dir", "out"], 2,
     "Invalid value for '--count': '３' is not a whole number"),
    ("generate-tokens-underscore", ["generate", "--tokens", "1_0"], 2,
     "Invalid value for '--tokens': '1_0' is not a whole number"),
    ("generate-tokens-100000-digits", ["generate", "--tokens", ARGUMENT], 2,
     "Invalid value for '--tokens': '" + "9" * 37 + "...' has 100,000 digits; a whole number here has at most 40"),
    ("derive-max-size-100000-digits", ["derive", "--max-size", ARGUMENT], 2, "Invalid value for '--max-size': '999"),
    ("derive-decode-100000-digits", ["derive", "--decode", ARGUMENT], 2, "Invalid value for '--decode': '999"),
    ("generate-range-100000-digits", ["generate", "--range", "1.." + ARGUMENT], 2,
     "Invalid value for '--range': '999"),
    ("generate-sliding-window-100000-digits", ["generate", "--mask", "sliding-window:" + ARGUMENT], 1,
     "Error: --mask sliding-window:N: '999"),
    ("generate-unknown-mask-100000-characters", ["generate", "--mask", "x" * 100_000], 1, "Error: unknown mask 'xxx"),
]


@pytest.mark.parametrize(("case", "args", "code", "fragment"), OPTIONS, ids=[c[0] for c in OPTIONS])
def test_whole_number_options_are_ascii_digits_and_bounded(tmp_path, case, args, code, fragment):
    r = run_cli(args, cwd=tmp_path)
    assert not r.killed and "Traceback" not in r.err, r.err[-300:]
    assert r.code == code, f"exit {r.code}: {r.err[:300]!r}"
    line = next(x for x in r.err.splitlines() if x.startswith("Error: "))
    assert fragment in line, line[:300]
    assert len(line) <= SHORT_LINE, f"{len(line):,} characters: {line[:SHORT_LINE]}..."
    assert r.out == "" and list(tmp_path.iterdir()) == []


# Angles float64 cannot hold: NumPy's reference is wrong there, and the cross-check declines with
# the reason (never "a bug in symattn"), with no NumPy warning on the way.
QK_3 = "Q: [[1, 0], [0, 1], [1, 1]]\nK: [[1, 0], [0, 1], [1, 1]]\nV: [[1, 2], [3, 4], [5, 6]]\n"
QK_4 = "Q: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]\nK: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 1, 1]]\nV: [[1], [2], [3]]\n"
X_4 = "X: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]]\n"
WIDE = 44  # θ_21 = base^(-42/44): 5e-324 to that power is past float64's range, so NumPy overflowed


def _unit_rows(d: int, ones: list[int]) -> str:
    return "[" + ", ".join("[" + ", ".join("1" if j == k else "0" for j in range(d)) + "]" for k in ones) + "]"


def _llama_layer(d: int = 4) -> bytes:
    """A one-head LLaMA layer of width d, weights 0, 1, 2, ... (exact in float32)."""
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    return safetensors({f"model.layers.0.self_attn.{n}.weight": f32(d, d) for n in names})


ANGLES = [
    ("rope-angle-10^30+1", {"p.yaml": QK_3 + 'rope: {angles: ["10^30 + 1"]}\n'}, "RoPE's angles",
     "an angle as large as 2e+30 radians is rounded by up to"),
    ("rope-angle-pi^600", {"p.yaml": QK_3 + 'rope: {angles: ["pi^600"]}\n'}, "RoPE's angles", "as large as 3.9e+298"),
    ("rope-base-10^-300", {"p.yaml": QK_4 + 'rope: {base: "1/10^300"}\n'}, "RoPE's angles", "as large as 2e+150"),
    ("sinusoidal-base-10^-300", {"p.yaml": X_4 + "W_Q: [[1], [0], [1], [0]]\nW_K: [[0], [1], [1], [0]]\n"
                                 "W_V: [[1], [1], [0], [0]]\npositions: {sinusoidal: {base: \"1/10^300\"}}\n"},
     "the sinusoidal positions' angles", "as large as 2e+150"),
    ("rope-base-5e-324-overflowing", {"p.yaml": f"Q: {_unit_rows(WIDE, [0, WIDE - 1])}\nK: {_unit_rows(WIDE, [WIDE - 1, 0])}\n"
                                      "V: [[1], [2]]\nrope: {base: 5e-324}\n"},
     "RoPE's θ_i reach about 10^309", "beyond float64's range"),
    ("rope-base-1e-330", {"p.yaml": QK_4 + "rope: {base: 1e-330}\n"}, "RoPE's base 1.00e-330",
     "below float64's smallest number (about 4.9e-324), so NumPy would hold it as 0"),
    ("rope-theta-5e-324-in-config", {"p.yaml": f"X: {_unit_rows(WIDE, [0])}\n"
                                               "from: {file: model.safetensors, layout: llama, layer: 0, heads: all}\n",
                                     "model.safetensors": _llama_layer(WIDE),
                                     "config.json": json.dumps({"num_attention_heads": 1, "rope_theta": 5e-324})},
     "RoPE's θ_i reach about 10^309", "beyond float64's range"),
]


@pytest.mark.parametrize(("case", "files", "whose", "why"), ANGLES, ids=[c[0] for c in ANGLES])
def test_the_cross_check_declines_angles_float64_cannot_hold(tmp_path, case, files, whose, why):
    _make(tmp_path, files, {})
    r = run_cli(["derive", "p.yaml", "-f", "json"], cwd=tmp_path)
    r.assert_bounded()
    assert r.code == 0, r.err
    check = json.loads(r.out)["crosscheck"]  # the solution, with the reason the check declined
    assert check["passed"] is None and whose in check["skipped"] and why in check["skipped"], check
    note, = r.err.splitlines()  # one line: no "bug in symattn", no RuntimeWarning
    assert note == f"Note: no numeric cross-check: {check['skipped']}.", r.err


HELD = [
    # θ = 10^5 at positions 0, 1, 2: float64 rounds 2·10^5 by about 10^-11, well inside the tolerance
    ("rope-angle-10^5", {"p.yaml": QK_3 + 'rope: {angles: ["10^5"]}\n'}),
    # a config's rope_theta is read from its JSON text (0.5 is 1/2): θ_1 = base^(-1/2) = √2, small
    # angles that float64 holds, so the layer is compared. (Its 5e-324 is 5/10^324, not float64's
    # 2^-1074: θ_1 near 4.5·10^161 is declined, as "rope-theta-5e-324-in-config" above is.)
    ("rope-theta-1/2-in-config", {"p.yaml": X_4 + "from: {file: model.safetensors, layout: llama, layer: 0, heads: all}\n",
                                  "model.safetensors": _llama_layer(),
                                  "config.json": json.dumps({"num_attention_heads": 1, "rope_theta": 0.5})}),
]


@pytest.mark.parametrize(("case", "files"), HELD, ids=[c[0] for c in HELD])
def test_angles_float64_holds_well_enough_are_still_cross_checked(tmp_path, case, files):
    """NumPy is compared (and agrees) where float64 holds the angles: only angles beyond that are declined."""
    _make(tmp_path, files, {})
    r = run_cli(["derive", "p.yaml", "-f", "json"], cwd=tmp_path)
    r.assert_bounded()
    assert r.code == 0 and r.err == "", r.err
    check = json.loads(r.out)["crosscheck"]
    assert check["passed"] is True and "skipped" not in check, check


# Paths of the wrong kind: one Error line and exit 1, as every other bad path gets (not click's
# usage text and exit 2), before any work, and nothing written. Made at test time: a folder
# "d" (and "d.tex"), a file "f".
PATHS = [
    ("derive-o-folder", ["derive", "-o", "d"], "Error: d: is a folder; symattn writes regular files"),
    ("derive-o-folder-with-a-suffix", ["derive", "-o", "d.tex"], "Error: d.tex: is a folder; symattn writes regular files"),
    ("derive-json-o-folder", ["derive", "-f", "json", "-o", "d"], "Error: d: is a folder; symattn writes regular files"),
    ("derive-plot-folder", ["derive", "--plot", "d", "-o", "out.tex"], "Error: d: is a folder; symattn writes regular files"),
    ("derive-o-under-a-file", ["derive", "-o", "f/out.tex"], "Error: f/out.tex: cannot write there: Not a directory"),
    ("derive-problem-folder", ["derive", "d", "-o", "out.tex"], "Error: d: is a folder, not a problem file"),
    ("check-problem-folder", ["check", "d", "f"], "Error: d: is a folder, not a problem file"),
    ("check-answers-folder", ["check", CAUSAL, "d"], "Error: d: is a folder, not an answers file"),
    ("generate-o-folder", ["generate", "-o", "d"], "Error: d: is a folder; symattn writes regular files"),
    ("generate-out-dir-file", ["generate", "--count", "2", "--out-dir", "f"], "Error: f: is not a folder"),
    ("generate-out-dir-under-a-file", ["generate", "--count", "2", "--out-dir", "f/variants"], "Error: f/variants: /"),
    ("generate-from-folder", ["generate", "--from", "d", "-o", "out.yaml"], "Error: d: is a folder, not a problem file"),
]


@pytest.mark.parametrize(("case", "args", "line"), PATHS, ids=[c[0] for c in PATHS])
def test_a_path_of_the_wrong_kind_is_one_error_line(tmp_path, case, args, line):
    (tmp_path / "d").mkdir()
    (tmp_path / "d.tex").mkdir()
    (tmp_path / "f").write_text("a file\n", encoding="utf-8")
    r = run_cli(args, cwd=tmp_path)
    r.assert_bounded()
    assert r.code == 1 and r.out == "", (r.code, r.err)
    assert r.one_error_line().startswith(line), r.err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d", "d.tex", "f"]  # nothing half-written
    assert (tmp_path / "f").read_text(encoding="utf-8") == "a file\n"


# Bidirectional controls in a title or a token (a right-to-left override would make "c‮at" read
# "cta" in a page): shown as ⟨U+202E⟩ in everything a person reads, never obeyed; the JSON keeps
# the text exact, as data.
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
BIDI_PROBLEM = ('title: "Order \\u202Eevil\\u202C test"\n'
                'tokens: ["The", "c\\u202Eat", "\\u2067sat\\u2069", "' + "".join(f"\\u{ord(c):04X}" for c in BIDI) + 'x"]\n'
                "X: [[1, 0], [0, 1], [1, 1], [0, 2]]\nW_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1, 0], [0, 1]]\n"
                "mask: causal\n")


@pytest.mark.parametrize("fmt", ["html", "markdown", "text", "latex", "json"])
def test_bidirectional_controls_are_shown_not_obeyed(tmp_path, fmt):
    (tmp_path / "p.yaml").write_text(BIDI_PROBLEM, encoding="utf-8")
    r = run_cli(["derive", "p.yaml", "-f", fmt], cwd=tmp_path)
    r.assert_bounded()
    assert r.code == 0 and r.err == "", r.err
    if fmt == "json":
        assert json.loads(r.out)["title"] == "Order \u202eevil\u202c test"  # data: the text as written
        return
    assert not any(c in r.out for c in BIDI), [hex(ord(c)) for c in BIDI if c in r.out]
    shown = {"html": "⟨U+202E⟩", "markdown": "⟨U+202E⟩", "text": "⟨U+202E⟩",
             "latex": r"\ensuremath{\langle}U+202E\ensuremath{\rangle}"}[fmt]
    assert f"Order {shown}evil" in r.out  # the title
    if fmt == "html":
        assert "<title>Order ⟨U+202E⟩evil⟨U+202C⟩ test</title>" in r.out
        assert "c⟨U+202E⟩at" in r.out and "⟨U+2067⟩sat⟨U+2069⟩" in r.out  # the tokens, in prose and tables
    if fmt == "text":
        lines = r.out.splitlines()
        assert lines[1] == "=" * len(lines[0])  # the title's rule as long as the title shown
        grid = [line for line in lines if line.startswith(("    The ", "    c⟨U+202E⟩at ", "    ⟨U+2067⟩sat⟨U+2069⟩ "))]
        assert len({line.index(" [") for line in grid}) == 1, grid  # the rows stay aligned
        assert "".join(f"⟨U+{ord(c):04X}⟩" for c in BIDI) + "x" in r.out
    if fmt in ("latex", "markdown"):  # a token in math: {\langle}\text{U+202E}{\rangle}, as MathJax and KaTeX print it
        assert r"\text{c}{\langle}\text{U+202E}{\rangle}\text{at}" in r.out


def test_bidirectional_controls_are_shown_in_the_heat_map(monkeypatch):
    """The heat map's tick labels (drawn by matplotlib, which reorders nothing itself but prints
    what it is given): the tokens with their controls shown."""
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    import symattn
    from symattn.render.plot import plot_weights

    ticks = []
    real = matplotlib.axes.Axes.set_xticks, matplotlib.axes.Axes.set_yticks

    def recording(which):
        def set_ticks(self, positions, labels=None, **kw):
            ticks.append(list(labels))
            return real[which](self, positions, labels=labels, **kw)
        return set_ticks

    monkeypatch.setattr(matplotlib.axes.Axes, "set_xticks", recording(0))
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yticks", recording(1))
    problem = ('tokens: ["The", "c\\u202Eat", "\\u2067sat\\u2069"]\nX: [[1, 0], [0, 1], [1, 1]]\n'
               "W_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1, 0], [0, 1]]\nmask: causal\n")
    image = plot_weights(symattn.derive(symattn.load_problem(problem)), ".png")
    assert image.startswith(b"\x89PNG")
    want = ["The", "c⟨U+202E⟩at", "⟨U+2067⟩sat⟨U+2069⟩"]
    assert ticks == [want, want]


# -- SIGTERM in the middle of a long run ------------------------------------------------------------
# The child's CPU time is read from /proc as it runs: the signal is sent once it has done that much
# work, and what it costs to stop is the CPU time it uses after the signal. No clock is read, so a
# busy machine changes nothing.
AFTER_SIGTERM_CPU_S = 1.0  # stopping takes about 0.05 s: the handler runs at the next bytecode


def _cpu_s(pid: int) -> float:
    """The user and system CPU seconds process ``pid`` has used so far (Linux's /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sigterm_after(args: list[str], cwd: Path, cpu_s: float):
    """Run ``python -m symattn ARGS``, SIGTERM it once it has used ``cpu_s`` CPU seconds; returns
    (exit code, stderr, CPU seconds used after the signal, or None when it ended before)."""
    import signal
    import subprocess
    import sys
    import time

    from _child import ROOT as CHECKOUT

    env = dict(os.environ, PYTHONPATH=str(CHECKOUT), NO_COLOR="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    with open(cwd / ".stderr", "w+b") as err:
        proc = subprocess.Popen([sys.executable, "-m", "symattn", *map(str, args)], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        sent = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if sent is None and _cpu_s(proc.pid) >= cpu_s:
                sent = _cpu_s(proc.pid)
                proc.send_signal(signal.SIGTERM)
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode("utf-8", "replace")
    os.remove(cwd / ".stderr")
    return proc.returncode, text, None if sent is None else usage.ru_utime + usage.ru_stime - sent


def _causal_problem(n: int, d: int = 4) -> str:
    import random

    draw = random.Random(1)
    rows = lambda: "[" + ", ".join("[" + ", ".join(str(draw.randint(-2, 2)) for _ in range(d)) + "]"
                                   for _ in range(n)) + "]"
    return f"Q: {rows()}\nK: {rows()}\nV: {rows()}\nmask: causal\n"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the child's CPU time from /proc")
def test_sigterm_stops_a_long_derivation_at_once(tmp_path):
    """960 causal tokens (921,600 scores, within the budget): about 7 CPU seconds of derivation,
    stopped after one: it exits 1 with one line, and no output file or temporary file is left."""
    (tmp_path / "p.yaml").write_text(_causal_problem(960), encoding="utf-8")
    code, err, after = _sigterm_after(["derive", "p.yaml", "-o", "out.txt"], tmp_path, cpu_s=1.0)
    if after is None:
        pytest.skip(f"the derivation ended before it had used 1 CPU second (exit {code})")
    assert after < AFTER_SIGTERM_CPU_S, f"{after:.2f} CPU seconds after SIGTERM"
    assert code == 1 and err == "Error: stopped by SIGTERM; no output file was left half-written\n", (code, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


_SWALLOWS_ONCE = """
import sys, time
from symattn.cli import app

def spin(cpu_s):
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass

def swallowing(args):
    try:
        spin(30)  # the signal lands here: its exception is lost, as a library's bare except or a finaliser loses it
    except BaseException:
        pass
    spin(30)
    return 0

app.run_command = swallowing
sys.exit(app.main(sys.argv[1:]))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the child's CPU time from /proc")
def test_sigterm_is_raised_again_when_its_exception_is_lost(tmp_path):
    """The first SIGTERM's exception is swallowed; a timer of CPU time raises it again within
    0.1 CPU seconds, so the run still stops at once with its one line (it ran 30 seconds more)."""
    import signal
    import subprocess
    import sys
    import time

    from _child import ROOT as CHECKOUT

    env = dict(os.environ, PYTHONPATH=str(CHECKOUT))
    proc = subprocess.Popen([sys.executable, "-c", _SWALLOWS_ONCE], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sent = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if sent is None and _cpu_s(proc.pid) >= 1.0:
            sent = _cpu_s(proc.pid)
            proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.stderr.close()
    assert sent is not None
    after = usage.ru_utime + usage.ru_stime - sent
    assert after < AFTER_SIGTERM_CPU_S, f"{after:.2f} CPU seconds after SIGTERM"
    assert os.waitstatus_to_exitcode(status) == 1
    assert err == "Error: stopped by SIGTERM; no output file was left half-written\n", err


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the child's CPU time from /proc")
def test_sigterm_is_not_held_up_by_a_long_number(tmp_path):
    """A million-digit tiling.block was converted in one C call of 30 CPU seconds that no signal
    interrupts. Bounded, it is refused within about 2 CPU seconds of reading the file; a SIGTERM
    sent at 3 seconds, if it is still running, stops it at once."""
    (tmp_path / "p.yaml").write_text(problem("1") + f"tiling: {{block: {MILLION}}}\n", encoding="utf-8")
    code, err, after = _sigterm_after(["derive", "p.yaml", "-o", "out.txt"], tmp_path, cpu_s=3.0)
    assert after is None or after < AFTER_SIGTERM_CPU_S, f"{after:.2f} CPU seconds after SIGTERM"
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("Error: "), (code, err[:300])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
