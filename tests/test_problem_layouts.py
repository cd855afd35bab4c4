"""One attention layer from a checkpoint by its layout: the from: field (gpt2, llama, bert).

The checkpoints are made here with random float32 weights (no download). The loaded weights are
compared with the slices NumPy takes of the saved arrays (each float its exact Fraction); the
derived attention weights and outputs with the layers written out by hand in PyTorch and with
torch.nn.MultiheadAttention, in float64.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

import symattn  # noqa: E402
from symattn.problem.load import load_problem  # noqa: E402
from test_problem_checkpoints import _error, _fractions, _write  # noqa: E402  (one line at the field; exact entries)

def _expected(array):
    array = np.asarray(array, dtype=np.float64)
    return [[Fraction(float(v)) for v in row] for row in array.reshape(-1, array.shape[-1])]


def _values(d, stage):
    return np.array([[float(v) for v in row] for row in d.evaluate(stage, 25)])


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def _x(n, d, seed=7):
    return np.random.default_rng(seed).integers(-2, 3, size=(n, d))


def _agree(d, att, heads, out):
    """Every head's weights A and output, and the layer's output, equal the reference's."""
    for h in range(len(att)):
        _close(_values(d, f"head{h + 1}.A"), att[h].numpy())
        _close(_values(d, f"head{h + 1}.O"), heads[h].numpy())
    _close(_values(d, "O"), out.numpy())


def _problem(tmp_path, x, spec, extra=""):
    return load_problem(_write(tmp_path, f"X: {json.dumps(np.asarray(x).tolist())}\nfrom: {{{spec}}}\n{extra}"))


# -- checkpoints ---------------------------------------------------------------------------------


def _gpt2_tensors(d_model=16, layers=2, bias="random", prefix="", seed=3):
    """A GPT-2-shaped block in GPT-2's names: Conv1D weights are in × out, Q|K|V side by side."""
    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(layers):
        p = f"{prefix}h.{layer}.attn."
        t[p + "c_attn.weight"] = rng.standard_normal((d_model, 3 * d_model)).astype(np.float32)
        t[p + "c_proj.weight"] = rng.standard_normal((d_model, d_model)).astype(np.float32)
        if bias is not None:
            t[p + "c_attn.bias"] = (rng.standard_normal(3 * d_model) if bias == "random"
                                    else np.zeros(3 * d_model)).astype(np.float32)
            t[p + "c_proj.bias"] = (rng.standard_normal(d_model) if bias == "random"
                                    else np.zeros(d_model)).astype(np.float32)
        t[f"{prefix}h.{layer}.ln_1.weight"] = np.ones(d_model, np.float32)
    t[prefix + "wte.weight"] = rng.standard_normal((10, d_model)).astype(np.float32)
    return t


def _llama_tensors(d_model=8, n_head=4, n_kv=2, d_head=4, layers=2, bias=False, prefix="model.", seed=5):
    """A LLaMA-shaped block: nn.Linear weights out × in; K and V have n_kv heads."""
    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(layers):
        p = f"{prefix}layers.{layer}.self_attn."
        for proj, out in (("q", n_head), ("k", n_kv), ("v", n_kv)):
            t[p + f"{proj}_proj.weight"] = rng.standard_normal((out * d_head, d_model)).astype(np.float32)
            if bias:
                t[p + f"{proj}_proj.bias"] = rng.standard_normal(out * d_head).astype(np.float32)
        t[p + "o_proj.weight"] = rng.standard_normal((d_model, n_head * d_head)).astype(np.float32)
    return t


def _bert_tensors(d_model=8, layers=2, bias="random", prefix="bert.", seed=11):
    """A BERT-shaped encoder: nn.Linear weights out × in, every projection with its bias."""
    rng = np.random.default_rng(seed)
    t = {}
    for layer in range(layers):
        p = f"{prefix}encoder.layer.{layer}.attention."
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            t[p + name + ".weight"] = rng.standard_normal((d_model, d_model)).astype(np.float32)
            if bias is not None:
                t[p + name + ".bias"] = (rng.standard_normal(d_model) if bias == "random"
                                         else np.zeros(d_model)).astype(np.float32)
    return t


def _save(tmp_path, tensors, config=None, name="model.safetensors"):
    safetensors_numpy.save_file(tensors, str(tmp_path / name))
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config), "utf-8")
    return {k: v.astype(np.float64) for k, v in tensors.items()}


# -- the loaded weights are the right slices ---------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "transformer."])
def test_gpt2_heads_are_the_column_blocks(tmp_path, prefix):
    t = _save(tmp_path, _gpt2_tensors(prefix=prefix))
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 1, heads: [2, 4], n_head: 4")
    w, b = t[prefix + "h.1.attn.c_attn.weight"], t[prefix + "h.1.attn.c_attn.bias"]
    assert p.multi_head and len(p.heads) == 2 and p.kv_heads is None and p.rope is None and p.mask.kind == "causal"
    for head, h in zip(p.heads, (1, 3)):  # heads 2 and 4, counted from 1
        for m, bias, start in ((head.W_Q, head.b_Q, 0), (head.W_K, head.b_K, 16), (head.W_V, head.b_V, 32)):
            cols = slice(start + 4 * h, start + 4 * h + 4)
            assert _fractions(m) == _expected(w[:, cols])
            assert _fractions(bias) == _expected(b[None, cols])
    c_proj = t[prefix + "h.1.attn.c_proj.weight"]
    assert _fractions(p.W_O) == _expected(np.vstack([c_proj[4:8], c_proj[12:16]]))
    assert _fractions(p.b_O) == _expected(t[prefix + "h.1.attn.c_proj.bias"][None])


