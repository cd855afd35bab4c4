"""The exact derivation: a :class:`Problem` in, an immutable :class:`Derivation` out.

:func:`derive` reads like the forward pass of attention, one line per stage in
the order of the formula ``softmax(Q Kᵀ / √d_k + M) V``. Each stage is a
:class:`Step` with a stable id (``"S_scaled"``), a title, one sentence of why,
the relation, the shapes and the exact matrix. Renderers only read steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator

import mpmath
import sympy

from . import _exact
from ._exact import NEG_INF, Matrix, SoftmaxRow
from .problem import Problem


@dataclass(frozen=True)
class Dot:
    """One entry worked out as a dot product: ``target[i][j] = Σ_k a_k·b_k``."""

    target: str
    i: int
    j: int
    left: str  # how the left vector is named, e.g. "q_1"
    right: str  # e.g. "k_2"
    terms: tuple[tuple[sympy.Expr, sympy.Expr], ...]
    value: sympy.Expr


@dataclass(frozen=True)
class Step:
    """One stage of the derivation.

    ``exact`` is the stage's exact matrix; ``rows`` and ``cols`` label its rows
    and columns (tokens, or dimension names); ``formula`` is the relation in
    LaTeX and ``formula_text`` the same in plain text; ``shape_note`` says how
    the shapes combine; ``worked`` holds entries worked out in full.
    """

    id: str
    title: str
    why: str
    formula: str
    formula_text: str
    shape_note: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]
    worked: tuple[Dot, ...] = ()
    softmax: tuple[SoftmaxRow, ...] = ()
    matrix: Matrix | None = field(default=None, repr=False)
    given: bool = False

    @cached_property
    def exact(self) -> Matrix:
        """The exact matrix (built from the softmax structure for ``A`` and ``O``)."""
        assert self.matrix is not None
        return self.matrix

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.cols))


@dataclass(frozen=True)
class _SoftmaxStep(Step):
    """The weights ``A``: entries come from the structured rows on demand."""

    @cached_property
    def exact(self) -> Matrix:
        return Matrix(
            len(self.softmax), len(self.cols), lambda i, j: self.softmax[i].weight(j)
        )


@dataclass(frozen=True)
class _OutputStep(Step):
    """The output ``O = A V`` as one fraction per entry over the row's ``Z_i``."""

    values: Matrix | None = field(default=None, repr=False)

    @cached_property
    def exact(self) -> Matrix:
        v = self.values
        return Matrix(
            len(self.softmax),
            v.cols,
            lambda i, j: self.softmax[i].weighted_sum([v[k, j] for k in range(v.rows)]),
        )


@dataclass(frozen=True)
class Derivation:
    """Every stage of one attention problem, exactly."""

    problem: Problem
    steps: tuple[Step, ...]

    def step(self, id: str) -> Step:
        """The step with this id (``"Q"``, ``"S_scaled"``, ``"A"``, ...)."""
        for s in self.steps:
            if s.id == id:
                return s
        raise KeyError(f"no step {id!r}; the steps are {', '.join(self.ids)}")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    @property
    def dims(self) -> dict[str, int | None]:
        p = self.problem
        return {"n_q": p.n_q, "n_k": p.n_k, "d_model": p.d_model, "d_k": p.d_k, "d_v": p.d_v, "heads": 1}

    def evaluate(self, id: str, dps: int = 30) -> list[list[mpmath.mpf]]:
        """The exact values of step ``id`` at ``dps`` significant digits (mpmath).

        ``A`` and ``O`` are evaluated from the softmax structure, never through
        ``evalf`` of a large expression.
        """
        key = (id, dps)
        cache = self.__dict__.setdefault("_evaluated", {})
        if key not in cache:
            cache[key] = self._evaluate(self.step(id), dps)
        return cache[key]

    def _evaluate(self, step: Step, dps: int) -> list[list[mpmath.mpf]]:
        if isinstance(step, _SoftmaxStep):
            return [row.evaluate(dps) for row in step.softmax]
        if isinstance(step, _OutputStep):
            weights = self.evaluate("A", dps)
            values = _exact.evaluate(step.values, dps)
            with mpmath.workdps(dps + 10):
                return [
                    [mpmath.fsum(a * v[j] for a, v in zip(row, values)) for j in range(len(values[0]))]
                    for row in weights
                ]
        return _exact.evaluate(step.exact, dps)


