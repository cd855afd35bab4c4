"""The fast paths for matrices of plain numbers (integers, decimals, fractions): read straight
from their text to exact rationals, never through SymPy's expression parser. Anything else
(symbols, roots, errors to report) is left to the full parser, :mod:`symattn.numbers.parse`.
"""

from __future__ import annotations

import functools
import re
from typing import Iterable

import yaml
from sympy import QQ

from ..numbers.matrices import rational_matrix, scaled_integer_matrix
from .model import Matrix

# Entries such as 12, -0.125 or 3/4, short enough that no limit of the full parser can apply.
_PLAIN = re.compile(r"(-?)([0-9]{1,30})(?:\.([0-9]{1,30}))?(?:/([1-9][0-9]{0,29}))?")


def plain_rational_matrix(rows: list[list[yaml.Node]]) -> Matrix | None:
    """The matrix, when every entry is a plain integer, decimal or fraction; else None.

    This is the fast path for big matrices: the entries go straight from their text to
    exact rationals, never through SymPy's expression parser. Anything else (symbols,
    roots, errors to report) is left to the full parser.
    """
    texts = []
    for row in rows:
        for entry in row:
            if type(entry) is not yaml.ScalarNode or entry.style:
                return None
            texts.append(entry.value)
    flat = _plain_rationals(texts)
    return None if flat is None else rational_matrix(len(rows), len(rows[0]), flat)


def _plain_rationals(texts: Iterable[str]) -> list | None:
    """Each text as a ``QQ`` number when all are plain integers, decimals or fractions; else None."""
    flat = []
    match = _PLAIN.fullmatch
    for text in texts:
        m = match(text)
        if m is None:
            return None
        sign, whole, frac, den = m.groups()
        if den is not None and (frac is not None or (whole[0] == "0" and len(whole) > 1)):
            return None  # 1.5/2 or 007/3: the full parser says what it thinks
        num = int(whole + frac) if frac else int(whole)
        q = 10 ** len(frac) if frac else int(den) if den else 1
        flat.append(QQ(-num if sign else num, q))
    return flat


