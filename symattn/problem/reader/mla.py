"""The reader's part for ``mla:`` (multi-head latent attention, DeepSeek-V2/V3): its weights, its
``heads`` and its own ``rope:``, every shape checked against X and the others, and the fields it
cannot go with, each refused in one line."""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...errors import SymattnError
from ...text import did_you_mean, excerpt
from ..model import Head, Matrix, Mla, Norm
from ..places import plural, shape_text
from .fields import Fields, key_of, node_of
from .layer import Layer, read_output
from .norm import mapping_keys
from .rope import read_rope

ENTRIES = ("heads", "W_DKV", "W_UK", "W_UV", "W_KR", "W_Q", "W_DQ", "W_UQ", "W_QR", "rope", "norm_kv", "norm_q")
USAGE = "mla: {heads: h, W_DKV: ..., W_UK: ..., W_UV: ..., W_KR: ..., W_Q: ... (or W_DQ: ... with W_UQ: ...), W_QR: ..., rope: {...}}"
# fields that take the place of mla's own (refused at whichever of the two is written second)
BESIDE = {
    **{name: f"with mla the queries, keys and values come from mla's own weights: remove the top-level {name}"
       for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V", "Q", "K", "V")},
    "heads": "with mla the number of heads is mla's own (mla: {heads: h}): remove the top-level heads",
    "kv": "with mla every head reads the one latent c_KV: there are no K/V groups (remove kv)",
    "rope": "with mla the rotation is mla's own (mla: {rope: {...}}), applied to q_R and k_R only: move rope into mla",
    "softcap": "soft-capping is not derived with mla: remove softcap or mla",
    "temperature": "a temperature is not derived with mla: remove temperature or mla",
    "linear": "linear attention has no scores for mla's keys: remove linear or mla",
    "qk_norm": "QK-norm is not derived with mla (its latent norms are mla's own): remove qk_norm or mla",
    "sink": "learned sinks are not derived with mla: remove sink or mla",
}
# fields refused at their own place
REFUSED = {
    "backward": "the backward pass of multi-head latent attention is not derived: remove backward (or mla)",
    "tiling": "the tiled softmax is not derived with mla: remove tiling",
    "decode": "decoding from mla's latent cache is not derived yet (its cache per token is shown in every mla "
              "solution): remove decode",
    "kv_heads": "with mla every head reads the one latent c_KV: kv_heads has no groups to make (remove kv_heads)",
    "from": "a DeepSeek checkpoint is not read yet: give mla's weights in the file (remove from)",
    "symbols": "mla needs numbers: remove symbols",
    "context": "mla is derived for self-attention (its rotated key k_R turns by the key's own position): remove context",
    "positions": "positions added to X are not derived with mla (it has its own RoPE): remove positions",
    "token_types": "token types are not derived with mla: remove token_types",
    "embeddings_norm": "the embeddings' norm is not derived with mla: remove embeddings_norm",
    "norm": "a layer norm in front of mla is not derived yet: remove norm",
    "residual": "the residual stream is not derived with mla yet: remove residual",
    "mlp": "the MLP behind mla is not derived yet: remove mlp",
    "logits": "the model's head behind mla is not derived yet: remove logits",
    "loss": "the loss behind mla is not derived yet: remove loss",
}


def refuse_beside(reader, fields: Fields) -> None:
    """One line for the first field mla cannot go with."""
    mla_key = key_of(fields, "mla")
    for name, why in BESIDE.items():
        if name in fields:
            other = key_of(fields, name)
            second = other if (other.start_mark.line, other.start_mark.column) > \
                (mla_key.start_mark.line, mla_key.start_mark.column) else mla_key
            raise reader.at(second).error(why, name if second is other else "mla")
    for name, why in REFUSED.items():
        if name in fields:
            raise reader.at(key_of(fields, name)).error(why, name)


def _entries(reader, node: yaml.Node) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode) or not node.value:
        raise reader.at(node).error(f"{USAGE}, not {_yaml.kind(node)}", "mla")
    given: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) else None
        if name not in ENTRIES:
            raise reader.at(k).error(f"unknown entry {excerpt(str(name))} in mla"
                                     f"{did_you_mean(str(name), ENTRIES, ignore_case=True)}; {USAGE}", "mla")
        if name in given:
            raise reader.at(k).error(f"mla.{name} is given twice", f"mla.{name}")
        given[name] = (k, v)
    if "norm_q" in given and "W_DQ" not in given:
        raise reader.at(given["norm_q"][0]).error("mla.norm_q normalises the query latent X·W_DQ: it goes with W_DQ "
                                                  "and W_UQ", "mla.norm_q")
    return given


