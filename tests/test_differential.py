"""Differential attention (differential: {lambda, W_Q2, W_K2}), exactly.

References written here, each test saying which it uses:
- the worked example by hand: mpmath at 50 digits from the softmax written out term by term, and
  SymPy for the exact identities (every row sums to 1 − λ; two equal maps leave (1 − λ)·A₁);
- NumPy float64 from the paper's formula (Ye et al., 2024, "Differential Transformer", eq. 1:
  (softmax(Q₁K₁ᵀ/√d) − λ·softmax(Q₂K₂ᵀ/√d))·V; its GroupNorm as RMSNorm of each head's rows, then
  times 1 − λ_init), with RoPE's rotation written here too;
- PyTorch: torch.nn.functional.scaled_dot_product_attention once for each of the two maps, and
  F.rms_norm (skips without torch);
- Hugging Face transformers' DiffLlamaAttention in float64, the problem's weights loaded into it and
  its λ_q, λ_k set to 0 so that its λ is λ_init (skips without transformers).
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn.check import load_answers, mark
from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "differential.yaml"
EPS = np.finfo(np.float64).eps


def _problem(text: str, tmp_path: Path, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return symattn.load_problem(path), path


def _f(m) -> np.ndarray:
    return np.array([[float(Fraction(str(x))) for x in row] for row in (m.tolist() if hasattr(m, "tolist") else m)])


def _bound(*arrays) -> float:
    """float64's rounding of these short sums, exponentials and quotients: a few dozen roundings of the
    largest magnitude."""
    return 64 * EPS * max(1.0, *(float(np.max(np.abs(a))) for a in arrays))


# -- the references ----------------------------------------------------------------------------


def softmax_rows(Z: np.ndarray) -> np.ndarray:
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


def rope_half(x: np.ndarray, base: float) -> np.ndarray:
    """RoPE with the half pairing (Hugging Face's rotate_half): entry i pairs with i + d/2, position p
    (from 0) turned by p·base^(−2i/d)."""
    n, d = x.shape
    theta = base ** (-np.arange(0, d, 2) / d)
    angle = np.arange(n)[:, None] * np.concatenate([theta, theta])[None, :]
    rotated = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=1)
    return x * np.cos(angle) + rotated * np.sin(angle)


def diff_attention(X, W_Q, W_K, W_Q2, W_K2, W_V, lam, M, rope=None, paper=None):
    """One head of the paper's eq. 1 in NumPy: both maps through the same 1/√d and mask M, then
    (A₁ − λA₂)·V; ``paper`` (λ_init, ε): each output row over its root mean square, times 1 − λ_init."""
    Q1, K1, Q2, K2, V = X @ W_Q, X @ W_K, X @ W_Q2, X @ W_K2, X @ W_V
    if rope is not None:
        Q1, K1, Q2, K2 = (rope_half(x, rope) for x in (Q1, K1, Q2, K2))
    d = Q1.shape[1]
    A1 = softmax_rows(Q1 @ K1.T / np.sqrt(d) + M)
    A2 = softmax_rows(Q2 @ K2.T / np.sqrt(d) + M)
    O = (A1 - lam * A2) @ V
    if paper is not None:
        lambda_init, eps = paper
        O = O / np.sqrt((O * O).mean(axis=1, keepdims=True) + eps) * (1 - lambda_init)
    return A1, A2, O


# -- the worked example, by hand ----------------------------------------------------------------


def test_the_worked_example_by_hand():
    """Reference: mpmath at 50 digits, each softmax written out as e^{s_ij}/Σ_j e^{s_ij}; SymPy for the identities."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    raw = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    mpmath.mp.dps = 50
    X = [[mpmath.mpf(x) for x in r] for r in raw["X"]]
    mat = lambda a, b: [[mpmath.fsum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))]  # noqa: E731
                        for i in range(len(a))]
    lam = mpmath.mpf(4) / 5
    Q1, K1 = mat(X, raw["W_Q"]), mat(X, raw["W_K"])
    Q2, K2 = mat(X, raw["differential"]["W_Q2"]), mat(X, raw["differential"]["W_K2"])
    V = mat(X, raw["W_V"])

    def softmax(Q, K):  # causal: row i reads keys j ≤ i
        out = []
        for i in range(3):
            e = [mpmath.exp(mpmath.fsum(a * b for a, b in zip(Q[i], K[j])) / mpmath.sqrt(2)) for j in range(i + 1)]
            out.append([x / mpmath.fsum(e) for x in e] + [mpmath.mpf(0)] * (2 - i))
        return out

    A1, A2 = softmax(Q1, K1), softmax(Q2, K2)
    A_diff = [[A1[i][j] - lam * A2[i][j] for j in range(3)] for i in range(3)]
    O = [[mpmath.fsum(A_diff[i][j] * V[j][c] for j in range(3)) for c in range(2)] for i in range(3)]
    for name, want in (("A", A1), ("A_2", A2), ("A_diff", A_diff), ("O", O)):
        got = d.step(name).exact
        for i, row in enumerate(want):
            for j, x in enumerate(row):
                assert abs(mpmath.mpf(str(sympy.N(got[i, j], 50))) - x) < mpmath.mpf(10) ** -45, (name, i, j)
    # the one negative weight: row 2, column 1 (the second map prefers token 1, the first token 2)
    negative = [(i + 1, j + 1) for i in range(3) for j in range(3) if A_diff[i][j] < 0]
    assert negative == [(2, 1)]
    assert "the weight at row 2, column 1 is negative" in d.step("A_diff").why
    # every row sums to 1 − λ = 1/5, exactly
    assert list(d.step("A_diff_sums").exact) == [sympy.Rational(1, 5)] * 3
    # token 3's two maps are the same (the same scores), so the difference is (1 − λ)·A₁ exactly
    A_exact, diff_exact = d.step("A").exact, d.step("A_diff").exact
    assert all(sympy.simplify(diff_exact[2, j] - A_exact[2, j] / 5) == 0 for j in range(3))
    assert d.last_check is None or d.last_check.passed


