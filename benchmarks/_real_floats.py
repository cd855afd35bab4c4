"""The "real floats" problems of benchmarks/bench_checkpoint.py (issue #29): LLaMA layers whose
weights and inputs are the floats a model holds, each its exact 24- to 53-bit dyadic rational.

Not a benchmark by itself. Run as a script it writes the problems into a folder, which is how to
derive them by hand (or profile them):

    python benchmarks/_real_floats.py DIR
    python -m symattn derive DIR/tiny/problem.yaml -o DIR/tiny/out.tex
    python -m symattn derive DIR/wide/problem.yaml -o DIR/wide/out.tex

Each problem has a peer without RoPE in the same folder, ``norope.yaml``: the same X, the same
heads (with the same K/V groups and ``W_O``), the same causal mask and scale, each weight the very
number the checkpoint holds, read from a float64 ``.npy`` written beside it (the layer's
``from:`` has no way to leave RoPE out). The two derivations differ only by RoPE's stages and by
how the weights are read, which shows what the rest costs.

* ``tiny``: a LLaMA model of hidden size 8, 4 heads of width 2 on 2 K/V heads, 1 layer, written
  by transformers' ``save_pretrained`` (``model.safetensors`` of float32, ``config.json``; random
  init after ``torch.manual_seed``), and X a float64 ``.npy`` of 5 rows ~ N(0, 1), fixed seed.
  The problem: ``from: {layout: llama, layer: 0, heads: all}``. Target: < 1 s.
* ``wide``: one head of a LLaMA-shaped layer, d_model 2048, 32 heads of 64, 4 K/V heads,
  ``rope_theta`` 500000 in ``config.json`` (written here as transformers 5 writes it, under
  ``rope_parameters``), the layer's four projections bfloat16 in ``model.safetensors`` (written
  by NumPy as raw uint16, with safetensors.numpy's format; no PyTorch), and X a float64 ``.npy``
  of 16 rows ~ N(0, 1). The problem: ``from: {layout: llama, layer: 0, heads: [1]}``. Target: < 3 s.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

TINY = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=32, max_position_embeddings=64)
TINY_TOKENS = 5
WIDE_D_MODEL, WIDE_HEADS, WIDE_KV_HEADS, WIDE_HEAD_DIM, WIDE_THETA = 2048, 32, 4, 64, 500000
WIDE_TOKENS = 16
TARGETS = {"tiny": 1.0, "wide": 3.0}


def _x(n: int, d_model: int, seed: int):
    import numpy as np

    return np.random.default_rng(seed).standard_normal((n, d_model))  # float64: 53-bit dyadics


def write_tiny(folder: Path, seed: int = 0) -> Path:
    """The tiny LLaMA (transformers, random init, save_pretrained) and its problem; the problem's path."""
    import numpy as np
    import torch
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    model.save_pretrained(folder)
    np.save(folder / "x.npy", _x(TINY_TOKENS, TINY["hidden_size"], seed))
    problem = folder / "problem.yaml"
    problem.write_text("title: tiny LLaMA layer (save_pretrained), 5 tokens, 4 heads on 2 K/V heads\n"
                       "X: {file: x.npy}\n"
                       "from: {file: model.safetensors, layout: llama, layer: 0, heads: all}\n", "utf-8")
    return problem


def _bf16(values):
    """float32 values rounded to bfloat16 (to nearest, ties to even), as the raw uint16 words."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def write_bf16_safetensors(path: Path, tensors: dict) -> None:
    """A safetensors file of BF16 tensors (``tensors``: name -> uint16 array of the words), its
    header written here: safetensors.numpy cannot name a uint16 array BF16."""
    header, offset = {}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            f.write(t.astype("<u2").tobytes())


def wide_config() -> dict:
    """A LLaMA 3.2 1B-like config.json, RoPE's settings as transformers 5 writes them (plain RoPE)."""
    return {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "head_dim": WIDE_HEAD_DIM, "hidden_act": "silu", "hidden_size": WIDE_D_MODEL,
            "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "llama",
            "num_attention_heads": WIDE_HEADS, "num_hidden_layers": 1, "num_key_value_heads": WIDE_KV_HEADS,
            "rms_norm_eps": 1e-05, "rope_parameters": {"rope_theta": float(WIDE_THETA), "rope_type": "default"},
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "vocab_size": 128256}


