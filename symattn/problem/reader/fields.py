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


def section_entries(reader, node: yaml.Node, field: str, keys, usage: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """The entries of a section such as ``linear:`` or ``differential:``, by name, each with its key and
    value node: a mapping of known keys only (an empty or non-mapping section, or an unknown key, is
    one error naming ``usage``)."""
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise reader.at(node).error(f"{usage}, not {_yaml.kind(node)}", field)
    given: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for name_node, value in node.value:
        name = name_node.value if isinstance(name_node, yaml.ScalarNode) else None
        if name not in keys:
            hint = did_you_mean(str(name), keys, ignore_case=True)
            raise reader.at(name_node).error(f"unknown entry {excerpt(str(name))}{hint}; {usage}", field)
        given[name] = (name_node, value)
    return given