# -- NumPy from the paper's formula ---------------------------------------------------------------

X4 = [[1, 0, 1], [0, 2, -1], [1, 1, 1], [-1, 0, 2]]
HEAD = {"W_Q": [[1, 0], [0, 1], [1, -1]], "W_K": [[1, 1], [0, 1], [-1, 0]], "W_V": [[1, 0], [0, 1], [1, 1]],
        "W_Q2": [[0, 1], [1, 0], [1, 1]], "W_K2": [[1, 0], [1, 1], [0, -1]]}
HEAD2 = {"W_Q": [[0, 1], [1, 1], [1, 0]], "W_K": [[1, 0], [0, 2], [1, 1]], "W_V": [[0, 1], [1, 0], [2, 1]],
         "W_Q2": [[1, 1], [0, 1], [-1, 0]], "W_K2": [[0, 1], [1, 0], [1, -1]]}
W_O = [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, -1, 1]]


def _text(heads: int, lam: str, extra: str = "", paper: str = "") -> str:
    flow = lambda m: "[" + ", ".join("[" + ", ".join(str(x) for x in r) + "]" for r in m) + "]"  # noqa: E731
    out = f"X: {flow(X4)}\n"
    tail = f", diff_transformer: {paper}" if paper else ""
    if heads == 1:
        out += "".join(f"{k}: {flow(HEAD[k])}\n" for k in ("W_Q", "W_K", "W_V"))
        out += f"differential: {{lambda: {lam}, W_Q2: {flow(HEAD['W_Q2'])}, W_K2: {flow(HEAD['W_K2'])}{tail}}}\n"
    else:
        out += "heads:\n" + "".join(f"  - {{W_Q: {flow(h['W_Q'])}, W_K: {flow(h['W_K'])}, W_V: {flow(h['W_V'])}}}\n"
                                     for h in (HEAD, HEAD2))
        out += f"W_O: {flow(W_O)}\n"
        out += (f"differential: {{lambda: {lam}, heads: [" + ", ".join(
            f"{{W_Q2: {flow(h['W_Q2'])}, W_K2: {flow(h['W_K2'])}}}" for h in (HEAD, HEAD2)) + f"]{tail}}}\n")
    return out + extra


CASES = {  # heads, λ, more fields, the mask as the paper's M, RoPE's base
    "causal": (1, "0.8", "mask: causal\n", None),
    "heads-causal": (2, "1/2", "mask: causal\n", None),
    "rope-sliding-window": (1, "4/5", "mask: {sliding-window: 2}\nrope: {base: 10000}\n", 10000.0),
    "heads-rope-causal": (2, "3/5", "mask: causal\nrope: {base: 100}\n", 100.0),
    "padding-bias": (1, "1/4", "mask: {padding: [1, 1, 1, 0]}\nbias: [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]\n",
                     None),
}


