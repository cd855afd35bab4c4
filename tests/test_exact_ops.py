"""The contract of the relations' operations: every backend of :class:`symattn.exact.ops.Ops`
implements every operation, and gives the same values.

Each operation runs on small problems (rational, with √, with a causal mask and its −∞, with RoPE)
through ExactOps, NumericOps, ArbOps and FloatOps, its inputs fed as the derivation feeds them. The
exact result, evaluated at ``REF_DPS`` digits, is the reference; each backend's values must lie
within its own precision of it. ArbOps and FloatOps serve the gradients' relations only: the
mask and the softmax they refuse (NumericOps computes them), and they are never asked for the
forward-only operations (rows, RoPE, the tiled softmax).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import mpmath
import numpy
import pytest
import sympy
from sympy import QQ, Rational, sqrt

import flint
from symattn.exact import structures
from symattn.exact.arb import ArbProducts, ArbTransposed, arb_lines, arb_rows
from symattn.exact.arb_ops import ArbOps
from symattn.exact.evaluation import evaluate
from symattn.exact.exact_ops import ExactOps
from symattn.exact.float_ops import FloatOps
from symattn.exact.numeric_ops import NumericOps
from symattn.exact.ops import Ops
from symattn.numbers.matrices import Matrix, is_rational, rational_matrix

ROOT = Path(__file__).resolve().parent.parent
REF_DPS = 60  # the exact results' digits: far beyond every backend's own
DPS = 30  # the digits NumericOps and ArbOps work at
BACKENDS = (ExactOps, NumericOps, ArbOps, FloatOps)
PROTOCOL = sorted(name for name, member in vars(Ops).items() if inspect.isfunction(member) and not name.startswith("_"))
# What ArbOps and FloatOps serve: the operations of the gradients' relations (and the plain ones).
GRADIENT_OPS = frozenset({"matmul", "T", "add_row", "col_sums", "scale", "softmax_backward", "hstack", "vstack", "block",
                          "softcap",
                          "sum", "sub", "ones", "given", "is_rational", "rational", "table", "times_row", "hadamard",
                          "normalise_backward"})
LEFT_TO_NUMERIC = ("mask", "add_mask", "softmax", "sink_weight", "row_mean", "row_spread", "normalise",
                   "divide_rows")  # ArbOps and FloatOps refuse these
# The operations only the common mistakes call (on NumericOps), beside the protocol's.
MISTAKE_OPS = frozenset({"columns_attend", "jacobian_diagonal", "zero_masked", "column_softmax", "grid"})


def _make(backend):
    return {ExactOps: lambda: ExactOps(), NumericOps: lambda: NumericOps(DPS), ArbOps: lambda: ArbOps(DPS),
            FloatOps: lambda: FloatOps()}[backend]()


def _tolerance(ops) -> mpmath.mpf:
    """The error a backend's entry may have, relative to the scale of the problem's numbers (see
    ``_scale``): NumericOps works at ``DPS`` + 10 digits and ArbOps at ``prec_bits(DPS)`` bits, so
    10^−DPS leaves ten digits for the few roundings of these small problems; FloatOps rounds each
    input once and each operation at most ``k + 2`` times for a sum of k ≤ 6 terms (unit roundoff
    2^−53), so 16 roundings bound it."""
    if isinstance(ops, FloatOps):
        return mpmath.mpf(2) ** -53 * 16
    if isinstance(ops, ExactOps):
        return mpmath.mpf(10) ** -(REF_DPS - 5)
    return mpmath.mpf(10) ** -DPS


def _scale(*exact) -> mpmath.mpf:
    """A bound on the terms of an entry: (the largest input entry, at least 1)² times the widest
    dimension (a sum of that many products)."""
    biggest, width = mpmath.mpf(1), 1
    for m in exact:
        for row in evaluate(m, 20):
            for x in row:
                if not mpmath.isinf(x):
                    biggest = max(biggest, abs(x))
        width = max(width, m.rows, m.cols)
    return biggest ** 2 * width


# -- the problems --------------------------------------------------------------------------------


def _q(rows: int, cols: int, entries) -> Matrix:
    return rational_matrix(rows, cols, [QQ(Rational(x).p, Rational(x).q) for x in entries])


RATIONAL = {
    "a": _q(3, 2, ["1/2", "-3/4", 2, "5/3", "-1", "7/8"]),
    "b": _q(2, 3, ["2/5", 1, "-1/3", "3/2", "-2", "1/7"]),
    "c": _q(3, 2, ["-1/6", "4/5", 3, "-2/9", "1/4", 0]),
    "s": _q(3, 3, ["1/2", "-1", "3/4", "2/3", 0, "-5/4", 1, "1/5", "-2/7"]),
    "g": _q(3, 3, ["1", "-1/2", "1/3", "-2/3", "3/4", "1/6", "1/8", "-1", "2/5"]),
    "row": _q(1, 2, ["1/3", "-5/2"]),
    "z": _q(3, 1, ["2/3", "-5", "7/4"]),  # normalisers: none 0
}
SURD = {
    "a": Matrix([[sqrt(2), Rational(-1, 2)], [1 + sqrt(3), Rational(2, 3)], [Rational(1, 4), -sqrt(5) / 2]]),
    "b": Matrix([[Rational(1, 2), sqrt(2), -1], [sqrt(3) / 3, Rational(1, 5), 2]]),
    "c": Matrix([[Rational(1, 3), sqrt(7)], [-sqrt(2), Rational(3, 4)], [2, Rational(-1, 6)]]),
    "s": Matrix([[sqrt(2) / 2, -1, Rational(1, 3)], [Rational(2, 5), sqrt(3), -sqrt(2)], [1, Rational(-1, 4), sqrt(5) / 5]]),
    "g": Matrix([[1, -sqrt(2), Rational(1, 3)], [Rational(-2, 3), Rational(3, 4), sqrt(3)], [sqrt(5), -1, Rational(2, 5)]]),
    "row": Matrix([[sqrt(2), Rational(-1, 3)]]),
    "z": Matrix([[1 + sqrt(2)], [Rational(-3, 2)], [sqrt(5) / 3]]),
}
PROBLEMS = {"rational": RATIONAL, "surd": SURD}
CAUSAL = [[True, False, False], [True, True, False], [True, True, True]]
EVERYWHERE = [[True] * 3 for _ in range(3)]
MASKS = {"causal": CAUSAL, "none": EVERYWHERE}
THETAS = [Rational(1, 2)]  # RoPE on pairs (0, 1): a rational angle, so cos and sin are exact and irrational
PAIRS = [(0, 1)]


# -- feeding, reading ------------------------------------------------------------------------------


def _feed(ops, m):
    """An exact matrix as the derivation hands it to a relation on this backend."""
    if isinstance(ops, ExactOps):
        return m
    if isinstance(ops, FloatOps):
        return ops.grid(m)  # its float64 values (Derivation.approx)
    if isinstance(ops, ArbOps):
        return arb_lines(m, DPS) if is_rational(m) else ops.grid(evaluate(m, DPS))
    return m if is_rational(m) else ops.given(m)  # NumericOps: rationals read exactly, the rest evaluated


def _values(x, dps: int = REF_DPS) -> list[list[mpmath.mpf]]:
    """Any backend's value as rows of mpmath numbers."""
    if isinstance(x, numpy.ndarray):
        return [[mpmath.mpf(float(v)) for v in row] for row in x]
    if isinstance(x, (ArbProducts, ArbTransposed)):
        return arb_rows(x.whole())
    if isinstance(x, flint.arb_mat):
        return arb_rows(x)
    if isinstance(x, list):
        return [[mpmath.mpf(v) for v in row] for row in x]
    structured = structures.evaluate_structure(x, dps, None)
    if structured is not None:
        return structured
    return evaluate(structures.matrix_of(x), dps)


