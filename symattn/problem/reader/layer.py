"""The attention layer's fields: Q, K and V given, or X (and context) with each head's weights
W_Q, W_K, W_V and biases, the heads' list (``heads``, ``kv_heads`` and ``kv``), W_O and b_O, or
the layer from a checkpoint (``from``, :mod:`symattn.problem.checkpoints.layouts`); and the rules
between them, each a function below.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..model import BIAS_NAMES, Head, Matrix
from ..places import item_field, plural, shape_text
from ..plain_numbers import plain_rational_matrix
from .fields import Fields, key_of, node_of


@dataclass
class Layer:
    """The layer as read: its matrices by field (Q, K, V given, or X, context, W_O, b_O), its
    heads, its K/V groups, what ``from:`` filled in (None without it), and the counts of queries
    and keys."""

    matrices: dict[str, Matrix]
    heads: list[Head]
    kv_heads: int | None
    loaded: object  # checkpoints.layouts.Loaded, or None
    n_q: int
    n_k: int
    direct: bool  # Q, K and V are given


def is_flat_row(node: yaml.Node) -> bool:
    """Whether ``node`` is a flat list of entries (``[1, 2]``), not a matrix's list of rows."""
    return isinstance(node, yaml.SequenceNode) and not isinstance(node, _yaml.FlowMatrix) and bool(node.value) \
        and not isinstance(node.value[0], yaml.SequenceNode)


def read_layer(reader, root: yaml.MappingNode, fields: Fields) -> Layer:
    """The layer's matrices and heads, every shape checked against the others."""
    direct = [n for n in ("Q", "K", "V") if n in fields]
    check_sources(reader, fields, direct)
    kv_heads = reader.kv_fields(fields) if "from" not in fields else None
    if direct:
        matrices = read_given(reader, root, fields)
        return Layer(matrices, [], kv_heads, None, matrices["Q"].rows, matrices["K"].rows, True)
    return read_projected(reader, root, fields, kv_heads)


def check_sources(reader, fields: Fields, direct: list[str]) -> None:
    """Q, K and V given, or X with the weights, not both; biases only where there is a projection."""
    projected = [n for n in ("X", "W_Q", "W_K", "W_V", "context", "heads", "W_O", "from") if n in fields]
    if direct and projected:
        raise reader.at(key_of(fields, direct[0])).error(
            f"give either X with W_Q, W_K, W_V or Q, K, V directly, not both ({projected[0]} is also given)"
        )
    biased = [n for n in BIAS_NAMES + ("b_O",) if n in fields]
    if direct and biased:
        b = biased[0]
        raise reader.at(key_of(fields, b)).error(
            f"{b} is the bias of the projection {'concat·W_O' if b == 'b_O' else 'X·W_' + b[-1]}; with Q, K and V "
            "given directly there is no projection to add it to (add it to the given matrix yourself, or give X "
            "with the weights)", b)
    if "b_O" in fields and "W_O" not in fields:
        raise reader.at(key_of(fields, "b_O")).error(
            "b_O is the bias of the output projection concat·W_O, but W_O is missing "
            "(b_O goes with heads and W_O)", "b_O")


def read_given(reader, root: yaml.MappingNode, fields: Fields) -> dict[str, Matrix]:
    """Q, K and V given directly, with shapes that fit."""
    matrices: dict[str, Matrix] = {}
    for name in ("Q", "K", "V"):
        if name not in fields:
            raise reader.at(root).error(f"Q, K and V go together: {name} is missing")
        matrices[name] = reader.matrix(node_of(fields, name), name)
    reader.same("Q", matrices["Q"], "cols", "K", matrices["K"], "cols", key_of(fields, "K"),
                "Q·Kᵀ needs Q and K to have the same number of columns (d_k)")
    reader.same("K", matrices["K"], "rows", "V", matrices["V"], "rows", key_of(fields, "V"),
                "each key needs one value row: K and V need the same number of rows")
    return matrices


