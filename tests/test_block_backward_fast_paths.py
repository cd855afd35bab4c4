"""The backward pass's products by a model-sized float matrix (dY_final = dlogits·W_Uᵀ, dG = dF·W_2ᵀ,
dH_norm = dU·W_1ᵀ, ...) are made in float64 slices as balls (``arb.ball_float_product``), without
reading the matrix into arb or making its fmpq_mat.

Each is compared here with an independent computation: ``fractions.Fraction`` for the exact
product of the midpoints and of the balls' extreme points, flint's own arb_mat product for the
radius, and the general path (every matrix an fmpq_mat read into arb) for a whole model's
gradients.

Run with:
    python -m pytest -q tests/test_block_backward_fast_paths.py
"""

from __future__ import annotations

import random
import shutil
from fractions import Fraction
from pathlib import Path

import flint
import mpmath
import numpy as np
import pytest

from symattn.exact import arb as _arb
from symattn.numbers import dyadic
from symattn.numbers.sympy_internals import deferred_source

EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"


def _fraction(x) -> Fraction:
    """An arf (or a ball's midpoint, or its radius) as an exact Fraction."""
    man, exp = x.man_exp() if isinstance(x, flint.arf) else x.mid().man_exp()
    man, exp = int(man), int(exp)
    return Fraction(man * 2**exp) if exp >= 0 else Fraction(man, 2**-exp)


def _balls(gen: random.Random, n: int, k: int):
    """An n × k arb_mat of 30-digit balls: thirds and sevenths of sizes from 1e-20 to 1e5, some
    exact (radius 0), some exact zeros, some with wide radii."""
    rows = []
    for _ in range(n):
        row = []
        for _ in range(k):
            kind = gen.random()
            if kind < 0.1:
                row.append(flint.arb(0))
                continue
            x = flint.arb(gen.randint(-10**6, 10**6)) / gen.choice([3, 7, 11]) * flint.arb(10) ** gen.randint(-20, 5)
            if kind < 0.3:
                x = flint.arb(x.mid())  # exact
            elif kind < 0.4:
                x = flint.arb(x.mid(), abs(float(x.mid())) * 1e-6)  # a wide ball
            row.append(x)
        rows.append(row)
    return flint.arb_mat(rows)


from test_block_fast_paths import _floats  # noqa: E402  (float32 numbers over a wide range of sizes, zeros, negatives)


@pytest.mark.parametrize("n, k, m", [(1, 1, 1), (2, 9, 5), (3, 200, 7), (1, 3000, 4)])
def test_ball_float_product_contains_every_product_of_points_in_the_balls(n, k, m):
    gen, rng = random.Random(n * 7 + k), np.random.default_rng(k)
    with _arb.arb_precision(30):
        a = _balls(gen, n, k)
        b = _floats(rng, (k, m))
        got = _arb.ball_float_product(a, b)
        theirs = a * flint.arb_mat(b.tolist())  # flint's own ball product, b read exactly
    assert got is not None and (got.nrows(), got.ncols()) == (n, m)
    for i in range(n):
        for j in range(m):
            column = [Fraction(float(b[t, j])) for t in range(k)]
            mids = [_fraction(a[i, t]) for t in range(k)]
            rads = [_fraction(a[i, t].rad()) for t in range(k)]
            centre = sum(x * y for x, y in zip(mids, column))
            # the product's largest and smallest values over the input balls: each term at an end
            top = sum(x * y + r * abs(y) for x, r, y in zip(mids, rads, column))
            bottom = sum(x * y - r * abs(y) for x, r, y in zip(mids, rads, column))
            ball = got[i, j]
            low = _fraction(ball.mid()) - _fraction(ball.rad())
            high = _fraction(ball.mid()) + _fraction(ball.rad())
            assert low <= bottom <= centre <= top <= high
            # and it is as tight as flint's own product, up to the working precision's rounding
            slack = abs(centre) / 2**(_arb.prec_bits(30) - 4) + Fraction(1, 10**300)
            assert _fraction(ball.rad()) <= 2 * _fraction(theirs[i, j].rad()) + slack


def test_ball_float_product_declines_what_it_cannot_take():
    with _arb.arb_precision(30):
        one = flint.arb_mat([[flint.arb(1), flint.arb(2)]])
        assert _arb.ball_float_product(one, np.array([[1.0], [np.inf]])) is None
        assert _arb.ball_float_product(one, np.array([[1e-300], [1e300]])) is None  # too wide a range
        assert _arb.ball_float_product(flint.arb_mat([[flint.arb("inf"), flint.arb(1)]]), np.ones((2, 1))) is None
        tiny = flint.arb_mat([[flint.arb(1, flint.arb(2) ** -1200), flint.arb(1)]])  # a radius below float64
        assert _arb.ball_float_product(tiny, np.ones((2, 1))) is None
        with pytest.raises(ValueError):
            _arb.ball_float_product(one, np.ones((3, 1)))


def _backward_problem(tmp_path: Path) -> Path:
    """The tiny whole GPT-2 (tied unembedding, ln_f, the MLP) with its cross-entropy's backward pass."""
    shutil.copy(EXAMPLES / "tiny_gpt2_model.safetensors", tmp_path)
    text = (EXAMPLES / "tiny_gpt2_model.yaml").read_text("utf-8") + "backward: {loss: cross-entropy}\n"
    path = tmp_path / "backward.yaml"
    path.write_text(text, "utf-8")
    return path


def _gradients(path: Path):
    from symattn import crosscheck, derive, load_problem
    from symattn.render import render

    d = derive(load_problem(path))
    check = crosscheck(d)
    ids = [s.id for s in d.steps if s.kind_of is not None and s.kind_of.gradient]
    return d, check, render(d, "text", check=check), {i: d.evaluate(i, 30) for i in ids}


def test_a_whole_models_gradients_with_its_float_matrices_kept_are_the_general_paths(tmp_path, monkeypatch):
    path = _backward_problem(tmp_path)
    slow, slow_check, slow_text, slow_values = _gradients(path)  # every matrix an fmpq_mat read into arb
    calls = []
    original = _arb.ball_float_product

    def counted(a, b):
        calls.append(b.shape)
        return original(a, b)

    monkeypatch.setattr(_arb, "ball_float_product", counted)
    monkeypatch.setattr(dyadic, "DEFER_FROM", 1)  # every checkpoint matrix keeps its floats
    fast, fast_check, fast_text, fast_values = _gradients(path)
    assert slow_check.passed and fast_check.passed
    assert fast_text == slow_text
    assert len(fast_values) > 20 and fast_values.keys() == slow_values.keys()
    for key, rows in slow_values.items():
        for row_a, row_b in zip(rows, fast_values[key]):
            for x, y in zip(row_a, row_b):
                assert x == y or abs(x - y) <= max(abs(x), 1) * mpmath.mpf(10) ** -28, key
    # the products by W_Uᵀ (the token table), W_2ᵀ and W_1ᵀ were made in float64 slices ...
    p = fast.problem
    vocab, d_model = p.logits.W_U.shape[1], p.logits.W_U.shape[0]
    assert (vocab, d_model) in calls and (p.mlp.W_2.shape[1], p.mlp.W_2.shape[0]) in calls
    assert (p.mlp.W_1.shape[1], p.mlp.W_1.shape[0]) in calls
    # ... and the three were never made fmpq_mats
    for m in (p.logits.W_U, p.mlp.W_1, p.mlp.W_2):
        assert deferred_source(m) is not None
