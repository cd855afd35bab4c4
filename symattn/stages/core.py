"""The stage registry: every stage symattn derives, in one table.

Each stage kind is one :class:`Kind` row: its id, its place in the formula, its
title and one sentence of why, how its rows and columns are labelled, whether it
is a gradient, and its **relation**: one definition of how its value follows from
its inputs, written against a small set of operations (``ops``: ``matmul``,
``T``, ``scale``, ``softmax``, ...). The same relation is run three ways:

- exactly, by :func:`symattn.derive` (SymPy and flint values, softmax kept as structure);
- at high precision, when a stage is evaluated from its inputs' values (mpmath);
- on a student's own earlier answers, by ``symattn check``'s follow-through marking.

A relation reads its inputs through ``v(key)`` (``v(key, head)`` for another head's
stage) and the problem's constants through ``c`` (a :class:`Context`). The common
mistakes of a stage (``mistakes``) are relations too, run on the exact values.

Stage ids are made and split here only: ``"S_scaled"``, or ``"head2.S_scaled"``
when the problem has several heads (:func:`stage_id`, :func:`split_id`).

This module imports nothing of the exact engine, so the independent NumPy and
PyTorch references can take their stage ids from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from ..text import did_you_mean

# -- the stage kinds, by key ------------------------------------------------------------
# A key names a row of the table; ``name`` (the id without a head prefix) is what users write.
# Two rows share a name: the output O of a head and the projected output of several heads
# (key "O_final"), and the upstream gradient dO and each head's share of it (key "dO_head").

X, CONTEXT, W_Q, W_K, W_V, Q, K, V = "X", "context", "W_Q", "W_K", "W_V", "Q", "K", "V"
K_T, S, S_SCALED, M, S_MASKED, A, O = "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"
CONCAT, W_O, O_FINAL = "concat", "W_O", "O_final"
DO, DW_O, DCONCAT, DO_HEAD = "dO", "dW_O", "dconcat", "dO_head"
DV, DA, DS_MASKED, DS, DQ, DK = "dV", "dA", "dS_masked", "dS", "dQ", "dK"
DW_Q, DW_K, DW_V, DX, DCONTEXT = "dW_Q", "dW_K", "dW_V", "dX", "dcontext"
Q_ROT, K_ROT = "Q_rot", "K_rot"  # the queries and keys rotated by RoPE
# FlashAttention's online softmax (``tiling:`` / ``--tiled B``)
M_TILED, L_TILED, ACC_TILED, O_TILED = "m_tiled", "l_tiled", "acc_tiled", "O_tiled"
PE, X_POS = "PE", "X_pos"
# the projections' biases (Q = X W_Q + b_Q, ...; O = concat W_O + b_O) and their gradients
B_Q, B_K, B_V, B_O = "b_Q", "b_K", "b_V", "b_O"
DB_Q, DB_K, DB_V, DB_O = "db_Q", "db_K", "db_V", "db_O"
BIASES = {Q: B_Q, K: B_K, V: B_V, O_FINAL: B_O}  # each projection's bias
# decoding one token from the KV cache (decode: t)
K_CACHE, V_CACHE, Q_T, S_T, A_T, O_T = "K_cache", "V_cache", "q_t", "s_t", "a_t", "o_t"
O_T_DIFF, DECODE_COST = "o_t_diff", "step_cost"
# With kv_heads (grouped-query attention) these stages exist once per K/V group, under the id of
# the group's first query head (head1.K for group 1); the group's other heads read them.
SHARED_KV = frozenset({"W_K", "W_V", "b_K", "b_V", "K", "V", "K_rot", "K_T", "K_cache", "V_cache"})

_HEAD_PREFIX = "head"
_HEAD_NUMBER = re.compile(r"[0-9]{1,9}")

# What a matrix's rows or columns stand for: the query tokens, the key tokens, or numbered
# dimensions (any other value: its letter, "d" gives d1, d2, ...).
QUERIES, KEYS = "queries", "keys"
# A decoding step's axes: the cached key tokens 1..t, the new query token t alone, and the
# columns of the cost table.
CACHED, NEW, STEPS, COSTS = "cached", "new", "steps", "costs"
TOKEN_AXES = (QUERIES, KEYS, CACHED, NEW, STEPS, COSTS)  # axes labelled by tokens (or words), not d1, d2, ...
COST_COLUMNS = ("scores (cache)", "output (cache)", "scores (full)", "outputs (full)")


def stage_id(name: str, head: int | None = None) -> str:
    """The id of stage ``name`` in head ``head`` (1-based; None: a single head or the whole layer).

    >>> stage_id("S_scaled"), stage_id("A", 2)
    ('S_scaled', 'head2.A')
    """
    return name if head is None else f"{_HEAD_PREFIX}{head}.{name}"


def split_id(id: str) -> tuple[int | None, str]:
    """``(head, name)`` of a stage id: ``"head2.A"`` → ``(2, "A")``, ``"O"`` → ``(None, "O")``."""
    prefix, dot, name = id.partition(".")
    # The digits 0-9 only ('²' passes str.isdigit() and breaks int()), and few of them: an id
    # from an answers file with a million-digit head number is no head's, and is not converted.
    if dot and prefix.startswith(_HEAD_PREFIX) and _HEAD_NUMBER.fullmatch(prefix, len(_HEAD_PREFIX)):
        return int(prefix[len(_HEAD_PREFIX):]), name
    return None, id


# -- what a relation sees ---------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """The problem's constants as one stage sees them: the problem, the head (1-based, or None
    for a single head and for the whole layer) and that head's sizes and scale factor."""

    p: Any  # symattn.problem.core.Problem
    head: int | None = None

    @property
    def multi(self) -> bool:
        return bool(self.p.multi_head)

    @property
    def projected(self) -> bool:
        return self.p.X is not None

    @property
    def cross(self) -> bool:
        return self.p.context is not None

    @property
    def positions(self) -> bool:
        """Positional encodings are added to X before the projections."""
        return getattr(self.p, "positions", None) is not None

    @property
    def xq(self) -> str:
        """The key of what the queries are made from: X, or X with its positions added."""
        return X_POS if self.positions else X

    @property
    def kv(self) -> str:
        """The key of what the keys and values are made from: the context, or X itself (with its
        positions when it has them)."""
        return CONTEXT if self.cross else self.xq

    @property
    def kv_name(self) -> str:
        return "C" if self.cross else self.xq_name

    @property
    def xq_name(self) -> str:
        """What the queries are made from, in LaTeX."""
        return "X_{pos}" if self.positions else "X"

    def plain(self, name: str) -> str:
        """A name of :attr:`xq_name`/:attr:`kv_name` in plain text."""
        return name.replace("_{pos}", "_pos")

    @property
    def heads(self) -> list[int | None]:
        """The head numbers of the problem: 1..h with several heads, else [None]."""
        return list(range(1, len(self.p.heads) + 1)) if self.multi else [None]

    @property
    def weights(self):
        """This head's weights (a :class:`symattn.problem.core.Head`), or None when Q, K, V are given."""
        if not self.projected:
            return None
        return self.p.heads[(self.head or 1) - 1]

    @property
    def d_k(self) -> int:
        return self.weights.d_k if self.projected else self.p.d_k

    @property
    def factor(self):
        """The exact factor this head's scores are multiplied by."""
        return self.p.scale_for(self.d_k)

    @property
    def output(self) -> str:
        """The key of the layer's output: a head's O, or the projected O of several heads."""
        return O_FINAL if self.multi else O

    @property
    def loss(self):
        return self.p.backward

    def at(self, head: int | None) -> "Context":
        return Context(self.p, head)

    @property
    def rope(self):
        """The problem's rotary embedding (a :class:`symattn.problem.rope.Rope`), or None."""
        return self.p.rope

    def rotation(self, pairing: str | None = None) -> tuple:
        """``(θ_i, pairs)`` of this head's rotation (with ``pairing``: that pairing's pairs)."""
        from ..problem.rope import pairs

        return self.rope.thetas(self.d_k), pairs(self.d_k, pairing or self.rope.pairing)

    @property
    def t(self) -> int | None:
        """The decoded token (1-based), or None."""
        return self.p.decode

    @property
    def grouped(self) -> bool:
        """Grouped-query attention: the query heads share keys and values (kv_heads)."""
        return bool(self.p.kv_heads) and self.multi

    @property
    def d_v(self) -> int:
        return self.weights.d_v if self.projected else self.p.d_v

    def has_bias(self, key: str) -> bool:
        """Whether the problem's projection ``key`` (b_Q, b_K, b_V or b_O) has a bias: the layer's
        b_O, or a head's b_Q, b_K, b_V (the heads of a problem give a bias all or none)."""
        if key == B_O:
            return getattr(self.p, "b_O", None) is not None
        return key in self.p.head_biases

    def bias(self, key: str):
        """This head's bias ``key`` (b_Q, b_K, b_V) or the layer's b_O; None without one."""
        if key == B_O:
            return getattr(self.p, "b_O", None)
        return getattr(self.weights, key, None) if self.projected else None

    def reads(self, key: str, head: int | None) -> int | None:
        """The head whose stage ``key`` head ``head`` reads: its K/V group's first head for a
        shared key or value stage, else ``head`` itself."""
        if head is not None and self.grouped and key in SHARED_KV:
            return self.p.kv_leader(head)
        return head


Relation = Callable[[Any, Callable[..., Any], Context], Any]


@dataclass(frozen=True)
class Mistake:
    """A common mistake: its name (said to the student) and the stage it would give, computed by
    ``relation(ops, ex, c)`` from the exact values (``ex(key)``); None where it does not apply."""

    name: str
    relation: Relation


@dataclass(frozen=True)
class Section:
    """A step of the worked solution (the walk-through's numbered stages)."""

    key: str
    title: str
    backward: bool = False
    per_head: bool = False
    applies: Callable[[Context], bool] = lambda c: True
    retitle: Callable[[Context], "str | None"] = lambda c: None  # another title for this head, or None

    def title_for(self, c: Context) -> str:
        return self.retitle(c) or self.title


@dataclass(frozen=True)
class Dot:
    """One entry worked out as a dot product: ``target[i][j] = Σ_k a_k·b_k``."""

    target: str
    i: int
    j: int
    left: str  # how the left vector is named, e.g. "q_1"
    right: str  # e.g. "k_2"
    terms: tuple
    value: Any
    bias: Any = None  # the bias entry added to the dot product (Q = X W_Q + b_Q); None: no bias


Text = "str | Callable[[Context], str]"


@dataclass(frozen=True)
class Kind:
    """One stage kind: a row of the registry.

    ``axes`` names what the rows and columns stand for: ``QUERIES`` (query tokens), ``KEYS`` (key
    tokens), or a letter for numbered dimensions (``"d"`` gives d1, d2, ...). ``source`` gives
    the problem's own matrix for a stage that is given, and ``relation`` computes the others.
    ``shape`` writes the shape note from the inputs' shapes (``sh(key)`` → (rows, cols)).
    """

    key: str
    name: str
    order: float  # place in the formula (what --from/--to and --ask count by)
    section: "str | Callable[[Context], str]"
    title: Text
    why: Text
    formula: "tuple[str, str] | Callable[[Context], tuple[str, str]]"  # (LaTeX, plain text)
    axes: "tuple[str, str] | Callable[[Context], tuple[str, str]]"
    shape: Callable[..., str]
    inputs: tuple[str, ...] = ()  # the stage keys the relation reads (in this head, unless layer-wide)
    relation: Relation | None = None
    source: Callable[[Context], Any] | None = None
    when: Callable[[Context], bool] = lambda c: True
    per_head: bool | str = False  # one stage per head; a run of rows with the same value goes head by head
    gradient: bool = False
    labelled: bool = True  # weights are shown without token or dimension labels
    tex: str = ""  # the stage's symbol in LaTeX (default: its name, W_Q → W_{Q})
    shows: frozenset = frozenset()  # extra pieces a worked solution shows (see the renderers)
    worked: Callable | None = None  # which entry is worked as a dot product
    mistakes: tuple[Mistake, ...] = ()
    slips: bool = False  # integer products: an entry off by one is an arithmetic slip
    short: Callable[[Any, Any, Context], bool] | None = None  # exact entries short at any size
    by_relation: bool = False  # evaluated from its inputs' values, not entry by entry
    note: Callable[[Any], str] | None = None  # added to the why, from the exact value


    def text(self, attr: str, c: Context) -> Any:
        value = getattr(self, attr)
        return value(c) if callable(value) else value

    def is_given(self, c: Context) -> bool:
        return self.source is not None and self.source(c) is not None

    @property
    def symbol(self) -> str:
        """The stage's symbol in LaTeX."""
        if self.tex:
            return self.tex
        head, _, tail = self.name.partition("_")
        return f"{head}_{{{tail}}}" if tail else head