def read_projected(reader, root: yaml.MappingNode, fields: Fields, kv_heads: int | None) -> Layer:
    """X (and context) with each head's weights and biases, W_O and b_O; or the layer ``from:`` names."""
    if "X" not in fields:
        raise reader.at(root).error("X is missing: from: gives the weights; give X, the layer's input (one row "
                                    "of d_model entries per token)" if "from" in fields else
                                    "X is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly")
    matrices: dict[str, Matrix] = {}
    matrices["X"] = X = reader.matrix(node_of(fields, "X"), "X")
    kv_name = "context" if "context" in fields else "X"
    if "context" in fields:
        matrices["context"] = reader.matrix(node_of(fields, "context"), "context")
    C = matrices[kv_name]
    heads: list[Head] = []
    loaded = None  # the layer's weights from a checkpoint (the from: field)
    if "from" in fields:
        from ..checkpoints.layouts import read_from

        loaded = read_from(reader, key_of(fields, "from"), node_of(fields, "from"), fields, X)
        head_nodes, kv_heads = [], loaded.kv_heads
        heads.extend(Head(*weights) for weights in loaded.heads)
        matrices.update(loaded.matrices)
    else:
        head_nodes = weight_nodes(reader, root, fields, kv_heads)
    heads.extend(read_heads(reader, fields, head_nodes, X, kv_name, C))
    check_biases(reader, heads, head_nodes, kv_heads)
    if kv_heads and (len({h.d_k for h in heads}) > 1 or len({h.d_v for h in heads}) > 1):
        raise reader.at(key_of(fields, "kv")).error(
            "with kv_heads every query head has the same d_k (W_Q and W_K columns) and every K/V group the "
            "same d_v (W_V columns), as the heads are stacked and the groups repeated", "kv")
    if "W_O" in fields:
        read_output(reader, fields, matrices, heads, X)
    return Layer(matrices, heads, kv_heads, loaded, X.rows, C.rows, False)


def weight_nodes(reader, root: yaml.MappingNode, fields: Fields, kv_heads: int | None) -> list[dict]:
    """Each head's weight and bias nodes, by name: from ``heads`` (with its group's ``kv``), or the
    top-level W_Q, W_K, W_V and biases of a single head."""
    if "heads" in fields:
        for name in ("W_Q", "W_K", "W_V") + BIAS_NAMES:
            if name in fields:
                own = "W_Q, W_K, W_V" if name.startswith("W") else "b_Q, b_K, b_V"
                raise reader.at(key_of(fields, name)).error(
                    f"with heads, each head gives its own {own}: move the top-level {name} into heads"
                    + (" (with kv_heads, b_K and b_V go under kv)" if kv_heads and name in ("b_K", "b_V") else ""),
                    name,
                )
        if "W_O" not in fields:
            raise reader.at(key_of(fields, "heads")).error(
                "heads need W_O, the output projection applied to the concatenated heads", "W_O"
            )
        head_nodes = reader.head_nodes(node_of(fields, "heads"), ("W_Q",) if kv_heads else ("W_Q", "W_K", "W_V"),
                                       optional=("b_Q",) if kv_heads else BIAS_NAMES)
        return reader.grouped(head_nodes, kv_heads, fields) if kv_heads else head_nodes
    if "W_O" in fields:
        raise reader.at(key_of(fields, "W_O")).error(
            "W_O projects concatenated heads: give the weights under heads "
            "(a single head is heads: [{W_Q: ..., W_K: ..., W_V: ...}])",
            "W_O",
        )
    for name in BIAS_NAMES:
        if name in fields and "W_" + name[-1] not in fields:
            raise reader.at(key_of(fields, name)).error(
                f"{name} is the bias of X·W_{name[-1]}, but W_{name[-1]} is missing", name)
    for name in ("W_Q", "W_K", "W_V"):
        if name not in fields:
            raise reader.at(root).error(
                f"{name} is missing: give X with W_Q, W_K and W_V, or give Q, K and V directly"
            )
    return [{name: fields[name] for name in ("W_Q", "W_K", "W_V") + BIAS_NAMES if name in fields}]


def read_heads(reader, fields: Fields, head_nodes: list[dict], X: Matrix, kv_name: str, C: Matrix) -> list[Head]:
    """Each head's weights and biases, with shapes that fit X (``C``: the matrix named ``kv_name``,
    X or context, that the keys and values are projected from)."""
    heads = []
    shared: dict[int, Matrix] = {}  # a K/V group's weights, read once for its heads
    for h, nodes in enumerate(head_nodes):
        prefix = f"head{h + 1}." if "heads" in fields else ""  # the head's stage ids: head1.W_Q
        kvp = nodes.get("_prefix", prefix)  # where the head's W_K and W_V are written
        w = {name: reader.shared(shared, nodes[name][1], kvp + name)
             if name != "W_Q" else reader.matrix(nodes[name][1], prefix + name) for name in ("W_Q", "W_K", "W_V")}
        rows = lambda n: f"{n} {plural(n, 'row')}"  # noqa: E731
        reader.same("X", X, "cols", prefix + "W_Q", w["W_Q"], "rows", nodes["W_Q"][0],
                    f"X·W_Q needs W_Q to have {rows(X.cols)}")
        reader.same(kv_name, C, "cols", kvp + "W_K", w["W_K"], "rows", nodes["W_K"][0],
                    f"{kv_name}·W_K needs W_K to have {rows(C.cols)}")
        reader.same(kv_name, C, "cols", kvp + "W_V", w["W_V"], "rows", nodes["W_V"][0],
                    f"{kv_name}·W_V needs W_V to have {rows(C.cols)}")
        reader.same(prefix + "W_Q", w["W_Q"], "cols", kvp + "W_K", w["W_K"], "cols",
                    nodes["W_Q"][0] if kvp != prefix else nodes["W_K"][0],
                    "Q·Kᵀ needs W_Q and W_K to have the same number of columns (d_k)")
        b = {}
        for name in BIAS_NAMES:
            if name in nodes:
                field = (prefix if name == "b_Q" else kvp) + name
                weight = "W_" + name[-1]
                b[name] = reader.shared(shared, nodes[name][1], field, lambda n, f, weight=weight: reader.bias_row(
                    n, f, w[weight].cols, weight, "X" if weight == "W_Q" else kv_name))
        heads.append(Head(w["W_Q"], w["W_K"], w["W_V"], **b))
    return heads


