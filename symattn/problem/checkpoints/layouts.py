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
spellings and new (:class:`Config`): what it changes in the layer's attention is applied (the
RoPE base, head_dim, a sliding window, GPT-2's scale, BERT's is_decoder) or refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sympy
import yaml

from ..checkpoints import safetensors as _safetensors
from .. import located_yaml as _yaml
from ...numbers.parse import is_positive
from ..model import Norm
from ..rope import DEFAULT_BASE, Rope
from ...text import excerpt, quote_path
from .config import Config, bert_config, count_of, gpt2_scale, llama_config, read_config, shown_value
from .qk_norm import read_qk_norm

LAYOUTS = ("gpt2", "llama", "bert")
KEYS = ("file", "layout", "layer", "heads", "n_head", "n_kv_head", "rope_theta", "norm", "residual", "embeddings",
        "token_types", "block")
ALIASES = {"num_attention_heads": "n_head", "num_key_value_heads": "n_kv_head"}  # config.json's names
USAGE = "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1, 2]}"
CONFLICTS = ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "heads", "W_O", "b_O", "kv_heads", "kv", "context")


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
    layout: str = ""  # gpt2, llama or bert
    partial: bool = False  # only some of the layer's heads are read
    norm: Norm | None = None  # the layer's norm, with norm: true
    residual: bool = False  # residual: true (H = X + the layer's output)
    embedded: tuple | None = None  # embeddings: true: (positions, token types, their ids, the embeddings' norm)
    mlp: object = None  # block: true: the layer's MLP and its norm (a problem.model.Mlp)
    head: tuple | None = None  # logits: {from: true}: (the final norm, W_U, logit lens?, tied?)
    qk_norm: object = None  # llama: the layer's q_norm and k_norm (a problem.model.QkNorm), when it has them


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
    ``reader`` is the problem's reader, ``fields`` the problem's fields, ``X`` its input."""
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
            import difflib  # only for the message: its import is not paid by every run

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
        import difflib

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
    config = read_config(reader, key, path, rel, where_)
    config.model_type(word)
    n_head = _count(reader, given, config, "n_head", ("n_head", "num_attention_heads"))
    if n_head is None:
        raise at(node).error(f"the number of heads is not in {quote_path(rel)}: give it in from (n_head: 12), or put the "
                             "model's config.json beside the checkpoint", "from.n_head")
    W = _shapes(at, node, layout, names, ckpt, n_head, word)
    d_model, d_head = W["d_model"], W["d_head"]
    n_kv = _kv_count(reader, node, given, config, word, names, ckpt, n_head, d_head)
    if X.cols != d_model:
        raise at(key).error(f"X is {X.rows}×{X.cols} but layer {layer} of {quote_path(rel)} takes rows of d_model = {d_model} "
                            f"{'entry' if d_model == 1 else 'entries'}", "X")
    picked = _heads(reader, given["heads"][1], n_head, d_head)
    group = n_head // n_kv
    # the budget first, before the config's checks and before any slice is read
    _charge(reader, given["heads"][1], layout, names, ckpt, picked, group, n_kv, d_model, d_head, layer, X)
    window = scale = None  # what the config changes in the layer's attention, read before any slice
    mask = layout.mask
    qk_norm = None
    if word == "llama":
        qk_norm = read_qk_norm(at, key, node, names, ckpt, config, d_head)  # Qwen 3's q_norm and k_norm, when present
        window = llama_config(config, layer, X.rows, n_head, d_head, names, ckpt, "mask" in fields)
    elif word == "gpt2":
        scale = gpt2_scale(config, layer, d_head, "scale" in fields)
    elif bert_config(config):
        mask = "causal"  # is_decoder: a BERT decoder's self-attention is causal
    rope = _rope(config, reader, key, given, fields, d_head) if layout.rope else None
    block = _flag(reader, given, "block")  # the whole layer: its norm, the residual and the MLP too
    norm_flag = _flag(reader, given, "norm") if "norm" in given else block
    residual = _flag(reader, given, "residual") if "residual" in given else block
    heads = _read_heads(layout, names, ckpt, picked, group, d_model, d_head)
    loaded = Loaded(heads, mask="sliding-window" if window else mask, multi=len(picked) > 1 or residual, window=window,
                    scale=scale, layout=word, partial=len(picked) < n_head, residual=residual)
    if loaded.multi:
        _read_output(loaded, at, given, layout, names, ckpt, picked, group, d_head)
    if _flag(reader, given, "embeddings"):
        from .embedded import read_embedded

        loaded.embedded = read_embedded(reader, given, word, _prefix(layout, names, layer), ckpt, config, layer, X,
                                        reader.token_ids.get("X"))
    elif "token_types" in given:
        raise at(given["token_types"][0]).error("token_types are read with the embeddings: give embeddings: true too",
                                                "from.token_types")
    if norm_flag:
        loaded.norm = _read_norm(at, given, word, layout, names, ckpt, config, layer, "block" if "norm" not in given
                                 else "norm")
    if block or "logits" in fields:
        _read_rest(reader, given, fields, word, _prefix(layout, names, layer), ckpt, config, layer, found, d_model,
                   loaded)
    loaded.rope, loaded.qk_norm = rope, qk_norm
    return loaded


def _read_rest(reader, given: dict, fields: dict, word: str, prefix: str, ckpt, config, layer: int, found: list,
               d_model: int, loaded: Loaded) -> None:
    """The MLP (``block: true``) and the model's head (the problem's ``logits: {from: true}``)."""
    from .block import read_block, read_head

    if _flag(reader, given, "block"):
        loaded.mlp = read_block(reader, given, word, prefix, ckpt, config, layer, d_model)
    node = fields.get("logits", (None, None))[1]
    flag = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == "from"), None) \
        if isinstance(node, yaml.MappingNode) else None
    if flag is not None and _yaml.is_bool(flag) and _yaml.bool_value(flag):
        loaded.head = read_head(reader, flag, word, prefix, ckpt, config, layer, found[-1] if found else None, d_model)


def _kv_count(reader, node, given: dict, config: Config, word: str, names: dict, ckpt: _File, n_head: int,
              d_head: int) -> int:
    """The layer's K/V heads: llama's may be fewer than its heads (n_kv_head, or the config's
    num_key_value_heads), shared in equal groups; every other layout's heads have their own."""
    at = reader.at
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
    return n_kv


