"""The problem reader: a problem file's YAML, field by field, into a
:class:`~symattn.problem.model.Problem`.

:class:`Reader` holds what reading one file keeps (its name and folder, the numbers read so far
against the size limit, the declared symbols); each family of fields is read by its own part
(:mod:`.scalars`, :mod:`.matrices`, :mod:`.layer`, :mod:`.masks`, :mod:`.positions`,
:mod:`.passes`, :mod:`.rope`, and :mod:`symattn.problem.checkpoints` for ``from:``), and the rules
between families are the functions below.
"""

from __future__ import annotations

from pathlib import Path

import sympy
import yaml

from .. import located_yaml as _yaml
from ...errors import SymattnError
from ..budget import MAX_SIZE, max_values
from ..located_yaml import Where, where
from ..masks import Mask, mask_rule
from ..model import NO_EMBEDDINGS_BACKWARD, block_backward_refusal, Matrix, Problem
from ..places import shape_text
from .fields import Fields, key_of, node_of, read_fields
from .block import BlockFields
from .layer import Layer, LayerFields, read_layer
from .masks import MaskFields
from .matrices import MatrixFields
from .norm import NormFields
from .passes import PassFields
from .positions import PositionFields
from .scalars import ScalarFields
from .sinks import read_sinks
from .qk_norm import read_qk_norm
from .scores import read_scores


class Reader(ScalarFields, MatrixFields, LayerFields, MaskFields, PositionFields, PassFields, NormFields, BlockFields):
    """Reads one problem file: ``Reader(file, base_dir, max_size).read(text)``."""

    def __init__(self, file: str, base_dir: Path | None, max_size: int = MAX_SIZE) -> None:
        self.file = file
        self.base_dir = base_dir
        self.max_size = max_size
        self.size = 0  # numbers read so far
        self.symbols: dict[str, sympy.Symbol] = {}
        self.read_numbers: dict[tuple[str, bool], sympy.Expr] = {}  # entries read so far, by text
        self.token_ids: dict[str, list[int]] = {}  # X or context looked up in an embedding table: the ids
        self.tables: dict[str, tuple] = {}  # ... and the table: (path, name as written, tensor, where)

    def read(self, text: str) -> Problem:
        if "\x00" in text:
            raise SymattnError("the file holds a NUL byte; it is not a text file", file=self.file)
        root = _yaml.compose(text, self.file, max_values=max_values(self.max_size))
        if root is None or _yaml.is_null(root):
            raise SymattnError("the file is empty; a problem needs at least X and the weights, or Q, K and V", file=self.file)
        _yaml.check_tags(root, self.file)
        if not isinstance(root, yaml.MappingNode):
            raise self.at(root).error(
                f"a problem file is a mapping of fields (X:, W_Q:, ...), not {_yaml.kind(root)}"
            )
        return self.build(root, read_fields(self, root))

    def at(self, node: yaml.Node) -> Where:
        return where(self.file, node)

    def build(self, root: yaml.MappingNode, fields: Fields) -> Problem:
        self.symbols = self.read_symbols(node_of(fields, "symbols"))
        values = self.read_values(node_of(fields, "values"))
        mla = None
        if "mla" in fields:
            from .mla import read_mla

            layer, mla = read_mla(self, root, fields)
        else:
            layer = read_layer(self, root, fields)
        tokens, key_tokens = read_labels(self, fields, layer)
        mask, bias = read_mask_and_bias(self, root, fields, layer, tokens)
        passes = read_passes(self, fields, layer, mask, bias)
        loaded = layer.loaded
        _refuse_together(self, fields)
        if "linear" in fields:
            from .linear import read_linear

            passes["linear"], mask = read_linear(self, fields, layer.n_q, layer.n_k, mask, loaded)
        if "differential" in fields:
            from .differential import read_differential

            passes["differential"] = read_differential(self, fields, layer)
        return Problem(
            source=self.file,
            title=self.title(node_of(fields, "title")),
            tokens=tokens,
            key_tokens=key_tokens,
            mask=mask,
            scale=loaded.scale if loaded is not None and loaded.scale is not None else self.scale(node_of(fields, "scale")),
            digits=self.digits(node_of(fields, "digits")),
            bias=bias,
            heads=tuple(layer.heads),
            multi_head="heads" in fields or mla is not None or (loaded is not None and loaded.multi),
            symbols=tuple(self.symbols.values()),
            values=tuple(values.items()),
            kv_heads=layer.kv_heads,
            **read_scores(self, fields, passes),
            qk_norm=read_qk_norm(self, fields, layer, passes, bool(self.symbols)),
            **passes,
            **layer.matrices,
            **({"mla": mla} if mla is not None else {}),
        )