def derive(problem: Problem) -> Derivation:
    """Derive every stage of ``softmax(Q Kᵀ·scale + M) V`` exactly.

    >>> from symattn import load_problem
    >>> p = load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nscale: none\\n")
    >>> derive(p).step("A").exact
    Matrix([[1/(exp(-1) + 1), exp(-1)/(exp(-1) + 1)]])
    """
    p = problem
    b = _Builder(p)
    if p.projected:
        b.given("X", p.X)
        if p.context is not None:
            b.given("context", p.context)
        b.given("W_Q", p.W_Q)
        b.given("W_K", p.W_K)
        b.given("W_V", p.W_V)
        Q = b.project("Q", p.X, p.W_Q)                      # (n_q, d_model) x (d_model, d_k) -> (n_q, d_k)
        K = b.project("K", b.kv_input, p.W_K)               # (n_k, d_model) x (d_model, d_k) -> (n_k, d_k)
        V = b.project("V", b.kv_input, p.W_V)               # (n_k, d_model) x (d_model, d_v) -> (n_k, d_v)
    else:
        Q = b.given("Q", p.Q)
        K = b.given("K", p.K)
        V = b.given("V", p.V)
    K_T = b.transpose(K)                                    # (n_k, d_k) -> (d_k, n_k)
    S = b.scores(Q, K_T)                                    # (n_q, d_k) x (d_k, n_k) -> (n_q, n_k)
    S_scaled = b.scaled(S)                                  # (n_q, n_k)
    M = b.mask()                                            # (n_q, n_k): 0 or -inf, plus bias
    S_masked = b.masked(S_scaled, M)                        # (n_q, n_k)
    A = b.softmax(S_masked)                                 # (n_q, n_k), rows sum to 1
    b.output(A, V)                                          # (n_q, n_k) x (n_k, d_v) -> (n_q, d_v)
    return Derivation(p, tuple(b.steps))


_WHY = {
    "X": "Each row of X is one token's vector; attention will mix these rows.",
    "context": "Each row of the context is one token of the other sequence; keys and values are computed from it (cross-attention).",
    "W_Q": "The query weights, learned in training and given here.",
    "W_K": "The key weights, learned in training and given here.",
    "W_V": "The value weights, learned in training and given here.",
    "Q": "Each token's query says what it is looking for: its row of X times W_Q.",
    "K": "Each token's key says what it offers to be matched against: its row times W_K.",
    "V": "Each token's value is what it hands on when it is attended to: its row times W_V.",
    "Q_given": "The queries are given directly: one row per query token, what it is looking for.",
    "K_given": "The keys are given directly: one row per key token, what it offers to be matched against.",
    "V_given": "The values are given directly: one row per key token, what it hands on when attended to.",
    "K_T": "Transposing K turns each key into a column, so one matrix product compares every query with every key.",
    "S": "Entry (i, j) is the dot product of query i with key j: how well query i matches key j.",
    "S_scaled": (
        "A dot product of d_k terms of unit variance has variance d_k; dividing by √d_k brings the scores "
        "back to unit variance, so the softmax does not saturate into a one-hot row with vanishing gradients."
    ),
    "S_scaled_custom": "The scores are multiplied by the scale factor the problem gives.",
    "S_scaled_none": "This problem uses no scaling (scale 1), so the scaled scores equal the scores.",
    "M": (
        "The mask says which keys each query may see: 0 where it may attend, −∞ where it may not. "
        "Decoders (GPT-style) use a causal mask so a token cannot look ahead; encoders (BERT-style) use none."
    ),
    "S_masked": "Adding M leaves allowed scores unchanged and sends forbidden ones to −∞; since exp(−∞) = 0 (as a limit), they get weight exactly 0.",
    "A": (
        "The softmax turns each row of scores into weights that are positive and sum to 1; subtracting the row "
        "maximum m_i first changes nothing (it cancels) and keeps every exponent ≤ 0."
    ),
    "O": "Each output row is a weighted average of the value rows, weighted by the same row of A.",
}