def write_wide(folder: Path, seed: int = 0) -> Path:
    """The d_model-2048 bfloat16 LLaMA layer and its problem (one head); the problem's path."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, kv = WIDE_D_MODEL, WIDE_KV_HEADS * WIDE_HEAD_DIM
    shapes = {"q_proj": (d, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, d)}
    tensors = {f"model.layers.0.self_attn.{name}.weight": _bf16(rng.standard_normal(shape, dtype=np.float32)
                                                                 * np.float32(0.02))
               for name, shape in shapes.items()}
    write_bf16_safetensors(folder / "model.safetensors", tensors)
    (folder / "config.json").write_text(json.dumps(wide_config(), indent=2) + "\n", "utf-8")
    np.save(folder / "x.npy", _x(WIDE_TOKENS, d, seed))
    problem = folder / "problem.yaml"
    problem.write_text(f"title: LLaMA-shaped layer (bfloat16, d_model {d}), head 1, {WIDE_TOKENS} tokens\n"
                       "X: {file: x.npy}\n"
                       "from: {file: model.safetensors, layout: llama, layer: 0, heads: [1]}\n", "utf-8")
    return problem


def read_tensors(path: Path) -> dict:
    """The tensors of a safetensors file of F32 or BF16 tensors, as float32 arrays (exactly)."""
    import numpy as np

    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        data = raw[8 + length + a:8 + length + b]
        if info["dtype"] == "BF16":
            words = np.frombuffer(data, dtype="<u2").astype(np.uint32) << np.uint32(16)
            out[name] = words.view(np.float32).reshape(info["shape"])
        else:
            assert info["dtype"] == "F32", info["dtype"]
            out[name] = np.frombuffer(data, dtype="<f4").reshape(info["shape"])
    return out


def write_peer(problem: Path, heads: list[int], n_head: int, n_kv: int) -> Path:
    """``norope.yaml`` beside ``problem``: layer 0's ``heads`` (counted from 1) as the layout
    reads them, without RoPE, every weight a float64 ``.npy`` (nn.Linear's out x in, transposed)."""
    import numpy as np

    folder = problem.parent
    t = {k.removeprefix("model."): v for k, v in read_tensors(folder / "model.safetensors").items()}
    att = "layers.0.self_attn."
    wq, wk, wv, wo = (t[att + f"{p}_proj.weight"].astype(np.float64) for p in "qkvo")
    d_head = wq.shape[0] // n_head

    def save(name: str, m) -> str:
        np.save(folder / name, np.ascontiguousarray(m))
        return f"{{file: {name}}}"

    def rows(m, h: int):  # head (or K/V head) h, from 0: its d_head rows, as d_model x d_head
        return m[h * d_head:(h + 1) * d_head].T

    group = [(q - 1) * n_kv // n_head for q in heads]
    lines = [f"title: {folder.name} without RoPE", "X: {file: x.npy}", "mask: causal"]
    if len(heads) == 1:
        lines += [f"W_Q: {save('wq.npy', rows(wq, heads[0] - 1))}", f"W_K: {save('wk.npy', rows(wk, group[0]))}",
                  f"W_V: {save('wv.npy', rows(wv, group[0]))}"]
        return _written(folder / "norope.yaml", lines)
    groups = sorted(set(group))
    lines += [f"kv_heads: {len(groups)}", "heads:"]
    lines += [f"  - W_Q: {save(f'wq{q}.npy', rows(wq, q - 1))}" for q in heads]
    lines += ["kv:"] + [f"  - {{W_K: {save(f'wk{g + 1}.npy', rows(wk, g))}, W_V: {save(f'wv{g + 1}.npy', rows(wv, g))}}}"
                        for g in groups]
    cols = np.concatenate([np.arange((q - 1) * d_head, q * d_head) for q in heads])
    lines.append(f"W_O: {save('wo.npy', wo[:, cols].T)}")
    return _written(folder / "norope.yaml", lines)


def _written(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return path


def write_all(root: Path, seed: int = 0) -> dict[str, Path]:
    """Both problems, in root/tiny and root/wide; their paths by name."""
    tiny, wide = write_tiny(root / "tiny", seed), write_wide(root / "wide", seed)
    write_peer(tiny, [1, 2, 3, 4], TINY["num_attention_heads"], TINY["num_key_value_heads"])
    write_peer(wide, [1], WIDE_HEADS, WIDE_KV_HEADS)
    return {"tiny": tiny, "wide": wide}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python benchmarks/_real_floats.py DIR")
    for name, path in write_all(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
