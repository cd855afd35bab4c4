"""Padding by length: ``mask: {padding: [...]}``, ``{valid-length: n}`` and lists such as
``[causal, {valid-length: 3}]``.

The references are written here: the allowed sets from the rule (a key-padding vector
broadcast to every query, AND the causal triangle), the attention in NumPy with
fractions for the masks, and PyTorch's ``scaled_dot_product_attention`` with a boolean
``attn_mask`` (True = may attend) where torch is installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import symattn
from symattn import SymattnError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "padding_by_length.yaml"

X = [[1, 0, 1], [0, 2, 1], [1, 1, 0], [2, 0, 0]]
W_Q = [[1, 0], [0, 1], [1, 1]]
W_K = [[0, 1], [1, 0], [1, 0]]
W_V = [[1, 0], [0, 1], [1, 1]]
BASE = (f"tokens: [a, b, c, d]\nX: {X}\nW_Q: {W_Q}\nW_K: {W_K}\nW_V: {W_V}\n")


def numpy_attention(allowed: np.ndarray):
    Xa, Q_w, K_w, V_w = (np.array(m, dtype=float) for m in (X, W_Q, W_K, W_V))
    Q, K, V = Xa @ Q_w, Xa @ K_w, Xa @ V_w
    S = np.where(allowed, Q @ K.T / np.sqrt(2), -np.inf)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return A, A @ V


def torch_attention(allowed: np.ndarray):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    Xa, Q_w, K_w, V_w = (torch.tensor(m, dtype=torch.float64) for m in (X, W_Q, W_K, W_V))
    Q, K, V = Xa @ Q_w, Xa @ K_w, Xa @ V_w
    mask = torch.from_numpy(allowed)  # boolean: True = may take part in attention
    O = F.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=mask[None])[0]
    return O.numpy()


CASES = {
    "{padding: [1, 1, 1, 0]}": [[True, True, True, False]] * 4,
    "{padding: [1, 0, 1, 0]}": [[True, False, True, False]] * 4,
    "{valid-length: 2}": [[True, True, False, False]] * 4,
    "{valid-length: 4}": [[True] * 4] * 4,
    "[causal, {valid-length: 3}]": [[j <= i and j < 3 for j in range(4)] for i in range(4)],
    "[causal, {padding: [1, 1, 0, 1]}]": [[j <= i and j != 2 for j in range(4)] for i in range(4)],
    "[{padding: [1, 1, 1, 0]}, {sliding-window: 2}]": [[j <= i and i - j < 2 and j < 3 for j in range(4)]
                                                       for i in range(4)],
}


@pytest.mark.parametrize("mask", list(CASES))
def test_allowed_sets_and_output_against_numpy(mask):
    d = symattn.derive(symattn.load_problem(BASE + f"mask: {mask}\n"))
    want = np.array(CASES[mask])
    assert d.problem.mask.allowed == tuple(tuple(bool(x) for x in row) for row in want)
    A, O = numpy_attention(want)
    assert np.abs(d.approx("A") - A).max() < 1e-12
    assert np.abs(d.approx("O") - O).max() < 1e-12
    assert (d.approx("A")[~want] == 0).all()  # padding keys get weight exactly 0


@pytest.mark.parametrize("mask", list(CASES))
def test_output_against_torch_boolean_attn_mask(mask):
    want = np.array(CASES[mask])
    O = torch_attention(want)
    d = symattn.derive(symattn.load_problem(BASE + f"mask: {mask}\n"))
    assert np.abs(d.approx("O") - O).max() < 1e-12
    check = symattn.crosscheck(d, torch=True)
    assert check.passed and check.torch.passed


def test_the_example():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    allowed = [[j <= i and j < 3 for j in range(4)] for i in range(4)]
    assert d.problem.mask.allowed == tuple(tuple(r) for r in allowed)
    assert d.problem.mask.kind == "combined"
    assert (d.approx("A")[:, 3] == 0).all()  # nobody attends to <pad>
    rule = d.problem.mask.rule()
    assert "causal" in rule and "valid length ⟦3⟧" in rule and "every one allows it" in rule


def test_rule_sentences():
    p = symattn.load_problem(BASE + "mask: {padding: [1, 1, 0, 0]}\n")
    assert p.mask.rule().startswith("key padding ⟦p = (1, 1, 0, 0)⟧")
    assert "keys 3 and 4 are padding" in p.mask.rule()
    p = symattn.load_problem(BASE + "mask: {valid-length: 3}\n")
    assert "⟦j \\le 3⟧" in p.mask.rule() and "after the first ⟦3⟧ are padding" in p.mask.rule()
    text = symattn.render_text(symattn.derive(p))
    assert "valid length 3: every query may attend to keys j ≤ 3 only" in text


def test_a_fully_masked_row_names_its_query():
    with pytest.raises(SymattnError) as info:
        symattn.load_problem(BASE + "mask: [causal, {padding: [0, 1, 1, 1]}]\n")
    err = info.value
    assert (err.line, err.col, err.field) == (6, 7, "mask")
    assert "row 1 with no key to attend to" in err.message and "the query 'a'" in err.message
    with pytest.raises(SymattnError, match="row 1 with no key to attend to"):
        symattn.load_problem(BASE + "mask: {padding: [0, 0, 0, 0]}\n")


@pytest.mark.parametrize(("mask", "where", "field", "fragment"), [
    ("{padding: [1, 1, 0]}", (6, 17), "mask.padding", "the padding vector has 3 entries but there are 4 keys"),
    ("{padding: [1, 1, 1, 0, 1]}", (6, 17), "mask.padding", "has 5 entries but there are 4 keys"),
    ("{padding: [1, 2, 1, 0]}", (6, 21), "mask.padding item 2", "a padding entry is 1 (a real token) or 0 (padding), not '2'"),
    ("{padding: [1, true, 1, 0]}", (6, 21), "mask.padding item 2", "not 'true'"),
    ("{padding: 3}", (6, 17), "mask.padding", "padding is one 0/1 entry per key"),
    ("{valid-length: 0}", (6, 22), "mask.valid-length", "a whole number from 1 to 4 (the number of keys), not '0'"),
    ("{valid-length: 5}", (6, 22), "mask.valid-length", "not '5'"),
    ("{valid-length: 2.5}", (6, 22), "mask.valid-length", "not '2.5'"),
    ("[causal, {valid-length: 9}]", (6, 31), "mask item 2.valid-length", "not '9'"),
    ("[casual, {valid-length: 2}]", (6, 8), "mask item 1", "(did you mean 'causal'?)"),
    ("padding", (6, 7), "mask", "padding needs its keys: write {padding: [1, 1, 1, 0]}"),
])
def test_bad_padding(mask, where, field, fragment):
    with pytest.raises(SymattnError) as info:
        symattn.load_problem(BASE + f"mask: {mask}\n")
    err = info.value
    assert (err.line, err.col) == where, str(err)
    assert err.field == field, str(err)
    assert fragment in err.message, str(err)
