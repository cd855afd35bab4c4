"""The rest of the block and the model's head: mlp:, logits: and loss:.

References: hand values of a problem whose attention is uniform (every stage rational up to the
softmax over the vocabulary, written out here by hand); NumPy written here for a gated (SwiGLU) MLP
with RMSNorms, a post-norm (BERT-order) MLP with GELU's erf form, and rows: last; mpmath at 50
digits for GELU's two forms; the check's diagnoses of slipped answers; and the refusals, one line
at the field. tests/test_block_hf.py compares with transformers' own modules.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _error, _write

ROOT_EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"

E, log, R = sympy.exp, sympy.log, sympy.Rational
ATTENTION = ("tokens: [the, cat]\nX: [[1, 0], [0, 1]]\nW_Q: [[1, 0], [0, 1]]\nW_K: [[0, 0], [0, 0]]\n"
             "W_V: [[1, 0], [0, 1]]\nmask: none\n")
MLP = ("mlp:\n  W_1: [[1, -1, 0], [0, 1, 1]]\n  b_1: [0, 0, -1]\n  W_2: [[1, 0], [0, 1], [1, 1]]\n"
       "  activation: relu\n")
HEAD = "logits:\n  W_U: [[1, 0, -1], [0, 1, 1]]\n  vocab: [the, cat, sat]\nloss: {targets: [cat, sat]}\n"
HAND = ATTENTION + MLP + HEAD


def _derive(tmp_path, text):
    return symattn.derive(load_problem(_write(tmp_path, text)))


def _same(a, b) -> bool:
    return all(sympy.simplify(x - y) == 0 for x, y in zip(sympy.Matrix(a), sympy.Matrix(b)))


def _same_logs(a, b) -> bool:
    """Equal logarithms: their exponentials expand to the same sum."""
    return all(sympy.expand(E(x) - E(y)) == 0 for x, y in zip(sympy.Matrix(a), sympy.Matrix(b)))


def test_a_whole_block_by_hand(tmp_path):
    d = _derive(tmp_path, HAND)
    # W_K = 0: every score is 0, so A = 1/2 everywhere, O = (1/2)·(sum of V's rows), H = X + O
    assert d.step("H").exact.tolist() == [[R(3, 2), R(1, 2)], [R(1, 2), R(3, 2)]]
    assert d.step("U").exact.tolist() == [[R(3, 2), -1, R(-1, 2)], [R(1, 2), 1, R(1, 2)]]  # H·W_1 + b_1
    assert d.step("G").exact.tolist() == [[R(3, 2), 0, 0], [R(1, 2), 1, R(1, 2)]]  # ReLU
    assert d.step("F").exact.tolist() == [[R(3, 2), 0], [1, R(3, 2)]]
    assert d.step("Y").exact.tolist() == [[3, R(1, 2)], [R(3, 2), 3]]  # Y = H + F
    assert d.step("logits").exact.tolist() == [[3, R(1, 2), R(-5, 2)], [R(3, 2), 3, R(3, 2)]]
    z = [[3, R(1, 2), R(-5, 2)], [R(3, 2), 3, R(3, 2)]]
    P = [[E(z[i][j]) / sum(E(x) for x in z[i]) for j in range(3)] for i in range(2)]
    assert _same(d.step("P").exact, P)
    nll = [log(sum(E(x) for x in z[0])) - z[0][1], log(sum(E(x) for x in z[1])) - z[1][2]]  # targets cat, sat
    assert _same_logs(d.step("nll").exact, nll)
    assert _same_logs([2 * d.step("L").exact[0, 0]], [nll[0] + nll[1]])  # L, the mean of the two
    assert all(s.written_exactly for s in d.steps)


def test_the_hand_block_in_every_format(tmp_path):
    d = _derive(tmp_path, HAND)
    for fmt in ("latex", "markdown", "text", "html"):
        out = html.unescape(symattn.render(d, fmt))
        for title in ("The MLP", "Add the MLP's output to the residual stream", "Next-token probabilities",
                      "The cross-entropy loss"):
            assert title in out, (fmt, title)
        assert "3 likeliest next words" in out and "rank 2 of 3" in out, fmt
    ids = [s["id"] for s in json.loads(symattn.render(d, "json"))["stages"]]
    assert ids[ids.index("H"):] == ["H", "W_1", "b_1", "U", "G", "W_2", "F", "Y", "W_U", "logits", "P", "nll", "L"]


def test_an_exact_zero_behind_the_softmax_is_zero_in_decimals(tmp_path):
    """The MLP's norm behind uniform attention (worked_examples/block_by_hand.yaml with β = (1, 0)):
    H = X + O is rational, each row normalises to ±1 (d_model 2), and H_norm = H_hat ∘ γ + β has
    exact zeros, as does all of row 2 of U = H_norm·W_1 + b_1 (by hand below). Their decimals,
    computed by the relation from the earlier stages' 30-digit values, are 0 too, not rounding
    noise (they were 1e-41)."""
    text = (ROOT_EXAMPLES / "block_by_hand.yaml").read_text("utf-8").replace(
        "mlp:\n", "mlp:\n  norm: {type: layernorm, bias: [1, 0], eps: 0}\n")
    d = _derive(tmp_path, text)
    # A is 1, (1/2, 1/2), (1/3, 1/3, 1/3) and V = X·W_V, so H = X + O = (2, 0), (1/2, 2), (5/3, 7/3)
    assert d.step("H").exact.tolist() == [[2, 0], [R(1, 2), 2], [R(5, 3), R(7, 3)]]
    assert d.step("H_norm").exact.tolist() == [[2, -1], [0, 1], [0, 1]]  # (±1, ∓1) + (1, 0)
    # (2, −1)·W_1 = (2, −3, 1) and (0, 1)·W_1 = (0, 1, −1), plus b_1 = (0, −1, 1)
    assert d.step("U").exact.tolist() == [[2, -4, 2], [0, 0, 0], [0, 0, 0]]
    stages = {s["id"]: s for s in json.loads(symattn.render(d, "json"))["stages"]}
    for stage in ("H_norm", "U", "G"):
        zeros = np.array(d.step(stage).exact.tolist(), dtype=object) == 0
        assert (d.approx(stage)[zeros] == 0).all(), (stage, d.approx(stage))
        assert (np.array(stages[stage]["approx"])[zeros] == 0).all(), stages[stage]
    assert "e-4" not in symattn.render(d, "text")  # no 1e-41 shown for a 0

def _rms(x, g, eps):
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * g


def _ln(x, g, b, eps):
    mu = x.mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps) * g + b


def _attention(X, Wq, Wk, Wv, causal):
    s = (X @ Wq) @ (X @ Wk).T / math.sqrt(Wq.shape[1])
    if causal:
        s = np.where(np.tril(np.ones_like(s)) > 0, s, -np.inf)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    return (a / a.sum(axis=1, keepdims=True)) @ (X @ Wv)


RNG = np.random.default_rng(7)
XS = RNG.integers(-4, 5, size=(3, 4)) / 4
WQ, WK, WV = (RNG.integers(-4, 5, size=(4, 4)) / 4 for _ in range(3))
WG, WU_, WD = RNG.integers(-3, 4, size=(4, 6)) / 2, RNG.integers(-3, 4, size=(4, 6)) / 2, RNG.integers(-3, 4, size=(6, 4)) / 2
GAIN, VOCAB = RNG.integers(1, 5, size=4) / 2, RNG.integers(-3, 4, size=(4, 5)) / 2


def _yaml(a) -> str:
    return json.dumps(a.tolist())


def test_a_swiglu_block_with_rmsnorms_matches_numpy(tmp_path):
    text = (f"X: {_yaml(XS)}\nW_Q: {_yaml(WQ)}\nW_K: {_yaml(WK)}\nW_V: {_yaml(WV)}\nmask: causal\n"
            f"norm: {{type: rmsnorm, weight: {_yaml(GAIN)}, eps: 1e-6}}\n"
            f"mlp:\n  norm: {{type: rmsnorm, weight: {_yaml(GAIN[::-1])}, eps: 1e-6}}\n  W_gate: {_yaml(WG)}\n"
            f"  W_up: {_yaml(WU_)}\n  W_down: {_yaml(WD)}\n  activation: silu\n"
            f"logits: {{norm: {{type: rmsnorm, weight: {_yaml(GAIN)}, eps: 1e-6}}, W_U: {_yaml(VOCAB)}, rows: last, top: 2}}\n"
            "loss: {targets: [4]}\n")
    d = _derive(tmp_path, text)
    H = XS + _attention(_rms(XS, GAIN, 1e-6), WQ, WK, WV, True)
    h = _rms(H, GAIN[::-1], 1e-6)
    gate = h @ WG
    Y = H + (gate / (1 + np.exp(-gate)) * (h @ WU_)) @ WD
    z = _rms(Y[-1:], GAIN, 1e-6) @ VOCAB
    nll = np.log(np.exp(z).sum()) - z[0, 4]
    for stage, want in (("H", H), ("U_gate", gate), ("Y", Y), ("Y_last", Y[-1:]), ("logits", z), ("L", [[nll]])):
        assert np.allclose(d.approx(stage), want, rtol=1e-13, atol=1e-13), stage
    assert "2 likeliest next words" in symattn.render(d, "text")


def test_a_post_norm_gelu_mlp_matches_numpy(tmp_path):
    W1, W2 = RNG.integers(-3, 4, size=(4, 5)) / 2, RNG.integers(-3, 4, size=(5, 4)) / 2
    b1, b2 = RNG.integers(-2, 3, size=5) / 4, RNG.integers(-2, 3, size=4) / 4
    text = (f"X: {_yaml(XS)}\nW_Q: {_yaml(WQ)}\nW_K: {_yaml(WK)}\nW_V: {_yaml(WV)}\nmask: none\n"
            f"norm: {{type: layernorm, place: post, weight: {_yaml(GAIN)}, bias: {_yaml(b2)}, eps: 1e-12}}\n"
            f"mlp:\n  norm: {{type: layernorm, place: post, weight: {_yaml(GAIN)}, eps: 1e-12}}\n"
            f"  W_1: {_yaml(W1)}\n  b_1: {_yaml(b1)}\n  W_2: {_yaml(W2)}\n  b_2: {_yaml(b2)}\n  activation: gelu\n")
    d = _derive(tmp_path, text)
    H = _ln(XS + _attention(XS, WQ, WK, WV, False), GAIN, b2, 1e-12)
    u = H @ W1 + b1
    G = 0.5 * u * (1 + np.vectorize(math.erf)(u / math.sqrt(2)))
    Y = _ln(H + G @ W2 + b2, GAIN, 0, 1e-12)
    for stage, want in (("H", H), ("G", G), ("Y_sum", H + G @ W2 + b2), ("Y", Y)):
        assert np.allclose(d.approx(stage), want, rtol=1e-13, atol=1e-13), stage
    assert "The residual sum and its norm (post-norm, LayerNorm)" in symattn.render(d, "markdown")


@pytest.mark.parametrize("activation, exact", [
    ("gelu", lambda x: x / 2 * (1 + mpmath.erf(x / mpmath.sqrt(2)))),
    ("gelu-tanh", lambda x: x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x**3)))),
    ("silu", lambda x: x / (1 + mpmath.exp(-x))),
    ("relu2", lambda x: max(x, 0) ** 2),
])
def test_each_activation_against_mpmath(tmp_path, activation, exact):
    d = _derive(tmp_path, ATTENTION + MLP.replace("relu", activation))
    U = d.step("U").exact
    mpmath.mp.dps = 50
    for i in range(2):
        for j in range(3):
            want = exact(mpmath.mpf(sympy.Rational(U[i, j]).p) / sympy.Rational(U[i, j]).q)
            assert abs(d.evaluate("G", 40)[i][j] - want) < mpmath.mpf(10) ** -35
            assert abs(mpmath.mpf(sympy.N(d.step("G").exact[i, j], 45)) - want) < mpmath.mpf(10) ** -35


@pytest.mark.parametrize("answers, fragment", [
    ({"G": [[1.5, 0, -0.5], [0.5, 1, 0.5]]}, "the activation applied before the bias"),
    ({"Y": [[1.5, 0], [1, 1.5]]}, "the residual was left out: Y = F"),
    ({"P": [[0.8176, 0.0759, 0.018], [0.1824, 0.9241, 0.982]]}, "the softmax over the wrong axis"),
    ({"nll": [[3.726], [2.696]]}, "the base-2 logarithm"),
    ({"nll": [[0.08266], [0.369]]}, "the log of the wrong class"),
    ({"L": [[4.452]]}, "the sum over the rows instead of their mean"),
])
def test_check_diagnoses_the_block_slips(tmp_path, answers, fragment):
    text = symattn.check(_derive(tmp_path, HAND), answers).to_json()
    assert fragment in text, text


def test_check_diagnoses_gelus_forms_swapped(tmp_path):
    d = _derive(tmp_path, HAND.replace("relu", "gelu-tanh"))
    U = np.array(d.approx("U"))
    swapped = 0.5 * U * (1 + np.vectorize(math.erf)(U / math.sqrt(2)))  # the erf form where tanh's is asked
    assert "GELU's erf and tanh forms swapped" in symattn.check(d, {"G": np.round(swapped, 6).tolist()}).to_json()


def test_rows_last_and_a_hostile_vocabulary(tmp_path):
    words = ["<b>x</b>", "\\input{a}", "50%&$"]
    text = ATTENTION + MLP + HEAD.replace("[the, cat, sat]", json.dumps(words)).replace(
        "loss: {targets: [cat, sat]}", "loss: {targets: [2]}").replace("  vocab", "  rows: last\n  vocab")
    d = _derive(tmp_path, text)
    assert d.step("logits").exact.tolist() == [[R(3, 2), 3, R(3, 2)]]  # the last row only
    page, latex = symattn.render(d, "html"), symattn.render(d, "latex")
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "\\input{a}" not in latex and "\\textbackslash{}input" in latex


def test_a_tied_unembedding_is_the_table_transposed(tmp_path):
    table = [[1, 0], [0, 1], [-1, 1]]  # one row per word: W_U is its transpose
    d = _derive(tmp_path, HAND.replace("W_U: [[1, 0, -1], [0, 1, 1]]", f"tied: true\n  embeddings: {table}"))
    assert d.step("W_U").exact.tolist() == [[1, 0, -1], [0, 1, 1]]
    assert "tied: the embedding table, transposed" in d.step("W_U").title


@pytest.mark.parametrize("extra, fragment", [
    (MLP.replace("[[1, -1, 0], [0, 1, 1]]", "[[1, -1, 0]]") + HEAD, "mlp.W_1: is 1×3; W_1 needs one row per feature"),
    (MLP.replace("[[1, 0], [0, 1], [1, 1]]", "[[1, 0], [0, 1]]") + HEAD, "mlp.W_2: is 2×2; W_2 needs one row per column"),
    (MLP.replace("relu", "tanh") + HEAD, "mlp.activation: unknown activation 'tanh'"),
    (MLP.replace("activation: relu", "W_up: [[1, 0, 0], [0, 1, 0]]\n  activation: relu") + HEAD,
     "mlp: unknown key 'W_1' in mlp"),
    (MLP + HEAD.replace("W_U: [[1, 0, -1], [0, 1, 1]]", "tied: true"), "logits.tied: tied: true needs an embedding table"),
    (MLP + HEAD.replace("[cat, sat]", "[1, 3]"), "loss.targets item 2: target id 3 is out of range"),
    (MLP + HEAD.replace("[cat, sat]", "[1]"), "loss.targets: targets has 1 id, but the logits have 2 rows"),
    (MLP + HEAD.replace("W_U: [[1, 0, -1], [0, 1, 1]]", "W_U: [[1, 0, -1]]"), "logits.W_U: is 1×3; W_U needs one row"),
    (MLP + HEAD.replace("[the, cat, sat]", "[the, cat]"), "logits.vocab: vocab has 2 words, but the vocabulary has 3"),
    (MLP + HEAD.replace("vocab", "top: 0\n  vocab"), "logits.top: top is a whole number from 1 to 50"),
    (MLP + HEAD + "residual: false\n", "residual: the MLP reads the residual stream"),
    (MLP + HEAD + "backward: {loss: sum}\n",
     "backward: the backward pass through the MLP and the model's head starts from the cross-entropy"),
    (MLP + HEAD.replace("loss: {targets: [cat, sat]}\n", "") + "backward: {loss: cross-entropy}\n",
     "backward: loss: cross-entropy needs the problem's cross-entropy: give logits: and loss: {targets: [...]}"),
    (MLP + "backward: {loss: cross-entropy}\n", "backward: loss: cross-entropy needs the problem's cross-entropy"),
    (MLP + HEAD + "backward: {loss: cross_entropy}\n", "backward.loss: loss must be sum"),
    (MLP + "loss: {targets: [1, 2]}\n", "loss: the loss is the cross-entropy of the logits: give logits"),
    (MLP + HEAD.replace("[cat, sat]", "next"), "loss.targets: targets: next takes each token's next id"),
    (MLP + HEAD.replace("W_U: [[1, 0, -1], [0, 1, 1]]", "from: true"), "logits.from: logits: {from: true} reads the"),
    (MLP.replace("W_1", "W_gate").replace("b_1: [0, 0, -1]", "W_up: [[1, 0, 0], [0, 1, 0]]").replace("W_2", "W_down")
     .replace("  b_2: [0, 1]\n", "") + HEAD, "mlp.activation: unknown activation 'relu'; a gated MLP takes silu"),
    (MLP.replace("  activation: relu\n", "") + HEAD, "mlp.activation: mlp needs activation"),
])
def test_bad_block_inputs(tmp_path, symattn_cli, extra, fragment):
    line = _error(tmp_path, ATTENTION + extra, symattn_cli)
    assert fragment in line, line


def test_the_backward_option_goes_back_from_the_cross_entropy_and_generate_from_refuses_the_block(tmp_path, symattn_cli):
    """--backward on a problem with its own cross-entropy goes back from it (a loss on H would skip
    the MLP and the head); without a loss it is refused; generate --from does not vary a block yet."""
    path = _write(tmp_path, HAND)
    r = symattn_cli.main("derive", path, "--backward", "-f", "json", "--no-check")
    assert r.code == 0, r.stderr
    ids = [s["id"] for s in json.loads(r.stdout)["stages"]]
    assert ids.index("dlogits") < ids.index("dW_U") < ids.index("dF") < ids.index("dH") < ids.index("dX")
    no_loss = _write(tmp_path, ATTENTION + MLP + HEAD.replace("loss: {targets: [cat, sat]}\n", ""), "no_loss.yaml")
    r = symattn_cli.main("derive", no_loss, "--backward")
    assert r.code == 1 and "loss: cross-entropy needs the problem's cross-entropy" in r.stderr, r.stderr
    r = symattn_cli.main("generate", "--from", path, "--count", "1", "--out-dir", tmp_path / "out")
    assert r.code == 1 and "--from does not vary problems with an MLP or logits yet" in r.stderr, r.stderr


def test_a_constant_row_under_a_norm_without_eps_and_symbols_are_refused(tmp_path, symattn_cli):
    # uniform attention on equal rows: H's rows are constant, and the MLP's LayerNorm has ε = 0
    flat = ATTENTION.replace("X: [[1, 0], [0, 1]]", "X: [[1, 1], [1, 1]]") + \
        MLP.replace("mlp:\n", "mlp:\n  norm: {type: layernorm, eps: 0}\n")
    assert "has variance 0 (every entry equal" in _error(tmp_path, flat, symattn_cli)
    symbolic = "symbols: [a]\n" + ATTENTION.replace("X: [[1, 0], [0, 1]]", "X: [[a, 0], [0, 1]]") + MLP
    assert "mlp: the MLP needs numbers" in _error(tmp_path, symbolic, symattn_cli)
