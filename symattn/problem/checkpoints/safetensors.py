"""Matrices cut out of a safetensors checkpoint, read lazily and taken exactly.

``{file: model.safetensors, tensor: NAME, rows: "0:64", cols: "64:128", transpose: true}``
names one 2-dimensional tensor of the file, the rows and columns wanted (Python slice syntax,
parsed here, never evaluated) and whether to transpose it (``nn.Linear`` stores out × in).
Only the slice asked for is read: each wanted row (or a run of whole rows) is read from the
file on its own, so a 500 MB checkpoint costs little. Float16, float32 and float64 values are
the dyadic rationals they stand for; bfloat16 values are read as raw bytes (NumPy has no
bfloat16) and widened exactly to float32.

``{file: model.safetensors, embeddings: "wte.weight", tokens: [464, 3797]}`` takes the rows of
an embedding table for the token ids given, each row read on its own (not the table).

The header is read once per file and checked whole, for every dtype alike, as the safetensors
package checks it: an object of entries ``{"dtype", "shape", "data_offsets"}`` (and an optional
``__metadata__`` of strings), each tensor's bytes the size its shape and dtype give, the
tensors one after another from the start of the data to the end of the file. Its cost is
bounded before it is parsed: at most :data:`MAX_VALUES` JSON values (counted from the bytes
that can precede one) and :data:`MAX_TENSORS` tensors, no number longer than
:data:`MAX_DIGITS` digits, and a name is quoted in a message only in part.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import struct
from typing import NamedTuple

from ...reading import file_error
from ...text import excerpt

# ASCII digits only: \d would take ٣ (Arabic-Indic three) as 3
_SLICE = re.compile(r"\s*([+-]?[0-9]+)?\s*(?::\s*([+-]?[0-9]+)?\s*(?::\s*([+-]?[0-9]+)?\s*)?)?\Z")
_INDEX = re.compile(r"\s*[+-]?[0-9]+\s*\Z")
_NUMBERS = re.compile(r"\d+")
MAX_HEADER = 100_000_000  # bytes: as the safetensors package allows
# A model's file holds hundreds to a few thousand tensors (GPT-2 about 150, a shard of a
# large model a few hundred, a mixture of experts with each expert's tensors apart a few
# thousand); the bound is thirty times that, and such a header is parsed in about a second.
MAX_TENSORS = 100_000
# Each JSON value is the first of the text or follows one of { [ , :, so counting those bytes
# bounds the values, and the parse's time and memory, before anything is parsed. A tensor's
# entry counts 11 of those bytes and one more per dimension past the first; the bound fits
# MAX_TENSORS tensors of 4 dimensions with room to spare for a __metadata__.
MAX_VALUES = 16 * MAX_TENSORS
MAX_DIGITS = 20  # a header's numbers are sizes and offsets below 2^64: at most 20 digits
_U64 = 1 << 64
_CLOSE = 1000  # names a missing one is compared with (difflib's cost grows with each)
_NAME = 100  # characters of a name shown in a message
_PICKLES = (".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle")
_CHUNK = 1 << 24  # bytes of whole rows read at once


class CheckpointError(Exception):
    """Why a tensor cannot be read, in one sentence; the caller adds the place and the field."""


def quote(name: str) -> str:
    """``name`` quoted for a message, cut to its first characters when it is long."""
    return excerpt(name, _NAME)


def parse_slice(text: str, n: int, what: str) -> range:
    """The indices of ``text`` (``"3"``, ``"0:64"``, ``"::2"``, ``"-64:"``) into a dimension of
    ``n``; ``what`` is "rows" or "cols". Out-of-range bounds are an error, not clipped."""
    if not isinstance(text, str) or len(text) > 100:
        raise CheckpointError(f"{what}: {quote(text) if isinstance(text, str) else repr(text)} is not a slice "
                              "like \"0:64\"")
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


# -- the header -------------------------------------------------------------------------------

# The bits of one value of each dtype the safetensors package knows; symattn reads _READ.
_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
         "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
         "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
_READ = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8",
         "I8": "<i1", "I16": "<i2", "I32": "<i4", "I64": "<i8", "U8": "<u1"}
_READ_NAMES = "F16, BF16, F32, F64, I8, I16, I32, I64 and U8"


class Entry(NamedTuple):
    """A tensor of the header: its dtype, shape, and where its bytes start and end (counted from
    the start of the data, as data_offsets are)."""

    dtype: str
    shape: tuple
    begin: int
    end: int


class _Refused(Exception):
    """A number no safetensors header holds, met while parsing."""


class _Float:
    """A number of the header that is not a whole one (1.5, 1e3, NaN), kept as its text."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text if len(text) <= 24 else text[:21] + "..."

    def __repr__(self) -> str:
        return self.text


