"""The backward pass of grouped-query attention (kv_heads): a K/V group's dV, dK (dK_rot), dW_K, dW_V
and its biases' gradients sum the shares of every query head that reads it.

The reference is the same problem written as plain multi-head attention with each group's W_K and
W_V repeated in every head that reads them (what PyTorch's enable_gqa and Hugging Face's repeat_kv
do): derived exactly, its heads' gradients must add up to the grouped problem's, exactly (the
difference simplifies to 0), and every other gradient must be the same. NumPy's chain rule,
central differences and PyTorch's autograd are held to it by the cross-check.

Run with:
    python -m pytest -q tests/test_exact_gqa_backward.py
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import symattn
from symattn import load_problem

X = "X: [[1, 0], [0, 1], [1, 1]]\ntokens: [I, saw, it]\nmask: causal\n"
W_QS = ["[[1, 0], [0, 1]]", "[[0, 1], [1, 0]]", "[[1, 1], [0, 1]]", "[[2, 0], [0, -1]]"]  # d_k = 2 (RoPE's pairs)
KV = [("[[1, 0], [1, 1]]", "[[1, 0], [0, 1]]"), ("[[0, 1], [2, 0]]", "[[0, 1], [1, 1]]")]
W_O = "W_O: [[1, 0], [0, 1], [1, 1], [0, 1], [1, 0], [1, 0], [0, 1], [1, -1]]\n"
LOSSES = {"sum": "backward: {loss: sum}\n",
          "weights": "backward: {loss: {weights: [[1, 0], [-2, 1], [3, 1]]}}\n"}
ROPE = "rope: {angles: [\"pi/2\"]}\n"  # quarter turns: rotated keys and queries stay rational


def _grouped(kv_heads: int, extra: str) -> str:
    kv = KV[:kv_heads]
    return (X + f"kv_heads: {kv_heads}\nheads:\n" + "".join(f"  - W_Q: {w}\n" for w in W_QS)
            + "kv:\n" + "".join(f"  - W_K: {k}\n    W_V: {v}\n" for k, v in kv) + W_O + extra)


def _expanded(kv_heads: int, extra: str) -> str:
    """The same layer as multi-head attention: each head carries its group's W_K and W_V."""
    size = 4 // kv_heads
    heads = "".join(f"  - W_Q: {w}\n    W_K: {KV[h // size][0]}\n    W_V: {KV[h // size][1]}\n"
                    for h, w in enumerate(W_QS))
    return X + "heads:\n" + heads + W_O + extra


def _exact_equal(a, b, what: str) -> None:
    a, b = sympy.Matrix(a), sympy.Matrix(b)
    assert a.shape == b.shape, what
    for x, y in zip(a, b):
        assert x == y or sympy.expand(x - y) == 0 or sympy.simplify(x - y) == 0, (what, x, y)


def _derive(text: str):
    return symattn.derive(load_problem(text))


@pytest.mark.parametrize("kv_heads, loss, rope", [(2, "weights", False), (1, "sum", False), (2, "sum", True),
                                                  (1, "weights", True)])
def test_a_groups_gradients_are_the_sums_of_its_heads_shares_exactly(kv_heads, loss, rope):
    extra = LOSSES[loss] + (ROPE + "scale: none\n" if rope else "")
    grouped, expanded = _derive(_grouped(kv_heads, extra)), _derive(_expanded(kv_heads, extra))
    size = 4 // kv_heads
    for h in range(1, 5):
        for name in ("dO", "dA", "dS_masked", "dS", "dQ", "dW_Q") + (("dQ_rot",) if rope else ()):
            _exact_equal(grouped.step(f"head{h}.{name}").exact, expanded.step(f"head{h}.{name}").exact,
                         f"head{h}.{name}")
    for first in range(1, 5, size):
        group = range(first, first + size)
        for name in ("dV", "dK", "dW_K", "dW_V") + (("dK_rot",) if rope else ()):
            total = sum((sympy.Matrix(expanded.step(f"head{h}.{name}").exact) for h in group[1:]),
                        sympy.Matrix(expanded.step(f"head{first}.{name}").exact))
            _exact_equal(grouped.step(f"head{first}.{name}").exact, total, f"head{first}.{name}")
            for h in group[1:]:  # shown once, under the group's first head
                assert f"head{h}.{name}" not in grouped.ids
    _exact_equal(grouped.step("dX").exact, expanded.step("dX").exact, "dX")
    _exact_equal(grouped.step("dW_O").exact, expanded.step("dW_O").exact, "dW_O")


