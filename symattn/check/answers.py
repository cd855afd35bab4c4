"""Reading answers: an answers file's YAML, or Python values, checked against the derivation's stages.

Each entry becomes an :class:`Entry`: its text, its exact value, and the half-unit of its last
written place (None when it is exact), which the marking rules (:mod:`symattn.check.marker`) use.
"""

from __future__ import annotations

import decimal
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import mpmath
import sympy
import yaml

from ..problem import located_yaml as _yaml
from .. import stages
from ..errors import SymattnError
from ..reading import FileError, read_regular
from ..numbers.parse import MAX_TEXT, NumberError, parse_number
from ..text import did_you_mean, excerpt
from ..exact.derivation import Derivation

DPS = 30
# The size of an answers file: this much, plus so much per entry of the problem's computed stages.
ANSWERS_BYTES = 1_000_000
ANSWER_BYTES_PER_ENTRY = 64
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+(?=[eE]))(?:[eE][-+]?[0-9]+)?\Z")
_E = {"e": sympy.E}
_LONGEST_ID = 100  # characters: a longer key is no misspelt stage id, and difflib is not run over it
NINF = mpmath.ninf

Grid = list[list[mpmath.mpf]]



@dataclass(frozen=True)
class Entry:
    """One answer entry: its text, exact value, and the half-unit of its last written place (None if exact)."""

    text: str
    value: sympy.Expr
    half_unit: mpmath.mpf | None

    @cached_property
    def approx(self) -> mpmath.mpf:
        return _approx(self.value)


@dataclass(frozen=True)
class Answer:
    """A student's matrix for one stage."""

    id: str
    entries: tuple[tuple[Entry, ...], ...]
    line: int | None  # of its stage id in the answers file (None for Python values)

    @cached_property
    def values(self) -> Grid:  # computed once: marking compares it with many candidates
        return [[e.approx for e in row] for row in self.entries]

    @property
    def coarsest(self) -> mpmath.mpf:
        """The largest half-unit among the entries (0 when all are exact)."""
        units = [e.half_unit for row in self.entries for e in row if e.half_unit is not None]
        return max(units, default=mpmath.mpf(0))




def load_answers(path: str | Path, derivation: Derivation) -> dict[str, Answer]:
    """Read and validate an answers file against the derivation's stages."""
    name = str(path)
    try:
        data = read_regular(path, answers_limit(derivation),
                            "the file is {size} bytes, more than the {limit} an answers file of this problem may be",
                            noun="answers file")
    except FileError as exc:
        raise SymattnError(str(exc), file=name) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SymattnError(f"the file is not UTF-8 text (bad byte at offset {exc.start})", file=name) from None
    if "\x00" in text:
        raise SymattnError("the file holds a NUL byte; it is not a text file", file=name)
    return parse_answers(text, name, derivation)


def answers_limit(derivation: Derivation) -> int:
    """The most bytes an answers file of this derivation's problem may hold."""
    return ANSWERS_BYTES + ANSWER_BYTES_PER_ENTRY * _entries(derivation)


def _entries(derivation: Derivation) -> int:
    """How many entries all the stages an answers file may answer hold together."""
    return sum(rows * cols for rows, cols in (s.shape for s in derivation.steps if not s.given))


def parse_answers(text: str, name: str, derivation: Derivation) -> dict[str, Answer]:
    # every entry, a stage id per row at most, and room for the rest
    root = _yaml.compose(text, name, max_values=2 * _entries(derivation) + 10_000)
    if root is None or _yaml.is_null(root):
        raise SymattnError("the answers file is empty; write stage ids with your matrices, e.g. S: [[1, 2], [3, 4]]", file=name)
    _yaml.check_tags(root, name)
    if not isinstance(root, yaml.MappingNode):
        raise _yaml.where(name, root).error(f"an answers file is a mapping of stage ids to matrices, not {_yaml.kind(root)}")
    out = _read_answers(root.value, _Nodes(name), derivation)
    if not out:
        raise SymattnError("the answers file has no answers", file=name)
    return out