def _numpy_case(p, base, paper=None):
    X = _f(X4)
    allowed = np.array(p.mask.allowed, bool)
    M = np.where(allowed, 0.0, -np.inf) + (_f(p.bias) if p.bias is not None else 0.0)
    lam = float(p.differential.lam)
    heads = [HEAD] if not p.multi_head else [HEAD, HEAD2]
    return [diff_attention(X, *(_f(h[k]) for k in ("W_Q", "W_K", "W_Q2", "W_K2", "W_V")), lam, M, base, paper)
            for h in heads]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_stage_matches_the_papers_formula_in_numpy(case, tmp_path):
    """Reference: NumPy float64 from the paper's eq. 1, written here (RoPE's rotation too), then concat·W_O."""
    heads, lam, extra, base = CASES[case]
    p, _ = _problem(_text(heads, lam, extra), tmp_path)
    d = symattn.derive(p)
    results = _numpy_case(p, base)
    for h, (A1, A2, O) in enumerate(results, 1):
        prefix = f"head{h}." if p.multi_head else ""
        bound = _bound(A1, A2, O)
        assert np.max(np.abs(d.approx(prefix + "A") - A1)) <= bound
        assert np.max(np.abs(d.approx(prefix + "A_2") - A2)) <= bound
        assert np.max(np.abs(d.approx(prefix + "A_diff") - (A1 - float(p.differential.lam) * A2))) <= bound
        assert np.max(np.abs(d.approx(prefix + "O") - O)) <= bound
        assert list(d.step(prefix + "A_diff_sums").exact) == [1 - p.differential.lam] * 4  # exactly 1 − λ
        assert (prefix + "Q_2rot" in d.ids) == (base is not None)
    if p.multi_head:
        want = np.concatenate([O for _, _, O in results], axis=1) @ _f(W_O)
        assert np.max(np.abs(d.approx("O") - want)) <= _bound(want, _f(W_O))
    assert symattn.crosscheck(d).passed


def test_lambda_is_exact_from_its_text(tmp_path):
    p, _ = _problem(_text(1, "0.8", "mask: causal\n"), tmp_path)
    assert p.differential.lam == sympy.Rational(4, 5)
    assert list(symattn.derive(p).step("A_diff_sums").exact) == [sympy.Rational(1, 5)] * 4


@pytest.mark.parametrize("heads", [1, 2])
def test_the_papers_norm_matches_numpy(heads, tmp_path):
    """Reference: NumPy float64, each head's rows over √(mean square + ε), times 1 − λ_init, written here."""
    p, _ = _problem(_text(heads, "4/5", "mask: causal\n", "{lambda_init: 1/5, eps: 1/1000}"), tmp_path)
    d = symattn.derive(p)
    results = _numpy_case(p, None, (0.2, 1e-3))
    for h, (_, _, O) in enumerate(results, 1):
        prefix = f"head{h}." if p.multi_head else ""
        assert np.max(np.abs(d.approx(prefix + "O_subln") - O)) <= _bound(O)
        # without the norm the head's output is A_diff·V; the norm and 1 − λ_init act on it
        plain = d.approx(prefix + "O")
        ms = (plain * plain).mean(axis=1, keepdims=True)
        assert np.max(np.abs(d.approx(prefix + "O_ms") - ms)) <= _bound(ms)
    if heads == 2:  # concat reads O_subln
        want = np.concatenate([O for _, _, O in results], axis=1) @ _f(W_O)
        assert np.max(np.abs(d.approx("O") - want)) <= _bound(want, _f(W_O))
        assert np.array_equal(d.approx("concat"), np.concatenate([d.approx(f"head{h}.O_subln") for h in (1, 2)], axis=1))
    assert symattn.crosscheck(d).passed