def _latent_norm(reader, given, name: str, latent: Matrix) -> Norm | None:
    """``norm_kv`` or ``norm_q``: RMSNorm of the latent's rows, ``{weight: [...], eps: ...}`` (weight 1 and
    eps 1e-6 when not given); with eps 0 no latent row may be all 0."""
    if name not in given:
        return None
    key, node = given[name]
    field = f"mla.{name}"
    if not isinstance(node, yaml.MappingNode):
        raise reader.at(node).error(f"{name} is RMSNorm's {{weight: [...], eps: ...}}, not {_yaml.kind(node)}", field)
    keys = mapping_keys(reader, node, field, ("weight", "eps"))
    weight = None
    if "weight" in keys:
        width = f"one entry per latent column ({latent.cols})"
        weight = reader.one_row(keys["weight"][1], field + ".weight", "γ", width, width)
        if weight.cols != latent.cols:
            raise reader.at(keys["weight"][1]).error(
                f"has {weight.cols} {'entry' if weight.cols == 1 else 'entries'}, but the latent has {latent.cols} "
                f"{plural(latent.cols, 'column')}: γ multiplies each of its columns", field + ".weight")
    eps = reader.norm_eps(keys["eps"][1] if "eps" in keys else None, "rmsnorm", field + ".eps")
    if eps == 0:
        for i in range(latent.rows):
            if all(x == 0 for x in latent.row(i)):
                raise reader.at(keys["eps"][1]).error(
                    f"row {i + 1} of the latent is all 0, so with eps 0 its norm divides 0 by 0: give eps > 0",
                    field + ".eps")
    return Norm("rmsnorm", eps, weight)


def _heads(reader, given, node) -> int:
    if "heads" not in given:
        raise reader.at(node).error("mla needs heads, the number of heads (mla: {heads: 2, ...})", "mla.heads")
    h = reader.plain_whole(given["heads"][1], "mla.heads")
    if h is None or h < 1:
        raise reader.at(given["heads"][1]).error(
            f"the number of heads is a whole number of at least 1, not {_yaml.kind(given['heads'][1])}", "mla.heads")
    return h


def _weights(reader, given, node, X: Matrix, h: int) -> dict[str, Matrix]:
    """mla's weights, each shape checked: the rows against what it multiplies, the columns per head."""
    if "W_Q" in given and "W_DQ" in given:
        raise reader.at(given["W_DQ"][0]).error("give mla.W_Q, or mla.W_DQ with mla.W_UQ, not both", "mla.W_DQ")
    if "W_UQ" in given and "W_DQ" not in given:
        raise reader.at(given["W_UQ"][0]).error("mla.W_UQ up-projects the query latent X·W_DQ: give mla.W_DQ too",
                                                "mla.W_UQ")
    if "W_DQ" in given and "W_UQ" not in given:
        raise reader.at(given["W_DQ"][0]).error("mla.W_DQ compresses the queries: give mla.W_UQ, the up-projection "
                                                "of its latent, too", "mla.W_DQ")
    needed = ("W_DKV", "W_UK", "W_UV", "W_KR") + (("W_DQ", "W_UQ") if "W_DQ" in given else ("W_Q",)) + ("W_QR",)
    w: dict[str, Matrix] = {}
    for name in needed:
        if name not in given:
            raise reader.at(node).error(f"{name} is missing; {USAGE}", f"mla.{name}")
        w[name] = reader.matrix(given[name][1], f"mla.{name}")
    d_cq = w["W_DQ"].cols if "W_DQ" in w else None
    rows = {"W_DKV": (X.cols, "X·W_DKV needs W_DKV to have one row per column of X"),
            "W_KR": (X.cols, "X·W_KR needs W_KR to have one row per column of X"),
            "W_UK": (w["W_DKV"].cols, "c_KV·W_UK needs W_UK to have one row per latent column (d_c, W_DKV's columns)"),
            "W_UV": (w["W_DKV"].cols, "c_KV·W_UV needs W_UV to have one row per latent column (d_c, W_DKV's columns)"),
            "W_Q": (X.cols, "X·W_Q needs W_Q to have one row per column of X"),
            "W_DQ": (X.cols, "X·W_DQ needs W_DQ to have one row per column of X"),
            "W_UQ": (d_cq, "c_Q·W_UQ needs W_UQ to have one row per query-latent column (W_DQ's columns)"),
            "W_QR": (d_cq or X.cols, "c_Q·W_QR needs W_QR to have one row per query-latent column (W_DQ's columns)"
                     if d_cq else "X·W_QR needs W_QR to have one row per column of X")}
    for name, m in w.items():
        want, why = rows[name]
        if m.rows != want:
            raise reader.at(given[name][1]).error(f"is {shape_text(m)}: {why} ({want} {plural(want, 'row')})",
                                                  f"mla.{name}")
    for name in ("W_UK", "W_UV", "W_UQ", "W_Q", "W_QR"):
        if name in w and w[name].cols % h:
            raise reader.at(given[name][1]).error(
                f"is {shape_text(w[name])}: its {w[name].cols} columns are {h} heads' blocks side by side, so they "
                f"must be a multiple of heads ({h})", f"mla.{name}")
    q = w.get("W_UQ", w.get("W_Q"))
    if q.cols != w["W_UK"].cols:
        name = "W_UQ" if "W_UQ" in w else "W_Q"
        raise reader.at(given[name][1]).error(
            f"is {shape_text(q)} but W_UK is {shape_text(w['W_UK'])}: each head's compressed query and key need the "
            f"same width d_h, so {name} and W_UK need the same number of columns", f"mla.{name}")
    if w["W_QR"].cols != h * w["W_KR"].cols:
        raise reader.at(given["W_QR"][1]).error(
            f"is {shape_text(w['W_QR'])} but W_KR is {shape_text(w['W_KR'])}: each head's rotated query is as wide as "
            f"the shared rotated key (d_R = {w['W_KR'].cols}), so W_QR needs {h}·{w['W_KR'].cols} = "
            f"{h * w['W_KR'].cols} columns", "mla.W_QR")
    return w


