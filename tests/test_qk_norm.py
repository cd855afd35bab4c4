"""QK-norm (``qk_norm:``, Qwen 3's q_norm and k_norm): each head's query and key rows normalised by
RMSNorm over d_k before RoPE; its stages, the bound it puts on the scores, every format, check's
diagnoses, bad inputs and ``from:`` with Qwen 3's tensors.

The references, each named where it is used:

- by hand: the worked example's mean squares (9, 1, 9; 1, 4, 9) and normalised rows, as Fractions;
- NumPy from the formula: q/√(mean(q²) + ε)·γ, then (with RoPE) rotate_half, then attention;
- PyTorch's ``nn.RMSNorm`` (its weight set to γ) on each head's Q and K, and
  ``F.scaled_dot_product_attention`` (``enable_gqa``) for the weights;
- Hugging Face transformers' own ``Qwen3Attention`` (``transformers.models.qwen3``) in a tiny
  ``Qwen3ForCausalLM`` written by ``save_pretrained`` in float64, for ``from:``.
"""

from __future__ import annotations

import dataclasses
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _error, _write

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "qk_norm.yaml"
TOL = 1e-12

GQA = """\
tokens: [a, b, c, d]
X: [[1, 0, 2], [0, 1, -1], [1, 1, 0], [2, -1, 1]]
kv_heads: 1
heads:
  - W_Q: [[3, 4], [1, 0], [0, 1]]
  - W_Q: [[1, 2], [2, 1], [-1, 0]]
kv:
  - {W_K: [[1, 1], [0, 2], [1, 0]], W_V: [[1, 0], [0, 1], [1, 1]]}
W_O: [[1], [0], [0], [1]]
mask: causal
rope: {base: 100}
qk_norm: {type: rmsnorm, weight_q: [1, "1/2"], weight_k: [2, 1], eps: 1e-6}
"""


def _rms(x: np.ndarray, g, eps: float) -> np.ndarray:
    """NumPy from the formula: each row over its mean square, times γ."""
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * np.asarray(g, dtype=float)


def _rotate_half(x: np.ndarray, base: float) -> np.ndarray:
    """Hugging Face's rotate_half RoPE in NumPy: pair i with i + d/2, θ_i = base^(−2i/d), positions from 0."""
    n, d = x.shape
    theta = base ** (-np.arange(0, d, 2) / d)
    ang = np.outer(np.arange(n), np.concatenate([theta, theta]))
    half = np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=1)
    return x * np.cos(ang) + half * np.sin(ang)


def _softmax_causal(S: np.ndarray) -> np.ndarray:
    S = np.where(np.tril(np.ones(S.shape, bool)), S, -np.inf)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


# -- the worked example, by hand and by NumPy ----------------------------------------------------------


