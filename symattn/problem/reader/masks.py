"""The reader's part for the ``mask:`` field (a word, ``{sliding-window: w}``, ``{padding: [...]}``,
``{valid-length: n}``, a list of these, or a 0/1 matrix), and the rule that every query keeps a
key to attend to."""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ...text import did_you_mean, excerpt
from ..masks import MASK_WORDS, Mask, mask_rule
from ..model import Matrix
from ..places import entry_field, item_field, plural


class MaskFields:
    """The mask and its parts."""

    def mask(self, node, n_q: int, n_k: int) -> Mask:
        if node is None:
            return Mask("none", mask_rule("none", n_q, n_k))
        if isinstance(node, yaml.SequenceNode) and node.value and not isinstance(node.value[0], yaml.SequenceNode):
            return self.combined_mask(node, n_q, n_k)
        if isinstance(node, yaml.MappingNode) and len(node.value) == 1 and \
                getattr(node.value[0][0], "value", None) in ("padding", "valid-length"):
            return self.key_mask(node.value[0][0], node.value[0][1], n_q, n_k, "mask")
        if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node):
            word = node.value
            if word in MASK_WORDS:
                return Mask(word, mask_rule(word, n_q, n_k))
            if word == "sliding-window":
                raise self.at(node).error("a sliding window needs its width: write {sliding-window: 2}", "mask")
            if word in ("padding", "valid-length"):
                example = "{padding: [1, 1, 1, 0]}" if word == "padding" else "{valid-length: 3}"
                raise self.at(node).error(f"{word} needs its keys: write {example}", "mask")
            raise self.at(node).error(
                f"unknown mask {excerpt(word)}{did_you_mean(word, MASK_WORDS + ('sliding-window',), ignore_case=True)}; "
                "use none, causal, causal-bottom-right, {sliding-window: w}, {padding: [1, 1, 0]}, "
                "{valid-length: n}, a list of these or a 0/1 matrix",
                "mask",
            )
        if isinstance(node, yaml.MappingNode):
            if any(getattr(k, "value", None) == "sink" for k, _ in node.value):
                return self.sink_window(node, n_q, n_k, "mask")
            if len(node.value) == 1 and node.value[0][0].value == "sliding-window":
                w_node = node.value[0][1]
                w = self.plain_whole(w_node, "mask")
                if w is not None and w >= 1:
                    return Mask("sliding-window", mask_rule("sliding-window", n_q, n_k, w), window=w)
                raise self.at(w_node).error(f"the window must be a whole number ≥ 1, not {_yaml.kind(w_node)}", "mask")
            if len(node.value) == 1 and node.value[0][0].value == "file":
                raise self.at(node).error("a mask is a word or a 0/1 matrix written in the file", "mask")
            first = node.value[0][0] if node.value else node
            raise self.at(first).error(
                f"unknown mask {_yaml.kind(first)}"
                f"{did_you_mean(getattr(first, 'value', ''), ('sliding-window', 'padding', 'valid-length'), ignore_case=True)}; "
                "the mapping forms are {sliding-window: w}, {sink: k, window: w}, {padding: [1, 1, 0]} and "
                "{valid-length: n}",
                "mask",
            )
        if isinstance(node, yaml.SequenceNode):
            rows = self.rows_of(node, "mask")
            allowed = tuple(
                tuple(self.mask_entry(entry, entry_field("mask", i, j)) for j, entry in enumerate(row))
                for i, row in enumerate(rows)
            )
            if (len(allowed), len(allowed[0])) != (n_q, n_k):
                raise self.at(node).error(
                    f"the mask is {len(allowed)}×{len(allowed[0])} but the scores are {n_q}×{n_k}", "mask"
                )
            return Mask("matrix", allowed)
        raise self.at(node).error(
            f"the mask must be none, causal, causal-bottom-right, {{sliding-window: w}} or a 0/1 matrix, not {_yaml.kind(node)}",
            "mask",
        )

    def key_mask(self, key: yaml.Node, value: yaml.Node, n_q: int, n_k: int, field: str) -> Mask:
        """``{padding: [1, 1, 0]}`` (1 = a real token, 0 = padding) or ``{valid-length: n}`` (the first
        n keys are real): which keys every query may attend to."""
        if key.value == "padding":
            field += ".padding"
            if not isinstance(value, yaml.SequenceNode) or not value.value or \
                    isinstance(value.value[0], yaml.SequenceNode):
                raise self.at(value).error(
                    f"padding is one 0/1 entry per key such as [1, 1, 1, 0] (1 = a real token, 0 = padding), "
                    f"not {_yaml.kind(value)}", field)
            keys = tuple(self.padding_entry(item, item_field(field, j)) for j, item in enumerate(value.value))
            if len(keys) != n_k:
                raise self.at(value).error(
                    f"the padding vector has {len(keys)} {'entry' if len(keys) == 1 else 'entries'} but there "
                    f"{'is' if n_k == 1 else 'are'} {n_k} {plural(n_k, 'key')}: give one 0/1 entry per key", field)
            return Mask("padding", tuple(keys for _ in range(n_q)), keys=keys)
        field += ".valid-length"
        n = self.plain_whole(value, field)
        if n is not None and 1 <= n <= n_k:
            keys = tuple(j < n for j in range(n_k))
            return Mask("valid-length", tuple(keys for _ in range(n_q)), keys=keys, valid_length=n)
        raise self.at(value).error(
            f"the valid length must be a whole number from 1 to {n_k} (the number of keys), not {_yaml.kind(value)}",
            field)

    def combined_mask(self, node: yaml.SequenceNode, n_q: int, n_k: int) -> Mask:
        """``[causal, {padding: [...]}]``: each query may attend where every part allows it."""
        parts = []
        for k, item in enumerate(node.value):
            field = item_field("mask", k)
            if isinstance(item, yaml.ScalarNode) and item.value in MASK_WORDS:
                parts.append(Mask(item.value, mask_rule(item.value, n_q, n_k)))
                continue
            if isinstance(item, yaml.MappingNode) and len(item.value) == 1:
                name = getattr(item.value[0][0], "value", None)
                if name in ("padding", "valid-length"):
                    parts.append(self.key_mask(item.value[0][0], item.value[0][1], n_q, n_k, field))
                    continue
                if name == "sliding-window":
                    parts.append(self.mask(item, n_q, n_k))
                    continue
            if isinstance(item, yaml.MappingNode) and any(getattr(k, "value", None) == "sink" for k, _ in item.value):
                parts.append(self.sink_window(item, n_q, n_k, field))
                continue
            word = getattr(item, "value", "")
            hint = did_you_mean(word, MASK_WORDS + ("padding", "valid-length", "sliding-window"), ignore_case=True) \
                if isinstance(word, str) else ""
            raise self.at(item).error(
                f"a mask in a list is causal, causal-bottom-right, none, {{sliding-window: w}}, {{padding: [...]}} "
                f"or {{valid-length: n}}, not {_yaml.kind(item)}{hint}", field)
        if len(parts) == 1:
            return parts[0]
        allowed = tuple(tuple(all(p.allowed[i][j] for p in parts) for j in range(n_k)) for i in range(n_q))
        return Mask("combined", allowed, parts=tuple(parts))

    def sink_window(self, node: yaml.MappingNode, n_q: int, n_k: int, field: str) -> Mask:
        """``{sink: k, window: w}``: StreamingLLM's mask, each query sees the first ``k`` keys (causally)
        and the ``w`` keys up to itself."""
        values = {}
        for key, value in node.value:
            name = getattr(key, "value", None)
            if name not in ("sink", "window"):
                raise self.at(key).error(
                    f"a sink-window mask has two fields, sink and window, not {_yaml.kind(key)}"
                    f"{did_you_mean(name or '', ('sink', 'window'), ignore_case=True)}", field)
            number = self.plain_whole(value, f"{field}.{name}")
            if number is None or number < 1:
                what = "sink tokens" if name == "sink" else "keys in the window (the query itself included)"
                raise self.at(value).error(
                    f"{name} is the number of {what}, a whole number ≥ 1, not {_yaml.kind(value)}", f"{field}.{name}")
            values[name] = number
        if "window" not in values:
            raise self.at(node).error("a sink-window mask needs its window too: write {sink: 4, window: 8}", field)
        sink, window = values["sink"], values["window"]
        return Mask("sink-window", mask_rule("sink-window", n_q, n_k, window, sink), window=window, sink=sink)

    def padding_entry(self, node: yaml.Node, field: str) -> bool:
        if isinstance(node, yaml.ScalarNode) and not node.style and node.value in ("0", "1"):
            return node.value == "1"
        raise self.at(node).error(f"a padding entry is 1 (a real token) or 0 (padding), not {_yaml.kind(node)}", field)

    def mask_entry(self, node: yaml.Node, field: str) -> bool:
        if _yaml.is_bool(node):
            return _yaml.bool_value(node)
        if isinstance(node, yaml.ScalarNode) and node.value in ("0", "1"):
            return node.value == "1"
        raise self.at(node).error(
            f"a mask entry is 1 (may attend) or 0 (may not), or true/false, not {_yaml.kind(node)}", field
        )

    def check_rows_attend(self, mask: Mask, bias: Matrix | None, mask_node: yaml.Node, bias_node,
                          tokens: tuple[str, ...] = ()) -> None:
        for i, row in enumerate(mask.allowed):
            if not any(
                ok and (bias is None or bias[i, j] != sympy.S.NegativeInfinity) for j, ok in enumerate(row)
            ):
                if any(row):  # the mask allows some key, the bias's -inf take the rest
                    by, field, node = "the mask and bias together leave", "bias", bias_node
                else:
                    by, field, node = "the mask leaves", "mask", mask_node
                raise self.at(node).error(
                    f"{by} row {i + 1} with no key to attend to; "
                    "its softmax would be 0/0. Allow at least one key in every row"
                    + (f" (row {i + 1} is the query {excerpt(tokens[i])})" if i < len(tokens) else ""),
                    field,
                )

