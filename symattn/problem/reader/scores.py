"""The reader's part for the fields that change the scores before the softmax: ``softcap: c``
(c·tanh(S_scaled/c), before the mask) and ``temperature: T`` (the masked scores divided by T)."""

from __future__ import annotations

import sympy

from .. import located_yaml as _yaml
from ...numbers.parse import is_positive
from ..scores import score_change_refusal
from .fields import Fields, key_of, node_of

_MEANING = {"softcap": "the cap c of c·tanh(s/c), a positive number such as 50",
            "temperature": "the number T the masked scores are divided by, a positive number such as 2"}


def read_scores(reader, fields: Fields, passes: dict) -> dict:
    """``softcap`` and ``temperature`` (None when not given), each a positive exact number, and
    refused with a pass that does not derive them."""
    out: dict[str, sympy.Expr | None] = {"softcap": None, "temperature": None}
    for name in out:
        if name not in fields:
            continue
        node = node_of(fields, name)
        if _yaml.is_null(node) or not hasattr(node, "value") or not isinstance(node.value, str):
            raise reader.at(node).error(f"{name} is {_MEANING[name]}, not {_yaml.kind(node)}", name)
        value = reader.number(node, name, use_symbols=False)
        if not is_positive(value):
            raise reader.at(node).error(f"{name} must be positive ({_MEANING[name]}), not {value}", name)
        refusal = score_change_refusal(name, passes.get("backward"), passes.get("tiling"), passes.get("decode"))
        if refusal:
            raise reader.at(key_of(fields, name)).error(refusal, name)
        out[name] = value
    return out
