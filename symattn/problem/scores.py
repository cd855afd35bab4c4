"""What soft-capping (``softcap: c``) and a temperature (``temperature: T``) may be combined with.

Both change the scores before the softmax: c·tanh(S_scaled/c) before the mask (Gemma 2), Ŝ/T after
it. The passes that recompute the scores on their own (the backward pass, the tiled softmax,
decoding from the KV cache) do not derive them yet, and are refused in one line rather than
derived without them.
"""

from __future__ import annotations

_WHAT = {"softcap": "soft-capping (softcap)", "temperature": "the temperature"}
_PASSES = {"backward": "the backward pass", "tiling": "the tiled softmax", "decode": "decoding from the KV cache"}


def score_change_refusal(field: str, backward=None, tiling=None, decode=None) -> str | None:
    """Why ``field`` (softcap or temperature) cannot be derived with the passes given; None when it can."""
    for name, given in (("backward", backward), ("tiling", tiling), ("decode", decode)):
        if given is not None:
            return f"{_PASSES[name]} is not derived with {_WHAT[field]} yet: remove {field}, or leave out {_PASSES[name]}"
    return None