def _int(text: str) -> int:
    if len(text) > MAX_DIGITS + 1 or len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"its header holds a number of {len(text.lstrip('-')):,} digits; a safetensors header's "
                       f"numbers are sizes and offsets below 2^64 (at most {MAX_DIGITS} digits)")
    return int(text)


def _object(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"its header names {quote(twice)} twice")
    return out


def _show(value, depth: int = 0) -> str:
    """A short rendering of a JSON value of the header, for a message."""
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, _Float)):
        return repr(value)
    if isinstance(value, list):
        if depth:
            return "[...]"
        return "[" + ", ".join(_show(v, 1) for v in value[:4]) + (", ..." if len(value) > 4 else "") + "]"
    return "{...}"


def _sizes(values) -> bool:
    """Whether ``values`` is a list of whole numbers from 0 to 2^64 - 1 (no bool, no float)."""
    return type(values) is list and all(type(v) is int and 0 <= v < _U64 for v in values)


def _entry(name: str, info) -> Entry:
    """The header's entry for ``name``, its fields checked (its place among the others is not)."""
    if type(info) is dict:
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if type(dtype) is str and _sizes(shape) and _sizes(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]:
            return Entry(dtype, tuple(shape), offsets[0], offsets[1])
    raise _malformed(name, info)


def _malformed(name: str, info) -> CheckpointError:
    """What is wrong with the header's entry ``info`` for ``name``, which :func:`_entry` refused."""
    def bad(why: str):
        return CheckpointError(f"is not a valid safetensors file: the header's entry for {quote(name)} is "
                               f"malformed: {why}")

    if not isinstance(info, dict):
        return bad(f"it is {_show(info)}, not a JSON object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            return bad(f"it has no {key}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str):
        return bad(f"its dtype is {_show(dtype)}, not a name such as \"F32\"")
    if not _sizes(shape):
        return bad(f"its shape is {_show(shape)}, not a list of whole numbers ≥ 0")
    if not _sizes(offsets) or len(offsets) != 2:
        return bad(f"its data_offsets are {_show(offsets)}, not two whole numbers [start, end] ≥ 0")
    return bad(f"its data_offsets {_show(offsets)} end before they start")


def _count(shape: tuple, limit: int) -> int:
    """The number of values of ``shape``, or limit + 1 when it is more than ``limit`` (a lying
    header's product is never built in full)."""
    if 0 in shape:
        return 0
    n = 1
    for d in shape:
        n *= d
        if n > limit:
            return limit + 1
    return n


