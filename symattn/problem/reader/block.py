"""The reader's part for the rest of the block and the model's head: ``mlp:``, ``logits:`` and
``loss:``.

``mlp: {norm: {...}, W_1: [[...]], b_1: [...], W_2: [[...]], b_2: [...], activation: gelu-tanh}``,
or gated (LLaMA's) ``{norm: {...}, W_gate: [[...]], W_up: [[...]], W_down: [[...]], activation:
silu}``; ``logits: {norm: {...}, W_U: [[...]] or tied: true, rows: all | last, top: 5, vocab:
[words]}``; ``loss: {targets: [ids or words]}`` or ``{targets: next}`` (each row predicts the next
token's id, as ``model(ids, labels=ids)`` does).
"""

from __future__ import annotations

import yaml

from .. import located_yaml as _yaml
from ...numbers.matrices import is_rational
from ...text import LongNumber, did_you_mean, excerpt, whole_number
from ..model import ACTIVATIONS, GATED_ACTIVATIONS, Logits, Loss, Matrix, Mlp
from ..places import item_field, plural, shape_text
from .norm import mapping_keys

PLAIN_KEYS = ("norm", "W_1", "b_1", "W_2", "b_2", "activation")
GATED_KEYS = ("norm", "W_gate", "W_up", "W_down", "activation")
LOGITS_KEYS = ("norm", "W_U", "tied", "embeddings", "rows", "top", "vocab", "from")
ACTIVATION_WHY = ("relu (max(0, x)), relu2 (max(0, x)²), gelu (x·Φ(x), with erf), gelu-tanh (GPT-2's tanh form) "
                  "or silu (x·σ(x))")
TOP_LIMIT = 50  # the most likely tokens a solution lists per row


def _mapping(reader, node: yaml.Node, field: str, keys: tuple[str, ...], usage: str) -> dict:
    """The keys of the mapping ``node`` (each known, once): name → (key node, value node)."""
    if not isinstance(node, yaml.MappingNode):
        raise reader.at(node).error(f"{field} is a mapping such as {usage}, not {_yaml.kind(node)}", field)
    return mapping_keys(reader, node, field, keys)


def _word(node: yaml.Node) -> str | None:
    return node.value if isinstance(node, yaml.ScalarNode) and not _yaml.is_null(node) and not node.style else None