ROPE_HEADS = """X: [[1, 0], [0, 1], [1, 1]]
heads:
  - {W_Q: [[1, 0], [0, 1]], W_K: [[1, 0], [0, 1]], W_V: [[1, 0], [1, 2]]}
  - {W_Q: [[0, 1], [1, 0]], W_K: [[1, 1], [0, 1]], W_V: [[0, 1], [1, 1]]}
W_O: [[1, 0], [0, 1], [1, 1], [0, 1]]
mask: causal
rope: {base: 10000}
differential:
  lambda: 4/5
  heads: [{W_Q2: [[0, 1], [1, 0]], W_K2: [[1, 0], [0, 1]]}, {W_Q2: [[1, 0], [1, 1]], W_K2: [[0, 1], [1, 0]]}]
  diff_transformer: {lambda_init: 4/5, eps: 1e-5}
"""
HEAD_NORM_STAGES = ["head1.O_ms", "head1.O_subln", "head2.O_ms", "head2.O_subln", "concat", "O"]


def test_the_papers_norm_under_rope_base_10000_with_two_heads(tmp_path, capsys):
    """Reference: NumPy float64 from the paper's eq. 1 with RoPE (rotate_half, θ = 10000^(−2i/d) = 1 for
    d_k = 2) and its per-head norm, written here, then concat·W_O. The per-head norm's exact entries
    (roots of sums of squares of sums of exponentials of cosines) are shown in decimals."""
    p, path = _problem(ROPE_HEADS, tmp_path)
    d = symattn.derive(p)
    raw = yaml.safe_load(ROPE_HEADS)
    X = _f(raw["X"])
    M = np.where(np.tril(np.ones((3, 3), bool)), 0.0, -np.inf)
    outs = []
    for h, (w, pair) in enumerate(zip(raw["heads"], raw["differential"]["heads"]), 1):
        _, _, plain = diff_attention(X, _f(w["W_Q"]), _f(w["W_K"]), _f(pair["W_Q2"]), _f(pair["W_K2"]), _f(w["W_V"]),
                                     0.8, M, 10000.0)
        _, _, O = diff_attention(X, _f(w["W_Q"]), _f(w["W_K"]), _f(pair["W_Q2"]), _f(pair["W_K2"]), _f(w["W_V"]),
                                 0.8, M, 10000.0, (0.8, 1e-5))
        assert np.max(np.abs(d.approx(f"head{h}.O") - plain)) <= _bound(plain)
        ms = (plain * plain).mean(axis=1, keepdims=True)
        assert np.max(np.abs(d.approx(f"head{h}.O_ms") - ms)) <= _bound(ms)
        assert np.max(np.abs(d.approx(f"head{h}.O_subln") - O)) <= _bound(O, 1 / np.sqrt(ms + 1e-5))
        outs.append(O)
    want = np.concatenate(outs, axis=1) @ _f(raw["W_O"])
    assert np.max(np.abs(d.approx("O") - want)) <= _bound(want, 1 / np.sqrt(1e-5))
    assert symattn.crosscheck(d).passed
    assert [i for i in HEAD_NORM_STAGES if not d.step(i).written_exactly] == HEAD_NORM_STAGES
    # the head's own output is still written exactly; its norm says why it is in decimals
    assert d.step("head1.O").written_exactly and d.step("head1.A_diff").written_exactly
    assert main(["derive", str(path), "-f", "text"]) == 0
    text = capsys.readouterr().out
    assert text.count("too long to print, so they are shown in decimals") == len(HEAD_NORM_STAGES)
    assert "√(msᵢ + ε) of such a sum of squares" in text
    assert main(["derive", str(path), "-f", "json"]) == 0
    stages = {s["id"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
    for i in HEAD_NORM_STAGES:
        assert stages[i]["exact"] is None and np.allclose(stages[i]["approx"], d.approx(i), rtol=0, atol=0)


def test_the_papers_norm_is_written_exactly_where_it_is_short(tmp_path):
    """Reference: SymPy by hand. Each token attends to itself alone (a window of 1), so both maps are
    the identity, O = (1 − λ)·V is rational and so is each mean square: every entry is short and exact."""
    text = ("X: [[1, 2], [3, 0]]\nW_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1, 0], [0, 1]]\n"
            "mask: {sliding-window: 1}\ndifferential: {lambda: 1/2, W_Q2: [[0, 1], [1, 0]], W_K2: [[1, 0], [0, 1]], "
            "diff_transformer: {lambda_init: 1/4, eps: 1/100}}\n")
    p, _ = _problem(text, tmp_path)
    d = symattn.derive(p)
    half = sympy.Rational(1, 2)
    O = sympy.Matrix([[1, 2], [3, 0]]) * half
    ms = [sum(x ** 2 for x in O.row(i)) / 2 for i in range(2)]
    assert list(d.step("O_ms").exact) == ms == [sympy.Rational(5, 8), sympy.Rational(9, 8)]
    want = [O[i, k] / sympy.sqrt(ms[i] + sympy.Rational(1, 100)) * sympy.Rational(3, 4) for i in range(2) for k in range(2)]
    assert all(sympy.simplify(a - b) == 0 for a, b in zip(d.step("O_subln").exact, want))
    assert d.step("O_ms").written_exactly and d.step("O_subln").written_exactly


# -- PyTorch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["causal", "heads-causal", "padding-bias"])
def test_each_map_matches_torch_sdpa(case, tmp_path):
    """Reference: PyTorch's scaled_dot_product_attention, called here once for each of the two maps."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    heads, lam, extra, _ = CASES[case]
    p, _ = _problem(_text(heads, lam, extra), tmp_path)
    d = symattn.derive(p)
    X = torch.tensor(_f(X4))
    allowed = torch.tensor(p.mask.allowed)
    mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    if p.bias is not None:
        mask = mask + torch.tensor(_f(p.bias))
    eye = torch.eye(4, dtype=torch.float64)
    for h, w in enumerate([HEAD] if heads == 1 else [HEAD, HEAD2], 1):
        W = {k: torch.tensor(_f(v)) for k, v in w.items()}
        prefix = f"head{h}." if p.multi_head else ""
        sdpa = lambda q, k, v: F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]  # noqa: E731
        A1, A2 = sdpa(X @ W["W_Q"], X @ W["W_K"], eye), sdpa(X @ W["W_Q2"], X @ W["W_K2"], eye)
        O = sdpa(X @ W["W_Q"], X @ W["W_K"], X @ W["W_V"]) - float(p.differential.lam) * sdpa(
            X @ W["W_Q2"], X @ W["W_K2"], X @ W["W_V"])
        bound = _bound(A1.numpy(), O.numpy())
        assert np.max(np.abs(d.approx(prefix + "A") - A1.numpy())) <= bound
        assert np.max(np.abs(d.approx(prefix + "A_2") - A2.numpy())) <= bound
        assert np.max(np.abs(d.approx(prefix + "O") - O.numpy())) <= bound
    assert symattn.crosscheck(d, torch=True).passed


@pytest.mark.parametrize("rope", [None, 10000.0])
def test_diffllama_attention_agrees(rope, tmp_path):
    """Reference: transformers' DiffLlamaAttention in float64 (its sdpa path), the problem's weights loaded
    into it: attention heads 1..h are the maps A₁ of symattn's heads, h+1..2h their maps A₂; a head's
    values are two DiffLlama value heads side by side (d_v = 2·d_k); λ_q1 = λ_k1 = λ_q2 = λ_k2 = 0, so
    its λ = e⁰ − e⁰ + λ_init = λ_init; its groupnorm (RMSNorm over 2·d_k, no weight) is the paper's
    norm, then 1 − λ_init; o_proj is W_O."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.diffllama.configuration_diffllama import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention

    V1 = {"W_V": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, -1]]}
    V2 = {"W_V": [[0, 1, 1, 1], [1, 0, -1, 0], [0, 2, 1, 0]]}
    heads = [{**HEAD, **V1}, {**HEAD2, **V2}]
    flow = lambda m: "[" + ", ".join("[" + ", ".join(str(x) for x in r) + "]" for r in m) + "]"  # noqa: E731
    w_o = [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, -1, 1], [1, 0, 0], [0, 0, 1], [2, 1, 0], [0, 1, -1]]
    text = (f"X: {flow(X4)}\nheads:\n" + "".join(f"  - {{W_Q: {flow(h['W_Q'])}, W_K: {flow(h['W_K'])}, W_V: "
                                                   f"{flow(h['W_V'])}}}\n" for h in heads)
            + f"W_O: {flow(w_o)}\nmask: causal\n" + (f"rope: {{base: {int(rope)}}}\n" if rope else "")
            + "differential: {lambda: 3/5, heads: [" + ", ".join(f"{{W_Q2: {flow(h['W_Q2'])}, W_K2: {flow(h['W_K2'])}}}"
                                                               for h in heads)
            + "], diff_transformer: {lambda_init: 3/5, eps: 1e-5}}\n")
    p, _ = _problem(text, tmp_path)
    d = symattn.derive(p)
    config = DiffLlamaConfig(hidden_size=3, num_attention_heads=4, num_key_value_heads=4, head_dim=2,
                             rms_norm_eps=1e-5, attention_dropout=0.0, attention_bias=False)
    config._attn_implementation = "sdpa"
    module = DiffLlamaAttention(config, layer_idx=0).double().eval()
    T = lambda m: torch.tensor(_f(m)).T  # noqa: E731  (nn.Linear stores out × in)
    with torch.no_grad():
        module.q_proj.weight.copy_(torch.cat([T(h["W_Q"]) for h in heads] + [T(h["W_Q2"]) for h in heads]))
        module.k_proj.weight.copy_(torch.cat([T(h["W_K"]) for h in heads] + [T(h["W_K2"]) for h in heads]))
        module.v_proj.weight.copy_(torch.cat([T(h["W_V"])[:2] for h in heads] + [T(h["W_V"])[2:] for h in heads]))
        module.o_proj.weight.copy_(T(w_o))
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(module, name).zero_()
    module.lambda_init = 0.6
    n = 4
    if rope is None:
        cos, sin = torch.ones(1, n, 2, dtype=torch.float64), torch.zeros(1, n, 2, dtype=torch.float64)
    else:
        theta = rope ** (-torch.arange(0, 2, 2, dtype=torch.float64) / 2)
        angle = torch.arange(n, dtype=torch.float64)[:, None] * torch.cat([theta, theta])[None, :]
        cos, sin = angle.cos()[None], angle.sin()[None]
    mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    seen = []  # what o_proj reads: the heads' normalised outputs side by side
    module.o_proj.register_forward_pre_hook(lambda mod, args: seen.append(args[0][0].clone()))
    with torch.no_grad():
        out, _ = module(torch.tensor(_f(X4))[None], (cos, sin), attention_mask=mask)
    heads_out = np.concatenate([d.approx(f"head{h}.O_subln") for h in (1, 2)], axis=1)
    assert np.max(np.abs(heads_out - seen[0].numpy())) <= 1e-12
    assert np.max(np.abs(heads_out @ _f(w_o) - out[0].numpy())) <= 1e-12  # and o_proj is W_O