def _header(fd: int, size: int) -> tuple[dict, int]:
    """The header's tensors (name → :class:`Entry`, offsets from the start of the data) and where the
    data starts, checked whole so nothing is read past the file: 8 bytes of length, the JSON,
    then each tensor's bytes, one after another to the end."""
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
    if len(raw) != length:
        raise CheckpointError("is not a valid safetensors file: the header is cut short")
    values = 1 + sum(raw.count(c) for c in (b"{", b"[", b",", b":"))
    if values > MAX_VALUES:
        raise CheckpointError(f"is not a checkpoint symattn reads: its header ({length:,} bytes) has up to "
                              f"{values:,} JSON values, more than {MAX_VALUES:,}; symattn reads a file of at most "
                              f"{MAX_TENSORS:,} tensors")
    try:
        text = raw.decode("utf-8")
        del raw
        header = json.loads(text, parse_int=_int, parse_float=_Float, parse_constant=_Float,
                            object_pairs_hook=_object)
    except _Refused as exc:
        raise CheckpointError(f"is not a valid safetensors file: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    except MemoryError:  # the values are bounded, but a long text of wide characters is not small
        raise CheckpointError(f"is not a checkpoint symattn reads: its header ({length:,} bytes) does not fit in "
                              "the memory available") from None
    if not isinstance(header, dict):
        raise CheckpointError("is not a valid safetensors file: its header is not a JSON object")
    data_start = 8 + length
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"is not a valid safetensors file: its __metadata__ is {_show(meta)}, not a mapping "
                              "of names to strings")
    if len(header) > MAX_TENSORS:
        raise CheckpointError(f"is not a checkpoint symattn reads: its header lists {len(header):,} tensors, more "
                              f"than the {MAX_TENSORS:,} symattn reads in one file")
    data_size = size - data_start
    entries = {name: _entry(name, info) for name, info in header.items()}
    del header
    at = 0  # the tensors' bytes, one after another from the start of the data
    for name, e in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if e.begin != at:
            raise CheckpointError(f"is not a valid safetensors file: tensor {quote(name)}'s data_offsets "
                                  f"[{e.begin}, {e.end}] overlap another tensor's or leave a gap before them "
                                  "(each tensor's bytes follow the last one's)")
        at = e.end
        bits = _BITS.get(e.dtype)  # a dtype safetensors does not know: only its offsets are checked
        if bits is not None and _count(e.shape, 8 * (e.end - e.begin) // bits) * bits != 8 * (e.end - e.begin) \
                or e.end > data_size:
            raise CheckpointError(f"is not a valid safetensors file: tensor {quote(name)}'s bytes do not fit its "
                                  "shape or run past the end of the file (truncated?)")
    if at != data_size:
        raise CheckpointError(f"is not a valid safetensors file: it holds {data_size - at:,} bytes after its last "
                              "tensor's (the header does not account for the whole file)")
    return entries, data_start


def close_names(name: str, names, cutoff: float) -> list[str]:
    """Up to three of ``names`` close to ``name``, compared with a bounded set of them: those
    with the same numbers in them (the same layer) first, then others, at most _CLOSE."""
    if len(name) > 2 * _NAME:
        return []
    numbers = _NUMBERS.findall(name)
    alike, others = [], []
    for n in names:
        if len(n) <= 2 * _NAME:
            if _NUMBERS.findall(n) == numbers:
                alike.append(n)
                if len(alike) == _CLOSE:
                    break
            elif len(others) < _CLOSE:
                others.append(n)
    import difflib  # only for the message: its import is not paid by every run

    return difflib.get_close_matches(name, (alike + others)[:_CLOSE], n=3, cutoff=cutoff)


def holding(n: int) -> str:
    """``n`` tensors, in words."""
    return "no tensors" if n == 0 else "1 tensor" if n == 1 else f"{n:,} tensors"


def some_names(names) -> str:
    """The first three of ``names`` in sorted order, quoted (without sorting them all)."""
    return ", ".join(quote(n) for n in heapq.nsmallest(3, names))


# -- reading ------------------------------------------------------------------------------------


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


class Checkpoint:
    """A safetensors file, open for reading, its header read and checked once: every slice of
    it is read through the one descriptor (``close`` it, or use it in a ``with``)."""

    def __init__(self, path) -> None:
        self.fd, st = _open(path)
        try:
            self.tensors, self.data_start = _header(self.fd, st.st_size)
        except OSError as exc:
            self.close()
            raise CheckpointError(f"cannot be read: {exc.strerror or exc}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def missing(self, tensor: str) -> str:
        """Why ``tensor`` is not read: the file has no such tensor; its closest names."""
        names = self.tensors.keys()
        close = close_names(tensor, names, 0.6)
        hint = (" (close: " + ", ".join(quote(c) for c in close) + ")") if close else \
            f" (it holds {holding(len(names))}" + (", e.g. " + some_names(names) if names else "") + ")"
        return f"has no tensor {quote(tensor)}{hint}"

    def matrix(self, tensor: str, vector: bool = False):
        """``(entry, NumPy dtype, rows, cols, flat)`` of the 2-dimensional ``tensor``; with
        ``vector`` a 1-dimensional tensor (a bias) is a matrix of one row (``flat``)."""
        import numpy as np

        e = self.tensors.get(tensor)
        if e is None:
            raise CheckpointError(self.missing(tensor))
        shape = list(e.shape)
        flat = vector and len(shape) == 1  # a bias: one row
        if len(shape) != 2 and not flat:
            raise CheckpointError(f"tensor {quote(tensor)} has shape {_show(shape)}; a matrix is a 2-dimensional "
                                  "tensor" + (" (a bias is 1- or 2-dimensional)" if vector else ""))
        if 0 in shape:
            raise CheckpointError(f"tensor {quote(tensor)} has shape {shape}: it holds no numbers, and a matrix has "
                                  "at least one row and one column")
        if e.dtype not in _READ:
            what = e.dtype if re.fullmatch(r"[A-Z0-9_]{1,20}", e.dtype) else quote(e.dtype)
            raise CheckpointError(f"tensor {quote(tensor)} holds {what} values; symattn reads {_READ_NAMES}")
        n_rows, n_cols = (1, shape[0]) if flat else shape
        return e, np.dtype(_READ[e.dtype]), n_rows, n_cols, flat

    def read(self, tensor: str, pick, pick_cols, room: int, vector: bool = False):
        """Rows ``pick(n_rows)`` and columns ``pick_cols(n_cols)`` (each a range or a list of
        indices) of the 2-dimensional ``tensor``, in native byte order (bfloat16 widened exactly
        to float32), at most ``room`` numbers."""
        e, item, n_rows, n_cols, flat = self.matrix(tensor, vector)
        r = pick(n_rows)
        c = pick_cols(n_cols)
        if len(r) * len(c) > room:
            raise CheckpointError(f"the slice of {quote(tensor)} is {len(r):,}×{len(c):,}: more numbers than the "
                                  "size limit allows; if it is meant to be this large, raise the limit with --max-size")
        for wanted, n, what in ((r, n_rows, "rows"), (c, n_cols, "cols")):
            lo, hi = _bounds(wanted)
            if lo < 0 or hi > n:
                raise CheckpointError(f"{what}: the tensor {quote(tensor)} has {n:,} {what}, not the {hi:,} asked for")
        try:
            out = _take(self.fd, self.data_start + e.begin, item, n_cols, r, c)
        except OSError as exc:
            raise CheckpointError(f"cannot be read: {exc.strerror or exc}") from None
        return _widen(out, e.dtype)

    def read_slice(self, tensor: str, rows: str | None, cols: str | None, room: int, vector: bool = False,
                   first_rows: int | None = None):
        """The rows and columns of ``tensor`` :func:`read_slice` reads, from this open file."""

        def pick(n_rows: int):
            if rows is None and first_rows is not None:
                if n_rows < first_rows:
                    raise CheckpointError(f"tensor {quote(tensor)} has {n_rows:,} {'row' if n_rows == 1 else 'rows'}, "
                                          f"fewer than the {first_rows:,} positions needed (one row per token)")
                return range(first_rows)
            return parse_slice(rows, n_rows, "rows") if rows is not None else range(n_rows)

        return self.read(tensor, pick, _columns(cols), room, vector)


def _columns(cols: str | None):
    """The columns ``cols`` ("0:64", or None for all) picks of a tensor of n_cols."""
    return lambda n_cols: parse_slice(cols, n_cols, "cols") if cols is not None else range(n_cols)


def _bounds(indices) -> tuple[int, int]:
    """The least index of a range or list of them, and one past the largest."""
    if isinstance(indices, range):
        return min(indices[0], indices[-1]), max(indices[0], indices[-1]) + 1
    return min(indices), max(indices) + 1


def _take(fd: int, start: int, item, n_cols: int, rows, cols):
    """The ``cols`` of each of ``rows`` (ranges or lists of indices, known to be in range) of the
    matrix of ``n_cols`` columns whose bytes start at ``start``: a run of
    whole rows in reads of up to 16 MB, else each row's span of the wanted columns on its own
    (``pread``), so a handful of rows of a large table costs a handful of small reads."""
    import numpy as np

    lo, hi = _bounds(cols)
    at = (np.arange(cols.start, cols.stop, cols.step, dtype=np.intp) if isinstance(cols, range) else
          np.asarray(cols, dtype=np.intp)) - lo
    out = np.empty((len(rows), len(cols)), dtype=item)
    size = item.itemsize

    def pread(n: int, offset: int):
        chunk = os.pread(fd, n * size, offset)
        if len(chunk) != n * size:
            raise CheckpointError("is not a valid safetensors file: it ends before the tensor's data (truncated?)")
        return np.frombuffer(chunk, dtype=item)

    if isinstance(rows, range) and rows.step == 1 and 2 * (hi - lo) >= n_cols:
        per = max(1, _CHUNK // (n_cols * size))  # whole rows at a time
        for k in range(0, len(rows), per):
            n = min(per, len(rows) - k)
            block = pread(n * n_cols, start + (rows[k] * n_cols) * size).reshape(n, n_cols)
            out[k:k + n] = block[:, lo:hi][:, at]
        return out
    for k, i in enumerate(rows):
        out[k] = pread(hi - lo, start + (i * n_cols + lo) * size)[at]
    return out


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
    with Checkpoint(path) as f:
        return f.read_slice(tensor, rows, cols, room, vector, first_rows)


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
                                    f"to {n_rows - 1:,}): is the table {quote(table)} of the tokenizer's model?")
        return ids

    with Checkpoint(path) as f:
        return f.read(table, pick, _columns(cols), room)