# -- small helpers for the rows -------------------------------------------------------------


def _prod(a: tuple[int, int], b: tuple[int, int], note: str) -> str:
    return f"({a[0]}×{a[1]})·({b[0]}×{b[1]}) → {a[0]}×{b[1]} ({note})"


def _t(shape: tuple[int, int]) -> tuple[int, int]:
    return (shape[1], shape[0])


def _plain(r: tuple[int, int], note: str) -> str:
    return f"{r[0]}×{r[1]} ({note})"


def _sq(m) -> bool:
    return m is not None and len(m) == len(m[0])


# -- why ----------------------------------------------------------------------------------------
#
# The why texts (and every other sentence the worked solution prints from here: the mask's rule,
# the loss) mark each mathematical symbol as LaTeX between ⟦ and ⟧: "weight ⟦a_{ij}⟧ of query
# ⟦i⟧". The renderers typeset a marked piece as math (LaTeX \(…\), Markdown $…$) and the text
# renderer writes it in Unicode (aᵢⱼ); the vocabulary and the conversions are in
# symattn/render/prose.py. Text outside the brackets is prose, never math.

_WHY = {
    X: "Each row of ⟦X⟧ is one token's vector; attention will mix these rows.",
    "X_cross": "Each row of ⟦X⟧ is one query-side token; the queries are computed from it.",
    CONTEXT: "Each row of the context is one token of the other sequence; keys and values are computed from it (cross-attention).",
    W_Q: "The query weights, learned in training and given here.",
    W_K: "The key weights, learned in training and given here.",
    W_V: "The value weights, learned in training and given here.",
    W_O: "The output weights, learned in training and given here: they mix the heads' outputs.",
    B_Q: "The query bias, learned in training and given here: one row, added to every token's query.",
    B_K: "The key bias, learned in training and given here: one row, added to every token's key.",
    B_V: "The value bias, learned in training and given here: one row, added to every token's value.",
    B_O: "The output bias, learned in training and given here: one row, added to every output row.",
    "bias_added": " Then the bias ⟦b_{L}⟧ is added to every row.",
    "db": ("⟦b_{L}⟧ is added to every row of ⟦{L}⟧, so its gradient sums ⟦d{L}⟧ over the rows: the column sums "
           "⟦\\mathbf{{1}}^{{\\top}} d{L}⟧."),
    "db_K": (" It is exactly ⟦0⟧: adding ⟦b_K⟧ to every key adds ⟦q_i \\cdot b_K⟧ to every score of row ⟦i⟧, and a "
             "softmax does not change when a constant is added to its row (each row of ⟦dS⟧ sums to ⟦0⟧)."),
    Q: "Each token's query says what it is looking for: its row of ⟦X⟧ times ⟦W_Q⟧.",
    K: "Each token's key says what it offers to be matched against: its row times ⟦W_K⟧.",
    V: "Each token's value is what it hands on when it is attended to: its row times ⟦W_V⟧.",
    "Q_given": "The queries are given directly: one row per query token, what it is looking for.",
    "K_given": "The keys are given directly: one row per key token, what it offers to be matched against.",
    "V_given": "The values are given directly: one row per key token, what it hands on when attended to.",
    "cross": " Keys and values come from the context: this is cross-attention.",
    K_T: "Transposing ⟦K⟧ turns each key into a column, so one matrix product compares every query with every key.",
    S: "Entry ⟦(i, j)⟧ is the dot product of query ⟦i⟧ with key ⟦j⟧: how well query ⟦i⟧ matches key ⟦j⟧.",
    S_SCALED: (
        "A dot product of ⟦d_k⟧ terms of unit variance has variance ⟦d_k⟧; dividing by ⟦\\sqrt{d_k}⟧ brings the scores "
        "back to unit variance, so the softmax does not saturate into a one-hot row with vanishing gradients."
    ),
    "S_scaled_custom": "The scores are multiplied by the scale factor the problem gives.",
    "S_scaled_none": "This problem uses no scaling (scale ⟦1⟧), so the scaled scores equal the scores.",
    M: (
        "The mask says which keys each query may see: ⟦0⟧ where it may attend, ⟦-\\infty⟧ where it may not. "
        "Decoders (GPT-style) use a causal mask so a token cannot look ahead; encoders (BERT-style) use none."
    ),
    S_MASKED: (
        "Adding ⟦M⟧ leaves allowed scores unchanged and sends forbidden ones to ⟦-\\infty⟧; since ⟦\\exp(-\\infty) = 0⟧ "
        "(as a limit), they get weight exactly ⟦0⟧."
    ),
    # A's why is this sentence and its end, which depends on how the rows were normalised (the note)
    A: "The softmax turns each row of scores into weights that are positive and sum to ⟦1⟧; ",
    "A_max": "subtracting the row maximum ⟦m_i⟧ first changes nothing (it cancels) and keeps every exponent ⟦\\le 0⟧.",
    "A_symbolic": (
        "subtracting a reference score ⟦m_i⟧ from a row first changes nothing (it cancels). With symbols the "
        "largest score of a row cannot always be picked, so such a row is normalised by its first allowed score "
        "instead and its exponents can be positive; any reference value gives the same weights."
    ),
    O: "Each output row is a weighted average of the value rows, weighted by the same row of ⟦A⟧.",
    CONCAT: "Each head attended in its own subspace; their outputs are placed side by side, row by row.",
    O_FINAL: "The output projection ⟦W_O⟧ mixes what the heads found into one output row per token.",
    DO: "Backpropagation starts from the loss: ⟦\\partial L/\\partial O⟧ says how the loss changes with each output entry.",
    DW_O: "The output projection is a product, so its weights' gradient is the concatenation (transposed) times ⟦dO⟧.",
    DCONCAT: "The gradient flows back through ⟦W_O⟧ to every head's output columns.",
    DO_HEAD: "This head's share of the upstream gradient: its block of columns of ⟦d\\operatorname{concat}⟧.",
    DV: (
        "Each value row was handed on with weight ⟦a_{ij}⟧ to every query ⟦i⟧, so its gradient collects those weights "
        "times ⟦dO⟧: ⟦A^{\\top} dO⟧."
    ),
    DA: (
        "Each weight ⟦a_{ij}⟧ scaled value row ⟦j⟧ in output row ⟦i⟧, so its gradient is the dot product of ⟦dO_i⟧ "
        "with ⟦v_j⟧: ⟦dO\\,V^{\\top}⟧."
    ),
    DS_MASKED: (
        "The softmax couples a whole row: raising one score raises its weight and lowers every other, "
        "so the gradient goes through the Jacobian ⟦\\operatorname{diag}(a) - a\\,a^{\\top}⟧ of each row, which gives "
        "⟦d\\hat{S}_{ij} = a_{ij}\\bigl(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\bigr)⟧. Masked positions have weight ⟦0⟧, "
        "so their gradient is exactly ⟦0⟧, and each row of ⟦d\\hat{S}⟧ sums to exactly ⟦0⟧ (adding a constant to a "
        "row of scores changes nothing)."
    ),
    DS: "The scores were scaled before the mask, so the gradient of the unscaled scores is the scale times ⟦d\\hat{S}⟧.",
    "dS_none": "This problem uses no scaling, so the gradient of the scores is ⟦d\\hat{S}⟧ itself.",
    DQ: (
        "Score ⟦(i, j)⟧ is ⟦q_i \\cdot k_j⟧, so query ⟦i⟧'s gradient sums the keys weighted by row ⟦i⟧ of ⟦dS⟧: "
        "⟦dS\\,K⟧."
    ),
    DK: (
        "Key ⟦j⟧ met every query in column ⟦j⟧ of ⟦S⟧, so its gradient sums the queries weighted by column ⟦j⟧ of "
        "⟦dS⟧: ⟦dS^{\\top} Q⟧."
    ),
    # {C} is the name of what the keys and values are made from (X, or the context C)
    DW_Q: "⟦Q = X\\,W_Q⟧, so the query weights' gradient is ⟦X^{\\top} dQ⟧.",
    DW_K: "⟦K = {C}\\,W_K⟧, so the key weights' gradient is ⟦{C}^{\\top} dK⟧.",
    DW_V: "⟦V = {C}\\,W_V⟧, so the value weights' gradient is ⟦{C}^{\\top} dV⟧.",
    DX: "⟦X⟧ reached the loss along three paths (queries, keys and values), so its gradient is their sum.",
    "dX_cross": "⟦X⟧ only made the queries here (cross-attention), so its gradient comes through ⟦dQ⟧ alone.",
    "dX_heads": " With several heads, every head's paths add up.",
    "dX_positions": (" The paths start at ⟦X_{pos} = X + PE⟧ and ⟦PE⟧ does not depend on ⟦X⟧, so the gradient of "
                     "⟦X⟧ is that of ⟦X_{pos}⟧ (for learned positions it is their gradient too, not derived here)."),
    "positions_used": (" The rows are those of ⟦X_{pos}⟧, the tokens with their positions added, so it now "
                       "depends on where each token stands."),
    DCONTEXT: "The context made the keys and the values, so its gradient is the sum of those two paths.",
    M_TILED: (
        "FlashAttention never holds a whole row of scores: it reads the keys in blocks and keeps, per query, "
        "only a running maximum ⟦m⟧, a running sum ⟦\\ell⟧ and an accumulator ⟦\\mathrm{{acc}}⟧, starting from "
        "⟦m^{{(0)}} = -\\infty⟧, ⟦\\ell^{{(0)}} = 0⟧, ⟦\\mathrm{{acc}}^{{(0)}} = 0⟧. Here the blocks hold ⟦B = {B}⟧ keys. "
        "Column ⟦b⟧ is the largest score seen after block ⟦b⟧; a masked key (⟦-\\infty⟧) never raises it."
    ),
    L_TILED: (
        "Each block's terms ⟦e^{{s_j - m^{{(b)}}}}⟧ are taken relative to the newest maximum, but the sum so far was "
        "taken relative to the older one ⟦m^{{(b-1)}}⟧. Multiplying it by ⟦e^{{m^{{(b-1)}} - m^{{(b)}}}}⟧ re-bases it "
        "(⟦e^{{s_j - m^{{(b-1)}}}} e^{{m^{{(b-1)}} - m^{{(b)}}}} = e^{{s_j - m^{{(b)}}}}⟧), so no earlier key needs to be read "
        "again: one pass over the keys is enough, and the ⟦n \\times n⟧ weights are never stored. A masked key adds "
        "exactly ⟦0⟧; before any key is allowed the factor is ⟦0⟧ (⟦e^{{x}} \\to 0⟧ as ⟦x \\to -\\infty⟧). After the last block ⟦\\ell⟧ "
        "is the softmax normaliser ⟦Z_i⟧."
    ),
    ACC_TILED: (
        "The accumulator collects ⟦e^{{s_j - m}} v_j⟧ and is re-based by the same factor "
        "⟦e^{{m^{{(b-1)}} - m^{{(b)}}}}⟧ whenever the maximum grows, so after the last block it is the softmax's "
        "numerator ⟦\\sum_j e^{{s_j - m_i}} v_j⟧ of each output row."
    ),
    O_TILED: (
        "Dividing once at the end gives the output rows: ⟦o_i = \\mathrm{{acc}}_i / \\ell_i⟧. It equals row ⟦i⟧ of "
        "⟦A\\,V⟧ exactly, not just to rounding: the difference simplifies to ⟦0⟧."
    ),
}


def _heads_words(heads: list[int]) -> str:
    """``heads 1 and 2``, ``heads 1, 2 and 3``, ``head 1``."""
    if len(heads) == 1:
        return f"head {heads[0]}"
    return "heads " + ", ".join(str(h) for h in heads[:-1]) + f" and {heads[-1]}"


