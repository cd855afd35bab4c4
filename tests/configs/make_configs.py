"""Writes the config.json files in this folder: what Hugging Face transformers writes for the tiny
models of tests/test_problem_configs.py, one file per case, so that those tests run without transformers.

    python tests/configs/make_configs.py

Each file is ``config.save_pretrained``'s own output (transformers 5 writes RoPE settings under
``rope_parameters``). The models are tiny, with 2 layers: LLaMA-like ones d_model 16 and 4 heads of
width 4 sharing 2 K/V heads, GPT-2 and BERT d_model 8 and 2 heads.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

LLAMA = dict(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=32, max_position_embeddings=64)
GPT2 = dict(n_embd=8, n_head=2, n_layer=2, n_positions=16, vocab_size=32, bos_token_id=0, eos_token_id=0)
BERT = dict(hidden_size=8, num_attention_heads=2, num_hidden_layers=2, intermediate_size=16, vocab_size=32,
            max_position_embeddings=16)


def _rope(kind: str, theta: float = 10000.0, **extra) -> dict:
    return {"rope_type": kind, "rope_theta": theta, **extra}


def configs() -> dict:
    """Each case's transformers config, by the name of its file."""
    import transformers as tf

    return {
        # read: the rope_theta under rope_parameters, grouped K/V heads, biases (attention_bias)
        "llama": tf.LlamaConfig(**LLAMA, attention_bias=True),
        "llama_rope_theta_100": tf.LlamaConfig(**LLAMA, attention_bias=True, rope_parameters=_rope("default", 100.0)),
        "llama_head_dim_6": tf.LlamaConfig(**LLAMA, head_dim=6, rope_parameters=_rope("default", 100.0)),
        "qwen2_rope_theta_1e6": tf.Qwen2Config(**LLAMA, rope_parameters=_rope("default", 1e6)),
        "mistral": tf.MistralConfig(**LLAMA),  # sliding_window 4096: no key of a short X is hidden
        "mistral_sliding_window_3": tf.MistralConfig(**LLAMA, sliding_window=3),
        "qwen2_sliding_window_2": tf.Qwen2Config(**LLAMA, use_sliding_window=True, sliding_window=2,
                                                 max_window_layers=1),
        "gpt2": tf.GPT2Config(**GPT2),
        "gpt2_inverse_layer_idx": tf.GPT2Config(**GPT2, scale_attn_by_inverse_layer_idx=True),
        "gpt2_unscaled": tf.GPT2Config(**GPT2, scale_attn_weights=False),
        "bert": tf.BertConfig(**BERT),
        "roberta": tf.RobertaConfig(**BERT),
        "bert_decoder": tf.BertConfig(**BERT, is_decoder=True),
        # refused: what symattn does not apply
        "llama_rope_llama3": tf.LlamaConfig(**LLAMA, rope_parameters=_rope(
            "llama3", 500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16)),
        "llama_rope_linear": tf.LlamaConfig(**LLAMA, rope_parameters=_rope("linear", factor=2.0)),
        "llama_rope_dynamic": tf.LlamaConfig(**LLAMA, rope_parameters=_rope("dynamic", factor=2.0)),
        "llama_rope_yarn": tf.LlamaConfig(**LLAMA, rope_parameters=_rope("yarn", factor=4.0,
                                                                         original_max_position_embeddings=16)),
        "llama_rope_longrope": tf.LlamaConfig(**LLAMA, rope_parameters=_rope(
            "longrope", short_factor=[1.0, 1.0], long_factor=[2.0, 2.0], original_max_position_embeddings=16)),
        "llama_partial_rotary": tf.LlamaConfig(**LLAMA, rope_parameters=_rope("default",
                                                                              partial_rotary_factor=0.5)),
        "gemma2": tf.Gemma2Config(**LLAMA, head_dim=4),
        "qwen3": tf.Qwen3Config(**LLAMA, head_dim=4),
        "bert_relative_key": tf.BertConfig(**BERT, position_embedding_type="relative_key"),
    }


def written(config) -> str:
    """The config.json that ``config.save_pretrained`` writes."""
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        return (Path(tmp) / "config.json").read_text("utf-8")


def main() -> None:
    for name, config in configs().items():
        text = written(config)
        json.loads(text)
        (HERE / f"{name}.json").write_text(text, "utf-8")


if __name__ == "__main__":
    main()
