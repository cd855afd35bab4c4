"""Matrices from .csv and .npy files: each read from its bytes and checked, the numbers exact
(a binary float is the dyadic rational it stands for)."""

from __future__ import annotations

import csv
import io
import re

from sympy import QQ

from ..errors import SymattnError
from ..numbers.matrices import rational_matrix
from ..numbers.parse import NumberError, check_size, parse_decimal
from ..text import quote_path
from .located_yaml import Where
from .model import Matrix
from .plain_numbers import flow_rational_matrix


def read_csv(data: bytes, rel: str, where_: Where, name: str) -> Matrix:
    """The matrix of a .csv file's bytes (``rel``: its name as written; ``where_``: where it is named)."""
    text = _csv_text(data, rel, where_, name)
    fast = _plain_csv_matrix(text)
    if fast is not None:
        return fast
    rows = _csv_rows(text, rel, where_, name)
    if not rows:
        raise where_.error(f"{quote_path(rel)} holds no numbers", name)
    width = len(rows[0])
    out = []
    for i, row in enumerate(rows):
        if len(row) != width:
            raise where_.error(f"{quote_path(rel)} line {i + 1} has {len(row)} entries but line 1 has {width}", name)
        try:
            out.append([check_size(c, parse_decimal(c)) for c in row])
        except NumberError as exc:
            raise where_.error(f"{quote_path(rel)} line {i + 1}: {exc}", name) from None
    return Matrix(out)


def read_npy(data: bytes, rel: str, where_: Where, name: str, room: int, vector: bool = False) -> Matrix:
    """The matrix of a .npy file's bytes, of at most ``room`` numbers (``vector``: a 1-dimensional
    array is one row)."""
    array = _npy_array(data, rel, where_, name, room, vector)
    if array.ndim != 2 or 0 in array.shape:
        raise where_.error(f"{quote_path(rel)} holds a {array.ndim}-dimensional array of shape {array.shape}; a matrix is 2-dimensional", name)
    rows, cols = array.shape
    if array.dtype.kind in "iu":
        return rational_matrix(rows, cols, [QQ(int(v)) for v in array.ravel().tolist()])
    if array.dtype.kind != "f":
        raise where_.error(f"{quote_path(rel)} holds {array.dtype} values; expected integers or floats", name)
    if not np_isfinite(array):
        raise where_.error(f"{quote_path(rel)} holds NaN or infinite values", name)
    if np_largest(array) > 1e300:
        raise where_.error(f"{quote_path(rel)} holds a value larger than 10^300 in size; use smaller numbers", name)
    # A binary float is exactly a dyadic rational: take that, not its decimal print.
    return float_matrix(array)


def float_matrix(array) -> Matrix:
    """The exact matrix of a 2-d NumPy array of finite binary floats, each the dyadic rational it
    stands for (see :func:`~symattn.numbers.dyadic.float_matrix`: a big one keeps its floats and
    makes its fmpq_mat only when an operation needs it whole)."""
    from ..numbers.dyadic import float_matrix as dyadic_matrix

    return dyadic_matrix(array)


def _csv_text(data: bytes, rel: str, where_: Where, name: str) -> str:
    """The text of a .csv file, which must be UTF-8 (a UTF-8 byte-order mark is allowed)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise where_.error(f"{quote_path(rel)} is UTF-16 text; symattn expects UTF-8: save it as UTF-8 (CSV UTF-8)", name)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise where_.error(
            f"{quote_path(rel)} is not UTF-8 text (bad byte 0x{data[exc.start]:02X} on line {line}, at byte offset {exc.start}); "
            "symattn expects UTF-8: save it as UTF-8 (CSV UTF-8)",
            name,
        ) from None


# A .csv file of plain decimals (perhaps with a power of ten of one or two digits, as
# numpy.savetxt writes them): lines of numbers between commas (spaces around them), blank
# lines, "\n" or "\r\n" line ends. Possessive repeats: no state kept per entry.
_CSV_DECIMAL = r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,2})?"
_CSV_LINE = rf"[ ]*+(?:{_CSV_DECIMAL}(?:[ ]*+,[ ]*+{_CSV_DECIMAL})*+[ ]*+)?"
_PLAIN_CSV = re.compile(rf"{_CSV_LINE}(?:\r?\n{_CSV_LINE})*+")


def _plain_csv_matrix(text: str) -> Matrix | None:
    """The matrix of a .csv file of plain decimals with rows of one length, read as the
    rows of a YAML matrix are; None leaves anything else (and every error) to the csv module."""
    if not _PLAIN_CSV.fullmatch(text):
        return None
    rows = [line for line in text.replace("\r", "").split("\n") if line.strip(" ")]
    return flow_rational_matrix(rows, checked=True) if rows else None  # matched by _PLAIN_CSV


def _csv_rows(text: str, rel: str, where_: Where, name: str) -> list[list[str]]:
    """The non-blank rows of a .csv file's text."""
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise where_.error(f"{quote_path(rel)} line {line} holds a NUL byte; it is not a text file", name)
    reader = csv.reader(io.StringIO(text))
    rows = []
    try:
        for row in reader:
            if row and any(c.strip() for c in row):
                rows.append(row)
    except csv.Error as exc:
        reason = str(exc)
        if "field larger than field limit" in reason:
            reason = f"an entry is longer than {csv.field_size_limit():,} characters"
        raise where_.error(f"{quote_path(rel)} line {reader.line_num}: {reason}", name) from None
    return rows


