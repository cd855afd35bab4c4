"""The reader's part for ``qk_norm:``: each head's query and key rows normalised (RMSNorm over the
head's d_k features) before RoPE, as Qwen 3, OLMo 2 and Gemma 3 do.

``qk_norm: {type: rmsnorm, weight_q: [...], weight_k: [...], eps: 1e-6}``: ``weight_q`` (γ_q) and
``weight_k`` (γ_k) are one row of width d_head each, shared by every head (Qwen 3's ``q_norm`` and
``k_norm``), optional (1); ``offset: 1`` multiplies by 1 + γ (Gemma 3); ``eps`` is exact from its
text, 1e-6 when not given.
"""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..model import Matrix, Norm, QkNorm
from ..places import plural
from .fields import Fields, key_of, node_of
from .norm import mapping_keys

KEYS = ("type", "weight_q", "weight_k", "eps", "offset")
USAGE = "qk_norm: {type: rmsnorm, weight_q: [...], weight_k: [...], eps: 1e-6}"


def read_qk_norm(reader, fields: Fields, layer, passes: dict, problem_symbols: bool) -> QkNorm | None:
    """The ``qk_norm:`` field (None when not given), checked against the heads' d_k and the passes."""
    if "qk_norm" not in fields:
        return getattr(layer.loaded, "qk_norm", None) if layer.loaded is not None else None
    node, key = node_of(fields, "qk_norm"), key_of(fields, "qk_norm")
    if not isinstance(node, yaml.MappingNode):
        raise reader.at(node).error(f"qk_norm is a mapping such as {USAGE[9:]}, not {_yaml.kind(node)}", "qk_norm")
    if layer.loaded is not None and getattr(layer.loaded, "qk_norm", None) is not None:
        raise reader.at(key).error("from: takes QK-norm from the checkpoint's q_norm and k_norm: remove qk_norm",
                                   "qk_norm")
    given = mapping_keys(reader, node, "qk_norm", KEYS)
    if "type" not in given:
        raise reader.at(node).error(f"qk_norm needs type: rmsnorm ({USAGE[9:]})", "qk_norm.type")
    t = given["type"][1]
    kind = t.value if isinstance(t, yaml.ScalarNode) and not _yaml.is_null(t) and not t.style else None
    if kind != "rmsnorm":
        hint = did_you_mean(str(kind), ("rmsnorm",), ignore_case=True) if kind else ""
        raise reader.at(t).error(f"unknown qk_norm type {excerpt(kind) if kind else _yaml.kind(t)}{hint}; QK-norm is "
                                 "type: rmsnorm (x/√(mean(x²) + ε)·γ over each head's d_k features, as Qwen 3, OLMo 2 "
                                 "and Gemma 3 normalise their queries and keys)", "qk_norm.type")
    d_k = _d_head(reader, key, layer)
    weights = {name: _row(reader, given[name][1], "qk_norm." + name, d_k, name[-1])
               for name in ("weight_q", "weight_k") if name in given}
    eps = reader.norm_eps(given["eps"][1] if "eps" in given else None, "rmsnorm", "qk_norm.eps")
    offset = 0
    if "offset" in given:
        v = given["offset"][1]
        if not (isinstance(v, yaml.ScalarNode) and not v.style and v.value in ("0", "1")):
            raise reader.at(v).error(f"offset is 0 (γ) or 1 ((1 + γ), Gemma 3's), not {_yaml.kind(v)}",
                                     "qk_norm.offset")
        offset = int(v.value)
    refusal = qk_norm_refusal(passes.get("backward"), problem_symbols)
    if refusal:
        raise reader.at(key).error(refusal, "qk_norm")
    if eps == 0:
        _check_rows(reader, given["eps"][1], layer, passes)
    return QkNorm(Norm("rmsnorm", eps, weights.get("weight_q"), None, offset),
                  Norm("rmsnorm", eps, weights.get("weight_k"), None, offset))


def qk_norm_refusal(backward, symbols: bool) -> str | None:
    """What QK-norm cannot be derived with; None when it can."""
    if backward is not None:
        return "the backward pass through QK-norm is not derived yet: remove qk_norm, or leave out the backward pass"
    if symbols:
        return ("QK-norm needs plain numbers: the mean square of a row of symbols has no exact root to divide by "
                "(remove symbols, or qk_norm)")
    return None


def _d_head(reader, key: yaml.Node, layer) -> int:
    """The heads' one d_k (QK-norm's weights are one row of width d_head, shared by every head)."""
    widths = sorted({h.d_k for h in layer.heads}) if layer.heads else [layer.matrices["Q"].cols]
    if len(widths) != 1:
        raise reader.at(key).error(
            f"qk_norm needs every head of the same d_k (the heads have d_k {', '.join(map(str, widths))}): its "
            "weights are one row of width d_head, shared by every head", "qk_norm")
    return widths[0]


def _row(reader, node: yaml.Node, field: str, d_k: int, side: str) -> Matrix:
    """γ_q or γ_k: one entry per feature of a head's query (key) row."""
    letter = f"γ_{side}"
    m = reader.one_row(node, field, letter, "one entry per feature of a head (d_k of them)",
                       "of width d_head, shared by every head")
    if m.cols != d_k:
        noun = "query" if side == "q" else "key"
        raise reader.at(node).error(
            f"has {m.cols} {'entry' if m.cols == 1 else 'entries'}, but each head's {noun} rows have d_k = {d_k} "
            f"{plural(d_k, 'column')}: {letter} multiplies each feature of a normalised {noun} row (one row of width "
            "d_head, shared by every head)", field)
    return m


def _check_rows(reader, eps_node: yaml.Node, layer, passes: dict) -> None:
    """With ε = 0 no query or key row may be all zeros (its mean square would be divided by 0)."""
    m = layer.matrices
    if passes.get("positions") is not None or passes.get("norm") is not None \
            or passes.get("embeddings_norm") is not None:
        raise reader.at(eps_node).error(
            "with positions or a norm in front, qk_norm needs eps > 0: whether a query or key row is all zeros is "
            "not decided for their irrational entries", "qk_norm.eps")
    if not layer.heads:
        sides = [("Q", None, m["Q"]), ("K", None, m["K"])]
    else:
        X = m["X"]
        C = m.get("context") if m.get("context") is not None else X
        sides = []
        for h, w in enumerate(layer.heads, 1):
            for name, x, W, b in (("Q", X, w.W_Q, w.b_Q), ("K", C, w.W_K, w.b_K)):
                product = x * W
                sides.append((name, h if len(layer.heads) > 1 else None, product if b is None else product + _rows(b, x.rows)))
    for name, head, rows in sides:
        for i in range(rows.rows):
            if all(rows[i, j] == 0 for j in range(rows.cols)):
                where = f"head {head}'s " if head else ""
                raise reader.at(eps_node).error(
                    f"row {i + 1} of {where}{name} is all zeros, and eps is 0, so QK-norm would divide by 0: give "
                    "eps > 0", "qk_norm.eps")


def _rows(b: Matrix, n: int) -> Matrix:
    return Matrix.vstack(*([b] * n))
