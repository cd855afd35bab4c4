"""Write tiny_gpt2.safetensors: one GPT-2 attention layer, d_model 8 and 2 heads of 4, in
GPT-2's tensor names and Conv1D layout, for worked_examples/tiny_gpt2_head.yaml; and
tiny_gpt2_block.safetensors: the same layer with what a block needs around it (a token table
wte of 16 rows, a position table wpe of 8, and ln_1's weight and bias), for
worked_examples/tiny_gpt2_block.yaml, which starts from token ids; and tiny_bert_block.safetensors:
one BERT layer of the same size in BERT's names (nn.Linear, out × in) with its embeddings (token,
position and token-type tables and their LayerNorm) and the post norm behind the attention, for
worked_examples/tiny_bert_block.yaml; tiny_gpt2_model.safetensors: a whole one-layer GPT-2 (the
block with ln_2, its MLP and ln_f; wte tied), for worked_examples/tiny_gpt2_model.yaml; and
tiny_llama_block.safetensors: a one-layer LLaMA (RMSNorm, GQA, SwiGLU), for
worked_examples/tiny_llama_block.yaml.

The weights are seeded and every one is a multiple of 1/4 between −1 and 1, stored as float32,
so the exact solution stays readable. It needs NumPy and safetensors only (no PyTorch):

    python worked_examples/make_tiny_checkpoint.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

D_MODEL, N_HEAD = 8, 2
HERE = Path(__file__).resolve().parent


def quarters(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Multiples of 1/4 from −1 to 1, exactly representable in float32."""
    return (rng.integers(-4, 5, size=shape) / 4).astype(np.float32)


def tensors(seed: int = 2019) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "h.0.attn.c_attn.weight": quarters(rng, D_MODEL, 3 * D_MODEL),  # in × out: Q | K | V
        "h.0.attn.c_attn.bias": quarters(rng, 3 * D_MODEL),
        "h.0.attn.c_proj.weight": quarters(rng, D_MODEL, D_MODEL),
        "h.0.attn.c_proj.bias": quarters(rng, D_MODEL),
    }


def block_tensors(seed: int = 2019) -> dict[str, np.ndarray]:
    """The layer of :func:`tensors` with the token and position tables and ln_1 (γ from 1/2 to
    3/2, β from −1/2 to 1/2), drawn from a second stream so the layer itself is the same."""
    rng = np.random.default_rng(seed + 1)
    return {
        **tensors(seed),
        "wte.weight": quarters(rng, 16, D_MODEL),
        "wpe.weight": quarters(rng, 8, D_MODEL),
        "h.0.ln_1.weight": (1 + quarters(rng, D_MODEL) / 2).astype(np.float32),
        "h.0.ln_1.bias": (quarters(rng, D_MODEL) / 2).astype(np.float32),
    }


def bert_tensors(seed: int = 1810) -> dict[str, np.ndarray]:
    """A BERT layer 0 with its embeddings: every weight a multiple of 1/4, each LayerNorm's γ from
    1/2 to 3/2 and β from −1/2 to 1/2."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in ("self.query", "self.key", "self.value", "output.dense"):
        out[f"encoder.layer.0.attention.{name}.weight"] = quarters(rng, D_MODEL, D_MODEL)  # out × in
        out[f"encoder.layer.0.attention.{name}.bias"] = quarters(rng, D_MODEL)
    for name, rows in (("word_embeddings", 16), ("position_embeddings", 8), ("token_type_embeddings", 2)):
        out[f"embeddings.{name}.weight"] = quarters(rng, rows, D_MODEL)
    for norm in ("embeddings.LayerNorm", "encoder.layer.0.attention.output.LayerNorm"):
        out[norm + ".weight"] = (1 + quarters(rng, D_MODEL) / 2).astype(np.float32)
        out[norm + ".bias"] = (quarters(rng, D_MODEL) / 2).astype(np.float32)
    return out


def model_tensors(seed: int = 2019) -> dict[str, np.ndarray]:
    """A whole one-layer GPT-2: the block of :func:`block_tensors` with ln_2, its MLP (c_fc: 8 × 16,
    c_proj: 16 × 8, Conv1D) and the final norm ln_f; the unembedding is wte, tied. The new tensors
    come from a third stream, so the layer and the tables are the same."""
    rng = np.random.default_rng(seed + 2)
    norm = lambda: ((1 + quarters(rng, D_MODEL) / 2).astype(np.float32), (quarters(rng, D_MODEL) / 2).astype(np.float32))
    (g2, b2), (gf, bf) = norm(), norm()
    return {
        **block_tensors(seed),
        "h.0.ln_2.weight": g2, "h.0.ln_2.bias": b2,
        "h.0.mlp.c_fc.weight": quarters(rng, D_MODEL, 2 * D_MODEL), "h.0.mlp.c_fc.bias": quarters(rng, 2 * D_MODEL),
        "h.0.mlp.c_proj.weight": quarters(rng, 2 * D_MODEL, D_MODEL), "h.0.mlp.c_proj.bias": quarters(rng, D_MODEL),
        "ln_f.weight": gf, "ln_f.bias": bf,
    }


def llama_tensors(seed: int = 2023) -> dict[str, np.ndarray]:
    """A one-layer LLaMA in its names (nn.Linear, out × in): d_model 8, 4 query heads of 2 sharing 2
    K/V heads, RMSNorms (γ from 1/2 to 3/2), a SwiGLU MLP of 16 (gate_proj, up_proj, down_proj), the
    final norm and a token table of 16 rows, tied to the unembedding (no lm_head)."""
    rng = np.random.default_rng(seed)
    gain = lambda: (1 + quarters(rng, D_MODEL) / 2).astype(np.float32)
    return {
        "model.embed_tokens.weight": quarters(rng, 16, D_MODEL),
        "model.layers.0.input_layernorm.weight": gain(),
        "model.layers.0.self_attn.q_proj.weight": quarters(rng, D_MODEL, D_MODEL),
        "model.layers.0.self_attn.k_proj.weight": quarters(rng, D_MODEL // 2, D_MODEL),
        "model.layers.0.self_attn.v_proj.weight": quarters(rng, D_MODEL // 2, D_MODEL),
        "model.layers.0.self_attn.o_proj.weight": quarters(rng, D_MODEL, D_MODEL),
        "model.layers.0.post_attention_layernorm.weight": gain(),
        "model.layers.0.mlp.gate_proj.weight": quarters(rng, 2 * D_MODEL, D_MODEL),
        "model.layers.0.mlp.up_proj.weight": quarters(rng, 2 * D_MODEL, D_MODEL),
        "model.layers.0.mlp.down_proj.weight": quarters(rng, D_MODEL, 2 * D_MODEL),
        "model.norm.weight": gain(),
    }


def main() -> None:
    for name, made, what, heads in (("tiny_gpt2.safetensors", tensors, "GPT-2", N_HEAD),
                                    ("tiny_gpt2_block.safetensors", block_tensors, "GPT-2", N_HEAD),
                                    ("tiny_bert_block.safetensors", bert_tensors, "BERT", N_HEAD),
                                    ("tiny_gpt2_model.safetensors", model_tensors, "whole GPT-2", N_HEAD),
                                    ("tiny_llama_block.safetensors", llama_tensors, "LLaMA", 4)):
        path = HERE / name
        save_file(made(), str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes): one {what} layer, d_model = {D_MODEL}, n_head = {heads}")


if __name__ == "__main__":
    main()
