"""The operations the stage relations are written in, declared once.

A relation in :mod:`symattn.stages.registry` says, for instance, ``ops.matmul(ops.T(v(A)), v(dO))``.
:class:`Ops` lists every operation a relation may call, and four backends implement it:

- :class:`symattn.exact.exact_ops.ExactOps`: exact values (SymPy and flint matrices, the softmax
  kept as structure, :mod:`symattn.exact.structures`);
- :class:`symattn.exact.numeric_ops.NumericOps`: values at ``dps`` digits (lists of mpmath rows, or
  a rational matrix read straight into arb), and the operations only the common mistakes use;
- :class:`symattn.exact.arb_ops.ArbOps`: flint arb matrices at ``dps`` digits, for the gradients of
  a problem without symbols (the mask and the softmax are left to NumericOps);
- :class:`symattn.exact.float_ops.FloatOps`: NumPy float64, for the gradients the cross-check
  compares with another float64 computation.

A value is whatever the backend holds (see each one); an exact matrix the problem gives is read
by any of them.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import sympy

Value = Any  # a backend's matrix: exact (a matrix or a structure), mpmath rows, an arb_mat, a float64 array


class Undefined(ArithmeticError):
    """A relation has no value here (a row of scores with nothing allowed has no softmax)."""


class Ops(Protocol):
    """The relations' vocabulary: every operation a stage relation may call, with its meaning.
    A backend subclasses it to declare that it implements all of them."""

    def matmul(self, a: Value, b: Value) -> Value:
        """The product ``a·b``."""
        raise NotImplementedError

    def T(self, a: Value) -> Value:
        """The transpose ``aᵀ``."""
        raise NotImplementedError

    def add_row(self, m: Value, row: Value) -> Value:
        """``m`` with the 1 × cols ``row`` added to every row (a projection's bias)."""
        raise NotImplementedError

    def col_sums(self, m: Value) -> Value:
        """``1ᵀ m``, the 1 × cols sums of the columns (a bias's gradient)."""
        raise NotImplementedError

    def scale(self, a: Value, factor: sympy.Expr) -> Value:
        """``factor · a`` for an exact number ``factor``."""
        raise NotImplementedError

    def mask(self, allowed: Sequence[Sequence[bool]], bias: Value | None) -> Value:
        """``M``: 0 where a query may attend (``allowed[i][j]``), −∞ where not, plus the bias if any."""
        raise NotImplementedError

    def add_mask(self, scores: Value, mask: Value) -> Value:
        """``scores + mask``, where a −∞ in the mask stays −∞."""
        raise NotImplementedError

    def softmax(self, z: Value, sink: sympy.Expr | None = None) -> Value:
        """The softmax of each row of ``z`` (0 at its −∞ positions); with a learned ``sink`` logit s,
        each row's denominator has one more term e^{s − m_i} (m_i the maximum over the row and s)."""
        raise NotImplementedError

    def sink_weight(self, a: Value) -> Value:
        """The n × 1 weight each row of the weights ``a`` (a softmax with a sink) gives its sink:
        e^{s − m_i} / Z_i = 1 − Σ_j a_ij."""
        raise NotImplementedError

    def softmax_backward(self, a: Value, dA: Value) -> Value:
        """Back through the softmax, row by row: ``a ∘ (dA − rowsum(a ∘ dA))`` for the weights ``a``."""
        raise NotImplementedError

    def hstack(self, parts: Sequence[Value]) -> Value:
        """The matrices ``parts`` side by side (the heads concatenated)."""
        raise NotImplementedError

    def vstack(self, parts: Sequence[Value]) -> Value:
        """The matrices ``parts`` one above the other (one row's weights without and with a change)."""
        raise NotImplementedError

    def softcap(self, a: Value, cap: sympy.Expr) -> Value:
        """``cap · tanh(a / cap)`` of each entry, for an exact number ``cap`` > 0 (Gemma 2's soft-capping)."""
        raise NotImplementedError

    def block(self, m: Value, first: int, width: int) -> Value:
        """Columns ``first … first + width − 1`` (0-based) of ``m`` (one head's block)."""
        raise NotImplementedError

    def sum(self, parts: Sequence[Value]) -> Value:
        """The sum of the matrices ``parts``, of one shape."""
        raise NotImplementedError

    def rows(self, m: Value, first: int, count: int) -> Value:
        """Rows ``first … first + count − 1`` (0-based) of ``m``."""
        raise NotImplementedError

    def table(self, rows: list[list[int]]) -> Value:
        """A matrix of whole numbers (a table of counts)."""
        raise NotImplementedError

    def sub(self, a: Value, b: Value) -> Value:
        """The difference ``a − b``."""
        raise NotImplementedError

    def difference(self, a: Value, b: Value) -> Value:
        """``a − b`` for two forms of one value (linear attention's recurrent and parallel outputs):
        exactly 0 where it is 0, however the two forms are written."""
        raise NotImplementedError

    def ones(self, rows: int, cols: int) -> Value:
        """The ``rows × cols`` matrix of ones."""
        raise NotImplementedError

    def given(self, m: Value) -> Value:
        """An exact matrix the problem gives, as this backend's value."""
        raise NotImplementedError

    def is_rational(self, x: Value) -> bool:
        """Whether ``x`` is an exact rational matrix (read exactly, never evaluated)."""
        raise NotImplementedError

    def rational(self, p: int, q: int) -> sympy.Rational:
        """The exact number ``p/q`` (a factor for :meth:`scale`)."""
        raise NotImplementedError

    def rotate(self, m: Value, thetas: Sequence[sympy.Expr], pairs: Sequence[tuple[int, int]],
               sign: int = 1, offset: int = 0) -> Value:
        """RoPE: row ``p`` of ``m`` with each pair ``pairs[i]`` turned by ``sign·(p + offset)·θ_i``."""
        raise NotImplementedError

    def row_mean(self, m: Value) -> Value:
        """The n × 1 means of the rows of ``m`` (μ_i of a token's features)."""
        raise NotImplementedError

    def row_spread(self, m: Value, mu: Value | None, ddof: int = 0) -> Value:
        """The n × 1 ``Σ_k (m_ik − μ_i)² / (d − ddof)`` of each row: the biased variance (``ddof`` 0),
        or with ``mu`` None the mean square ``Σ_k m_ik² / d`` (RMSNorm)."""
        raise NotImplementedError

    def normalise(self, m: Value, mu: Value | None, spread: Value, eps: sympy.Expr, inside: bool = True) -> Value:
        """``(m_ik − μ_i) / √(spread_i + ε)`` (``mu`` None: ``m_ik / √(spread_i + ε)``); ``inside``
        False puts ε outside the root, ``/(√spread_i + ε)`` (a common slip)."""
        raise NotImplementedError

    def times_row(self, m: Value, row: Value) -> Value:
        """``m`` with each column k multiplied by ``row``'s entry k (γ of a norm)."""
        raise NotImplementedError

    def hadamard(self, a: Value, b: Value) -> Value:
        """The entrywise product ``a ∘ b`` (dγ sums dX_norm ∘ X̂ over the tokens)."""
        raise NotImplementedError

    def normalise_backward(self, d: Value, hat: Value, spread: Value, eps: sympy.Expr, centred: bool) -> Value:
        """Back through a norm, row by row: ``(d_i − mean(d_i) − x̂_i·mean(d_i ∘ x̂_i)) / √(spread_i + ε)``
        for the gradient ``d`` of the normalised rows ``hat`` (LayerNorm, ``centred``), and without
        the mean of ``d_i`` for RMSNorm."""
        raise NotImplementedError

    def activate(self, m: Value, name: str) -> Value:
        """The MLP's activation ``name`` (relu, relu2, gelu, gelu-tanh, silu) of each entry of ``m``, or
        linear attention's feature map (relu, elu1 = elu(x) + 1, identity)."""
        raise NotImplementedError

    def row_softmax(self, z: Value) -> Value:
        """The softmax of each row of ``z`` over every column (the vocabulary: nothing masked)."""
        raise NotImplementedError

    def nll(self, z: Value, targets: Sequence[int], rows: Sequence[int], base: str | None = None) -> Value:
        """The len(rows) × 1 cross-entropies ``−log softmax(z)[r, t]`` of each used row ``r`` of the
        logits ``z`` and its target ``t`` (natural log; ``base`` "log2": in bits, a slip)."""
        raise NotImplementedError

    def divide_rows(self, m: Value, d: Value) -> Value:
        """Each row ``i`` of ``m`` divided by ``d[i][0]`` (linear attention's normalisers, n × 1); a
        normaliser that is 0 is refused, never divided by."""
        raise NotImplementedError

    def tiled_max(self, z: Value, block: int) -> Value:
        """The running maximum of each row of ``z`` after each block of ``block`` keys."""
        raise NotImplementedError

    def tiled_sums(self, z: Value, m: Value, block: int) -> Value:
        """The running sum ℓ of each row after each block, rescaled at each new running maximum ``m``."""
        raise NotImplementedError

    def tiled_acc(self, z: Value, m: Value, v: Value, block: int) -> Value:
        """Each row's accumulator ``Σ e^{s_j − m} v_j`` after the last block."""
        raise NotImplementedError

    def tiled_output(self, acc: Value, sums: Value) -> Value:
        """``acc / ℓ``: each accumulator row over its row's last running sum."""
        raise NotImplementedError