def read_mapping(answers: Mapping, derivation: Derivation) -> dict[str, Answer]:
    """Validate answers given as Python values, ``{stage id: rows}``, with the rules and messages of
    an answers file (an entry is named by its stage, row and column, counting from 1): each entry
    a string as a file writes it, an int, a Fraction, or a float (read as its shortest decimal,
    ``0.4231``, as it was typed)."""
    out = _read_answers(answers.items(), _Values(), derivation)
    if not out:
        raise SymattnError('the answers have no stages; give stage ids with matrices, e.g. {"S": [[1, 2], [3, 4]]}')
    return out


class _Nodes:
    """What :func:`_read_answers` needs to know of an answers file's YAML nodes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def where(self, node) -> _yaml.Where:
        return _yaml.where(self.name, node)

    def key(self, node) -> str | None:
        return node.value if isinstance(node, yaml.ScalarNode) else None

    def line(self, node) -> int | None:
        return node.start_mark.line + 1

    def rows(self, node) -> list | None:
        return node.value if isinstance(node, yaml.SequenceNode) else None

    def text(self, node) -> str | None:
        if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node) or _yaml.is_bool(node):
            return None
        return node.value

    kind = staticmethod(_yaml.kind)


class _Unplaced:
    """A place in Python values: messages name the field alone."""

    def error(self, message: str, field: str | None = None) -> SymattnError:
        return SymattnError(message, field=field)


class _Values:
    """The same for answers given as Python values (see :func:`read_mapping`)."""

    _HERE = _Unplaced()

    def where(self, value) -> _Unplaced:
        return self._HERE

    def key(self, value) -> str | None:
        return value if isinstance(value, str) else None

    def line(self, value) -> int | None:
        return None

    def rows(self, value) -> list | None:
        if isinstance(value, (list, tuple)):
            return list(value)
        if not isinstance(value, (str, bytes, Mapping)) and callable(getattr(value, "tolist", None)):
            listed = value.tolist()  # a NumPy array or a SymPy matrix
            return listed if isinstance(listed, list) else None
        return None

    def text(self, value) -> str | None:
        """An entry as an answers file would write it; None when it is no number."""
        if isinstance(value, str):
            return value
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, numbers.Integral):
            return _digits(int(value))
        if isinstance(value, numbers.Rational):
            top, bottom = _digits(int(value.numerator)), _digits(int(value.denominator))
            return top if bottom == "1" else f"{top}/{bottom}"
        if isinstance(value, float):
            return repr(value)  # the shortest decimal that is this float: what was typed
        if isinstance(value, (numbers.Real, decimal.Decimal)):
            return str(value)  # NumPy's float32 prints its own shortest decimal
        return None

    def kind(self, value) -> str:
        if isinstance(value, (list, tuple)):
            return "a list"
        if isinstance(value, Mapping):
            return "a mapping"
        if value is None:
            return "empty"
        return excerpt(value if isinstance(value, str) else repr(value))


def _digits(n: int) -> str:
    """An integer's decimal digits, or NumberError when it has more than an entry may (before
    Python is asked to print thousands of them)."""
    if n.bit_length() > 4 * MAX_TEXT:
        raise NumberError(f"the entry is longer than {MAX_TEXT} characters")
    return str(n)


def _read_answers(items, values, derivation: Derivation) -> dict[str, Answer]:
    """Each (stage id, matrix) pair checked against the derivation's stages, read by ``values``
    (:class:`_Nodes` for a file's YAML, :class:`_Values` for Python values)."""
    ids = [s.id for s in derivation.steps if not s.given]
    out: dict[str, Answer] = {}
    for key, node in items:
        where = values.where(key)
        stage = values.key(key)
        if stage is None:
            raise where.error(f"a stage id is a name such as S or head1.A, not {values.kind(key)}")
        if stage not in ids and derivation.problem.backward is None and stages.split_id(str(stage))[1] in stages.GRADIENT_NAMES:
            raise where.error(
                f"{stage} is a gradient of the backward pass, which this problem does not derive; "
                "add a backward: section to the problem or mark with --backward"
            )
        if stage not in ids and derivation.problem.tiling is None and stages.split_id(str(stage))[1] in stages.TILED_NAMES:
            raise where.error(
                f"{stage} is a stage of the online (tiled) softmax, which this problem does not derive; "
                "add tiling: {block: B} to the problem or mark with --tiled B"
            )
        head, kind = stages.split_id(str(stage))
        shared = stages.Context(derivation.problem, head).reads(kind, head) if head else head
        if stage not in ids and head and shared != head and head <= len(derivation.problem.heads):
            raise where.error(f"head {head} reads K/V group {derivation.problem.kv_group(head)}, whose {kind} is "
                              f"{stages.stage_id(kind, shared)} (a group's keys and values are written once, "
                              "with its first head)")
        if stage not in ids:
            hint = did_you_mean(stage, ids) if len(stage) <= _LONGEST_ID else ""
            raise where.error(f"{excerpt(stage)} is not a computed stage of this problem{hint}; "
                              f"the stages are {', '.join(ids)}")
        if stage in out:
            raise where.error(f"{stage} is answered twice")
        out[stage] = _read_matrix(values, stage, node, derivation.step(stage).shape, values.line(key))
    return out


def _read_matrix(values, stage: str, node, shape: tuple[int, int], line: int | None) -> Answer:
    where = values.where(node)
    matrix = values.rows(node)
    if not matrix:
        raise where.error(f"an answer is a matrix written as a list of rows, not {values.kind(node)}", stage)
    rows, cols = shape
    if len(matrix) != rows:
        raise where.error(f"{stage} is {rows}×{cols} but the answer has {len(matrix)} rows", stage)
    entries = []
    for i, row in enumerate(matrix):
        cells = values.rows(row)
        if cells is None or len(cells) != cols:
            n = len(cells) if cells is not None else "no"
            future = (" (the cache holds keys 1 to t only: an entry for a key after t used a future key)"
                      if stages.split_id(stage)[1] in (stages.S_T, stages.A_T) and isinstance(n, int) and n > cols else "")
            raise values.where(row).error(f"{stage} has {cols} columns but this row has {n} entries{future}",
                                          f"{stage} row {i + 1}")
        entries.append(tuple(_read_entry(values, f"{stage} row {i + 1}, column {j + 1}", e) for j, e in enumerate(cells)))
    return Answer(stage, tuple(entries), line)


def _read_entry(values, field_name: str, node) -> Entry:
    where = values.where(node)
    try:
        text = values.text(node)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if text is None:
        raise where.error(f"expected a number, not {values.kind(node)}", field_name)
    text = text.strip()
    try:
        value, half = _number(text)
    except NumberError as exc:
        raise where.error(str(exc), field_name) from None
    if value.free_symbols:
        raise where.error(f"{excerpt(text)} is not a number", field_name)
    return Entry(text, value, half)


@lru_cache(maxsize=1 << 14)  # a class's files write the same few hundred numbers again and again
def _number(text: str) -> tuple[sympy.Expr, mpmath.mpf | None]:
    """An entry's exact value and the half-unit of its last written place (None if exact)."""
    value = parse_number(text, symbols=_E, allow_neg_inf=True)
    half = None
    if _DECIMAL.match(text):
        mantissa, _, exponent = text.lower().partition("e")
        places = len(mantissa.partition(".")[2]) - (int(exponent) if exponent else 0)
        half = mpmath.mpf(10) ** (-places) / 2
    return value, half



@lru_cache(maxsize=1 << 14)
def _approx(x: sympy.Expr) -> mpmath.mpf:
    return to_mp(x)


def to_mp(x: sympy.Expr) -> mpmath.mpf:
    """An exact value to :data:`DPS` digits."""
    from ..exact.evaluation import to_mpf

    with mpmath.workdps(DPS + 10):
        return to_mpf(x, DPS)
