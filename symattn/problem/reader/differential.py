"""The reader's part for ``differential:`` (differential attention, Ye et al. 2024: a second softmax
map subtracted from the first, ``(A₁ − λA₂)·V``), and the rules that tie it to the rest of the
problem: the fields it cannot go with, each refused in one line at its field."""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..model import DiffTransformer, Differential, Matrix
from ..places import item_field, shape_text
from .fields import Fields, key_of, node_of, section_entries

USAGE = "write {lambda: 1/2, W_Q2: [[...]], W_K2: [[...]]}"
KEYS = ("lambda", "W_Q2", "W_K2", "heads", "diff_transformer")
PAPER_KEYS = ("lambda_init", "eps")
DEFAULT_EPS = "1e-5"  # the paper's RMSNorm ε (and DiffLlama's rms_norm_eps)
# the fields differential attention does not go with, and why (each refused in one line at its field)
REFUSED = {
    "backward": "the backward pass of differential attention is not derived: remove backward (or differential)",
    "tiling": "the tiled (online) softmax of two maps and their difference is not derived: remove tiling "
              "(or differential)",
    "decode": "decoding from the KV cache with two maps is not derived: remove decode (or differential)",
    "kv_heads": "differential attention with shared keys and values (kv_heads) is not derived: give each head "
                "its own W_K and W_V",
    "sink": "learned sinks beside differential attention are not derived: remove sink or differential",
    "softcap": "soft-capping beside differential attention is not derived: remove softcap or differential",
    "temperature": "a temperature beside differential attention is not derived: remove temperature or differential",
    "linear": "linear attention and differential attention are two different attentions: give one of them",
    "qk_norm": "QK-norm beside differential attention is not derived: remove qk_norm or differential",
    "symbols": "differential attention needs numbers: its second map is derived from numbers (remove symbols)",
    "context": "differential attention is derived for self-attention: remove context (or differential)",
    "from": "differential attention reads its weights from the problem file, not from a checkpoint: remove from",
    "Q": "differential attention projects both maps from X: give X with W_Q, W_K, W_V and the second map's "
         "W_Q2, W_K2 (not Q, K, V)",
}


def read_differential(reader, fields: Fields, layer) -> Differential:
    """The ``differential:`` section: λ, each head's W_Q2 and W_K2 (the shapes of its W_Q and W_K), and
    the paper's per-head norm when ``diff_transformer`` is given."""
    for field, why in REFUSED.items():
        if field in fields:
            raise reader.at(key_of(fields, field)).error(why, field)
    for field in ("K", "V"):
        if field in fields:
            raise reader.at(key_of(fields, field)).error(REFUSED["Q"], field)
    node = node_of(fields, "differential")
    key = key_of(fields, "differential")
    given = section_entries(reader, node, "differential", KEYS, USAGE)
    if "lambda" not in given:
        raise reader.at(key).error(f"λ is missing: {USAGE}", "differential")
    lam = _number(reader, given["lambda"][1], "differential.lambda", "λ")
    if any(h.b_Q is not None or h.b_K is not None for h in layer.heads):
        field = next((f for f in ("b_Q", "b_K") if f in fields), "differential")
        at = key_of(fields, field) if field != "differential" else key
        raise reader.at(at).error("the second map's queries and keys have no bias: differential attention is "
                                  "derived without b_Q and b_K (b_V is followed)", field)
    maps = _maps(reader, given, key, layer, "heads" in fields)
    paper = _paper(reader, given["diff_transformer"]) if "diff_transformer" in given else None
    return Differential(lam, maps, paper, key.start_mark.line + 1, key.start_mark.column + 1)


def _number(reader, node: yaml.Node, field: str, what: str) -> sympy.Expr:
    x = reader.number(node, field, use_symbols=False)
    if not x.is_real or not x.is_finite:
        raise reader.at(node).error(f"{what} is a finite real number such as 1/2 or 0.8, not "
                                    f"{excerpt(str(getattr(node, 'value', '')))}", field)
    return x


