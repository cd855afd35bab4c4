"""A problem file's top-level fields: their names, each given once, and their nodes."""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt

FIELDS = (
    "title",
    "tokens",
    "X",
    "context",
    "context_tokens",
    "W_Q",
    "W_K",
    "W_V",
    "Q",
    "K",
    "V",
    "heads",
    "kv_heads",
    "kv",
    "W_O",
    "b_Q",
    "b_K",
    "b_V",
    "b_O",
    "mask",
    "bias",
    "scale",
    "softcap",
    "temperature",
    "qk_norm",
    "symbols",
    "values",
    "digits",
    "backward",
    "rope",
    "tiling",
    "positions",
    "token_types",
    "embeddings_norm",
    "norm",
    "residual",
    "mlp",
    "logits",
    "loss",
    "decode",
    "sink",
    "linear",
    "mla",
    "differential",
    "from",
)

Fields = dict[str, tuple[yaml.Node, yaml.Node]]  # each field given: its name's node and its value's


def read_fields(reader, root: yaml.MappingNode) -> Fields:
    """The fields of the mapping ``root``, each a known name given once."""
    fields: Fields = {}
    for key, value in root.value:
        if not isinstance(key, yaml.ScalarNode) or _yaml.is_null(key):
            raise reader.at(key).error("a field name must be a plain word such as X or W_Q")
        name = key.value
        if name not in FIELDS:
            raise reader.at(key).error(f"unknown field {excerpt(name)}{did_you_mean(name, FIELDS, ignore_case=True)}")
        if name in fields:
            first = reader.at(fields[name][0])
            raise reader.at(key).error(f"the field {name!r} is given twice (first at line {first.line})")
        fields[name] = (key, value)
    return fields


def node_of(fields: Fields, name: str) -> yaml.Node | None:
    """The value of the field ``name``; None when it is not given."""
    return fields[name][1] if name in fields else None


def key_of(fields: Fields, name: str) -> yaml.Node:
    """The name's node of the field ``name`` (given): where a rule about the field is reported."""
    return fields[name][0]
