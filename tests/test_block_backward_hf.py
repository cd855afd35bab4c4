"""backward: {loss: cross-entropy} through from: {block: true} and logits: {from: true}, against
PyTorch autograd through Hugging Face transformers' own modules.

References: the tiny GPT-2, LLaMA and BERT models of test_block_hf (their weights redrawn from
N(0, 0.5²), float64, saved with save_pretrained). The loss is transformers' own
``fixed_cross_entropy`` of the model's float64 logits against the next ids (what
``model(ids, labels=ids)`` computes, without its cast of the logits to float32), and its
``backward()`` gives every parameter's ``.grad``. symattn's exact gradients (their 30-digit values,
rounded once) must equal them at 1e-12 of the largest entry:

- GPT-2: ``wte`` (tied: the unembedding's dW_Uᵀ plus each looked-up row's dX), ``wpe`` (dX again:
  X_pos = X + PE), ``ln_1``, ``c_attn`` (each head's dW_Q, dW_K, dW_V and their biases, in its
  columns), ``attn.c_proj`` (dW_O, db_O), ``ln_2``, ``mlp.c_fc`` and ``mlp.c_proj`` (dW_1, db_1, dW_2,
  db_2) and ``ln_f``;
- LLaMA (RMSNorm, RoPE, SwiGLU, an untied lm_head; 4 heads with 4, 2 or 1 K/V heads):
  ``embed_tokens``, each head's rows of ``q_proj``, each K/V group's rows of ``k_proj`` and
  ``v_proj`` (the sum of its heads' shares, as ``repeat_kv`` makes autograd add them), ``o_proj``,
  the gate, up and down projections, the three norms' weights and ``lm_head``;
- BERT (post-norm, GELU): layer 0 called on the word embeddings' rows, its output times a given
  W_U and the cross-entropy: every weight of the layer and the input's gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.problem.load import load_problem
from test_block_hf import BERT, GPT2, IDS, LLAMA, _build
from test_problem_checkpoints import _write

BACKWARD = "logits: {from: true}\nloss: {targets: next}\nbackward: {loss: cross-entropy}\n"


def _close(got, want, what=""):
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()), err_msg=what)


def _derive(tmp_path, table: str, layout: str, extra: str, embeddings: bool = True):
    _write(tmp_path, f"X: {{file: model.safetensors, embeddings: {table}, tokens: {IDS}}}\n"
                     f"from: {{file: model.safetensors, layout: {layout}, layer: 0, heads: all, block: true"
                     f"{', embeddings: true' if embeddings else ''}}}\n" + extra)
    return symattn.derive(load_problem(tmp_path / "p.yaml"))


def _next_token_loss(model):
    """transformers' float64 cross-entropy of the logits against the next ids, its gradients taken."""
    import torch
    from transformers.loss.loss_utils import fixed_cross_entropy

    t = torch.tensor([IDS])
    model.zero_grad()
    logits = model(t).logits[0]
    loss = fixed_cross_entropy(logits[:-1], t[0, 1:])
    loss.backward()
    return loss.item()


def _lookups(d, table_rows: int) -> np.ndarray:
    """dX scattered to the rows of the embedding table the tokens looked up."""
    out = np.zeros((table_rows, d.approx("dX").shape[1]))
    np.add.at(out, IDS, d.approx("dX"))
    return out


def _heads(grad: np.ndarray, h: int, width: int) -> list[np.ndarray]:
    return [grad[:, k * width:(k + 1) * width] for k in range(h)]


