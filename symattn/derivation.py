"""The exact derivation: a :class:`Problem` in, an immutable :class:`Derivation` out.

:func:`derive` reads like the forward pass of attention, one line per stage in
the order of the formula ``softmax(Q Kᵀ / √d_k + M) V``. Each stage is a
:class:`Step` with a stable id (``"S_scaled"``, or ``"head2.S_scaled"`` with
several heads), a title, one sentence of why, the relation, the shapes and the
exact matrix. Renderers only read steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterator

import mpmath
import sympy

from . import _exact
from ._errors import SymattnError
from ._exact import NEG_INF, LazyMatrix, Matrix, SoftmaxRow
from .problem import Head, Problem

Values = list[list[mpmath.mpf]]


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
    def lazy(self) -> "Matrix | LazyMatrix":
        """The exact matrix, with entries built only when read (renderers show corners of big ones)."""
        assert self.matrix is not None
        return self.matrix

    @cached_property
    def exact(self) -> Matrix:
        """The exact matrix as a SymPy ImmutableMatrix (built from the softmax structure for ``A`` and ``O``)."""
        m = self.lazy
        return m.as_matrix() if isinstance(m, LazyMatrix) else m

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.cols))

    @property
    def kind(self) -> str:
        """The stage id without its head prefix: ``"head2.A"`` → ``"A"``."""
        return self.id.rsplit(".", 1)[-1]

    @property
    def head(self) -> int | None:
        """The head this step belongs to (1-based), or None."""
        if "." not in self.id:
            return None
        return int(self.id.split(".", 1)[0].removeprefix("head"))

    def evaluate(self, derivation: "Derivation", dps: int, subs) -> Values:
        """The values at ``dps`` digits (``subs`` gives numbers for symbols)."""
        return _exact.evaluate(self.lazy, dps, subs)

    def _repr_latex_(self) -> str:
        """In a notebook: the step's relation and exact matrix, as display math."""
        from .render._common import exact_tex_matrix_of_step

        return f"$$ {self.formula} = {exact_tex_matrix_of_step(self)} $$"

    def _repr_markdown_(self) -> str:
        return f"**{self.title}** ({self.id}). {self.why}\n\n{self._repr_latex_()}\n\nShape: {self.shape_note}."


@dataclass(frozen=True)
class _SoftmaxStep(Step):
    """The weights ``A``: entries come from the structured rows on demand."""

    @cached_property
    def lazy(self) -> LazyMatrix:
        return LazyMatrix(len(self.softmax), len(self.cols), lambda i, j: self.softmax[i].weight(j))

    def evaluate(self, derivation, dps, subs) -> Values:
        return [row.evaluate(dps, subs) for row in self.softmax]

    def floats(self, dps: int) -> "list[list[float]] | None":
        return _exact.weights_floats(self.softmax, dps)

    def entry_value(self, i: int, j: int, dps: int, subs) -> mpmath.mpf:
        return self.softmax[i].evaluate(dps, subs)[j]  # one row's weights, not the whole matrix


@dataclass(frozen=True)
class _OutputStep(Step):
    """The output ``O = A V`` as one fraction per entry over the row's ``Z_i``."""

    values: Matrix | None = field(default=None, repr=False)

    @cached_property
    def lazy(self) -> LazyMatrix:
        v = self.values
        columns: dict[int, list[sympy.Expr]] = {}

        def entry(i: int, j: int) -> sympy.Expr:
            if j not in columns:
                columns[j] = [v[k, j] for k in range(v.rows)]
            return self.softmax[i].weighted_sum(columns[j])

        return LazyMatrix(len(self.softmax), v.cols, entry)

    @cached_property
    def value_columns(self) -> "list[list] | None":
        """The columns of ``V`` as QQ numbers when it is rational, else None."""
        qq = _exact.qq_entries(self.values)
        return None if qq is None else [list(col) for col in zip(*qq)]

    def floats(self, dps: int) -> "list[list[float]] | None":
        return _exact.weights_times(self.softmax, self.values, dps, _exact.arb_float)

    def entry_value(self, i: int, j: int, dps: int, subs) -> "mpmath.mpf | None":
        """Entry (i, j) alone, from row i's weights and column j of V (rational ones), else None."""
        columns = self.value_columns
        if columns is None:
            return None
        return _exact.weighted_value(self.softmax[i], columns[j], dps)

    def evaluate(self, derivation, dps, subs) -> Values:
        fast = _exact.weights_times(self.softmax, self.values, dps)
        if fast is not None:
            return fast
        weights = [row.evaluate(dps, subs) for row in self.softmax]
        return _exact.mp_matmul(weights, _exact.evaluate(self.values, dps, subs), dps)