def _read_heads(layout: _Layout, names: dict, ckpt: _File, picked, group: int, d_model: int, d_head: int) -> list[tuple]:
    """Each listed head's (W_Q, W_K, W_V, b_Q, b_K, b_V), a bias None when the file has none; the
    K/V heads they read each read once."""
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
    return heads


def _read_output(loaded: Loaded, at, given: dict, layout: _Layout, names: dict, ckpt: _File, picked, group: int,
                 d_head: int) -> None:
    """With several heads: the rows of the output projection that read each listed head, in order,
    in one read, b_O, and the K/V groups the heads share."""
    wanted = _spans([h * d_head for h in picked], d_head)
    loaded.matrices["W_O"] = ckpt.exact(ckpt.array(names["o"] + ".weight", rows=wanted) if layout.fused else
                                        ckpt.array(names["o"] + ".weight", cols=wanted).T)
    if names["o"] + ".bias" in ckpt.shapes:
        loaded.matrices["b_O"] = ckpt.exact(ckpt.array(names["o"] + ".bias", vector=True))
    if group > 1:
        loaded.kv_heads = _groups(at, given["heads"][1], [h + 1 for h in picked], group)


def _flag(reader, given: dict, name: str) -> bool:
    """``from``'s ``norm: true`` or ``residual: true`` (false when not given)."""
    if name not in given:
        return False
    v = given[name][1]
    if not _yaml.is_bool(v):
        raise reader.at(v).error(f"{name} is true or false, not {_yaml.kind(v)}", "from." + name)
    return _yaml.bool_value(v)


# The norm in front of each layout's attention (behind it for bert): the tensor, after the
# layer's prefix, and the config's names for its ε with transformers' default.
_NORMS = {
    "gpt2": ("h.{layer}.ln_1", "layernorm", ("layer_norm_epsilon",), "1e-5"),
    "llama": ("layers.{layer}.input_layernorm", "rmsnorm", ("rms_norm_eps",), "1e-6"),
    "bert": ("encoder.layer.{layer}.attention.output.LayerNorm", "layernorm", ("layer_norm_eps",), "1e-12"),
}


