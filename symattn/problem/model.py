"""The data model: a validated problem (:class:`Problem`) and its parts, every matrix entry an
exact SymPy number. Problems are frozen; :mod:`symattn.problem.passes` makes changed copies."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy

from .masks import Mask
from .rope import Rope

BIAS_NAMES = ("b_Q", "b_K", "b_V")  # a head's projection biases (b_O is the layer's)

Matrix = sympy.ImmutableMatrix

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


NORM_KINDS = ("layernorm", "rmsnorm")
# the backward pass is not derived through the embeddings' norm: the refusal, in the file and for --backward
NO_EMBEDDINGS_BACKWARD = ("the backward pass through the embeddings' norm is not derived: give X as the layer's input "
                          "(X_emb, the embeddings' norm's output) to go back to it, or leave out backward")


@dataclass(frozen=True)
class Norm:
    """A layer normalisation over each token's features (one row of X at a time).

    ``kind`` is ``layernorm``, (x − μ)/√(σ² + ε)·γ + β with the biased variance σ², or
    ``rmsnorm``, x/√(mean(x²) + ε)·γ. ``weight`` (γ) and ``bias`` (β) are 1 × d rows, None for
    1 and 0; ``offset`` 1 multiplies by (1 + γ) instead (Gemma). ``eps`` is exact. ``place`` is
    ``pre`` (the attention reads the normalised X) or ``post`` (the norm of X + the attention's
    output, BERT's order; the residual is implied).
    """

    kind: str
    eps: sympy.Expr
    weight: Matrix | None = None
    bias: Matrix | None = None
    offset: int = 0
    place: str = "pre"

    @property
    def rms(self) -> bool:
        return self.kind == "rmsnorm"

    @property
    def post(self) -> bool:
        return self.place == "post"

    @property
    def largest_gain(self) -> sympy.Expr:
        """max_k |γ_k| (of 1 + γ with the offset; 1 without a weight): how far γ can stretch a row."""
        g = self.gain
        return sympy.Integer(1) if g is None else max(abs(g[0, j]) for j in range(g.cols))

    @property
    def gain(self) -> Matrix | None:
        """The row each normalised row is multiplied by, entry by entry: γ, or offset + γ (None: 1)."""
        if self.weight is None or not self.offset:
            return self.weight
        return Matrix(1, self.weight.cols, lambda i, j: self.offset + self.weight[0, j])


# the MLP's activations: ReLU, its square, GELU with erf (exact) or with tanh (GPT-2's), SiLU (x·σ(x))
ACTIVATIONS = ("relu", "relu2", "gelu", "gelu-tanh", "silu")
GATED_ACTIVATIONS = ("silu", "gelu-tanh", "gelu")  # SwiGLU, GeGLU (tanh or erf)
# the backward pass through the MLP and the model's head starts from the cross-entropy of the logits
CROSS_ENTROPY = "cross-entropy"
NO_BLOCK_BACKWARD = ("the backward pass through the MLP and the model's head starts from the cross-entropy of the "
                     "logits: give logits: and loss: {targets: [...]}, and backward: {loss: cross-entropy}")


def block_backward_refusal(backward: "Backward", mlp, logits, loss) -> str | None:
    """Why a backward pass cannot start where ``backward`` says, given the problem's MLP, logits
    and loss (None: it can): through the MLP and the head only from the cross-entropy, and the
    cross-entropy only with a loss."""
    if backward.kind == CROSS_ENTROPY:
        return None if loss is not None else ("loss: cross-entropy needs the problem's cross-entropy: give logits: "
                                              "and loss: {targets: [...]}")
    if mlp is not None or logits is not None:
        return NO_BLOCK_BACKWARD
    return None


@dataclass(frozen=True)
class Mlp:
    """The MLP behind the attention, on the residual stream H.

    Plain: ``F = act(H_n·W_1 + b_1)·W_2 + b_2``; gated (LLaMA's): ``F = (act(H_n·W_gate) ∘
    (H_n·W_up))·W_down`` with ``W_1`` the gate's weights, ``W_up`` the up weights and ``W_2`` the
    down weights. H_n is ``norm``'s output (place pre: GPT-2's ln_2, LLaMA's
    post_attention_layernorm), or H itself; with a post norm (BERT) the block's output is
    ``Y = LN(H + F)``, else ``Y = H + F``.
    """

    activation: str
    W_1: Matrix  # d_model × d_ff (the gate's weights when gated)
    W_2: Matrix  # d_ff × d_model (the down weights when gated)
    b_1: Matrix | None = None  # 1 × d_ff
    b_2: Matrix | None = None  # 1 × d_model
    W_up: Matrix | None = None  # d_model × d_ff: gated
    norm: Norm | None = None

    @property
    def gated(self) -> bool:
        return self.W_up is not None

    @property
    def d_ff(self) -> int:
        return self.W_1.cols

    @property
    def post(self) -> bool:
        return self.norm is not None and self.norm.post


@dataclass(frozen=True)
class Logits:
    """The model's head: the final norm (``norm``, GPT-2's ln_f, LLaMA's model.norm; None: none)
    and the unembedding ``W_U`` (d_model × vocabulary; ``tied``: the embedding table, transposed).
    ``last``: only the last position's row; ``top``: how many of the likeliest tokens the solution
    lists per row; ``vocab``: the words of the vocabulary's ids (0-based), or () for ids;
    ``lens``: the layer is not the model's last (the logit lens)."""

    W_U: Matrix
    norm: Norm | None = None
    last: bool = False
    top: int = 5
    tied: bool = False
    vocab: tuple[str, ...] = ()
    lens: bool = False

    @property
    def size(self) -> int:
        return self.W_U.cols

    def word(self, j: int) -> str:
        """Vocabulary entry ``j`` (0-based) as the solution names it: its word, or #j."""
        return self.vocab[j] if self.vocab else f"#{j}"


