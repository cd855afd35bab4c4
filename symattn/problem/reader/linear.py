"""The reader's part for ``linear:`` (linear attention: the softmax replaced by a feature map), and the
rules that tie it to the rest of the problem: the masks it can follow, and the fields it cannot
go with, each refused in one line."""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..masks import Mask, mask_rule
from ..model import FEATURES, Linear
from .fields import Fields, key_of, node_of, section_entries

USAGE = "write {feature: relu}, {feature: elu1} (elu(x) + 1) or {feature: identity}"
# the mask kinds linear attention follows: the sum over the keys j ≤ i (causal) or over every key,
# either of them over the real tokens only (padding)
FOLLOWED = frozenset({"none", "causal", "padding", "valid-length"})
# the fields linear attention does not go with, and why (each refused in one line at its field)
REFUSED = {
    "rope": "RoPE with linear attention is not derived (RoFormer rotates φ(q) and φ(k) in the numerator only, "
            "a different formula): remove rope or linear",
    "context": "linear attention is derived for self-attention: the causal sum and the state grow one token at "
               "a time (remove context or linear)",
    "bias": "an additive bias has no place in linear attention: there is no softmax for it to shift (remove bias or linear)",
    "scale": "linear attention takes no scale: its features read the unscaled q and k, and a factor on every "
             "score cancels in the normalised weights (remove scale)",
    "tiling": "the tiled (online) softmax is the softmax's: linear attention has no softmax to tile; its own "
              "recurrent form is always shown (remove tiling)",
    "decode": "linear attention decodes from its constant-size state, shown in every linear solution: remove decode",
    "backward": "the backward pass of linear attention is not derived: remove backward (or linear)",
    "kv_heads": "linear attention with shared keys and values (kv_heads) is not derived: give each head its own W_K and W_V",
    "symbols": "linear attention needs numbers: the sign of a symbolic entry under relu is not decided (remove symbols)",
}


def read_linear(reader, fields: Fields, n_q: int, n_k: int, mask: Mask, loaded=None) -> tuple[Linear, Mask]:
    """The ``linear:`` section and the mask it follows: the problem's own, or causal when the
    problem gives none."""
    node = node_of(fields, "linear")
    key = key_of(fields, "linear")
    feature = None
    for _, value in section_entries(reader, node, "linear", ("feature",), USAGE).values():
        word = value.value if isinstance(value, yaml.ScalarNode) and not _yaml.is_null(value) else None
        if word not in FEATURES:
            what = excerpt(word) if word is not None else _yaml.kind(value)
            raise reader.at(value).error(
                f"unknown feature {what}{did_you_mean(str(word), FEATURES, ignore_case=True)}; use relu, elu1 "
                "(elu(x) + 1) or identity", "linear.feature")
        feature = word
    for field, why in REFUSED.items():
        if field in fields:
            raise reader.at(key_of(fields, field)).error(why, field)
    if loaded is not None and getattr(loaded, "rope", None) is not None:
        raise reader.at(key_of(fields, "from")).error(REFUSED["rope"], "from")
    if "mask" not in fields:  # causal by default: the sum over j ≤ i
        mask = Mask("causal", mask_rule("causal", n_q, n_k))
    elif not mask.kinds <= FOLLOWED:
        raise reader.at(node_of(fields, "mask")).error(
            f"linear attention follows a causal mask, no mask, or padding (its state sums the real keys j ≤ i, or "
            f"every real key); a {_kinds(mask)} mask is not one of them", "mask")
    return Linear(feature, key.start_mark.line + 1, key.start_mark.column + 1), mask


def _kinds(mask: Mask) -> str:
    return " and ".join(sorted(mask.kinds - FOLLOWED)).replace("matrix", "0/1 matrix")
