"""X looked up in a checkpoint's embedding table: ``{file: model.safetensors, embeddings:
"wte.weight", tokens: [464, 3797, 3332]}``.

The token ids are those the model's tokenizer gives (0-based rows of the table); each row is
read on its own, so 16 tokens of GPT-2's 50257×768 table cost 16 reads of 3 KB. The ids are
kept by the reader to label the rows (``#464``) when the problem gives no ``tokens:`` labels.
"""

from __future__ import annotations

import yaml

from ..checkpoints import safetensors as _safetensors
from .. import located_yaml as _yaml
from ...text import LongNumber, did_you_mean, whole_number
from ..places import item_field

_KEYS = ("file", "embeddings", "tokens", "cols")
_USAGE = "rows of an embedding table take file, embeddings, tokens and cols"


def embedding_rows(reader, keys: dict, path, rel: str, where_, name: str):
    """The NumPy rows of ``keys``' embedding table for its token ids; errors at their field."""
    for k in keys:
        if k not in _KEYS:
            hint = did_you_mean(k, _KEYS[1:], ignore_case=True)
            why = " (a tensor's slice is {file, tensor, rows, cols})" if k in ("tensor", "rows", "transpose") else ""
            raise reader.at(keys[k][0]).error(f"{k}: unknown key{hint}; {_USAGE}{why}", name)
    table = keys["embeddings"][1]
    if not isinstance(table, yaml.ScalarNode) or _yaml.is_null(table) or not table.value.strip():
        raise reader.at(table).error("embeddings: needs the name of the embedding table, such as \"wte.weight\"", name)
    if "tokens" not in keys:
        raise reader.at(keys["embeddings"][0]).error(
            "embeddings: needs tokens: the token ids to look up, such as [464, 3797, 3332] "
            "(the model's tokenizer gives them)", name)
    ids_node = keys["tokens"][1]
    field = f"{name}.tokens"
    if not isinstance(ids_node, yaml.SequenceNode) or not ids_node.value:
        raise reader.at(ids_node).error(
            f"the token ids are a list such as [464, 3797, 3332], not {_yaml.kind(ids_node)}", field)
    ids = []
    for i, item in enumerate(ids_node.value):
        try:
            token = whole_number(item.value) if isinstance(item, yaml.ScalarNode) and not item.style else None
        except LongNumber as exc:
            raise reader.at(item).error(str(exc), item_field(field, i)) from None
        if token is None:
            raise reader.at(item).error(
                f"a token id is a whole number ≥ 0 (a row of the table, counted from 0 as the tokenizer "
                f"does), not {_yaml.kind(item)}", item_field(field, i))
        ids.append(token)
    cols = None
    if "cols" in keys:
        v = keys["cols"][1]
        if not isinstance(v, yaml.ScalarNode) or _yaml.is_null(v) or not v.value.strip():
            raise reader.at(v).error('cols: needs a slice like "0:64" (quote it)', name)
        cols = v.value
    try:
        array = _safetensors.read_embeddings(path, table.value, ids, cols, reader.max_size - reader.size)
    except _safetensors.TokenError as exc:
        raise reader.at(ids_node.value[exc.index]).error(str(exc), item_field(field, exc.index)) from None
    except _safetensors.CheckpointError as exc:
        text = str(exc)
        if text.startswith("cols:"):
            raise reader.at(keys["cols"][1]).error(text, name) from None
        if text.startswith("has no tensor") or text.startswith("tensor "):
            raise reader.at(table).error(f"{rel!r} {text}" if text.startswith("has") else text, name) from None
        raise where_.error(f"{rel!r} {text}" if not text.startswith("the ") else text, name) from None
    reader.token_ids[name] = ids
    reader.tables[name] = (path, rel, table.value, where_)  # a tied unembedding reads the whole table
    return array
