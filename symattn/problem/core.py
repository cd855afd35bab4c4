"""Problem files: read, validate and turn into an immutable :class:`Problem`.

Everything a user can get wrong is found here, before any arithmetic, and
reported as one :class:`~symattn.SymattnError` line naming the file, line,
column and field.
"""

from __future__ import annotations

import csv
import dataclasses
import difflib
import functools
import io
import itertools
import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import sympy
import yaml
from sympy import QQ

from . import located_yaml as _yaml
from ..errors import SymattnError
from ..numbers.parse import NumberError, check_size, is_positive, parse_decimal, parse_number
from ..text import LongNumber, excerpt, quote_path, whole_number
from .checkpoints import safetensors as _safetensors
from ..reading import FileError, read_regular
from ..numbers.matrices import binary_float_matrix, is_rational, rational_matrix, scaled_integer_matrix
from .rope import Rope
from .located_yaml import Where, where
from .budget import MAX_SIZE  # numbers in one problem (all its matrices); --max-size raises it

BYTES_PER_NUMBER = 64  # the file-size limit is this many bytes per allowed number

FIELDS = (
    "title",
    "tokens",
    "X",
    "context",
    "context_tokens",
    "W_Q",
    "W_K",
    "W_V",
    "Q",
    "K",
    "V",
    "heads",
    "kv_heads",
    "kv",
    "W_O",
    "b_Q",
    "b_K",
    "b_V",
    "b_O",
    "mask",
    "bias",
    "scale",
    "symbols",
    "values",
    "digits",
    "backward",
    "rope",
    "tiling",
    "positions",
    "decode",
    "from",
)
MASK_WORDS = ("none", "causal", "causal-bottom-right")
BIAS_NAMES = ("b_Q", "b_K", "b_V")  # a head's projection biases (b_O is the layer's)

Matrix = sympy.ImmutableMatrix
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RESERVED = {"sqrt", "exp", "log", "e", "inf", "nan", "oo"}