def test_the_example_by_hand():
    """Mean squares 9, 1, 9 (queries) and 1, 4, 9 (keys), so each row is divided by 3, 1, 3 and 1, 2, 3."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    assert [Fraction(str(x)) for x in d.step("q_norm_ms").exact] == [9, 1, 9]
    assert [Fraction(str(x)) for x in d.step("k_norm_ms").exact] == [1, 4, 9]
    q_hat = [[Fraction(1, 3), Fraction(1, 3), 1, Fraction(5, 3)], [0, 2, 0, 0], [1, 1, 1, 1]]
    k_norm = [[1, -1, 1, -2], [2, 0, 0, 0], [Fraction(1, 3), Fraction(1, 3), Fraction(5, 3), 2]]  # γ_k = 1, 1, 1, 2
    got = d.step("Q_hat").exact
    assert [[Fraction(str(got[i, j])) for j in range(4)] for i in range(3)] == q_hat
    got = d.step("K_norm").exact
    assert [[Fraction(str(got[i, j])) for j in range(4)] for i in range(3)] == k_norm


def test_the_example_against_numpy_and_the_bound():
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    X, W_Q, W_K, W_V = (np.array(raw[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    q = _rms(X @ W_Q, raw["qk_norm"]["weight_q"], 0.0)
    k = _rms(X @ W_K, raw["qk_norm"]["weight_k"], 0.0)
    S = q @ k.T / 2.0
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    np.testing.assert_allclose(d.approx("Q_norm"), q, atol=TOL, rtol=0)
    np.testing.assert_allclose(d.approx("K_norm"), k, atol=TOL, rtol=0)
    np.testing.assert_allclose(d.approx("S_scaled"), S, atol=TOL, rtol=0)
    np.testing.assert_allclose(d.approx("O"), _softmax_causal(S) @ (X @ W_V), atol=TOL, rtol=0)
    # the bound the solution proves: (1/√4)·max|γ_q|·max|γ_k|·4 = 8, stated with these numbers
    assert np.abs(S).max() <= 8
    why = d.step("S_scaled").why
    assert "Cauchy–Schwarz" in why and "= 8" in why


def test_the_bound_holds_for_any_inputs():
    """Rows drawn at random (NumPy from the formula): |scale·q̂γ_q·k̂γ_k| ≤ scale·max|γ_q|·max|γ_k|·d_k."""
    rng = np.random.default_rng(4)
    for d_k in (2, 4, 8):
        gq, gk = rng.normal(size=d_k), rng.normal(size=d_k)
        q, k = _rms(rng.normal(size=(50, d_k)) * 10, gq, 1e-6), _rms(rng.normal(size=(50, d_k)), gk, 1e-6)
        assert np.abs(q @ k.T / np.sqrt(d_k)).max() <= np.abs(gq).max() * np.abs(gk).max() * np.sqrt(d_k)


# -- with RoPE and grouped K/V heads ----------------------------------------------------------------------


def _gqa_numpy():
    raw = yaml.safe_load(GQA)
    X = np.array(raw["X"], dtype=float)
    kv = raw["kv"][0]
    gq = [1.0, 0.5]
    K = _rotate_half(_rms(X @ np.array(kv["W_K"], float), [2.0, 1.0], 1e-6), 100.0)
    V = X @ np.array(kv["W_V"], float)
    out = {}
    for h, head in enumerate(raw["heads"], 1):
        Q = _rotate_half(_rms(X @ np.array(head["W_Q"], float), gq, 1e-6), 100.0)
        out[f"head{h}.Q_rot"] = Q
        out[f"head{h}.A"] = _softmax_causal(Q @ K.T / np.sqrt(2))
    out["head1.K_rot"] = K
    out["O"] = np.hstack([out[f"head{h}.A"] @ V for h in (1, 2)]) @ np.array(raw["W_O"], float)
    return out


def test_with_rope_and_grouped_heads_against_numpy(tmp_path):
    """NumPy from the formula: normalise, then rotate (rotate_half), each head's queries and the group's keys."""
    d = symattn.derive(load_problem(_write(tmp_path, GQA)))
    assert "head2.K_norm" not in d.ids and "head1.K_norm" in d.ids  # the group's keys: normalised once
    for key, want in _gqa_numpy().items():
        np.testing.assert_allclose(d.approx(key), want, atol=TOL, rtol=0)


def test_with_rope_and_grouped_heads_against_pytorch(tmp_path):
    """PyTorch: nn.RMSNorm (weight γ, eps 1e-6) per head, HF-style rotate_half, SDPA with enable_gqa."""
    torch = pytest.importorskip("torch")
    raw = yaml.safe_load(GQA)
    X = torch.tensor(raw["X"], dtype=torch.float64)

    def rms(x, g):
        m = torch.nn.RMSNorm(2, eps=1e-6, dtype=torch.float64)
        with torch.no_grad():
            m.weight.copy_(torch.tensor(g, dtype=torch.float64))
            return m(x)

    def rope(x):
        return torch.from_numpy(_rotate_half(x.numpy(), 100.0))

    d = symattn.derive(load_problem(_write(tmp_path, GQA)))
    Kn = rms(X @ torch.tensor(raw["kv"][0]["W_K"], dtype=torch.float64), [2.0, 1.0])
    np.testing.assert_allclose(d.approx("head1.K_norm"), Kn.numpy(), atol=TOL, rtol=0)
    Qs = []
    for h, head in enumerate(raw["heads"], 1):
        Qn = rms(X @ torch.tensor(head["W_Q"], dtype=torch.float64), [1.0, 0.5])
        np.testing.assert_allclose(d.approx(f"head{h}.Q_norm"), Qn.numpy(), atol=TOL, rtol=0)
        Qs.append(rope(Qn))
    eye = torch.eye(4, dtype=torch.float64)
    A = torch.nn.functional.scaled_dot_product_attention(torch.stack(Qs), rope(Kn)[None], eye[None], is_causal=True,
                                                         enable_gqa=True)
    for h in (1, 2):
        np.testing.assert_allclose(d.approx(f"head{h}.A"), A[h - 1].numpy(), atol=TOL, rtol=0)
    assert symattn.crosscheck(d, torch=True).passed


# -- every format, check ----------------------------------------------------------------------------------


def test_every_format_shows_the_stages():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    ids = [s["id"] for s in json.loads(symattn.render(d, "json"))["stages"]]
    assert ids.index("V") < ids.index("q_norm_ms") < ids.index("Q_norm") < ids.index("K_norm") < ids.index("K_T")
    for fmt in ("latex", "markdown", "text", "html"):
        text = symattn.render(d, fmt)
        assert "Normalise the queries and keys (QK-norm)" in text, fmt
        assert "Cauchy" in text, fmt


def _diagnosis(d, answers: dict) -> dict:
    marking = json.loads(symattn.check(d, answers).to_json())
    return {s["id"]: (s["status"], s.get("diagnosis", "")) for s in marking["stages"]}


def test_check_names_the_norm_over_the_wrong_axis():
    """Normalised over the tokens (each column of Q) instead of each query row, NumPy from that slip."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    Q = d.approx("Q")
    over_tokens = (Q / np.sqrt((Q * Q).mean(axis=0, keepdims=True))).round(6).tolist()
    status, why = _diagnosis(d, {"Q_hat": over_tokens})["Q_hat"]
    assert status == "wrong" and "normalised over the tokens (each column)" in why