def _agree(got, want, tolerance, what: str) -> None:
    with mpmath.workdps(REF_DPS + 10):  # the comparison itself rounds nothing that matters
        _compare(_values(got), _values(want), tolerance, what)


def _compare(got, want, tolerance, what: str) -> None:
    assert (len(got), len(got[0]) if got else 0) == (len(want), len(want[0]) if want else 0), (what, "shape")
    for i, (g_row, w_row) in enumerate(zip(got, want)):
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            if mpmath.isinf(w):
                assert g == w, (what, i, j, g, w)
            else:
                assert abs(g - w) <= tolerance, (what, i, j, g, w, tolerance)


def _weights(ops, problem, allowed):
    """The softmax of the masked scores on this backend (ArbOps and FloatOps are given
    NumericOps' weights, as the derivation gives them the forward pass's values)."""
    if isinstance(ops, (ArbOps, FloatOps)):
        numeric = NumericOps(REF_DPS)
        weights = numeric.softmax(numeric.add_mask(numeric.given(problem["s"]), numeric.mask(allowed, None)))
        return ops.grid(weights)
    return ops.softmax(ops.add_mask(_feed(ops, problem["s"]), ops.mask(allowed, None)))


# Each case: (the operation, the inputs whose entries bound the terms, what it computes on a backend).
CASES = {
    "matmul": ("matmul", ("a", "b"), lambda ops, p, m: ops.matmul(_feed(ops, p["a"]), _feed(ops, p["b"]))),
    "matmul_T": ("T", ("a", "c"), lambda ops, p, m: ops.matmul(ops.T(_feed(ops, p["a"])), _feed(ops, p["c"]))),
    "T": ("T", ("a",), lambda ops, p, m: ops.T(_feed(ops, p["a"]))),
    "add_row": ("add_row", ("a", "row"), lambda ops, p, m: ops.add_row(_feed(ops, p["a"]), _feed(ops, p["row"]))),
    "col_sums": ("col_sums", ("a",), lambda ops, p, m: ops.col_sums(_feed(ops, p["a"]))),
    "scale": ("scale", ("a",), lambda ops, p, m: ops.scale(_feed(ops, p["a"]), ops.rational(-3, 7))),
    "scale_surd": ("scale", ("a",), lambda ops, p, m: ops.scale(_feed(ops, p["a"]), 1 / sqrt(2))),
    "mask": ("mask", ("s",), lambda ops, p, m: ops.mask(MASKS[m], None)),
    "mask_bias": ("mask", ("s",), lambda ops, p, m: ops.mask(MASKS[m], p["g"])),
    "add_mask": ("add_mask", ("s",), lambda ops, p, m: ops.add_mask(_feed(ops, p["s"]), ops.mask(MASKS[m], None))),
    "softmax": ("softmax", ("s",), lambda ops, p, m: ops.softmax(_masked(ops, p, m))),
    "softmax_sink": ("softmax", ("s",), lambda ops, p, m: ops.softmax(_masked(ops, p, m), sink=Rational(1, 2))),
    "softmax_sink_surd": ("softmax", ("s",), lambda ops, p, m: ops.softmax(_masked(ops, p, m), sink=-sqrt(2))),
    "sink_weight": ("sink_weight", ("s",),
                    lambda ops, p, m: ops.sink_weight(ops.softmax(_masked(ops, p, m), sink=Rational(-1, 3)))),
    "attention": ("matmul", ("s", "c"), lambda ops, p, m: ops.matmul(_weights(ops, p, MASKS[m]), _feed(ops, p["c"]))),
    "softmax_backward": ("softmax_backward", ("s", "g"),
                         lambda ops, p, m: ops.softmax_backward(_weights(ops, p, MASKS[m]), _feed(ops, p["g"]))),
    "hstack": ("hstack", ("a", "c"), lambda ops, p, m: ops.hstack([_feed(ops, p["a"]), _feed(ops, p["c"])])),
    "vstack": ("vstack", ("a", "c"), lambda ops, p, m: ops.vstack([_feed(ops, p["a"]), _feed(ops, p["c"])])),
    "vstack_rows": ("vstack", ("s",), lambda ops, p, m: ops.vstack([ops.rows(_feed(ops, p["s"]), 2, 1),
                                                                   ops.rows(_feed(ops, p["s"]), 0, 1)])
                    if type(ops) in (ExactOps, NumericOps) else ops.vstack([_feed(ops, p["s"][2:3, :]),
                                                                                _feed(ops, p["s"][0:1, :])])),
    "softcap": ("softcap", ("s",), lambda ops, p, m: ops.softcap(_feed(ops, p["s"]), Rational(1, 2))),
    "softcap_surd": ("softcap", ("a",), lambda ops, p, m: ops.softcap(_feed(ops, p["a"]), sqrt(3))),
    "block": ("block", ("b",), lambda ops, p, m: ops.block(_feed(ops, p["b"]), 1, 2)),
    "sum": ("sum", ("a", "c"), lambda ops, p, m: ops.sum([_feed(ops, p["a"]), _feed(ops, p["c"]), _feed(ops, p["a"])])),
    "rows": ("rows", ("a",), lambda ops, p, m: ops.rows(_feed(ops, p["a"]), 1, 2)),
    "table": ("table", (), lambda ops, p, m: ops.table([[1, 2, 3], [4, 5, 6]])),
    "sub": ("sub", ("a", "c"), lambda ops, p, m: ops.sub(_feed(ops, p["a"]), _feed(ops, p["c"]))),
    "difference": ("difference", ("a", "c"), lambda ops, p, m: ops.difference(_feed(ops, p["a"]), _feed(ops, p["c"]))),
    "ones": ("ones", (), lambda ops, p, m: ops.ones(2, 3)),
    "given": ("given", ("g",), lambda ops, p, m: ops.given(p["g"])),
    "rotate": ("rotate", ("a",), lambda ops, p, m: ops.rotate(_feed(ops, p["a"]), THETAS, PAIRS)),
    "rotate_back": ("rotate", ("a",), lambda ops, p, m: ops.rotate(_feed(ops, p["a"]), THETAS, PAIRS, sign=-1, offset=2)),
    "row_mean": ("row_mean", ("a",), lambda ops, p, m: ops.row_mean(_feed(ops, p["a"]))),
    "row_spread": ("row_spread", ("a",), lambda ops, p, m: ops.row_spread(_feed(ops, p["a"]), ops.row_mean(_feed(ops, p["a"])))),
    "row_spread_rms": ("row_spread", ("a",), lambda ops, p, m: ops.row_spread(_feed(ops, p["a"]), None)),
    "row_spread_unbiased": ("row_spread", ("s",),
                            lambda ops, p, m: ops.row_spread(_feed(ops, p["s"]), ops.row_mean(_feed(ops, p["s"])), 1)),
    "normalise": ("normalise", ("s",), lambda ops, p, m: _normalised(ops, p, rms=False)),
    "normalise_rms": ("normalise", ("s",), lambda ops, p, m: _normalised(ops, p, rms=True)),
    "normalise_outside": ("normalise", ("s",), lambda ops, p, m: _normalised(ops, p, rms=False, inside=False)),
    "normalise_times": ("normalise", ("s", "g"),  # a normalised matrix times weights, then its scores
                        lambda ops, p, m: ops.matmul(_normed_q(ops, p), ops.T(_normed_q(ops, p)))),
    "times_row": ("times_row", ("a", "row"), lambda ops, p, m: ops.times_row(_feed(ops, p["a"]), _feed(ops, p["row"]))),
    "hadamard": ("hadamard", ("a", "c"), lambda ops, p, m: ops.hadamard(_feed(ops, p["a"]), _feed(ops, p["c"]))),
    "normalise_backward": ("normalise_backward", ("s",), lambda ops, p, m: _back_through(ops, p, centred=True)),
    "normalise_backward_rms": ("normalise_backward", ("s",), lambda ops, p, m: _back_through(ops, p, centred=False)),
    **{f"activate_{name}": ("activate", ("s",), lambda ops, p, m, name=name: ops.activate(_feed(ops, p["s"]), name))
       for name in ("relu", "relu2", "gelu", "gelu-tanh", "silu", "elu1", "identity")},
    "divide_rows": ("divide_rows", ("a", "z"), lambda ops, p, m: ops.divide_rows(_feed(ops, p["a"]), _feed(ops, p["z"]))),
    "row_softmax": ("row_softmax", ("s",), lambda ops, p, m: ops.row_softmax(_feed(ops, p["s"]))),
    "nll": ("nll", ("s",), lambda ops, p, m: ops.nll(_feed(ops, p["s"]), [2, 0], [0, 2])),
    "nll_bits": ("nll", ("s",), lambda ops, p, m: ops.nll(_feed(ops, p["s"]), [1], [1], "log2")),
    "tiled_max": ("tiled_max", ("s",), lambda ops, p, m: ops.tiled_max(_masked(ops, p, m), 2)),
    "tiled_sums": ("tiled_sums", ("s",), lambda ops, p, m: ops.tiled_sums(*_tiled(ops, p, m)[:2], 2)),
    "tiled_acc": ("tiled_acc", ("s", "c"), lambda ops, p, m: ops.tiled_acc(*_tiled(ops, p, m), 2)),
    "tiled_output": ("tiled_output", ("s", "c"), lambda ops, p, m: _tiled_output(ops, p, m)),
}