def test_gpt2_one_head_is_a_single_head_problem_and_n_head_from_config(tmp_path):
    t = _save(tmp_path, _gpt2_tensors(), config={"n_head": 4, "n_embd": 16})
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 0, heads: [3]")
    assert not p.multi_head and p.W_O is None and p.b_O is None
    assert _fractions(p.W_V) == _expected(t["h.0.attn.c_attn.weight"][:, 40:44])
    assert _fractions(p.heads[0].b_K) == _expected(t["h.0.attn.c_attn.bias"][None, 24:28])


def test_gpt2_n_head_in_from_wins_over_config(tmp_path):
    t = _save(tmp_path, _gpt2_tensors(), config={"n_head": 4})
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 0, heads: [2], n_head: 2")
    assert p.d_k == 8 and _fractions(p.W_Q) == _expected(t["h.0.attn.c_attn.weight"][:, 8:16])


def test_heads_all(tmp_path):
    t = _save(tmp_path, _gpt2_tensors())
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 0, heads: all, n_head: 4")
    assert len(p.heads) == 4 and _fractions(p.W_O) == _expected(t["h.0.attn.c_proj.weight"])


@pytest.mark.parametrize("prefix", ["model.", ""])
def test_llama_heads_read_their_kv_group_transposed(tmp_path, prefix):
    t = _save(tmp_path, _llama_tensors(prefix=prefix, bias=True),
              config={"num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 500000.0})
    p = _problem(tmp_path, _x(3, 8), "file: model.safetensors, layout: llama, layer: 1, heads: all")
    a = prefix + "layers.1.self_attn."
    assert p.kv_heads == 2 and [p.kv_group(h) for h in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert p.rope.pairing == "half" and p.rope.base == 500000 and p.mask.kind == "causal"
    for h, head in enumerate(p.heads):
        g = h // 2  # heads 1, 2 read K/V head 1; heads 3, 4 K/V head 2
        assert _fractions(head.W_Q) == _expected(t[a + "q_proj.weight"][4 * h:4 * h + 4].T)
        assert _fractions(head.W_K) == _expected(t[a + "k_proj.weight"][4 * g:4 * g + 4].T)
        assert _fractions(head.W_V) == _expected(t[a + "v_proj.weight"][4 * g:4 * g + 4].T)
        assert _fractions(head.b_Q) == _expected(t[a + "q_proj.bias"][None, 4 * h:4 * h + 4])
        assert _fractions(head.b_V) == _expected(t[a + "v_proj.bias"][None, 4 * g:4 * g + 4])
    assert _fractions(p.W_O) == _expected(t[a + "o_proj.weight"].T)
    assert p.b_O is None


@pytest.mark.parametrize("heads, kv_heads, groups", [
    ("[3, 4]", 1, [2, 2]),   # one group, read by both: kv_heads 1
    ("[2, 3]", None, [1, 2]),  # no group shared: plain heads
    ("[1, 2, 3, 4]", 2, [1, 1, 2, 2]),
])
def test_llama_selected_heads_and_their_groups(tmp_path, heads, kv_heads, groups):
    t = _save(tmp_path, _llama_tensors())
    p = _problem(tmp_path, _x(3, 8), f"file: model.safetensors, layout: llama, layer: 0, heads: {heads}, "
                                     "n_head: 4, n_kv_head: 2, rope_theta: 100")
    assert p.kv_heads == kv_heads and p.rope.base == 100
    for head, g in zip(p.heads, groups):
        assert _fractions(head.W_K) == _expected(t["model.layers.0.self_attn.k_proj.weight"][4 * (g - 1):4 * g].T)


@pytest.mark.parametrize("prefix", ["bert.", "roberta.", ""])
def test_bert_heads(tmp_path, prefix):
    t = _save(tmp_path, _bert_tensors(prefix=prefix), config={"num_attention_heads": 2})
    p = _problem(tmp_path, _x(3, 8), "file: model.safetensors, layout: bert, layer: 1, heads: [2, 1]")
    a = prefix + "encoder.layer.1.attention."
    assert p.mask.kind == "none" and p.rope is None
    for head, h in zip(p.heads, (1, 0)):  # in the order listed
        assert _fractions(head.W_Q) == _expected(t[a + "self.query.weight"][4 * h:4 * h + 4].T)
        assert _fractions(head.b_K) == _expected(t[a + "self.key.bias"][None, 4 * h:4 * h + 4])
    o = t[a + "output.dense.weight"]
    assert _fractions(p.W_O) == _expected(np.vstack([o[:, 4:8].T, o[:, 0:4].T]))
    assert _fractions(p.b_O) == _expected(t[a + "output.dense.bias"][None])


def test_only_the_needed_slices_are_read(tmp_path, monkeypatch):
    """A 50-layer file: the loader reads the few slices of one head, not whole tensors, each
    tensor once, through one open file."""
    import symattn.problem.checkpoints.safetensors as st

    _save(tmp_path, _gpt2_tensors(layers=50))
    asked, opened = [], []
    real, real_open = st.Checkpoint.read, st._open

    def spy(self, tensor, *args, **kwargs):
        out = real(self, tensor, *args, **kwargs)
        asked.append((tensor, out.size))
        return out

    monkeypatch.setattr(st.Checkpoint, "read", spy)
    monkeypatch.setattr(st, "_open", lambda path: opened.append(path) or real_open(path))
    _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 37, heads: [1], n_head: 4")
    assert [a for a, _ in asked] == ["h.37.attn.c_attn.weight", "h.37.attn.c_attn.bias"]
    assert sum(n for _, n in asked) == 3 * 16 * 4 + 3 * 4
    assert len(opened) == 1


def test_every_head_of_a_layer_is_read_through_one_open_file(tmp_path, monkeypatch):
    """heads: all of a grouped LLaMA layer: one open, one read of each tensor (K and V once per group)."""
    import symattn.problem.checkpoints.safetensors as st

    t = _save(tmp_path, _llama_tensors(bias=True))
    asked, opened = [], []
    real, real_open = st.Checkpoint.read, st._open
    monkeypatch.setattr(st.Checkpoint, "read", lambda self, tensor, *a, **k: asked.append(tensor) or
                        real(self, tensor, *a, **k))
    monkeypatch.setattr(st, "_open", lambda path: opened.append(path) or real_open(path))
    p = _problem(tmp_path, _x(3, 8), "file: model.safetensors, layout: llama, layer: 1, heads: all, n_head: 4, "
                                     "n_kv_head: 2")
    a = "model.layers.1.self_attn."
    assert len(opened) == 1
    assert sorted(asked) == sorted(a + n for n in ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                                                   "v_proj.weight", "v_proj.bias", "o_proj.weight"))
    for h, head in enumerate(p.heads):
        g = h // 2
        assert _fractions(head.W_K) == _expected(t[a + "k_proj.weight"][4 * g:4 * g + 4].T)
        assert _fractions(head.b_K) == _expected(t[a + "k_proj.bias"][None, 4 * g:4 * g + 4])
    assert p.heads[0].W_K is p.heads[1].W_K  # a group's keys: read once, shared


def test_explicit_rope_replaces_the_layouts(tmp_path):
    _save(tmp_path, _llama_tensors(n_kv=4))
    p = _problem(tmp_path, _x(3, 8), "file: model.safetensors, layout: llama, layer: 0, heads: [1], n_head: 4",
                 'rope: {angles: ["pi/6", "pi/3"]}\n')
    assert p.rope.angles is not None and p.kv_heads is None


def test_explicit_mask_replaces_the_layouts(tmp_path):
    _save(tmp_path, _gpt2_tensors())
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4",
                 "mask: none\n")
    assert p.mask.kind == "none"


# -- the derived attention against PyTorch --------------------------------------------------------


def _gpt2_reference(torch, x, c_attn_w, c_attn_b, c_proj_w, c_proj_b, n_head):
    """GPT-2's attention written out by hand (transformers' GPT2Attention): Conv1D is x @ W + b;
    split Q|K|V; view into heads; causal mask; softmax(QKᵀ/√d)V; merge heads; c_proj."""
    n, d_model = x.shape
    q, k, v = (x @ c_attn_w + c_attn_b).split(d_model, dim=1)
    hd = d_model // n_head
    q, k, v = (t.view(n, n_head, hd).transpose(0, 1) for t in (q, k, v))
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    heads = att @ v
    merged = heads.transpose(0, 1).reshape(n, d_model)
    return att, heads, merged @ c_proj_w + c_proj_b


@pytest.mark.parametrize("bias", ["zero", "random"])
def test_gpt2_layer_matches_a_pytorch_reference(tmp_path, bias):
    torch = pytest.importorskip("torch")
    t = _save(tmp_path, _gpt2_tensors(bias=bias), config={"n_head": 4})
    x = _x(4, 16)
    d = symattn.derive(_problem(tmp_path, x, "file: model.safetensors, layout: gpt2, layer: 1, heads: all"))
    T = {k: torch.tensor(v) for k, v in t.items()}
    att, heads, out = _gpt2_reference(torch, torch.tensor(x, dtype=torch.float64), T["h.1.attn.c_attn.weight"],
                                      T["h.1.attn.c_attn.bias"], T["h.1.attn.c_proj.weight"],
                                      T["h.1.attn.c_proj.bias"], 4)
    _agree(d, att, heads, out)


def _rotate_half(torch, x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _llama_reference(torch, x, q_w, k_w, v_w, o_w, n_head, n_kv, theta, biases=(0, 0, 0)):
    """LLaMA's attention written out by hand (transformers' LlamaAttention): nn.Linear is
    x @ Wᵀ + b; RoPE with rotate_half on positions 0 … n−1; repeat_kv; causal softmax; o_proj."""
    n = x.shape[0]
    hd = q_w.shape[0] // n_head
    q = (x @ q_w.T + biases[0]).view(n, n_head, hd).transpose(0, 1)
    k = (x @ k_w.T + biases[1]).view(n, n_kv, hd).transpose(0, 1)
    v = (x @ v_w.T + biases[2]).view(n, n_kv, hd).transpose(0, 1)
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q = q * cos + _rotate_half(torch, q) * sin
    k = k * cos + _rotate_half(torch, k) * sin
    k, v = (t.repeat_interleave(n_head // n_kv, dim=0) for t in (k, v))
    scores = q @ k.transpose(-1, -2) / hd ** 0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    heads = att @ v
    return att, heads, heads.transpose(0, 1).reshape(n, n_head * hd) @ o_w.T


def test_llama_grouped_layer_with_rope_matches_a_pytorch_reference(tmp_path):
    torch = pytest.importorskip("torch")
    t = _save(tmp_path, _llama_tensors(), config={"num_attention_heads": 4, "num_key_value_heads": 2})
    x = _x(3, 8)
    p = _problem(tmp_path, x, "file: model.safetensors, layout: llama, layer: 1, heads: all")
    assert p.kv_heads == 2 and p.rope.base == 10000
    d = symattn.derive(p)
    a = {k.rsplit(".", 2)[-2]: torch.tensor(v) for k, v in t.items() if k.startswith("model.layers.1.")}
    att, heads, out = _llama_reference(torch, torch.tensor(x, dtype=torch.float64), a["q_proj"], a["k_proj"],
                                       a["v_proj"], a["o_proj"], 4, 2, 10000.0)
    _agree(d, att, heads, out)


def test_llama_one_head_of_a_group_matches_a_pytorch_reference(tmp_path):
    torch = pytest.importorskip("torch")
    t = _save(tmp_path, _llama_tensors(n_kv=1))
    x = _x(3, 8, seed=9)
    d = symattn.derive(_problem(tmp_path, x, "file: model.safetensors, layout: llama, layer: 0, heads: [3], "
                                             "n_head: 4, n_kv_head: 1, rope_theta: 10000"))
    a = {k.rsplit(".", 2)[-2]: torch.tensor(v) for k, v in t.items() if k.startswith("model.layers.0.")}
    att, heads, _ = _llama_reference(torch, torch.tensor(x, dtype=torch.float64), a["q_proj"], a["k_proj"],
                                     a["v_proj"], a["o_proj"], 4, 1, 10000.0)
    _close(_values(d, "A"), att[2].numpy())
    _close(_values(d, "O"), heads[2].numpy())


def test_llama_with_qkv_biases_matches_a_pytorch_reference(tmp_path):
    """Qwen-style: q_proj, k_proj and v_proj have biases, o_proj none."""
    torch = pytest.importorskip("torch")
    t = _save(tmp_path, _llama_tensors(bias=True))
    x = _x(3, 8)
    d = symattn.derive(_problem(tmp_path, x, "file: model.safetensors, layout: llama, layer: 0, heads: all, "
                                             "n_head: 4, n_kv_head: 2"))
    a = {k.split("self_attn.")[1]: torch.tensor(v) for k, v in t.items() if k.startswith("model.layers.0.")}
    _, _, out = _llama_reference(torch, torch.tensor(x, dtype=torch.float64), a["q_proj.weight"], a["k_proj.weight"],
                                 a["v_proj.weight"], a["o_proj.weight"], 4, 2, 10000.0,
                                 (a["q_proj.bias"], a["k_proj.bias"], a["v_proj.bias"]))
    _close(_values(d, "O"), out.numpy())


def _bert_reference(torch, x, a, n_head):
    """BERT's self-attention written out by hand (BertSelfAttention + the output dense layer,
    before dropout, the residual and LayerNorm): no mask."""
    n, d_model = x.shape
    hd = d_model // n_head
    q, k, v = ((x @ a[f"self.{p}.weight"].T + a[f"self.{p}.bias"]).view(n, n_head, hd).transpose(0, 1)
               for p in ("query", "key", "value"))
    att = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5, dim=-1)
    heads = att @ v
    return att, heads, heads.transpose(0, 1).reshape(n, d_model) @ a["output.dense.weight"].T + a["output.dense.bias"]


@pytest.mark.parametrize("bias", ["zero", "random"])
def test_bert_layer_matches_a_pytorch_reference(tmp_path, bias):
    torch = pytest.importorskip("torch")
    t = _save(tmp_path, _bert_tensors(bias=bias), config={"num_attention_heads": 2})
    x = _x(3, 8)
    d = symattn.derive(_problem(tmp_path, x, "file: model.safetensors, layout: bert, layer: 0, heads: all"))
    a = {k.split("attention.")[1]: torch.tensor(v) for k, v in t.items() if k.startswith("bert.encoder.layer.0.")}
    att, heads, out = _bert_reference(torch, torch.tensor(x, dtype=torch.float64), a, 2)
    _agree(d, att, heads, out)


@pytest.mark.parametrize("layout, bias", [
    ("bert", False), ("gpt2", False),
    ("bert", True), ("gpt2", True),
])
def test_multihead_attention_module_agrees(tmp_path, layout, bias):
    """torch.nn.MultiheadAttention given the checkpoint's weights (in_proj_weight =
    cat(W_Qᵀ, W_Kᵀ, W_Vᵀ), out_proj.weight = W_Oᵀ): its per-head weights and its output."""
    torch = pytest.importorskip("torch")
    d_model, n_head, n = 8, 2, 4
    if layout == "bert":
        t = _save(tmp_path, _bert_tensors(bias="random" if bias else None), config={"num_attention_heads": n_head})
        a = {k.split("attention.")[1]: v for k, v in t.items() if k.startswith("bert.encoder.layer.1.")}
        W = [a[f"self.{p}.weight"].T for p in ("query", "key", "value")]
        B = [a[f"self.{p}.bias"] for p in ("query", "key", "value")] if bias else None
        W_O, b_O = a["output.dense.weight"].T, a.get("output.dense.bias")
    else:
        t = _save(tmp_path, _gpt2_tensors(d_model=d_model, bias="random" if bias else None),
                  config={"n_head": n_head})
        c = t["h.1.attn.c_attn.weight"]
        W = [c[:, i * d_model:(i + 1) * d_model] for i in range(3)]
        B = list(t["h.1.attn.c_attn.bias"].reshape(3, d_model)) if bias else None
        W_O, b_O = t["h.1.attn.c_proj.weight"], t.get("h.1.attn.c_proj.bias")
    x = _x(n, d_model, seed=13)
    d = symattn.derive(_problem(tmp_path, x, f"file: model.safetensors, layout: {layout}, layer: 1, heads: all"))
    mha = torch.nn.MultiheadAttention(d_model, n_head, bias=bias, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.tensor(np.vstack([w.T for w in W])))
        mha.out_proj.weight.copy_(torch.tensor(W_O.T))
        if bias:
            mha.in_proj_bias.copy_(torch.tensor(np.concatenate(B)))
            mha.out_proj.bias.copy_(torch.tensor(b_O))
    mha.eval()
    xt = torch.tensor(x, dtype=torch.float64)[None]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1) if layout == "gpt2" else None  # True: may not attend
    out, weights = mha(xt, xt, xt, attn_mask=mask, need_weights=True, average_attn_weights=False)
    for h in range(n_head):
        _close(_values(d, f"head{h + 1}.A"), weights[0, h].detach().numpy())
    _close(_values(d, "O"), out[0].detach().numpy())


def test_derive_cli_crosscheck_passes(tmp_path, symattn_cli):
    _save(tmp_path, _llama_tensors(), config={"num_attention_heads": 4, "num_key_value_heads": 2})
    path = _write(tmp_path, f"X: {json.dumps(_x(3, 8).tolist())}\n"
                            "from: {file: model.safetensors, layout: llama, layer: 0, heads: [1, 2]}\n")
    r = symattn_cli.main("derive", path, "-f", "json")
    assert r.code == 0
    assert json.loads(r.stdout)["crosscheck"]["passed"] is True


def test_real_inputs_and_some_heads_of_a_gpt2_layer_match_a_pytorch_reference(tmp_path, symattn_cli):
    """Everything of a real checkpoint at once: X looked up in wte and wpe, heads 2 and 4 of 4 with
    their biases, W_O the c_proj rows of those heads and b_O; against GPT-2's attention by hand,
    the heads' share of c_proj taken from the reference's own split."""
    torch = pytest.importorskip("torch")
    tensors = _gpt2_tensors()
    tensors["wpe.weight"] = np.random.default_rng(9).standard_normal((6, 16)).astype(np.float32)
    t = _save(tmp_path, tensors)
    ids = [7, 2, 9, 2]
    path = _write(tmp_path, f"X: {{file: model.safetensors, embeddings: wte.weight, tokens: {ids}}}\n"
                            "positions: {file: model.safetensors, tensor: wpe.weight}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 1, heads: [2, 4], n_head: 4}\n")
    d = symattn.derive(load_problem(path))
    T = {k: torch.tensor(v) for k, v in t.items()}
    x = T["wte.weight"][ids] + T["wpe.weight"][:4]
    att, heads, _ = _gpt2_reference(torch, x, T["h.1.attn.c_attn.weight"], T["h.1.attn.c_attn.bias"],
                                    T["h.1.attn.c_proj.weight"], T["h.1.attn.c_proj.bias"], 4)
    w_o = T["h.1.attn.c_proj.weight"]
    out = torch.cat([heads[1], heads[3]], dim=1) @ torch.cat([w_o[4:8], w_o[12:16]]) + T["h.1.attn.c_proj.bias"]
    for mine, theirs in ((1, 1), (2, 3)):
        _close(_values(d, f"head{mine}.A"), att[theirs].numpy())
        _close(_values(d, f"head{mine}.O"), heads[theirs].numpy())
    _close(_values(d, "O"), out.numpy())
    # the CLI shows the biases as stages and its own cross-check (NumPy, PyTorch) agrees
    r = symattn_cli.main("derive", path, "-f", "json", "--check", "torch")
    assert r.code == 0
    doc = json.loads(r.stdout)
    assert doc["crosscheck"]["passed"] is True
    ids_seen = {s["id"] for s in doc["stages"]}
    assert {"head1.b_Q", "head1.b_K", "head2.b_V", "b_O", "PE"} <= ids_seen


# -- bad input: one line at the field ------------------------------------------------------------


X16 = "X: [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]]\n"


@pytest.fixture
def gpt2_file(tmp_path):
    _save(tmp_path, _gpt2_tensors())
    return tmp_path


def test_unknown_layout(gpt2_file, symattn_cli):
    line = _error(gpt2_file, X16 + "from: {file: model.safetensors, layout: gtp2, layer: 0, heads: [1], n_head: 4}\n",
                  symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.layout: unknown layout 'gtp2' \(did you mean 'gpt2'\?\); "
                    r"the layouts are gpt2, llama, bert", line), line


def test_missing_tensor_lists_close_names(tmp_path, symattn_cli):
    t = _gpt2_tensors()
    t["h.0.attn.c_proj_weight"] = t.pop("h.0.attn.c_proj.weight")
    _save(tmp_path, t)
    line = _error(tmp_path, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4}\n",
                  symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.layout: 'model\.safetensors' has no tensor 'h\.0\.attn\.c_proj\.weight'",
                    line), line
    assert "'h.0.attn.c_proj_weight'" in line


def test_wrong_layout_for_the_file_lists_its_names(tmp_path, symattn_cli):
    _save(tmp_path, _bert_tensors())
    line = _error(tmp_path, "X: [[1, 0, 0, 0, 0, 0, 0, 0]]\n"
                            "from: {file: model.safetensors, layout: llama, layer: 0, heads: [1], n_head: 2}\n", symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.layout: 'model\.safetensors' has no tensor "
                    r"'model\.layers\.0\.self_attn\.q_proj\.weight'", line) and "bert.encoder" in line, line


@pytest.mark.parametrize("heads, fragment", [
    ("[5]", "head 5 is out of range: the layer has 4 heads, numbered 1 to 4"),
    ("[0]", "heads are counted from 1: head 1 is the first (columns 0:4 of Q)"),
    ("[1, 1]", "head 1 is given twice"),
    ("[-1]", "a whole number ≥ 1"),
    ("[]", "heads is a list of head numbers counted from 1"),
])
def test_bad_heads(gpt2_file, symattn_cli, heads, fragment):
    line = _error(gpt2_file, X16 + f"from: {{file: model.safetensors, layout: gpt2, layer: 0, heads: {heads}, "
                                   "n_head: 4}\n", symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.heads", line) and fragment in line, line


def test_layer_out_of_range(gpt2_file, symattn_cli):
    line = _error(gpt2_file, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 2, heads: [1], n_head: 4}\n",
                  symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.layer: layer 2 is out of range: 'model\.safetensors' holds layers 0 to 1",
                    line), line


def test_missing_n_head(gpt2_file, symattn_cli):
    line = _error(gpt2_file, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1]}\n", symattn_cli)
    assert re.match(r"Error: P:2:\d+: from\.n_head: the number of heads is not in 'model\.safetensors': "
                    r"give it in from \(n_head: 12\), or put the model's config\.json beside the checkpoint", line), line


