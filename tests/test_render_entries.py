"""How the entries of a sum over heads are written (symattn/render/entries.py).

A head's share of the concatenation or of the projected output is collected from QQ
coefficients; it must be exactly the sum SymPy's ``expand`` makes of the head's numerators times
the weights, and whether a step needs decimals must be what its exact entries say.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy

import symattn
from symattn import stages as registry
from symattn.problem.load import parse_problem
from symattn.render.entries import head_parts, needs_decimals, over_normaliser
from symattn.render.numbers import NEG_INF, is_plain_integer


def _floats(rng, rows: int, cols: int, scale: float = 1.0) -> str:
    """A matrix of float64 values written as the exact fractions they are (53-bit dyadics)."""
    m = rng.standard_normal((rows, cols)) * scale
    return "[" + ", ".join("[" + ", ".join(f'"{Fraction(float(x))}"' for x in row) + "]" for row in m) + "]"


def _problem(extra: str = "", seed: int = 0, d_k: int = 2, kv: bool = True) -> str:
    rng = np.random.default_rng(seed)
    text = f"X: {_floats(rng, 3, 4)}\nmask: causal\n"
    if kv:
        text += "kv_heads: 2\nheads:\n" + "".join(f"  - W_Q: {_floats(rng, 4, d_k)}\n" for _ in range(4))
        text += "kv:\n" + "".join(f"  - {{W_K: {_floats(rng, 4, d_k)}, W_V: {_floats(rng, 4, d_k)}}}\n" for _ in range(2))
        rows = 4 * d_k
    else:
        text += "heads:\n" + "".join(f"  - {{W_Q: {_floats(rng, 4, d_k)}, W_K: {_floats(rng, 4, d_k)}, "
                                     f"W_V: {_floats(rng, 4, d_k)}}}\n" for _ in range(2))
        rows = 2 * d_k
    w_o = rng.standard_normal((rows, 3))
    w_o[1, :] = 0  # a row of zero weights: the head's column is skipped
    text += "W_O: [" + ", ".join("[" + ", ".join(f'"{Fraction(float(x))}"' for x in row) + "]" for row in w_o) + "]\n"
    return text + extra


def _expanded(d, step, i: int, j: int) -> list:
    """The parts as the definition gives them: each head's numerators times the weights, summed and expanded."""
    p = d.problem
    outputs = [d.step(s) for s in registry.resolve("heads", registry.Context(p))]
    weights = sympy.eye(sum(o.shape[1] for o in outputs)) if step.key == registry.CONCAT else p.W_O
    out, offset = [], 0
    for h, o in enumerate(outputs, 1):
        over_z = over_normaliser(o, i, 0) is not None
        total = sympy.Add(*[(over_normaliser(o, i, c) if over_z else o.lazy[i, c]) * weights[offset + c, j]
                            for c in range(o.shape[1])])
        total = sympy.expand(total, power_exp=False, power_base=False, log=False)
        if total != 0:
            out.append((h, total, over_z))
        offset += o.shape[1]
    return out


@pytest.mark.parametrize("extra, d_k, kv", [
    ("", 2, True),                       # scale 1/√2: the exponents hold √2
    ("rope: {base: 10000}\n", 2, True),  # cosines and sines in the exponents
    ("", 4, False),                      # rational scores: rational rows
    ("scale: none\n", 2, False),
])
def test_head_parts_are_the_expanded_sums(extra, d_k, kv):
    d = symattn.derive(parse_problem(_problem(extra, d_k=d_k, kv=kv), "p.yaml"))
    for key in (registry.CONCAT, registry.O_FINAL):
        step = next(s for s in d if s.key == key)
        for i in range(step.shape[0]):
            for j in range(step.shape[1]):
                got, want = head_parts(d, step, i, j), _expanded(d, step, i, j)
                assert got == want, (key, i, j)
                # the same tree, argument for argument, as SymPy builds it
                assert [sympy.srepr(x) for _, x, _ in got] == [sympy.srepr(x) for _, x, _ in want], (key, i, j)


@pytest.mark.parametrize("extra", ["", "rope: {angles: [\"1/2\"]}\n"])
def test_head_parts_collect_tied_scores(extra):
    """Tokens 1 and 2 are the same vector, so every query's two scores against them tie: their
    exponentials are one term, its coefficient the two values' sum (3·e^x, not e^x + 2·e^x);
    with RoPE they no longer tie."""
    text = ("X: [[1, 2], [1, 2], [0, 1]]\nheads:\n"
            "  - {W_Q: [[1, 0], [0, 1]], W_K: [[1, 1], [0, 1]], W_V: [[1, 0], [2, 1]]}\n"
            "  - {W_Q: [[0, 1], [1, 0]], W_K: [[1, 0], [1, 2]], W_V: [[0, 1], [1, 3]]}\n"
            "W_O: [[1, 2], [0, 1], [\"1/2\", 0], [1, -1]]\n" + extra)
    d = symattn.derive(parse_problem(text, "p.yaml"))
    for key in (registry.CONCAT, registry.O_FINAL):
        step = next(s for s in d if s.key == key)
        for i in range(step.shape[0]):
            for j in range(step.shape[1]):
                got, want = head_parts(d, step, i, j), _expanded(d, step, i, j)
                assert got == want and all(sympy.srepr(g) == sympy.srepr(w) for (_, g, _), (_, w, _) in zip(got, want))


def test_the_heads_sum_is_read_whole_where_it_is_exact():
    d = symattn.derive(parse_problem(_problem("rope: {base: 10000}\n"), "p.yaml"))
    step = next(s for s in d if s.key == registry.O_FINAL)
    entry = step.exact[2, 1]
    parts = head_parts(d, step, 2, 1)
    normalisers = {h: d.step(f"head{h}.O").softmax[2].normaliser for h, _, _ in parts}
    whole = sympy.Add(*[x / normalisers[h] if over_z else x for h, x, over_z in parts])
    assert abs(sympy.N(whole - entry, 40)) < sympy.Float("1e-35")


def test_needs_decimals_of_a_heads_sum_is_what_its_exact_entries_say():
    # Fractions of exponentials: decimals help.
    d = symattn.derive(parse_problem(_problem(), "p.yaml"))
    step = next(s for s in d if s.key == registry.O_FINAL)
    assert needs_decimals(step) is True
    # Values constant down each column: every output entry is an integer in value, though each
    # is built as a sum of fractions over the heads' normalisers: the 30-digit values cannot
    # decide, and the exact entries do, as before.
    text = ("X: [[1, 0], [1, 1], [1, 2]]\nmask: causal\nheads:\n"
            "  - {W_Q: [[1], [2]], W_K: [[1], [1]], W_V: [[2], [0]]}\n"
            "  - {W_Q: [[1], [0]], W_K: [[2], [1]], W_V: [[-1], [0]]}\n"
            "W_O: [[1, 2], [3, 1]]\n")
    d = symattn.derive(parse_problem(text, "p.yaml"))
    step = next(s for s in d if s.key == registry.O_FINAL)
    values = [[float(v) for v in row] for row in d.evaluate(step.id, 30)]
    assert values == [[-1.0, 3.0]] * 3
    assert any(over_z for i in range(3) for _, _, over_z in head_parts(d, step, i, 0))
    want = any(not (is_plain_integer(x) or x == NEG_INF) for x in step.exact)
    assert needs_decimals(step) is want