def test_check_names_gamma_left_out_and_follows_through():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    hat = d.approx("K_hat")
    status, why = _diagnosis(d, {"K_norm": hat.round(6).tolist()})["K_norm"]
    assert status == "wrong" and "γ was left out" in why
    # a wrong K_norm, then the scores right from it: follow-through
    q = d.approx("Q_norm")
    got = _diagnosis(d, {"K_norm": hat.round(6).tolist(), "S": (q @ hat.T).round(6).tolist()})
    assert got["S"][0] == "follows"


# -- bad inputs and from: -----------------------------------------------------------------------------------

BASE = "X: [[1, 0], [0, 1]]\nW_Q: [[1, 2], [3, 4]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1], [2]]\nmask: causal\n"


@pytest.mark.parametrize("extra, fragment", [
    ("qk_norm: {type: rmsnorm, weight_q: [1, 2, 3]}", "qk_norm.weight_q: has 3 entries, but each head's query rows "
                                                      "have d_k = 2 columns"),
    ("qk_norm: {type: rmsnorm, weight_k: [[1], [2]]}", "qk_norm.weight_k: is 2×1; γ_k is one row"),
    ("qk_norm: {type: layernorm}", "qk_norm.type: unknown qk_norm type 'layernorm'"),
    ("qk_norm: {weight_q: [1, 1]}", "qk_norm.type: qk_norm needs type: rmsnorm"),
    ("qk_norm: {type: rmsnorm, eps: -1}", "qk_norm.eps: eps must be ≥ 0"),
    ("qk_norm: {type: rmsnorm, gamma: [1, 1]}", "unknown key 'gamma' in qk_norm"),
    ("qk_norm: rmsnorm", "qk_norm: qk_norm is a mapping"),
    ("qk_norm: {type: rmsnorm, offset: 2}", "qk_norm.offset: offset is 0 (γ) or 1"),
    ("qk_norm: {type: rmsnorm}\nbackward: {loss: sum}", "qk_norm: the backward pass through QK-norm is not derived"),
])
def test_bad_qk_norm_is_one_line(tmp_path, symattn_cli, extra, fragment):
    line = _error(tmp_path, BASE + extra + "\n", symattn_cli)
    assert fragment in line, line


