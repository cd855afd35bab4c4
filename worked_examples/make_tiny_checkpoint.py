"""Write tiny_gpt2.safetensors: one GPT-2 attention layer, d_model 8 and 2 heads of 4, in
GPT-2's tensor names and Conv1D layout, for worked_examples/tiny_gpt2_head.yaml; and
tiny_gpt2_block.safetensors: the same layer with what a block needs around it (a token table
wte of 16 rows, a position table wpe of 8, and ln_1's weight and bias), for
worked_examples/tiny_gpt2_block.yaml, which starts from token ids.

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


def main() -> None:
    for name, made in (("tiny_gpt2.safetensors", tensors), ("tiny_gpt2_block.safetensors", block_tensors)):
        path = HERE / name
        save_file(made(), str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes): one GPT-2 layer, d_model = {D_MODEL}, n_head = {N_HEAD}")


if __name__ == "__main__":
    main()