def _rope(reader, given, node, d_R: int, n: int):
    if "rope" not in given:
        raise reader.at(node).error("mla needs rope, the rotation of q_R and k_R (rope: {base: 10000} or "
                                    "rope: {angles: [...]}, as the top-level rope)", "mla.rope")
    key, value = given["rope"]
    try:
        return read_rope(reader, key, value, [d_R], n, n, multi=False, cross=False)
    except SymattnError as exc:
        field = exc.field if exc.field is None or exc.field.startswith("mla.") else "mla." + exc.field
        message = exc.message.replace("d_k", "d_R")
        raise SymattnError(message, file=exc.file, line=exc.line, col=exc.col, field=field) from None


def effective_heads(mla: Mla) -> list[Head]:
    """Each head's effective projections before the rotation and without the latent norms: [W_Q^(h) ;
    W_QR^(h)] (through W_DQ when given), [W_DKV·W_UK^(h) ; W_KR] and W_DKV·W_UV^(h). They give the heads'
    widths (d_h + d_R, d_v) to the rest of symattn; mla's own stages and references never read them."""
    h, d_h, d_R, d_v = mla.heads, mla.d_h, mla.d_R, mla.d_v
    out = []
    for k in range(h):
        def cols(m, width):
            return m[:, k * width:(k + 1) * width]
        up_q = mla.W_Q if mla.W_Q is not None else mla.W_DQ * mla.W_UQ
        rot_q = mla.W_QR if mla.W_DQ is None else mla.W_DQ * mla.W_QR
        W_Q = Matrix.hstack(cols(up_q, d_h), cols(rot_q, d_R))
        W_K = Matrix.hstack(mla.W_DKV * cols(mla.W_UK, d_h), mla.W_KR)
        out.append(Head(Matrix(W_Q), Matrix(W_K), Matrix(mla.W_DKV * cols(mla.W_UV, d_v))))
    return out


def read_mla(reader, root: yaml.MappingNode, fields: Fields) -> tuple[Layer, Mla]:
    """The layer of an ``mla:`` problem: X, mla's weights and rope, W_O (and b_O)."""
    refuse_beside(reader, fields)
    node = node_of(fields, "mla")
    given = _entries(reader, node)
    if "X" not in fields:
        raise reader.at(root).error("X is missing: mla's latent is X·W_DKV; give X, one row of d_model entries "
                                    "per token", "X")
    X = reader.matrix(node_of(fields, "X"), "X")
    h = _heads(reader, given, node)
    w = _weights(reader, given, node, X, h)
    rope = _rope(reader, given, node, w["W_KR"].cols, X.rows)
    key = key_of(fields, "mla")
    norm_kv = _latent_norm(reader, given, "norm_kv", X * w["W_DKV"])
    norm_q = _latent_norm(reader, given, "norm_q", X * w["W_DQ"]) if "W_DQ" in w else None
    mla = Mla(h, rope=rope, line=key.start_mark.line + 1, col=key.start_mark.column + 1, norm_kv=norm_kv,
              norm_q=norm_q, **w)
    heads = effective_heads(mla)
    if "W_O" not in fields:
        raise reader.at(key).error("mla's heads need W_O, the output projection applied to the concatenated heads",
                                   "W_O")
    matrices = {"X": X}
    read_output(reader, fields, matrices, heads, X)
    return Layer(matrices, heads, None, None, X.rows, X.rows, False), mla
