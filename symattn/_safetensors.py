"""Matrices cut out of a safetensors checkpoint, read lazily and taken exactly.

``{file: model.safetensors, tensor: NAME, rows: "0:64", cols: "64:128", transpose: true}``
names one 2-dimensional tensor of the file, the rows and columns wanted (Python slice syntax,
parsed here, never evaluated) and whether to transpose it (``nn.Linear`` stores out × in).
Only the slice asked for is read: the file is mapped, not loaded, so a 500 MB checkpoint
costs little. Float16, float32 and float64 values are the dyadic rationals they stand for;
bfloat16 values are read as raw bytes (NumPy has no bfloat16) and widened exactly to float32.

``{file: model.safetensors, embeddings: "wte.weight", tokens: [464, 3797]}`` takes the rows of
an embedding table for the token ids given, each row read on its own (not the table).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import struct

from ._files import FileError, file_error

_SLICE = re.compile(r"\s*([+-]?\d+)?\s*(?::\s*([+-]?\d+)?\s*(?::\s*([+-]?\d+)?\s*)?)?\Z")
_INDEX = re.compile(r"\s*[+-]?\d+\s*\Z")
MAX_HEADER = 100_000_000  # bytes: as the safetensors package allows
_PICKLES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")


class CheckpointError(Exception):
    """Why a tensor cannot be read, in one sentence; the caller adds the place and the field."""


def parse_slice(text: str, n: int, what: str) -> range:
    """The indices of ``text`` (``"3"``, ``"0:64"``, ``"::2"``, ``"-64:"``) into a dimension of
    ``n``; ``what`` is "rows" or "cols". Out-of-range bounds are an error, not clipped."""
    if not isinstance(text, str) or len(text) > 100:
        raise CheckpointError(f"{what}: {text!r} is not a slice like \"0:64\"")
    if _INDEX.match(text):
        i = int(text)
        if not -n <= i < n:
            raise CheckpointError(f"{what}: index {i} is out of range; the tensor has {n} {what}")
        return range(i % n, i % n + 1)
    m = _SLICE.match(text)
    if not m or ":" not in text:
        raise CheckpointError(f"{what}: {text!r} is not a slice like \"0:64\" (start:stop or start:stop:step)")
    start, stop, step = (None if g is None else int(g) for g in m.groups())
    if step == 0:
        raise CheckpointError(f"{what}: {text!r} has a step of 0")
    for bound in (start, stop):
        if bound is not None and not -n <= bound <= n:
            raise CheckpointError(f"{what}: {text!r} is out of range; the tensor has {n} {what} (0:{n})")
    r = range(n)[slice(start, stop, step)]
    if len(r) == 0:
        raise CheckpointError(f"{what}: {text!r} selects no {what} of the {n}")
    return r


def pickle_refusal(rel: str) -> str | None:
    """The message refusing a PyTorch pickle, or None if ``rel`` is not one."""
    if os.path.splitext(rel)[1].lower() not in _PICKLES:
        return None
    return (f"{rel!r} is a pickle (torch.save); symattn does not read pickles, as loading one can run any code: "
            "convert it once with safetensors.torch.save_file(torch.load(PATH, weights_only=True), "
            "'model.safetensors'), or take the model.safetensors the model's page offers")


def _header(fd: int, size: int) -> tuple[dict, int]:
    """The safetensors header's JSON and where the data starts, checked so nothing is read
    past the file: 8 bytes of length, the JSON, then the data."""
    if size < 8:
        raise CheckpointError(f"is not a valid safetensors file: it is {size} bytes, too short for a header")
    (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if length > MAX_HEADER:
        raise CheckpointError(f"is not a valid safetensors file: its header claims {length:,} bytes, "
                              f"more than {MAX_HEADER:,}")
    if 8 + length > size:
        raise CheckpointError(f"is not a valid safetensors file: the header is cut short "
                              f"(it claims {length:,} bytes; the file holds {size - 8:,} after the length)")
    raw = os.pread(fd, length, 8)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise CheckpointError("is not a valid safetensors file: its header is not a JSON object")
    return header, 8 + length


_DTYPES = {"F16": "<f2", "F32": "<f4", "F64": "<f8", "BF16": "<u2",
           "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "U8": "<u1"}


def _open(path):
    """A read-only descriptor of the safetensors file ``path`` and its stat, once it is known
    to be a regular file (no FIFO or device is opened for reading)."""
    why = file_error(path, "safetensors file")
    if why is not None:
        raise CheckpointError(str(why) if str(why).startswith("is ") else f"cannot be read: {why.strerror}")
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CheckpointError(f"cannot be read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        why = file_error(path, "safetensors file")
        if why is not None:
            raise CheckpointError(str(why))
    except OSError as exc:
        os.close(fd)
        raise CheckpointError(f"cannot be read: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _matrix_entry(fd: int, size: int, tensor: str, vector: bool = False):
    """``(dtype name, NumPy dtype, rows, cols, where its bytes start, flat)`` of the 2-dimensional
    ``tensor``, its header entry checked against the file's size. With ``vector`` a 1-dimensional
    tensor (a bias) is a matrix of one row (``flat``)."""
    import numpy as np

    header, data_start = _header(fd, size)
    names = sorted(k for k in header if k != "__metadata__")
    if tensor not in header or tensor == "__metadata__":
        close = difflib.get_close_matches(tensor, names, n=3, cutoff=0.6)
        hint = (" (close: " + ", ".join(repr(c) for c in close) + ")") if close else \
            f" (it holds {len(names)} tensors, e.g. " + ", ".join(repr(c) for c in names[:3]) + ")"
        raise CheckpointError(f"has no tensor {tensor!r}{hint}")
    info = header[tensor]
    try:
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (*shape, begin, end))
    except (TypeError, KeyError, ValueError):
        ok = False
    if not ok:
        raise CheckpointError(f"is not a valid safetensors file: the header's entry for {tensor!r} is malformed")
    flat = vector and len(shape) == 1  # a bias: one row
    if len(shape) != 2 and not flat:
        raise CheckpointError(f"tensor {tensor!r} has shape {list(shape)}; a matrix is a 2-dimensional tensor"
                              + (" (a bias is 1- or 2-dimensional)" if vector else ""))
    if dtype not in _DTYPES:
        raise CheckpointError(f"tensor {tensor!r} holds {dtype} values; symattn reads F16, BF16, F32, F64 and integers")
    item = np.dtype(_DTYPES[dtype])
    n_rows, n_cols = (1, shape[0]) if flat else shape
    if end - begin != n_rows * n_cols * item.itemsize or data_start + end > size:
        raise CheckpointError(f"is not a valid safetensors file: tensor {tensor!r}'s bytes do not fit its shape "
                              "or run past the end of the file (truncated?)")
    return dtype, item, n_rows, n_cols, data_start + begin, flat


def _widen(out, dtype: str):
    """``out`` in native byte order; bfloat16's raw words widened exactly to float32 (bfloat16
    is the top half of a float32)."""
    import numpy as np

    if dtype == "BF16":
        out = (out.astype(np.uint32) << 16).view(np.float32)
    return np.ascontiguousarray(out.astype(out.dtype.newbyteorder("=")))


def read_slice(path, rel: str, tensor: str, rows: str | None, cols: str | None, room: int,
               vector: bool = False, first_rows: int | None = None):
    """The NumPy array (float or integer; bfloat16 widened exactly to float32) of ``tensor``'s
    ``rows`` and ``cols`` in the safetensors file ``path``, at most ``room`` numbers. With
    ``vector`` a 1-dimensional tensor (a bias) is read as a matrix of one row.
    ``first_rows``: with no ``rows`` given, rows 0 to first_rows - 1 (a table of positions)."""

    def pick(n_rows: int):
        if rows is None and first_rows is not None:
            if n_rows < first_rows:
                raise CheckpointError(f"tensor {tensor!r} has {n_rows:,} {'row' if n_rows == 1 else 'rows'}, fewer "
                                      f"than the {first_rows:,} positions needed (one row per token)")
            return range(first_rows)
        return parse_slice(rows, n_rows, "rows") if rows is not None else range(n_rows)

    return _read(path, tensor, pick, cols, room, one_by_one=False, vector=vector)


class TokenError(CheckpointError):
    """A token id that names no row of the table; ``index`` is its place in the list (0-based)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def read_embeddings(path, table: str, ids: list[int], cols: str | None, room: int):
    """The rows ``ids`` (token ids, 0-based as a tokenizer gives them) of the embedding table
    ``table`` in the safetensors file ``path``, in that order, each row read on its own: 16
    tokens of GPT-2's 50257×768 table read 16 rows, not the table."""

    def pick(n_rows: int):
        for k, i in enumerate(ids):
            if i >= n_rows:
                raise TokenError(k, f"token id {i} is past the table's {n_rows:,} rows (ids count from 0 "
                                    f"to {n_rows - 1:,}): is the table {table!r} of the tokenizer's model?")
        return ids

    return _read(path, table, pick, cols, room, one_by_one=True)


