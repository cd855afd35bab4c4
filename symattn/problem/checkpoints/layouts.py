"""One attention layer of a known checkpoint layout, cut into heads: the ``from:`` field.

``from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [3]}`` fills each listed head's
W_Q, W_K, W_V and its biases b_Q, b_K, b_V (and, with several heads, W_O, the rows of the output
projection that read those heads, and b_O) from the tensors a model of that layout names:

- ``gpt2``: ``h.{layer}.attn.c_attn`` (Conv1D, in × out, Q|K|V side by side, each n_head blocks
  of d_head columns) and ``h.{layer}.attn.c_proj``, with or without ``transformer.``;
- ``llama``: ``model.layers.{layer}.self_attn.{q,k,v,o}_proj`` (nn.Linear, out × in, so each
  slice is transposed), K/V heads shared in groups when there are fewer of them, biases when
  the file has them (Qwen), and rotary positions (Hugging Face's ``rotate_half`` pairing);
- ``bert``: ``bert.encoder.layer.{layer}.attention.self.{query,key,value}`` and
  ``attention.output.dense`` (nn.Linear), with ``bert.``, ``roberta.`` or no prefix.

``layer`` is the number in the tensor names (``h.0`` is layer 0); heads are counted from 1, as
everywhere in a problem file (head 1 is the first d_head columns of Q). Only the slices needed
are read (:mod:`symattn.problem.checkpoints.safetensors`), each float its exact dyadic rational.

The ``config.json`` beside the checkpoint is read as Hugging Face transformers writes it, old
spellings and new (:class:`_Config`): what it changes in the layer's attention is applied (the
RoPE base, head_dim, a sliding window, GPT-2's scale, BERT's is_decoder) or refused by name.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field

import sympy
import yaml

from ..checkpoints import safetensors as _safetensors
from .. import located_yaml as _yaml
from ...reading import FileError, read_regular
from ...numbers.parse import NumberError, check_size, is_positive, parse_number
from ..rope import DEFAULT_BASE, Rope
from ...text import excerpt, quote_path

LAYOUTS = ("gpt2", "llama", "bert")
KEYS = ("file", "layout", "layer", "heads", "n_head", "n_kv_head", "rope_theta")
ALIASES = {"num_attention_heads": "n_head", "num_key_value_heads": "n_kv_head"}  # config.json's names
USAGE = "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1, 2]}"
CONFLICTS = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "heads", "W_O", "b_O", "kv_heads", "kv", "context")
MAX_CONFIG = 1_000_000  # bytes of config.json


@dataclass
class Loaded:
    """What ``from:`` fills in: each head's (W_Q, W_K, W_V, b_Q, b_K, b_V) (a bias None when the
    file has none), ``matrices`` (W_O and b_O with several heads), the K/V groups, the rotary
    embedding, and the layout's mask and score scale (as the config sets them) when the problem
    gives none."""

    heads: list[tuple]
    matrices: dict = field(default_factory=dict)
    kv_heads: int | None = None
    rope: Rope | None = None
    mask: str = "none"
    multi: bool = False
    window: int | None = None  # the config's sliding window, when the layer applies it (mask sliding-window)
    scale: object = None  # the config's score scale when it is not 1/√d_head (GPT-2's, exact); None: auto


@dataclass(frozen=True)
class _Layout:
    prefixes: tuple[str, ...]  # tried in turn before each name
    layers: str  # a regular expression whose group is the layer number
    q: str  # the tensors, {layer} filled in; llama and bert have one per projection
    k: str
    v: str
    o: str
    fused: bool  # gpt2: Q|K|V side by side in the q tensor (Conv1D, in × out)
    mask: str
    rope: bool


_LAYOUT = {
    "gpt2": _Layout(("", "transformer."), r"(?:^|\.)h\.(\d+)\.attn\.", "h.{layer}.attn.c_attn", "", "",
                    "h.{layer}.attn.c_proj", True, "causal", False),
    "llama": _Layout(("model.", ""), r"(?:^|\.)layers\.(\d+)\.self_attn\.", "layers.{layer}.self_attn.q_proj",
                     "layers.{layer}.self_attn.k_proj", "layers.{layer}.self_attn.v_proj",
                     "layers.{layer}.self_attn.o_proj", False, "causal", True),
    "bert": _Layout(("bert.", "roberta.", ""), r"(?:^|\.)layer\.(\d+)\.attention\.",
                    "encoder.layer.{layer}.attention.self.query", "encoder.layer.{layer}.attention.self.key",
                    "encoder.layer.{layer}.attention.self.value", "encoder.layer.{layer}.attention.output.dense",
                    False, "none", False),
}


class _File:
    """The checkpoint, open for reading: its tensors' shapes (from the header, read and checked
    once) and slices read on demand through the one open file, each counted against the
    problem's size limit. ``close`` it when the layer is read."""

    def __init__(self, reader, path, rel: str, where_) -> None:
        self.reader, self.path, self.rel, self.where = reader, path, rel, where_
        try:
            self.checkpoint = _safetensors.Checkpoint(path)
        except _safetensors.CheckpointError as exc:
            text = str(exc)
            raise where_.error(f"cannot read {quote_path(rel)}: {text[len('cannot be read: '):]}"
                               if text.startswith("cannot be read: ") else f"{quote_path(rel)} {text}", "from.file") from None
        self.shapes: dict[str, list[int]] = {k: list(e.shape) for k, e in self.checkpoint.tensors.items()}

    def close(self) -> None:
        self.checkpoint.close()

    def missing(self, name: str, what: str) -> str:
        """A tensor the layout needs is not in the file: the message, with the closest names."""
        names = self.shapes.keys()
        close = _safetensors.close_names(name, names, 0.5)
        hint = ("; close: " + ", ".join(_safetensors.quote(c) for c in close)) if close else \
            (f"; it holds {_safetensors.holding(len(names))}" + (", e.g. " + _safetensors.some_names(names)
                                                                   if names else ""))
        return f"{quote_path(self.rel)} has no tensor {_safetensors.quote(name)} ({what}){hint}"

    def array(self, tensor: str, rows=None, cols=None, vector: bool = False):
        """The NumPy array of the rows and columns (ranges or lists of indices; None for all) of
        ``tensor`` (a 1-dimensional one as a row)."""
        reader = self.reader
        try:
            array = self.checkpoint.read(tensor, lambda n: range(n) if rows is None else rows,
                                         lambda n: range(n) if cols is None else cols,
                                         reader.max_size - reader.size, vector=vector)
        except _safetensors.CheckpointError as exc:
            text = str(exc)
            raise self.where.error(text if text.startswith(("the slice", "tensor ")) else f"{quote_path(self.rel)} {text}",
                                   "from") from None
        return array

    def exact(self, array):
        """The exact matrix of an array read from the file, counted against the size limit."""
        m = self.reader.slice_matrix(array, self.rel, self.where, "from")
        self.reader.count(m.rows * m.cols, self.where, "from")
        return m

    def pieces(self, tensor: str, starts: list[int], width: int, along: str, transpose: bool = False,
               vector: bool = False) -> list:
        """The exact matrices of ``tensor``'s rows (``along="rows"``) or columns start:start + width
        for each of ``starts``, read in one piece (the heads of a projection)."""
        wanted = _spans(starts, width)
        array = self.array(tensor, rows=wanted if along == "rows" else None, cols=wanted if along == "cols" else None,
                           vector=vector)
        out = []
        for k in range(len(starts)):
            part = array[k * width:(k + 1) * width] if along == "rows" else array[:, k * width:(k + 1) * width]
            out.append(self.exact(part.T if transpose else part))
        return out


