"""from: {block: true} and logits: {from: true}, against Hugging Face transformers' own modules.

References: tiny GPT-2, LLaMA and BERT models built from their configs, their weights redrawn from
N(0, 0.5²), turned to float64 and saved with save_pretrained (config.json and float64
model.safetensors); symattn derives the problem that names that checkpoint and reads the same
token ids. Compared at 1e-12 (of the largest entry, at least 1): the residual stream after the
attention (the input of ln_2 / post_attention_layernorm; BertAttention's output), the MLP's
activation (the input of c_proj / down_proj; BertIntermediate's output) and output, the block's
output (``hidden_states[1]``, block 0's raw output: the last hidden state has the final norm in
it), the logits, the softmax and the loss. transformers' causal-LM loss casts the logits to float32
(``ForCausalLMLoss``: ``logits.float()``), so ``model(ids, labels=ids).loss`` is a float32 number:
it is compared at float32's precision, and the float64 reference is transformers' own
``fixed_cross_entropy`` of the float64 logits, which that loss calls after the shift.
"""

from __future__ import annotations

import numpy as np
import pytest

import symattn
from symattn.problem.load import load_problem
from symattn.render.stream import picture
from test_embeddings_hf import _seen
from test_problem_checkpoints import _error, _write

IDS = [5, 12, 3, 7, 0, 9]
GPT2 = dict(vocab_size=16, n_positions=8, n_embd=8, n_head=2, n_inner=16, bos_token_id=0, eos_token_id=0)
LLAMA = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=16, rms_norm_eps=1e-6)
BERT = dict(vocab_size=16, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
            max_position_embeddings=16, type_vocab_size=2)


def _close(got, want):
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))


def _build(tmp_path, cls: str, config: str, **fields):
    """The model ``cls`` of ``config(**fields)``, its weights drawn from N(0, 0.5²), in float64 and in
    eval mode (no dropout), saved in tmp_path by save_pretrained."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config)(**fields)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model.eval()


def _names(tmp_path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
        return set(f.keys())


def _derive(tmp_path, table: str, layout: str, layer: int = 0, extra: str = "", embeddings: bool = True):
    _write(tmp_path, f"X: {{file: model.safetensors, embeddings: {table}, tokens: {IDS}}}\n"
                     f"from: {{file: model.safetensors, layout: {layout}, layer: {layer}, heads: all, block: true"
                     f"{', embeddings: true' if embeddings else ''}}}\n" + extra)
    return symattn.derive(load_problem(tmp_path / "p.yaml"))


def _hidden(model, ids=IDS):
    """Every hidden state transformers reports (batch row 0), float64 numpy."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return [h[0].numpy() for h in out.hidden_states]


def _agree(d, seen, stages):
    for stage in stages:
        _close(d.approx(stage), seen[stage])


def _head_reference(model, ids=IDS):
    """transformers' logits (float64), their softmax, each row's cross-entropy against the next id and
    its mean (``fixed_cross_entropy``, in float64), and ``model(ids, labels=ids).loss`` (float32)."""
    import torch
    from transformers.loss.loss_utils import fixed_cross_entropy

    t = torch.tensor([ids])
    with torch.no_grad():
        logits = model(t).logits[0]
        hf_loss = model(t, labels=t).loss
        nll = torch.nn.functional.cross_entropy(logits[:-1], t[0, 1:], reduction="none")
        mean = fixed_cross_entropy(logits[:-1], t[0, 1:])
    assert logits.dtype == torch.float64 and hf_loss.dtype == torch.float32  # transformers' float32 loss
    return {"logits": logits.numpy(), "P": torch.softmax(logits, -1).numpy(), "nll": nll.numpy()[:, None],
            "L": np.array([[mean.item()]]), "hf_loss": hf_loss.item()}


def _check_head(d, ref):
    _agree(d, ref, ("logits", "P", "nll", "L"))
    np.testing.assert_allclose(d.approx("L")[0, 0], ref["hf_loss"], rtol=1e-6)
    assert np.allclose(d.approx("P").sum(axis=1), 1.0, atol=1e-12)


def test_gpt2_block_and_logit_lens_match_transformers(tmp_path):
    model = _build(tmp_path, "GPT2LMHeadModel", "GPT2Config", n_layer=2, **GPT2)
    assert "transformer.wte.weight" in _names(tmp_path) and "lm_head.weight" not in _names(tmp_path)
    block = model.transformer.h[0]
    seen = _seen(model, IDS, {"H": (block.ln_2, "in"), "G": (block.mlp.c_proj, "in"), "F": (block.mlp, "out")})
    hidden = _hidden(model)
    d = _derive(tmp_path, "transformer.wte.weight", "gpt2", extra="logits: {from: true}\n")
    _agree(d, seen, ("H", "G", "F"))
    _close(d.approx("Y"), hidden[1])
    _close(d.approx("Y"), seen["H"] + seen["F"])
    import torch

    with torch.no_grad():
        lens = model.lm_head(model.transformer.ln_f(torch.from_numpy(hidden[1]))).numpy()
    _close(d.approx("logits"), lens)
    assert "logit lens" in d.step("logits").why
    assert picture(d).blocks[-1].label == "The next token (the logit lens)"  # the web page's picture says so
    # layer 1 is the last: its logits are the model's own, and no lens
    d1 = _derive(tmp_path, "transformer.wte.weight", "gpt2", layer=1, embeddings=False,
                 extra="logits: {from: true}\n")
    assert "logit lens" not in d1.step("logits").why
    assert picture(d1).blocks[-1].label == "The next token"


