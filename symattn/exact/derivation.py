"""The exact derivation: a :class:`Problem` in, an immutable :class:`Derivation` out.

:func:`derive` walks the stage registry (:mod:`symattn.stages.registry`) in the order of the
formula ``softmax(Q Kᵀ / √d_k + M) V`` and, with a backward pass, back from dL/dO to
the inputs. Each stage is a :class:`Step` with a stable id (``"S_scaled"``, or
``"head2.S_scaled"`` with several heads), a title, one sentence of why, the relation,
the shapes and the exact value. Renderers only read steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Iterator

import mpmath
import sympy

from . import arb as _arb
from . import evaluation as _evaluation
from . import lazy as _lazy
from . import rotary as _rotary
from . import softmax as _softmax
from . import structures as _structures
from . import written as _written
from .. import stages
from ..errors import SymattnError
from ..numbers.matrices import Matrix, is_rational
from .arb_ops import ArbOps
from .exact_ops import ExactOps
from .float_ops import FloatOps
from .lazy import LazyMatrix
from .numeric_ops import NumericOps
from .softmax import SoftmaxRow
from ..problem.model import NO_EMBEDDINGS_BACKWARD, Problem, block_backward_refusal
from ..stages.kinds import Dot, Kind
from ..text import did_you_mean

Values = list[list[mpmath.mpf]]

EXACT_LIMIT = _written.EXACT_LIMIT  # the scores (n_q·n_k) above which gradients are shown in decimals
# Up to this many entries, a written-out gradient's exact entries are read to show its exact zeros
# as 0 in decimals (they are built for the worked solution anyway).
ZERO_CHECK_LIMIT = 4096

__all__ = ["Derivation", "Dot", "Step", "derive"]


@dataclass(frozen=True)
class Step:
    """One stage of the derivation.

    ``value`` is the stage's exact value: a matrix, or a structure the worked solution writes
    (the softmax rows of ``A``; ``O = A·V`` over the rows' ``Z_i``; a gradient over ``Z_i²``).
    ``rows`` and ``cols`` label its rows and columns (tokens, or dimension names);
    ``formula`` is the relation in LaTeX and ``formula_text`` the same in plain text;
    ``shape_note`` says how the shapes combine; ``worked`` holds entries worked out in full;
    ``kind_of`` is the stage's row in the registry. ``written_exactly`` is False when the exact
    entries are too long to write out (big gradients): renderers then show decimals only.
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
    value: object = field(default=None, repr=False)
    given: bool = False
    kind_of: Kind | None = field(default=None, repr=False, compare=False)
    written_exactly: bool = True
    axes: tuple[str, str] = (stages.QUERIES, stages.KEYS)  # what the rows and columns stand for

    @property
    def kind(self) -> str:
        """The stage id without its head prefix: ``"head2.A"`` → ``"A"``."""
        return stages.split_id(self.id)[1]

    @property
    def key(self) -> str:
        """The stage's key in the registry (``"O_final"`` for the projected output of several heads)."""
        return self.kind_of.key if self.kind_of is not None else self.kind

    @property
    def head(self) -> int | None:
        """The head this step belongs to (1-based), or None."""
        return stages.split_id(self.id)[0]

    @property
    def shows(self) -> frozenset:
        """The extra pieces a worked solution shows with this step (see the registry)."""
        return self.kind_of.shows if self.kind_of is not None else frozenset()

    @property
    def is_softmax(self) -> bool:
        """Whether the step is the softmax weights themselves (each entry e^{z_ij − m_i} / Z_i)."""
        return isinstance(self.value, _structures.Softmax)

    @property
    def softmax(self) -> tuple[SoftmaxRow, ...]:
        """The softmax rows of ``A`` and ``O`` (empty for every other step)."""
        return self.value.rows if isinstance(self.value, (_structures.Softmax, _structures.Output)) else ()

    @property
    def values(self) -> Matrix | None:
        """``V``, for the output ``O = A·V`` kept over the softmax rows; else None."""
        return self.value.values if isinstance(self.value, _structures.Output) else None

    @property
    def jacobian(self) -> tuple[SoftmaxRow, ...]:
        """The softmax rows a gradient over ``Z_i²`` is written with (empty for other steps)."""
        return self.value.rows if isinstance(self.value, _structures.OverZ2) else ()

    @property
    def over_rows(self):
        """For a sum over the softmax rows (``dV = Aᵀ dO``, ``dK = dSᵀ Q`` and what follows from
        them), ``(i, j) →`` ``(plain, [(r, power, numerator over Z_r^power), ...])``; None for every
        other step."""
        return self.value.fractions if isinstance(self.value, _structures.OverRows) else None

    @property
    def over_z_squared(self):
        """For a gradient through the softmax, ``(i, j) →`` the numerator of entry (i, j) written
        over ``Z_i²``; None for every other step."""
        return self.value.top if isinstance(self.value, _structures.OverZ2) else None

    @cached_property
    def lazy(self) -> "Matrix | LazyMatrix":
        """The exact matrix, with entries built only when read (renderers show corners of big ones)."""
        return _structures.matrix_of(self.value)

    @cached_property
    def exact(self) -> Matrix:
        """The exact matrix as a SymPy ImmutableMatrix (built from the softmax structure for ``A`` and ``O``)."""
        m = self.lazy
        return m.as_matrix() if isinstance(m, LazyMatrix) else m

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), len(self.cols))

    @cached_property
    def value_columns(self) -> "list[list] | None":
        """The columns of ``V`` as QQ numbers, for an output over the softmax rows with rational V; else None."""
        if self.values is None:
            return None
        qq = _lazy.qq_entries(self.values)
        return None if qq is None else [list(col) for col in zip(*qq)]

    def floats(self, dps: int) -> "list[list[float]] | None":
        """Float64 values straight from arb, for rational weights and outputs; else None."""
        if isinstance(self.value, _structures.Softmax):
            both = _softmax.softmax_floats(self.softmax, self._output_values(), dps)
            return None if both is None else both[0]
        if isinstance(self.value, _structures.Output):
            both = _softmax.softmax_floats(self.softmax, self.values, dps)
            return None if both is None or both[1] is None else both[1]
        return None

    def _output_values(self):
        """``V`` of the output made from this step's softmax rows in the same derivation (its
        float64 values come in the same pass as the weights'), or None."""
        derivation = self.derivation
        return None if derivation is None else derivation._outputs_by_rows.get(id(self.value.rows))

    def entry_value(self, i: int, j: int, dps: int, subs) -> "mpmath.mpf | None":
        """Entry (i, j) of the weights or the output alone (from one row of the softmax); else None."""
        if isinstance(self.value, _structures.Softmax):
            return self.softmax[i].evaluate(dps, subs)[j]
        columns = self.value_columns
        if columns is None:
            return None
        return _softmax.weighted_value(self.softmax[i], columns[j], dps)

    @property
    def derivation(self) -> "Derivation | None":
        """The derivation this step belongs to (None for a step made on its own)."""
        return self.__dict__.get("_derivation")


