"""The ``config.json`` beside a checkpoint, read as Hugging Face transformers writes it, old
spellings and new (:class:`Config`): what it changes in a layer's attention is applied (the RoPE
base, head_dim, a sliding window, GPT-2's scale, BERT's is_decoder) or refused by name. Its
numbers are kept as their JSON text and converted exactly where they are read.
"""

from __future__ import annotations

import json
import os
import re

import sympy

from ...numbers.parse import NumberError, check_size, is_positive, parse_number
from ...reading import FileError, read_regular
from ...text import quote_path

MAX_CONFIG = 1_000_000  # bytes of config.json

# The model types whose attention each layout follows, as transformers computes it: a config.json
# of another type (Gemma 2's soft-capping, Qwen 3's normalised queries, Cohere's interleaved RoPE)
# is refused rather than read as if it were one of these.
MODEL_TYPES = {
    "gpt2": ("gpt2",),
    "llama": ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "starcoder2", "gemma"),
    "bert": ("bert", "roberta", "xlm-roberta"),
}
_EVERY_LAYER_WINDOW = ("mistral", "mixtral", "starcoder2")  # sliding_window applies to every layer
_LAYER_TYPES_WINDOW = ("qwen2", "qwen2_moe", "qwen3")  # only with use_sliding_window, to the layers layer_types names
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


def count_of(v) -> int | None:
    """A whole number of at most nine digits from config.json; None when ``v`` is none."""
    return int(v.text) if isinstance(v, _Number) and _COUNT.fullmatch(v.text) else None


def shown_value(v) -> str:
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


class Config:
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
                self.refuse(f"gives {found[0][0]} {shown_value(found[0][1])} and {name} {shown_value(v)}, which disagree: "
                            "keep one")
        return found[0] if found else (None, None)

    def flag(self, name: str, default: bool) -> bool:
        v = self.data.get(name)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.refuse(f"has {name} {shown_value(v)}, not true or false")
        return v

    def model_type(self, word: str) -> None:
        v = self.data.get("model_type")
        if v is not None and not isinstance(v, str):
            self.refuse(f"has model_type {shown_value(v)}, not a name such as {MODEL_TYPES[word][0]!r}")
        if v is not None and v not in MODEL_TYPES[word]:
            self.refuse(f"is for a {shown_value(v)} model (model_type), whose attention symattn's {word} layout does not "
                        f"follow: it follows {', '.join(MODEL_TYPES[word])} models")

    def norm_eps(self, names: tuple[str, ...], default: str) -> sympy.Expr:
        """The layer norm's ε from the first of ``names`` the config has, exactly (``1e-05`` is
        1/100000); ``default`` (transformers' own default for the model) when it has none."""
        name, v = self.get(*names)
        if v is None:
            return sympy.Rational(default)
        try:
            eps = _exact(v)
        except NumberError:
            eps = None
        if eps is None or not eps.is_real or eps.is_negative:
            self.refuse(f"has {name} {shown_value(v)}, not a number ≥ 0")
        return eps

    def rope_base(self) -> sympy.Expr | None:
        """The config's rope_theta, exactly (None when it has none), after refusing the RoPE settings
        symattn does not apply: any rope_type but default, partial_rotary_factor but 1, other keys."""
        for name in _ROPE_DICTS:
            v = self.data.get(name)
            if v is not None and not isinstance(v, dict):
                self.refuse(f'has {name} {shown_value(v)}, not an object such as {{"rope_type": "default", '
                            '"rope_theta": 10000.0}')
        name, kind = self.get("rope_parameters.rope_type", "rope_parameters.type", "rope_scaling.rope_type",
                              "rope_scaling.type")
        if kind is not None and kind != "default":
            self.refuse(f"sets {name} {shown_value(kind)}, which symattn does not apply (it applies plain RoPE, rope_type "
                        "default): give rope: {base: ...} in the problem to use plain RoPE angles")
        for name in _ROPE_DICTS:
            for k in self.data.get(name) or {}:
                if k not in _ROPE_KEYS:
                    shown = k if len(k) <= 40 and k.isprintable() else shown_value(k)
                    self.refuse(f"sets {name}.{shown}, which symattn does not apply (it reads rope_type, rope_theta "
                                "and partial_rotary_factor there)")
        name, part = self.get("partial_rotary_factor", "rope_parameters.partial_rotary_factor",
                              "rope_scaling.partial_rotary_factor")
        if part is not None and not _same(part, _Number("1")):
            self.refuse(f"sets {name} {shown_value(part)} (RoPE on part of each head), which symattn does not apply")
        name, theta = self.get("rope_theta", "rope_parameters.rope_theta", "rope_scaling.rope_theta")
        if theta is None:
            return None
        try:
            base = _exact(theta)
        except NumberError:
            base = None
        if base is None or not is_positive(base):
            self.refuse(f"has {name} {shown_value(theta)}, not a positive number")
        return base