def _maps(reader, given: dict, key: yaml.Node, layer, multi: bool) -> tuple[tuple[Matrix, Matrix], ...]:
    if multi:
        if "heads" not in given:
            raise reader.at(key).error("with heads, give differential.heads: one {W_Q2, W_K2} per head, in order",
                                       "differential")
        for name in ("W_Q2", "W_K2"):
            if name in given:
                raise reader.at(given[name][0]).error(
                    f"with heads, each head's {name} goes in differential.heads: one {{W_Q2, W_K2}} per head",
                    "differential." + name)
        items = given["heads"][1]
        if not isinstance(items, yaml.SequenceNode) or len(items.value) != len(layer.heads):
            count = len(items.value) if isinstance(items, yaml.SequenceNode) else None
            raise reader.at(items).error(
                f"differential.heads is a list of {len(layer.heads)} entries {{W_Q2, W_K2}}, one per head"
                + (f"; it has {count}" if count is not None else f", not {_yaml.kind(items)}"), "differential.heads")
        out = []
        for h, (item, head) in enumerate(zip(items.value, layer.heads)):
            field = item_field("differential.heads", h)
            if not isinstance(item, yaml.MappingNode):
                raise reader.at(item).error(f"each head's entry is {{W_Q2: [[...]], W_K2: [[...]]}}, not "
                                            f"{_yaml.kind(item)}", field)
            entries = {}
            for name_node, value in item.value:
                name = name_node.value if isinstance(name_node, yaml.ScalarNode) else None
                if name not in ("W_Q2", "W_K2"):
                    raise reader.at(name_node).error(f"unknown entry {excerpt(str(name))}; each head gives W_Q2 and "
                                                     "W_K2", field)
                entries[name] = (name_node, value)
            out.append(_pair(reader, entries, item, head, field + " "))
        return tuple(out)
    if "heads" in given:
        raise reader.at(given["heads"][0]).error("differential.heads is for a problem with heads; give W_Q2 and "
                                                 "W_K2 directly", "differential.heads")
    return (_pair(reader, given, key, layer.heads[0], "differential."),)


def _pair(reader, entries: dict, at: yaml.Node, head, prefix: str) -> tuple[Matrix, Matrix]:
    out = []
    for name, like in (("W_Q2", head.W_Q), ("W_K2", head.W_K)):
        if name not in entries:
            raise reader.at(at).error(f"{name} is missing: the second map needs its own W_Q2 and W_K2",
                                      prefix.rstrip(". ") or "differential")
        m = reader.matrix(entries[name][1], prefix + name)
        if m.shape != like.shape:
            raise reader.at(entries[name][1]).error(
                f"{name} is {shape_text(m)} but W_{name[2]} is {shape_text(like)}: the second map's weights have "
                f"the first's shape", prefix + name)
        out.append(m)
    return out[0], out[1]


def _paper(reader, pair: tuple[yaml.Node, yaml.Node]) -> DiffTransformer:
    name_node, node = pair
    field = "differential.diff_transformer"
    if not isinstance(node, yaml.MappingNode):
        raise reader.at(node).error(f"write diff_transformer: {{lambda_init: 1/5, eps: 1e-5}}, not {_yaml.kind(node)}",
                                    field)
    given = {}
    for key, value in node.value:
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name not in PAPER_KEYS:
            raise reader.at(key).error(f"unknown entry {excerpt(str(name))}"
                                       f"{did_you_mean(str(name), PAPER_KEYS, ignore_case=True)}; write "
                                       "{lambda_init: 1/5, eps: 1e-5}", field)
        given[name] = value
    if "lambda_init" not in given:
        raise reader.at(name_node).error("lambda_init is missing: the paper multiplies each head's normalised "
                                         "output by 1 − λ_init", field)
    lambda_init = _number(reader, given["lambda_init"], field + ".lambda_init", "λ_init")
    eps = sympy.Rational(DEFAULT_EPS)
    if "eps" in given:
        eps = _number(reader, given["eps"], field + ".eps", "eps")
        if not eps.is_positive:
            raise reader.at(given["eps"]).error("eps must be > 0: a head's output row of zeros would be divided "
                                                "by 0", field + ".eps")
    return DiffTransformer(lambda_init, eps)