@pytest.mark.parametrize("text, fragment", [
    ("from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 3}",
     "from.n_head: the queries are 16 wide, which 3 heads cannot share equally"),
    ("from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4, color: red}",
     "from: unknown key 'color' in from"),
    ("from: {file: model.safetensors, layout: gpt2, heads: [1], n_head: 4}", "from.layer: from needs layer"),
    ("from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4}\nW_Q: [[1]]",
     "W_Q: from: fills each head's weights from the checkpoint: remove W_Q or from"),
    ("from: {file: model.pt, layout: gpt2, layer: 0, heads: [1], n_head: 4}", "from.file: 'model.pt' is a pickle"),
    ("from: {file: nothere.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4}",
     "from.file: cannot read 'nothere.safetensors'"),
    ("from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4, n_kv_head: 2}",
     "from.n_kv_head: n_kv_head is for the llama layout"),
    ("from: [model.safetensors]", "from: from is a mapping"),
])
def test_bad_from(gpt2_file, symattn_cli, text, fragment):
    line = _error(gpt2_file, X16 + text + "\n", symattn_cli)
    assert fragment in line and re.match(r"Error: P:\d+:\d+: ", line), line


def test_x_width_must_be_d_model(gpt2_file, symattn_cli):
    line = _error(gpt2_file, "X: [[1, 2]]\nfrom: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], "
                             "n_head: 4}\n", symattn_cli)
    assert "X: X is 1×2 but layer 0 of 'model.safetensors' takes rows of d_model = 16 entries" in line


