"""Write tiny_gpt2.safetensors: one GPT-2 attention layer, d_model 8 and 2 heads of 4, in
GPT-2's tensor names and Conv1D layout, for worked_examples/tiny_gpt2_head.yaml.

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


def main() -> None:
    path = HERE / "tiny_gpt2.safetensors"
    save_file(tensors(), str(path))
    print(f"wrote {path} ({path.stat().st_size} bytes): one GPT-2 layer, d_model = {D_MODEL}, n_head = {N_HEAD}")


if __name__ == "__main__":
    main()