@dataclass(frozen=True)
class _ConcatStep(Step):
    """The heads' outputs side by side."""

    parts: tuple[str, ...] = ()

    def evaluate(self, derivation, dps, subs) -> Values:
        blocks = [derivation.evaluate(part, dps) for part in self.parts]
        return [sum((block[i] for block in blocks), []) for i in range(len(self.rows))]


@dataclass(frozen=True)
class _ProductStep(Step):
    """``left · right`` where ``left`` is an earlier step (evaluated from its own structure)."""

    left: str = ""
    right: Matrix | None = field(default=None, repr=False)

    def evaluate(self, derivation, dps, subs) -> Values:
        return _exact.mp_matmul(derivation.evaluate(self.left, dps), _exact.evaluate(self.right, dps, subs), dps)


@dataclass(frozen=True)
class Derivation:
    """Every stage of one attention problem, exactly."""

    problem: Problem
    steps: tuple[Step, ...]

    def step(self, id: str) -> Step:
        """The step with this id (``"Q"``, ``"S_scaled"``, ``"head1.A"``, ...)."""
        for s in self.steps:
            if s.id == id:
                return s
        raise KeyError(f"no step {id!r}; the steps are {', '.join(self.ids)}")

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.steps)

    def _repr_markdown_(self) -> str:
        """In a notebook, a derivation shows its whole worked solution."""
        from .render import render_markdown

        return render_markdown(self)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    @property
    def dims(self) -> dict:
        """The sizes of the problem; with heads of different widths d_k and d_v are lists."""
        p = self.problem
        if p.projected:
            d_k = [h.d_k for h in p.heads]
            d_v = [h.d_v for h in p.heads]
        else:
            d_k, d_v = [p.d_k], [p.d_v]
        dims = {
            "n_q": p.n_q,
            "n_k": p.n_k,
            "d_model": p.d_model,
            "d_k": d_k[0] if len(set(d_k)) == 1 else d_k,
            "d_v": d_v[0] if len(set(d_v)) == 1 else d_v,
            "heads": len(d_k),
        }
        if p.W_O is not None:
            dims["d_out"] = p.W_O.cols
        return dims

    @property
    def can_evaluate(self) -> bool:
        """False when the problem has symbols without values."""
        return self.problem.substitutions is not None

    def evaluate(self, id: str, dps: int = 30) -> Values:
        """The exact values of step ``id`` at ``dps`` significant digits (mpmath).

        Softmax weights and outputs are evaluated from the softmax structure,
        never through ``evalf`` of a large expression. Symbols take their
        ``values``.
        """
        subs = self.problem.substitutions
        if subs is None:
            raise SymattnError(
                "the problem has symbols without values, so its numbers cannot be evaluated; "
                "give values: {name: number, ...} for every symbol"
            )
        key = (id, dps)
        cache = self.__dict__.setdefault("_evaluated", {})
        if key not in cache:
            cache[key] = self.step(id).evaluate(self, dps, subs)
        return cache[key]

    def entry_values(self, id: str, dps: int = 30):
        """A function ``(i, j) → value at dps digits`` that evaluates only the entries asked for
        when the stage is rational (a renderer showing the corner of a big matrix), and
        reads :meth:`evaluate` otherwise."""
        step = self.step(id)
        qq = _exact.qq_entries(step.lazy)
        if qq is None or self.problem.symbols:
            subs = self.problem.substitutions
            if hasattr(step, "entry_value") and subs is not None and (id, dps) not in self.__dict__.get("_evaluated", {}):
                # Weights and outputs entry by entry: a corner of a big matrix costs a corner.
                def computed(i: int, j: int) -> mpmath.mpf:
                    value = step.entry_value(i, j, dps, subs)
                    return self.evaluate(id, dps)[i][j] if value is None else value

                return computed
            values = self.evaluate(id, dps)
            return lambda i, j: values[i][j]

        prec = mpmath.libmp.dps_to_prec(dps + 10)

        def value(i: int, j: int) -> mpmath.mpf:
            x = qq[i][j]
            return mpmath.ninf if x is None else _exact.mpf_of_qq(x, prec)

        return value

    def approx(self, id: str) -> "numpy.ndarray":
        """The values of step ``id`` as float64 (−∞ kept; NaN beyond float64's range).

        Rational stages are rounded straight from their exact fractions; the others
        from their 30-digit values.
        """
        import numpy

        cache = self.__dict__.setdefault("_approx", {})
        if id not in cache:
            values = None
            if not self.problem.symbols:  # rationals rounded once; rational softmax rows from arb
                step = self.step(id)
                values = _exact.approx(step.lazy)
                if values is None and hasattr(step, "floats"):
                    values = step.floats(30)
            if values is None:
                values = [[_float(v) for v in row] for row in self.evaluate(id, 30)]
            cache[id] = numpy.array(values, dtype=numpy.float64)
        return cache[id]


