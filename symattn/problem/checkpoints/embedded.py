"""``from: {..., embeddings: true}``: what a model adds to its embedding rows before layer 0, read
from the checkpoint.

- ``gpt2``: the learned positions ``wpe``, rows 0 … n − 1;
- ``bert``: the learned positions ``embeddings.position_embeddings`` (RoBERTa's start after the
  padding id, as its model counts them), the token-type rows ``embeddings.token_type_embeddings``
  (type 0 for every token unless ``from``'s ``token_types`` lists them) and the embeddings' own
  LayerNorm ``embeddings.LayerNorm`` with the config's ``layer_norm_eps``;
- ``llama``: nothing (RoPE turns the queries and keys instead).

X must be rows of the model's embedding table (``X: {file, embeddings, tokens}``): the ids give
RoBERTa's positions, and anything else is not what layer 0 reads.
"""

from __future__ import annotations

import numpy as np
import yaml

from .. import located_yaml as _yaml
from ..model import Norm, Positions
from .config import count_of, shown_value
from ..places import item_field
from ...text import LongNumber, quote_path, whole_number

ROBERTA = ("roberta", "xlm-roberta")  # positions counted from padding_idx + 1, skipping padding tokens


def read_embedded(reader, given: dict, word: str, prefix: str, ckpt, config, layer: int, X, ids) -> tuple:
    """(positions, token-type rows, type ids, the embeddings' norm) of ``from``'s ``embeddings: true``;
    ``ids``: X's token ids (None when X is not rows of an embedding table)."""
    at = reader.at
    node = given["embeddings"][1]
    if layer != 0:
        raise at(node).error(f"the embeddings feed layer 0; layer {layer}'s input is the output of the layers below "
                             "it: give it as X (the README's hook recipe), without embeddings", "from.embeddings")
    if ids is None:
        raise at(node).error("embeddings: true adds what the model adds to rows of its embedding table: give X as "
                             "{file: model.safetensors, embeddings: TABLE, tokens: [ids]}", "from.embeddings")
    if "token_types" in given and word != "bert":
        raise at(given["token_types"][0]).error(f"token_types are BERT's; {word} has no token-type embeddings",
                                                "from.token_types")
    if word == "llama":
        return None, None, (), None
    n = len(ids)
    if word == "gpt2":
        return _positions(at, node, ckpt, prefix + "wpe.weight", list(range(n))), None, (), None
    pad = None
    if config.data.get("model_type") in ROBERTA:
        stated = config.data.get("pad_token_id")
        pad = 1 if stated is None else count_of(stated)  # transformers' RobertaConfig default: 1
        if pad is None:
            config.refuse(f"has pad_token_id {shown_value(stated)}, not a whole number ≥ 0 (RoBERTa counts positions "
                          "from it)")
    positions = _positions(at, node, ckpt, prefix + "embeddings.position_embeddings.weight", position_ids(ids, pad))
    type_ids = _type_ids(reader, given, n)
    types = _rows(at, node, ckpt, prefix + "embeddings.token_type_embeddings.weight", type_ids, "token types",
                  given["token_types"][1] if "token_types" in given else None)
    name = prefix + "embeddings.LayerNorm"
    for part in ("weight", "bias"):
        if f"{name}.{part}" not in ckpt.shapes:
            raise at(node).error(ckpt.missing(f"{name}.{part}", "the embeddings' LayerNorm"), "from.embeddings")
        if ckpt.shapes[f"{name}.{part}"] != [X.cols]:
            raise at(node).error(f"{name}.{part} has shape {ckpt.shapes[f'{name}.{part}']}, not [{X.cols}] (one entry "
                                 "per feature of d_model)", "from.embeddings")
    norm = Norm("layernorm", config.norm_eps(("layer_norm_eps",), "1e-12"),
                ckpt.exact(ckpt.array(name + ".weight", vector=True)), ckpt.exact(ckpt.array(name + ".bias", vector=True)))
    return positions, types, tuple(type_ids), norm


def position_ids(ids: list[int], pad: int | None) -> list[int]:
    """The position of each token: 0, 1, … (BERT, GPT-2), or RoBERTa's count of the tokens that are
    not padding so far, after ``pad`` (a padding token itself at ``pad``)."""
    if pad is None:
        return list(range(len(ids)))
    out, seen = [], 0
    for t in ids:
        seen += t != pad
        out.append(pad + seen if t != pad else pad)
    return out


def _type_ids(reader, given: dict, n: int) -> list[int]:
    """``from``'s ``token_types``: one type id per token (0 for every token when not given)."""
    if "token_types" not in given:
        return [0] * n
    v = given["token_types"][1]
    if not isinstance(v, yaml.SequenceNode) or len(v.value) != n:
        raise reader.at(v).error(f"token_types is a list of {n} type ids, one per token (such as "
                                 f"[{', '.join(['0'] * min(n, 3))}{', ...' if n > 3 else ''}]), not "
                                 f"{_yaml.kind(v) if not isinstance(v, yaml.SequenceNode) else f'{len(v.value)} ids'}",
                                 "from.token_types")
    out = []
    for i, item in enumerate(v.value):
        try:
            t = whole_number(item.value) if isinstance(item, yaml.ScalarNode) and not item.style else None
        except LongNumber as exc:
            raise reader.at(item).error(str(exc), item_field("from.token_types", i)) from None
        if t is None:
            raise reader.at(item).error(f"a token type is a whole number ≥ 0 (a row of the token-type table, from 0), "
                                        f"not {_yaml.kind(item)}", item_field("from.token_types", i))
        out.append(t)
    return out


def _rows(at, node, ckpt, tensor: str, wanted: list[int], what: str, ids_node=None):
    """The exact rows ``wanted`` (0-based, in order, repeats allowed) of ``tensor``."""
    if tensor not in ckpt.shapes:
        raise at(node).error(ckpt.missing(tensor, f"the model's {what}"), "from.embeddings")
    shape = ckpt.shapes[tensor]
    if len(shape) != 2:
        raise at(node).error(f"{tensor} has shape {shape}, not a table of rows", "from.embeddings")
    for i, r in enumerate(wanted):
        if r >= shape[0]:
            where_ = at(ids_node.value[i]) if ids_node is not None else at(node)
            raise where_.error(f"{quote_path(ckpt.rel)}'s {tensor} has {shape[0]:,} {'row' if shape[0] == 1 else 'rows'} "
                               f"({what} 0 to {shape[0] - 1:,}), so it has no {what[:-1]} {r:,} (token {i + 1})",
                               item_field("from.token_types", i) if ids_node is not None else "from.embeddings")
    unique = sorted(set(wanted))
    place = {r: k for k, r in enumerate(unique)}
    array = ckpt.array(tensor, rows=unique)
    return ckpt.exact(np.ascontiguousarray(array[[place[r] for r in wanted]]))


def _positions(at, node, ckpt, tensor: str, wanted: list[int]) -> Positions:
    return Positions("learned", _rows(at, node, ckpt, tensor, wanted, "positions"))
