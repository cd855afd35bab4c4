"""Gradients through the weights are written as the forward pass writes the weights: over Z_i.

dV = Aᵀ dO sums the weights of a column, one row's a_ik = e^{z_ik − m_i} / Z_i each, so each of its
entries (and those of dW_V = Cᵀ dV) is written as a sum of fractions, each over its row's Z_i. The
value written must be the exact entry: checked here exactly with SymPy on every example with a
backward pass, and the worked solution must show no nested fraction such as 1/(e(2/e + 1)).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import sympy

import symattn
from symattn.problem.model import SUM_LOSS
from symattn.exact.norms import rational_rows_of
from symattn.render.entries import entry_form
from _reference import backward_supported

EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"
# (grouped-query attention has no backward pass yet.) Symbols and positional encodings (X_pos holds sines) make X
# not rational: dW_Q = X_posᵀ·dQ is then written entry by entry, not over each row's Z.
SMALL = [p for p in sorted(EXAMPLES.glob("*.yaml"))
         if "symbolic" not in p.stem and "positions" not in p.stem
         and backward_supported(p)]


NORMED = ("dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta")  # back through a norm with rational roots


def with_backward(path):
    p = symattn.load_problem(path)
    return p if p.backward is not None else dataclasses.replace(p, backward=SUM_LOSS)


def written_value(form, rows) -> sympy.Expr:
    """The value an entry form writes, with each Z_r put back as the row's normaliser."""
    total = form.value if form.value is not None else sympy.Integer(0)
    for over in form.over:
        top = over.numerator if not over.parts else sympy.Add(*[sympy.Rational(int(c.numerator), int(c.denominator))
                                                              * sympy.exp(sympy.Rational(int(x.numerator), int(x.denominator)))
                                                              for c, x in over.numerator])
        total += (-1 if over.negative else 1) * top / rows[over.row].normaliser ** (2 if over.squared else 1)
    return total


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_gradients_are_written_over_each_rows_Z(path):
    d = symattn.derive(with_backward(path))
    steps = [s for s in d.steps if s.kind in ("dV", "dW_V", "dK", "dW_Q", "dW_K", "dX", "dcontext", *NORMED)
             and s.written_exactly]
    norm = d.problem.norm
    # behind a norm's irrational roots every gradient is shown in decimals (tests/test_norm_backward.py)
    irrational = norm is not None and not rational_rows_of(d.step("R_hat" if norm.post else "X_hat").value)
    assert steps or not d.problem.n_q * d.problem.n_k <= 64 or irrational
    for step in steps:
        if step.over_rows is None:
            # a sum over heads whose softmax rows differ: each head has its own Z_i, so the entries
            # are written out (gathered over one head's Z_i they would be wrong, as rmsnorm_head's were)
            heads = {tuple(r.normaliser for r in d.step(f"head{h}.A").softmax) for h in range(1, len(d.problem.heads) + 1)} \
                if d.problem.multi_head else set()
            assert step.kind in ("dX", "dcontext", *NORMED) and len(heads) > 1, step.id
            continue
        rows = step.value.rows
        for i in range(step.shape[0]):
            for j in range(step.shape[1]):
                form = entry_form(d, step, i, j)
                assert sympy.simplify(written_value(form, rows) - step.lazy[i, j]) == 0, (step.id, i, j)


def test_the_worked_solution_shows_dV_over_Z_i():
    d = symattn.derive(symattn.load_problem(EXAMPLES / "backward_causal.yaml"))
    md = symattn.render_markdown(d)
    dV = next(line for line in md.splitlines() if line.startswith("dV = A^{\\top} dO ="))
    assert "Z_{2}" in dV and "Z_{3}" in dV
    assert "e \\left(" not in dV and "+ -" not in dV  # no nested 1/(e(2/e + 1)), no "+ −"
    text = symattn.render_text(d)
    assert "1/Z_2 - exp(-1)/Z_3" in text