def test_uneven_kv_groups(tmp_path, symattn_cli):
    _save(tmp_path, _llama_tensors())
    line = _error(tmp_path, "X: [[1, 0, 0, 0, 0, 0, 0, 0]]\nfrom: {file: model.safetensors, layout: llama, layer: 0, "
                            "heads: [1, 2, 3], n_head: 4, n_kv_head: 2}\n", symattn_cli)
    assert "from.heads: the layer's heads share keys and values in groups of 2" in line, line


def test_rope_scaling_is_refused(tmp_path, symattn_cli):
    _save(tmp_path, _llama_tensors(), config={"num_attention_heads": 4, "num_key_value_heads": 2,
                                              "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})
    line = _error(tmp_path, "X: [[1, 0, 0, 0, 0, 0, 0, 0]]\nfrom: {file: model.safetensors, layout: llama, layer: 0, "
                            "heads: [1]}\n", symattn_cli)
    assert "sets rope_scaling.rope_type 'llama3', which symattn does not apply" in line, line


# -- the worked example ---------------------------------------------------------------------------


def _tiny_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "worked_examples" / "make_tiny_checkpoint.py"
    spec = importlib.util.spec_from_file_location("symattn_make_tiny_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_tiny_checkpoint_is_what_the_script_writes(tmp_path, monkeypatch):
    script = _tiny_script()
    committed = (script.HERE / "tiny_gpt2.safetensors").read_bytes()
    monkeypatch.setattr(script, "HERE", tmp_path)
    script.main()
    assert (tmp_path / "tiny_gpt2.safetensors").read_bytes() == committed
    for name, array in script.tensors().items():
        assert np.all(array * 4 == np.round(array * 4)) and np.abs(array).max() <= 1, name


def _tiny_reference():
    """Head 2 of the tiny GPT-2 layer in Fractions: X·W + b, causal softmax at 30 digits (mpmath)."""
    import mpmath
    import yaml

    script = _tiny_script()
    t = script.tensors()
    x = yaml.safe_load((script.HERE / "tiny_gpt2_head.yaml").read_text("utf-8"))["X"]
    w, b = t["h.0.attn.c_attn.weight"], t["h.0.attn.c_attn.bias"]
    d = script.D_MODEL
    proj = []
    for start in (4, d + 4, 2 * d + 4):  # head 2 is columns 4:8 of Q, of K and of V
        proj.append([[sum(Fraction(xi) * Fraction(float(w[i, start + j])) for i, xi in enumerate(row))
                      + Fraction(float(b[start + j])) for j in range(4)] for row in x])
    q, k, v = proj
    mpmath.mp.dps = 30
    out = []
    for i in range(len(x)):
        s = [sum(q[i][c] * k[j][c] for c in range(4)) / 2 for j in range(i + 1)]  # √d_head = 2
        e = [mpmath.exp(mpmath.mpf(z.numerator) / z.denominator) for z in s]
        a = [z / sum(e) for z in e]
        out.append([float(sum(a[j] * mpmath.mpf(v[j][c].numerator) / v[j][c].denominator for j in range(i + 1)))
                    for c in range(4)])
    return np.array(out)


def _tiny_derived():
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "worked_examples" / "tiny_gpt2_head.yaml"
    return _values(symattn.derive(load_problem(path)), "O")


def test_the_worked_example_is_gpt2s_head():
    _close(_tiny_derived(), _tiny_reference())


def test_a_config_link_out_of_the_folder_is_refused(tmp_path, symattn_cli):
    inner = tmp_path / "problem"
    inner.mkdir()
    _save(inner, _gpt2_tensors())
    (tmp_path / "config.json").write_text('{"n_head": 4}', "utf-8")
    (inner / "config.json").symlink_to(tmp_path / "config.json")
    line = _error(inner, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1]}\n", symattn_cli)
    assert "the config.json beside 'model.safetensors' leads out of the problem's folder" in line, line


@pytest.mark.parametrize("config, fragment", [
    ("{not json", "is not valid JSON"),
    ('{"n_head": "four"}', "has n_head 'four', not a whole number"),
    ("[4]", "is not a JSON object"),
])
def test_bad_config(gpt2_file, symattn_cli, config, fragment):
    (gpt2_file / "config.json").write_text(config, "utf-8")
    line = _error(gpt2_file, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1]}\n", symattn_cli)
    assert fragment in line, line


def test_float16_weights_and_biases_are_exact(tmp_path):
    t = _save(tmp_path, {k: v.astype(np.float16) for k, v in _gpt2_tensors().items()})
    p = _problem(tmp_path, _x(3, 16), "file: model.safetensors, layout: gpt2, layer: 0, heads: [4, 1], n_head: 4")
    assert _fractions(p.heads[0].W_V) == _expected(t["h.0.attn.c_attn.weight"][:, 44:48])
    assert _fractions(p.heads[1].b_Q) == _expected(t["h.0.attn.c_attn.bias"][None, 0:4])
    assert _fractions(p.b_O) == _expected(t["h.0.attn.c_proj.bias"][None])


def test_bfloat16_weights_and_biases_are_exact(tmp_path):
    """bfloat16 (what LLaMA checkpoints hold) is read as raw bits and widened exactly."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    t = {k: torch.tensor(v).to(torch.bfloat16) for k, v in _llama_tensors(bias=True).items()}
    save_file(t, str(tmp_path / "model.safetensors"))
    p = _problem(tmp_path, _x(3, 8), "file: model.safetensors, layout: llama, layer: 0, heads: [4], "
                                     "n_head: 4, n_kv_head: 2")
    a = {k: v.to(torch.float64).numpy() for k, v in t.items() if k.startswith("model.layers.0.")}
    assert _fractions(p.W_Q) == _expected(a["model.layers.0.self_attn.q_proj.weight"][12:16].T)
    assert _fractions(p.W_K) == _expected(a["model.layers.0.self_attn.k_proj.weight"][4:8].T)
    assert _fractions(p.heads[0].b_K) == _expected(a["model.layers.0.self_attn.k_proj.bias"][None, 4:8])


@pytest.mark.parametrize("shape, fragment", [
    (["x", 3], "the header's entry for 'h.0.attn.c_attn.weight' is malformed"),
    ([0, 0], "the queries are 0 wide"),
    ([4, 12], "h.0.attn.c_proj.weight is 4×12, which does not fit queries 4 wide and d_model = 4"),
])
def test_hostile_headers(tmp_path, symattn_cli, shape, fragment):
    """Shapes the header claims are checked before anything is read or computed from them."""
    size = 4 * shape[0] * shape[1] if all(isinstance(n, int) for n in shape) else 0  # bytes that fit the shape
    entries = {name: {"dtype": "F32", "shape": shape, "data_offsets": [k * size, (k + 1) * size]}
               for k, name in enumerate(("h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight"))}
    header = json.dumps(entries).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(2 * size))
    line = _error(tmp_path, X16 + "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4}\n",
                  symattn_cli)
    assert fragment in line, line


def test_x_is_needed(gpt2_file, symattn_cli):
    line = _error(gpt2_file, "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 4}\n", symattn_cli)
    assert re.match(r"Error: P:1:1: X is missing: from: gives the weights; give X, the layer's input", line), line


# -- every bias and projection checked, the layer charged, before anything is read ------------------


_LAYER_TENSORS = {"gpt2": lambda: _gpt2_tensors(), "llama": lambda: _llama_tensors(bias=True),
                  "bert": lambda: _bert_tensors()}
_LAYER_SPEC = {"gpt2": ("h.0.attn.", 16, "n_head: 4"), "llama": ("model.layers.0.self_attn.", 8, "n_head: 4, n_kv_head: 2"),
               "bert": ("bert.encoder.layer.0.attention.", 8, "n_head: 2")}


@pytest.mark.parametrize("layout, bias, width", [
    ("gpt2", "c_attn.bias", 48), ("gpt2", "c_proj.bias", 16),
    ("llama", "q_proj.bias", 16), ("llama", "k_proj.bias", 8), ("llama", "v_proj.bias", 8), ("llama", "o_proj.bias", 8),
    ("bert", "self.query.bias", 8), ("bert", "self.key.bias", 8), ("bert", "self.value.bias", 8),
    ("bert", "output.dense.bias", 8),
])
@pytest.mark.parametrize("shape", ["2-D", "short"])
def test_every_bias_of_every_layout_is_checked(tmp_path, symattn_cli, monkeypatch, layout, bias, width, shape):
    """A bias of the wrong shape is one line naming it, and nothing of the layer is read."""
    import symattn.problem.checkpoints.safetensors as st

    prefix, d_model, heads = _LAYER_SPEC[layout]
    t = _LAYER_TENSORS[layout]()
    t[prefix + bias] = np.zeros((2, width // 2) if shape == "2-D" else (width - 1,), np.float32)
    _save(tmp_path, t)
    monkeypatch.setattr(st.Checkpoint, "read", None)  # nothing is read
    x = json.dumps(_x(1, d_model).tolist())
    line = _error(tmp_path, f"X: {x}\nfrom: {{file: model.safetensors, layout: {layout}, layer: 0, heads: all, "
                            f"{heads}}}\n", symattn_cli)
    got = [2, width // 2] if shape == "2-D" else [width - 1]
    assert f"from.layout: {prefix}{bias} has shape {got}, not [{width}]" in line, line


@pytest.mark.parametrize("layout, name, shape, fragment", [
    ("bert", "self.key.weight", (8, 6), "bert.encoder.layer.0.attention.self.key.weight is 8×6, not 8×8"),
    ("bert", "self.value.weight", (6, 8), "bert.encoder.layer.0.attention.self.value.weight is 6×8, not 8×8"),
    ("llama", "k_proj.weight", (8, 6), "model.layers.0.self_attn.k_proj.weight is 8×6, not (n_kv_head × d_head)×8"),
])
def test_keys_and_values_weights_are_checked(tmp_path, symattn_cli, layout, name, shape, fragment):
    prefix, d_model, heads = _LAYER_SPEC[layout]
    t = _LAYER_TENSORS[layout]()
    t[prefix + name] = np.zeros(shape, np.float32)
    _save(tmp_path, t)
    x = json.dumps(_x(1, d_model).tolist())
    line = _error(tmp_path, f"X: {x}\nfrom: {{file: model.safetensors, layout: {layout}, layer: 0, heads: all, "
                            f"{heads}}}\n", symattn_cli)
    assert fragment in line, line


@pytest.mark.parametrize("tokens, max_size, fragment", [
    # 4 heads of d_head 4 on d_model 16: W_Q, W_K, W_V and biases 4 × 204, W_O 256, b_O 16 = 1,088 numbers
    (1, 1000, "the 4 heads of layer 0 hold 1,088 numbers (d_model = 16, d_head = 4), more than the 984 the size "
              "limit of 1,000 leaves for them"),
    # 40 tokens: 40 × 40 × 4 = 6,400 scores, more than 2,000 × 1,000,000 / 1,000,000 ... scaled by --max-size
    (40, 2000, "the 4 heads make 6,400 attention scores (40 query × 40 key tokens × 4 heads), more than the 2,000 the "
               "size budget allows for any output"),
])
def test_the_layer_is_charged_before_any_head_is_read(tmp_path, monkeypatch, tokens, max_size, fragment):
    import symattn.problem.checkpoints.safetensors as st
    from symattn.errors import SymattnError

    _save(tmp_path, _gpt2_tensors())
    monkeypatch.setattr(st.Checkpoint, "read", None)  # nothing is read
    path = _write(tmp_path, f"X: {json.dumps(_x(tokens, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, n_head: 4}\n")
    with pytest.raises(SymattnError) as err:
        load_problem(path, max_size=max_size)
    assert err.value.field == "from.heads" and fragment in err.value.message, err.value.message


def test_a_layer_that_fits_is_read_whole_at_the_limit(tmp_path):
    """The charge is the count the reading makes: a layer exactly at the limit is read."""
    _save(tmp_path, _gpt2_tensors())
    path = _write(tmp_path, f"X: {json.dumps(_x(1, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, n_head: 4}\n")
    p = load_problem(path, max_size=16 + 1088)
    assert len(p.heads) == 4
    from symattn.errors import SymattnError

    with pytest.raises(SymattnError, match="the 4 heads of layer 0 hold 1,088 numbers"):
        load_problem(path, max_size=16 + 1087)