def kv_groups(p) -> list[tuple[int, list[int]]]:
    """``(group, query heads)`` of a grouped-query problem (1-based), in order."""
    size = len(p.heads) // p.kv_heads
    return [(g, list(range((g - 1) * size + 1, g * size + 1))) for g in range(1, p.kv_heads + 1)]


def kv_cache_size(p) -> dict:
    """Numbers the KV cache holds per token per layer: with the problem's K/V heads and without sharing."""
    heads = list(p.heads) if p.projected else []
    g = p.kv_heads or len(heads) or 1
    h = len(heads) or 1
    d_k, d_v = p.d_k, p.d_v
    return {"kv_heads": g, "query_heads": h, "d_k": d_k, "d_v": d_v,
            "per_token": g * (d_k + d_v), "without_sharing": h * (d_k + d_v)}


def _cache_sentence(c: Context) -> str:
    """The KV cache's size per token, with and without the heads' sharing."""
    size = kv_cache_size(c.p)
    g, h, d_k, d_v = size["kv_heads"], size["query_heads"], size["d_k"], size["d_v"]
    if d_k == d_v:
        with_, without = f"2 g\\,d_k = 2 \\cdot {g} \\cdot {d_k}", f"2 h\\,d_k = 2 \\cdot {h} \\cdot {d_k}"
    else:
        with_, without = f"g(d_k + d_v) = {g}({d_k} + {d_v})", f"h(d_k + d_v) = {h}({d_k} + {d_v})"
    if not c.grouped:
        return (f" The KV cache grows by the token's key and value in every head: ⟦{without} = {size['without_sharing']}⟧ "
                "numbers per token per layer.")
    return (f" With ⟦g = {g}⟧ K/V heads for ⟦h = {h}⟧ query heads, the KV cache holds ⟦{with_} = {size['per_token']}⟧ "
            f"numbers per token per layer (keys and values), against ⟦{without} = {size['without_sharing']}⟧ "
            "without sharing.")


def _group_note(c: Context, key: str) -> str:
    """Which query heads read this K/V group (grouped-query attention), for the group's stages;
    which group a query head reads, for its queries."""
    if not c.grouped or c.head is None or key == W_Q:
        return ""
    p = c.p
    group = p.kv_group(c.head)
    heads = kv_groups(p)[group - 1][1]
    if key == Q:
        ids = f"{stage_id(K, heads[0])} and {stage_id(V, heads[0])}"
        return (f" Head {c.head} reads K/V group {group} ({ids}), which {_heads_words(heads)} share "
                f"({'multi-query attention: one K/V head for all' if p.kv_heads == 1 else 'grouped-query attention'}).")
    note = f" {_heads_words(heads).capitalize()} read K/V group {group}: it is computed once, for them all."
    return note + (_cache_sentence(c) if key == K else "")


def _reads_note(c: Context, key: str) -> str:
    """For a grouped head other than its group's first: whose keys (K_T) or values (V) it reads."""
    other = c.reads(key, c.head)
    if other == c.head:
        return ""
    return f" The {'keys' if key == K_T else 'values'} are K/V group {c.p.kv_group(c.head)}'s ({stage_id(key, other)})."


def _mask_why(c: Context) -> str:
    p = c.p
    why = _WHY[M] + f" Here the rule is {p.mask.rule()}."
    if p.mask.kinds & {"causal", "causal-bottom-right", "sliding-window"} and p.n_q != p.n_k:
        shift = p.n_k - p.n_q
        why += (
            f" With ⟦{p.n_q}⟧ queries and ⟦{p.n_k}⟧ keys the two causal alignments differ: top-left "
            f"(PyTorch's is_causal) lets query ⟦i⟧ see keys ⟦j \\le i⟧, bottom-right (FlashAttention's) "
            f"keys ⟦j \\le i {'+' if shift >= 0 else '-'} {abs(shift)}⟧."
        )
    if p.bias is not None:
        why += " The bias is added to it, so ⟦M⟧ is the mask plus the bias."
    return why


_POSITIONS_WHY = {
    "sinusoidal": (
        "Attention by itself ignores order: shuffling the tokens only shuffles the output rows. The original "
        "transformer therefore adds to each token a fixed vector that encodes its position ⟦p⟧: each pair of "
        "columns ⟦2i, 2i+1⟧ holds the sine and cosine of ⟦p⟧ at one frequency, ⟦1/\\mathrm{{base}}^{{2i/d}}⟧, "
        "from one radian per position (⟦i = 0⟧) to ever slower ones, so nearby positions get similar rows. "
        "Positions are counted from ⟦p = 0⟧ as in the paper: token ⟦1⟧ of this text has ⟦p = 0⟧, so its row is "
        "⟦\\sin(0) = 0⟧ and ⟦\\cos(0) = 1⟧ alternating. Here ⟦\\mathrm{{base}} = {base}⟧ and ⟦d = d_{{\\mathrm{{model}}}} = {d}⟧, and "
        "every entry is exact."
    ),
    "learned": (
        "Attention by itself ignores order: shuffling the tokens only shuffles the output rows. Here the "
        "positions are learned (GPT-2 style): one trained row per position, given, and row ⟦p⟧ is added to the "
        "token at position ⟦p⟧."
    ),
    "cross": (
        " Only ⟦X⟧, the query side, gets positions: the context is taken as given (in an encoder-decoder "
        "transformer it is the encoder's output, whose positions were added before the encoder)."
    ),
}


def _pe_why(c: Context) -> str:
    pos = c.p.positions
    import sympy

    why = _POSITIONS_WHY[pos.kind]
    if pos.kind == "sinusoidal":
        why = why.format(base=sympy.latex(pos.base), d=c.p.d_model)
    return why + (_POSITIONS_WHY["cross"] if c.cross else "")


def _pe_formula(c: Context) -> tuple[str, str]:
    import sympy

    pos = c.p.positions
    if pos.kind != "sinusoidal":
        return "PE", "PE (given)"
    b, d, t = sympy.latex(pos.base), c.p.d_model, str(pos.base)
    if not pos.base.is_Integer:
        b, t = f"\\left({b}\\right)", f"({t})"
    angle = f"\\frac{{p}}{{{b}^{{2i/{d}}}}}"
    return (f"PE_{{p,\\,2i}} = \\sin {angle},\\quad PE_{{p,\\,2i+1}} = \\cos {angle}",
            f"PE[p, 2i] = sin(p / {t}^(2i/{d})), PE[p, 2i+1] = cos(p / {t}^(2i/{d})), p = 0, 1, ...")


def _pe_slip(**slip) -> Relation:
    def relation(ops, ex, c):
        m = c.p.positions.variant(**slip)
        return None if m is None else ops.given(m)

    return relation


def _scale_formula(c: Context) -> tuple[str, str]:
    import sympy

    p = c.p
    if p.scale == "auto":
        return f"\\frac{{S}}{{\\sqrt{{d_k}}}} = \\frac{{S}}{{\\sqrt{{{c.d_k}}}}}", f"S / √d_k = S / √{c.d_k}"
    if p.scale == "none":
        return "S", "S (no scaling)"
    return f"{sympy.latex(c.factor)}\\cdot S", f"{c.factor}·S"


def _scale_why(c: Context) -> str:
    return {"auto": _WHY[S_SCALED], "none": _WHY["S_scaled_none"]}.get(
        c.p.scale if isinstance(c.p.scale, str) else "", _WHY["S_scaled_custom"])


def _masked_formula(c: Context) -> tuple[str, str]:
    import sympy

    p = c.p
    scaled = {"auto": "\\frac{S}{\\sqrt{d_k}}", "none": "S"}.get(p.scale) if isinstance(p.scale, str) else None
    scaled = scaled or f"{sympy.latex(p.scale)}\\,S"
    return f"\\hat{{S}} = {scaled} + M", "Ŝ = S_scaled + M"


def _scale_tex(c: Context) -> str:
    import sympy

    return "\\frac{1}{\\sqrt{d_k}}" if c.p.scale == "auto" else sympy.latex(c.factor)


def _dS_formula(c: Context) -> tuple[str, str]:
    if c.factor == 1:  # no scaling (or a scale of 1): no factor written
        return "dS = d\\hat{S}", "dS = dŜ"
    return f"dS = {_scale_tex(c)}\\, d\\hat{{S}}", f"dS = {c.factor}·dŜ"


def _dO_formula(c: Context) -> tuple[str, str]:
    kind = c.loss.kind
    if kind == "sum":
        return "dO = \\frac{\\partial L}{\\partial O} = \\mathbf{1}", "dO = ∂L/∂O = 1 (every entry)"
    if kind == "weights":
        return "dO = \\frac{\\partial L}{\\partial O} = W", "dO = ∂L/∂O = W"
    if kind == "dO":
        return "dO = \\frac{\\partial L}{\\partial O}", "dO = ∂L/∂O (given)"
    return "dO = \\frac{\\partial L}{\\partial O} = O - T", "dO = ∂L/∂O = O − T"


def _dO_relation(ops, v, c: Context):
    loss = c.loss
    if loss.kind == "sum":
        return ops.ones(c.p.n_q, c.p.d_out)
    if loss.kind in ("weights", "dO"):
        return ops.given(loss.matrix)
    return ops.sub(v(c.output), ops.given(loss.matrix))  # L = ½‖O − T‖²


def _head_block(c: Context) -> tuple[int, int]:
    """Where this head's columns sit in the concatenation: (first, width)."""
    widths = [h.d_v for h in c.p.heads]
    k = (c.head or 1) - 1
    return sum(widths[:k]), widths[k]


def _dO_head_formula(c: Context) -> tuple[str, str]:
    lo, width = _head_block(c)
    return (f"dO^{{({c.head})}} = d\\operatorname{{concat}}_{{[:,\\,{lo + 1}..{lo + width}]}}",
            f"dO = dconcat[:, {lo + 1}..{lo + width}]")


def _input_paths(c: Context, kind: str) -> list[tuple[str, str, int | None]]:
    """(gradient, weights, head) of every path to X (``kind`` dX) or to the context (dcontext),
    heads' query paths first."""
    heads = c.heads
    if kind == DCONTEXT:
        return [(g, w, h) for h in heads for g, w in ((DK, W_K), (DV, W_V))]
    paths = [(DQ, W_Q, h) for h in heads]
    if not c.cross:
        paths += [(g, w, h) for h in heads for g, w in ((DK, W_K), (DV, W_V))]
    return paths


def _input_gradient(kind: str) -> Relation:
    def relation(ops, v, c: Context):
        return ops.sum([ops.matmul(v(g, h), ops.T(v(w, h))) for g, w, h in _input_paths(c, kind)])

    return relation


def _dX_why(c: Context) -> str:
    why = _WHY["dX_cross"] if c.cross else _WHY[DX]
    return why + (_WHY["dX_heads"] if c.multi else "") + (_WHY["dX_positions"] if c.positions else "")


def _dX_formula(c: Context) -> tuple[str, str]:
    sum_h, sum_t = ("\\sum_h ", "Σ_h ") if c.multi else ("", "")
    if c.cross:
        return f"dX = {sum_h}dQ\\,W_Q^{{\\top}}", f"dX = {sum_t}dQ·W_Qᵀ"
    return (f"dX = {sum_h}\\left(dQ\\,W_Q^{{\\top}} + dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)",
            f"dX = {sum_t}(dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ)")


def _dcontext_formula(c: Context) -> tuple[str, str]:
    sum_h, sum_t = ("\\sum_h ", "Σ_h ") if c.multi else ("", "")
    return (f"dC = {sum_h}\\left(dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)",
            f"dC = {sum_t}(dK·W_Kᵀ + dV·W_Vᵀ)")


def _dot(target: str, i: int, j: int, a, b, left: str, right: str, value) -> Dot:
    return Dot(target, i, j, left, right, tuple(zip(list(a), list(b))), value)