def flow_rational_matrix(rows: list[str], checked: bool = False) -> Matrix | None:
    """A matrix cut out of the YAML text as its rows' text (``_yaml.FlowMatrix``), when its
    rows are the same length and every entry is a plain number; else None. ``checked``: the
    reader has matched every entry of ``rows`` with its pattern of plain numbers already (an
    integer or decimal, perhaps with a power of ten or over a denominator; blanks only around the
    commas), so the text is not matched again.

    The common case, integers and decimals (model weights written out, perhaps with their
    trailing zeros dropped, as ``yaml.safe_dump`` does), is read without a Python object per
    entry beyond its integer numerator: every entry is scaled to the most decimals any entry has,
    and the digits are read as integers over that power of ten (with NumPy when every scaled
    numerator has at most 18 digits, else by padding the text).
    """
    width = rows[0].count(",") + 1
    if any(row.count(",") + 1 != width for row in rows):
        return None  # ragged: the usual path says which row
    text = ",".join(rows)
    if "e" in text or "E" in text:
        text = _POWER_OF_TEN.sub(_without_power, text)
    if "/" not in text:
        # Checked, with its powers of ten written out: only integers and decimals are left.
        plain = checked and "e" not in text and "E" not in text
        read = _decimal_numerators(text, plain) if len(rows) * width >= _NUMPY_FROM else None
        if read is not None:
            numerators, decimals = read
            return scaled_integer_matrix(len(numerators) // width, width, numerators, 10 ** decimals)
        first = text.split(",", 1)[0].strip(" \n")
        decimals = len(first) - first.index(".") - 1 if "." in first else 0
        padded = text
        if not _same_decimals(decimals).fullmatch(text):
            decimals = _most_decimals(text, decimals)
            padded = _pad_decimals(text, decimals)
        if _same_decimals(decimals).fullmatch(padded):
            numerators = [int(x) for x in (padded.replace(".", "") if decimals else padded).split(",")]
            return scaled_integer_matrix(len(numerators) // width, width, numerators, 10 ** decimals)
    flat = _plain_rationals(x.strip(" \n") for x in text.split(","))
    return None if flat is None else rational_matrix(len(flat) // width, width, flat)


# A decimal with a power of ten of one or two digits (1.5e-05), and the same number written
# out without it (0.000015): the same digits, the point moved.
_POWER_OF_TEN = re.compile(r"(?<![0-9.])(-?)([0-9]{1,30})(?:\.([0-9]{1,30}))?[eE]([-+]?[0-9]{1,2})(?![0-9./eE])")


def _without_power(m: re.Match) -> str:
    sign, whole, frac, power = m.group(1), m.group(2), m.group(3) or "", int(m.group(4))
    digits, point = whole + frac, len(whole) + power
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _most_decimals(text: str, least: int) -> int:
    """The most digits after a point in ``text``, at least ``least`` (0 to 30; a longer run is
    left to the checks)."""
    if least >= 30 or not _DECIMALS[least + 1].search(text):
        return min(least, 30)
    low, high = least + 1, 30  # some run of ``low`` digits follows a point; none of high + 1
    while low < high:
        mid = (low + high + 1) // 2
        if _DECIMALS[mid].search(text):
            low = mid
        else:
            high = mid - 1
    return low


_DECIMALS = [re.compile(rf"\.[0-9]{{{k}}}") for k in range(31)]


_PLAIN_NUMBER = r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?+"
_PLAIN_NUMBERS = re.compile(rf"[ \n]*+{_PLAIN_NUMBER}(?:[ \n]*+,[ \n]*+{_PLAIN_NUMBER})*+[ \n]*+")
_INT64_DIGITS = 18  # every integer of 18 digits is an int64
_NUMPY_FROM = 256  # entries: a smaller matrix is read by the plain path (no NumPy import for a small problem)


def _decimal_numerators(text: str, plain: bool = False) -> "tuple[numpy.ndarray, int] | None":
    """``(numerators, decimals)``: each number of ``text`` (integers and decimals joined by
    commas) times ``10**decimals`` as int64, ``decimals`` the most digits any number has after its
    point; read with NumPy in a few passes over the whole text (its digits without the point,
    times 10 to the power of the digits it lacks).

    None when ``text`` is anything else, or when some scaled numerator could pass 18 digits (the
    general padding of :func:`_pad_decimals` reads those). ``plain``: the caller has checked
    that ``text`` is integers and decimals joined by commas (blanks around them), so it is not
    matched again here."""
    if not plain and not _PLAIN_NUMBERS.fullmatch(text):
        return None
    import numpy as np

    packed = text.replace(" ", "").replace("\n", "")  # checked above: blanks only around commas
    chars = np.frombuffer(packed.encode("ascii"), dtype=np.uint8)
    ends = np.append(np.flatnonzero(chars == ord(",")), chars.size)  # one past each number
    starts = np.concatenate(([0], ends[:-1] + 1))
    points = np.flatnonzero(chars == ord("."))
    own = np.zeros(ends.size, dtype=np.int64)  # each number's digits after its point
    holder = np.searchsorted(ends, points)
    own[holder] = ends[holder] - points - 1
    decimals = int(own.max())
    before = ends - starts - own - (own > 0)  # the sign and the digits before the point
    if int(before.max()) + decimals > _INT64_DIGITS:
        return None
    digits = _int64s(packed.replace(".", "") if points.size else packed, ends.size)
    return digits * 10 ** (decimals - own), decimals


def _int64s(text: str, count: int) -> "numpy.ndarray":
    """The ``count`` integers of ``text`` (checked: each at most 18 digits, joined by commas) as int64."""
    import warnings

    import numpy as np

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = np.fromstring(text, dtype=np.int64, sep=",")  # the text read in C, no list of pieces
        if out.size == count:
            return out
    except (ValueError, DeprecationWarning):
        pass
    return np.array(text.split(","), dtype=np.int64)


def _pad_decimals(text: str, decimals: int) -> str:
    """``text`` with every number given exactly ``decimals`` digits after the point, by
    appending zeros (an integer gains a point); the same values. One pass per shorter count."""
    if not decimals:
        return text
    if text.count(".") != text.count(",") + 1:  # not one point per number: some integers
        text = _INTEGER.sub(r"\g<0>." + "0" * decimals, text)
    for k in range(1, decimals):
        text = _SHORT_DECIMALS[k].sub(r"\g<0>" + "0" * (decimals - k), text)
    return text


_INTEGER = re.compile(r"(?<![.0-9])[0-9]+(?![.0-9])")
_SHORT_DECIMALS = [re.compile(rf"\.[0-9]{{{k}}}(?![0-9])") for k in range(31)]


@functools.lru_cache(maxsize=None)
def _same_decimals(decimals: int) -> re.Pattern:
    """Rows of numbers (joined by commas) each with exactly ``decimals`` digits after the
    point (none: integers). Possessive repeats: no state kept per entry."""
    number = rf"-?[0-9]{{1,30}}\.[0-9]{{{decimals}}}" if decimals else r"-?[0-9]{1,30}"
    return re.compile(rf"[ \n]*+{number}(?:[ \n]*+,[ \n]*+{number})*+[ \n]*+")