@dataclass(frozen=True)
class Derivation:
    """Every stage of one attention problem, exactly.

    ``last_check`` is the result of the last :func:`symattn.crosscheck` of this derivation (None
    until one has run): the cross-check records it there (:meth:`record_check`), and a
    derivation's summary and notebook page report it. How a derivation and its steps show
    themselves (``repr``, a notebook's displays) is the render side's
    (:class:`symattn.render.display.Derivation`, what :func:`symattn.derive` builds).
    """

    problem: Problem
    steps: tuple[Step, ...]
    # a symattn.CrossCheck (the cross-check comes after the derivation: exact/ does not import it)
    last_check: object = field(default=None, init=False, compare=False, repr=False)
    step_class: ClassVar[type[Step]] = Step  # what :func:`derive` makes each stage with

    def __post_init__(self) -> None:
        for step in self.steps:  # a step shows itself with its derivation's normalisers and decimals
            step.__dict__.setdefault("_derivation", self)

    @cached_property
    def _outputs_by_rows(self) -> dict[int, object]:
        """``V`` of each output, by the identity of the softmax rows it is made from (looked up
        once per softmax step, so a derivation of many heads is not quadratic in their count)."""
        return {id(s.value.rows): s.value.values for s in reversed(self.steps) if isinstance(s.value, _structures.Output)}

    @cached_property
    def _by_id(self) -> dict[str, Step]:
        return {s.id: s for s in self.steps}

    def step(self, id: str) -> Step:
        """The step with this id (``"Q"``, ``"S_scaled"``, ``"head1.A"``, ...)."""
        try:
            return self._by_id[id]
        except KeyError:
            raise SymattnError(f"this problem has no stage {id!r}{did_you_mean(id, self.ids)}; "
                               f"its stages are {', '.join(self.ids)}") from None

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(s.id for s in self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __contains__(self, id: object) -> bool:
        """Whether the derivation has a stage of this id (``"head2.A" in d``), without a tuple of every id."""
        return id in self._by_id

    def record_check(self, check) -> None:
        """Keep ``check`` as :attr:`last_check` (what :func:`symattn.crosscheck` does with its result)."""
        object.__setattr__(self, "last_check", check)  # the one field set after the derivation is made

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

        Softmax weights and outputs are evaluated from the softmax structure, never
        through ``evalf`` of a large expression; gradients and the stages of several heads
        from their relation on the earlier stages' values. Symbols take their ``values``.
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
            cache[key] = self._evaluate(self.step(id), dps, subs)
        return cache[key]

    def _evaluate(self, step: Step, dps: int, subs) -> Values:
        structured = _structures.evaluate_structure(step.value, dps, subs)
        if structured is not None:
            return structured
        exact = step.lazy
        kind = step.kind_of
        if kind is None or not (kind.gradient or kind.by_relation):
            return _evaluation.evaluate(exact, dps, subs)
        if kind.gradient and _lazy.qq_entries(exact) is not None:
            return _evaluation.evaluate(exact, dps)  # rationals: their values, not a rounded product's
        values = self.by_relation(step, dps)
        if step.written_exactly and exact.rows * exact.cols <= ZERO_CHECK_LIMIT:
            # A sum that cancels exactly (its exact entry is 0: a gradient's, or a stage behind the
            # softmax such as the MLP's H_norm = H_hat ∘ γ + β) is 0 in decimals too, not the
            # rounding noise of its terms (such as 1e-45).
            values = [[mpmath.mpf(0) if _exactly_zero(step, i, j) else v for j, v in enumerate(row)]
                      for i, row in enumerate(values)]
        return values

    def by_relation(self, step: Step, dps: int) -> Values:
        """Step ``step`` computed by its relation from the earlier stages' values at ``dps`` digits
        (a rational stage is read exactly)."""
        balls = self._gradient_balls(step, dps)
        if balls is not None:
            return _arb.arb_rows(balls)
        kind, c = step.kind_of, stages.Context(self.problem, step.head)
        ops = NumericOps(dps, self.problem.substitutions)

        def value(key: str, head=...):
            other = self.step(stages.resolve(key, c, head)[0])
            return other.lazy if is_rational(other.lazy) else self.evaluate(other.id, dps)

        return ops.grid(kind.relation(ops, value, c))

    def _gradient_balls(self, step: Step, dps: int):
        """A gradient of a problem without symbols computed by its relation on arb matrices at
        ``dps`` digits (the earlier gradients kept as arb matrices too), or None for any other step."""
        kind = step.kind_of
        if kind is None or not kind.gradient or self.problem.symbols:
            return None
        cache = self.__dict__.setdefault("_balls", {})
        key = (step.id, dps)
        if key not in cache:
            c = stages.Context(self.problem, step.head)
            ops = cache.setdefault(("ops", dps), ArbOps(dps))  # one for every gradient: it keeps transposes

            def value(key: str, head=...):
                other = self.step(stages.resolve(key, c, head)[0])
                balls = self._gradient_balls(other, dps)
                if balls is not None:
                    return balls
                read = (other.id, dps, "read")
                if read not in cache:  # each input read into arb once (X serves dW_Q, dW_K, dW_V, dX)
                    if _lazy.qq_entries(other.lazy) is not None:
                        # rational: read exactly, a row or a column at a time as products ask
                        cache[read] = _arb.arb_lines(other.lazy, dps)
                    else:
                        balls = _structures.arb_structure(other.value, dps)
                        cache[read] = ops.grid(self.evaluate(other.id, dps) if balls is None else balls)
                return cache[read]

            balls = kind.relation(ops, value, c)
            # A product is kept as one until needed whole (a corner shown is a corner computed).
            cache[key] = balls if isinstance(balls, _arb.ArbProducts) else ops.grid(balls)
        return cache[key]

    def entry_values(self, id: str, dps: int = 30):
        """A function ``(i, j) → value at dps digits`` that evaluates only the entries asked for
        when the stage is rational (a renderer showing the corner of a big matrix), and
        reads :meth:`evaluate` otherwise."""
        step = self.step(id)
        if isinstance(step.lazy, _rotary.Balled):  # RoPE's fast path: each entry from its ball
            balls = step.lazy.ball_rows(dps)
            return lambda i, j: mpmath.ninf if balls[i][j] is None else _arb.arb_to_mpf(balls[i][j])
        qq = _lazy.qq_entries(step.lazy)
        if qq is None and (id, dps) not in self.__dict__.get("_evaluated", {}):
            balls = self._gradient_balls(step, dps)
            if balls is not None:  # a gradient: only the entries shown made mpmath numbers
                zeros = step.written_exactly and step.lazy.rows * step.lazy.cols <= ZERO_CHECK_LIMIT

                def entry(i: int, j: int) -> mpmath.mpf:
                    return mpmath.mpf(0) if zeros and _exactly_zero(step, i, j) else _arb.arb_rows_entry(balls, i, j)

                return entry
        if qq is None or self.problem.symbols:
            subs = self.problem.substitutions
            if step.softmax and subs is not None and (id, dps) not in self.__dict__.get("_evaluated", {}):
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
            return mpmath.ninf if x is None else _evaluation.mpf_of_qq(x, prec)

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
                values = _evaluation.approx(step.lazy)
                if values is None:
                    values = step.floats(30)
                if values is None:  # a gradient: its 30-digit arb values rounded, no mpmath number made
                    values = self._gradient_floats(step)
            if values is None:
                values = [[_float(v) for v in row] for row in self.evaluate(id, 30)]
            cache[id] = numpy.asarray(values, dtype=numpy.float64)
        return cache[id]

    def _gradient_floats(self, step: Step) -> "list[list[float]] | numpy.ndarray | None":
        """A gradient's values as float64, 0 where its exact entry is 0 (as :meth:`evaluate` gives
        them); None for any other step.

        The cross-check compares them with NumPy's float64 backward pass, so they are computed by
        their relation in float64 from the earlier stages' float64 values, when every earlier stage
        lies well inside float64's range and so does the result; else from the 30-digit arb values
        (NaN beyond float64's range, which turns the cross-check off)."""
        import numpy

        kind = step.kind_of
        if kind is None or not kind.gradient or self.problem.symbols:
            return None
        values = self._float_relation(step)
        if values is None:
            values = _arb.arb_floats(self._gradient_balls(step, 30))
        exact = step.lazy
        if step.written_exactly and exact.rows * exact.cols <= ZERO_CHECK_LIMIT:
            values = [[0.0 if _exactly_zero(step, i, j) else v for j, v in enumerate(row)]
                      for i, row in enumerate(values)]
        return values

    def _float_relation(self, step: Step) -> "numpy.ndarray | None":
        """A gradient by its relation in float64 (see :meth:`_gradient_floats`), or None when an input
        or the result is not well inside float64's range."""
        import numpy

        c = stages.Context(self.problem, step.head)
        ops = FloatOps()
        inputs_ok = True

        def value(key: str, head=...):
            nonlocal inputs_ok
            other = self.step(stages.resolve(key, c, head)[0])
            values = self.approx(other.id)
            if not numpy.isfinite(values).all() or (values.size and numpy.abs(values).max() > _FLOAT_SAFE):
                inputs_ok = False
            return values

        result = numpy.asarray(ops.grid(step.kind_of.relation(ops, value, c)), dtype=numpy.float64)
        if not inputs_ok or not numpy.isfinite(result).all() or (result.size and numpy.abs(result).max() > _FLOAT_SAFE):
            return None
        return result


_FLOAT_SAFE = 1e100  # values below this, and products and sums of a few thousand of them, stay finite


def _float(x: mpmath.mpf) -> float:
    """``x`` as float64; NaN when it is finite but beyond float64's range (not ±inf, which
    would pass for a masked position)."""
    value = float(x)
    return float("nan") if math.isinf(value) and not mpmath.isinf(x) else value


def derive(problem: Problem, *, on_step=None, cls: type[Derivation] = Derivation) -> Derivation:
    """Derive every stage of ``softmax(Q Kᵀ·scale + M) V`` exactly (and, with a backward
    section, every gradient), stage by stage as the registry lists them.

    ``cls`` is the class of the derivation made (a subclass of :class:`Derivation`), its stages
    made with its ``step_class``: :func:`symattn.derive` makes the one that shows itself in a
    terminal and a notebook.

    >>> from symattn import load_problem
    >>> p = load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nscale: none\\n")
    >>> derive(p).step("A").exact
    Matrix([[1/(exp(-1) + 1), exp(-1)/(exp(-1) + 1)]])
    """
    if getattr(problem, "embeddings_norm", None) is not None and problem.backward is not None:
        raise SymattnError(NO_EMBEDDINGS_BACKWARD, file=problem.source, field="backward")
    refusal = problem.backward is not None and block_backward_refusal(problem.backward, problem.mlp, problem.logits,
                                                                      problem.loss)
    if refusal:  # a loss on H would skip the MLP and the head
        raise SymattnError(refusal, file=problem.source, field="backward")
    values: dict[str, object] = {}
    shown: dict[str, bool] = {}  # whether each stage so far is written exactly
    steps: list[Step] = []
    for planned in stages.plan(problem):
        try:
            step = _step(planned, values, cls.step_class, shown)
        except SymattnError as exc:
            if exc.file is not None:
                raise
            lin = getattr(problem, "linear", None)  # a normaliser of 0: reported at the linear field
            line, col = (lin.line, lin.col) if lin is not None and exc.field == "linear" else (None, None)
            raise SymattnError(exc.message, file=problem.source, line=line, col=col, field=exc.field) from None
        values[step.id] = step.value
        shown[step.id] = step.written_exactly
        steps.append(step)
        if on_step is not None:
            on_step(step.id)  # the progress display
    return cls(problem, tuple(steps))


def _exactly_zero(step: Step, i: int, j: int) -> bool:
    """Whether the exact entry (i, j) of a stage computed by its relation is 0: a gradient's sum over
    the rows' ``Z_i`` whose terms all cancel (gathered, as the worked solution writes it), or an
    entry equal to 0."""
    value = step.value
    if isinstance(value, _structures.OverRows) and value.plain is None and not value.tops(i, j):
        return True
    return step.lazy[i, j] == 0


def _step(planned: stages.Planned, values: dict, step_class: type[Step] = Step, shown: dict | None = None) -> Step:
    """One stage: its exact value (given, or by its relation on the earlier values) and how it is shown."""
    kind, c, p = planned.kind, planned.c, planned.c.p

    def value(key: str, head=...):
        return values[stages.resolve(key, c, head)[0]]

    given = kind.is_given(c)
    ops = ExactOps(expand=not kind.gradient)
    result = kind.source(c) if given else kind.relation(ops, value, c)
    shape = _structures.shape_of(result)
    why = kind.text("why", c) + (kind.note(result) if kind.note is not None and not given else "")
    formula, formula_text = kind.text("formula", c)
    inputs_shown = shown is None or all(shown.get(i, True) for i in stages.input_ids(kind, c))
    written = _written.written(kind, result, c, values, ops, given, inputs_shown)
    matrix = _structures.matrix_of(result)
    axes = kind.text("axes", c)
    return step_class(
        planned.id, kind.text("title", c), why, formula, formula_text,
        kind.shape(lambda key, head=...: _structures.shape_of(value(key, head)), shape, c),
        *(_labels(axis, n, p) for axis, n in zip(axes, shape)),
        worked=kind.worked(value, matrix, c) if kind.worked is not None and not given else (),
        value=result, given=given, kind_of=kind, written_exactly=written, axes=axes,
    )


def _labels(axis: str, n: int, p: Problem) -> tuple[str, ...]:
    """Row or column labels: the query or key tokens, or numbered dimensions (d1, d2, ...)."""
    if axis == stages.QUERIES:
        return p.tokens
    if axis == stages.KEYS:
        return p.key_tokens
    if axis == stages.CACHED:  # the keys in the cache when token t is decoded
        return tuple(p.key_tokens[j] for j in p.mask.cache_rows(p.decode))[:n]
    if axis == stages.NEW:  # the decoded token
        return p.tokens[p.decode - 1:p.decode]
    if axis == stages.STEPS:  # the decoding steps t = 1..n
        return tuple(f"t = {t}" for t in range(1, n + 1))
    if axis == stages.COSTS:
        return stages.COST_COLUMNS[:n]
    if axis == stages.CACHE_KINDS:
        return stages.cache_kinds(p)
    if axis == stages.CACHE_WIDTHS:
        return stages.CACHE_WIDTH_COLUMNS[:n]
    if axis == stages.STATE_COSTS:
        return stages.STATE_COST_COLUMNS[:n]
    if axis == stages.CAP_ROWS:  # one row's weights without the cap, then with it
        return ("no cap", f"c = {sympy.sstr(p.softcap)}")
    if axis == stages.TEMP_ROWS:  # one row's weights at T = 1, then at the problem's T
        return ("T = 1", f"T = {sympy.sstr(p.temperature)}")
    if axis in (stages.MEAN, stages.VARIANCE, stages.MEAN_SQUARE, stages.SINK_AXIS, stages.NORMALISER,
                stages.ROW_SUM):  # one column: what it holds
        return (axis,)
    if axis == stages.LAST:  # the last position's row (the logits of rows: last)
        return p.tokens[-1:]
    if axis == stages.VOCAB:  # a column per word of the vocabulary: its word, or its id
        return tuple(p.logits.word(j) for j in range(n))
    if axis == stages.LOSS_ROWS:  # the rows the loss takes, each with its target word
        tokens = p.tokens[-1:] if p.logits.last else p.tokens
        return tuple(f"{tokens[r]} → {p.logits.word(t)}" for r, t in zip(p.loss.rows, p.loss.targets))
    if axis in (stages.NLL_AXIS, stages.LOSS_AXIS):
        return (axis,)
    return tuple(f"{axis}{i + 1}" for i in range(n))
