"""QK-norm from a ``llama``-named checkpoint: ``self_attn.q_norm.weight`` and ``self_attn.k_norm.weight``
beside ``q_proj`` (Qwen 3's names), each one row of width d_head shared by every head, with the
config's ``rms_norm_eps``. A layer with one of them and not the other, or with a norm over the whole
projection (OLMo 2's, n_head·d_head wide), is refused: symattn normalises each head's rows."""

from __future__ import annotations

from ...text import quote_path
from ..model import Norm, QkNorm


def read_qk_norm(at, key, node, names: dict, ckpt, config, d_head: int) -> QkNorm | None:
    """The layer's QK-norm, or None when the file has no q_norm and no k_norm beside q_proj."""
    found = {p: names[p][:-len("_proj")] + "_norm.weight" for p in ("q", "k")}
    have = [p for p, name in found.items() if name in ckpt.shapes]
    if not have:
        if config.data.get("model_type") == "qwen3":
            raise at(key).error(f"the config.json beside {quote_path(ckpt.rel)} is for a qwen3 model, which normalises "
                                f"its queries and keys (QK-norm), but the file has no {found['q']}: name the file "
                                "that holds the layer", "from")
        return None
    if len(have) == 1:
        other = found["k" if have == ["q"] else "q"]
        raise at(node).error(f"{quote_path(ckpt.rel)} has {found[have[0]]} but no {other}: symattn applies QK-norm to "
                             "the queries and the keys together, as Qwen 3 does", "from.layout")
    weights = {}
    for p, name in found.items():
        shape = ckpt.shapes[name]
        if shape != [d_head]:
            raise at(node).error(f"{name} has shape {shape}, not [{d_head}]: symattn's QK-norm normalises each head's "
                                 f"rows with one weight of width d_head = {d_head} shared by every head (Qwen 3's); a "
                                 "norm over the whole projection (OLMo 2's) is not applied", "from.layout")
        weights[p] = ckpt.exact(ckpt.array(name, vector=True))
    eps = config.norm_eps(("rms_norm_eps",), "1e-6")
    return QkNorm(Norm("rmsnorm", eps, weights["q"]), Norm("rmsnorm", eps, weights["k"]))