def test_gpt2_logits_and_loss_match_transformers(tmp_path):
    model = _build(tmp_path, "GPT2LMHeadModel", "GPT2Config", n_layer=1, **GPT2)
    ref = _head_reference(model)
    d = _derive(tmp_path, "transformer.wte.weight", "gpt2", extra="logits: {from: true}\nloss: {targets: next}\n")
    _check_head(d, ref)
    assert "logit lens" not in d.step("logits").why
    # the last row alone, scored against explicit targets
    d = _derive(tmp_path, "transformer.wte.weight", "gpt2",
                extra="logits: {from: true, rows: last, top: 3}\nloss: {targets: [4]}\n")
    _close(d.approx("logits"), ref["logits"][-1:])
    _close(d.approx("L"), [[-np.log(ref["P"][-1, 4])]])


def _llama(tmp_path, layers: int, tied: bool = False):
    """The LLaMA model, with transformers' float32 steps (RoPE's angles, every RMSNorm: LlamaRMSNorm
    casts its input to float32) recomputed in float64; and the block's output before that patch."""
    from test_norm import _float64_rms
    from test_problem_configs import _float64_rope

    model = _build(tmp_path, "LlamaForCausalLM", "LlamaConfig", num_hidden_layers=layers, tie_word_embeddings=tied,
                   **LLAMA)
    assert model.config._attn_implementation == "sdpa"  # the eager path's softmax is float32 too
    unpatched = _hidden(model)[1]
    _float64_rope(model)
    for module in model.modules():
        if type(module).__name__ == "LlamaRMSNorm":
            _float64_rms(module)
    return model, unpatched


def test_llama_block_matches_transformers(tmp_path):
    model, unpatched = _llama(tmp_path, 2)
    layer = model.model.layers[0]
    seen = _seen(model, IDS, {"H": (layer.post_attention_layernorm, "in"), "G": (layer.mlp.down_proj, "in"),
                              "F": (layer.mlp, "out")})
    hidden = _hidden(model)
    d = _derive(tmp_path, "model.embed_tokens.weight", "llama")
    _agree(d, seen, ("H", "G", "F"))
    _close(d.approx("Y"), hidden[1])
    # transformers' own float32 steps: within float32's rounding of the float64 values
    np.testing.assert_allclose(d.approx("Y"), unpatched, rtol=0, atol=1e-5 * np.abs(unpatched).max())


@pytest.mark.parametrize("tied", [False, True])
def test_llama_logits_and_loss_match_transformers(tmp_path, tied):
    model, _ = _llama(tmp_path, 1, tied)
    names = _names(tmp_path)
    if tied and "lm_head.weight" in names:
        pytest.skip("save_pretrained kept lm_head.weight beside the tied embedding table")
    assert ("lm_head.weight" in names) is not tied
    ref = _head_reference(model)
    d = _derive(tmp_path, "model.embed_tokens.weight", "llama", extra="logits: {from: true}\nloss: {targets: next}\n")
    _check_head(d, ref)
    W_U = (model.model.embed_tokens if tied else model.lm_head).weight.detach().numpy()
    _close(d.approx("W_U"), W_U.T)


def test_bert_block_matches_transformers(tmp_path):
    model = _build(tmp_path, "BertModel", "BertConfig", **BERT)
    assert "embeddings.word_embeddings.weight" in _names(tmp_path)  # BertModel's names have no prefix
    layer = model.encoder.layer[0]
    seen = _seen(model, IDS, {"X_emb": (model.embeddings, "out"), "H": (layer.attention, "out"),
                              "G": (layer.intermediate, "out"), "F": (layer.output.dense, "out"),
                              "Y": (layer, "out")})
    hidden = _hidden(model)
    _close(seen["Y"], hidden[1])  # the hook and hidden_states agree on the layer's output
    d = _derive(tmp_path, "embeddings.word_embeddings.weight", "bert")
    _agree(d, seen, ("X_emb", "H", "G", "F"))
    _close(d.approx("Y"), hidden[1])


def test_block_without_mlp_tensors_is_one_error_line(tmp_path, symattn_cli):
    """A GPT-2 checkpoint missing h.0.mlp.c_fc.weight: one "Error:" line naming it and close names."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    tensors = {"wte.weight": (16, 8), "wpe.weight": (8, 8), "h.0.ln_1.weight": (8,), "h.0.ln_1.bias": (8,),
               "h.0.attn.c_attn.weight": (8, 24), "h.0.attn.c_attn.bias": (24,), "h.0.attn.c_proj.weight": (8, 8),
               "h.0.attn.c_proj.bias": (8,), "h.0.ln_2.weight": (8,), "h.0.ln_2.bias": (8,),
               "h.0.mlp.c_fc.bias": (16,), "h.0.mlp.c_proj.weight": (16, 8), "h.0.mlp.c_proj.bias": (8,)}
    save_file({k: rng.standard_normal(s) for k, s in tensors.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_head": 2, "n_embd": 8}', "utf-8")
    line = _error(tmp_path, f"X: {{file: model.safetensors, embeddings: wte.weight, tokens: {IDS}}}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, block: true}\n",
                  symattn_cli)
    assert line.startswith("Error: P:2:") and "from.block: " in line, line
    assert "has no tensor 'h.0.mlp.c_fc.weight'" in line and "; close: " in line, line
    assert "'h.0.mlp.c_fc.bias'" in line and "'h.0.mlp.c_proj.weight'" in line, line