def check_biases(reader, heads: list[Head], head_nodes: list[dict], kv_heads: int | None) -> None:
    """A bias for every head (every K/V group with kv_heads), or for none."""
    for name in BIAS_NAMES:
        have = [h for h, head in enumerate(heads) if getattr(head, name) is not None]
        if have and len(have) != len(heads):
            h = next(h for h in range(len(heads)) if getattr(heads[h], name) is None)
            group = kv_heads and name != "b_Q"
            which = (lambda k: f"K/V group {k // (len(heads) // kv_heads) + 1}") if group else (lambda k: f"head {k + 1}")
            raise reader.at(head_nodes[h]["W_" + name[-1]][0]).error(
                f"{name} is given for {which(have[0])} but not for {which(h)}: give every "
                f"{'group' if group else 'head'} its {name}, or none", name)


def read_output(reader, fields: Fields, matrices: dict[str, Matrix], heads: list[Head], X: Matrix) -> None:
    """W_O (one row per value column of the concatenated heads) and b_O, into ``matrices``."""
    W_O = matrices["W_O"] = reader.matrix(node_of(fields, "W_O"), "W_O")
    width = sum(h.d_v for h in heads)
    if W_O.rows != width:
        parts = " + ".join(str(h.d_v) for h in heads)
        raise reader.at(key_of(fields, "W_O")).error(
            f"the concatenated heads are {X.rows}×{width} ({parts} value {plural(width, 'column')}) "
            f"but W_O is {shape_text(W_O)}: concat·W_O needs W_O to have {width} {plural(width, 'row')}",
            "W_O",
        )
    if "b_O" in fields:
        matrices["b_O"] = reader.bias_row(node_of(fields, "b_O"), "b_O", W_O.cols, "W_O", "concat")


