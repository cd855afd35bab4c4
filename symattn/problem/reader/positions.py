"""The reader's part for ``positions:``: sinusoidal encodings (``sinusoidal`` or
``{sinusoidal: {base: b}}``), or a matrix of learned positions (GPT-2's ``wpe``)."""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ...numbers.matrices import is_rational
from ...numbers.parse import is_positive
from ...text import did_you_mean
from ..model import SINUSOIDAL_BASE, Matrix, Positions, sinusoidal_encoding
from ..places import shape_text


class PositionFields:
    """The positional encodings added to X."""

    def positions(self, node: yaml.Node, key: yaml.Node, X: Matrix | None) -> Positions:
        """``positions: sinusoidal``, ``{sinusoidal: {base: b}}`` or a matrix of learned positions."""
        usage = "use sinusoidal, {sinusoidal: {base: 100}} or a matrix of learned positions [[...], ...]"
        if X is None:
            raise self.at(key).error("positions are added to X: give X with the weights, not Q, K and V", "positions")
        n, d = X.rows, X.cols
        if isinstance(node, yaml.SequenceNode) or (
                isinstance(node, yaml.MappingNode) and any(getattr(k, "value", None) == "file" for k, _ in node.value)):
            # a table of a checkpoint gives its first n rows: GPT-2's wpe has one per position up to 1024
            m = self.matrix_file(node, "positions", first_rows=n) if isinstance(node, yaml.MappingNode) \
                else self.matrix(node, "positions")
            if m.shape != (n, d):
                raise self.at(node).error(
                    f"the learned positions are {shape_text(m)} but X is {shape_text(X)}: give one row of d_model = {d} "
                    f"{'entry' if d == 1 else 'entries'} per token", "positions")
            if not is_rational(m) and m.free_symbols:  # (free_symbols would make a SymPy number of each entry)
                raise self.at(node).error("the learned positions must be plain numbers, not symbols", "positions")
            return Positions("learned", m)
        base = sympy.Integer(SINUSOIDAL_BASE)
        if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node) and node.value == "sinusoidal":
            return Positions("sinusoidal", sinusoidal_encoding(n, d, base), base)
        if isinstance(node, yaml.MappingNode) and len(node.value) == 1 and \
                getattr(node.value[0][0], "value", None) == "sinusoidal":
            options = node.value[0][1]
            if isinstance(options, yaml.MappingNode):
                for k, v in options.value:
                    if getattr(k, "value", None) != "base":
                        raise self.at(k).error(
                            f"unknown option {_yaml.kind(k)} of sinusoidal positions{did_you_mean(str(getattr(k, 'value', '')), ('base',), ignore_case=True)}; "
                            "the option is base", "positions.sinusoidal")
                    base = self.number(v, "positions.sinusoidal.base", use_symbols=False)
                    if not is_positive(base):
                        raise self.at(v).error(f"the base must be positive, not {v.value}", "positions.sinusoidal.base")
            elif not _yaml.is_null(options):
                raise self.at(options).error(
                    f"the options of sinusoidal positions are a mapping such as {{base: 100}}, not {_yaml.kind(options)}",
                    "positions.sinusoidal")
            return Positions("sinusoidal", sinusoidal_encoding(n, d, base), base)
        what = node.value if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node) else None
        if what is None and isinstance(node, yaml.MappingNode) and node.value:
            what = getattr(node.value[0][0], "value", None)
        hint = did_you_mean(what, ("sinusoidal",), ignore_case=True) if isinstance(what, str) else ""
        shown = repr(what) if isinstance(what, str) else _yaml.kind(node)
        raise self.at(node if not isinstance(node, yaml.MappingNode) or not node.value else node.value[0][0]).error(
            f"unknown positions {shown}{hint}; {usage}", "positions")


    def token_types(self, node: yaml.Node, key: yaml.Node, X: Matrix | None, positions: Positions | None) -> Matrix:
        """BERT's token-type rows, one per token: ``{file, embeddings: TABLE, tokens: [type ids]}`` (rows of
        the model's token-type table) or a matrix of n rows."""
        if X is None:
            raise self.at(key).error("token types are added to X: give X with the weights, not Q, K and V",
                                     "token_types")
        if positions is None:
            raise self.at(key).error("token types are added with the positions, as BERT adds both: give positions "
                                     "too", "token_types")
        n, d = X.rows, X.cols
        if isinstance(node, yaml.MappingNode):
            names = [getattr(k, "value", None) for k, _ in node.value]
            if "file" in names and "embeddings" not in names:
                raise self.at(node).error(
                    "token types are rows of the model's token-type table: {file: model.safetensors, embeddings: "
                    "\"embeddings.token_type_embeddings.weight\", tokens: [0, 0, 1]} (each token's type id)",
                    "token_types")
        m = self.matrix(node, "token_types")
        if m.shape != (n, d):
            raise self.at(node).error(
                f"the token types are {shape_text(m)} but X is {shape_text(X)}: give one row of d_model = {d} "
                f"{'entry' if d == 1 else 'entries'} per token (one type id per token)", "token_types")
        if not is_rational(m) and m.free_symbols:
            raise self.at(node).error("the token types must be plain numbers, not symbols", "token_types")
        return m