def test_the_cross_check_holds_every_group_gradient_to_numpy_finite_differences_and_autograd():
    pytest.importorskip("torch")
    d = _derive(_grouped(2, LOSSES["weights"] + ROPE))
    check = symattn.crosscheck(d, torch=True)
    assert check.passed, check
    ids = {r.id for r in check.rows} if hasattr(check, "rows") else None
    if ids is not None:
        assert {"head1.dK", "head1.dV", "head3.dW_K", "head3.dK_rot"} <= ids


def test_the_group_gradients_follow_their_heads_in_the_json_order():
    ids = list(_derive(_grouped(2, LOSSES["sum"])).ids)
    # group 1's dV comes after both of its heads' dA, before group 2's heads
    assert ids.index("head2.dA") < ids.index("head1.dV") < ids.index("head3.dA") < ids.index("head3.dV")
    assert ids.index("head2.dW_Q") < ids.index("head1.dK") < ids.index("head1.dW_K") < ids.index("head3.dA")


def test_the_solution_writes_out_the_groups_sum():
    d = _derive(_grouped(2, LOSSES["sum"]))
    text = symattn.render(d, "text")
    assert "dV = A⁽¹⁾ᵀ·dO⁽¹⁾ + A⁽²⁾ᵀ·dO⁽²⁾" in text
    assert "dK = dS⁽³⁾ᵀ·Q⁽³⁾ + dS⁽⁴⁾ᵀ·Q⁽⁴⁾" in text
    assert "Heads 1 and 2 both read K/V group 1's values" in text
    latex = symattn.render(d, "latex")
    assert "dV = A^{(1)\\top} dO^{(1)} + A^{(2)\\top} dO^{(2)}" in latex  # one superscript per base


def test_check_names_a_group_gradient_from_one_head_alone():
    d = _derive(_grouped(2, LOSSES["weights"]))
    own = np.asarray(d.approx("head1.A")).T @ np.asarray(d.approx("head1.dO"))  # head 1's share alone
    assert not np.allclose(own, d.approx("head1.dV"))
    report = symattn.check(d, {"head1.dV": np.round(own, 8).tolist()}).to_json()
    assert "only one head's share" in report, report


def test_a_llama_block_with_grouped_heads_and_rope_goes_back_to_every_weight():
    """The tiny LLaMA block (4 heads on 2 K/V groups, RoPE, RMSNorm, SwiGLU, the head): its group's dK_rot
    sums two heads' shares through the MLP and the norms, and is turned back entry by entry when asked
    for (the whole closed form is far too long to build); NumPy's chain rule agrees."""
    from pathlib import Path

    from symattn.reference.numeric_backward import numeric_gradients

    example = Path(__file__).resolve().parent.parent / "worked_examples" / "tiny_llama_block.yaml"
    d = symattn.derive(symattn.with_backward(load_problem(example)))
    want = numeric_gradients(d.problem)
    for key in ("head1.dK_rot", "head1.dK", "head3.dW_K", "head3.dW_V", "head2.dW_Q", "dX"):
        got = d.approx(key)
        np.testing.assert_allclose(got, want[key], rtol=0, atol=1e-12 * max(1.0, np.abs(want[key]).max()), err_msg=key)
    assert "head2.dK" not in d.ids and "head4.dW_V" not in d.ids
    assert symattn.crosscheck(d).passed


def test_a_gradient_turned_back_lazily_is_the_one_turned_at_once():
    from symattn.exact.exact_ops import _turned_lazily
    from symattn.exact.lazy import LazyMatrix
    from symattn.problem.rope import rotate

    m = sympy.Matrix(3, 4, lambda i, j: sympy.Rational(i + 2 * j - 3, 5) + sympy.exp(sympy.Rational(-i, 3)))
    thetas, pairs = [sympy.Rational(1, 2), sympy.pi / 3], [(0, 2), (1, 3)]
    lazy = _turned_lazily(LazyMatrix(3, 4, lambda i, j: m[i, j]), thetas, pairs, [0, 1, 2], -1)
    eager = rotate(sympy.ImmutableMatrix(m), thetas, pairs, [0, 1, 2], -1)
    for i in range(3):
        for j in range(4):
            assert sympy.simplify(lazy[i, j] - eager[i, j]) == 0