def _normalised(ops, p, rms: bool, inside: bool = True):
    x = _feed(ops, p["s"])
    mu = None if rms else ops.row_mean(x)
    return ops.normalise(x, mu, ops.row_spread(x, mu), Rational(1, 10), inside)


def _back_through(ops, p, centred: bool):
    """Back through a norm of ``s`` (ε = 1/10) from a gradient of its normalised rows (``s``ᵀ). ArbOps and
    FloatOps are given NumericOps' normalised rows, as the derivation gives them the forward pass's values."""
    x = p["s"]
    numeric = NumericOps(REF_DPS) if isinstance(ops, (ArbOps, FloatOps)) else ops
    mu = numeric.row_mean(x) if centred else None
    spread = numeric.row_spread(x, mu)
    hat = numeric.normalise(x, mu, spread, Rational(1, 10))
    if numeric is not ops:
        hat, spread = ops.grid(hat), ops.grid(spread)
    return ops.normalise_backward(ops.T(_feed(ops, p["s"])), hat, spread, Rational(1, 10), centred)


def _normed_q(ops, p):
    """(normalised rows ∘ row + bias)·g: what a projection of X_norm computes (RowScaled in ExactOps)."""
    y = ops.times_row(_normalised(ops, p, rms=False), _feed(ops, p["g"][0:1, :] if not isinstance(p["g"], list) else p["g"]))
    return ops.matmul(ops.add_row(y, _feed(ops, p["g"][1:2, :])), _feed(ops, p["g"]))