def _float(x: mpmath.mpf) -> float:
    """``x`` as float64; NaN when it is finite but beyond float64's range (not ±inf, which
    would pass for a masked position)."""
    value = float(x)
    return float("nan") if math.isinf(value) and not mpmath.isinf(x) else value


def derive(problem: Problem, *, on_step=None) -> Derivation:
    """Derive every stage of ``softmax(Q Kᵀ·scale + M) V`` exactly.

    >>> from symattn import load_problem
    >>> p = load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nscale: none\\n")
    >>> derive(p).step("A").exact
    Matrix([[1/(exp(-1) + 1), exp(-1)/(exp(-1) + 1)]])
    """
    p = problem
    b = _Builder(p, on_step)
    from .backward import HeadInfo, add_backward

    infos = []
    if not p.projected:
        Q, K, V = b.given("Q", p.Q), b.given("K", p.K), b.given("V", p.V)
        b.attention(Q, K, V, p.d_k)
        infos.append(HeadInfo("", b.by_id("A").softmax, Q, K, V, p.scale_for(p.d_k)))
        X = C = None
    else:
        X = b.given("X", p.X)                                   # (n_q, d_model)
        C = b.given("context", p.context) if p.context is not None else X  # (n_k, d_model)
        outputs = []
        for h, head in enumerate(p.heads, 1):
            b.prefix = f"head{h}." if p.multi_head else ""
            Q, K, V = b.projections(X, C, head)                 # (n_q, d_k), (n_k, d_k), (n_k, d_v)
            outputs.append(b.attention(Q, K, V, head.d_k))      # (n_q, d_v)
            infos.append(HeadInfo(b.prefix, b.by_id(b.prefix + "A").softmax, Q, K, V, p.scale_for(head.d_k),
                                  head.W_Q, head.W_K, head.W_V))
        if p.multi_head:
            b.prefix = ""
            concat = b.concat(outputs)                          # (n_q, h·d_v)
            W_O = b.given("W_O", p.W_O)                         # (h·d_v, d_out)
            b.output_projection(concat, W_O)                    # (n_q, d_out)
    if p.backward is not None:
        add_backward(b, infos, X, C, "O")                       # dL/dO back to every input
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
    "X_cross": "Each row of X is one query-side token; the queries are computed from it.",
    "W_O": "The output weights, learned in training and given here: they mix the heads' outputs.",
    "A_symbolic": (
        "With symbols the largest score of a row cannot be picked, so each such row is normalised by its first "
        "allowed score m_i instead; any reference value gives the same weights."
    ),
    "concat": "Each head attended in its own subspace; their outputs are placed side by side, row by row.",
    "O_proj": "The output projection W_O mixes what the heads found into one output row per token.",
}