def dot_at(key: str, v, result, c: Context, i: int, j: int) -> Dot | None:
    """Entry (i, j) of a projection (Q, K, V) or of the scores worked as a dot product; None for
    any other stage."""
    if key == S:
        rot = "^{\\mathrm{rot}}" if c.rope is not None else ""
        return _dot(S, i, j, v("q_in").row(i), v(K_T).col(j), f"q{rot}_{i + 1}", f"k{rot}_{j + 1}", result[i, j])
    if key in (Q, K, V):
        inp = v(c.xq) if key == Q else v(c.kv)
        label = "x" if key == Q or not c.cross else "c"
        dot = _dot(key, i, j, inp.row(i), v("W_" + key).col(j), f"{label}_{i + 1}", f"W_{key}[:,{j + 1}]",
                   result[i, j])
        bias = BIASES[key]
        return replace(dot, bias=v(bias)[0, j]) if c.has_bias(bias) else dot
    return None


def _worked_projection(name: str) -> Callable:
    def worked(v, result, c: Context) -> tuple[Dot, ...]:
        return (dot_at(name, v, result, c, 0, 0),)

    return worked


def _worked_score(v, result, c: Context) -> tuple[Dot, ...]:
    return (dot_at(S, v, result, c, 0, 1 if result.cols > 1 else 0),)


# -- the common mistakes ----------------------------------------------------------------------

_TRANSPOSED = "the product's rows and columns are swapped (the answer is the transpose)"
_NO_SCALING = "no scaling: the scores were not divided by √d_k"
_BY_D_K = "scaled by d_k instead of √d_k"
_MASK_MISSING = "mask missing: the masked positions were not set to −∞"
_MASK_AFTER = "mask applied after the softmax (masked weights zeroed, rows not renormalised)"
_COLUMNS = "softmax taken over columns instead of rows"


def _transposed(key: str, square_only: bool = False) -> Mistake:
    def relation(ops, ex, c):
        exact = ex(key)
        return None if square_only and not _sq(exact) else ops.T(exact)

    return Mistake(_TRANSPOSED, relation)


def _by_d_k(ops, ex, c: Context):
    return ops.scale(ex(S), ops.rational(1, c.d_k))


def _score_variants(kind: str) -> tuple[Mistake, ...]:
    """Mistakes before the softmax, carried to the weights (``kind`` A) or the output (O)."""

    def carried(weights_of: Callable) -> Relation:
        def relation(ops, ex, c):
            a = weights_of(ops, ex, c)
            return a if kind == A else ops.matmul(a, ex(V))

        return relation

    def columns(ops, ex, c):
        z = ex(S_MASKED)
        if not ops.columns_attend(z):
            return None
        return ops.T(ops.softmax(ops.T(z)))

    def after(ops, ex, c):
        return ops.zero_masked(ops.softmax(ex(S_SCALED)), ex(M))

    return (
        Mistake(_NO_SCALING, carried(lambda ops, ex, c: ops.softmax(ops.add_mask(ex(S), ex(M))))),
        Mistake(_BY_D_K, carried(lambda ops, ex, c: ops.softmax(ops.add_mask(_by_d_k(ops, ex, c), ex(M))))),
        Mistake(_MASK_MISSING, carried(lambda ops, ex, c: ops.softmax(ex(S_SCALED)))),
        Mistake(_MASK_AFTER, carried(after)),
        Mistake(_COLUMNS, carried(columns)),
    )


def _square_product(name: str, left: Callable, right: Callable, when: Callable = _sq) -> Mistake:
    def relation(ops, ex, c):
        a = left(ops, ex)
        return ops.matmul(a, right(ops, ex)) if when(ex) else None

    return Mistake(name, relation)


_SCALE_MISSING_DQDK = "the scale factor is missing: dŜ was used instead of dS = scale·dŜ"


# -- rotary position embeddings (RoPE) ---------------------------------------------------------

_ROPE_PAIRING = (
    "The two pairings rotate by the same angles but pair different components: half pairs component ⟦i⟧ "
    "with ⟦i + d_k/2⟧ (GPT-NeoX, LLaMA in Hugging Face: rotate_half), interleaved pairs ⟦2i - 1⟧ with ⟦2i⟧ "
    "(the RoFormer paper, Meta's original LLaMA code), so weights trained under one give other scores under "
    "the other."
)


def _rope_why(noun: str, letter: str) -> Text:
    def why(c: Context) -> str:
        r = c.rope
        return (
            f"RoPE turns each pair of {noun}'s components by the angle ⟦p\\,\\theta_i⟧, where ⟦p⟧ is the "
            f"token's position, counted from ⟦0⟧ for the first token as the libraries count, and "
            f"{r.rule()}; a turned {letter} keeps its length and only its direction carries the position. "
            f"This problem uses the {r.pairing} pairing. " + _ROPE_PAIRING
            + (" With ⟦d_k = 2⟧ both pair components ⟦1⟧ and ⟦2⟧." if c.d_k == 2 else "")
        )

    return why


def _rope_formula(letter: str) -> Callable[[Context], tuple[str, str]]:
    def formula(c: Context) -> tuple[str, str]:
        first = "(1, 1 + d_k/2)" if c.rope.pairing == "half" else "(1, 2)"
        return (f"{letter}^{{\\mathrm{{rot}}}}_p = R(p\\,\\theta)\\,{letter.lower()}_p",
                f"{letter}_rot[p] = R(p·θ)·{letter.lower()}_p, each pair {first}, … turned by p·θ_i")

    return formula


def _rope_mistakes(key: str) -> tuple[Mistake, ...]:
    from_ = Q if key == Q_ROT else K

    def swapped(ops, ex, c):
        from ..problem.rope import other

        return ops.rotate(ex(from_), *c.rotation(other(c.rope.pairing)))

    return (
        Mistake("the pairing is swapped: the other pairing's components were rotated together "
                "(half pairs i with i + d_k/2, interleaved 2i − 1 with 2i)", swapped),
        Mistake("rotated the wrong way (by −p·θ_i): the signs of the sines are swapped",
                lambda ops, ex, c: ops.rotate(ex(from_), *c.rotation(), sign=-1)),
        Mistake("positions counted from 1: the first token was rotated by θ_i, but RoPE counts positions from 0",
                lambda ops, ex, c: ops.rotate(ex(from_), *c.rotation(), offset=1)),
        Mistake("not rotated: the unrotated " + ("queries" if key == Q_ROT else "keys") + " were copied",
                lambda ops, ex, c: ex(from_)),
    )


_K_ROT_WHY = (
    "Each key is turned exactly as the queries are: pair ⟦i⟧ of the key at position ⟦p⟧ by ⟦p\\,\\theta_i⟧, "
    "in the same pairing. The values are not rotated: the position belongs in the match, not in what is "
    "handed on."
)


def _rope_rows() -> tuple[Kind, ...]:
    def row(key: str, base: str, order: float, title: str, noun: str, axis: str) -> Kind:
        return Kind(
            key, key, order, "rotate", title, _rope_why(noun, "vector") if base == Q else _K_ROT_WHY, _rope_formula(base),
            (QUERIES if base == Q else KEYS, axis),
            lambda sh, r, c, base=base: _plain(r, f"like {base}: {'n_q' if base == Q else 'n_k'} × d_k"),
            inputs=(base,), relation=lambda ops, v, c, base=base: ops.rotate(v(base), *c.rotation()),
            when=lambda c: c.rope is not None, per_head=True, tex=f"{base}^{{\\mathrm{{rot}}}}",
            shows=frozenset({"rotation"}), mistakes=_rope_mistakes(key),
        )

    return (row(Q_ROT, Q, 8.3, "Rotate the queries", "a query", "q"),
            row(K_ROT, K, 8.6, "Rotate the keys", "a key", "k"))


def _k_t_why(c: Context) -> str:
    if c.rope is None:
        return _WHY[K_T]
    return _WHY[K_T].replace("⟦K⟧", "the rotated keys ⟦K^{\\mathrm{rot}}⟧")


def _k_t_formula(c: Context) -> tuple[str, str]:
    if c.rope is None:
        return "K^{\\top}", "Kᵀ"
    return "K^{\\top} = (K^{\\mathrm{rot}})^{\\top}", "Kᵀ = K_rotᵀ"


def _s_why(c: Context) -> str:
    if c.rope is None:
        return _WHY[S]
    return (_WHY[S].replace("the dot product of query", "the dot product of rotated query") +
            " Since ⟦R(a)^{\\top} R(b) = R(b - a)⟧, the score of the query at position ⟦p⟧ and the key at "
            "position ⟦r⟧ is ⟦q_p \\cdot R((r - p)\\,\\theta)\\,k_r⟧: it depends on the positions only through "
            "⟦r - p⟧.")


def _s_formula(c: Context) -> tuple[str, str]:
    if c.rope is None:
        return "S = Q\\,K^{\\top}", "S = Q·Kᵀ"
    return "S = Q^{\\mathrm{rot}}\\,(K^{\\mathrm{rot}})^{\\top}", "S = Q_rot·K_rotᵀ"


def _rope_on_v(ops, ex, c: Context):
    """V with each row rotated as the keys are (None without RoPE, or when d_v is odd)."""
    if c.rope is None:
        return None
    v = ex(V)
    if (v.cols if hasattr(v, "cols") else len(v[0])) != c.d_k:
        return None
    return ops.rotate(v, *c.rotation())


_ROPE_ON_V = "the rotation was applied to V as well: RoPE rotates only the queries and the keys"
_ROPE_V_MISTAKES = (Mistake(_ROPE_ON_V, _rope_on_v),)
_ROPE_O_MISTAKES = (Mistake(_ROPE_ON_V, lambda ops, ex, c: None if _rope_on_v(ops, ex, c) is None
                            else ops.matmul(ex(A), _rope_on_v(ops, ex, c))),)
_ROPE_SCORE_MISTAKES = (
    Mistake("the rotation was left out: Q·Kᵀ of the unrotated queries and keys",
            lambda ops, ex, c: None if c.rope is None else ops.matmul(ex(Q), ops.T(ex(K)))),
)
# -- the tiled softmax ------------------------------------------------------------------------

_NO_RESCALE = ("forgotten rescale: the running sum and accumulator were updated without the factor "
               "e^(m_old − m_new) when the maximum grew")
_BLOCK_MAX = "each block's own maximum instead of the running maximum over every block so far"


def _tiled(c: Context) -> bool:
    return getattr(c.p, "tiling", None) is not None


def _output_without_rescale(ops, ex, c: Context):
    block = c.p.tiling.block
    return ops.tiled_output(ops.tiled_acc(ex(S_MASKED), ex(M_TILED), ex(V), block, rescale=False),
                            ops.tiled_sums(ex(S_MASKED), ex(M_TILED), block, rescale=False))


# -- the table --------------------------------------------------------------------------------


def _given_title(cross_title: str, title: str) -> Callable[[Context], str]:
    return lambda c: cross_title if c.cross else title


def _weights_row(key: str, order: int, title: str) -> Kind:
    letter = key[-1].lower()
    return Kind(
        key, key, order, "project", title, lambda c, key=key: _WHY[key] + _group_note(c, key),
        (key.replace("_", "_{", 1) + "}", key),
        ("d", letter), lambda sh, r, c, key=key: _plain(r, f"d_model × d_{'v' if key == W_V else 'k'}"),
        source=lambda c, key=key: getattr(c.weights, key) if c.projected else None,
        when=lambda c: c.projected, per_head=True, labelled=False,
    )