def _spans(starts: list[int], width: int):
    """The indices start:start + width of each of ``starts``, in order: a range when they follow
    one another (a run of whole heads, read at once)."""
    if all(b - a == width for a, b in zip(starts, starts[1:])):
        return range(starts[0], starts[-1] + width)
    return [s + j for s in starts for j in range(width)]


def read_from(reader, key: yaml.Node, node: yaml.Node, fields: dict, X) -> Loaded:
    """The heads (and W_O, b_O, K/V groups, RoPE, mask) the ``from:`` mapping ``node`` names;
    ``reader`` is problem.py's reader, ``fields`` the problem's fields, ``X`` its input."""
    at = reader.at
    for name in CONFLICTS:
        if name in fields:
            why = ("the layer's keys and values come from X (self-attention)" if name == "context" else
                   "from: fills each head's weights from the checkpoint")
            raise at(fields[name][0]).error(f"{why}: remove {name} or from", name)
    if not isinstance(node, yaml.MappingNode):
        raise at(node).error(f"from is a mapping such as {USAGE}, not {_yaml.kind(node)}", "from")
    given: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) and not _yaml.is_null(k) else None
        canonical = ALIASES.get(name, name)
        if canonical not in KEYS:
            close = difflib.get_close_matches(str(name), KEYS + tuple(ALIASES), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise at(k).error(f"unknown key {_yaml.kind(k) if name is None else repr(name)} in from{hint}; "
                              f"from takes {', '.join(KEYS)}", "from")
        if canonical in given:
            raise at(k).error(f"{canonical} is given twice in from" + (f" ({name} is {canonical})" if name != canonical
                                                                        else ""), "from." + canonical)
        given[canonical] = (k, v)
    for name in ("file", "layout", "layer", "heads"):
        if name not in given:
            raise at(node).error(f"from needs {name}: {USAGE}", "from." + name)
    layout_node = given["layout"][1]
    word = layout_node.value if isinstance(layout_node, yaml.ScalarNode) and not _yaml.is_null(layout_node) else None
    if word not in LAYOUTS:
        close = difflib.get_close_matches(str(word).lower(), LAYOUTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        what = excerpt(word) if word is not None else _yaml.kind(layout_node)
        raise at(layout_node).error(f"unknown layout {what}{hint}; the layouts are {', '.join(LAYOUTS)}",
                                    "from.layout")
    layout = _LAYOUT[word]
    path, rel, where_ = reader.resolve_file(given["file"][1], "from.file")
    refusal = _safetensors.pickle_refusal(rel)
    if refusal:
        raise where_.error(refusal, "from.file")
    if path.suffix.lower() != ".safetensors":
        raise where_.error(f"{quote_path(rel)}: from: reads a .safetensors checkpoint", "from.file")
    ckpt = _File(reader, path, rel, where_)
    try:
        return _layer(reader, key, node, fields, X, given, word, layout, layout_node, path, rel, where_, ckpt)
    finally:
        ckpt.close()


def _layer(reader, key, node, fields, X, given, word, layout, layout_node, path, rel, where_, ckpt) -> Loaded:
    """The rest of :func:`read_from`, with the checkpoint ``ckpt`` open: its heads read."""
    at = reader.at
    layer_node = given["layer"][1]
    layer = _whole(reader, layer_node, "from.layer", "layer is the number in the tensor names (h.0 is layer 0)",
                   least=0)
    found = sorted({int(m.group(1)) for n in ckpt.shapes for m in [re.search(layout.layers, n)] if m
                    and len(m.group(1)) <= 9})  # a longer number is no layer (layer has at most 9 digits)
    names = _names(layout, layer, ckpt)
    if names is None:
        if found and layer not in found:
            raise at(layer_node).error(f"layer {layer} is out of range: {quote_path(rel)} holds layers {found[0]} to {found[-1]} "
                                       "(the number in the tensor names)", "from.layer")
        first = layout.prefixes[0] + layout.q.format(layer=layer) + ".weight"
        raise at(layout_node).error(ckpt.missing(first, f"{word} layer {layer}'s query weights"), "from.layout")
    config = _config(reader, key, path, rel, where_)
    config.model_type(word)
    n_head = _count(reader, given, config, "n_head", ("n_head", "num_attention_heads"))
    if n_head is None:
        raise at(node).error(f"the number of heads is not in {quote_path(rel)}: give it in from (n_head: 12), or put the "
                             "model's config.json beside the checkpoint", "from.n_head")
    W = _shapes(at, node, layout, names, ckpt, n_head, word)
    d_model, d_head = W["d_model"], W["d_head"]
    n_kv = n_head
    if word == "llama":
        n_kv = _count(reader, given, config, "n_kv_head", ("num_key_value_heads",)) or n_head
        if n_head % n_kv:
            raise at(given.get("n_kv_head", (node, node))[1]).error(
                f"{n_head} heads cannot share keys and values in {n_kv} equal groups", "from.n_kv_head")
        for proj in ("k", "v"):
            rows = ckpt.shapes[names[proj] + ".weight"][0]
            if rows != n_kv * d_head:
                raise at(node).error(f"{names[proj]}.weight has {rows} rows, not n_kv_head × d_head = {n_kv} × "
                                     f"{d_head}: check n_kv_head (num_key_value_heads)", "from.n_kv_head")
    elif "n_kv_head" in given:
        raise at(given["n_kv_head"][0]).error(f"n_kv_head is for the llama layout; {word} heads each have their own "
                                              "keys and values", "from.n_kv_head")
    if X.cols != d_model:
        raise at(key).error(f"X is {X.rows}×{X.cols} but layer {layer} of {quote_path(rel)} takes rows of d_model = {d_model} "
                            f"{'entry' if d_model == 1 else 'entries'}", "X")
    picked = _heads(reader, given["heads"][1], n_head, d_head)
    group = n_head // n_kv
    # the budget first, before the config's checks and before any slice is read
    _charge(reader, given["heads"][1], layout, names, ckpt, picked, group, n_kv, d_model, d_head, layer, X)
    window = scale = None  # what the config changes in the layer's attention, read before any slice
    mask = layout.mask
    if word == "llama":
        _qk_norm(at, node, names, ckpt)
        window = _llama_config(config, layer, X.rows, n_head, d_head, names, ckpt, "mask" in fields)
    elif word == "gpt2":
        scale = _gpt2_scale(config, layer, d_head, "scale" in fields)
    elif _bert_config(config):
        mask = "causal"  # is_decoder: a BERT decoder's self-attention is causal
    rope = _rope(config, reader, key, given, fields, d_head) if layout.rope else None
    kv = list(dict.fromkeys(h // group for h in picked))  # the K/V heads the listed heads read, each once
    weights, biases = {}, {}
    if layout.fused:  # Q|K|V side by side: K's columns start at d_model, V's at 2·d_model; one read of each tensor
        starts = [off + h * d_head for off in (0, d_model, 2 * d_model) for h in picked]
        n = len(picked)
        for out, name, vector in ((weights, names["q"] + ".weight", False), (biases, names["q"] + ".bias", True)):
            if name in ckpt.shapes:
                got = ckpt.pieces(name, starts, d_head, "cols", vector=vector)
                out.update(q=got[:n], k=got[n:2 * n], v=got[2 * n:])
    else:
        for proj in "qkv":
            heads_read = picked if proj == "q" else kv
            starts = [h * d_head for h in heads_read]
            weights[proj] = ckpt.pieces(names[proj] + ".weight", starts, d_head, "rows", transpose=True)
            if names[proj] + ".bias" in ckpt.shapes:
                biases[proj] = ckpt.pieces(names[proj] + ".bias", starts, d_head, "cols", vector=True)
    where_kv = {g: i for i, g in enumerate(kv)}

    def part(proj: str, i: int, h: int) -> tuple:
        """The weights and bias of the i-th listed head, head h (0-based), in projection ``proj``."""
        k = i if proj == "q" or layout.fused else where_kv[h // group]
        return weights[proj][k], biases[proj][k] if proj in biases else None

    heads = []
    for i, h in enumerate(picked):
        W_Q, b_Q = part("q", i, h)
        W_K, b_K = part("k", i, h)
        W_V, b_V = part("v", i, h)
        heads.append((W_Q, W_K, W_V, b_Q, b_K, b_V))
    loaded = Loaded(heads, mask="sliding-window" if window else mask, multi=len(picked) > 1, window=window,
                    scale=scale)
    if loaded.multi:
        # the rows of the output projection that read each listed head, in order, in one read
        wanted = _spans([h * d_head for h in picked], d_head)
        loaded.matrices["W_O"] = ckpt.exact(ckpt.array(names["o"] + ".weight", rows=wanted) if layout.fused else
                                            ckpt.array(names["o"] + ".weight", cols=wanted).T)
        if names["o"] + ".bias" in ckpt.shapes:
            loaded.matrices["b_O"] = ckpt.exact(ckpt.array(names["o"] + ".bias", vector=True))
        if group > 1:
            loaded.kv_heads = _groups(at, given["heads"][1], [h + 1 for h in picked], group)
    loaded.rope = rope
    return loaded


def _names(layout: _Layout, layer: int, ckpt: _File) -> dict[str, str] | None:
    """The layer's tensor names (without .weight/.bias) under the first prefix the file uses;
    None when its query weights are under none."""
    for prefix in layout.prefixes:
        names = {p: prefix + getattr(layout, p).format(layer=layer) for p in "qkvo" if getattr(layout, p)}
        if names["q"] + ".weight" in ckpt.shapes:
            return names
    return None


def _shapes(at, node, layout: _Layout, names: dict, ckpt: _File, n_head: int, word: str) -> dict:
    """d_model and d_head from the query weights' shape, every tensor the layout needs checked
    to be there with a shape that fits."""
    needed = [names[p] + ".weight" for p in "qkvo" if p in names]
    for name in needed:
        if name not in ckpt.shapes:
            raise at(node).error(ckpt.missing(name, f"{word} needs it"), "from.layout")
        if len(ckpt.shapes[name]) != 2:
            raise at(node).error(f"{name} has shape {ckpt.shapes[name]}; {word} stores it as a matrix", "from.layout")
    q_rows, q_cols = ckpt.shapes[names["q"] + ".weight"]
    if layout.fused:
        d_model, width = q_rows, q_cols
        if width != 3 * d_model:
            raise at(node).error(f"{names['q']}.weight is {q_rows}×{q_cols}; gpt2's Conv1D c_attn is "
                                 f"d_model × 3·d_model (Q|K|V side by side)", "from.layout")
        heads_width = d_model
    else:
        d_model, heads_width = q_cols, q_rows  # nn.Linear: out × in
    if heads_width == 0 or heads_width % n_head:
        raise at(node).error(f"the queries are {heads_width} wide, which {n_head} heads cannot share equally: "
                             "check n_head (num_attention_heads)", "from.n_head")
    d_head = heads_width // n_head
    o_rows, o_cols = ckpt.shapes[names["o"] + ".weight"]
    if (o_rows, o_cols) != ((heads_width, d_model) if layout.fused else (d_model, heads_width)):
        raise at(node).error(f"{names['o']}.weight is {o_rows}×{o_cols}, which does not fit queries {heads_width} wide "
                             f"and d_model = {d_model}", "from.layout")
    if not layout.fused:  # nn.Linear K and V: out × d_model; bert's as wide as the queries (llama's: n_kv_head)
        for p in "kv":
            rows, cols = ckpt.shapes[names[p] + ".weight"]
            if cols != d_model or (word != "llama" and rows != heads_width):
                want = f"{heads_width}×{d_model}" if word != "llama" else f"(n_kv_head × d_head)×{d_model}"
                raise at(node).error(f"{names[p]}.weight is {rows}×{cols}, not {want} as queries {heads_width} wide "
                                     f"and d_model = {d_model} need", "from.layout")
    # every bias is a vector as long as its projection's output: Q|K|V for gpt2's c_attn, d_model for the output
    widths = {names["q"] + ".bias": q_cols} if layout.fused else \
        {names[p] + ".bias": ckpt.shapes[names[p] + ".weight"][0] for p in "qkv"}
    widths[names["o"] + ".bias"] = d_model
    for bias, width in widths.items():
        if bias in ckpt.shapes and ckpt.shapes[bias] != [width]:
            raise at(node).error(f"{bias} has shape {ckpt.shapes[bias]}, not [{width}]", "from.layout")
    return {"d_model": d_model, "d_head": d_head}


def _charge(reader, node, layout: _Layout, names: dict, ckpt: _File, picked, group: int, n_kv: int, d_model: int,
            d_head: int, layer: int, X) -> None:
    """Refuse the listed heads before any is read when their weights are more numbers than the size
    limit leaves, or their scores more than any output's size budget allows."""
    from ..budget import layer_refusal

    n = len(picked)
    room = reader.max_size - reader.size
    if n > room:  # each head reads at least its d_model × d_head ≥ 1 query weights
        kv = n
    else:
        kv = n_kv if isinstance(picked, range) else len({h // group for h in picked})
    bias = {p: (names["q"] if layout.fused else names[p]) + ".bias" in ckpt.shapes for p in "qkv"}
    w = d_model * d_head
    numbers = n * (w + d_head * bias["q"]) + kv * (2 * w + d_head * (bias["k"] + bias["v"]))
    if n > 1:  # W_O's rows for the heads, and b_O
        numbers += n * w + d_model * (names["o"] + ".bias" in ckpt.shapes)
    if numbers > room:
        raise reader.at(node).error(
            f"the {n:,} heads of layer {layer} hold {numbers:,} numbers (d_model = {d_model:,}, d_head = {d_head:,}), "
            f"more than the {room:,} the size limit of {reader.max_size:,} leaves for them; list fewer heads, or if "
            "it is meant to be this large, raise the limit with --max-size", "from.heads")
    why = layer_refusal(X.rows, X.rows, n, reader.max_size)
    if why:
        raise reader.at(node).error(why, "from.heads")


def _heads(reader, node: yaml.Node, n_head: int, d_head: int) -> "list[int] | range":
    """The 0-based heads of ``heads: [1, 3]`` (counted from 1) or ``heads: all``."""
    at = reader.at
    if isinstance(node, yaml.ScalarNode) and node.value == "all" and not node.style:
        return range(n_head)  # not a list: a header may claim 10^8 heads, refused before any is read
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise at(node).error(f"heads is a list of head numbers counted from 1, such as [1, 3], or all; not "
                             f"{_yaml.kind(node)}", "from.heads")
    picked: list[int] = []
    seen: set[int] = set()
    for i, item in enumerate(node.value):
        name = f"from.heads item {i + 1}"
        if isinstance(item, yaml.ScalarNode) and not item.style and item.value == "0":
            raise at(item).error(f"heads are counted from 1: head 1 is the first (columns 0:{d_head} of Q), head "
                                 f"{n_head} the last", name)
        h = _whole(reader, item, name, "a head number counted from 1", least=1)
        if h > n_head:
            raise at(item).error(f"head {h} is out of range: the layer has {n_head} heads, numbered 1 to {n_head}",
                                 name)
        if h in seen:
            raise at(item).error(f"head {h} is given twice", name)
        seen.add(h)
        picked.append(h - 1)
    return picked


def _groups(at, node, heads: list[int], group: int) -> int | None:
    """The K/V groups the listed heads (1-based) read, as symattn's kv_heads: each group read by
    the same number of consecutive listed heads; None when no two listed heads share one."""
    groups = [(h - 1) // group + 1 for h in heads]
    runs: list[list[int]] = []  # [group, how many listed heads in a row read it]
    for g in groups:
        if runs and runs[-1][0] == g:
            runs[-1][1] += 1
        else:
            runs.append([g, 1])
    distinct = len(set(groups))
    if distinct == len(heads):
        return None
    if len(runs) != distinct or len({n for _, n in runs}) != 1:
        read = ", ".join(f"head {h} reads group {g}" for h, g in zip(heads, groups))
        raise at(node).error(f"the layer's heads share keys and values in groups of {group} ({read}); symattn's "
                             "kv_heads needs every group read by the same number of the listed heads, one after "
                             f"another: list whole groups, such as [1, {group}]", "from.heads")
    return distinct


def _rope(config: "_Config", reader, key, given: dict, fields: dict, d_head: int) -> Rope | None:
    """LLaMA's rotary embedding: rotate_half (pairing half), θ_i = rope_theta^(−2i/d_head), the base
    from ``from`` (which wins), else the config's, else 10000; the config's other RoPE settings refused."""
    at = reader.at
    if "rope" in fields:
        return None  # the problem's own rope: replaces the layout's (problem.py reads it)
    if "backward" in fields:
        raise at(fields["backward"][0]).error("the backward pass through RoPE (which the llama layout applies) is not "
                                              "derived; remove backward", "backward")
    if d_head % 2:
        raise at(key).error(f"RoPE rotates pairs of components, but d_head is {d_head}", "from")
    base = config.rope_base()
    if "rope_theta" in given:
        v = given["rope_theta"][1]
        base = reader.number(v, "from.rope_theta", use_symbols=False)
        if not is_positive(base):
            raise at(v).error(f"rope_theta must be positive, not {v.value}", "from.rope_theta")
    return Rope("half", base=sympy.Integer(DEFAULT_BASE) if base is None else base)


# -- config.json --------------------------------------------------------------------------------------

# The model types whose attention each layout follows, as transformers computes it: a config.json
# of another type (Gemma 2's soft-capping, Qwen 3's normalised queries, Cohere's interleaved RoPE)
# is refused rather than read as if it were one of these.
MODEL_TYPES = {
    "gpt2": ("gpt2",),
    "llama": ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "starcoder2", "gemma"),
    "bert": ("bert", "roberta", "xlm-roberta"),
}
_EVERY_LAYER_WINDOW = ("mistral", "mixtral", "starcoder2")  # sliding_window applies to every layer
_LAYER_TYPES_WINDOW = ("qwen2", "qwen2_moe")  # only with use_sliding_window, to the layers layer_types names
_ROPE_DICTS = ("rope_parameters", "rope_scaling")  # transformers 5's name and the older one
_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
_CONSTANTS = ("NaN", "Infinity", "-Infinity")  # what Python's json reads beside JSON's numbers
_COUNT = re.compile(r"[0-9]{1,9}")


class _Number:
    """A number in config.json as its JSON text, converted only where it is read and then exactly
    (100.0 is 100, 1e6 is 10^6; never a binary float), its length bounded first."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _exact(v) -> sympy.Expr:
    """The exact value of a number read from config.json (NumberError when it is none)."""
    if not isinstance(v, _Number) or v.text in _CONSTANTS:
        raise NumberError("not a finite number")
    return check_size(v.text, parse_number(v.text))


def _count_of(v) -> int | None:
    """A whole number of at most nine digits from config.json; None when ``v`` is none."""
    return int(v.text) if isinstance(v, _Number) and _COUNT.fullmatch(v.text) else None


def _shown(v) -> str:
    """A config value as a message shows it: a long one cut to a short excerpt."""
    if isinstance(v, _Number):
        return v.text if len(v.text) <= 40 else f"{v.text[:30]}… ({len(v.text):,} characters)"
    if isinstance(v, str):
        return repr(v if len(v) <= 40 else v[:30] + "…")
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    return "a list" if isinstance(v, list) else "an object"


def _same(a, b) -> bool:
    """Whether two spellings of one setting give the same value (numbers compared exactly)."""
    if isinstance(a, _Number) and isinstance(b, _Number):
        if a.text == b.text:
            return True
        try:
            return bool(_exact(a) == _exact(b))
        except NumberError:
            return False
    return type(a) is type(b) and not isinstance(a, (_Number, list, dict)) and a == b


class _Config:
    """The ``config.json`` beside the checkpoint (empty when there is none): each setting read under
    every spelling transformers writes, and every setting that changes the layer's attention in a way
    symattn does not apply refused in one line naming it."""

    def __init__(self, data: dict, rel: str, where_) -> None:
        self.data, self.rel, self.where = data, rel, where_

    def refuse(self, text: str):
        raise self.where.error(f"the config.json beside {quote_path(self.rel)} {text}", "from")

    def value(self, spelling: str):
        """The value at a dotted ``spelling`` (rope_parameters.rope_theta); None when absent or null."""
        v = self.data
        for part in spelling.split("."):
            v = v.get(part) if isinstance(v, dict) else None
        return v

    def get(self, *spellings: str) -> tuple[str | None, object]:
        """The first spelling present and its value, refused when two spellings disagree."""
        found = [(s, v) for s in spellings for v in [self.value(s)] if v is not None]
        for name, v in found[1:]:
            if not _same(found[0][1], v):
                self.refuse(f"gives {found[0][0]} {_shown(found[0][1])} and {name} {_shown(v)}, which disagree: "
                            "keep one")
        return found[0] if found else (None, None)

    def flag(self, name: str, default: bool) -> bool:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.refuse(f"has {name} {_shown(v)}, not true or false")
        return v

    def model_type(self, word: str) -> None:
        v = self.data.get("model_type")
        if v is not None and not isinstance(v, str):
            self.refuse(f"has model_type {_shown(v)}, not a name such as {MODEL_TYPES[word][0]!r}")
        if v is not None and v not in MODEL_TYPES[word]:
            self.refuse(f"is for a {_shown(v)} model (model_type), whose attention symattn's {word} layout does not "
                        f"follow: it follows {', '.join(MODEL_TYPES[word])} models")

    def rope_base(self) -> sympy.Expr | None:
        """The config's rope_theta, exactly (None when it has none), after refusing the RoPE settings
        symattn does not apply: any rope_type but default, partial_rotary_factor but 1, other keys."""
        for name in _ROPE_DICTS:
            v = self.data.get(name)
            if v is not None and not isinstance(v, dict):
                self.refuse(f'has {name} {_shown(v)}, not an object such as {{"rope_type": "default", '
                            '"rope_theta": 10000.0}')
        name, kind = self.get("rope_parameters.rope_type", "rope_parameters.type", "rope_scaling.rope_type",
                              "rope_scaling.type")
        if kind is not None and kind != "default":
            self.refuse(f"sets {name} {_shown(kind)}, which symattn does not apply (it applies plain RoPE, rope_type "
                        "default): give rope: {base: ...} in the problem to use plain RoPE angles")
        for name in _ROPE_DICTS:
            for k in self.data.get(name) or {}:
                if k not in _ROPE_KEYS:
                    shown = k if len(k) <= 40 and k.isprintable() else _shown(k)
                    self.refuse(f"sets {name}.{shown}, which symattn does not apply (it reads rope_type, rope_theta "
                                "and partial_rotary_factor there)")
        name, part = self.get("partial_rotary_factor", "rope_parameters.partial_rotary_factor",
                              "rope_scaling.partial_rotary_factor")
        if part is not None and not _same(part, _Number("1")):
            self.refuse(f"sets {name} {_shown(part)} (RoPE on part of each head), which symattn does not apply")
        name, theta = self.get("rope_theta", "rope_parameters.rope_theta", "rope_scaling.rope_theta")
        if theta is None:
            return None
        try:
            base = _exact(theta)
        except NumberError:
            base = None
        if base is None or not is_positive(base):
            self.refuse(f"has {name} {_shown(theta)}, not a positive number")
        return base


def _config(reader, key, path, rel: str, where_) -> _Config:
    """The ``config.json`` beside the checkpoint, its numbers kept as their text."""
    cfg = path.parent / "config.json"
    at = reader.at(key)
    if not os.path.lexists(cfg):
        return _Config({}, rel, at)
    try:
        inside = reader.base_dir in cfg.resolve().parents
    except (RuntimeError, OSError):
        inside = False
    if not inside:
        raise where_.error(f"the config.json beside {quote_path(rel)} leads out of the problem's folder (a link?)", "from")
    try:
        data = json.loads(read_regular(cfg, MAX_CONFIG, "config.json is {size} bytes; a model's config is smaller",
                                       noun="config file").decode("utf-8"),
                          parse_int=_Number, parse_float=_Number, parse_constant=_Number)
    except FileError as exc:
        raise where_.error(f"the config.json beside {quote_path(rel)}: {exc}", "from") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise where_.error(f"the config.json beside {quote_path(rel)} is not valid JSON", "from") from None
    if not isinstance(data, dict):
        raise where_.error(f"the config.json beside {quote_path(rel)} is not a JSON object", "from")
    return _Config(data, rel, at)


def _count(reader, given: dict, config: _Config, name: str, config_keys: tuple[str, ...]) -> int | None:
    """A whole number of heads from ``from`` (which wins) or the config; None when neither has it."""
    if name in given:
        return _whole(reader, given[name][1], "from." + name, f"{name} is a number of heads", least=1)
    k, v = config.get(*config_keys)
    if v is None:
        return None
    count = _count_of(v)
    if count is None or count < 1:
        raise reader.at(given["file"][1]).error(f"the config.json beside the checkpoint has {k} {_shown(v)}, not a "
                                                "whole number from 1 to 999,999,999", "from." + name)
    return count


def _qk_norm(at, node, names: dict, ckpt: _File) -> None:
    """A llama-named layer that normalises its queries or keys (Qwen 3, OLMo 2) is refused."""
    for p, what in (("q", "queries"), ("k", "keys")):
        name = names[p][:-len("_proj")] + "_norm.weight"
        if name in ckpt.shapes:
            raise at(node).error(f"{quote_path(ckpt.rel)} has {name}: the layer normalises each head's {what} (QK-norm), "
                                 "which symattn does not apply", "from.layout")


def _llama_config(config: _Config, layer: int, n: int, n_head: int, d_head: int, names: dict, ckpt: _File,
                  masked: bool) -> int | None:
    """The sliding window a llama layer of ``n`` tokens applies (None: none, or one that hides no
    key), after refusing what the config changes in the layer that symattn does not apply."""
    name, head_dim = config.get("head_dim")
    if head_dim is not None and _count_of(head_dim) != d_head:
        rows = ckpt.shapes[names["q"] + ".weight"][0]
        config.refuse(f"has head_dim {_shown(head_dim)}, but the {rows} rows of {names['q']}.weight make {n_head} "
                      f"heads {d_head} wide: check head_dim and n_head (num_attention_heads)")
    for k, what in (("attn_logit_softcapping", "soft-capped scores"),
                    ("attention_multiplier", "scores scaled by it, not by 1/√d_head")):
        name, v = config.get(k)
        if v is not None:
            config.refuse(f"sets {name} {_shown(v)} ({what}), which symattn does not apply")
    name, v = config.get("query_pre_attn_scalar")
    if v is not None and _count_of(v) != d_head:
        config.refuse(f"sets {name} {_shown(v)} (scores scaled by its inverse square root, not by 1/√d_head = "
                      f"1/√{d_head}), which symattn does not apply")
    kinds = config.data.get("layer_types")
    kind = None
    if kinds is not None:
        if not isinstance(kinds, list):
            config.refuse(f"has layer_types {_shown(kinds)}, not a list")
        if layer >= len(kinds):
            config.refuse(f"has layer_types with {len(kinds)} {'entry' if len(kinds) == 1 else 'entries'}, none for "
                          f"layer {layer}")
        kind = kinds[layer]
        if kind not in ("full_attention", "sliding_attention"):
            config.refuse(f"gives layer {layer} the attention type {_shown(kind)} (layer_types), which symattn does "
                          "not apply")
    if masked:
        return None  # the problem's mask replaces the layout's
    width = config.value("sliding_window")
    model = config.data.get("model_type")
    if width is None or (model in _LAYER_TYPES_WINDOW and not config.flag("use_sliding_window", False)):
        return None  # transformers drops the window (sliding_window null, or Qwen 2 without use_sliding_window)
    w = _count_of(width)
    if not w:
        config.refuse(f"has sliding_window {_shown(width)}, not a whole number ≥ 1 or null")
    if w >= n:
        return None  # query i reads keys i − w + 1 … i: with n ≤ w tokens that is every earlier key (causal)
    if model in _EVERY_LAYER_WINDOW:
        return w
    if model in _LAYER_TYPES_WINDOW and kind is not None:
        return w if kind == "sliding_attention" else None
    why = ("it has no layer_types" if model in _LAYER_TYPES_WINDOW else
           f"model_type {_shown(model)} does not say" if model is not None else "it has no model_type")
    config.refuse(f"sets sliding_window {w}, which hides keys from X's {n} tokens, and symattn cannot tell whether "
                  f"layer {layer} applies it ({why}): give mask: {{sliding-window: {w}}} or mask: causal in the "
                  "problem")


def _gpt2_scale(config: _Config, layer: int, d_head: int, given: bool):
    """GPT-2's score scale when the config changes it (scale_attn_weights: false drops 1/√d_head,
    scale_attn_by_inverse_layer_idx divides by layer + 1), exactly; None for the usual 1/√d_head or
    when the problem gives its own scale."""
    weights = config.flag("scale_attn_weights", True)
    inverse = config.flag("scale_attn_by_inverse_layer_idx", False)
    if given or (weights and not inverse):
        return None
    scale = (1 / sympy.sqrt(sympy.Integer(d_head)) if weights else sympy.Integer(1)) / (layer + 1 if inverse else 1)
    return "none" if scale == 1 else scale


def _bert_config(config: _Config) -> bool:
    """Whether the BERT layer is a decoder's (is_decoder: causal), after refusing relative positions."""
    name, kind = config.get("position_embedding_type")
    if kind is not None and kind != "absolute":
        config.refuse(f"sets {name} {_shown(kind)} (relative positions in the scores), which symattn does not apply")
    return config.flag("is_decoder", False)


def _whole(reader, node: yaml.Node, field: str, what: str, least: int) -> int:
    if isinstance(node, yaml.ScalarNode) and not node.style and re.fullmatch(r"[0-9]{1,9}", node.value) \
            and int(node.value) >= least:
        return int(node.value)
    raise reader.at(node).error(f"{what}: a whole number ≥ {least}, not {_yaml.kind(node)}", field)