@dataclass(frozen=True)
class Loss:
    """The cross-entropy loss: ``targets`` holds one vocabulary id (0-based) for each of the logits'
    ``rows`` it is taken over (0-based); L is the mean over them of −log P[r, t] (natural log)."""

    targets: tuple[int, ...]
    rows: tuple[int, ...]


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
    """Where the backward pass starts: the upstream gradient dL/dO (dL/dH with the residual stream).

    ``kind`` is ``"dO"`` (the matrix is dL/dO itself), ``"sum"`` (L = Σ O,
    so dL/dO is all ones; no matrix), ``"weights"`` (L = Σ W ∘ O, the matrix
    is W), ``"target"`` (L = ½‖O − T‖², the matrix is T) or ``"cross-entropy"`` (the problem's
    own loss L of the logits, behind the MLP and the model's head; no matrix).
    """

    kind: str
    matrix: Matrix | None = None

    def describe(self, of: str = "O") -> str:
        """The loss in words, for the worked solution (math marked ⟦…⟧, see symattn.render.prose), on
        the output ``of``: O, or with the residual the residual stream H."""
        d = f"⟦\\partial L/\\partial {of}⟧"
        what = "output" if of == "O" else "residual-stream"
        return {
            "dO": f"the upstream gradient {d} is given",
            "sum": f"the loss is ⟦L = \\sum {of}⟧ (the sum of every {what} entry), so {d} is all ones",
            "weights": f"the loss is ⟦L = \\sum W \\circ {of}⟧ (each {what} entry times its weight), so "
                       f"⟦\\partial L/\\partial {of} = W⟧",
            "target": f"the loss is ⟦L = \\tfrac{{1}}{{2}}\\|{of} - T\\|^2⟧ (squared distance to the target ⟦T⟧), so "
                      f"⟦\\partial L/\\partial {of} = {of} - T⟧",
            CROSS_ENTROPY: f"the loss is the cross-entropy ⟦L⟧ of the logits, and ⟦\\partial L/\\partial {of}⟧ comes "
                           "back to it through the model's head and the MLP",
        }[self.kind]


SUM_LOSS = Backward("sum")


@dataclass(frozen=True)
class Tiling:
    """FlashAttention's online softmax: the keys in blocks of ``block``; ``rows`` are the query
    rows worked block by block in the solution (0-based; None: every row)."""

    block: int
    rows: tuple[int, ...] | None = None


FEATURES = ("relu", "elu1", "identity")  # linear attention's feature maps φ (elu1: elu(x) + 1)


