"""What a row of the registry is made of.

:class:`Kind` is one stage kind (a row); its relation is a :data:`Relation` that reads its inputs
through ``v(key)`` and the problem's constants through a :class:`Context`. A :class:`Mistake` is a
relation too, run on the exact values; a :class:`Dot` is one entry worked out as a dot product; a
:class:`Section` is a numbered step of the worked solution. ``tiled`` and ``decoding`` say when
the rows of the tiled pass and of the decoding step apply.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from .ids import (
    B_O, CONTEXT, H, H_NORM, H_POST, O, O_FINAL, SHARED_KV, X, X_EMB, X_NORM, X_POS, Y, Y_FINAL, Y_LAST, Y_POST,
)


@dataclass(frozen=True)
class Context:
    """The problem's constants as one stage sees them: the problem, the head (1-based, or None
    for a single head and for the whole layer) and that head's sizes and scale factor."""

    p: Any  # symattn.problem.model.Problem
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
    def norm(self):
        """The problem's layer norm (a :class:`symattn.problem.model.Norm`), or None."""
        return getattr(self.p, "norm", None)

    @property
    def emb_norm(self):
        """The embeddings' own norm (BERT's ``embeddings.LayerNorm``), whose output is the layer's
        input, or None."""
        return getattr(self.p, "embeddings_norm", None)

    @property
    def token_types(self) -> bool:
        """BERT's token-type embeddings are added with the positions."""
        return getattr(self.p, "token_types", None) is not None

    @property
    def embedded(self) -> str:
        """The key of the embedding rows with what the model adds to them: X, or X_pos."""
        return X_POS if self.positions else X

    @property
    def pre_norm(self) -> bool:
        """The attention reads the normalised X (a norm in front: GPT-2, LLaMA)."""
        return self.norm is not None and not self.norm.post

    @property
    def residual(self) -> bool:
        """The residual stream H = X + O is derived (always with a post norm)."""
        return bool(getattr(self.p, "residual", False))

    @property
    def mlp(self):
        """The MLP behind the attention (a :class:`symattn.problem.model.Mlp`), or None."""
        return getattr(self.p, "mlp", None)

    @property
    def logits(self):
        """The model's head: the final norm and the unembedding (a :class:`symattn.problem.model.Logits`), or None."""
        return getattr(self.p, "logits", None)

    @property
    def ce(self):
        """The cross-entropy loss of the logits (a :class:`symattn.problem.model.Loss`), or None."""
        return getattr(self.p, "loss", None)

    @property
    def stream(self) -> str:
        """The key of the residual stream after the attention: H (behind a post norm, its output)."""
        return H_POST if self.norm is not None and self.norm.post else H

    @property
    def mlp_in(self) -> str:
        """The key of what the MLP reads: its norm of the stream, or the stream itself."""
        return H_NORM if self.mlp is not None and self.mlp.norm is not None and not self.mlp.post else self.stream

    @property
    def top(self) -> str:
        """The key of the block's output: Y (behind the MLP's post norm, its output), or H without an MLP."""
        if self.mlp is None:
            return self.stream
        return Y_POST if self.mlp.post else Y

    @property
    def final_in(self) -> str:
        """The key of the rows the model's head reads: the block's output, or its last row (rows: last)."""
        return Y_LAST if self.logits is not None and self.logits.last else self.top

    @property
    def unembedded(self) -> str:
        """The key of what the unembedding multiplies: the final norm's output, or its input."""
        return Y_FINAL if self.logits is not None and self.logits.norm is not None else self.final_in

    @property
    def block(self) -> str:
        """The key of the block's input: X, X with its positions added, or the embeddings' norm of
        it (the layer's norm's input and the residual's base)."""
        return X_EMB if self.emb_norm is not None else self.embedded

    @property
    def xq(self) -> str:
        """The key of what the queries are made from: X, X with its positions added, or its norm."""
        return X_NORM if self.pre_norm else self.block

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
        return "X_{norm}" if self.pre_norm else self.block_name

    @property
    def block_name(self) -> str:
        """The block's input, in LaTeX."""
        return "X_{emb}" if self.emb_norm is not None else "X_{pos}" if self.positions else "X"

    def plain(self, name: str) -> str:
        """A name of :attr:`xq_name`/:attr:`kv_name` in plain text."""
        return re.sub(r"_\{(\w+)\}", r"_\1", name)

    @property
    def heads(self) -> list[int | None]:
        """The head numbers of the problem: 1..h with several heads, else [None]."""
        return list(range(1, len(self.p.heads) + 1)) if self.multi else [None]

    @property
    def weights(self):
        """This head's weights (a :class:`symattn.problem.model.Head`), or None when Q, K, V are given."""
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
        if self.multi:
            return O_FINAL
        return "O_subln" if getattr(self.differential, "paper", None) is not None else O

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
    def sink(self):
        """This query head's learned sink logit (an exact number), or None without sinks."""
        sinks = self.p.sinks
        return None if sinks is None else sinks[(self.head or 1) - 1]

    @property
    def linear(self) -> str | None:
        """Linear attention's feature map (relu, elu1, identity), or None for the softmax."""
        lin = getattr(self.p, "linear", None)
        return lin.feature if lin is not None else None

    @property
    def differential(self):
        """Differential attention's section (a :class:`symattn.problem.model.Differential`), or None."""
        return getattr(self.p, "differential", None)

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

    @property
    def group_heads(self) -> list[int | None]:
        """The query heads that read this head's keys and values: its K/V group's (grouped-query
        attention), else this head alone."""
        if not self.grouped or self.head is None:
            return [self.head]
        size = len(self.p.heads) // self.p.kv_heads
        first = self.p.kv_leader(self.head)
        return list(range(first, first + size))

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
    terms: Any  # the pairs (a_k, b_k), a sequence (worked.Pairs reads each when asked for)
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


# -- when a row applies ----------------------------------------------------------------------


def tiled(c: Context) -> bool:
    """The problem asks for FlashAttention's online softmax (``tiling:``)."""
    return getattr(c.p, "tiling", None) is not None


def softmax_attention(c: Context) -> bool:
    """The attention is the softmax's (not linear attention)."""
    return c.linear is None


def decoding(c: Context) -> bool:
    """The problem decodes one token from the KV cache (``decode: t``)."""
    return c.t is not None