def _read(path, tensor: str, pick, cols: str | None, room: int, one_by_one: bool, vector: bool = False):
    """Rows ``pick(n_rows)`` and ``cols`` of the 2-dimensional ``tensor``: each row read on
    its own with ``one_by_one`` (and for bfloat16, which NumPy lacks), else the slice through
    the safetensors package."""
    fd, st = _open(path)
    try:
        dtype, item, n_rows, n_cols, start, flat = _matrix_entry(fd, st.st_size, tensor, vector)
        r = pick(n_rows)
        c = parse_slice(cols, n_cols, "cols") if cols is not None else range(n_cols)
        if len(r) * len(c) > room:
            raise CheckpointError(f"the slice of {tensor!r} is {len(r):,}×{len(c):,}: more numbers than the size "
                                  "limit allows; if it is meant to be this large, raise the limit with --max-size")
        # Read only the wanted rows, each between the first and last wanted column.
        lo, hi = min(c[0], c[-1]), max(c[0], c[-1]) + 1
        if one_by_one or dtype == "BF16":  # bfloat16: the raw 16-bit words, from the header's offsets
            out = _rows(fd, start, item, n_cols, r, lo, hi)
        else:
            r_lo, r_hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
            whole = _package_vector(path, tensor, lo, hi) if flat else _package_slice(path, tensor, r_lo, r_hi, lo, hi)
            out = whole[[i - r_lo for i in r]]
        return _widen(out[:, [j - lo for j in c]], dtype)
    except OSError as exc:
        raise CheckpointError(f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _rows(fd: int, start: int, item, n_cols: int, rows, lo: int, hi: int):
    """Columns lo:hi of each of ``rows``, each read on its own from the file (``pread``): a
    handful of rows of a large table costs a handful of small reads."""
    import numpy as np

    out = np.empty((len(rows), hi - lo), dtype=item)
    width = (hi - lo) * item.itemsize
    for k, i in enumerate(rows):
        chunk = os.pread(fd, width, start + (i * n_cols + lo) * item.itemsize)
        if len(chunk) != width:
            raise CheckpointError("is not a valid safetensors file: it ends before the tensor's data (truncated?)")
        out[k] = np.frombuffer(chunk, dtype=item)
    return out


def _package_slice(path, tensor: str, r_lo: int, r_hi: int, c_lo: int, c_hi: int):
    """Rows r_lo:r_hi and columns c_lo:c_hi of ``tensor`` through the safetensors package,
    which maps the file and reads only the slice (``get_slice``), after checking the header."""
    return _package_read(path, lambda f: f.get_slice(tensor)[r_lo:r_hi, c_lo:c_hi])


def _package_vector(path, tensor: str, c_lo: int, c_hi: int):
    """Entries c_lo:c_hi of the 1-dimensional ``tensor`` (a bias), as one row."""
    return _package_read(path, lambda f: f.get_slice(tensor)[c_lo:c_hi].reshape(1, c_hi - c_lo))


def _package_read(path, read):
    """``read(f)`` of the file opened by the safetensors package; its errors as CheckpointError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(os.fspath(path), framework="numpy") as f:
            return read(f)
    except (SafetensorError, OSError, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"is not a valid safetensors file: {reason}") from None