def _masked(ops, p, m):
    return ops.add_mask(_feed(ops, p["s"]), ops.mask(MASKS[m], None))


def _tiled(ops, p, m):
    z = _masked(ops, p, m)
    return z, ops.tiled_max(z, 2), _feed(ops, p["c"])


def _tiled_output(ops, p, m):
    z, maxima, v = _tiled(ops, p, m)
    return ops.tiled_output(ops.tiled_acc(z, maxima, v, 2), ops.tiled_sums(z, maxima, 2))


def _serves(backend, operation: str) -> bool:
    return backend in (ExactOps, NumericOps) or operation in GRADIENT_OPS


# -- the tests -----------------------------------------------------------------------------------------


def test_the_cases_exercise_every_operation():
    used = {name for name, _, _ in CASES.values()} | {"rational", "is_rational"}  # those two: in cases and below
    assert used == set(PROTOCOL), set(PROTOCOL) ^ used


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
def test_every_backend_implements_every_operation(backend):
    """Each backend declares Ops and defines each of its operations itself (not Ops' placeholder),
    taking at least the protocol's parameters, in its order and with its defaults."""
    assert Ops in backend.__mro__, f"{backend.__name__} does not declare Ops"
    for name in PROTOCOL:
        member = getattr(backend, name)
        assert member is not vars(Ops)[name], f"{backend.__name__} does not implement {name}"
        want = list(inspect.signature(vars(Ops)[name]).parameters.values())
        have = list(inspect.signature(member).parameters.values())
        assert [p.name for p in have[:len(want)]] == [p.name for p in want], (backend.__name__, name)
        assert [p.default for p in have[:len(want)]] == [p.default for p in want], (backend.__name__, name)
        assert all(p.default is not inspect.Parameter.empty for p in have[len(want):]), (backend.__name__, name)