# -- symattn check ------------------------------------------------------------------------------


def _mark(d, answers: dict, tmp_path) -> dict:
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump(answers))
    return {s["id"]: s for s in mark(d, load_answers(path, d)).as_dict()["stages"]}


def _rounded(m) -> list[list[str]]:
    return [[f"{x:.6f}" for x in row] for row in np.asarray(m).tolist()]


@pytest.mark.parametrize("wrong, name", [
    (lambda A1, A2, lam: A2 - lam * A1, "λ applied to the wrong map"),
    (lambda A1, A2, lam: lam * (A1 - A2), "λ applied to the wrong map"),
    (lambda A1, A2, lam: A1 + lam * A2, "the maps added instead of subtracted"),
    (lambda A1, A2, lam: A1 - A2, "λ left out"),
])
def test_check_names_the_differential_maps_mistakes(wrong, name, tmp_path):
    """Reference: the hand answers written here in NumPy from the two maps (A₁ and A₂ from the paper's
    formula), each with one slip of the difference."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    raw = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    X = _f(raw["X"])
    M = np.where(np.tril(np.ones((3, 3), bool)), 0.0, -np.inf)
    A1, A2, _ = diff_attention(X, _f(raw["W_Q"]), _f(raw["W_K"]), _f(raw["differential"]["W_Q2"]),
                               _f(raw["differential"]["W_K2"]), _f(raw["W_V"]), 0.8, M)
    slip = wrong(A1, A2, 0.8)
    V = X @ _f(raw["W_V"])
    by_id = _mark(d, {"A_diff": _rounded(slip), "O": _rounded(slip @ V)}, tmp_path)
    assert by_id["A_diff"]["status"] == "wrong" and name in by_id["A_diff"]["diagnosis"], by_id["A_diff"]
    assert by_id["O"]["status"] == "follows" and by_id["O"]["follows_from"] == ["A_diff"]  # from their own A_diff
    alone = _mark(d, {"O": _rounded(slip @ V)}, tmp_path)["O"]
    assert alone["status"] == "wrong" and name in alone["diagnosis"], alone
    sums = _mark(d, {"A_diff_sums": _rounded(slip.sum(axis=1, keepdims=True))}, tmp_path)["A_diff_sums"]
    if np.allclose(slip.sum(axis=1), 1 - 0.8):  # A₂ − λA₁ sums to 1 − λ too: its row sums are right
        assert sums["status"] == "right", sums
    else:
        assert sums["status"] == "wrong" and name in sums["diagnosis"], sums


def test_check_names_the_missing_factor_of_the_papers_norm(tmp_path):
    """Reference: NumPy, the head's rows over √(ms + ε) without the factor 1 − λ_init, written here."""
    p, _ = _problem(_text(1, "4/5", "mask: causal\n", "{lambda_init: 1/5, eps: 1/1000}"), tmp_path)
    d = symattn.derive(p)
    O = d.approx("O")
    normed = O / np.sqrt((O * O).mean(axis=1, keepdims=True) + 1e-3)
    got = _mark(d, {"O_subln": _rounded(normed)}, tmp_path)["O_subln"]
    assert got["status"] == "wrong" and "(1 − λ_init) left out" in got["diagnosis"], got