class _Builder:
    """Collects the steps of one derivation, in order."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        self.steps: list[Step] = []
        self.q_labels = p.tokens
        self.k_labels = p.key_tokens
        self.kv_input = p.context if p.context is not None else p.X
        self.kv_name = "C" if p.context is not None else "X"

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    # -- inputs and projections ------------------------------------------------

    def given(self, id: str, m: Matrix) -> Matrix:
        p = self.p
        if id in ("X", "Q"):
            rows, cols = self.q_labels, _dims(id_col(id), m.cols)
        elif id in ("context", "K", "V"):
            rows, cols = self.k_labels, _dims(id_col(id), m.cols)
        else:  # weights: rows are model dimensions
            rows, cols = _dims("d", m.rows), _dims(id_col(id), m.cols)
        title = {
            "X": "Input tokens",
            "context": "Context tokens",
            "W_Q": "Query weights",
            "W_K": "Key weights",
            "W_V": "Value weights",
            "Q": "Queries (given)",
            "K": "Keys (given)",
            "V": "Values (given)",
        }[id]
        why = _WHY[f"{id}_given"] if id in ("Q", "K", "V") else _WHY[id]
        symbol = {"context": "C"}.get(id, id)
        n_name = {"X": "n", "context": "n_k", "Q": "n_q", "K": "n_k", "V": "n_k"}.get(id)
        if p.context is not None and id == "X":
            n_name = "n_q"
        if n_name is None:
            shape_note = f"{m.rows}×{m.cols} (d_model × {'d_v' if id == 'W_V' else 'd_k'})"
        else:
            width = {"X": "d_model", "context": "d_model", "Q": "d_k", "K": "d_k", "V": "d_v"}[id]
            shape_note = f"{m.rows}×{m.cols} ({n_name} × {width})"
        self.add(
            Step(id, title, why, _tex_name(symbol), symbol, shape_note, rows, cols, matrix=m, given=True)
        )
        return m

    def project(self, id: str, inp: Matrix, weights: Matrix) -> Matrix:
        name = "X" if inp is self.p.X else "C"
        result = _exact.matmul(inp, weights)
        rows = self.q_labels if id == "Q" else self.k_labels
        width = "d_v" if id == "V" else "d_k"
        worked = (_dot(id, 0, 0, inp.row(0), weights.col(0), f"{name.lower()}_1", f"W_{id}[:,1]", result[0, 0]),)
        title = {"Q": "Query projection", "K": "Key projection", "V": "Value projection"}[id]
        return self.add(
            Step(
                id,
                title,
                _WHY[id],
                f"{id} = {name}\\,W_{{{id}}}",
                f"{id} = {name}·W_{id}",
                f"({inp.rows}×{inp.cols})·({weights.rows}×{weights.cols}) → {result.rows}×{result.cols} "
                f"({'n_q' if id == 'Q' else 'n_k'} × {width})",
                rows,
                _dims(id.lower(), result.cols),
                worked=worked,
                matrix=result,
            )
        ).exact

    # -- scores ----------------------------------------------------------------

    def transpose(self, K: Matrix) -> Matrix:
        K_T = K.T
        self.add(
            Step(
                "K_T",
                "Transpose the keys",
                _WHY["K_T"],
                "K^{\\top}",
                "Kᵀ",
                f"{K.rows}×{K.cols} → {K_T.rows}×{K_T.cols} (d_k × n_k)",
                _dims("k", K_T.rows),
                self.k_labels,
                matrix=K_T,
            )
        )
        return K_T

    def scores(self, Q: Matrix, K_T: Matrix) -> Matrix:
        S = _exact.matmul(Q, K_T)
        i, j = 0, 1 if S.cols > 1 else 0
        worked = (_dot("S", i, j, Q.row(i), K_T.col(j), f"q_{i + 1}", f"k_{j + 1}", S[i, j]),)
        return self.add(
            Step(
                "S",
                "Scores",
                _WHY["S"],
                "S = Q\\,K^{\\top}",
                "S = Q·Kᵀ",
                f"({Q.rows}×{Q.cols})·({K_T.rows}×{K_T.cols}) → {S.rows}×{S.cols} (n_q × n_k)",
                self.q_labels,
                self.k_labels,
                worked=worked,
                matrix=S,
            )
        ).exact

    def scaled(self, S: Matrix) -> Matrix:
        p = self.p
        factor = p.scale_value
        if p.scale == "auto":
            why, formula, text = _WHY["S_scaled"], f"\\frac{{S}}{{\\sqrt{{d_k}}}} = \\frac{{S}}{{\\sqrt{{{p.d_k}}}}}", f"S / √d_k = S / √{p.d_k}"
        elif p.scale == "none":
            why, formula, text = _WHY["S_scaled_none"], "S", "S (no scaling)"
        else:
            why, formula, text = _WHY["S_scaled_custom"], f"{sympy.latex(factor)}\\cdot S", f"{factor}·S"
        return self.add(
            Step(
                "S_scaled",
                "Scale the scores",
                why,
                formula,
                text,
                f"{S.rows}×{S.cols} (n_q × n_k)",
                self.q_labels,
                self.k_labels,
                matrix=_exact.scale(S, factor),
            )
        ).exact

    def mask(self) -> Matrix:
        p = self.p
        M = Matrix(
            p.n_q,
            p.n_k,
            lambda i, j: (
                NEG_INF
                if not p.mask.allowed[i][j]
                else (p.bias[i, j] if p.bias is not None else sympy.Integer(0))
            ),
        )
        rule = p.mask.rule()
        why = _WHY["M"] + f" Here the rule is {rule}."
        if p.bias is not None:
            why += " The given bias is added to it."
        formula = "M = M_{\\text{mask}} + B" if p.bias is not None else "M"
        return self.add(
            Step(
                "M",
                "The mask",
                why,
                formula,
                "M = mask + bias" if p.bias is not None else "M",
                f"{p.n_q}×{p.n_k} (n_q × n_k)",
                self.q_labels,
                self.k_labels,
                matrix=M,
            )
        ).exact

    def masked(self, S_scaled: Matrix, M: Matrix) -> Matrix:
        p = self.p
        scaled = {"auto": "\\frac{S}{\\sqrt{d_k}}", "none": "S"}.get(p.scale, "s\\,S") if isinstance(p.scale, str) else "s\\,S"
        return self.add(
            Step(
                "S_masked",
                "Add the mask",
                _WHY["S_masked"],
                f"\\hat{{S}} = {scaled} + M",
                "Ŝ = S_scaled + M",
                f"{p.n_q}×{p.n_k} (n_q × n_k)",
                self.q_labels,
                self.k_labels,
                matrix=_exact.add_mask(S_scaled, M),
            )
        ).exact

    # -- weights and output -----------------------------------------------------

    def softmax(self, Z: Matrix) -> tuple[SoftmaxRow, ...]:
        rows = _exact.softmax_rows(Z)
        self.add(
            _SoftmaxStep(
                "A",
                "Softmax on each row",
                _WHY["A"],
                "A = \\operatorname{softmax}(\\hat{S})",
                "A[i,j] = exp(Ŝ[i,j] − m_i) / Z_i,  m_i = max_k Ŝ[i,k],  Z_i = Σ_k exp(Ŝ[i,k] − m_i)",
                f"{Z.rows}×{Z.cols} (n_q × n_k), each row sums to 1",
                self.q_labels,
                self.k_labels,
                softmax=rows,
            )
        )
        return rows

    def output(self, rows: tuple[SoftmaxRow, ...], V: Matrix) -> None:
        p = self.p
        self.add(
            _OutputStep(
                "O",
                "Weighted sum of the values",
                _WHY["O"],
                "O = A\\,V",
                "O = A·V",
                f"({p.n_q}×{p.n_k})·({V.rows}×{V.cols}) → {p.n_q}×{V.cols} (n_q × d_v)",
                self.q_labels,
                _dims("v", V.cols),
                softmax=rows,
                values=V,
            )
        )


def id_col(id: str) -> str:
    return {"X": "d", "context": "d", "Q": "q", "K": "k", "V": "v", "W_Q": "q", "W_K": "k", "W_V": "v"}[id]


def _dims(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i + 1}" for i in range(n))


def _tex_name(symbol: str) -> str:
    if "_" in symbol:
        head, tail = symbol.split("_", 1)
        return f"{head}_{{{tail}}}"
    return symbol


def _dot(target, i, j, a: Matrix, b: Matrix, left: str, right: str, value) -> Dot:
    return Dot(target, i, j, left, right, tuple(zip(list(a), list(b))), value)