def read_config(reader, key, path, rel: str, where_) -> Config:
    """The ``config.json`` beside the checkpoint, its numbers kept as their text."""
    cfg = path.parent / "config.json"
    at = reader.at(key)
    if not os.path.lexists(cfg):
        return Config({}, rel, at)
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
    return Config(data, rel, at)




def llama_config(config: Config, layer: int, n: int, n_head: int, d_head: int, names: dict, ckpt,
                  masked: bool) -> int | None:
    """The sliding window a llama layer of ``n`` tokens applies (None: none, or one that hides no
    key), after refusing what the config changes in the layer that symattn does not apply."""
    name, head_dim = config.get("head_dim")
    if head_dim is not None and count_of(head_dim) != d_head:
        rows = ckpt.shapes[names["q"] + ".weight"][0]
        config.refuse(f"has head_dim {shown_value(head_dim)}, but the {rows} rows of {names['q']}.weight make {n_head} "
                      f"heads {d_head} wide: check head_dim and n_head (num_attention_heads)")
    for k, what in (("attn_logit_softcapping", "soft-capped scores"),
                    ("attention_multiplier", "scores scaled by it, not by 1/√d_head")):
        name, v = config.get(k)
        if v is not None:
            config.refuse(f"sets {name} {shown_value(v)} ({what}), which symattn does not apply")
    name, v = config.get("query_pre_attn_scalar")
    if v is not None and count_of(v) != d_head:
        config.refuse(f"sets {name} {shown_value(v)} (scores scaled by its inverse square root, not by 1/√d_head = "
                      f"1/√{d_head}), which symattn does not apply")
    kinds = config.data.get("layer_types")
    kind = None
    if kinds is not None:
        if not isinstance(kinds, list):
            config.refuse(f"has layer_types {shown_value(kinds)}, not a list")
        if layer >= len(kinds):
            config.refuse(f"has layer_types with {len(kinds)} {'entry' if len(kinds) == 1 else 'entries'}, none for "
                          f"layer {layer}")
        kind = kinds[layer]
        if kind not in ("full_attention", "sliding_attention"):
            config.refuse(f"gives layer {layer} the attention type {shown_value(kind)} (layer_types), which symattn does "
                          "not apply")
    if masked:
        return None  # the problem's mask replaces the layout's
    width = config.value("sliding_window")
    model = config.data.get("model_type")
    if width is None or (model in _LAYER_TYPES_WINDOW and not config.flag("use_sliding_window", False)):
        return None  # transformers drops the window (sliding_window null, or Qwen 2 without use_sliding_window)
    w = count_of(width)
    if not w:
        config.refuse(f"has sliding_window {shown_value(width)}, not a whole number ≥ 1 or null")
    if w >= n:
        return None  # query i reads keys i − w + 1 … i: with n ≤ w tokens that is every earlier key (causal)
    if model in _EVERY_LAYER_WINDOW:
        return w
    if model in _LAYER_TYPES_WINDOW and kind is not None:
        return w if kind == "sliding_attention" else None
    why = ("it has no layer_types" if model in _LAYER_TYPES_WINDOW else
           f"model_type {shown_value(model)} does not say" if model is not None else "it has no model_type")
    config.refuse(f"sets sliding_window {w}, which hides keys from X's {n} tokens, and symattn cannot tell whether "
                  f"layer {layer} applies it ({why}): give mask: {{sliding-window: {w}}} or mask: causal in the "
                  "problem")


def gpt2_scale(config: Config, layer: int, d_head: int, given: bool):
    """GPT-2's score scale when the config changes it (scale_attn_weights: false drops 1/√d_head,
    scale_attn_by_inverse_layer_idx divides by layer + 1), exactly; None for the usual 1/√d_head or
    when the problem gives its own scale."""
    weights = config.flag("scale_attn_weights", True)
    inverse = config.flag("scale_attn_by_inverse_layer_idx", False)
    if given or (weights and not inverse):
        return None
    scale = (1 / sympy.sqrt(sympy.Integer(d_head)) if weights else sympy.Integer(1)) / (layer + 1 if inverse else 1)
    return "none" if scale == 1 else scale


def bert_config(config: Config) -> bool:
    """Whether the BERT layer is a decoder's (is_decoder: causal), after refusing relative positions."""
    name, kind = config.get("position_embedding_type")
    if kind is not None and kind != "absolute":
        config.refuse(f"sets {name} {shown_value(kind)} (relative positions in the scores), which symattn does not apply")
    return config.flag("is_decoder", False)