def _projection_row(key: str, order: int, title: str) -> Kind:
    def given_note(r, c):
        return _plain(r, {Q: "n_q × d_k", K: "n_k × d_k", V: "n_k × d_v"}[key])

    bias = BIASES[key]

    def shape(sh, r, c):
        if not c.projected:
            return given_note(r, c)
        inp = sh(c.xq) if key == Q else sh(c.kv)
        n = "n_q" if key == Q else "n_k"
        note = _prod(inp, sh("W_" + key), f"{n} × {'d_v' if key == V else 'd_k'}")
        return note + (f", plus {bias} ({sh(bias)[0]}×{sh(bias)[1]}) on every row" if c.has_bias(bias) else "")

    def why(c):
        if not c.projected:
            return _WHY[f"{key}_given"]
        positions = _WHY["positions_used"] if c.positions and (key == Q or not c.cross) else ""
        added = _WHY["bias_added"].format(L=key) if c.has_bias(bias) else ""
        return _WHY[key] + added + (_WHY["cross"] if c.cross and key != Q else "") + positions + _group_note(c, key)

    def formula(c):
        if not c.projected:
            return key, key
        name = c.xq_name if key == Q else c.kv_name
        if c.has_bias(bias):
            return f"{key} = {name}\\,W_{{{key}}} + b_{{{key}}}", f"{key} = {c.plain(name)}·W_{key} + {bias}"
        return f"{key} = {name}\\,W_{{{key}}}", f"{key} = {c.plain(name)}·W_{key}"

    def relation(ops, v, c):
        product = ops.matmul(v(c.xq) if key == Q else v(c.kv), v("W_" + key))
        return ops.add_row(product, v(bias)) if c.has_bias(bias) else product

    def unbiased(ops, ex, c):
        if not c.has_bias(bias):
            return None
        return ops.matmul(ex(c.xq) if key == Q else ex(c.kv), ex("W_" + key))

    return Kind(
        key, key, order, lambda c: "project" if c.projected else "given",
        lambda c: {Q: "Queries (given)", K: "Keys (given)", V: "Values (given)"}[key] if not c.projected else title,
        why, formula, (QUERIES if key == Q else KEYS, key.lower()), shape,
        inputs=("xq" if key == Q else "kv", "W_" + key, bias), relation=relation,
        source=lambda c: None if c.projected else getattr(c.p, key),
        per_head=True, slips=True, worked=_worked_projection(key),
        mistakes=(_transposed(key),) + (_ROPE_V_MISTAKES if key == V else ())
        + (Mistake(f"the bias {bias} was not added: {key} = {'X' if key == Q else 'the input'}·W_{key} alone",
                   unbiased),),
    )


def _few(heads, show, dots: str, most: int = 8) -> list[str]:
    """``show(h)`` for each head, or for the first two and the last with ``dots`` between when there
    are more than ``most`` (a formula of 256 heads is one line, and LaTeX's matrices hold 64 columns)."""
    heads = list(heads)
    if len(heads) <= most:
        return [show(h) for h in heads]
    return [show(heads[0]), show(heads[1]), dots, show(heads[-1])]


def _bias_row(key: str, order: float, title: str) -> Kind:
    """A projection's given bias, one 1 × d row (b_Q, b_K, b_V per head; b_O of the layer)."""
    letter = key[-1]
    layer = key == B_O
    return Kind(
        key, key, order, "projection" if layer else "project", title,
        (lambda c: _WHY[key] + (_group_note(c, W_K) if key in SHARED_KV else "")),
        (f"b_{{{letter}}}", key), ("b", letter.lower()),
        lambda sh, r, c: _plain(r, "1 × " + ("d_out" if layer else "d_v" if key == B_V else "d_k")
                                + ", added to every row"),
        source=lambda c: c.bias(key) if c.projected else None,
        when=lambda c: c.has_bias(key) and (c.multi or not layer), per_head=not layer, labelled=False,
    )


def _bias_gradient(key: str, order: float) -> Kind:
    """The gradient of a projection's bias: the column sums of its projection's gradient."""
    g = key[-1]
    layer = g == "O"
    dg = DO if layer else "d" + g

    def rows(c):  # the rows the bias was added to: the query tokens, or the key tokens for K and V
        return c.p.n_k if g in "KV" else c.p.n_q

    def relation(ops, v, c):
        return ops.col_sums(v(dg))

    def averaged(ops, ex, c):
        return ops.scale(ops.col_sums(ex(dg)), ops.rational(1, rows(c)))

    noun = {"Q": "query", "K": "key", "V": "value", "O": "output"}[g]
    return Kind(
        key, key, order, "b_projection" if layer else "b_weights", f"Gradient of the {noun} bias",
        _WHY["db"].format(L=g) + (_WHY["db_K"] if g == "K" else ""),
        (f"db_{{{g}}} = \\mathbf{{1}}^{{\\top}} d{g}", f"db_{g} = 1ᵀ·d{g} (the column sums of d{g})"),
        ("b", g.lower()), lambda sh, r, c: _prod((1, sh(dg)[0]), sh(dg), f"like b_{g}"),
        inputs=(dg,), relation=relation,
        when=lambda c: c.loss is not None and c.has_bias("b_" + g) and (c.multi or not layer),
        per_head=not layer, gradient=True, labelled=False,
        mistakes=(Mistake(f"averaged over the rows instead of summed: db_{g} is the sum of the rows of d{g}",
                          averaged),),
    )


def _output_projection(ops, v, c: Context):
    product = ops.matmul(v(CONCAT), v(W_O))
    return ops.add_row(product, v(B_O)) if c.has_bias(B_O) else product


def _weight_gradient(key: str, order: int, noun: str) -> Kind:
    g = key[-1]

    def relation(ops, v, c):
        inp = v(c.xq) if g == "Q" else v(c.kv)
        return ops.matmul(ops.T(inp), v("d" + g))

    def formula(c):
        name = c.xq_name if g == "Q" else c.kv_name
        return f"dW_{{{g}}} = {name}^{{\\top}} d{g}", f"dW_{g} = {c.plain(name)}ᵀ·d{g}"

    def why(c):
        text = _WHY[key].replace("{C}", c.kv_name)
        return text.replace("X", c.xq_name) if g == "Q" else text

    return Kind(
        key, key, order, "b_weights", f"Gradient of the {noun} weights",
        why, formula, ("d", g.lower()),
        lambda sh, r, c: _prod(_t(sh(c.xq) if g == "Q" else sh(c.kv)), sh("d" + g), f"like W_{g}"),
        inputs=("xq" if g == "Q" else "kv", "d" + g), relation=relation,
        when=lambda c: c.projected and c.loss is not None, per_head=True, gradient=True, labelled=False,
        mistakes=(_transposed(key, square_only=True),),
    )


# -- decoding one token from the KV cache (decode: t) -----------------------------------------

_FUTURE_KEY = ("the cache row used a future key: the weights were normalised over every key, "
               "including keys after t, as if the row were unmasked")


def _decoding(c: Context) -> bool:
    return c.t is not None


def _rot_tex(c: Context, letter: str) -> str:
    """The matrix the cache reads: the rotated queries or keys under RoPE (the cache holds them rotated)."""
    return f"{letter}^{{\\mathrm{{rot}}}}" if c.rope is not None else letter


def _rot_text(c: Context, letter: str) -> str:
    return f"{letter}_rot" if c.rope is not None else letter


def _row_t(ops, m, c: Context):
    return ops.rows(m, c.t - 1, 1)


def _future_weights(ops, ex, c: Context):
    """The decoded row's weights over all n keys (unmasked), as a student who used future keys gets them."""
    return ops.softmax(_row_t(ops, ex(S_SCALED), c))


def _decode_cost_rows(c: Context) -> list[list[int]]:
    d_k, d_v = c.d_k, c.d_v
    return [[t * d_k, t * d_v, t * t * d_k, t * t * d_v] for t in range(1, c.p.n_q + 1)]


def _decode_why(key: str) -> Callable[[Context], str]:
    def why(c: Context) -> str:
        t = c.t
        text = {
            K_CACHE: (f"Decoding token ⟦t = {t}⟧, a model has already computed the keys of tokens ⟦1⟧ to ⟦{t}⟧ "
                      f"(row ⟦{t}⟧ was just added for the new token) and keeps them: the KV cache holds rows ⟦1⟧ to "
                      f"⟦{t}⟧ of ⟦K⟧. Causal attention never reads a key after ⟦t⟧, so nothing else is needed."),
            V_CACHE: f"The values of tokens ⟦1⟧ to ⟦{t}⟧ are cached the same way: rows ⟦1⟧ to ⟦{t}⟧ of ⟦V⟧.",
            Q_T: f"Only the new token's query is needed: row ⟦{t}⟧ of ⟦Q⟧. The earlier rows were decoded at earlier steps.",
            S_T: ("The new query against every cached key, scaled as before: one row of ⟦t⟧ scores. No mask is "
                  "needed, since the cache holds only keys ⟦j \\le t⟧."),
            A_T: "The softmax of the one row of scores: weights over the cached keys that sum to ⟦1⟧.",
            O_T: "The new token's output: the cached values weighted by ⟦a_t⟧.",
            O_T_DIFF: (f"The decoded row is exactly row ⟦{t}⟧ of the full causal computation: the causal mask gave "
                       f"every key after ⟦{t}⟧ weight exactly ⟦0⟧, so leaving those keys out of the cache changes "
                       f"nothing. The difference ⟦o_t - O_{{{t},:}}⟧ simplifies to exactly ⟦0⟧."),
            DECODE_COST: ("Decoding token ⟦t⟧ from the cache costs ⟦t\\,d_k⟧ multiplications for its scores (and "
                          "⟦t\\,d_v⟧ for its output); recomputing all ⟦t⟧ rows from scratch costs ⟦t^2 d_k⟧ for the "
                          "scores (the full product ⟦Q K^{\\top}⟧ of ⟦t⟧ tokens) and ⟦t^2 d_v⟧ for the outputs. Row "
                          f"⟦t⟧ is the step that decodes that token; here ⟦d_k = {c.d_k}⟧ and ⟦d_v = {c.d_v}⟧"
                          + (", per head." if c.multi else ".")),
        }[key]
        if key == K_CACHE:
            text += _cache_sentence(c)
            if c.grouped:
                text += f" {_heads_words(kv_groups(c.p)[c.p.kv_group(c.head) - 1][1]).capitalize()} read this cache."
        return text

    return why


def _s_t_formula(c: Context) -> tuple[str, str]:
    factor = "" if c.factor == 1 else _scale_tex(c) + "\\,"
    text = "" if c.factor == 1 else f"{c.factor}·"
    return f"s_t = {factor}q_t\\,K_{{\\mathrm{{cache}}}}^{{\\top}}", f"s_t = {text}q_t·K_cacheᵀ"


_DECODE_KINDS: tuple[Kind, ...] = (
    Kind(K_CACHE, K_CACHE, 15.1, "decode", "The key cache", _decode_why(K_CACHE),
         lambda c: (f"K_{{\\mathrm{{cache}}}} = {_rot_tex(c, 'K')}_{{1..{c.t},\\,:}}",
                    f"K_cache = {_rot_text(c, 'K')}[1..{c.t}, :]"), (CACHED, "k"),
         lambda sh, r, c: _plain(r, "t × d_k"), inputs=("k_in",), relation=lambda ops, v, c: ops.rows(v("k_in"), 0, c.t),
         when=_decoding, per_head=True, tex="K_{\\mathrm{cache}}"),
    Kind(V_CACHE, V_CACHE, 15.2, "decode", "The value cache", _decode_why(V_CACHE),
         lambda c: (f"V_{{\\mathrm{{cache}}}} = V_{{1..{c.t},\\,:}}", f"V_cache = V[1..{c.t}, :]"), (CACHED, "v"),
         lambda sh, r, c: _plain(r, "t × d_v"), inputs=(V,), relation=lambda ops, v, c: ops.rows(v(V), 0, c.t),
         when=_decoding, per_head=True, tex="V_{\\mathrm{cache}}"),
    Kind(Q_T, Q_T, 15.3, "decode", "The new token's query", _decode_why(Q_T),
         lambda c: (f"q_t = {_rot_tex(c, 'Q')}_{{{c.t},\\,:}}", f"q_t = {_rot_text(c, 'Q')}[{c.t}, :]"), (NEW, "q"),
         lambda sh, r, c: _plain(r, "1 × d_k"), inputs=("q_in",), relation=lambda ops, v, c: _row_t(ops, v("q_in"), c),
         when=_decoding, per_head=True, tex="q_t"),
    Kind(S_T, S_T, 15.4, "decode", "Its scores against the cache", _decode_why(S_T), _s_t_formula, (NEW, CACHED),
         lambda sh, r, c: _prod(sh(Q_T), _t(sh(K_CACHE)), "1 × t") + ", scaled",
         inputs=(Q_T, K_CACHE),
         relation=lambda ops, v, c: ops.scale(ops.matmul(v(Q_T), ops.T(v(K_CACHE))), c.factor),
         when=_decoding, per_head=True, tex="s_t",
         mistakes=(Mistake(_NO_SCALING, lambda ops, ex, c: ops.matmul(ex(Q_T), ops.T(ex(K_CACHE)))),)),
    Kind(A_T, A_T, 15.5, "decode", "Its weights", _decode_why(A_T),
         ("a_t = \\operatorname{softmax}(s_t)", "a_t = softmax(s_t)"), (NEW, CACHED),
         lambda sh, r, c: f"{r[0]}×{r[1]} (1 × t), sums to 1", inputs=(S_T,),
         relation=lambda ops, v, c: ops.softmax(ops.add_mask(v(S_T), ops.mask(((True,) * c.t,), None))),
         when=_decoding, per_head=True, tex="a_t", shows=frozenset({"softmax"}),
         mistakes=(Mistake(_FUTURE_KEY, lambda ops, ex, c: ops.block(_future_weights(ops, ex, c), 0, c.t)
                           if c.t < c.p.n_k else None),)),
    Kind(O_T, O_T, 15.6, "decode", "Its output", _decode_why(O_T), ("o_t = a_t\\,V_{\\mathrm{cache}}", "o_t = a_t·V_cache"),
         (NEW, "v"), lambda sh, r, c: _prod(sh(A_T), sh(V_CACHE), "1 × d_v"), inputs=(A_T, V_CACHE),
         relation=lambda ops, v, c: ops.matmul(v(A_T), v(V_CACHE)), when=_decoding, per_head=True, tex="o_t",
         shows=frozenset({"weighted_sum"}),
         mistakes=(Mistake(_FUTURE_KEY, lambda ops, ex, c: ops.matmul(_future_weights(ops, ex, c), ex(V))
                           if c.t < c.p.n_k else None),)),
    Kind(O_T_DIFF, O_T_DIFF, 15.7, "decode", "The same as row t of the full computation", _decode_why(O_T_DIFF),
         lambda c: (f"o_t - O_{{{c.t},:}}", f"o_t − O[{c.t}, :]"), (NEW, "v"),
         lambda sh, r, c: _plain(r, "1 × d_v") + ", exactly 0", inputs=(O_T, O),
         relation=lambda ops, v, c: ops.sub(v(O_T), _row_t(ops, v(O), c)), when=_decoding, per_head=True,
         tex="o_t - O_{t,:}"),
    Kind(DECODE_COST, DECODE_COST, 15.8, "step_cost", "The cost of a decoding step", _decode_why(DECODE_COST),
         ("\\text{cost}", "cost(t) = (t·d_k, t·d_v, t²·d_k, t²·d_v)"), (STEPS, COSTS),
         lambda sh, r, c: _plain(r, "one row per decoding step t = 1..n: from the cache, then recomputed in full"),
         relation=lambda ops, v, c: ops.table(_decode_cost_rows(c)), when=_decoding, tex="\\text{cost}"),
)