@dataclass(frozen=True)
class Linear:
    """Linear attention: the softmax replaced by φ(q_i)·φ(k_j) over φ(q_i)·Σ_j φ(k_j), with the feature
    map ``feature`` (one of :data:`FEATURES`) applied to the unscaled queries and keys; ``line`` and
    ``col`` are where the field is written (a normaliser found to be 0 is reported there)."""

    feature: str
    line: int | None = None
    col: int | None = None


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3), ``heads`` heads. The keys and values come from the
    latent ``c_KV = X·W_DKV`` (n × d_c): head h's compressed key ``c_KV·W_UK^(h)`` and value
    ``c_KV·W_UV^(h)`` (column blocks of W_UK, W_UV, head 1 first); one rotated key ``RoPE(X·W_KR)``
    (n × d_R) is shared by every head. The queries are ``X·W_Q^(h)``, or ``c_Q·W_UQ^(h)`` with
    ``c_Q = X·W_DQ``, beside ``RoPE(X·W_QR^(h))`` (``c_Q·W_QR^(h)`` with W_DQ). ``rope`` turns only the
    d_R parts; ``norm_kv`` and ``norm_q`` normalise the latents (RMSNorm) when given; ``line`` and ``col``
    are where the field is written."""

    heads: int
    W_DKV: Matrix  # d_model × d_c
    W_UK: Matrix  # d_c × h·d_h
    W_UV: Matrix  # d_c × h·d_v
    W_KR: Matrix  # d_model × d_R
    W_QR: Matrix  # (d_model, or d_cq with W_DQ) × h·d_R
    rope: Rope
    W_Q: Matrix | None = None  # d_model × h·d_h
    W_DQ: Matrix | None = None  # d_model × d_cq
    W_UQ: Matrix | None = None  # d_cq × h·d_h
    norm_kv: "Norm | None" = None  # RMSNorm of c_KV (DeepSeek's kv_a_layernorm) before W_UK, W_UV and the cache
    norm_q: "Norm | None" = None  # RMSNorm of c_Q (q_a_layernorm) before W_UQ and W_QR; only with W_DQ
    line: int | None = None
    col: int | None = None

    @property
    def d_c(self) -> int:
        return self.W_DKV.cols

    @property
    def d_R(self) -> int:
        return self.W_KR.cols

    @property
    def d_h(self) -> int:
        return self.W_UK.cols // self.heads

    @property
    def d_v(self) -> int:
        return self.W_UV.cols // self.heads


@dataclass(frozen=True)
class QkNorm:
    """QK-norm (Qwen 3, OLMo 2, Gemma 3): each head's query rows and key rows normalised over the
    head's d_head features, before RoPE, by the norms ``q`` and ``k`` (one weight row of width
    d_head each, shared by every head)."""

    q: Norm
    k: Norm


@dataclass(frozen=True)
class DiffTransformer:
    """The Differential Transformer paper's per-head norm: each head's output row divided by its root
    mean square (RMSNorm with no learned weight, the paper's GroupNorm "subln", ``eps`` under the root),
    then times ``1 − lambda_init``."""

    lambda_init: sympy.Expr
    eps: sympy.Expr


@dataclass(frozen=True)
class Differential:
    """Differential attention (Ye et al., 2024): ``(softmax(Q₁K₁ᵀ/√d) − λ·softmax(Q₂K₂ᵀ/√d))·V``. Q₁ and
    K₁ are the problem's own; ``maps`` holds each head's (W_Q2, W_K2) of the second map; ``lam`` is λ,
    exact from its text; ``paper`` the paper's per-head norm and scale, or None; ``line`` and ``col``
    are where the field is written."""

    lam: sympy.Expr
    maps: tuple[tuple[Matrix, Matrix], ...]
    paper: DiffTransformer | None = None
    line: int | None = None
    col: int | None = None


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
    sinks: tuple | None = None  # gpt-oss's learned sink logits, one exact number per query head
    norm: Norm | None = None  # the layer normalisation in front of (or, post, behind) the attention
    residual: bool = False  # H = the attention's input + its output (implied by a post norm)
    token_types: Matrix | None = None  # BERT's token-type rows, one per token, added with the positions
    token_type_ids: tuple[int, ...] = ()  # which row of the token-type table each token took (0-based)
    embeddings_norm: Norm | None = None  # the embeddings' own norm (BERT's): its output is the layer's input
    mlp: Mlp | None = None  # the MLP behind the attention, on the residual stream; None: none
    logits: Logits | None = None  # the final norm and the unembedding; None: none
    loss: Loss | None = None  # the cross-entropy of the logits; None: none
    linear: Linear | None = None  # linear attention instead of the softmax; None: the softmax
    differential: Differential | None = None  # differential attention: a second map subtracted; None: none
    softcap: sympy.Expr | None = None  # c: the scaled scores become c·tanh(S_scaled/c) before the mask; None: none
    temperature: sympy.Expr | None = None  # T: the masked scores are divided by T; None: none
    qk_norm: QkNorm | None = None  # each head's queries and keys normalised before RoPE; None: not
    mla: Mla | None = None  # multi-head latent attention: Q, K, V from its latent (heads: its effective weights)

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