@dataclass(frozen=True)
class Mask:
    """Which positions each query may attend to.

    ``kind`` is ``none``, ``causal``, ``causal-bottom-right``,
    ``sliding-window`` (with ``window``) or ``matrix`` (given 0/1 entries);
    ``allowed[i][j]`` says whether query i may attend to key j.
    """

    kind: str
    allowed: tuple[tuple[bool, ...], ...]
    window: int | None = None
    keys: tuple[bool, ...] | None = None  # padding and valid-length: which keys are real tokens
    valid_length: int | None = None
    parts: tuple["Mask", ...] = ()  # combined: the masks whose allowed sets are intersected

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds this mask is made of (its parts' for a combined mask)."""
        return frozenset(p.kind for p in self.parts) if self.parts else frozenset({self.kind})

    def rule(self) -> str:
        """The mask's rule in words, for the worked solution (math marked ⟦…⟧, see symattn.render.prose)."""
        if self.kind == "combined":
            return (f"the AND of {len(self.parts)} masks (a key is allowed only where every one allows it): "
                    + "; and ".join(part.rule() for part in self.parts))
        if self.kind == "padding":
            vector = ", ".join("1" if k else "0" for k in self.keys)
            pads = [str(j + 1) for j, k in enumerate(self.keys) if not k]
            which = (f"key{'s' if len(pads) > 1 else ''} {_and(pads)} {'are' if len(pads) > 1 else 'is'} padding"
                     if pads else "no key is padding")
            return (f"key padding ⟦p = ({vector})⟧: every query may attend to key ⟦j⟧ only when ⟦p_j = 1⟧ "
                    f"(a real token), never to padding (⟦p_j = 0⟧); {which}")
        if self.kind == "valid-length":
            n = self.valid_length
            return (f"valid length ⟦{n}⟧: every query may attend to keys ⟦j \\le {n}⟧ only; "
                    + (f"the keys after the first ⟦{n}⟧ are padding" if n < len(self.keys) else "no key is padding"))
        return {
            "none": "no mask: every query may attend to every key",
            "causal": "causal: query ⟦i⟧ may attend to keys ⟦j \\le i⟧ (no looking ahead)",
            "causal-bottom-right": "causal, aligned bottom-right: query ⟦i⟧ may attend to keys ⟦j \\le i + (n_k - n_q)⟧",
            "sliding-window": (f"sliding window of ⟦{self.window}⟧: query ⟦i⟧ may attend to keys ⟦j \\le i⟧ "
                               f"with ⟦i - j < {self.window}⟧"),
            "matrix": "given matrix: ⟦1⟧ = may attend, ⟦0⟧ = may not",
        }[self.kind]


SINUSOIDAL_BASE = 10000  # the original transformer's base


def sinusoidal_encoding(n: int, d: int, base: sympy.Expr, start: int = 0, swap: bool = False,
                        pairs: bool = True) -> Matrix:
    """The exact sinusoidal encodings of positions ``start``, ``start + 1``, ... (one row each):
    ``PE[p, 2i] = sin(p / base^(2i/d))`` and ``PE[p, 2i+1] = cos(p / base^(2i/d))``.

    ``swap`` puts cos in the even columns and sin in the odd ones, ``pairs=False`` uses the column
    number k instead of 2i in the exponent: the common slips, for ``symattn check``."""
    base = sympy.sympify(base)

    def entry(p: int, k: int) -> sympy.Expr:
        angle = sympy.Integer(p + start) / base ** sympy.Rational(2 * (k // 2) if pairs else k, d)
        return (sympy.cos if (k % 2 == 1) != swap else sympy.sin)(angle)

    return Matrix(n, d, entry)


@dataclass(frozen=True)
class Positions:
    """Positional encodings added to X before the projections.

    ``kind`` is ``sinusoidal`` (``matrix`` computed exactly from ``base``) or ``learned`` (``matrix``
    given, GPT-2 style); ``matrix`` has one row per query token (position p = 0, 1, ...) and
    d_model columns.
    """

    kind: str
    matrix: Matrix
    base: sympy.Expr | None = None

    def variant(self, **slip) -> Matrix | None:
        """The sinusoidal encodings with one of :func:`sinusoidal_encoding`'s slips; None when learned."""
        if self.kind != "sinusoidal":
            return None
        return sinusoidal_encoding(self.matrix.rows, self.matrix.cols, self.base, **slip)


@dataclass(frozen=True)
class Head:
    """One attention head's weights, and its projection biases (1 × d rows added to every row of
    X·W; None: no bias)."""

    W_Q: Matrix
    W_K: Matrix
    W_V: Matrix
    b_Q: Matrix | None = None
    b_K: Matrix | None = None
    b_V: Matrix | None = None

    @property
    def d_k(self) -> int:
        return self.W_Q.cols

    @property
    def d_v(self) -> int:
        return self.W_V.cols


@dataclass(frozen=True)
class Backward:
    """Where the backward pass starts: the upstream gradient dL/dO.

    ``kind`` is ``"dO"`` (the matrix is dL/dO itself), ``"sum"`` (L = Σ O,
    so dL/dO is all ones; no matrix), ``"weights"`` (L = Σ W ∘ O, the matrix
    is W) or ``"target"`` (L = ½‖O − T‖², the matrix is T).
    """

    kind: str
    matrix: Matrix | None = None

    def describe(self) -> str:
        """The loss in words, for the worked solution (math marked ⟦…⟧, see symattn.render.prose)."""
        d = "⟦\\partial L/\\partial O⟧"
        return {
            "dO": f"the upstream gradient {d} is given",
            "sum": f"the loss is ⟦L = \\sum O⟧ (the sum of every output entry), so {d} is all ones",
            "weights": "the loss is ⟦L = \\sum W \\circ O⟧ (each output entry times its weight), so "
                       "⟦\\partial L/\\partial O = W⟧",
            "target": "the loss is ⟦L = \\tfrac{1}{2}\\|O - T\\|^2⟧ (squared distance to the target ⟦T⟧), so "
                      "⟦\\partial L/\\partial O = O - T⟧",
        }[self.kind]


SUM_LOSS = Backward("sum")


@dataclass(frozen=True)
class Tiling:
    """FlashAttention's online softmax: the keys in blocks of ``block``; ``rows`` are the query
    rows worked block by block in the solution (0-based; None: every row)."""

    block: int
    rows: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Problem:
    """A validated attention problem; every matrix entry is an exact SymPy number.

    Either ``X`` with ``heads`` (one head from the top-level weights, or the
    ``heads`` field with ``W_O``), or ``Q``, ``K``, ``V`` given directly.
    """

    source: str
    title: str
    tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    mask: Mask
    scale: sympy.Expr | str  # "auto", "none" or an exact number
    digits: int
    X: Matrix | None = None
    context: Matrix | None = None
    heads: tuple[Head, ...] = ()
    multi_head: bool = False  # the heads field was used (stage ids get head1. ...)
    W_O: Matrix | None = None
    b_O: Matrix | None = None  # the output projection's bias, 1 × d_out; None: none
    Q: Matrix | None = None
    K: Matrix | None = None
    V: Matrix | None = None
    bias: Matrix | None = None
    symbols: tuple[sympy.Symbol, ...] = ()
    values: tuple[tuple[sympy.Symbol, sympy.Expr], ...] = ()
    backward: Backward | None = None  # the upstream gradient; None: forward pass only
    rope: Rope | None = None  # rotary position embeddings of the queries and keys; None: none
    tiling: Tiling | None = None  # the online (tiled) softmax; None: not derived
    positions: Positions | None = None  # positional encodings added to X; None: X as given
    kv_heads: int | None = None  # grouped-query attention: the heads share K/V in this many groups
    decode: int | None = None  # decode only this token's row from a KV cache (1-based)

    def kv_group(self, head: int) -> int:
        """The K/V group (1-based) that query head ``head`` (1-based) reads: heads
        ``(g−1)·h/g + 1 … g·h/g`` share group g (PyTorch's ``enable_gqa`` and Hugging Face's
        ``repeat_kv`` order)."""
        if not self.kv_heads:
            return head
        return (head - 1) // (len(self.heads) // self.kv_heads) + 1

    def kv_leader(self, head: int) -> int:
        """The first query head of ``head``'s K/V group: the head whose ids hold the group's K and V."""
        if not self.kv_heads:
            return head
        return (self.kv_group(head) - 1) * (len(self.heads) // self.kv_heads) + 1

    @property
    def projected(self) -> bool:
        """True when Q, K, V are computed from X and weights (not given)."""
        return self.X is not None

    @functools.cached_property
    def head_biases(self) -> frozenset[str]:
        """The biases the heads have (of ``b_Q``, ``b_K``, ``b_V``): the heads give a bias all or
        none, so asked once, not once per head (a problem may have thousands of heads)."""
        return frozenset(key for key in ("b_Q", "b_K", "b_V")
                         if self.projected and any(getattr(h, key, None) is not None for h in self.heads))

    def _single(self, name: str) -> Matrix | None:
        if not self.projected or self.multi_head:
            return None
        return getattr(self.heads[0], name)

    @property
    def W_Q(self) -> Matrix | None:
        """The query weights of a single-head problem (None with ``heads`` or Q, K, V given)."""
        return self._single("W_Q")

    @property
    def W_K(self) -> Matrix | None:
        return self._single("W_K")

    @property
    def W_V(self) -> Matrix | None:
        return self._single("W_V")

    @property
    def n_q(self) -> int:
        return (self.X if self.projected else self.Q).rows

    @property
    def n_k(self) -> int:
        if self.projected:
            return (self.context if self.context is not None else self.X).rows
        return self.K.rows

    @property
    def d_model(self) -> int | None:
        return self.X.cols if self.projected else None

    @property
    def d_k(self) -> int:
        """d_k of the (first) head."""
        return self.heads[0].d_k if self.projected else self.Q.cols

    @property
    def d_v(self) -> int:
        """d_v of the (first) head."""
        return self.heads[0].d_v if self.projected else self.V.cols

    def scale_for(self, d_k: int) -> sympy.Expr:
        """The exact factor the scores of a head with this d_k are multiplied by."""
        if self.scale == "auto":
            return 1 / sympy.sqrt(sympy.Integer(d_k))
        if self.scale == "none":
            return sympy.Integer(1)
        return self.scale

    @property
    def scale_value(self) -> sympy.Expr:
        """The exact scale factor of the (first) head."""
        return self.scale_for(self.d_k)

    @property
    def d_out(self) -> int:
        """The width of the final output O."""
        if self.W_O is not None:
            return self.W_O.cols
        return self.d_v

    @property
    def substitutions(self) -> dict[sympy.Symbol, sympy.Expr] | None:
        """Numbers for every symbol (for the numeric cross-check), or None if some are missing."""
        given = dict(self.values)
        if any(s not in given for s in self.symbols):
            return None
        return given


def max_values(max_size: int) -> int:
    """The most YAML values (scalars and aliases) a problem file of ``max_size`` numbers may
    hold: every number, a label per number, and room for the other fields."""
    return 2 * max_size + 10_000


def load_problem(source: str | os.PathLike, max_size: int = MAX_SIZE) -> Problem:
    """Read a problem from a file path, or from YAML text (a string with a newline).

    >>> p = load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nmask: causal\\n")
    >>> p.n_q, p.n_k, p.d_k, p.mask.allowed
    (1, 2, 2, ((True, False),))
    """
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith("{")):
        return parse_problem(source, "<problem>", base_dir=None, max_size=max_size)
    path = Path(source)
    name = str(source)
    limit = BYTES_PER_NUMBER * max_size
    try:
        data = read_regular(
            path, limit,
            "the file is {size} bytes, more than the limit of {limit} for " + f"{max_size:,} numbers; "
            "if it is meant to be this large, raise the limit with --max-size",
            noun="problem file",
        )
    except FileError as exc:
        raise SymattnError(str(exc), file=name) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SymattnError(
            f"the file is not UTF-8 text (bad byte at offset {exc.start})", file=name
        ) from None
    return parse_problem(text, name, base_dir=path.resolve().parent, max_size=max_size)


def parse_problem(text: str, file: str, base_dir: Path | None = None, max_size: int = MAX_SIZE) -> Problem:
    """Validate the YAML ``text`` of a problem; ``file`` names it in messages.

    ``max_size`` bounds the count of numbers in all its matrices together, so a
    small file that repeats a row through YAML aliases cannot demand millions.
    """
    return _Reader(file, base_dir, max_size).read(text)


class _Reader:
    def __init__(self, file: str, base_dir: Path | None, max_size: int = MAX_SIZE) -> None:
        self.file = file
        self.base_dir = base_dir
        self.max_size = max_size
        self.size = 0  # numbers read so far
        self.symbols: dict[str, sympy.Symbol] = {}
        self.read_numbers: dict[tuple[str, bool], sympy.Expr] = {}  # entries read so far, by text
        self.token_ids: dict[str, list[int]] = {}  # X or context looked up in an embedding table: the ids

    # -- the document ------------------------------------------------------

    def read(self, text: str) -> Problem:
        if "\x00" in text:
            raise SymattnError("the file holds a NUL byte; it is not a text file", file=self.file)
        root = _yaml.compose(text, self.file, max_values=max_values(self.max_size))
        if root is None or _yaml.is_null(root):
            raise SymattnError("the file is empty; a problem needs at least X and the weights, or Q, K and V", file=self.file)
        _yaml.check_tags(root, self.file)
        if not isinstance(root, yaml.MappingNode):
            raise self.at(root).error(
                f"a problem file is a mapping of fields (X:, W_Q:, ...), not {_yaml.kind(root)}"
            )
        fields = self.fields(root)
        return self.build(root, fields)

    def at(self, node: yaml.Node) -> Where:
        return where(self.file, node)

    def fields(self, root: yaml.MappingNode) -> dict[str, tuple[yaml.Node, yaml.Node]]:
        fields: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in root.value:
            if not isinstance(key, yaml.ScalarNode) or _yaml.is_null(key):
                raise self.at(key).error("a field name must be a plain word such as X or W_Q")
            name = key.value
            if name not in FIELDS:
                raise self.at(key).error(f"unknown field {excerpt(name)}{_did_you_mean(name, FIELDS)}")
            if name in fields:
                first = self.at(fields[name][0])
                raise self.at(key).error(f"the field {name!r} is given twice (first at line {first.line})")
            fields[name] = (key, value)
        return fields

    def build(self, root: yaml.MappingNode, fields: dict[str, tuple[yaml.Node, yaml.Node]]) -> Problem:
        def node(name: str) -> yaml.Node | None:
            return fields[name][1] if name in fields else None

        def key(name: str) -> yaml.Node:
            return fields[name][0]

        self.symbols = self.read_symbols(node("symbols"))
        values = self.read_values(node("values"))
        direct = [n for n in ("Q", "K", "V") if n in fields]
        projected = [n for n in ("X", "W_Q", "W_K", "W_V", "context", "heads", "W_O", "from") if n in fields]
        if direct and projected:
            raise self.at(key(direct[0])).error(
                f"give either X with W_Q, W_K, W_V or Q, K, V directly, not both ({projected[0]} is also given)"
            )
        biased = [n for n in BIAS_NAMES + ("b_O",) if n in fields]
        if direct and biased:
            b = biased[0]
            raise self.at(key(b)).error(
                f"{b} is the bias of the projection {'concat·W_O' if b == 'b_O' else 'X·W_' + b[-1]}; with Q, K and V "
                "given directly there is no projection to add it to (add it to the given matrix yourself, or give X "
                "with the weights)", b)
        if "b_O" in fields and "W_O" not in fields:
            raise self.at(key("b_O")).error(
                "b_O is the bias of the output projection concat·W_O, but W_O is missing "
                "(b_O goes with heads and W_O)", "b_O")
        matrices: dict[str, Matrix] = {}
        heads: list[Head] = []
        kv_heads = self.kv_fields(fields) if "from" not in fields else None
        loaded = None  # the layer's weights from a checkpoint (the from: field)
        if direct:
            for name in ("Q", "K", "V"):
                if name not in fields:
                    raise self.at(root).error(f"Q, K and V go together: {name} is missing")
                matrices[name] = self.matrix(node(name), name)
            self.same("Q", matrices["Q"], "cols", "K", matrices["K"], "cols", key("K"),
                      "Q·Kᵀ needs Q and K to have the same number of columns (d_k)")
            self.same("K", matrices["K"], "rows", "V", matrices["V"], "rows", key("V"),
                      "each key needs one value row: K and V need the same number of rows")
            n_q, n_k = matrices["Q"].rows, matrices["K"].rows
        else:
            if "X" not in fields:
                raise self.at(root).error("X is missing: from: gives the weights; give X, the layer's input (one row "
                                          "of d_model entries per token)" if "from" in fields else
                                          "X is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly")
            matrices["X"] = X = self.matrix(node("X"), "X")
            kv_name = "context" if "context" in fields else "X"
            if "context" in fields:
                matrices["context"] = self.matrix(node("context"), "context")
            C = matrices[kv_name]
            if "from" in fields:
                from .checkpoints.layouts import read_from

                loaded = read_from(self, key("from"), node("from"), fields, X)
                head_nodes, kv_heads = [], loaded.kv_heads
                heads.extend(Head(*weights) for weights in loaded.heads)
                matrices.update(loaded.matrices)
            elif "heads" in fields:
                for name in ("W_Q", "W_K", "W_V") + BIAS_NAMES:
                    if name in fields:
                        own = "W_Q, W_K, W_V" if name.startswith("W") else "b_Q, b_K, b_V"
                        raise self.at(key(name)).error(
                            f"with heads, each head gives its own {own}: move the top-level {name} into heads"
                            + (" (with kv_heads, b_K and b_V go under kv)" if kv_heads and name in ("b_K", "b_V") else ""),
                            name,
                        )
                if "W_O" not in fields:
                    raise self.at(key("heads")).error(
                        "heads need W_O, the output projection applied to the concatenated heads", "W_O"
                    )
                head_nodes = self.head_nodes(node("heads"), ("W_Q",) if kv_heads else ("W_Q", "W_K", "W_V"),
                                             optional=("b_Q",) if kv_heads else BIAS_NAMES)
                if kv_heads:
                    head_nodes = self.grouped(head_nodes, kv_heads, fields)
            else:
                if "W_O" in fields:
                    raise self.at(key("W_O")).error(
                        "W_O projects concatenated heads: give the weights under heads "
                        "(a single head is heads: [{W_Q: ..., W_K: ..., W_V: ...}])",
                        "W_O",
                    )
                for name in BIAS_NAMES:
                    if name in fields and "W_" + name[-1] not in fields:
                        raise self.at(key(name)).error(
                            f"{name} is the bias of X·W_{name[-1]}, but W_{name[-1]} is missing", name)
                for name in ("W_Q", "W_K", "W_V"):
                    if name not in fields:
                        raise self.at(root).error(
                            f"{name} is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly"
                        )
                head_nodes = [{name: fields[name] for name in ("W_Q", "W_K", "W_V") + BIAS_NAMES if name in fields}]
            shared: dict[int, Matrix] = {}  # a K/V group's weights, read once for its heads
            for h, nodes in enumerate(head_nodes):
                prefix = f"head{h + 1}." if "heads" in fields else ""  # the head's stage ids: head1.W_Q
                kvp = nodes.get("_prefix", prefix)  # where the head's W_K and W_V are written
                w = {name: self.shared(shared, nodes[name][1], kvp + name)
                     if name != "W_Q" else self.matrix(nodes[name][1], prefix + name) for name in ("W_Q", "W_K", "W_V")}
                rows = lambda n: f"{n} {_plural(n, 'row')}"  # noqa: E731
                self.same("X", X, "cols", prefix + "W_Q", w["W_Q"], "rows", nodes["W_Q"][0],
                          f"X·W_Q needs W_Q to have {rows(X.cols)}")
                self.same(kv_name, C, "cols", kvp + "W_K", w["W_K"], "rows", nodes["W_K"][0],
                          f"{kv_name}·W_K needs W_K to have {rows(C.cols)}")
                self.same(kv_name, C, "cols", kvp + "W_V", w["W_V"], "rows", nodes["W_V"][0],
                          f"{kv_name}·W_V needs W_V to have {rows(C.cols)}")
                self.same(prefix + "W_Q", w["W_Q"], "cols", kvp + "W_K", w["W_K"], "cols", nodes["W_Q"][0] if kvp != prefix else nodes["W_K"][0],
                          "Q·Kᵀ needs W_Q and W_K to have the same number of columns (d_k)")
                b = {}
                for name in BIAS_NAMES:
                    if name in nodes:
                        field = (prefix if name == "b_Q" else kvp) + name
                        weight = "W_" + name[-1]
                        b[name] = self.shared(shared, nodes[name][1], field, lambda n, f, weight=weight: self.bias_row(
                            n, f, w[weight].cols, weight, "X" if weight == "W_Q" else kv_name))
                heads.append(Head(w["W_Q"], w["W_K"], w["W_V"], **b))
            for name in BIAS_NAMES:  # a bias for every head, or for none
                have = [h for h, head in enumerate(heads) if getattr(head, name) is not None]
                if have and len(have) != len(heads):
                    h = next(h for h in range(len(heads)) if getattr(heads[h], name) is None)
                    group = kv_heads and name != "b_Q"
                    which = (lambda k: f"K/V group {k // (len(heads) // kv_heads) + 1}") if group else (lambda k: f"head {k + 1}")
                    raise self.at(head_nodes[h]["W_" + name[-1]][0]).error(
                        f"{name} is given for {which(have[0])} but not for {which(h)}: give every "
                        f"{'group' if group else 'head'} its {name}, or none", name)
            if kv_heads and (len({h.d_k for h in heads}) > 1 or len({h.d_v for h in heads}) > 1):
                raise self.at(key("kv")).error(
                    "with kv_heads every query head has the same d_k (W_Q and W_K columns) and every K/V group the "
                    "same d_v (W_V columns), as the heads are stacked and the groups repeated", "kv")
            if "W_O" in fields:
                W_O = matrices["W_O"] = self.matrix(node("W_O"), "W_O")
                width = sum(h.d_v for h in heads)
                if W_O.rows != width:
                    parts = " + ".join(str(h.d_v) for h in heads)
                    raise self.at(key("W_O")).error(
                        f"the concatenated heads are {X.rows}×{width} ({parts} value {_plural(width, 'column')}) "
                        f"but W_O is {_shape(W_O)}: concat·W_O needs W_O to have {width} {_plural(width, 'row')}",
                        "W_O",
                    )
                if "b_O" in fields:
                    matrices["b_O"] = self.bias_row(node("b_O"), "b_O", W_O.cols, "W_O", "concat")
            n_q = X.rows
            n_k = C.rows

        if "context_tokens" in fields and "context" not in fields:
            raise self.at(key("context_tokens")).error("context_tokens label the rows of context, which is not given")
        tokens = self.labels(node("tokens"), "tokens", n_q, "X" if not direct else "Q", "t", self.token_ids.get("X"))
        if "context" in fields:
            key_tokens = self.labels(node("context_tokens"), "context_tokens", n_k, "context", "c",
                                     self.token_ids.get("context"))
        elif direct and n_k != n_q:
            key_tokens = tuple(f"k_{j + 1}" for j in range(n_k))
        else:
            key_tokens = tokens

        mask = self.mask(node("mask"), n_q, n_k) if loaded is None or "mask" in fields else \
            Mask(loaded.mask, mask_rule(loaded.mask, n_q, n_k, loaded.window), window=loaded.window)
        bias = None
        if "bias" in fields:
            bias = self.matrix(node("bias"), "bias", allow_neg_inf=True)
            if bias.shape != (n_q, n_k):
                raise self.at(node("bias")).error(
                    f"bias is {_shape(bias)} but the scores are {n_q}×{n_k}: bias needs one entry per query and key",
                    "bias",
                )
        self.check_rows_attend(mask, bias, node("mask") or root, node("bias"), tokens)
        positions = self.positions(node("positions"), key("positions"), matrices.get("X")) if "positions" in fields else None
        d_out = matrices["W_O"].cols if "W_O" in matrices else (heads[0].d_v if heads else matrices["V"].cols)
        backward = self.backward(node("backward"), n_q, d_out) if "backward" in fields else None
        rope = None
        if "rope" in fields:
            from .rope_fields import read_rope

            d_ks = [h.d_k for h in heads] if heads else [matrices["Q"].cols]
            rope = read_rope(self, key("rope"), node("rope"), d_ks, n_q, n_k, multi="heads" in fields,
                             cross="context" in fields, backward="backward" in fields)
        elif loaded is not None:
            rope = loaded.rope
        tiling = self.tiling(node("tiling"), n_q) if "tiling" in fields else None
        if tiling is not None and self.symbols:
            raise self.at(key("tiling")).error(
                "the tiled softmax needs numbers: the running maximum of scores with symbols cannot be decided; "
                "remove symbols or tiling", "tiling")
        if kv_heads and backward is not None:
            raise self.at(key("backward")).error(
                "the backward pass of grouped-query attention (kv_heads) is not supported yet", "backward")
        decode = None
        if "decode" in fields:
            decode = self.decode(node("decode"), n_q, mask, "context" in fields, bias is not None)

        return Problem(
            source=self.file,
            title=self.title(node("title")),
            tokens=tokens,
            key_tokens=key_tokens,
            mask=mask,
            scale=loaded.scale if loaded is not None and loaded.scale is not None else self.scale(node("scale")),
            digits=self.digits(node("digits")),
            bias=bias,
            heads=tuple(heads),
            multi_head="heads" in fields or (loaded is not None and loaded.multi),
            symbols=tuple(self.symbols.values()),
            values=tuple(values.items()),
            backward=backward,
            rope=rope,
            tiling=tiling,
            positions=positions,
            kv_heads=kv_heads,
            decode=decode,
            **matrices,
        )

    def backward(self, node: yaml.Node, n_q: int, d_out: int) -> Backward:
        """The ``backward:`` section: ``dO: [[...]]`` or ``loss: sum | {weights: ...} | {target: ...}``."""
        usage = "backward: needs dO: [[...]] (dL/dO) or loss: sum, loss: {weights: [[...]]} or loss: {target: [[...]]}"
        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            raise self.at(node).error(usage, "backward")
        key, value = node.value[0]
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name == "dO":
            return Backward("dO", self.sized(self.matrix(value, "backward.dO"), value, "backward.dO", n_q, d_out))
        if name != "loss":
            hint = _did_you_mean(str(name), ("dO", "loss"))
            raise self.at(key).error(f"unknown entry {excerpt(name)} in backward{hint}; {usage}", "backward")
        if isinstance(value, yaml.ScalarNode) and value.value == "sum":
            return Backward("sum")
        if isinstance(value, yaml.MappingNode) and len(value.value) == 1:
            kind_node, matrix_node = value.value[0]
            kind = kind_node.value if isinstance(kind_node, yaml.ScalarNode) else None
            if kind in ("weights", "target"):
                field = f"backward.loss.{kind}"
                return Backward(kind, self.sized(self.matrix(matrix_node, field), matrix_node, field, n_q, d_out))
            hint = _did_you_mean(str(kind), ("weights", "target"))
            raise self.at(kind_node).error(
                f"unknown loss {excerpt(kind)}{hint}; write loss: sum, loss: {{weights: [[...]]}} or loss: {{target: [[...]]}}",
                "backward.loss",
            )
        hint = _did_you_mean(str(value.value), ("sum",)) if isinstance(value, yaml.ScalarNode) else ""
        raise self.at(value).error(
            f"loss must be sum, {{weights: [[...]]}} or {{target: [[...]]}}, not {_yaml.kind(value)}{hint}",
            "backward.loss",
        )

    def tiling(self, node: yaml.Node, n_q: int) -> Tiling:
        """The ``tiling:`` section: ``{block: B}``, optionally ``rows: [...]`` (1-based query rows)."""
        usage = "tiling: needs block: B (the keys per block, a whole number ≥ 1), optionally rows: [1, 3]"
        if not isinstance(node, yaml.MappingNode):
            raise self.at(node).error(f"{usage}, not {_yaml.kind(node)}", "tiling")
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name not in ("block", "rows"):
                hint = _did_you_mean(str(name), ("block", "rows"))
                raise self.at(key).error(f"unknown entry {_yaml.kind(key)} in tiling{hint}; {usage}", "tiling")
            if name in entries:
                raise self.at(key).error(f"{name} is given twice", "tiling")
            entries[name] = (key, value)
        if "block" not in entries:
            raise self.at(node).error(usage, "tiling")
        block = self.whole(entries["block"][1], "tiling.block", "the block size")
        rows = None
        if "rows" in entries:
            rows_node = entries["rows"][1]
            if not isinstance(rows_node, yaml.SequenceNode) or not rows_node.value:
                raise self.at(rows_node).error(
                    f"rows is a list of query rows counted from 1, such as [1, 3], not {_yaml.kind(rows_node)}",
                    "tiling.rows")
            picked: list[int] = []
            for i, item in enumerate(rows_node.value):
                field = _item("tiling.rows", i)
                row = self.whole(item, field, "a query row")
                if row > n_q:
                    raise self.at(item).error(
                        f"row {row} is out of range: the problem has {n_q} {'query' if n_q == 1 else 'queries'} "
                        f"(rows 1 to {n_q})", field)
                if row - 1 in picked:
                    raise self.at(item).error(f"row {row} is given twice", field)
                picked.append(row - 1)
            rows = tuple(picked)
        return Tiling(block, rows)

    def whole(self, node: yaml.Node, field: str, what: str) -> int:
        """A whole number ≥ 1 written plainly (``2``, not ``2.0`` or ``"2"``)."""
        value = self.plain_whole(node, field)
        if value is not None and value >= 1:
            return value
        raise self.at(node).error(f"{what} must be a whole number ≥ 1, not {_yaml.kind(node)}", field)

    def plain_whole(self, node: yaml.Node, field: str) -> int | None:
        """The whole number ``node`` writes plainly in the digits 0-9 (``2``; not ``2.0``, ``"2"``
        or ``²``), else None; one with more digits than any count has is refused here, before
        it is converted."""
        if not (isinstance(node, yaml.ScalarNode) and not node.style):
            return None
        try:
            return whole_number(node.value)
        except LongNumber as exc:
            raise self.at(node).error(str(exc), field) from None
    def positions(self, node: yaml.Node, key: yaml.Node, X: Matrix | None) -> Positions:
        """``positions: sinusoidal``, ``{sinusoidal: {base: b}}`` or a matrix of learned positions."""
        usage = "use sinusoidal, {sinusoidal: {base: 100}} or a matrix of learned positions [[...], ...]"
        if X is None:
            raise self.at(key).error("positions are added to X: give X with the weights, not Q, K and V", "positions")
        n, d = X.rows, X.cols
        if isinstance(node, yaml.SequenceNode) or (
                isinstance(node, yaml.MappingNode) and any(getattr(k, "value", None) == "file" for k, _ in node.value)):
            # a table of a checkpoint gives its first n rows: GPT-2's wpe has one per position up to 1024
            m = self.matrix_file(node, "positions", first_rows=n) if isinstance(node, yaml.MappingNode) \
                else self.matrix(node, "positions")
            if m.shape != (n, d):
                raise self.at(node).error(
                    f"the learned positions are {_shape(m)} but X is {_shape(X)}: give one row of d_model = {d} "
                    f"{'entry' if d == 1 else 'entries'} per token", "positions")
            if not is_rational(m) and m.free_symbols:  # (free_symbols would make a SymPy number of each entry)
                raise self.at(node).error("the learned positions must be plain numbers, not symbols", "positions")
            return Positions("learned", m)
        base = sympy.Integer(SINUSOIDAL_BASE)
        if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node) and node.value == "sinusoidal":
            return Positions("sinusoidal", sinusoidal_encoding(n, d, base), base)
        if isinstance(node, yaml.MappingNode) and len(node.value) == 1 and \
                getattr(node.value[0][0], "value", None) == "sinusoidal":
            options = node.value[0][1]
            if isinstance(options, yaml.MappingNode):
                for k, v in options.value:
                    if getattr(k, "value", None) != "base":
                        raise self.at(k).error(
                            f"unknown option {_yaml.kind(k)} of sinusoidal positions{_did_you_mean(str(getattr(k, 'value', '')), ('base',))}; "
                            "the option is base", "positions.sinusoidal")
                    base = self.number(v, "positions.sinusoidal.base", use_symbols=False)
                    if not is_positive(base):
                        raise self.at(v).error(f"the base must be positive, not {v.value}", "positions.sinusoidal.base")
            elif not _yaml.is_null(options):
                raise self.at(options).error(
                    f"the options of sinusoidal positions are a mapping such as {{base: 100}}, not {_yaml.kind(options)}",
                    "positions.sinusoidal")
            return Positions("sinusoidal", sinusoidal_encoding(n, d, base), base)
        what = node.value if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node) else None
        if what is None and isinstance(node, yaml.MappingNode) and node.value:
            what = getattr(node.value[0][0], "value", None)
        hint = _did_you_mean(what, ("sinusoidal",)) if isinstance(what, str) else ""
        shown = repr(what) if isinstance(what, str) else _yaml.kind(node)
        raise self.at(node if not isinstance(node, yaml.MappingNode) or not node.value else node.value[0][0]).error(
            f"unknown positions {shown}{hint}; {usage}", "positions")

    def sized(self, m: Matrix, node: yaml.Node, field: str, n_q: int, d_out: int) -> Matrix:
        """``m``, checked to have the output's shape."""
        if m.shape != (n_q, d_out):
            raise self.at(node).error(
                f"{field.rsplit('.', 1)[-1]} is {_shape(m)} but the output O is {n_q}×{d_out}: "
                "it needs one entry per output entry",
                field,
            )
        return m

    def same(self, a: str, ma: Matrix, a_dim: str, b: str, mb: Matrix, b_dim: str, node_b: yaml.Node, why: str) -> None:
        """Report, at ``b``, that a dimension of ``b`` does not fit ``a``."""
        if getattr(ma, a_dim) != getattr(mb, b_dim):
            raise self.at(node_b).error(f"{a} is {_shape(ma)} but {b} is {_shape(mb)}: {why}", b)

    def head_nodes(self, node: yaml.Node, names: tuple[str, ...] = ("W_Q", "W_K", "W_V"),
                   field: str = "heads", optional: tuple[str, ...] = ()) -> list[dict[str, tuple[yaml.Node, yaml.Node]]]:
        listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        what_one = "a head" if field == "heads" else "a K/V group"
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            what = "an empty list" if isinstance(node, yaml.SequenceNode) else _yaml.kind(node)
            raise self.at(node).error(
                f"{field} is a list of {{{', '.join(names)}}} mappings, one per {what_one[2:]}, not {what}", field
            )
        out = []
        for h, item in enumerate(node.value):
            if not isinstance(item, yaml.MappingNode):
                raise self.at(item).error(f"{what_one} is a mapping with {listed}, not {_yaml.kind(item)}", _item(field, h))
            nodes: dict[str, tuple[yaml.Node, yaml.Node]] = {}
            for k, v in item.value:
                name = getattr(k, "value", None)
                if name not in names + optional:
                    hint = ("; with kv_heads, W_K and W_V go under kv, once per group"
                            if field == "heads" and name in ("W_K", "W_V") else
                            "; with kv_heads, b_K and b_V go under kv, once per group"
                            if field == "heads" and name in ("b_K", "b_V") else "")
                    raise self.at(k).error(
                        f"unknown field {excerpt(name)} in {what_one}{'' if hint else _did_you_mean(str(name), names + optional)}; "
                        f"{what_one} has {listed}{hint}",
                        _item(field, h),
                    )
                if name in nodes:
                    raise self.at(k).error(f"{name} is given twice in this {what_one[2:]}", _item(field, h))
                nodes[name] = (k, v)
            for name in names:
                if name not in nodes:
                    raise self.at(item).error(f"{name} is missing from this {what_one[2:]}", _item(field, h))
            out.append(nodes)
        return out

    def shared(self, cache: dict, node: yaml.Node, field: str, read=None) -> Matrix:
        if id(node) not in cache:
            cache[id(node)] = self.matrix(node, field) if read is None else read(node, field)
        return cache[id(node)]

    def bias_row(self, node: yaml.Node, field: str, width: int, weight: str, inp: str) -> Matrix:
        """A projection's bias: a flat list ``[1, 2]``, a one-row matrix ``[[1, 2]]`` or a file's
        (a 1-dimensional tensor or array is one row), with one entry per column of ``weight``."""
        if isinstance(node, yaml.SequenceNode) and not isinstance(node, _yaml.FlowMatrix) and node.value \
                and not isinstance(node.value[0], yaml.SequenceNode):
            entries = node.value
            self.count(len(entries), self.at(node), field)
            m = _plain_rational_matrix([entries])
            if m is None:
                m = Matrix([[self.number(e, _item(field, j)) for j, e in enumerate(entries)]])
        elif isinstance(node, yaml.SequenceNode) and not node.value:
            raise self.at(node).error("the bias is empty; it needs one entry per column of " + weight, field)
        else:
            m = self.matrix(node, field, vector=True)
            if m.rows != 1:
                raise self.at(node).error(
                    f"is {_shape(m)}; a bias is one row, such as [1, 2] or [[1, 2]], added to every row of "
                    f"{inp}·{weight}", field)
        if m.cols != width:
            raise self.at(node).error(
                f"has {m.cols} {'entry' if m.cols == 1 else 'entries'}, {weight} has {width} "
                f"{_plural(width, 'column')}: the bias adds one number to each column of {inp}·{weight}", field)
        return m

    def kv_fields(self, fields) -> int | None:
        """``kv_heads: g`` (with its ``kv:`` list of g {W_K, W_V}), checked against ``heads``; None without it."""
        if "kv" in fields and "kv_heads" not in fields:
            raise self.at(fields["kv"][0]).error(
                "kv gives the shared W_K and W_V of grouped-query attention: set kv_heads, the number of groups", "kv")
        if "kv_heads" not in fields:
            return None
        key, node = fields["kv_heads"]
        if "heads" not in fields:
            raise self.at(key).error(
                "kv_heads groups the query heads of a multi-head problem: it needs heads (and W_O)", "kv_heads")
        g = self.plain_whole(node, "kv_heads")
        if g is None or g < 1:
            raise self.at(node).error(f"kv_heads must be a whole number of at least 1, not {_yaml.kind(node)}", "kv_heads")
        heads = fields["heads"][1]
        h = len(heads.value) if isinstance(heads, yaml.SequenceNode) else 0
        if h and h % g:
            raise self.at(node).error(
                f"{h} query heads cannot share keys and values in {g} equal groups: "
                f"the number of heads must be divisible by kv_heads", "kv_heads")
        if "kv" not in fields:
            raise self.at(key).error(
                f"kv_heads: {g} needs kv, a list of {g} {{W_K, W_V}} mappings (one per K/V group)", "kv")
        return g

    def grouped(self, head_nodes: list, g: int, fields) -> list[dict]:
        """Each query head's nodes with its group's W_K and W_V (heads (k−1)·h/g + 1 … k·h/g read group k)."""
        kv_node = fields["kv"][1]
        kv = self.head_nodes(kv_node, ("W_K", "W_V"), "kv", optional=("b_K", "b_V"))
        if len(kv) != g:
            raise self.at(kv_node).error(
                f"kv_heads is {g} but kv lists {len(kv)} {_plural(len(kv), 'group')}: give one {{W_K, W_V}} per group", "kv")
        size = len(head_nodes) // g
        return [{**nodes, **kv[h // size], "_prefix": f"kv item {h // size + 1}, "} for h, nodes in enumerate(head_nodes)]

    def decode(self, node: yaml.Node, n: int, mask: "Mask", cross: bool, bias: bool) -> int:
        """``decode: t``: the token (1-based) whose row is decoded from the KV cache."""
        t = self.plain_whole(node, "decode")
        if t is None:
            raise self.at(node).error(f"decode must be a token number from 1 to {n}, not {_yaml.kind(node)}", "decode")
        problem = decode_problem(t, n, mask, cross, bias)
        if problem:
            raise self.at(node).error(problem, "decode")
        return t

    def read_symbols(self, node) -> dict[str, sympy.Symbol]:
        if node is None:
            return {}
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(f"symbols is a list of names such as [a, b], not {_yaml.kind(node)}", "symbols")
        out: dict[str, sympy.Symbol] = {}
        for i, item in enumerate(node.value):
            name = item.value if isinstance(item, yaml.ScalarNode) else None
            field = _item("symbols", i)
            if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
                raise self.at(item).error(
                    f"a symbol is a name of letters, digits and _ starting with a letter, not {_yaml.kind(item)}", field
                )
            if name in _RESERVED or hasattr(sympy, name):
                raise self.at(item).error(
                    f"{name!r} is taken (a function, constant or SymPy name); choose another name such as {name}_1", field
                )
            if name in out:
                raise self.at(item).error(f"the symbol {excerpt(name)} is declared twice", field)
            out[name] = sympy.Symbol(name)
        return out

    def read_values(self, node) -> dict[sympy.Symbol, sympy.Expr]:
        if node is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.at(node).error(f"values is a mapping such as {{a: 1/2}}, not {_yaml.kind(node)}", "values")
        out: dict[sympy.Symbol, sympy.Expr] = {}
        for k, v in node.value:
            name = getattr(k, "value", None)
            if name not in self.symbols:
                declared = ", ".join(self.symbols) or "none"
                raise self.at(k).error(
                    f"{excerpt(name)} is not a declared symbol (declared: {declared}){_did_you_mean(str(name), self.symbols)}",
                    "values",
                )
            symbol = self.symbols[name]
            if symbol in out:
                raise self.at(k).error(f"{excerpt(name)} is given twice", "values")
            value = self.number(v, f"values.{name}", use_symbols=False)
            out[symbol] = value
        return out

    # -- scalars and lists ---------------------------------------------------

    def title(self, node: yaml.Node | None) -> str:
        if node is None:
            if self.file.startswith("<"):
                return "Scaled dot-product attention"
            stem = Path(self.file).stem.replace("_", " ").replace("-", " ").strip()
            return stem[:1].upper() + stem[1:] if stem else "Scaled dot-product attention"
        if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node):
            raise self.at(node).error(f"the title must be text, not {_yaml.kind(node)}", "title")
        return node.value.strip()

    def labels(self, node, name: str, n: int, of: str, prefix: str, ids: list[int] | None = None) -> tuple[str, ...]:
        """The rows' labels: given, else the token ids the rows were looked up by (#464), else t_1, t_2, ...."""
        if node is None:
            return tuple(f"#{i}" for i in ids) if ids is not None else tuple(f"{prefix}_{i + 1}" for i in range(n))
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(f"{name} must be a list of labels such as [The, cat, sat], not {_yaml.kind(node)}", name)
        if len(node.value) != n:
            raise self.at(node).error(
                f"{name} has {len(node.value)} {_plural(len(node.value), 'label')} but {of} has {n} {_plural(n, 'row')}",
                name,
            )
        out = []
        for i, item in enumerate(node.value):
            if not isinstance(item, yaml.ScalarNode) or _yaml.is_null(item) or not item.value.strip():
                raise self.at(item).error(f"a label must be a word, not {_yaml.kind(item)}", _item(name, i))
            out.append(item.value.strip())
        return tuple(out)

    def digits(self, node) -> int:
        if node is None:
            return 4
        value = self.plain_whole(node, "digits")
        if value is not None and 1 <= value <= 50:
            return value
        raise self.at(node).error(f"digits must be a whole number from 1 to 50, not {_yaml.kind(node)}", "digits")

    def scale(self, node):
        if node is None:
            return "auto"
        if isinstance(node, yaml.ScalarNode) and node.value in ("auto", "none"):
            return node.value
        if not isinstance(node, yaml.ScalarNode):
            raise self.at(node).error(f"scale must be auto, none or a number, not {_yaml.kind(node)}", "scale")
        value = self.number(node, "scale", use_symbols=False)
        if not is_positive(value):
            raise self.at(node).error(f"scale must be positive, not {value}", "scale")
        return value

    def number(self, node: yaml.Node, field: str, allow_neg_inf: bool = False, use_symbols: bool = True) -> sympy.Expr:
        if not isinstance(node, yaml.ScalarNode):
            raise self.at(node).error(f"expected a number, not {_yaml.kind(node)}", field)
        if _yaml.is_null(node):
            raise self.at(node).error("the entry is empty; write a number", field)
        if _yaml.is_bool(node):
            raise self.at(node).error(f"{node.value!r} is a boolean, not a number", field)
        # An alias is the same node: its entry is read once (60,000 aliases of one expensive
        # expression cost one reading). The text and what is allowed are part of the key.
        key = (node.value, allow_neg_inf)
        value = self.read_numbers.get(key)
        if value is None:
            try:
                value = check_size(node.value, parse_number(node.value, symbols=self.symbols, allow_neg_inf=allow_neg_inf))
            except NumberError as exc:
                raise self.at(node).error(str(exc), field) from None
            self.read_numbers[key] = value
        if value.free_symbols and not use_symbols:
            names = ", ".join(sorted(s.name for s in value.free_symbols))
            raise self.at(node).error(f"{excerpt(node.value)} holds the symbol(s) {names}; this must be a plain number", field)
        return value

    # -- matrices ------------------------------------------------------------

    def rows_of(self, node: yaml.Node, name: str) -> list[list[yaml.Node]]:
        """The entry nodes of a matrix written as a list of rows."""
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(
                f"a matrix is a list of rows such as [[1, 0], [0, 1]], not {_yaml.kind(node)}", name
            )
        if not node.value:
            raise self.at(node).error("the matrix is empty; it needs at least one row", name)
        if len(node.value) > self.max_size:
            raise self.at(node).error(f"the matrix has more than {self.max_size:,} rows (the size limit; raise it with --max-size)", name)
        rows = []
        width = None
        for i, row in enumerate(node.value):
            if not isinstance(row, yaml.SequenceNode):
                hint = " (a single row is written [[...]])" if isinstance(row, yaml.ScalarNode) else ""
                raise self.at(row).error(f"row {i + 1} must be a list of numbers, not {_yaml.kind(row)}{hint}", _row(name, i))
            if not row.value:
                raise self.at(row).error("the row is empty", _row(name, i))
            if len(row.value) > self.max_size:
                raise self.at(row).error(
                    f"the row has more than {self.max_size:,} entries (the size limit; raise it with --max-size)",
                    _row(name, i),
                )
            if width is None:
                width = len(row.value)
            elif len(row.value) != width:
                raise self.at(row).error(
                    f"row {i + 1} has {len(row.value)} entries but row 1 has {width}; every row needs the same length",
                    _row(name, i),
                )
            rows.append(row.value)
        self.count(len(rows) * width, self.at(node), name)
        return rows

    def count(self, numbers: int, where_: Where, name: str) -> None:
        """Add a matrix's numbers to the problem's total and enforce the size limit."""
        self.size += numbers
        if self.size > self.max_size:
            raise where_.error(
                f"the problem holds more than {self.max_size:,} numbers (the size limit); "
                "if it is meant to be this large, raise the limit with --max-size",
                name,
            )

    def matrix(self, node: yaml.Node, name: str, allow_neg_inf: bool = False, vector: bool = False) -> Matrix:
        if isinstance(node, yaml.MappingNode):
            return self.matrix_file(node, name, vector)
        if isinstance(node, _yaml.FlowMatrix):
            fast = self.flow_matrix(node, name)
            if fast is not None:
                return fast
        rows = self.rows_of(node, name)
        fast = _plain_rational_matrix(rows)
        if fast is not None:
            return fast
        return Matrix(
            [
                [self.number(entry, _entry(name, i, j), allow_neg_inf) for j, entry in enumerate(row)]
                for i, row in enumerate(rows)
            ]
        )

    def flow_matrix(self, node: _yaml.FlowMatrix, name: str) -> Matrix | None:
        """A matrix of plain numbers read straight from its text; None leaves anything
        to report (a ragged row, the size limit) to the usual path."""
        numbers = sum(map(str.count, node.rows, itertools.repeat(","))) + len(node.rows)
        if self.size + numbers > self.max_size:
            # Beyond the size limit: refused from the text, with the message composing would give,
            # before anything is composed (a 30 MB row would take minutes).
            if len(node.rows) > self.max_size:
                raise self.at(node).error(
                    f"the matrix has more than {self.max_size:,} rows (the size limit; raise it with --max-size)", name)
            width = node.rows[0].count(",") + 1
            for i, row in enumerate(node.rows):
                n = row.count(",") + 1
                if n > self.max_size:
                    raise node.row_where(self.file, i).error(
                        f"the row has more than {self.max_size:,} entries (the size limit; raise it with --max-size)",
                        _row(name, i),
                    )
                if n != width:
                    raise node.row_where(self.file, i).error(
                        f"row {i + 1} has {n} entries but row 1 has {width}; every row needs the same length",
                        _row(name, i),
                    )
            self.count(numbers, self.at(node), name)
        m = _flow_rational_matrix(node.rows, checked=True)  # _yaml matched each row as it cut the matrix out
        if m is not None:
            self.count(numbers, self.at(node), name)
        return m

    def matrix_file(self, node: yaml.MappingNode, name: str, vector: bool = False,
                    first_rows: int | None = None) -> Matrix:
        keys = {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}
        if "file" not in keys or len(keys) != len(node.value):
            raise self.at(node).error("a matrix is a list of rows, or {file: NAME} naming a .npy, .csv "
                                      "or .safetensors file", name)
        path, rel, where_ = self.resolve_file(keys["file"][1], name)
        suffix = path.suffix.lower()
        refusal = _safetensors.pickle_refusal(rel)
        if refusal:
            raise where_.error(refusal, name)
        if suffix == ".safetensors":
            return self.checkpoint_matrix(keys, path, rel, where_, name, vector, first_rows)
        extra = sorted(set(keys) - {"file"})
        if extra:
            raise self.at(keys[extra[0]][0]).error(
                f"{extra[0]}: is for a tensor of a .safetensors file; a .npy or .csv file is read whole", name)
        if suffix not in (".csv", ".npy"):
            raise where_.error(f"{quote_path(rel)}: a matrix file must end in .npy, .csv or .safetensors", name)
        try:
            data = read_regular(path, BYTES_PER_NUMBER * self.max_size,
                                f"{quote_path(rel)} is {{size}} bytes, beyond the size limit; raise it with --max-size",
                                noun="matrix file")
        except FileError as exc:
            if str(exc).startswith(repr(rel)):
                raise where_.error(str(exc), name) from None
            if str(exc).startswith("is "):  # a folder, a FIFO, a device, a socket
                raise where_.error(f"{quote_path(rel)} {exc}", name) from None
            how = " as a .npy file" if suffix == ".npy" else ""
            raise where_.error(f"cannot read {quote_path(rel)}{how}: {exc.strerror}", name) from None
        m = self._read_csv(data, rel, where_, name) if suffix == ".csv" else self._read_npy(data, rel, where_, name, vector)
        self.count(m.rows * m.cols, where_, name)
        return m

    def resolve_file(self, value: yaml.Node, name: str) -> tuple[Path, str, Where]:
        """The path of the file ``value`` names, inside the problem's folder, with its name as
        written and its place."""
        if not isinstance(value, yaml.ScalarNode) or _yaml.is_null(value):
            raise self.at(value).error("file: needs a file name", name)
        where_ = self.at(value)
        rel = value.value
        if self.base_dir is None:
            raise where_.error("matrices from files need the problem to be read from a file", name)
        if "\x00" in rel:
            raise where_.error(f"{quote_path(rel)}: the file name holds a NUL byte; no file is named so", name)
        if os.path.isabs(rel) or ".." in Path(rel).parts:
            raise where_.error(f"{quote_path(rel)} must be a path inside the problem's folder (no absolute paths, no ..)", name)
        try:
            path = (self.base_dir / rel).resolve()
        except (RuntimeError, OSError):  # Python before 3.13 raises RuntimeError for a loop of links
            raise where_.error(f"cannot read {quote_path(rel)}: the path is a loop of symbolic links; it leads to no file",
                               name) from None
        if self.base_dir not in path.parents:
            raise where_.error(f"{quote_path(rel)} leaves the problem's folder", name)
        return path, rel, where_

    def checkpoint_matrix(self, keys: dict, path: Path, rel: str, where_: Where, name: str, vector: bool = False,
                          first_rows: int | None = None) -> Matrix:
        """``{file: X.safetensors, tensor: NAME, rows: "a:b", cols: "c:d", transpose: true}``:
        a slice of one tensor, read lazily, each float its exact dyadic rational; or
        ``{file: X.safetensors, embeddings: TABLE, tokens: [ids]}``: rows of an embedding table.
        ``first_rows``: with no ``rows:``, the table's first rows (learned positions)."""
        if "embeddings" in keys:
            from .checkpoints.embeddings import embedding_rows

            array = embedding_rows(self, keys, path, rel, where_, name, _did_you_mean, _item)
            return self.checkpoint_array(array, keys["embeddings"][1], rel, where_, name)
        for k in keys:
            if k not in ("file", "tensor", "rows", "cols", "transpose"):
                raise self.at(keys[k][0]).error(
                    f"{k}: unknown key{_did_you_mean(k, ('tensor', 'rows', 'cols', 'transpose', 'embeddings'))}; "
                    "a tensor of a .safetensors file takes file, tensor, rows, cols and transpose "
                    "(or file, embeddings, tokens and cols for rows of an embedding table)", name)
        if "tensor" not in keys:
            raise where_.error(f"{quote_path(rel)}: a .safetensors file holds many tensors; name one with tensor:", name)
        texts = {}
        for k in ("tensor", "rows", "cols"):
            if k in keys:
                v = keys[k][1]
                if not isinstance(v, yaml.ScalarNode) or _yaml.is_null(v) or not v.value.strip():
                    raise self.at(v).error(f"{k}: needs " + ("a tensor name" if k == "tensor" else
                                                              'a slice like "0:64" (quote it)'), name)
                texts[k] = v.value
        transpose = False
        if "transpose" in keys:
            v = keys["transpose"][1]
            if not (isinstance(v, yaml.ScalarNode) and v.value in ("true", "false", "True", "False")):
                raise self.at(v).error("transpose: is true or false", name)
            transpose = v.value.lower() == "true"
        try:
            array = _safetensors.read_slice(path, rel, texts["tensor"], texts.get("rows"), texts.get("cols"),
                                            self.max_size - self.size, vector, first_rows)
        except _safetensors.CheckpointError as exc:
            text = str(exc)
            field = next((k for k in ("rows", "cols") if text.startswith(k + ":")), None)
            if field is not None:
                raise self.at(keys[field][1]).error(text, name) from None
            if text.startswith("has no tensor") or text.startswith("tensor "):
                raise self.at(keys["tensor"][1]).error(f"{quote_path(rel)} {text}" if text.startswith("has") else text,
                                                       name) from None
            raise where_.error(f"{quote_path(rel)} {text}" if not text.startswith("the slice") else text, name) from None
        if transpose:
            array = array.T
        return self.checkpoint_array(array, keys["tensor"][1], rel, where_, name)

    def checkpoint_array(self, array, at: yaml.Node, rel: str, where_: Where, name: str) -> Matrix:
        """The exact matrix of an array read from a checkpoint (``at``: where to report its values),
        counted against the size limit."""
        m = self.slice_matrix(array, rel, self.at(at), name)
        self.count(m.rows * m.cols, where_, name)
        return m

    def slice_matrix(self, array, rel: str, where_: Where, name: str) -> Matrix:
        """The exact matrix of a slice read from a checkpoint: integers, or each float the dyadic
        rational it stands for."""
        if array.dtype.kind in "iu":
            return rational_matrix(array.shape[0], array.shape[1], [QQ(int(v)) for v in array.ravel().tolist()])
        if not np_isfinite(array):
            raise where_.error(f"{quote_path(rel)}: the slice holds NaN or infinite values", name)
        if np_largest(array) > 1e300:
            raise where_.error(f"{quote_path(rel)}: the slice holds a value larger than 10^300 in size; use smaller numbers", name)
        return binary_float_matrix(array)

    def _read_csv(self, data: bytes, rel: str, where_: Where, name: str) -> Matrix:
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

    def _read_npy(self, data: bytes, rel: str, where_: Where, name: str, vector: bool = False) -> Matrix:
        array = _npy_array(data, rel, where_, name, self.max_size - self.size, vector)
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
        return binary_float_matrix(array)

    # -- the mask --------------------------------------------------------------

    def mask(self, node, n_q: int, n_k: int) -> Mask:
        if node is None:
            return Mask("none", mask_rule("none", n_q, n_k))
        if isinstance(node, yaml.SequenceNode) and node.value and not isinstance(node.value[0], yaml.SequenceNode):
            return self.combined_mask(node, n_q, n_k)
        if isinstance(node, yaml.MappingNode) and len(node.value) == 1 and \
                getattr(node.value[0][0], "value", None) in ("padding", "valid-length"):
            return self.key_mask(node.value[0][0], node.value[0][1], n_q, n_k, "mask")
        if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node):
            word = node.value
            if word in MASK_WORDS:
                return Mask(word, mask_rule(word, n_q, n_k))
            if word == "sliding-window":
                raise self.at(node).error("a sliding window needs its width: write {sliding-window: 2}", "mask")
            if word in ("padding", "valid-length"):
                example = "{padding: [1, 1, 1, 0]}" if word == "padding" else "{valid-length: 3}"
                raise self.at(node).error(f"{word} needs its keys: write {example}", "mask")
            raise self.at(node).error(
                f"unknown mask {excerpt(word)}{_did_you_mean(word, MASK_WORDS + ('sliding-window',))}; "
                "use none, causal, causal-bottom-right, {sliding-window: w}, {padding: [1, 1, 0]}, "
                "{valid-length: n}, a list of these or a 0/1 matrix",
                "mask",
            )
        if isinstance(node, yaml.MappingNode):
            if len(node.value) == 1 and node.value[0][0].value == "sliding-window":
                w_node = node.value[0][1]
                w = self.plain_whole(w_node, "mask")
                if w is not None and w >= 1:
                    return Mask("sliding-window", mask_rule("sliding-window", n_q, n_k, w), window=w)
                raise self.at(w_node).error(f"the window must be a whole number ≥ 1, not {_yaml.kind(w_node)}", "mask")
            if len(node.value) == 1 and node.value[0][0].value == "file":
                raise self.at(node).error("a mask is a word or a 0/1 matrix written in the file", "mask")
            first = node.value[0][0] if node.value else node
            raise self.at(first).error(
                f"unknown mask {_yaml.kind(first)}"
                f"{_did_you_mean(getattr(first, 'value', ''), ('sliding-window', 'padding', 'valid-length'))}; "
                "the mapping forms are {sliding-window: w}, {padding: [1, 1, 0]} and {valid-length: n}",
                "mask",
            )
        if isinstance(node, yaml.SequenceNode):
            rows = self.rows_of(node, "mask")
            allowed = tuple(
                tuple(self.mask_entry(entry, _entry("mask", i, j)) for j, entry in enumerate(row))
                for i, row in enumerate(rows)
            )
            if (len(allowed), len(allowed[0])) != (n_q, n_k):
                raise self.at(node).error(
                    f"the mask is {len(allowed)}×{len(allowed[0])} but the scores are {n_q}×{n_k}", "mask"
                )
            return Mask("matrix", allowed)
        raise self.at(node).error(
            f"the mask must be none, causal, causal-bottom-right, {{sliding-window: w}} or a 0/1 matrix, not {_yaml.kind(node)}",
            "mask",
        )

    def key_mask(self, key: yaml.Node, value: yaml.Node, n_q: int, n_k: int, field: str) -> Mask:
        """``{padding: [1, 1, 0]}`` (1 = a real token, 0 = padding) or ``{valid-length: n}`` (the first
        n keys are real): which keys every query may attend to."""
        if key.value == "padding":
            field += ".padding"
            if not isinstance(value, yaml.SequenceNode) or not value.value or \
                    isinstance(value.value[0], yaml.SequenceNode):
                raise self.at(value).error(
                    f"padding is one 0/1 entry per key such as [1, 1, 1, 0] (1 = a real token, 0 = padding), "
                    f"not {_yaml.kind(value)}", field)
            keys = tuple(self.padding_entry(item, _item(field, j)) for j, item in enumerate(value.value))
            if len(keys) != n_k:
                raise self.at(value).error(
                    f"the padding vector has {len(keys)} {'entry' if len(keys) == 1 else 'entries'} but there "
                    f"{'is' if n_k == 1 else 'are'} {n_k} {_plural(n_k, 'key')}: give one 0/1 entry per key", field)
            return Mask("padding", tuple(keys for _ in range(n_q)), keys=keys)
        field += ".valid-length"
        n = self.plain_whole(value, field)
        if n is not None and 1 <= n <= n_k:
            keys = tuple(j < n for j in range(n_k))
            return Mask("valid-length", tuple(keys for _ in range(n_q)), keys=keys, valid_length=n)
        raise self.at(value).error(
            f"the valid length must be a whole number from 1 to {n_k} (the number of keys), not {_yaml.kind(value)}",
            field)

    def combined_mask(self, node: yaml.SequenceNode, n_q: int, n_k: int) -> Mask:
        """``[causal, {padding: [...]}]``: each query may attend where every part allows it."""
        parts = []
        for k, item in enumerate(node.value):
            field = _item("mask", k)
            if isinstance(item, yaml.ScalarNode) and item.value in MASK_WORDS:
                parts.append(Mask(item.value, mask_rule(item.value, n_q, n_k)))
                continue
            if isinstance(item, yaml.MappingNode) and len(item.value) == 1:
                name = getattr(item.value[0][0], "value", None)
                if name in ("padding", "valid-length"):
                    parts.append(self.key_mask(item.value[0][0], item.value[0][1], n_q, n_k, field))
                    continue
                if name == "sliding-window":
                    parts.append(self.mask(item, n_q, n_k))
                    continue
            word = getattr(item, "value", "")
            hint = _did_you_mean(word, MASK_WORDS + ("padding", "valid-length", "sliding-window")) \
                if isinstance(word, str) else ""
            raise self.at(item).error(
                f"a mask in a list is causal, causal-bottom-right, none, {{sliding-window: w}}, {{padding: [...]}} "
                f"or {{valid-length: n}}, not {_yaml.kind(item)}{hint}", field)
        if len(parts) == 1:
            return parts[0]
        allowed = tuple(tuple(all(p.allowed[i][j] for p in parts) for j in range(n_k)) for i in range(n_q))
        return Mask("combined", allowed, parts=tuple(parts))

    def padding_entry(self, node: yaml.Node, field: str) -> bool:
        if isinstance(node, yaml.ScalarNode) and not node.style and node.value in ("0", "1"):
            return node.value == "1"
        raise self.at(node).error(f"a padding entry is 1 (a real token) or 0 (padding), not {_yaml.kind(node)}", field)

    def mask_entry(self, node: yaml.Node, field: str) -> bool:
        if _yaml.is_bool(node):
            return _yaml.bool_value(node)
        if isinstance(node, yaml.ScalarNode) and node.value in ("0", "1"):
            return node.value == "1"
        raise self.at(node).error(
            f"a mask entry is 1 (may attend) or 0 (may not), or true/false, not {_yaml.kind(node)}", field
        )

    def check_rows_attend(self, mask: Mask, bias: Matrix | None, mask_node: yaml.Node, bias_node,
                          tokens: tuple[str, ...] = ()) -> None:
        for i, row in enumerate(mask.allowed):
            if not any(
                ok and (bias is None or bias[i, j] != sympy.S.NegativeInfinity) for j, ok in enumerate(row)
            ):
                if any(row):  # the mask allows some key, the bias's -inf take the rest
                    by, field, node = "the mask and bias together leave", "bias", bias_node
                else:
                    by, field, node = "the mask leaves", "mask", mask_node
                raise self.at(node).error(
                    f"{by} row {i + 1} with no key to attend to; "
                    "its softmax would be 0/0. Allow at least one key in every row"
                    + (f" (row {i + 1} is the query {excerpt(tokens[i])})" if i < len(tokens) else ""),
                    field,
                )


def mask_rule(kind: str, n_q: int, n_k: int, window: int | None = None) -> tuple[tuple[bool, ...], ...]:
    """Which keys each query may attend to under a named mask (query i, key j, 0-based)."""
    rule = {
        "none": lambda i, j: True,
        "causal": lambda i, j: j <= i,  # top-left aligned, as PyTorch's is_causal
        "causal-bottom-right": lambda i, j: j <= i + n_k - n_q,  # as FlashAttention
        "sliding-window": lambda i, j: j <= i and i - j < window,
    }[kind]
    return tuple(tuple(bool(rule(i, j)) for j in range(n_k)) for i in range(n_q))


# Entries such as 12, -0.125 or 3/4, short enough that no limit of the full parser can apply.
_PLAIN = re.compile(r"(-?)([0-9]{1,30})(?:\.([0-9]{1,30}))?(?:/([1-9][0-9]{0,29}))?")


def _plain_rational_matrix(rows: list[list[yaml.Node]]) -> Matrix | None:
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


def _flow_rational_matrix(rows: list[str], checked: bool = False) -> Matrix | None:
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


# Where an entry, a row or a list item is, as a person reads it: counted from 1, as the
# worked solution's subscripts are (S₂₁ is row 2, column 1). JSON keeps 0-based indices.
def _entry(name: str, i: int, j: int) -> str:
    """``X row 3, column 2`` for the 0-based entry ``(i, j)`` of matrix ``name``."""
    return f"{name} row {i + 1}, column {j + 1}"


def _row(name: str, i: int) -> str:
    """``X row 3`` for the 0-based row ``i`` of matrix ``name``."""
    return f"{name} row {i + 1}"


def decode_problem(t: int, n: int, mask: Mask, cross: bool, bias: bool) -> str | None:
    """What is wrong with decoding token ``t`` (1-based) of ``n``, or None."""
    if cross:
        return ("decoding from a KV cache is for causal self-attention; this problem is cross-attention "
                "(context), whose keys do not grow one token at a time")
    if mask.kind != "causal":
        return (f"decoding from a KV cache needs the causal mask (mask: causal); this problem's mask is "
                f"{mask.kind}, so token {t}'s row would not be the cache's row")
    if bias:
        return "decoding with a bias is not supported; remove bias or decode"
    if not 1 <= t <= n:
        return f"token {t} is out of range: there are {n} tokens, so give a token number from 1 to {n}"
    return None


def with_decode(problem: Problem, t: int) -> Problem:
    """``problem`` decoding token ``t`` (``--decode t``), checked as the ``decode`` field is."""
    if isinstance(t, bool) or not isinstance(t, int):
        raise SymattnError(f"the token to decode is a whole number from 1, not {excerpt(repr(t))}",
                           file=problem.source, field="--decode")
    wrong = decode_problem(t, problem.n_q, problem.mask, problem.context is not None, problem.bias is not None)
    if wrong:
        raise SymattnError(wrong, file=problem.source, field="--decode")
    return dataclasses.replace(problem, decode=t)


def _item(name: str, i: int) -> str:
    """``tokens item 2`` for the 0-based item ``i`` of the list ``name``."""
    return f"{name} item {i + 1}"


def _and(items: list[str]) -> str:
    """``1, 2 and 3``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _shape(m: Matrix) -> str:
    return f"{m.rows}×{m.cols}"


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    lowered = {c.lower(): c for c in choices}
    if isinstance(word, str) and word.lower() in lowered:
        return f" (did you mean {lowered[word.lower()]!r}?)"
    close = difflib.get_close_matches(str(word), choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# -- matrix files ------------------------------------------------------------


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
    return _flow_rational_matrix(rows, checked=True) if rows else None  # matched by _PLAIN_CSV


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