def _read_norm(at, given: dict, word: str, layout: _Layout, names: dict, ckpt: _File, config: Config, layer: int,
               flag: str = "norm") -> Norm:
    """The layer's norm from the checkpoint (``from: {norm: true}``): gpt2's ln_1 (LayerNorm), llama's
    input_layernorm (RMSNorm; Gemma's multiplies by 1 + γ) or bert's attention.output.LayerNorm (after
    the residual sum), with the config's ε."""
    tensor, kind, eps_names, default = _NORMS[word]
    name = _prefix(layout, names, layer) + tensor.format(layer=layer)
    node = given[flag][1]
    if name + ".weight" not in ckpt.shapes:
        raise at(node).error(ckpt.missing(name + ".weight", f"the weight γ of layer {layer}'s norm"), "from.norm")
    model_type = config.data.get("model_type")
    if kind == "rmsnorm" and name + ".bias" in ckpt.shapes:
        raise at(node).error(f"{quote_path(ckpt.rel)} has {name}.bias: this layer's norm is not LLaMA's RMSNorm (a "
                             f"{model_type or 'starcoder2'} LayerNorm?), which symattn's llama layout does not "
                             "read: give norm: {type: layernorm, ...} in the problem", "from.norm")
    if kind == "layernorm" and name + ".bias" not in ckpt.shapes:
        raise at(node).error(ckpt.missing(name + ".bias", f"the bias β of layer {layer}'s LayerNorm"), "from.norm")
    d_model = ckpt.shapes[names["q"] + ".weight"][0 if layout.fused else 1]
    for part in ("weight", "bias") if kind == "layernorm" else ("weight",):
        shape = ckpt.shapes[f"{name}.{part}"]
        if shape != [d_model]:
            raise at(node).error(f"{name}.{part} has shape {shape}, not [{d_model}] (one entry per feature of "
                                 "d_model)", "from.norm")
    weight = ckpt.exact(ckpt.array(name + ".weight", vector=True))
    bias = ckpt.exact(ckpt.array(name + ".bias", vector=True)) if kind == "layernorm" else None
    return Norm(kind, config.norm_eps(eps_names, default), weight, bias, offset=int(model_type == "gemma"),
                place="post" if word == "bert" else "pre")


def _prefix(layout: _Layout, names: dict, layer: int) -> str:
    """The model's prefix the file's tensor names carry (``transformer.``, ``bert.``, or none)."""
    return names["q"][:len(names["q"]) - len(layout.q.format(layer=layer))]


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


def _rope(config: "Config", reader, key, given: dict, fields: dict, d_head: int) -> Rope | None:
    """LLaMA's rotary embedding: rotate_half (pairing half), θ_i = rope_theta^(−2i/d_head), the base
    from ``from`` (which wins), else the config's, else 10000; the config's other RoPE settings refused."""
    at = reader.at
    if "rope" in fields:
        return None  # the problem's own rope: replaces the layout's (the reader reads it)
    if d_head % 2:
        raise at(key).error(f"RoPE rotates pairs of components, but d_head is {d_head}", "from")
    base = config.rope_base()
    if "rope_theta" in given:
        v = given["rope_theta"][1]
        base = reader.number(v, "from.rope_theta", use_symbols=False)
        if not is_positive(base):
            raise at(v).error(f"rope_theta must be positive, not {v.value}", "from.rope_theta")
    return Rope("half", base=sympy.Integer(DEFAULT_BASE) if base is None else base)


def _count(reader, given: dict, config: Config, name: str, config_keys: tuple[str, ...]) -> int | None:
    """A whole number of heads from ``from`` (which wins) or the config; None when neither has it."""
    if name in given:
        return _whole(reader, given[name][1], "from." + name, f"{name} is a number of heads", least=1)
    k, v = config.get(*config_keys)
    if v is None:
        return None
    count = count_of(v)
    if count is None or count < 1:
        raise reader.at(given["file"][1]).error(f"the config.json beside the checkpoint has {k} {shown_value(v)}, not a "
                                                "whole number from 1 to 999,999,999", "from." + name)
    return count


def _whole(reader, node: yaml.Node, field: str, what: str, least: int) -> int:
    if isinstance(node, yaml.ScalarNode) and not node.style and re.fullmatch(r"[0-9]{1,9}", node.value) \
            and int(node.value) >= least:
        return int(node.value)
    raise reader.at(node).error(f"{what}: a whole number ≥ {least}, not {_yaml.kind(node)}", field)
