"""The fast paths of a model-sized block and head give what the general paths give.

A big float matrix read from a checkpoint keeps its floats and makes its fmpq_mat only when an
operation needs it whole (``symattn.numbers.dyadic``); rows of mpmath numbers times such a matrix
are multiplied exactly in float64 slices (``integer_product``, ``arb.float_product``); the MLP's
activation is evaluated in ball arithmetic; the likeliest words are ranked from float64 first.
Each is compared here with an independent computation: ``fractions.Fraction``, mpmath at 60
digits, flint's fmpq_mat, the general path with the fast one switched off.

Run with:
    python -m pytest -q tests/test_block_fast_paths.py
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy

from symattn.exact import arb as _arb
from symattn.exact import block as _block
from symattn.exact import lazy as _lazy
from symattn.numbers import dyadic
from symattn.numbers.parse import matrix_float64
from symattn.numbers.sympy_internals import deferred_source, qq_dense
from symattn.render import head as _head

EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"


def _floats(rng, shape, spread: float = 0.02):
    """float32 numbers as float64, over a wide range of sizes (a tiny one, a large one, zeros)."""
    values = (rng.standard_normal(shape) * spread).astype(np.float32).astype(np.float64)
    values.flat[0] = np.float32(3e-30)
    values.flat[-1] = -np.float32(12345.5)
    values.flat[len(values.flat) // 2] = 0.0
    return values


@pytest.mark.parametrize("n, k, m", [(1, 1, 1), (2, 7, 5), (3, 300, 40), (1, 40, 9000)])
def test_integer_product_is_the_exact_product(n, k, m):
    rng = np.random.default_rng(n * 1000 + k)
    b = _floats(rng, (k, m))
    gen = random.Random(k)
    a = [[gen.choice([0, gen.randint(-2**150, 2**150), gen.randint(-5, 5)]) for _ in range(k)] for _ in range(n)]
    rows, power = dyadic.integer_product(a, b)
    for i in range(n):
        for j in sorted({0, m - 1, m // 2, m // 3}):
            exact = sum(Fraction(a[i][t]) * Fraction(float(b[t, j])) for t in range(k))
            assert Fraction(rows[i][j], 2**power) == exact


@pytest.mark.parametrize("b", [[[1e-300, 1e300]], [[1.0, np.inf]], [[np.nan, 1.0]], [[5e-324, 1.0]]])
def test_integer_product_declines_what_it_cannot_slice(b):
    assert dyadic.integer_product([[1]], np.array(b)) is None


def test_float_product_matches_mpmath_at_60_digits_and_the_arb_path():
    rng = np.random.default_rng(3)
    W = dyadic.float_matrix(_floats(rng, (50, 30)).astype(np.float32))
    with mpmath.workdps(40):
        a = [[mpmath.mpf(rng.standard_normal()) / 7 + mpmath.mpf(1) / 3 for _ in range(50)] for _ in range(4)]
    fast = _arb.float_product(a, W, 30)
    assert fast is not None
    with _arb.arb_precision(30):
        slow = _arb.arb_operand(a) * _arb.arb_operand(W)  # the general path: arb balls
    with mpmath.workdps(60):
        for i in range(4):
            for j in range(30):
                exact = mpmath.fsum(a[i][t] * mpmath.mpf(float(W.__dict__["_float64_values"][t, j])) for t in range(50))
                assert abs(fast[i][j] - exact) <= abs(exact) * mpmath.mpf(10) ** -38
                assert abs(_arb.arb_to_mpf(slow[i, j]) - exact) <= abs(exact) * mpmath.mpf(10) ** -38


def test_float_product_leaves_infinities_and_other_matrices_to_arb():
    W = dyadic.float_matrix(np.ones((2, 2), dtype=np.float32))
    assert _arb.float_product([[mpmath.ninf, mpmath.mpf(1)]], W, 30) is None
    assert _arb.float_product([[mpmath.mpf(1), mpmath.mpf(1)]], sympy.ImmutableMatrix([[1, 2], [3, 4]]), 30) is None


def _deferred(monkeypatch, seed: int, shape: tuple[int, int]):
    """Random binary floats of ``shape``: their float64 array, their matrix made now, and deferred."""
    values = _floats(np.random.default_rng(seed), shape)
    made = dyadic.made_float_matrix(values)
    monkeypatch.setattr(dyadic, "DEFER_FROM", 1)
    return values, made, dyadic.float_matrix(values)


def test_a_deferred_float_matrix_reads_as_the_made_one(monkeypatch):
    values, made, m = _deferred(monkeypatch, 5, (6, 9))
    assert deferred_source(m) is not None
    assert m[2, 3] == made[2, 3] and m[-1, -1] == made[-1, -1]
    assert m[1:4, 2:5] == made[1:4, 2:5]
    assert [list(r) for r in _lazy.rational_rows(m)] == [list(r) for r in _lazy.rational_rows(made)]
    assert _lazy.rational_rows(m)[4][7] == _lazy.rational_rows(made)[4][7]
    assert not _lazy.all_integers(m)
    assert _lazy.all_integers(dyadic.float_matrix(np.array([[1.0, -2.0], [0.0, 8.0]])))
    assert np.array_equal(matrix_float64(m), values)
    assert deferred_source(m) is not None  # nothing so far made it whole
    assert qq_dense(m) == qq_dense(made)  # made whole on demand, the same rationals
    assert deferred_source(m) is None
    assert m == made


def test_a_deferred_float_matrix_transposes_without_being_made(monkeypatch):
    """The backward pass multiplies by W_Uᵀ, W_2ᵀ and W_1ᵀ: their transposes stay floats."""
    from symattn.exact.products import transpose

    _, made, m = _deferred(monkeypatch, 6, (5, 7))
    t = transpose(m)
    assert deferred_source(m) is not None and deferred_source(t) is not None  # neither made whole
    assert t.shape == (7, 5) and all(t[j, i] == made[i, j] for i in range(5) for j in range(7))
    assert t == made.T


@pytest.mark.parametrize("name", ["gelu", "gelu-tanh", "silu"])
def test_the_activation_in_ball_arithmetic_matches_mpmath_at_60_digits(name):
    with mpmath.workdps(40):
        rows = [[mpmath.mpf(x) / 7 for x in (-30, -3, -1, 0, 1, 2, 50)], [mpmath.mpf(10) ** -25, mpmath.mpf(1) / 3]]
    got = _block.arb_activated(rows, name, 30)
    with mpmath.workdps(60):
        for row, out in zip(rows, got):
            for x, y in zip(row, out):
                want = _block.NUMERIC[name](x)
                assert abs(y - want) <= abs(want) * mpmath.mpf(10) ** -35


def test_ranking_from_floats_first_is_the_exact_ranking():
    gen = random.Random(7)
    with mpmath.workdps(40):
        base = [mpmath.mpf(gen.randint(0, 20)) / 20 for _ in range(300)]
        # values a float cannot tell apart, and exact ties
        row = [v + mpmath.mpf(gen.randint(0, 3)) * mpmath.mpf(10) ** -30 for v in base]
    floats = [float(v) for v in row]
    for k in (1, 3, 10, 300):
        assert _head._ranked(row, floats, k) == sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
    for t in range(0, 300, 17):
        assert _head._rank(row, floats, t) == 1 + sum(1 for j in range(len(row))
                                                       if row[j] > row[t] or (row[j] == row[t] and j < t))


def _derived(path: Path):
    from symattn import crosscheck, derive, load_problem
    from symattn.render import render

    d = derive(load_problem(path))
    check = crosscheck(d)
    return d, check, render(d, "text", check=check)


def test_a_whole_model_with_every_float_matrix_deferred_gives_the_same_solution(monkeypatch):
    path = EXAMPLES / "tiny_gpt2_model.yaml"
    monkeypatch.setattr(_arb, "float_product", lambda a, b, dps: None)  # the general path: arb products
    slow, slow_check, slow_text = _derived(path)
    monkeypatch.undo()
    monkeypatch.setattr(dyadic, "DEFER_FROM", 1)  # every checkpoint matrix keeps its floats
    fast, fast_check, fast_text = _derived(path)
    assert slow_check.passed and fast_check.passed
    assert fast_text == slow_text
    for s, f in zip(slow.steps, fast.steps):
        a, b = slow.evaluate(s.id, 30), fast.evaluate(f.id, 30)
        for ra, rb in zip(a, b):
            for x, y in zip(ra, rb):
                assert x == y or abs(x - y) <= max(abs(x), 1) * mpmath.mpf(10) ** -28, s.id
    # the unembedding (the token table, transposed) and the MLP's weights were never made fmpq_mats
    p = fast.problem
    for m in (p.logits.W_U, p.mlp.W_1, p.mlp.W_2):
        assert deferred_source(m) is not None
    # what the exact logits are built from is still each float's dyadic rational
    W_U = p.logits.W_U
    assert W_U[3, 5] == sympy.Rational(*float(matrix_float64(W_U)[3, 5]).as_integer_ratio())


def test_the_softmax_over_a_vocabulary_and_the_cross_entropy_match_mpmath_at_60_digits():
    gen = random.Random(11)
    with mpmath.workdps(40):
        z = [[mpmath.mpf(gen.randint(-4000, 4000)) / 97 for _ in range(500)] for _ in range(2)]
    P = _block.numeric_row_softmax(z, 30)
    nll = _block.numeric_nll(z, [7, 499], [0, 1], 30)
    bits = _block.numeric_nll(z, [7], [1], 30, _block.LN2)
    with mpmath.workdps(60):
        for row, got in zip(z, P):
            total = mpmath.fsum(mpmath.exp(x) for x in row)
            for x, p in zip(row, got):
                assert abs(p - mpmath.exp(x) / total) <= mpmath.exp(x) / total * mpmath.mpf(10) ** -35
        for (r, t), (value,) in zip([(0, 7), (1, 499)], nll):
            want = -mpmath.log(mpmath.exp(z[r][t]) / mpmath.fsum(mpmath.exp(x) for x in z[r]))
            assert abs(value - want) <= mpmath.mpf(10) ** -35
        want = -mpmath.log(mpmath.exp(z[1][7]) / mpmath.fsum(mpmath.exp(x) for x in z[1])) / mpmath.log(2)
        assert abs(bits[0][0] - want) <= mpmath.mpf(10) ** -35


@pytest.mark.parametrize("name", ["tiny_llama_block", "tiny_bert_block", "tiny_gpt2_head"])
def test_every_format_is_the_same_with_the_checkpoints_matrices_deferred(monkeypatch, name):
    from symattn import crosscheck, derive, load_problem
    from symattn.render import render
    from symattn.render.json import write_json

    def outputs():
        d = derive(load_problem(EXAMPLES / f"{name}.yaml"))
        check = crosscheck(d)
        parts: list[str] = []
        write_json(d, parts.append, check=check)
        return [render(d, f, check=check) for f in ("latex", "markdown", "html", "text")] + ["".join(parts)]

    made = outputs()
    monkeypatch.setattr(dyadic, "DEFER_FROM", 1)
    assert outputs() == made