KINDS: tuple[Kind, ...] = (
    # 1 the input
    Kind(X, X, 1, "input", _given_title("Query-side tokens", "Input tokens"),
         lambda c: _WHY["X_cross"] if c.cross else _WHY[X], ("X", "X"), (QUERIES, "d"),
         lambda sh, r, c: _plain(r, "n_q × d_model" if c.cross else "n × d_model"),
         source=lambda c: c.p.X, when=lambda c: c.projected),
    Kind(CONTEXT, CONTEXT, 2, "input", "Context tokens (the key and value side)", _WHY[CONTEXT], ("C", "C"),
         (KEYS, "d"), lambda sh, r, c: _plain(r, "n_k × d_model"), source=lambda c: c.p.context,
         when=lambda c: c.cross),
    # positional encodings, added to X before the projections
    Kind(PE, PE, 2.3, "positions",
         lambda c: "Sinusoidal positional encodings" if c.p.positions.kind == "sinusoidal" else "Learned positions",
         _pe_why, _pe_formula, (QUERIES, "d"), lambda sh, r, c: _plain(r, "n_q × d_model, one row per position"),
         relation=lambda ops, v, c: ops.given(c.p.positions.matrix),
         source=lambda c: c.p.positions.matrix if c.p.positions.kind == "learned" else None,
         when=lambda c: c.positions,
         mistakes=(Mistake("sin and cos swapped: the even columns 2i take the sine, the odd ones the cosine",
                           _pe_slip(swap=True)),
                   Mistake("positions counted from 1: the first token is at p = 0", _pe_slip(start=1)),
                   Mistake("exponent k/d with the column number k instead of 2i/d (the sine and cosine of a "
                           "pair share one frequency)", _pe_slip(pairs=False)))),
    Kind(X_POS, X_POS, 2.6, "positions", "Add the positions to the tokens",
         "Each token's row gets its position's row of ⟦PE⟧ added, entry by entry; the projections read ⟦X_{pos}⟧ "
         "instead of ⟦X⟧, so the same word at two positions gives two different queries, keys and values.",
         ("X_{pos} = X + PE", "X_pos = X + PE"), (QUERIES, "d"), lambda sh, r, c: _plain(r, "like X"),
         inputs=(X, PE), relation=lambda ops, v, c: ops.sum([v(X), v(PE)]), when=lambda c: c.positions,
         mistakes=(Mistake("the positions were not added: X_pos = X", lambda ops, ex, c: ex(X)),)),
    # 2 projections (weights first, as the JSON contract lists them)
    _weights_row(W_Q, 3, "Query weights"),
    _weights_row(W_K, 5, "Key weights"),
    _weights_row(W_V, 7, "Value weights"),
    _bias_row(B_Q, 3.5, "Query bias"),
    _bias_row(B_K, 5.5, "Key bias"),
    _bias_row(B_V, 7.5, "Value bias"),
    _projection_row(Q, 4, "Query projection"),
    _projection_row(K, 6, "Key projection"),
    _projection_row(V, 8, "Value projection"),
    # 3 to 8: one head, scores to output
    *_rope_rows(),
    Kind(K_T, K_T, 9, "transpose", "Transpose the keys", _k_t_why, _k_t_formula, ("k", KEYS),
         lambda sh, r, c: f"{r[1]}×{r[0]} → {r[0]}×{r[1]} (d_k × n_k)",
         inputs=("k_in",), relation=lambda ops, v, c: ops.T(v("k_in")), per_head=True, tex="K^{\\top}", slips=True),
    Kind(S, S, 10, "scores", "Scores", lambda c: _s_why(c) + _reads_note(c, K_T), _s_formula, (QUERIES, KEYS),
         lambda sh, r, c: _prod(sh("q_in"), sh(K_T), "n_q × n_k"),
         inputs=("q_in", K_T), relation=lambda ops, v, c: ops.matmul(v("q_in"), v(K_T)), per_head=True, slips=True,
         worked=_worked_score, shows=frozenset({"rope_relative"}),
         mistakes=(
             Mistake("K·Qᵀ instead of Q·Kᵀ (the scores are transposed)",
                     lambda ops, ex, c: ops.matmul(ex("k_in"), ops.T(ex("q_in")))),
             Mistake("Q·K instead of Q·Kᵀ (K was not transposed)",
                     lambda ops, ex, c: ops.matmul(ex("q_in"), ex("k_in")) if len(ex("q_in")[0]) == len(ex("k_in")) else None),
             *_ROPE_SCORE_MISTAKES,
         )),
    Kind(S_SCALED, S_SCALED, 11, "scale", "Scale the scores", _scale_why, _scale_formula, (QUERIES, KEYS),
         lambda sh, r, c: _plain(r, "n_q × n_k"),
         inputs=(S,), relation=lambda ops, v, c: ops.scale(v(S), c.factor), per_head=True,
         tex="\\frac{S}{\\sqrt{d_k}}",
         mistakes=(Mistake(_NO_SCALING, lambda ops, ex, c: ex(S)), Mistake(_BY_D_K, _by_d_k))),
    Kind(M, M, 12, "mask", "The mask", _mask_why,
         lambda c: ("M = M_{\\text{mask}} + B", "M = mask + bias") if c.p.bias is not None else ("M", "M"),
         (QUERIES, KEYS), lambda sh, r, c: _plain(r, "n_q × n_k"),
         relation=lambda ops, v, c: ops.mask(c.p.mask.allowed, c.p.bias), per_head=True,
         shows=frozenset({"mask_parts"})),
    Kind(S_MASKED, S_MASKED, 13, "mask", "Add the mask", _WHY[S_MASKED], _masked_formula, (QUERIES, KEYS),
         lambda sh, r, c: _plain(r, "n_q × n_k"),
         inputs=(S_SCALED, M), relation=lambda ops, v, c: ops.add_mask(v(S_SCALED), v(M)), per_head=True,
         tex="\\hat{S}",
         mistakes=(Mistake(_MASK_MISSING, lambda ops, ex, c: ex(S_SCALED)),
                   Mistake(_NO_SCALING, lambda ops, ex, c: ops.add_mask(ex(S), ex(M))),
                   Mistake(_BY_D_K, lambda ops, ex, c: ops.add_mask(_by_d_k(ops, ex, c), ex(M))))),
    Kind(A, A, 14, "softmax", "Softmax on each row", _WHY[A],
         ("A = \\operatorname{softmax}(\\hat{S})",
          "A[i,j] = exp(Ŝ[i,j] − m_i) / Z_i,  m_i = max_k Ŝ[i,k],  Z_i = Σ_k exp(Ŝ[i,k] − m_i)"),
         (QUERIES, KEYS), lambda sh, r, c: f"{r[0]}×{r[1]} (n_q × n_k), each row sums to 1",
         inputs=(S_MASKED,), relation=lambda ops, v, c: ops.softmax(v(S_MASKED)), per_head=True,
         shows=frozenset({"softmax"}), mistakes=_score_variants(A),
         note=lambda value: _WHY["A_max"] if all(r.is_max for r in value.rows) else _WHY["A_symbolic"]),
    Kind(O, O, 15, "output", "Weighted sum of the values", lambda c: _WHY[O] + _reads_note(c, V), ("O = A\\,V", "O = A·V"), (QUERIES, "v"),
         lambda sh, r, c: f"({sh(A)[0]}×{sh(A)[1]})·({sh(V)[0]}×{sh(V)[1]}) → {r[0]}×{r[1]} (n_q × d_v)",
         inputs=(A, V), relation=lambda ops, v, c: ops.matmul(v(A), v(V)), per_head=True,
         shows=frozenset({"weighted_sum"}),
         mistakes=_score_variants(O) + (
             Mistake("Aᵀ·V instead of A·V (the weights were transposed)",
                     lambda ops, ex, c: ops.matmul(ops.T(ex(A)), ex(V)) if _sq(ex(A)) else None),
             _transposed(O),
             *_ROPE_O_MISTAKES,
         )),
    # FlashAttention's online softmax: the same weighted sum in one pass over blocks of keys
    Kind(M_TILED, M_TILED, 15.02, "tiled", "Running maximum, block by block",
         lambda c: _WHY[M_TILED].format(B=c.p.tiling.block),
         ("m^{(b)} = \\max\\bigl(m^{(b-1)},\\ \\max_{j \\in b} \\hat{S}_{ij}\\bigr)",
          "m(b) = max(m(b−1), max_{j in block b} Ŝ[i,j]),  m(0) = −∞"),
         (QUERIES, "b"), lambda sh, r, c: _plain(r, "n_q × blocks"),
         inputs=(S_MASKED,), relation=lambda ops, v, c: ops.tiled_max(v(S_MASKED), c.p.tiling.block),
         when=_tiled, per_head=True, tex="m",
         mistakes=(Mistake(_BLOCK_MAX, lambda ops, ex, c: ops.tiled_max(ex(S_MASKED), c.p.tiling.block, running=False)),)),
    Kind(L_TILED, L_TILED, 15.04, "tiled", "Running sum, rescaled at each new maximum", _WHY[L_TILED].format(),
         ("\\ell^{(b)} = e^{m^{(b-1)} - m^{(b)}}\\,\\ell^{(b-1)} + \\sum_{j \\in b} e^{\\hat{S}_{ij} - m^{(b)}}",
          "ℓ(b) = exp(m(b−1) − m(b))·ℓ(b−1) + Σ_{j in block b} exp(Ŝ[i,j] − m(b)),  ℓ(0) = 0"),
         (QUERIES, "b"), lambda sh, r, c: _plain(r, "n_q × blocks") + "; the last column is Z_i",
         inputs=(S_MASKED, M_TILED),
         relation=lambda ops, v, c: ops.tiled_sums(v(S_MASKED), v(M_TILED), c.p.tiling.block),
         when=_tiled, per_head=True, tex="\\ell", shows=frozenset({"exp_sums"}),
         mistakes=(Mistake(_NO_RESCALE, lambda ops, ex, c: ops.tiled_sums(ex(S_MASKED), ex(M_TILED), c.p.tiling.block,
                                                                      rescale=False)),)),
    Kind(ACC_TILED, ACC_TILED, 15.06, "tiled", "Accumulator after the last block", _WHY[ACC_TILED].format(),
         ("\\mathrm{acc}^{(b)} = e^{m^{(b-1)} - m^{(b)}}\\,\\mathrm{acc}^{(b-1)} + \\sum_{j \\in b} e^{\\hat{S}_{ij} - m^{(b)}}\\, v_j",
          "acc(b) = exp(m(b−1) − m(b))·acc(b−1) + Σ_{j in block b} exp(Ŝ[i,j] − m(b))·v_j,  acc(0) = 0"),
         (QUERIES, "v"), lambda sh, r, c: _plain(r, "n_q × d_v") + "; the accumulator after the last block",
         inputs=(S_MASKED, M_TILED, V),
         relation=lambda ops, v, c: ops.tiled_acc(v(S_MASKED), v(M_TILED), v(V), c.p.tiling.block),
         when=_tiled, per_head=True, tex="\\mathrm{acc}", shows=frozenset({"exp_sums"}),
         mistakes=(Mistake(_NO_RESCALE, lambda ops, ex, c: ops.tiled_acc(ex(S_MASKED), ex(M_TILED), ex(V), c.p.tiling.block,
                                                                      rescale=False)),)),
    Kind(O_TILED, O_TILED, 15.08, "tiled", "Output of the tiled pass", _WHY[O_TILED].format(),
         ("O^{\\text{tiled}}_i = \\mathrm{acc}_i^{(N)} / \\ell_i^{(N)}", "O_tiled[i] = acc(N)[i] / ℓ(N)[i]"),
         (QUERIES, "v"), lambda sh, r, c: _plain(r, "n_q × d_v") + "; equal to O",
         inputs=(ACC_TILED, L_TILED), relation=lambda ops, v, c: ops.tiled_output(v(ACC_TILED), v(L_TILED)),
         when=_tiled, per_head=True, tex="O^{\\text{tiled}}", shows=frozenset({"tiles", "exp_sums"}),
         mistakes=(Mistake(_NO_RESCALE, _output_without_rescale),
                   Mistake("the accumulator was not divided by the running sum ℓ at the end",
                           lambda ops, ex, c: ex(ACC_TILED)))),
    # decoding one token from the KV cache
    *_DECODE_KINDS,
    # several heads: concatenate, then project
    Kind(CONCAT, CONCAT, 16, "concat", "Concatenate the heads", _WHY[CONCAT],
         lambda c: ("\\operatorname{concat} = \\begin{bmatrix} "
                    + " & ".join(_few(c.heads, lambda h: f"O^{{({h})}}", "\\cdots")) + " \\end{bmatrix}",
                    "concat = [" + " | ".join(_few(c.heads, lambda h: stage_id(O, h), "…")) + "]"),
         (QUERIES, "c"),
         lambda sh, r, c: f"{c.p.n_q}×({' + '.join(_few(c.heads, lambda h: str(sh(O, h)[1]), '…'))}) = {r[0]}×{r[1]} (n_q × h·d_v)",
         inputs=("heads",), relation=lambda ops, v, c: ops.hstack([v(O, h) for h in c.heads]),
         when=lambda c: c.multi, tex="\\operatorname{concat}", by_relation=True,
         shows=frozenset({"heads_sum"}), mistakes=(_transposed(CONCAT),)),
    Kind(W_O, W_O, 17, "projection", "Output weights", _WHY[W_O], ("W_{O}", "W_O"), ("c", "o"),
         lambda sh, r, c: _plain(r, "h·d_v × d_out"), source=lambda c: c.p.W_O, when=lambda c: c.multi,
         labelled=False),
    _bias_row(B_O, 17.5, "Output bias"),
    Kind(O_FINAL, O, 18, "projection", "Output projection",
         lambda c: _WHY[O_FINAL] + (_WHY["bias_added"].format(L="O") if c.has_bias(B_O) else ""),
         lambda c: (("O = \\operatorname{concat}\\,W_O + b_O", "O = concat·W_O + b_O") if c.has_bias(B_O)
                    else ("O = \\operatorname{concat}\\,W_O", "O = concat·W_O")), (QUERIES, "o"),
         lambda sh, r, c: _prod(sh(CONCAT), sh(W_O), "n_q × d_out")
         + (f", plus b_O (1×{sh(B_O)[1]}) on every row" if c.has_bias(B_O) else ""),
         inputs=(CONCAT, W_O, B_O), relation=_output_projection,
         when=lambda c: c.multi, by_relation=True, shows=frozenset({"heads_sum"}),
         mistakes=(_transposed(O_FINAL),
                   Mistake("the bias b_O was not added: O = concat·W_O alone",
                           lambda ops, ex, c: ops.matmul(ex(CONCAT), ex(W_O)) if c.has_bias(B_O) else None))),
    # the backward pass: the upstream gradient, then back through the output projection
    Kind(DO, DO, 19, "b_upstream", "The upstream gradient",
         lambda c: _WHY[DO] + " Here " + c.loss.describe() + ".", _dO_formula,
         lambda c: (QUERIES, "o" if c.multi else "v"), lambda sh, r, c: _plain(r, "like O"),
         inputs=("output",), relation=_dO_relation, when=lambda c: c.loss is not None, gradient=True,
         short=lambda ops, value, c: c.loss.kind != "target"),
    Kind(DW_O, DW_O, 20, "b_projection", "Gradient of the output weights", _WHY[DW_O],
         ("dW_O = \\operatorname{concat}^{\\top} dO", "dW_O = concatᵀ·dO"), ("c", "o"),
         lambda sh, r, c: _prod(_t(sh(CONCAT)), sh(DO), "like W_O"),
         inputs=(CONCAT, DO), relation=lambda ops, v, c: ops.matmul(ops.T(v(CONCAT)), v(DO)),
         when=lambda c: c.multi and c.loss is not None, gradient=True, labelled=False,
         mistakes=(_transposed(DW_O, square_only=True),)),
    _bias_gradient(DB_O, 20.5),
    Kind(DCONCAT, DCONCAT, 21, "b_projection", "Gradient of the concatenation", _WHY[DCONCAT],
         ("d\\operatorname{concat} = dO\\,W_O^{\\top}", "dconcat = dO·W_Oᵀ"), (QUERIES, "c"),
         lambda sh, r, c: _prod(sh(DO), _t(sh(W_O)), "like concat"),
         inputs=(DO, W_O), relation=lambda ops, v, c: ops.matmul(v(DO), ops.T(v(W_O))),
         when=lambda c: c.multi and c.loss is not None, gradient=True, tex="d\\operatorname{concat}",
         mistakes=(_transposed(DCONCAT, square_only=True),)),
    # each head, backwards
    Kind(DO_HEAD, DO, 19, "b_head", "This head's upstream gradient", _WHY[DO_HEAD], _dO_head_formula,
         (QUERIES, "v"), lambda sh, r, c: _plain(r, "like this head's O"),
         inputs=(DCONCAT,), relation=lambda ops, v, c: ops.block(v(DCONCAT), *_head_block(c)),
         when=lambda c: c.multi and c.loss is not None, per_head="shares", gradient=True),
    Kind(DV, DV, 22, "b_weighted_sum", "Gradient of the values", _WHY[DV], ("dV = A^{\\top} dO", "dV = Aᵀ·dO"),
         (KEYS, "v"), lambda sh, r, c: _prod(_t(sh(A)), sh(DO), "like V"),
         inputs=(A, DO), relation=lambda ops, v, c: ops.matmul(ops.T(v(A)), v(DO)),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(_square_product("A·dO instead of Aᵀ·dO (the weights were not transposed)",
                                   lambda ops, ex: ex(A), lambda ops, ex: ex(DO), lambda ex: _sq(ex(A))),
                   _transposed(DV, square_only=True))),
    Kind(DA, DA, 23, "b_weighted_sum", "Gradient of the weights", _WHY[DA], ("dA = dO\\,V^{\\top}", "dA = dO·Vᵀ"),
         (QUERIES, KEYS), lambda sh, r, c: _prod(sh(DO), _t(sh(V)), "like A"),
         inputs=(DO, V), relation=lambda ops, v, c: ops.matmul(v(DO), ops.T(v(V))),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         short=lambda ops, value, c: ops.is_rational(value),
         mistakes=(_square_product("dO·V instead of dO·Vᵀ (V was not transposed)",
                                   lambda ops, ex: ex(DO), lambda ops, ex: ex(V),
                                   lambda ex: len(ex(V)) == len(ex(DO)[0]) and len(ex(V)[0]) == len(ex(DO))),
                   _transposed(DA, square_only=True))),
    Kind(DS_MASKED, DS_MASKED, 24, "b_softmax", "Back through the softmax", _WHY[DS_MASKED],
         ("d\\hat{S}_{ij} = a_{ij}\\Big(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\Big)",
          "dŜ[i,j] = a_ij·(dA[i,j] − Σ_k a_ik·dA[i,k])"),
         (QUERIES, KEYS), lambda sh, r, c: _plain(r, "like Ŝ") + "; each row sums to 0",
         inputs=(A, DA), relation=lambda ops, v, c: ops.softmax_backward(v(A), v(DA)),
         when=lambda c: c.loss is not None, per_head=True, gradient=True, tex="d\\hat{S}",
         shows=frozenset({"jacobian"}),
         mistakes=(Mistake("Jacobian diagonal only: a_ij(1 − a_ij)·dA_ij drops the off-diagonal terms −a_ij·a_ik "
                           "(each weight also depends on the other scores of its row)",
                           lambda ops, ex, c: ops.jacobian_diagonal(ex(A), ex(DA))),
                   _transposed(DS_MASKED, square_only=True))),
    Kind(DS, DS, 25, "b_scaling", "Back through the scaling",
         lambda c: _WHY["dS_none"] if c.p.scale == "none" else _WHY[DS], _dS_formula,
         (QUERIES, KEYS), lambda sh, r, c: _plain(r, "like S"),
         inputs=(DS_MASKED,), relation=lambda ops, v, c: ops.scale(v(DS_MASKED), c.factor),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(Mistake("the scale factor is missing: dS = dŜ, but the scores were scaled before the softmax",
                           lambda ops, ex, c: ex(DS_MASKED)),
                   _transposed(DS, square_only=True))),
    Kind(DQ, DQ, 26, "b_qk", "Gradient of the queries", _WHY[DQ], ("dQ = dS\\,K", "dQ = dS·K"), (QUERIES, "q"),
         lambda sh, r, c: _prod(sh(DS), sh(K), "like Q"),
         inputs=(DS, K), relation=lambda ops, v, c: ops.matmul(v(DS), v(K)),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(Mistake(_SCALE_MISSING_DQDK, lambda ops, ex, c: ops.matmul(ex(DS_MASKED), ex(K))),
                   _square_product("dSᵀ·K instead of dS·K (dS was transposed)",
                                   lambda ops, ex: ops.T(ex(DS)), lambda ops, ex: ex(K), lambda ex: _sq(ex(DS))),
                   _transposed(DQ, square_only=True))),
    Kind(DK, DK, 27, "b_qk", "Gradient of the keys", _WHY[DK], ("dK = dS^{\\top} Q", "dK = dSᵀ·Q"), (KEYS, "k"),
         lambda sh, r, c: _prod(_t(sh(DS)), sh(Q), "like K"),
         inputs=(DS, Q), relation=lambda ops, v, c: ops.matmul(ops.T(v(DS)), v(Q)),
         when=lambda c: c.loss is not None, per_head=True, gradient=True,
         mistakes=(Mistake(_SCALE_MISSING_DQDK, lambda ops, ex, c: ops.matmul(ops.T(ex(DS_MASKED)), ex(Q))),
                   _square_product("dS·Q instead of dSᵀ·Q (dS was not transposed)",
                                   lambda ops, ex: ex(DS), lambda ops, ex: ex(Q), lambda ex: _sq(ex(DS))),
                   _transposed(DK, square_only=True))),
    _weight_gradient(DW_Q, 28, "query"),
    _weight_gradient(DW_K, 29, "key"),
    _weight_gradient(DW_V, 30, "value"),
    _bias_gradient(DB_Q, 30.2),
    _bias_gradient(DB_K, 30.4),
    _bias_gradient(DB_V, 30.6),
    # back to the input
    Kind(DX, DX, 31, "b_input", "Gradient of the input", _dX_why, _dX_formula, (QUERIES, "d"),
         lambda sh, r, c: _plain(r, "like X"), inputs=("paths",), relation=_input_gradient(DX),
         when=lambda c: c.projected and c.loss is not None, gradient=True,
         mistakes=(_transposed(DX, square_only=True),)),
    Kind(DCONTEXT, DCONTEXT, 32, "b_input", "Gradient of the context",
         lambda c: _WHY[DCONTEXT] + (_WHY["dX_heads"] if c.multi else ""), _dcontext_formula, (KEYS, "d"),
         lambda sh, r, c: _plain(r, "like the context"), inputs=("paths",), relation=_input_gradient(DCONTEXT),
         when=lambda c: c.projected and c.cross and c.loss is not None, gradient=True, tex="dC"),
)

