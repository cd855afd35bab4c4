"""``from: {..., block: true}`` and ``logits: {from: true}``: the rest of the layer and the model's
head, read from the checkpoint.

``block: true`` reads the layer's second norm and its MLP:

- ``gpt2``: ``h.{L}.ln_2``, then ``h.{L}.mlp.c_fc`` and ``h.{L}.mlp.c_proj`` (Conv1D, in × out), with
  the config's ``activation_function`` (``gelu_new``, GPT-2's tanh form, by default);
- ``llama``: ``layers.{L}.post_attention_layernorm`` (RMSNorm), then ``mlp.gate_proj``,
  ``mlp.up_proj`` and ``mlp.down_proj`` (nn.Linear, out × in), with ``hidden_act`` (``silu``);
- ``bert``: ``encoder.layer.{L}.intermediate.dense`` and ``output.dense`` (nn.Linear) and the
  LayerNorm behind them, ``output.LayerNorm`` (post-norm), with ``hidden_act`` (``gelu``, erf).

``logits: {from: true}`` reads the final norm and the unembedding: ``ln_f`` and the tied ``wte``
(GPT-2), ``model.norm`` and ``lm_head`` (LLaMA; the embedding table when the config ties them).
"""

from __future__ import annotations

from ..model import Mlp, Norm
from ...text import quote_path

# each config activation symattn computes exactly, by the name transformers gives it
ACTIVATIONS = {"gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh", "gelu": "gelu", "relu": "relu",
               "silu": "silu", "swish": "silu"}
# each layout: the config's name of the activation and its default; the norm's config names of ε and default
_ACT = {"gpt2": (("activation_function",), "gelu_new"), "llama": (("hidden_act",), "silu"),
        "bert": (("hidden_act",), "gelu")}
_EPS = {"gpt2": (("layer_norm_epsilon",), "1e-5"), "llama": (("rms_norm_eps",), "1e-6"),
        "bert": (("layer_norm_eps",), "1e-12")}


class _Reader:
    """The tensors of one layer (or the model's head) under the file's prefix, each checked there."""

    def __init__(self, at, node, ckpt, prefix: str, field: str) -> None:
        self.at, self.node, self.ckpt, self.prefix, self.field = at, node, ckpt, prefix, field

    def has(self, name: str) -> bool:
        return self.prefix + name in self.ckpt.shapes

    def shape(self, name: str, what: str) -> list[int]:
        full = self.prefix + name
        if full not in self.ckpt.shapes:
            raise self.at(self.node).error(self.ckpt.missing(full, what), self.field)
        return self.ckpt.shapes[full]

    def matrix(self, name: str, what: str, shape: tuple[int, int], transpose: bool):
        """The exact matrix ``name``: stored ``shape`` (out × in for nn.Linear, read transposed)."""
        got = self.shape(name, what)
        if got != list(shape):
            raise self.at(self.node).error(f"{self.prefix}{name} has shape {got}, not {list(shape)} ({what})", self.field)
        array = self.ckpt.array(self.prefix + name)
        return self.ckpt.exact(array.T if transpose else array)

    def row(self, name: str, what: str, width: int):
        got = self.shape(name, what)
        if got != [width]:
            raise self.at(self.node).error(f"{self.prefix}{name} has shape {got}, not [{width}] ({what})", self.field)
        return self.ckpt.exact(self.ckpt.array(self.prefix + name, vector=True))

    def norm(self, name: str, kind: str, eps, d: int, place: str, offset: int = 0) -> Norm:
        weight = self.row(name + ".weight", "the norm's weight γ", d)
        if kind == "rmsnorm" and self.has(name + ".bias"):
            raise self.at(self.node).error(f"{quote_path(self.ckpt.rel)} has {self.prefix}{name}.bias: this norm is not "
                                           "an RMSNorm, which the llama layout reads", self.field)
        bias = self.row(name + ".bias", "the LayerNorm's bias β", d) if kind == "layernorm" else None
        return Norm(kind, eps, weight, bias, offset=offset, place=place)


def _activation(config, word: str) -> str:
    names, default = _ACT[word]
    name, value = config.get(*names)
    value = default if value is None else value
    if value not in ACTIVATIONS:
        config.refuse(f"has {name} {value!r}, an activation symattn does not compute exactly (it computes "
                      + ", ".join(sorted(ACTIVATIONS)) + ")")
    return ACTIVATIONS[value]