def test_gpt2_gradients_match_transformers_autograd(tmp_path):
    model = _build(tmp_path, "GPT2LMHeadModel", "GPT2Config", n_layer=1, **GPT2)
    loss = _next_token_loss(model)
    d = _derive(tmp_path, "transformer.wte.weight", "gpt2", BACKWARD)
    _close(d.approx("L"), [[loss]], "L")
    g = {name: p.grad.numpy() for name, p in model.named_parameters()}
    assert set(g) == {name for name, _ in model.named_parameters()}
    # the tied table: the unembedding's gradient (transposed) plus each looked-up row's
    _close(g["transformer.wte.weight"], d.approx("dW_U").T + _lookups(d, 16), "wte")
    want = np.zeros_like(g["transformer.wpe.weight"])
    want[:len(IDS)] = d.approx("dX")
    _close(g["transformer.wpe.weight"], want, "wpe")
    for prefix, gamma, beta in (("transformer.h.0.ln_1", "dnorm_gamma", "dnorm_beta"),
                                ("transformer.h.0.ln_2", "dmlp_gamma", "dmlp_beta"),
                                ("transformer.ln_f", "dfinal_gamma", "dfinal_beta")):
        _close(g[prefix + ".weight"][None], d.approx(gamma), gamma)
        _close(g[prefix + ".bias"][None], d.approx(beta), beta)
    width = 8 // 2
    c_attn, c_bias = g["transformer.h.0.attn.c_attn.weight"], g["transformer.h.0.attn.c_attn.bias"][None]
    for part, (w, b) in enumerate((("dW_Q", "db_Q"), ("dW_K", "db_K"), ("dW_V", "db_V"))):
        for h in range(2):
            cols = slice(part * 8 + h * width, part * 8 + (h + 1) * width)
            _close(c_attn[:, cols], d.approx(f"head{h + 1}.{w}"), w)
            _close(c_bias[:, cols], d.approx(f"head{h + 1}.{b}"), b)
    _close(g["transformer.h.0.attn.c_proj.weight"], d.approx("dW_O"), "dW_O")
    _close(g["transformer.h.0.attn.c_proj.bias"][None], d.approx("db_O"), "db_O")
    _close(g["transformer.h.0.mlp.c_fc.weight"], d.approx("dW_1"), "dW_1")
    _close(g["transformer.h.0.mlp.c_fc.bias"][None], d.approx("db_1"), "db_1")
    _close(g["transformer.h.0.mlp.c_proj.weight"], d.approx("dW_2"), "dW_2")
    _close(g["transformer.h.0.mlp.c_proj.bias"][None], d.approx("db_2"), "db_2")
    # every gradient stage cross-checks against NumPy's chain rule and PyTorch's autograd too
    assert symattn.crosscheck(d, torch=True).passed


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_llama_gradients_match_transformers_autograd(tmp_path, kv_heads):
    from test_norm import _float64_rms
    from test_problem_configs import _float64_rope

    fields = dict(LLAMA, num_key_value_heads=kv_heads)
    model = _build(tmp_path, "LlamaForCausalLM", "LlamaConfig", num_hidden_layers=1, tie_word_embeddings=False,
                   **fields)
    _float64_rope(model)  # transformers' float32 steps (RoPE's angles, RMSNorm's cast) in float64
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            _float64_rms(module)
    loss = _next_token_loss(model)
    d = _derive(tmp_path, "model.embed_tokens.weight", "llama", BACKWARD, embeddings=False)
    _close(d.approx("L"), [[loss]], "L")
    g = {name: p.grad.numpy() for name, p in model.named_parameters()}
    _close(g["model.embed_tokens.weight"], _lookups(d, 16), "embed_tokens")
    _close(g["lm_head.weight"], d.approx("dW_U").T, "lm_head")
    for name, stage in (("model.layers.0.input_layernorm", "dnorm_gamma"),
                        ("model.layers.0.post_attention_layernorm", "dmlp_gamma"), ("model.norm", "dfinal_gamma")):
        _close(g[name + ".weight"][None], d.approx(stage), stage)
    heads, width = 4, 8 // 4
    attn = "model.layers.0.self_attn."
    for h, block in enumerate(_heads(g[attn + "q_proj.weight"].T, heads, width)):
        _close(block, d.approx(f"head{h + 1}.dW_Q"), f"q_proj head {h + 1}")
    for proj, stage in (("k_proj", "dW_K"), ("v_proj", "dW_V")):  # K/V head k's ids: its group's first head's
        for k, block in enumerate(_heads(g[attn + proj + ".weight"].T, kv_heads, width)):
            _close(block, d.approx(f"head{k * (heads // kv_heads) + 1}.{stage}"), f"{proj} K/V head {k + 1}")
    assert not any(f"head{h}.dW_K" in d.ids for h in range(1, heads + 1) if (h - 1) % (heads // kv_heads))
    _close(g[attn + "o_proj.weight"].T, d.approx("dW_O"), "o_proj")
    mlp = "model.layers.0.mlp."
    for proj, stage in (("gate_proj", "dW_gate"), ("up_proj", "dW_up"), ("down_proj", "dW_down")):
        _close(g[mlp + proj + ".weight"].T, d.approx(stage), proj)
    assert symattn.crosscheck(d, torch=True).passed


def test_bert_layer_gradients_match_transformers_autograd(tmp_path):
    torch = pytest.importorskip("torch")
    model = _build(tmp_path, "BertModel", "BertConfig", **BERT)
    layer = model.encoder.layer[0]
    rng = np.random.default_rng(5)
    W_U = rng.integers(-2, 3, size=(8, 5))
    targets = [1, 4, 0, 2, 3, 1]
    table = model.embeddings.word_embeddings.weight.detach()
    X = table[IDS].clone().requires_grad_()
    Y = layer(X[None])
    Y = (Y[0] if isinstance(Y, tuple) else Y)[0]
    z = Y @ torch.tensor(W_U, dtype=torch.float64)
    loss = torch.nn.functional.cross_entropy(z, torch.tensor(targets))
    layer.zero_grad()
    loss.backward()
    rows = "[" + ", ".join("[" + ", ".join(str(int(x)) for x in row) + "]" for row in W_U) + "]"
    d = _derive(tmp_path, "embeddings.word_embeddings.weight", "bert",
                f"logits: {{W_U: {rows}}}\nloss: {{targets: {targets}}}\nbackward: {{loss: cross-entropy}}\n",
                embeddings=False)
    _close(d.approx("L"), [[loss.item()]], "L")
    _close(d.approx("dX"), X.grad.numpy(), "dX")
    g = {name: p.grad.numpy() for name, p in layer.named_parameters()}
    _close(g["intermediate.dense.weight"].T, d.approx("dW_1"), "dW_1")
    _close(g["intermediate.dense.bias"][None], d.approx("db_1"), "db_1")
    _close(g["output.dense.weight"].T, d.approx("dW_2"), "dW_2")
    _close(g["output.dense.bias"][None], d.approx("db_2"), "db_2")
    _close(g["output.LayerNorm.weight"][None], d.approx("dmlp_gamma"), "dmlp_gamma")
    _close(g["output.LayerNorm.bias"][None], d.approx("dmlp_beta"), "dmlp_beta")
    _close(g["attention.output.LayerNorm.weight"][None], d.approx("dnorm_gamma"), "dnorm_gamma")
    _close(g["attention.output.dense.weight"].T, d.approx("dW_O"), "dW_O")
    for proj, stage in (("query", "dW_Q"), ("key", "dW_K"), ("value", "dW_V")):
        for h, block in enumerate(_heads(g[f"attention.self.{proj}.weight"].T, 2, 4)):
            _close(block, d.approx(f"head{h + 1}.{stage}"), f"{proj} head {h + 1}")
    assert symattn.crosscheck(d, torch=True).passed