def test_eps_zero_with_a_zero_row_is_refused(tmp_path, symattn_cli):
    text = "X: [[1, 0], [0, 0]]\nW_Q: [[1, 2], [3, 4]]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1], [2]]\nmask: causal\n"
    line = _error(tmp_path, text + "qk_norm: {type: rmsnorm, eps: 0}\n", symattn_cli)
    assert "qk_norm.eps: row 2 of Q is all zeros, and eps is 0" in line, line


def test_generate_from_refuses_qk_norm():
    with pytest.raises(symattn.SymattnError, match="does not vary problems with qk_norm"):
        symattn.generate(1, base=EXAMPLE)


QWEN3 = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_attention_heads=4, num_key_value_heads=2,
             head_dim=4, num_hidden_layers=1, max_position_embeddings=16, rms_norm_eps=1e-6)


def test_from_a_qwen3_checkpoint_against_its_attention_module(tmp_path):
    """Hugging Face's Qwen3Attention (transformers.models.qwen3) in a tiny Qwen3ForCausalLM, float64,
    saved by save_pretrained: symattn's from: reads q_norm and k_norm and gives what the module returns."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3 import modeling_qwen3

    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    model.eval()
    attention = model.model.layers[0].self_attn
    assert isinstance(attention, modeling_qwen3.Qwen3Attention)
    seen = {}

    def keep(name, value):  # a hook that returns None, so the module runs on unchanged
        seen.setdefault(name, value)

    hooks = [attention.register_forward_pre_hook(lambda m, a, kw: keep("X", kw["hidden_states"][0]), with_kwargs=True),
             attention.register_forward_hook(lambda m, a, out: keep("O", out[0][0]))]
    with torch.no_grad():
        model(torch.tensor([[5, 12, 3]]))
    for h in hooks:
        h.remove()
    np.save(tmp_path / "x.npy", seen["X"].numpy())
    path = _write(tmp_path, "X: {file: x.npy}\nfrom: {file: model.safetensors, layout: llama, layer: 0, heads: all}\n")
    p = load_problem(path)
    assert p.qk_norm is not None and p.qk_norm.q.eps == Fraction(1, 10**6)
    d = symattn.derive(p)
    want = seen["O"].numpy()
    # Qwen3RMSNorm and the rotary tables compute in float32 whatever the model's dtype (as LlamaRMSNorm
    # does): each normalised entry and each cos/sin carries a relative error of a few units of 2^-24,
    # and O sums a few dozen such terms, so 100 units of 2^-24 (of the largest entry) bound the module's
    # own rounding; without q_norm and k_norm the layer's output is off by far more (below)
    atol = 2.0 ** -24 * 100 * max(1.0, np.abs(want).max())
    np.testing.assert_allclose(d.approx("O"), want, rtol=0, atol=atol)
    unnormed = symattn.derive(dataclasses.replace(p, qk_norm=None)).approx("O")
    assert np.abs(unnormed - want).max() > 1000 * atol
    np.testing.assert_array_equal(d.approx("head1.q_norm_gamma")[0], attention.q_norm.weight.detach().numpy())
    np.testing.assert_array_equal(d.approx("head1.k_norm_gamma")[0], attention.k_norm.weight.detach().numpy())
    assert symattn.crosscheck(d, torch=True).passed  # symattn's float64 NumPy and PyTorch references too