def test_check_names_the_second_maps_missing_scale(tmp_path):
    """Reference: the second map's masked scores without 1/√2, in NumPy here."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    S2 = _f(d.step("S_2").exact.tolist())
    unscaled = np.where(np.tril(np.ones((3, 3), bool)), S2, -np.inf)
    answer = [["-inf" if np.isinf(x) else f"{x:.6f}" for x in row] for row in unscaled]
    got = _mark(d, {"S_2masked": answer}, tmp_path)["S_2masked"]
    assert got["status"] == "wrong" and "no scaling" in got["diagnosis"], got


def test_right_answers_pass(tmp_path):
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    answers = {s.id: _rounded(d.approx(s.id)) for s in d if not s.given and "inf" not in str(d.approx(s.id))}
    by_id = _mark(d, answers, tmp_path)
    assert by_id and all(s["status"] == "right" for s in by_id.values()), by_id


# -- every format, and what is refused -----------------------------------------------------------


def test_every_format_shows_both_maps_and_the_difference(capsys):
    for fmt, marks in (("text", ["DiffAttn(X)", "A_diff = A₁ − 4/5·A_2", "row sum", "row 2, column 1 is negative"]),
                       ("markdown", ["A_{diff}", "\\hat{S}_2", "common-mode noise"]),
                       ("latex", ["\\operatorname{DiffAttn}", "A_{diff}", "\\ensuremath{\\lambda}"]),
                       ("html", ["stage-A_2", "stage-A_diff", "stage-A_diff_sums"])):
        assert main(["derive", str(EXAMPLE), "-f", fmt]) == 0
        out = capsys.readouterr().out
        assert all(m in out for m in marks), (fmt, [m for m in marks if m not in out])
    assert main(["derive", str(EXAMPLE), "-f", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    ids = [s["id"] for s in data["stages"]]
    assert ids == ["X", "W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "W_Q2", "W_K2",
                   "Q_2", "K_2", "S_2", "S_2masked", "A_2", "A_diff", "A_diff_sums", "O"]
    assert data["crosscheck"]["passed"] is True


@pytest.mark.parametrize("option, field", [(["--backward"], "backward"), (["--tiled", "2"], "--tiled"),
                                           (["--decode", "2"], "--decode")])
def test_passes_it_does_not_derive_are_refused_in_one_line(option, field, capsys):
    code = main(["derive", str(EXAMPLE), "-f", "text", *option])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("Error: ")
    assert f"{field}: " in err and "differential" in err and "not derived" in err


BLOCK = """X: [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]]
W_Q: [[1, 0], [0, 1], [1, 1], [0, 1]]
W_K: [[0, 1], [1, 0], [-1, 1], [1, 0]]
W_V: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]]
mask: causal
norm: {type: rmsnorm, eps: 1/100}
mlp: {W_1: [[1, 0], [0, 1], [1, 1], [0, 0]], W_2: [[1, 0, 0, 1], [0, 1, 1, 0]], activation: relu}
differential: {lambda: 1/2, W_Q2: [[0, 1], [1, 0], [1, 0], [0, 1]], W_K2: [[1, 0], [0, 1], [0, 1], [1, 1]]PAPER}
"""


@pytest.mark.parametrize("paper", [None, (0.5, 0.01)])
def test_the_rest_of_the_block_reads_the_differential_output(paper, tmp_path):
    """Reference: NumPy here, RMSNorm of X (no weight), the paper's eq. 1 (and its norm), then H = X + O."""
    text = BLOCK.replace("PAPER", ", diff_transformer: {lambda_init: 1/2, eps: 1/100}" if paper else "")
    p, _ = _problem(text, tmp_path)
    d = symattn.derive(p)
    raw = yaml.safe_load(text)
    X = _f(raw["X"])
    Xn = X / np.sqrt((X * X).mean(axis=1, keepdims=True) + 0.01)
    M = np.where(np.tril(np.ones((3, 3), bool)), 0.0, -np.inf)
    _, _, O = diff_attention(Xn, _f(raw["W_Q"]), _f(raw["W_K"]), _f(raw["differential"]["W_Q2"]),
                             _f(raw["differential"]["W_K2"]), _f(raw["W_V"]), 0.5, M, None, paper)
    assert np.max(np.abs(d.approx("H") - (X + O))) <= _bound(X, O)
    assert symattn.crosscheck(d).passed