class _Builder:
    """Collects the steps of one derivation, in order; ``prefix`` names the current head."""

    def __init__(self, p: Problem, on_step=None) -> None:
        self.p = p
        self.on_step = on_step  # called with each stage id as it is derived (the progress display)
        self.steps: list[Step] = []
        self.prefix = ""
        self.q_labels = p.tokens
        self.k_labels = p.key_tokens
        self.kv_name = "C" if p.context is not None else "X"

    def add(self, step: Step) -> Step:
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step.id)
        return step

    def by_id(self, id: str) -> Step:
        """A step added earlier."""
        return next(s for s in reversed(self.steps) if s.id == id)

    def step(self, cls, id: str, title: str, why: str, formula: str, text: str, shape: str, rows, cols, **kw) -> Step:
        """Add a step of class ``cls`` under the current head's prefix."""
        return self.add(cls(self.prefix + id, title, why, formula, text, shape, rows, cols, **kw))

    # -- inputs and projections ------------------------------------------------

    def given(self, id: str, m: Matrix) -> Matrix:
        p = self.p
        cross = p.context is not None
        if id in ("X", "Q"):
            rows = self.q_labels
        elif id in ("context", "K", "V"):
            rows = self.k_labels
        else:  # weights: rows are model (or concatenated value) dimensions
            rows = _dims("c" if id == "W_O" else "d", m.rows)
        cols = _dims({"X": "d", "context": "d", "W_O": "o"}.get(id, id[-1].lower()), m.cols)
        title = {
            "X": "Query-side tokens" if cross else "Input tokens",
            "context": "Context tokens (the key and value side)",
            "W_Q": "Query weights",
            "W_K": "Key weights",
            "W_V": "Value weights",
            "W_O": "Output weights",
            "Q": "Queries (given)",
            "K": "Keys (given)",
            "V": "Values (given)",
        }[id]
        why = _WHY[f"{id}_given"] if id in ("Q", "K", "V") else _WHY[id]
        if id == "X" and cross:
            why = _WHY["X_cross"]
        symbol = {"context": "C"}.get(id, id)
        shape = {
            "X": f"n_q × d_model" if cross else "n × d_model",
            "context": "n_k × d_model",
            "W_Q": "d_model × d_k",
            "W_K": "d_model × d_k",
            "W_V": "d_model × d_v",
            "W_O": "h·d_v × d_out",
            "Q": "n_q × d_k",
            "K": "n_k × d_k",
            "V": "n_k × d_v",
        }[id]
        self.step(Step, id, title, why, _tex_name(symbol), symbol, f"{m.rows}×{m.cols} ({shape})", rows, cols,
                  matrix=m, given=True)
        return m

    def projections(self, X: Matrix, C: Matrix, head: Head) -> tuple[Matrix, Matrix, Matrix]:
        self.given("W_Q", head.W_Q)
        self.given("W_K", head.W_K)
        self.given("W_V", head.W_V)
        Q = self.project("Q", X, "X", head.W_Q)                 # (n_q, d_model) x (d_model, d_k)
        K = self.project("K", C, self.kv_name, head.W_K)        # (n_k, d_model) x (d_model, d_k)
        V = self.project("V", C, self.kv_name, head.W_V)        # (n_k, d_model) x (d_model, d_v)
        return Q, K, V

    def project(self, id: str, inp: Matrix, name: str, weights: Matrix) -> Matrix:
        result = _exact.matmul(inp, weights)
        rows = self.q_labels if id == "Q" else self.k_labels
        n = "n_q" if id == "Q" else "n_k"
        width = "d_v" if id == "V" else "d_k"
        worked = (_dot(id, 0, 0, inp.row(0), weights.col(0), f"{name.lower()}_1", f"W_{id}[:,1]", result[0, 0]),)
        title = {"Q": "Query projection", "K": "Key projection", "V": "Value projection"}[id]
        why = _WHY[id]
        if name == "C" and id in ("K", "V"):
            why += " Keys and values come from the context: this is cross-attention."
        return self.step(
            Step, id, title, why,
            f"{id} = {name}\\,W_{{{id}}}",
            f"{id} = {name}·W_{id}",
            f"({inp.rows}×{inp.cols})·({weights.rows}×{weights.cols}) → {result.rows}×{result.cols} ({n} × {width})",
            rows, _dims(id.lower(), result.cols), worked=worked, matrix=result,
        ).lazy

    # -- one head: scores to output ------------------------------------------------

    def attention(self, Q: Matrix, K: Matrix, V: Matrix, d_k: int) -> Matrix:
        """Stages 3 to 8 of one head; returns its output (exact)."""
        K_T = self.transpose(K)                                 # (n_k, d_k) -> (d_k, n_k)
        S = self.scores(Q, K_T)                                 # (n_q, d_k) x (d_k, n_k) -> (n_q, n_k)
        S_scaled = self.scaled(S, d_k)                          # (n_q, n_k)
        M = self.mask()                                         # (n_q, n_k): 0 or -inf, plus bias
        S_masked = self.masked(S_scaled, M)                     # (n_q, n_k)
        A = self.softmax(S_masked)                              # (n_q, n_k), rows sum to 1
        return self.output(A, V)                                # (n_q, n_k) x (n_k, d_v) -> (n_q, d_v)

    def transpose(self, K: Matrix) -> Matrix:
        K_T = K.T
        self.step(Step, "K_T", "Transpose the keys", _WHY["K_T"], "K^{\\top}", "Kᵀ",
                  f"{K.rows}×{K.cols} → {K_T.rows}×{K_T.cols} (d_k × n_k)",
                  _dims("k", K_T.rows), self.k_labels, matrix=K_T)
        return K_T

    def scores(self, Q: Matrix, K_T: Matrix) -> Matrix:
        S = _exact.matmul(Q, K_T)
        i, j = 0, 1 if S.cols > 1 else 0
        worked = (_dot("S", i, j, Q.row(i), K_T.col(j), f"q_{i + 1}", f"k_{j + 1}", S[i, j]),)
        return self.step(
            Step, "S", "Scores", _WHY["S"], "S = Q\\,K^{\\top}", "S = Q·Kᵀ",
            f"({Q.rows}×{Q.cols})·({K_T.rows}×{K_T.cols}) → {S.rows}×{S.cols} (n_q × n_k)",
            self.q_labels, self.k_labels, worked=worked, matrix=S,
        ).lazy

    def scaled(self, S: Matrix, d_k: int) -> Matrix:
        p = self.p
        factor = p.scale_for(d_k)
        if p.scale == "auto":
            why = _WHY["S_scaled"]
            formula = f"\\frac{{S}}{{\\sqrt{{d_k}}}} = \\frac{{S}}{{\\sqrt{{{d_k}}}}}"
            text = f"S / √d_k = S / √{d_k}"
        elif p.scale == "none":
            why, formula, text = _WHY["S_scaled_none"], "S", "S (no scaling)"
        else:
            why, formula, text = _WHY["S_scaled_custom"], f"{sympy.latex(factor)}\\cdot S", f"{factor}·S"
        return self.step(
            Step, "S_scaled", "Scale the scores", why, formula, text, f"{S.rows}×{S.cols} (n_q × n_k)",
            self.q_labels, self.k_labels, matrix=_exact.scale(S, factor),
        ).lazy

    def mask(self) -> Matrix:
        p = self.p
        M = _exact.mask_matrix(p.mask.allowed, p.bias)
        why = _WHY["M"] + f" Here the rule is {p.mask.rule()}."
        if p.mask.kind in ("causal", "causal-bottom-right", "sliding-window") and p.n_q != p.n_k:
            shift = p.n_k - p.n_q
            why += (
                f" With {p.n_q} queries and {p.n_k} keys the two causal alignments differ: top-left "
                f"(PyTorch's is_causal) lets query i see keys j ≤ i, bottom-right (FlashAttention's) "
                f"keys j ≤ i {'+' if shift >= 0 else '−'} {abs(shift)}."
            )
        if p.bias is not None:
            why += " The bias is added to it, so M is the mask plus the bias."
        return self.step(
            Step, "M", "The mask", why,
            "M = M_{\\text{mask}} + B" if p.bias is not None else "M",
            "M = mask + bias" if p.bias is not None else "M",
            f"{p.n_q}×{p.n_k} (n_q × n_k)", self.q_labels, self.k_labels, matrix=M,
        ).lazy

    def masked(self, S_scaled: Matrix, M: Matrix) -> Matrix:
        p = self.p
        scaled = {"auto": "\\frac{S}{\\sqrt{d_k}}", "none": "S"}.get(p.scale) if isinstance(p.scale, str) else None
        scaled = scaled or f"{sympy.latex(p.scale)}\\,S"
        return self.step(
            Step, "S_masked", "Add the mask", _WHY["S_masked"],
            f"\\hat{{S}} = {scaled} + M", "Ŝ = S_scaled + M", f"{p.n_q}×{p.n_k} (n_q × n_k)",
            self.q_labels, self.k_labels, matrix=_exact.add_mask(S_scaled, M),
        ).lazy

    # -- weights and output -----------------------------------------------------

    def softmax(self, S_masked: Matrix) -> tuple[SoftmaxRow, ...]:
        rows = _exact.softmax_rows(S_masked)
        why = _WHY["A"]
        if not all(r.is_max for r in rows):
            why += " " + _WHY["A_symbolic"]
        self.step(
            _SoftmaxStep, "A", "Softmax on each row", why,
            "A = \\operatorname{softmax}(\\hat{S})",
            "A[i,j] = exp(Ŝ[i,j] − m_i) / Z_i,  m_i = max_k Ŝ[i,k],  Z_i = Σ_k exp(Ŝ[i,k] − m_i)",
            f"{S_masked.rows}×{S_masked.cols} (n_q × n_k), each row sums to 1",
            self.q_labels, self.k_labels, softmax=rows,
        )
        return rows

    def output(self, rows: tuple[SoftmaxRow, ...], V: Matrix) -> Matrix:
        p = self.p
        return self.step(
            _OutputStep, "O", "Weighted sum of the values", _WHY["O"], "O = A\\,V", "O = A·V",
            f"({p.n_q}×{p.n_k})·({V.rows}×{V.cols}) → {p.n_q}×{V.cols} (n_q × d_v)",
            self.q_labels, _dims("v", V.cols), softmax=rows, values=V,
        ).lazy

    # -- several heads ----------------------------------------------------------

    def concat(self, outputs: list[Matrix]) -> Matrix:
        p = self.p
        concat = _exact.hstack(*outputs)
        widths = " + ".join(str(o.cols) for o in outputs)
        parts = tuple(f"head{h}.O" for h in range(1, len(outputs) + 1))
        formula = "\\operatorname{concat} = \\begin{bmatrix} " + " & ".join(
            f"O^{{({h})}}" for h in range(1, len(outputs) + 1)) + " \\end{bmatrix}"
        return self.step(
            _ConcatStep, "concat", "Concatenate the heads", _WHY["concat"], formula,
            "concat = [" + " | ".join(parts) + "]",
            f"{p.n_q}×({widths}) = {concat.rows}×{concat.cols} (n_q × h·d_v)",
            self.q_labels, _dims("c", concat.cols), matrix=concat, parts=parts,
        ).lazy

    def output_projection(self, concat: Matrix, W_O: Matrix) -> Matrix:
        result = _exact.matmul(concat, W_O)
        return self.step(
            _ProductStep, "O", "Output projection", _WHY["O_proj"],
            "O = \\operatorname{concat}\\,W_O", "O = concat·W_O",
            f"({concat.rows}×{concat.cols})·({W_O.rows}×{W_O.cols}) → {result.rows}×{result.cols} (n_q × d_out)",
            self.q_labels, _dims("o", result.cols), matrix=result, left="concat", right=W_O,
        ).lazy


def _dims(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i + 1}" for i in range(n))


def _tex_name(symbol: str) -> str:
    if "_" in symbol:
        head, tail = symbol.split("_", 1)
        return f"{head}_{{{tail}}}"
    return symbol


def _dot(target, i, j, a: Matrix, b: Matrix, left: str, right: str, value) -> Dot:
    return Dot(target, i, j, left, right, tuple(zip(list(a), list(b))), value)