def read_labels(reader: Reader, fields: Fields, layer: Layer) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The labels of the queries' rows and of the keys' rows (the queries' own in self-attention)."""
    if "context_tokens" in fields and "context" not in fields:
        raise reader.at(key_of(fields, "context_tokens")).error(
            "context_tokens label the rows of context, which is not given")
    n_q, n_k = layer.n_q, layer.n_k
    tokens = reader.labels(node_of(fields, "tokens"), "tokens", n_q, "X" if not layer.direct else "Q", "t",
                           reader.token_ids.get("X"))
    if "context" in fields:
        key_tokens = reader.labels(node_of(fields, "context_tokens"), "context_tokens", n_k, "context", "c",
                                   reader.token_ids.get("context"))
    elif layer.direct and n_k != n_q:
        key_tokens = tuple(f"k_{j + 1}" for j in range(n_k))
    else:
        key_tokens = tokens
    return tokens, key_tokens


def read_mask_and_bias(reader: Reader, root: yaml.MappingNode, fields: Fields, layer: Layer,
                       tokens: tuple[str, ...]) -> tuple[Mask, Matrix | None]:
    """The mask (the checkpoint layout's when ``from:`` gives one and the problem none) and the
    bias, which together must leave every query a key to attend to."""
    n_q, n_k, loaded = layer.n_q, layer.n_k, layer.loaded
    mask = reader.mask(node_of(fields, "mask"), n_q, n_k) if loaded is None or "mask" in fields else \
        Mask(loaded.mask, mask_rule(loaded.mask, n_q, n_k, loaded.window), window=loaded.window)
    bias = None
    if "bias" in fields:
        bias = reader.matrix(node_of(fields, "bias"), "bias", allow_neg_inf=True)
        if bias.shape != (n_q, n_k):
            raise reader.at(node_of(fields, "bias")).error(
                f"bias is {shape_text(bias)} but the scores are {n_q}×{n_k}: bias needs one entry per query and key",
                "bias",
            )
    reader.check_rows_attend(mask, bias, node_of(fields, "mask") or root, node_of(fields, "bias"), tokens)
    return mask, bias


def read_passes(reader: Reader, fields: Fields, layer: Layer, mask: Mask, bias: Matrix | None) -> dict:
    """The fields around the attention itself: positions, backward, rope, tiling and decode, each
    checked against the layer and the others."""
    matrices, heads, n_q, n_k = layer.matrices, layer.heads, layer.n_q, layer.n_k
    positions = reader.positions(node_of(fields, "positions"), key_of(fields, "positions"), matrices.get("X")) \
        if "positions" in fields else None
    d_out = matrices["W_O"].cols if "W_O" in matrices else (heads[0].d_v if heads else matrices["V"].cols)
    embedded = read_embeddings(reader, fields, layer, positions)
    positions = embedded["positions"]
    norm, residual = read_norm(reader, fields, layer, embedded, d_out)
    block = read_block(reader, fields, layer)
    backward = reader.backward(node_of(fields, "backward"), n_q, d_out, residual) if "backward" in fields else None
    if backward is not None and embedded["embeddings_norm"] is not None:
        raise reader.at(key_of(fields, "backward")).error(NO_EMBEDDINGS_BACKWARD, "backward")
    refusal = backward and block_backward_refusal(backward, block["mlp"], block["logits"], block["loss"])
    if refusal:
        raise reader.at(key_of(fields, "backward")).error(refusal, "backward")
    rope = None
    if "rope" in fields:
        from .rope import read_rope

        d_ks = [h.d_k for h in heads] if heads else [matrices["Q"].cols]
        rope = read_rope(reader, key_of(fields, "rope"), node_of(fields, "rope"), d_ks, n_q, n_k,
                         multi="heads" in fields, cross="context" in fields)
    elif layer.loaded is not None:
        rope = layer.loaded.rope
    tiling = reader.tiling(node_of(fields, "tiling"), n_q) if "tiling" in fields else None
    if tiling is not None and reader.symbols:
        raise reader.at(key_of(fields, "tiling")).error(
            "the tiled softmax needs numbers: the running maximum of scores with symbols cannot be decided; "
            "remove symbols or tiling", "tiling")
    decode = None
    if "decode" in fields:
        decode = reader.decode(node_of(fields, "decode"), n_q, mask, "context" in fields, bias is not None)
    sinks = read_sinks(reader, fields, len(heads) or 1,
                       {"tiling": tiling is not None, "backward": backward is not None})
    return {"backward": backward, "rope": rope, "tiling": tiling, "decode": decode, "sinks": sinks, "norm": norm,
            "residual": residual, **embedded, **block}


def read_block(reader: Reader, fields: Fields, layer: Layer) -> dict:
    """The rest of the block and the model's head: the MLP, the logits and the loss (the residual
    stream they read is implied, and checked by :func:`read_norm`)."""
    X, loaded = layer.matrices.get("X"), layer.loaded
    mlp = getattr(loaded, "mlp", None)
    for name in ("mlp", "logits"):
        if name in fields and reader.symbols:
            raise reader.at(key_of(fields, name)).error(
                f"the {'MLP needs' if name == 'mlp' else 'logits need'} numbers: an activation's sign and the likeliest "
                "words of symbols are not decided (remove symbols)", name)
    if "mlp" in fields:
        if mlp is not None:
            raise reader.at(key_of(fields, "mlp")).error(
                "from: {block: true} takes the MLP from the checkpoint: remove mlp or from's block", "mlp")
        mlp = reader.mlp(node_of(fields, "mlp"), key_of(fields, "mlp"), X)
    logits = reader.logits(node_of(fields, "logits"), key_of(fields, "logits"), X, getattr(loaded, "head", None)) \
        if "logits" in fields else None
    loss = reader.loss(node_of(fields, "loss"), key_of(fields, "loss"), logits, layer.n_q, reader.token_ids.get("X")) \
        if "loss" in fields else None
    return {"mlp": mlp, "logits": logits, "loss": loss}


def read_embeddings(reader: Reader, fields: Fields, layer: Layer, positions) -> dict:
    """What the model adds to the embedding rows before the layer: the positions, BERT's token types
    and the embeddings' own norm, from the problem or from ``from: {embeddings: true}``."""
    X, loaded = layer.matrices.get("X"), layer.loaded
    if loaded is not None and loaded.embedded is not None:
        for name in ("positions", "token_types", "embeddings_norm"):
            if name in fields:
                raise reader.at(key_of(fields, name)).error(
                    f"from: {{embeddings: true}} takes the {name.replace('_', ' ')} from the checkpoint: remove "
                    f"{name} or from's embeddings", name)
        positions, token_types, type_ids, emb_norm = loaded.embedded
    else:
        token_types = reader.token_types(node_of(fields, "token_types"), key_of(fields, "token_types"), X,
                                         positions) if "token_types" in fields else None
        type_ids = tuple(reader.token_ids.get("token_types", ()))
        emb_norm = reader.norm(node_of(fields, "embeddings_norm"), key_of(fields, "embeddings_norm"), X,
                               "embeddings_norm") if "embeddings_norm" in fields else None
    if emb_norm is not None:
        check_norm_rows(reader, fields, emb_norm, X, positions, token_types, "embeddings_norm")
    return {"positions": positions, "token_types": token_types, "token_type_ids": type_ids,
            "embeddings_norm": emb_norm}


def read_norm(reader: Reader, fields: Fields, layer: Layer, embedded: dict, d_out: int):
    """The norm (the problem's, or the one ``from: {norm: true}`` read) and whether H = X + O is
    derived, checked against the layer: a plain-number X, a residual as wide as X, no row that
    the norm would divide by 0."""
    loaded = layer.loaded
    norm = reader.norm(node_of(fields, "norm"), key_of(fields, "norm"), layer.matrices.get("X")) \
        if "norm" in fields else None
    if loaded is not None and loaded.norm is not None:
        if norm is not None:
            raise reader.at(key_of(fields, "norm")).error(
                "from: {norm: true} takes the layer's norm from the checkpoint: remove norm or from's norm", "norm")
        norm = loaded.norm
    if loaded is not None and norm is not None and norm.post != (loaded.layout == "bert"):
        why = ("bert layers normalise after the residual sum (post-norm): give place: post" if loaded.layout == "bert"
               else f"{loaded.layout} layers normalise before the attention (pre-norm); place: post is BERT's order")
        raise reader.at(key_of(fields, "norm")).error(why, "norm.place")
    residual = reader.residual(node_of(fields, "residual")) if "residual" in fields else \
        bool(loaded is not None and loaded.residual)
    where_ = key_of(fields, "residual") if "residual" in fields else key_of(fields, "norm") if "norm" in fields \
        else next((key_of(fields, f) for f in ("mlp", "logits", "from") if f in fields), None)
    reads = next((f for f in ("mlp", "logits") if f in fields), "block" if getattr(loaded, "mlp", None) else None)
    if reads is not None:  # the MLP and the logits read the residual stream
        if "residual" in fields and not residual:
            raise reader.at(where_).error(f"the {'logits read' if reads == 'logits' else 'MLP reads'} the residual stream "
                                          f"H = X + O: remove residual: false", "residual")
        residual = True
    if norm is not None and norm.post:
        if "residual" in fields and not residual:
            raise reader.at(where_).error("a post norm normalises X + the attention's output: the residual is part of "
                                          "it (remove residual: false, or use place: pre)", "residual")
        residual = True
    X = layer.matrices.get("X")
    if residual:
        if X is None:
            raise reader.at(where_).error("the residual adds the attention's output to its input X: give X with the "
                                          "weights, not Q, K and V", "residual")
        if d_out != X.cols:
            what = "concat·W_O" if "W_O" in layer.matrices else "each row of O = A·V (d_v)"
            raise reader.at(where_).error(
                f"the residual H = X + O needs O as wide as X: {what} has {d_out} "
                f"{'column' if d_out == 1 else 'columns'}, X has d_model = {X.cols}", "residual")
        if loaded is not None and loaded.partial:
            raise reader.at(where_).error(
                "the residual stream adds the whole layer's output, the sum over every head: give from: {heads: all} "
                "(a part of the heads is not what the model adds)", "residual")
    if norm is not None and embedded["embeddings_norm"] is not None and not norm.post and norm.eps == 0:
        raise reader.at(key_of(fields, "norm")).error(
            "with the embeddings' norm in front, the layer's norm needs eps > 0: its input rows are normalised "
            "already, and whether one is constant is not decided", "norm.eps")
    if norm is not None:
        check_norm_rows(reader, fields, norm, X, embedded["positions"], embedded["token_types"])
    return norm, residual


def check_norm_rows(reader: Reader, fields: Fields, norm, X: Matrix, positions, token_types=None,
                    field: str = "norm") -> None:
    """The norm's input holds plain numbers, and with ε = 0 no row of it has variance (or mean square) 0."""
    from ...numbers.matrices import is_rational

    if not is_rational(X) and X.free_symbols:
        raise reader.at(key_of(fields, field if field in fields else "from")).error(
            "the norm needs plain numbers: X holds symbols, whose mean and variance have no exact root "
            "to divide by (give numbers, or leave out the norm)", field)
    if norm.eps != 0 or norm.post:
        return
    inp = X if positions is None else X + positions.matrix
    if token_types is not None:
        inp = inp + token_types
    for i in range(inp.rows):
        row = [inp[i, j] for j in range(inp.cols)]
        if not all(x.is_Rational for x in row):
            # a row with a sine or cosine of a nonzero rational (sinusoidal positions p ≥ 1) holds
            # transcendental entries whose differences are too: never all equal, never all 0
            continue
        mean = sympy.Add(*row) / len(row)
        if all(x == mean if not norm.rms else x == 0 for x in row):
            what = "every entry is 0" if norm.rms else "its entries are all equal (variance 0)"
            raise reader.at(key_of(fields, field)).error(
                f"row {i + 1} of {'X + PE + TT' if token_types is not None else 'X + PE' if positions is not None else 'X'}: "
                f"{what}, and eps is 0, so the norm would divide by 0: give eps > 0", field + ".eps")


# fields whose arithmetic symattn has not put together yet: the second is refused beside the first
_NOT_TOGETHER = (("sink", "softcap"), ("sink", "temperature"), ("linear", "softcap"), ("linear", "temperature"),
                 ("linear", "qk_norm"), ("linear", "sink"))


def _refuse_together(reader: Reader, fields: Fields) -> None:
    """One line naming the second of two fields symattn does not derive together."""
    for first, second in _NOT_TOGETHER:
        if first in fields and second in fields:
            raise reader.at(key_of(fields, second)).error(
                f"{second} beside {first} is not derived yet: give one of them", second)