# -- symattn generate --differential ------------------------------------------------------------


@pytest.mark.parametrize("options", [{"d_k": 1, "d_v": 2, "tokens": 3}, {"heads": 2, "d_k": 1, "d_v": 1, "mask": "none"},
                                     {"d_k": 4, "d_v": 2, "mask": "sliding-window:2"}])
def test_generated_differential_exercises_keep_their_guarantees(options):
    """Reference: each problem's second map recomputed here in NumPy from its own numbers."""
    problems = symattn.generate(3, seed=5, differential="1/2", **options)
    assert [p.to_yaml() for p in problems] == [p.to_yaml() for p in symattn.generate(3, seed=5, differential="1/2",
                                                                                      **options)]
    for p in problems:
        assert p.differential.lam == sympy.Rational(1, 2) and "differential:\n  lambda: 1/2" in p.to_yaml()
        d = symattn.derive(p)
        assert symattn.crosscheck(d).passed
        X = _f(p.X)
        allowed = np.array(p.mask.allowed)
        for h, (w, (W_Q2, W_K2)) in enumerate(zip(p.heads, p.differential.maps), 1):
            S1 = (X @ _f(w.W_Q)) @ (X @ _f(w.W_K)).T
            S2 = (X @ _f(W_Q2)) @ (X @ _f(W_K2)).T
            assert np.abs(S2).max() <= 8 and np.abs(X @ _f(W_Q2)).max() <= 4  # the easy level's bounds
            root = np.sqrt(_f(W_Q2).shape[1])
            assert np.all(S2 / root == np.round(S2 / root))  # whole scaled scores
            assert max(len({S2[i, j] for j in range(len(S2)) if allowed[i, j]}) for i in range(len(S2))) <= 2
            assert any(S1[i, j] - S1[i].max() != S2[i, j] - S2[i].max()
                       for i in range(len(S2)) for j in range(len(S2)) if allowed[i, j])  # two different maps
            prefix = f"head{h}." if p.multi_head else ""
            assert list(d.step(prefix + "A_diff_sums").exact) == [sympy.Rational(1, 2)] * len(S2)


def test_generate_differential_refuses_what_it_cannot_follow(capsys):
    for args, message in ((["--differential", "3/2"], "between 0 and 1"), (["--differential", "x"], "a fraction"),
                          (["--differential", "1/2", "--cross", "3"], "--cross"),
                          (["--differential", "1/2", "--linear", "relu"], "--linear"),
                          (["--differential", "1/2", "--block"], "--block")):
        assert main(["generate", *args]) == 1
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_generate_from_a_differential_problem_is_refused(capsys):
    assert main(["generate", "--from", str(EXAMPLE)]) == 1
    err = capsys.readouterr().err
    assert "--from does not vary differential attention" in err and len(err.strip().splitlines()) == 1, err
