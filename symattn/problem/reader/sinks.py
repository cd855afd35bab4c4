"""The reader's part for the ``sink:`` field: gpt-oss's learned sink logits, one per query head."""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ..places import item_field, plural
from .fields import Fields, key_of, node_of
from .layer import is_flat_row


_QUERY_HEADS = ("query heads", "query head")


def read_sinks(reader, fields: Fields, n_heads: int, others: dict) -> tuple[sympy.Expr, ...] | None:
    """``sink: s`` (one head), ``sink: [s_1, …, s_h]`` (one per query head) or ``{file, tensor}``
    (a checkpoint's 1-dimensional tensor of h entries): each an exact number. ``others`` names
    the fields given with it that sinks do not combine with yet."""
    if "sink" not in fields:
        return None
    node = node_of(fields, "sink")
    for name, given in others.items():
        if given:
            raise reader.at(key_of(fields, "sink")).error(
                f"learned sinks with {name} are not supported yet; remove sink or {name}", "sink")
    if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node):
        values = (reader.number(node, "sink", use_symbols=False),)
    elif is_flat_row(node):
        values = tuple(reader.flat_row(node, "sink", use_symbols=False))
    elif isinstance(node, yaml.MappingNode):
        m = reader.matrix(node, "sink", vector=True)
        if m.rows != 1:
            raise reader.at(node).error(
                f"the tensor is {m.rows}×{m.cols}; the sinks are one number per query head (a 1-dimensional "
                "tensor such as gpt-oss's self_attn.sinks)", "sink")
        values = tuple(m[0, j] for j in range(m.cols))
    else:
        raise reader.at(node).error(
            f"sink is one number per query head: a number such as 0 (one head), a list such as [0, 1/2], or "
            f"{{file, tensor}}; not {_yaml.kind(node)}", "sink")
    if len(values) != n_heads:
        raise reader.at(node).error(
            f"there {'is' if len(values) == 1 else 'are'} {len(values)} sink {plural(len(values), 'logit')} but "
            f"{n_heads} {_QUERY_HEADS[n_heads == 1]}: " + "give one sink per query head"
            + (" (grouped K/V heads included: every query head has its own sink)" if "kv_heads" in fields else ""),
            "sink")
    for j, s in enumerate(values):
        if not s.is_real or not s.is_finite:
            where = node.value[j] if isinstance(node, yaml.SequenceNode) else node
            field = item_field("sink", j) if isinstance(node, yaml.SequenceNode) else "sink"
            raise reader.at(where).error(f"a sink logit is a finite real number, not {sympy.sstr(s)}", field)
    return values