def read_block(reader, given: dict, word: str, prefix: str, ckpt, config, layer: int, d_model: int) -> Mlp:
    """The layer's second norm and its MLP (``from``'s ``block: true``)."""
    r = _Reader(reader.at, given["block"][1], ckpt, prefix, "from.block")
    eps = config.norm_eps(*_EPS[word])
    act = _activation(config, word)
    offset = int(config.data.get("model_type") == "gemma")
    if word == "gpt2":
        base = f"h.{layer}."
        d_ff = r.shape(base + "mlp.c_fc.weight", f"layer {layer}'s MLP (GPT-2's c_fc)")[-1]
        norm = r.norm(base + "ln_2", "layernorm", eps, d_model, "pre")
        return Mlp(act, r.matrix(base + "mlp.c_fc.weight", "c_fc, Conv1D: d_model × d_ff", (d_model, d_ff), False),
                   r.matrix(base + "mlp.c_proj.weight", "c_proj, Conv1D: d_ff × d_model", (d_ff, d_model), False),
                   r.row(base + "mlp.c_fc.bias", "c_fc's bias", d_ff), r.row(base + "mlp.c_proj.bias", "c_proj's bias",
                                                                             d_model), norm=norm)
    if word == "llama":
        base = f"layers.{layer}."
        d_ff = r.shape(base + "mlp.gate_proj.weight", f"layer {layer}'s MLP (gate_proj)")[0]
        for part in ("gate_proj", "up_proj", "down_proj"):
            if r.has(f"{base}mlp.{part}.bias"):
                raise r.at(r.node).error(f"{quote_path(ckpt.rel)} has {prefix}{base}mlp.{part}.bias (mlp_bias): a gated "
                                         "MLP with biases, which symattn does not derive", "from.block")
        norm = r.norm(base + "post_attention_layernorm", "rmsnorm", eps, d_model, "pre", offset)
        return Mlp(act, r.matrix(base + "mlp.gate_proj.weight", "gate_proj, nn.Linear: d_ff × d_model", (d_ff, d_model), True),
                   r.matrix(base + "mlp.down_proj.weight", "down_proj, nn.Linear: d_model × d_ff", (d_model, d_ff), True),
                   W_up=r.matrix(base + "mlp.up_proj.weight", "up_proj, nn.Linear: d_ff × d_model", (d_ff, d_model), True),
                   norm=norm)
    base = f"encoder.layer.{layer}."
    d_ff = r.shape(base + "intermediate.dense.weight", f"layer {layer}'s MLP (intermediate.dense)")[0]
    norm = r.norm(base + "output.LayerNorm", "layernorm", eps, d_model, "post")
    return Mlp(act, r.matrix(base + "intermediate.dense.weight", "intermediate.dense, nn.Linear: d_ff × d_model",
                             (d_ff, d_model), True),
               r.matrix(base + "output.dense.weight", "output.dense, nn.Linear: d_model × d_ff", (d_model, d_ff), True),
               r.row(base + "intermediate.dense.bias", "intermediate.dense's bias", d_ff),
               r.row(base + "output.dense.bias", "output.dense's bias", d_model), norm=norm)


def read_head(reader, node, word: str, prefix: str, ckpt, config, layer: int, last: int | None, d_model: int) -> tuple:
    """(the final norm, W_U, whether this is the logit lens, whether W_U is tied) of ``logits:
    {from: true}``; ``last``: the file's last layer."""
    r = _Reader(reader.at, node, ckpt, prefix, "logits.from")
    if word == "bert":
        raise reader.at(node).error("logits: {from: true} reads GPT-2's and LLaMA's heads; BERT's masked-LM head "
                                    "(cls.predictions: a dense layer, GELU and a LayerNorm before the tied decoder) is "
                                    "not read: give logits: {norm: ..., W_U: ...} in the problem", "logits.from")
    eps = config.norm_eps(*_EPS[word])
    if word == "gpt2":
        norm = r.norm("ln_f", "layernorm", eps, d_model, "pre")
        table, lm_head = "wte.weight", "lm_head.weight"
        tied = lm_head not in ckpt.shapes  # save_pretrained leaves the tied copy out
    else:
        norm = r.norm("norm", "rmsnorm", eps, d_model, "pre", int(config.data.get("model_type") == "gemma"))
        table, lm_head = "embed_tokens.weight", "lm_head.weight"
        tied = config.flag("tie_word_embeddings", False) or lm_head not in ckpt.shapes
    if not tied and lm_head in ckpt.shapes:  # lm_head sits outside the model's prefix (model.)
        vocab = ckpt.shapes[lm_head][0]
        full = _Reader(reader.at, node, ckpt, "", "logits.from")
        W_U = full.matrix(lm_head, "the unembedding, nn.Linear: vocabulary × d_model", (vocab, d_model), True)
    else:
        vocab = r.shape(table, "the embedding table the tied unembedding transposes")[0]
        W_U = r.matrix(table, "the embedding table: vocabulary × d_model", (vocab, d_model), True)
    return norm, W_U, last is not None and layer < last, tied