def test_a_backend_that_loses_an_operation_is_seen():
    """The check above is not vacuous: a backend without one of its own operations falls back on
    Ops' placeholder, which is what it looks for."""
    lost = type("Lost", (Ops,), {name: getattr(ExactOps, name) for name in PROTOCOL if name != "col_sums"})
    assert getattr(lost, "col_sums") is vars(Ops)["col_sums"]
    with pytest.raises(NotImplementedError):
        lost().col_sums(RATIONAL["a"])


def test_the_relations_call_only_declared_operations():
    """Every ``ops.<name>`` in the stage registry is an operation of Ops (or one of NumericOps'
    operations for the common mistakes)."""
    called = set()
    for path in sorted((ROOT / "symattn" / "stages").glob("*.py")):  # the registry and its helpers
        tree = ast.parse(path.read_text(encoding="utf-8"))
        called |= {node.attr for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ops"}
    assert called, "no ops.<name> found: the check reads the wrong file"
    assert called - set(PROTOCOL) <= MISTAKE_OPS, called - set(PROTOCOL) - MISTAKE_OPS
    assert all(callable(getattr(NumericOps, name, None)) for name in MISTAKE_OPS)


@pytest.mark.parametrize("case, problem, mask, backend", [
    pytest.param(case, problem, mask, backend, id=f"{case}-{problem}-{mask}-{backend.__name__}")
    for case in sorted(CASES) for problem in sorted(PROBLEMS) for mask in sorted(MASKS) for backend in BACKENDS
    if _serves(backend, CASES[case][0])])
def test_every_backend_agrees_with_the_exact_values(case, problem, mask, backend):
    operation, inputs, run = CASES[case]
    p = PROBLEMS[problem]
    want = run(ExactOps(), p, mask)
    ops = _make(backend)
    got = run(ops, p, mask)
    tolerance = _tolerance(ops) * _scale(*[p[k] for k in inputs])
    _agree(got, want, tolerance, (case, problem, mask, backend.__name__))


@pytest.mark.parametrize("backend", (ArbOps, FloatOps), ids=lambda b: b.__name__)
def test_the_forward_operations_are_left_to_numeric_ops(backend):
    """ArbOps and FloatOps refuse the mask, adding it, the softmax and the norm's forward operations
    (γ's product serves the backward pass, dX̂ = dX_norm ∘ γ): never a wrong value."""
    ops = _make(backend)
    s = RATIONAL["s"]
    calls = {"mask": lambda: ops.mask(CAUSAL, None), "add_mask": lambda: ops.add_mask(ops.grid(s), None),
             "softmax": lambda: ops.softmax(ops.grid(s)), "sink_weight": lambda: ops.sink_weight(ops.grid(s)),
             "row_mean": lambda: ops.row_mean(ops.grid(s)),
             "row_spread": lambda: ops.row_spread(ops.grid(s), None),
             "normalise": lambda: ops.normalise(ops.grid(s), None, ops.grid(RATIONAL["a"]), 0),
             "divide_rows": lambda: ops.divide_rows(ops.grid(RATIONAL["a"]), ops.grid(RATIONAL["z"]))}
    assert set(calls) == set(LEFT_TO_NUMERIC)
    for name, call in calls.items():
        with pytest.raises(NotImplementedError):
            call()


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
def test_rational_and_is_rational(backend):
    ops = _make(backend)
    assert ops.rational(-6, 4) == Rational(-3, 2) and isinstance(ops.rational(1, 3), sympy.Rational)
    assert ops.is_rational(RATIONAL["a"]) is True  # an exact rational matrix, read exactly
    assert ops.is_rational(SURD["a"]) is False


def test_the_comparison_sees_a_wrong_value():
    """The comparison is not vacuous: a value off by the smallest change NumericOps can see fails."""
    want = ExactOps().matmul(RATIONAL["a"], RATIONAL["b"])
    got = [list(row) for row in _values(NumericOps(DPS).matmul(RATIONAL["a"], RATIONAL["b"]))]
    got[1][2] += mpmath.mpf(10) ** -(DPS - 2)
    with pytest.raises(AssertionError):
        _agree(got, want, _tolerance(NumericOps(DPS)) * _scale(RATIONAL["a"], RATIONAL["b"]), "matmul")