_NPY_MAGIC = b"\x93NUMPY"
_NPY_MAX_HEADER = 10_000  # characters, as NumPy allows by default


def _npy_array(data: bytes, rel: str, where_: Where, name: str, room: int, vector: bool = False):
    """The array of a .npy file, read from its bytes. Its header is checked first: a plain
    dictionary of descr, fortran_order and shape; a shape of at most ``room`` numbers; as
    many bytes of data as the shape needs. Nothing is allocated from a size the header
    claims."""
    import ast
    import struct

    import numpy as np

    def bad(what: str) -> SymattnError:
        return where_.error(f"{quote_path(rel)} is not a valid .npy file: {what}", name)

    if not data:
        raise where_.error(f"{quote_path(rel)} is empty; a .npy file holds a header and an array (written by numpy.save)", name)
    if data.startswith(b"PK\x03\x04"):
        raise bad("it is a zip archive (an .npz file?); save a single matrix with numpy.save")
    if not data.startswith(_NPY_MAGIC) or len(data) < 8:
        raise bad("it does not start with the .npy signature (\\x93NUMPY)")
    version = (data[6], data[7])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise bad(f"format version {version[0]}.{version[1]} is not one NumPy writes (1.0, 2.0 or 3.0)")
    length_format = "<H" if version == (1, 0) else "<I"
    start = 8 + struct.calcsize(length_format)
    if len(data) < start:
        raise bad("the header is cut short")
    (length,) = struct.unpack_from(length_format, data, 8)
    if length > _NPY_MAX_HEADER:
        raise bad(f"the header is {length:,} bytes long, more than {_NPY_MAX_HEADER:,}")
    if len(data) < start + length:
        raise bad("the header is cut short")
    try:
        header_text = data[start:start + length].decode("utf-8" if version == (3, 0) else "latin-1")
        header = ast.literal_eval(header_text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise bad("the header is not a dictionary of plain values with the keys descr, fortran_order and shape")
    shape, fortran = header["shape"], header["fortran_order"]
    if not (isinstance(shape, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise bad(f"the header's shape is not a tuple of whole numbers ≥ 0: {_short_repr(shape)}")
    if not isinstance(fortran, bool):
        raise bad(f"the header's fortran_order is not True or False: {_short_repr(fortran)}")
    try:
        dtype = np.lib.format.descr_to_dtype(header["descr"])
    except (TypeError, ValueError, KeyError, IndexError, RecursionError):
        raise bad(f"the header's descr is not a NumPy data type: {_short_repr(header['descr'])}") from None
    if vector and len(shape) == 1:  # a bias saved as a 1-dimensional array: one row
        shape = (1, shape[0])
    if len(shape) != 2 or 0 in shape:
        raise where_.error(
            f"{quote_path(rel)} holds a {len(shape)}-dimensional array of shape {_short_repr(shape)}; a matrix is 2-dimensional"
            if len(shape) != 2 else f"{quote_path(rel)} holds an empty array of shape {shape}; a matrix needs numbers",
            name,
        )
    count = shape[0] * shape[1]
    if count > room:
        raise where_.error(
            f"{quote_path(rel)} holds a {shape[0]:,}×{shape[1]:,} matrix: more numbers than the size limit allows; "
            "if it is meant to be this large, raise the limit with --max-size",
            name,
        )
    if dtype.hasobject or dtype.kind not in "iufb" or dtype.subdtype is not None or dtype.names:
        raise where_.error(f"{quote_path(rel)} holds {dtype} values; expected integers or floats", name)
    if dtype.kind == "b":
        raise where_.error(f"{quote_path(rel)} holds bool values; expected integers or floats", name)
    need = count * dtype.itemsize
    have = len(data) - start - length
    if have < need:
        raise bad(f"its header promises a {shape[0]}×{shape[1]} {dtype} matrix ({need:,} bytes) "
                  f"but the file holds {have:,} bytes of data")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=start + length)
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


def _short_repr(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def np_isfinite(array) -> bool:
    import numpy as np

    return bool(np.isfinite(array).all())


def np_largest(array) -> float:
    import numpy as np

    return float(np.abs(array).max())