BY_KEY: dict[str, Kind] = {k.key: k for k in KINDS}

# Which entries of its inputs make an entry (i, j) of a stage: ``row`` (row i of the input),
# ``col`` (column j), ``row_j`` (row j: the input is transposed in the product, as V in
# dA = dO Vᵀ), ``col_i`` (column i: as A in dV = Aᵀ dO), ``entry`` (entry (i, j)) or ``T``
# (entry (j, i)). The web page highlights them when a reader points at the entry. Input keys as
# in ``Kind.inputs``.
TRACES: dict[str, tuple[tuple[str, str], ...]] = {
    PE: (),
    X_POS: ((X, "entry"), (PE, "entry")),
    Q: (("xq", "row"), (W_Q, "col"), (B_Q, "col")),
    K: (("kv", "row"), (W_K, "col"), (B_K, "col")),
    V: (("kv", "row"), (W_V, "col"), (B_V, "col")),
    Q_ROT: ((Q, "row"),),
    K_ROT: ((K, "row"),),
    K_T: (("k_in", "T"),),
    S: (("q_in", "row"), (K_T, "col")),
    S_SCALED: ((S, "entry"),),
    S_MASKED: ((S_SCALED, "entry"), (M, "entry")),
    A: ((S_MASKED, "row"),),
    O: ((A, "row"), (V, "col")),
    M_TILED: ((S_MASKED, "row"),),
    L_TILED: ((S_MASKED, "row"), (M_TILED, "row")),
    ACC_TILED: ((S_MASKED, "row"), (M_TILED, "row"), (V, "col")),
    O_TILED: ((ACC_TILED, "entry"), (L_TILED, "row")),
    O_FINAL: ((CONCAT, "row"), (W_O, "col"), (B_O, "col")),
    DB_O: ((DO, "col"),),
    DB_Q: ((DQ, "col"),),
    DB_K: ((DK, "col"),),
    DB_V: ((DV, "col"),),
    DV: ((A, "col_i"), (DO, "col")),
    DA: ((DO, "row"), (V, "row_j")),
    DS_MASKED: ((A, "row"), (DA, "row")),
    DS: ((DS_MASKED, "entry"),),
    DQ: ((DS, "row"), (K, "col")),
    DK: ((DS, "col_i"), (Q, "col")),
    DW_Q: (("xq", "col_i"), (DQ, "col")),
    DW_K: (("kv", "col_i"), (DK, "col")),
    DW_V: (("kv", "col_i"), (DV, "col")),
    K_CACHE: (("k_in", "entry"),),
    V_CACHE: ((V, "entry"),),
    A_T: ((S_T, "row"),),
    O_T: ((A_T, "row"), (V_CACHE, "col")),
    O_T_DIFF: ((O_T, "entry"),),
}