class LayerFields:
    """The reader's part for the heads: their lists of weights, shared K/V groups and biases."""

    def same(self, a: str, ma: Matrix, a_dim: str, b: str, mb: Matrix, b_dim: str, node_b: yaml.Node, why: str) -> None:
        """Report, at ``b``, that a dimension of ``b`` does not fit ``a``."""
        if getattr(ma, a_dim) != getattr(mb, b_dim):
            raise self.at(node_b).error(f"{a} is {shape_text(ma)} but {b} is {shape_text(mb)}: {why}", b)

    def head_nodes(self, node: yaml.Node, names: tuple[str, ...] = ("W_Q", "W_K", "W_V"),
                   field: str = "heads", optional: tuple[str, ...] = ()) -> list[dict[str, tuple[yaml.Node, yaml.Node]]]:
        listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        what_one = "a head" if field == "heads" else "a K/V group"
        if not isinstance(node, yaml.SequenceNode) or not node.value:
            what = "an empty list" if isinstance(node, yaml.SequenceNode) else _yaml.kind(node)
            raise self.at(node).error(
                f"{field} is a list of {{{', '.join(names)}}} mappings, one per {what_one[2:]}, not {what}", field
            )
        out = []
        for h, item in enumerate(node.value):
            if not isinstance(item, yaml.MappingNode):
                raise self.at(item).error(f"{what_one} is a mapping with {listed}, not {_yaml.kind(item)}", item_field(field, h))
            nodes: dict[str, tuple[yaml.Node, yaml.Node]] = {}
            for k, v in item.value:
                name = getattr(k, "value", None)
                if name not in names + optional:
                    hint = ("; with kv_heads, W_K and W_V go under kv, once per group"
                            if field == "heads" and name in ("W_K", "W_V") else
                            "; with kv_heads, b_K and b_V go under kv, once per group"
                            if field == "heads" and name in ("b_K", "b_V") else "")
                    close = "" if hint else did_you_mean(str(name), names + optional, ignore_case=True)
                    raise self.at(k).error(
                        f"unknown field {excerpt(name)} in {what_one}{close}; {what_one} has {listed}{hint}",
                        item_field(field, h),
                    )
                if name in nodes:
                    raise self.at(k).error(f"{name} is given twice in this {what_one[2:]}", item_field(field, h))
                nodes[name] = (k, v)
            for name in names:
                if name not in nodes:
                    raise self.at(item).error(f"{name} is missing from this {what_one[2:]}", item_field(field, h))
            out.append(nodes)
        return out

    def shared(self, cache: dict, node: yaml.Node, field: str, read=None) -> Matrix:
        if id(node) not in cache:
            cache[id(node)] = self.matrix(node, field) if read is None else read(node, field)
        return cache[id(node)]

    def flat_row(self, node: yaml.SequenceNode, field: str, use_symbols: bool = True) -> Matrix:
        """A flat list ``[1, 2]`` (see :func:`is_flat_row`) as a 1-row matrix, its entries counted."""
        entries = node.value
        self.count(len(entries), self.at(node), field)
        m = plain_rational_matrix([entries])
        if m is None:
            m = Matrix([[self.number(e, item_field(field, j), use_symbols=use_symbols) for j, e in enumerate(entries)]])
        return m

    def bias_row(self, node: yaml.Node, field: str, width: int, weight: str, inp: str) -> Matrix:
        """A projection's bias: a flat list ``[1, 2]``, a one-row matrix ``[[1, 2]]`` or a file's
        (a 1-dimensional tensor or array is one row), with one entry per column of ``weight``."""
        if is_flat_row(node):
            m = self.flat_row(node, field)
        elif isinstance(node, yaml.SequenceNode) and not node.value:
            raise self.at(node).error("the bias is empty; it needs one entry per column of " + weight, field)
        else:
            m = self.matrix(node, field, vector=True)
            if m.rows != 1:
                raise self.at(node).error(
                    f"is {shape_text(m)}; a bias is one row, such as [1, 2] or [[1, 2]], added to every row of "
                    f"{inp}·{weight}", field)
        if m.cols != width:
            raise self.at(node).error(
                f"has {m.cols} {'entry' if m.cols == 1 else 'entries'}, {weight} has {width} "
                f"{plural(width, 'column')}: the bias adds one number to each column of {inp}·{weight}", field)
        return m

    def kv_fields(self, fields) -> int | None:
        """``kv_heads: g`` (with its ``kv:`` list of g {W_K, W_V}), checked against ``heads``; None without it."""
        if "kv" in fields and "kv_heads" not in fields:
            raise self.at(fields["kv"][0]).error(
                "kv gives the shared W_K and W_V of grouped-query attention: set kv_heads, the number of groups", "kv")
        if "kv_heads" not in fields:
            return None
        key, node = fields["kv_heads"]
        if "heads" not in fields:
            raise self.at(key).error(
                "kv_heads groups the query heads of a multi-head problem: it needs heads (and W_O)", "kv_heads")
        g = self.plain_whole(node, "kv_heads")
        if g is None or g < 1:
            raise self.at(node).error(f"kv_heads must be a whole number of at least 1, not {_yaml.kind(node)}", "kv_heads")
        heads = fields["heads"][1]
        h = len(heads.value) if isinstance(heads, yaml.SequenceNode) else 0
        if h and h % g:
            raise self.at(node).error(
                f"{h} query heads cannot share keys and values in {g} equal groups: "
                f"the number of heads must be divisible by kv_heads", "kv_heads")
        if "kv" not in fields:
            raise self.at(key).error(
                f"kv_heads: {g} needs kv, a list of {g} {{W_K, W_V}} mappings (one per K/V group)", "kv")
        return g

    def grouped(self, head_nodes: list, g: int, fields) -> list[dict]:
        """Each query head's nodes with its group's W_K and W_V (heads (k−1)·h/g + 1 … k·h/g read group k)."""
        kv_node = fields["kv"][1]
        kv = self.head_nodes(kv_node, ("W_K", "W_V"), "kv", optional=("b_K", "b_V"))
        if len(kv) != g:
            raise self.at(kv_node).error(
                f"kv_heads is {g} but kv lists {len(kv)} {plural(len(kv), 'group')}: give one {{W_K, W_V}} per group", "kv")
        size = len(head_nodes) // g
        return [{**nodes, **kv[h // size], "_prefix": f"kv item {h // size + 1}, "} for h, nodes in enumerate(head_nodes)]

