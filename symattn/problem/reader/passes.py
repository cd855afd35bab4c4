"""The reader's part for the fields of the further passes: ``backward:`` (the loss or dL/dO),
``tiling:`` (the online softmax's blocks) and ``decode:`` (a token from the KV cache)."""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..masks import Mask
from ..model import CROSS_ENTROPY, Backward, Matrix, Tiling
from ..passes import decode_problem
from ..places import item_field, shape_text


class PassFields:
    """The backward, tiling and decode fields."""

    def backward(self, node: yaml.Node, n_q: int, d_out: int, residual: bool = False) -> Backward:
        """The ``backward:`` section: ``dO: [[...]]`` (``dH: [[...]]`` with the residual, whose loss is
        on H) or ``loss: sum | {weights: ...} | {target: ...}``."""
        given = "dH" if residual else "dO"
        usage = (f"backward: needs {given}: [[...]] (dL/d{given[1]}) or loss: sum, loss: {{weights: [[...]]}}, "
                 "loss: {target: [[...]]} or loss: cross-entropy")
        if not isinstance(node, yaml.MappingNode) or len(node.value) != 1:
            raise self.at(node).error(usage, "backward")
        key, value = node.value[0]
        name = key.value if isinstance(key, yaml.ScalarNode) else None
        if name == given:
            field = f"backward.{given}"
            return Backward("dO", self.sized(self.matrix(value, field), value, field, n_q, d_out))
        if name in ("dO", "dH"):
            if residual:
                why = "with the residual the loss is on the block's output H: give dH: [[...]], dL/dH (dO follows from it)"
            else:
                why = "dH is the gradient of the residual stream, which this problem does not have: give dO: [[...]]"
            raise self.at(key).error(why, "backward")
        if name != "loss":
            hint = did_you_mean(str(name), (given, "loss"), ignore_case=True)
            raise self.at(key).error(f"unknown entry {excerpt(name)} in backward{hint}; {usage}", "backward")
        if isinstance(value, yaml.ScalarNode) and value.value in ("sum", CROSS_ENTROPY):
            return Backward(value.value)
        if isinstance(value, yaml.MappingNode) and len(value.value) == 1:
            kind_node, matrix_node = value.value[0]
            kind = kind_node.value if isinstance(kind_node, yaml.ScalarNode) else None
            if kind in ("weights", "target"):
                field = f"backward.loss.{kind}"
                return Backward(kind, self.sized(self.matrix(matrix_node, field), matrix_node, field, n_q, d_out))
            hint = did_you_mean(str(kind), ("weights", "target"), ignore_case=True)
            raise self.at(kind_node).error(
                f"unknown loss {excerpt(kind)}{hint}; write loss: sum, loss: {{weights: [[...]]}}, loss: {{target: [[...]]}} "
                "or loss: cross-entropy",
                "backward.loss",
            )
        hint = did_you_mean(str(value.value), ("sum", CROSS_ENTROPY), ignore_case=True) \
            if isinstance(value, yaml.ScalarNode) else ""
        raise self.at(value).error(
            f"loss must be sum, {{weights: [[...]]}}, {{target: [[...]]}} or cross-entropy, not {_yaml.kind(value)}{hint}",
            "backward.loss",
        )

    def tiling(self, node: yaml.Node, n_q: int) -> Tiling:
        """The ``tiling:`` section: ``{block: B}``, optionally ``rows: [...]`` (1-based query rows)."""
        usage = "tiling: needs block: B (the keys per block, a whole number ≥ 1), optionally rows: [1, 3]"
        if not isinstance(node, yaml.MappingNode):
            raise self.at(node).error(f"{usage}, not {_yaml.kind(node)}", "tiling")
        entries: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name not in ("block", "rows"):
                hint = did_you_mean(str(name), ("block", "rows"), ignore_case=True)
                raise self.at(key).error(f"unknown entry {_yaml.kind(key)} in tiling{hint}; {usage}", "tiling")
            if name in entries:
                raise self.at(key).error(f"{name} is given twice", "tiling")
            entries[name] = (key, value)
        if "block" not in entries:
            raise self.at(node).error(usage, "tiling")
        block = self.whole(entries["block"][1], "tiling.block", "the block size")
        rows = None
        if "rows" in entries:
            rows_node = entries["rows"][1]
            if not isinstance(rows_node, yaml.SequenceNode) or not rows_node.value:
                raise self.at(rows_node).error(
                    f"rows is a list of query rows counted from 1, such as [1, 3], not {_yaml.kind(rows_node)}",
                    "tiling.rows")
            picked: list[int] = []
            for i, item in enumerate(rows_node.value):
                field = item_field("tiling.rows", i)
                row = self.whole(item, field, "a query row")
                if row > n_q:
                    raise self.at(item).error(
                        f"row {row} is out of range: the problem has {n_q} {'query' if n_q == 1 else 'queries'} "
                        f"(rows 1 to {n_q})", field)
                if row - 1 in picked:
                    raise self.at(item).error(f"row {row} is given twice", field)
                picked.append(row - 1)
            rows = tuple(picked)
        return Tiling(block, rows)

    def sized(self, m: Matrix, node: yaml.Node, field: str, n_q: int, d_out: int) -> Matrix:
        """``m``, checked to have the output's shape."""
        if m.shape != (n_q, d_out):
            raise self.at(node).error(
                f"{field.rsplit('.', 1)[-1]} is {shape_text(m)} but the output O is {n_q}×{d_out}: "
                "it needs one entry per output entry",
                field,
            )
        return m

    def decode(self, node: yaml.Node, n: int, mask: "Mask", cross: bool, bias: bool) -> int:
        """``decode: t``: the token (1-based) whose row is decoded from the KV cache."""
        t = self.plain_whole(node, "decode")
        if t is None:
            raise self.at(node).error(f"decode must be a token number from 1 to {n}, not {_yaml.kind(node)}", "decode")
        problem = decode_problem(t, n, mask, cross, bias)
        if problem:
            raise self.at(node).error(problem, "decode")
        return t