def traces(kind: Kind, c: Context) -> list[tuple[str, str]]:
    """``(stage id, how)`` for each input entry that makes an entry of ``kind`` (see TRACES);
    empty when the stage is given."""
    if kind.is_given(c):
        return []
    return [(i, how) for key, how in TRACES.get(kind.key, ()) for i in resolve(key, c)]

# The numbered steps of a worked solution, in order.
SECTIONS: tuple[Section, ...] = (
    Section("given", "The input: queries, keys and values given", applies=lambda c: not c.projected),
    Section("input", "The input", applies=lambda c: c.projected),
    Section("positions", "Add the positions", applies=lambda c: c.positions),
    Section("project", "Project to queries, keys and values", per_head=True, applies=lambda c: c.projected,
            retitle=lambda c: (f"Project to queries (K/V of group {c.p.kv_group(c.head)} above)"
                               if c.reads(K, c.head) != c.head else None)),
    Section("rotate", "Rotate the queries and keys (RoPE)", per_head=True, applies=lambda c: c.rope is not None),
    Section("transpose", "Transpose the keys", per_head=True),
    Section("scores", "Score every query against every key", per_head=True),
    Section("scale", "Scale the scores", per_head=True),
    Section("mask", "Apply the mask", per_head=True),
    Section("softmax", "Softmax on each row", per_head=True),
    Section("output", "Weighted sum of the values", per_head=True),
    Section("tiled", "The same output in one pass: FlashAttention's online softmax", per_head=True,
            applies=lambda c: _tiled(c)),
    Section("decode", "Decode the new token from the KV cache", per_head=True, applies=lambda c: c.t is not None),
    Section("step_cost", "The cost of a decoding step", applies=lambda c: c.t is not None),
    Section("concat", "Concatenate the heads", applies=lambda c: c.multi),
    Section("projection", "Output projection", applies=lambda c: c.multi),
    Section("b_upstream", "Backward: the upstream gradient", backward=True),
    Section("b_projection", "Back through the output projection", backward=True, applies=lambda c: c.multi),
    Section("b_head", "This head's upstream gradient", backward=True, per_head=True, applies=lambda c: c.multi),
    Section("b_weighted_sum", "Back through the weighted sum", backward=True, per_head=True),
    Section("b_softmax", "Back through the softmax", backward=True, per_head=True),
    Section("b_scaling", "Back through the scaling", backward=True, per_head=True),
    Section("b_qk", "Back to the queries and keys", backward=True, per_head=True),
    Section("b_weights", "Back to the projection weights", backward=True, per_head=True),
    Section("b_input", "Back to the input", backward=True),
)


# -- a problem's stages -------------------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    """One stage of a problem: its row, its head and its id."""

    kind: Kind
    head: int | None
    id: str
    c: Context


def _per_head_blocks(items: list, per_head: Callable, heads: list) -> Iterator[tuple[Any, int | None]]:
    """``items`` in order, each run of per-head items (the same truthy ``per_head``) repeated for
    every head in turn."""
    k = 0
    while k < len(items):
        if not per_head(items[k]):
            yield items[k], None
            k += 1
            continue
        end = k
        while end < len(items) and per_head(items[end]) == per_head(items[k]):
            end += 1
        for h in heads:
            for item in items[k:end]:
                yield item, h
        k = end


def plan(problem) -> list[Planned]:
    """The stages of ``problem`` in the order they are derived (the JSON contract's order)."""
    c = Context(problem)
    out = []
    for kind, h in _per_head_blocks([k for k in KINDS if k.when(c)], lambda k: k.per_head, c.heads):
        if c.reads(kind.key, h) != h:
            continue  # a grouped head reads its group's keys and values: shown once, with the group's first head
        out.append(Planned(kind, h, stage_id(kind.name, h), c.at(h)))
    return out


def sections(problem) -> list[tuple[Section, int, int | None]]:
    """The numbered steps of the worked solution: (section, number, head), in order.

    Forward steps are numbered 1, 2, ... over the steps this problem has (with several heads
    each head repeats its numbers); the backward steps continue after the last forward one.
    """
    c = Context(problem)
    forward = [s for s in SECTIONS if not s.backward and s.applies(c)]
    backward = [s for s in SECTIONS if s.backward and s.applies(c)]
    number = {s.key: n for n, s in enumerate(forward, 1)}
    number.update({s.key: len(forward) + n for n, s in enumerate(backward, 1)})
    multi = c.heads if c.multi else [None]
    return [(s, number[s.key], h) for s, h in _per_head_blocks(forward + backward, lambda s: s.per_head and c.multi, multi)]


def section_of(kind: Kind, c: Context) -> str:
    return kind.section(c) if callable(kind.section) else kind.section


def resolve(key: str, c: Context, head: "int | None | object" = ...) -> list[str]:
    """The stage ids an input key stands for in context ``c`` (another head's with ``head``)."""
    if key == "kv":
        key = c.kv
    if key in ("q_in", "k_in"):  # what the scores read: the rotated queries and keys under RoPE
        key = {"q_in": Q_ROT, "k_in": K_ROT}[key] if c.rope is not None else {"q_in": Q, "k_in": K}[key]
    if key == "xq":
        key = c.xq
    if key == "output":
        key = c.output
    if key == "heads":
        return [stage_id(O, h) for h in c.heads]
    if key in (B_Q, B_K, B_V, B_O) and not c.has_bias(key):
        return []  # no bias: the projection is the product alone
    h = c.head if head is ... else head
    if key == DO and c.multi and h is not None:
        key = DO_HEAD  # inside a head, the upstream gradient is the head's share of it
    kind = BY_KEY[key]
    return [stage_id(kind.name, c.reads(key, h) if kind.per_head and c.multi else None)]


def input_ids(kind: Kind, c: Context) -> list[str]:
    """The ids of the stages ``kind`` is computed from, in context ``c``."""
    if "paths" in kind.inputs:
        return [i for g, w, h in _input_paths(c, kind.key) for i in resolve(g, c, h) + resolve(w, c, h)]
    return [i for key in kind.inputs for i in resolve(key, c)]


# -- names users write ----------------------------------------------------------------------

# The stage names --from, --to and --ask take, in the order of the formula (with heads they
# apply to every head).
NAMES: tuple[str, ...] = tuple(dict.fromkeys(k.name for k in sorted(KINDS, key=lambda k: k.order)))
GRADIENT_NAMES = frozenset(k.name for k in KINDS if k.gradient)
TILED_NAMES = frozenset((M_TILED, L_TILED, ACC_TILED, O_TILED))  # the online softmax's, with tiling: only


def order_of(name: str, problem=None) -> int:
    """The place of stage ``name`` in the formula; with several heads ``O`` is the projected output."""
    if name == O and problem is not None and problem.multi_head:
        return BY_KEY[O_FINAL].order
    return min(k.order for k in KINDS if k.name == name)


def unknown_stage(word: str, choices) -> str:
    """The message for a stage name that is not one of ``choices``."""
    return f"{word!r} is not a stage{did_you_mean(word, choices)}; the stages are {', '.join(choices)}"


__all__ = [
    "A", "ACC_TILED", "BIASES", "B_K", "B_O", "B_Q", "B_V", "DB_K", "DB_O", "DB_Q", "DB_V", "A_T", "BY_KEY", "CACHED", "COSTS", "STEPS", "COST_COLUMNS", "DECODE_COST", "K_CACHE", "NEW",
    "O_T", "O_T_DIFF", "Q_T", "SHARED_KV", "S_T", "TOKEN_AXES", "V_CACHE", "kv_cache_size", "kv_groups",
    "CONCAT", "K_ROT", "PE", "Q_ROT", "X_POS", "CONTEXT", "Context", "DA", "DCONCAT", "DCONTEXT", "DK", "DO", "DO_HEAD", "DQ", "DS",
    "DS_MASKED", "DV", "DW_K", "DW_O", "DW_Q", "DW_V", "DX", "Dot", "GRADIENT_NAMES", "K", "KINDS", "K_T", "Kind",
    "L_TILED", "M", "M_TILED", "Mistake", "NAMES", "O", "O_FINAL", "O_TILED", "Planned", "Q", "S", "SECTIONS", "S_MASKED", "S_SCALED", "Section", "V",
    "W_K", "W_O", "W_Q", "W_V", "X", "did_you_mean", "input_ids", "order_of", "plan", "resolve", "section_of",
    "sections", "split_id", "stage_id", "TILED_NAMES", "unknown_stage",
]