class BlockFields:
    """The MLP, the logits and the loss."""

    def mlp(self, node: yaml.Node, key: yaml.Node, X: Matrix | None) -> Mlp:
        """The ``mlp:`` mapping, for a residual stream as wide as X."""
        usage = "{norm: {...}, W_1: [[...]], b_1: [...], W_2: [[...]], b_2: [...], activation: gelu-tanh}"
        if X is None:
            raise self.at(key).error("the MLP reads the residual stream X + O: give X with the weights, not Q, K and V",
                                     "mlp")
        if isinstance(node, yaml.MappingNode) and any(_word(k) in ("W_gate", "W_up", "W_down") for k, _ in node.value):
            given = _mapping(self, node, "mlp", GATED_KEYS, "{W_gate: [[...]], W_up: [[...]], W_down: [[...]], "
                                                            "activation: silu}")
            names, gated = ("W_gate", "W_up", "W_down"), True
        else:
            given = _mapping(self, node, "mlp", PLAIN_KEYS, usage)
            names, gated = ("W_1", "W_2"), False
        for name in names:
            if name not in given:
                raise self.at(node).error(f"mlp needs {name} ({usage if not gated else 'W_gate, W_up and W_down'})",
                                          f"mlp.{name}")
        activation = self.activation(given, node, gated)
        d = X.cols
        first = self.mlp_weight(given[names[0]][1], f"mlp.{names[0]}", d, None)
        d_ff = first.cols
        up = self.mlp_weight(given["W_up"][1], "mlp.W_up", d, d_ff) if gated else None
        second_name = names[-1]
        second = self.mlp_weight(given[second_name][1], f"mlp.{second_name}", d_ff, d, rows_of=names[0])
        b_1 = self.bias_row(given["b_1"][1], "mlp.b_1", d_ff, "W_1", "H") if "b_1" in given else None
        b_2 = self.bias_row(given["b_2"][1], "mlp.b_2", d, "W_2", "G") if "b_2" in given else None
        for m, name in ((first, names[0]), (up, "W_up"), (second, second_name), (b_1, "b_1"), (b_2, "b_2")):
            if m is not None and not is_rational(m) and m.free_symbols:
                raise self.at(given[name][1]).error("the MLP's weights must be plain numbers, not symbols", f"mlp.{name}")
        norm = self.norm(given["norm"][1], given["norm"][0], X, "mlp.norm") if "norm" in given else None
        return Mlp(activation, first, second, b_1, b_2, up, norm)

    def activation(self, given: dict, node: yaml.Node, gated: bool) -> str:
        if "activation" not in given:
            raise self.at(node).error(f"mlp needs activation: {ACTIVATION_WHY}", "mlp.activation")
        v = given["activation"][1]
        name = _word(v)
        allowed = GATED_ACTIVATIONS if gated else ACTIVATIONS
        if name not in allowed:
            hint = did_you_mean(str(name), allowed, ignore_case=True) if name and name not in ACTIVATIONS else ""
            what = ("a gated MLP takes silu (SwiGLU), gelu-tanh or gelu (GeGLU)" if gated and name in ACTIVATIONS
                    else f"the activations are {ACTIVATION_WHY}")
            raise self.at(v).error(f"unknown activation {excerpt(name) if name else _yaml.kind(v)}{hint}; {what}",
                                   "mlp.activation")
        return name

    def mlp_weight(self, node: yaml.Node, field: str, rows: int, cols: int | None, rows_of: str | None = None) -> Matrix:
        """An MLP weight matrix of ``rows`` rows (and ``cols`` columns when given)."""
        m = self.matrix(node, field)
        if m.rows != rows:
            what = (f"one row per column of {rows_of} (d_ff = {rows})" if rows_of else
                    f"one row per feature of the residual stream (d_model = {rows})")
            raise self.at(node).error(f"is {shape_text(m)}; {field.split('.')[-1]} needs {what}", field)
        if cols is not None and m.cols != cols:
            raise self.at(node).error(
                f"is {shape_text(m)}; it needs {cols} {plural(cols, 'column')} "
                f"({'d_model' if rows_of else 'd_ff, as W_gate has'})", field)
        return m

    def logits(self, node: yaml.Node, key: yaml.Node, X: Matrix | None, loaded_head=None) -> Logits:
        """The ``logits:`` mapping; ``loaded_head`` is what ``from: true`` read from the checkpoint
        ((norm, W_U, lens)), or None."""
        usage = "{norm: {...}, W_U: [[...]], rows: last, top: 5}"
        if X is None:
            raise self.at(key).error("the logits read the residual stream: give X with the weights, not Q, K and V",
                                     "logits")
        given = _mapping(self, node, "logits", LOGITS_KEYS, usage)
        d = X.cols
        last = self.logit_rows(given)
        top = self.plain_whole(given["top"][1], "logits.top") if "top" in given else 5
        if top is None or not 1 <= top <= TOP_LIMIT:
            raise self.at(given["top"][1]).error(f"top is a whole number from 1 to {TOP_LIMIT}: how many of the likeliest "
                                                 "tokens the solution lists", "logits.top")
        from_checkpoint = "from" in given and _yaml.is_bool(given["from"][1]) and _yaml.bool_value(given["from"][1])
        if "from" in given and not (_yaml.is_bool(given["from"][1])):
            raise self.at(given["from"][1]).error("from is true (the final norm and the unembedding from the checkpoint "
                                                  "of from:) or false", "logits.from")
        if from_checkpoint:
            for name in ("norm", "W_U", "tied", "embeddings"):
                if name in given:
                    raise self.at(given[name][0]).error(f"logits: {{from: true}} takes the {name} from the checkpoint: "
                                                        f"remove {name} or from", f"logits.{name}")
            if loaded_head is None:
                raise self.at(given["from"][0]).error("logits: {from: true} reads the checkpoint of from: {file, layout, "
                                                      "...}, which this problem does not have", "logits.from")
            norm, W_U, lens, tied = loaded_head
        else:
            norm = self.norm(given["norm"][1], given["norm"][0], X, "logits.norm") if "norm" in given else None
            W_U, tied = self.unembedding(given, node, d), "tied" in given
            lens = False
        vocab = self.vocab(given["vocab"][1], W_U.cols) if "vocab" in given else ()
        return Logits(W_U, norm, last, top, tied, vocab, lens)

    def logit_rows(self, given: dict) -> bool:
        if "rows" not in given:
            return False
        v = given["rows"][1]
        name = _word(v)
        if name not in ("all", "last"):
            raise self.at(v).error(f"rows is all (every position's logits) or last (the last position's only), not "
                                   f"{excerpt(name) if name else _yaml.kind(v)}", "logits.rows")
        return name == "last"

    def unembedding(self, given: dict, node: yaml.Node, d: int) -> Matrix:
        """W_U (d_model × vocabulary), or with ``tied: true`` the embedding table transposed."""
        tied = "tied" in given and _yaml.is_bool(given["tied"][1]) and _yaml.bool_value(given["tied"][1])
        if "tied" in given and not _yaml.is_bool(given["tied"][1]):
            raise self.at(given["tied"][1]).error("tied is true (W_U is the embedding table, transposed) or false",
                                                  "logits.tied")
        if "W_U" in given and tied:
            raise self.at(given["tied"][0]).error("give W_U or tied: true, not both", "logits.tied")
        if "W_U" in given:
            W_U = self.matrix(given["W_U"][1], "logits.W_U")
            if W_U.rows != d:
                raise self.at(given["W_U"][1]).error(
                    f"is {shape_text(W_U)}; W_U needs one row per feature of the residual stream (d_model = {d}) and "
                    "one column per word of the vocabulary", "logits.W_U")
        elif tied:
            W_U = self.tied_table(given, d)
        else:
            raise self.at(node).error("logits needs W_U: [[...]] (d_model × vocabulary) or tied: true (the embedding "
                                      "table, transposed)", "logits.W_U")
        if not is_rational(W_U) and W_U.free_symbols:
            raise self.at(given.get("W_U", given.get("embeddings", (node, node)))[1]).error(
                "the unembedding must be plain numbers, not symbols", "logits.W_U")
        return W_U

    def tied_table(self, given: dict, d: int) -> Matrix:
        """The embedding table (vocabulary × d_model) a tied unembedding transposes: ``embeddings:``,
        or the table X's rows were looked up in."""
        if "embeddings" in given:
            table = self.matrix(given["embeddings"][1], "logits.embeddings")
            where_ = given["embeddings"][1]
        elif "X" in self.tables:
            table, where_ = self.read_table(*self.tables["X"]), given["tied"][1]
        else:
            raise self.at(given["tied"][0]).error(
                "tied: true needs an embedding table: give X as {file, embeddings: TABLE, tokens: [...]}, or the "
                "table itself as embeddings: [[...]] (one row per word), or W_U", "logits.tied")
        if table.cols != d:
            raise self.at(where_).error(f"the embedding table is {shape_text(table)}; it needs d_model = {d} "
                                        f"{plural(d, 'column')}, one row per word", "logits.embeddings")
        return table.T

    def vocab(self, node: yaml.Node, size: int) -> tuple[str, ...]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(f"vocab is a list of words, one per column of W_U, not {_yaml.kind(node)}",
                                      "logits.vocab")
        if len(node.value) != size:
            raise self.at(node).error(f"vocab has {len(node.value)} {plural(len(node.value), 'word')}, but the "
                                      f"vocabulary has {size} (the columns of W_U)", "logits.vocab")
        words = []
        for j, item in enumerate(node.value):
            if not isinstance(item, yaml.ScalarNode) or _yaml.is_null(item) or not item.value.strip():
                raise self.at(item).error(f"a word must be text, not {_yaml.kind(item)}", item_field("logits.vocab", j))
            words.append(item.value.strip())
        return tuple(words)

    def loss(self, node: yaml.Node, key: yaml.Node, logits: Logits | None, n: int, ids: list[int] | None) -> Loss:
        """``loss: {targets: [...]}`` (one per row of the logits) or ``{targets: next}``."""
        if logits is None:
            raise self.at(key).error("the loss is the cross-entropy of the logits: give logits: {...} too", "loss")
        given = _mapping(self, node, "loss", ("targets",), "{targets: [3797, 3332, 866]}")
        if "targets" not in given:
            raise self.at(node).error("loss needs targets: one vocabulary id per row of the logits, or next", "loss.targets")
        v = given["targets"][1]
        rows = 1 if logits.last else n
        if _word(v) == "next":
            if ids is None:
                raise self.at(v).error("targets: next takes each token's next id: give X as rows of an embedding table "
                                       "by token ids ({file, embeddings: TABLE, tokens: [...]})", "loss.targets")
            if logits.last or n < 2:
                raise self.at(v).error("targets: next needs the logits of every row (rows: all) and 2 tokens or more: "
                                       "row i predicts token i + 1, the last row has none", "loss.targets")
            return Loss(tuple(ids[1:]), tuple(range(n - 1)))
        if not isinstance(v, yaml.SequenceNode):
            raise self.at(v).error(f"targets is a list of vocabulary ids (or words of vocab), one per row, or next, "
                                   f"not {_yaml.kind(v)}", "loss.targets")
        if len(v.value) != rows:
            raise self.at(v).error(f"targets has {len(v.value)} {plural(len(v.value), 'id')}, but the logits have "
                                   f"{rows} {plural(rows, 'row')}: one target per row", "loss.targets")
        targets = [self.target(item, item_field("loss.targets", i), logits) for i, item in enumerate(v.value)]
        return Loss(tuple(targets), tuple(range(rows)))

    def target(self, item: yaml.Node, field: str, logits: Logits) -> int:
        text = item.value.strip() if isinstance(item, yaml.ScalarNode) and not _yaml.is_null(item) else None
        if text is not None and text in logits.vocab and (item.style or not text.isdigit()):
            return logits.vocab.index(text)  # a word of vocab (a quoted one, or one that is not an id)
        try:
            t = whole_number(item.value) if isinstance(item, yaml.ScalarNode) and not item.style else None
        except LongNumber as exc:
            raise self.at(item).error(str(exc), field) from None
        if t is None:
            words = " or a word of vocab" if logits.vocab else ""
            raise self.at(item).error(f"a target is a vocabulary id (a whole number ≥ 0, counted from 0){words}, not "
                                      f"{_yaml.kind(item)}", field)
        if t >= logits.size:
            raise self.at(item).error(f"target id {t} is out of range: the vocabulary has {logits.size} "
                                      f"{plural(logits.size, 'word')}, ids 0 to {logits.size - 1}", field)
        return t
