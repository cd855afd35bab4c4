"""The reader's part for ``norm:`` and ``residual:``: the layer normalisation in front of the
attention (or behind it, BERT's ``place: post``) and the residual stream H = X + the attention's
output.

``norm: {type: layernorm, weight: [...], bias: [...], eps: 1e-5}``, ``{type: rmsnorm, weight:
[...], eps: 1e-6, offset: 1}``; ``weight`` (γ) and ``bias`` (β) are optional (1 and 0), a flat
list, a 1-row matrix or a file's 1-dimensional tensor; ``eps`` is exact from its text.
"""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ...numbers.matrices import is_rational
from ...text import did_you_mean, excerpt
from ..model import NORM_KINDS, Matrix, Norm
from ..places import plural, shape_text
from .layer import is_flat_row

NORM_KEYS = ("type", "weight", "bias", "eps", "offset", "place")
PLACES = ("pre", "post")
DEFAULT_EPS = {"layernorm": "1e-5", "rmsnorm": "1e-6"}  # PyTorch's nn.LayerNorm; LLaMA's rms_norm_eps
USAGE = "norm: {type: layernorm, weight: [...], bias: [...], eps: 1e-5} or {type: rmsnorm, weight: [...], eps: 1e-6}"


def mapping_keys(reader, node: yaml.MappingNode, field: str, keys: tuple[str, ...]) -> dict:
    """The keys of the mapping ``node`` of ``field``, each one of ``keys`` and given once: name →
    (key node, value node)."""
    given: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) and not _yaml.is_null(k) else None
        if name not in keys:
            raise reader.at(k).error(f"unknown key {excerpt(str(name)) if name else _yaml.kind(k)} in {field}"
                                     f"{did_you_mean(str(name), keys, ignore_case=True)}; {field} takes "
                                     f"{', '.join(keys)}", field)
        if name in given:
            raise reader.at(k).error(f"{name} is given twice in {field}", field + "." + name)
        given[name] = (k, v)
    return given


class NormFields:
    """The norm and the residual."""

    def norm(self, node: yaml.Node, key: yaml.Node, X: Matrix | None, field: str = "norm") -> Norm:
        """The ``norm:`` mapping, for an input X of d_model columns (``field`` embeddings_norm: the
        embeddings' own norm, which has no place)."""
        keys = NORM_KEYS if field in ("norm", "mlp.norm") else tuple(k for k in NORM_KEYS if k != "place")
        if X is None:
            raise self.at(key).error("the norm normalises each row of X: give X with the weights, not Q, K and V",
                                     field)
        if not isinstance(node, yaml.MappingNode):
            if _yaml.is_bool(node) and _yaml.bool_value(node):
                if field in ("mlp.norm", "logits.norm"):
                    raise self.at(node).error(f"{field}: true is not a norm: give the norm itself ({USAGE[6:]}), or "
                                              "from: {..., block: true} / logits: {from: true} to take it from a "
                                              "checkpoint", field)
                if field != "norm":
                    raise self.at(node).error("embeddings_norm: true takes the embeddings' norm from a checkpoint: give "
                                              "from: {..., embeddings: true}, or the norm itself: {type: layernorm, "
                                              "weight: [...], bias: [...], eps: 1e-12}", field)
                raise self.at(node).error("norm: true takes the norm from a checkpoint's layer: give from: {..., norm: "
                                          f"true}}, or the norm itself: {USAGE}", field)
            raise self.at(node).error(f"{field} is a mapping such as {USAGE[6:]}, not {_yaml.kind(node)}", field)
        given = mapping_keys(self, node, field, keys)
        if "type" not in given:
            raise self.at(node).error(f"{field} needs type: layernorm or rmsnorm ({USAGE[6:]})", field + ".type")
        t = given["type"][1]
        kind = t.value if isinstance(t, yaml.ScalarNode) and not _yaml.is_null(t) and not t.style else None
        if kind not in NORM_KINDS:
            hint = did_you_mean(str(kind), NORM_KINDS, ignore_case=True) if kind else ""
            raise self.at(t).error(f"unknown norm type {excerpt(kind) if kind else _yaml.kind(t)}{hint}; the types are "
                                   "layernorm ((x − μ)/√(σ² + ε)·γ + β) and rmsnorm (x/√(mean(x²) + ε)·γ)", field + ".type")
        d = X.cols
        weight = self.norm_row(given["weight"][1], field + ".weight", d, "γ") if "weight" in given else None
        bias = None
        if "bias" in given:
            if kind == "rmsnorm":
                raise self.at(given["bias"][0]).error(
                    "rmsnorm has no bias: it is x/√(mean(x²) + ε)·γ, with no β and no mean taken away; "
                    "use type: layernorm for (x − μ)/√(σ² + ε)·γ + β", field + ".bias")
            bias = self.norm_row(given["bias"][1], field + ".bias", d, "β")
        eps = self.norm_eps(given["eps"][1] if "eps" in given else None, kind, field + ".eps")
        offset = 0
        if "offset" in given:
            v = given["offset"][1]
            if not (isinstance(v, yaml.ScalarNode) and not v.style and v.value in ("0", "1")):
                raise self.at(v).error(f"offset is 0 (γ) or 1 ((1 + γ), Gemma's RMSNorm), not {_yaml.kind(v)}",
                                       field + ".offset")
            offset = int(v.value)
        place = "pre"
        if "place" in given:
            v = given["place"][1]
            place = v.value if isinstance(v, yaml.ScalarNode) and not _yaml.is_null(v) and not v.style else None
            if place not in PLACES:
                raise self.at(v).error(
                    f"place is pre (the {'MLP reads the normalised H' if field == 'mlp.norm' else 'attention reads the normalised X'}: "
                    f"GPT-2, LLaMA) or post (the norm of {'H + the MLP' if field == 'mlp.norm' else 'X + the attention'}'s "
                    f"output: BERT), not {excerpt(place) if place else _yaml.kind(v)}"
                    f"{did_you_mean(str(place), PLACES, ignore_case=True) if place else ''}", field + ".place")
        return Norm(kind, eps, weight, bias, offset, place)

    def one_row(self, node: yaml.Node, field: str, letter: str, needs: str, width: str) -> Matrix:
        """A norm's weight row ``letter`` (γ, β, γ_q, ...) as a flat list, a 1-row matrix or a file's, of
        plain numbers: ``needs`` and ``width`` say how many entries it takes, in the errors."""
        if is_flat_row(node):
            m = self.flat_row(node, field, use_symbols=False)
        elif isinstance(node, yaml.SequenceNode) and not node.value:
            raise self.at(node).error(f"{letter} is empty; it needs {needs}", field)
        else:
            m = self.matrix(node, field, vector=True)
            if m.rows != 1:
                raise self.at(node).error(f"is {shape_text(m)}; {letter} is one row, such as [1, 2] or [[1, 2]], "
                                          f"{width}", field)
        if not is_rational(m) and m.free_symbols:
            raise self.at(node).error(f"{letter} must be plain numbers, not symbols", field)
        return m

    def norm_row(self, node: yaml.Node, field: str, d: int, letter: str) -> Matrix:
        """γ or β: one entry per feature (column of X), as a flat list, a 1-row matrix or a file's."""
        per_feature = "one entry per feature (column of X)"
        m = self.one_row(node, field, letter, per_feature, per_feature)
        if m.cols != d:
            raise self.at(node).error(
                f"has {m.cols} {'entry' if m.cols == 1 else 'entries'}, but X has d_model = {d} "
                f"{plural(d, 'column')}: {letter} {'multiplies' if letter == 'γ' else 'is added to'} each feature of a "
                "token's normalised row", field)
        return m

    def norm_eps(self, node: yaml.Node | None, kind: str, field: str = "norm.eps") -> sympy.Expr:
        """ε, exactly from its text (``1e-5`` is 1/100000), ≥ 0; the type's usual value when not given."""
        if node is None:
            return sympy.Rational(DEFAULT_EPS[kind])
        eps = self.number(node, field, use_symbols=False)
        if not eps.is_real or eps.is_negative or (eps.is_nonnegative is None and sympy.N(eps, 30) < 0):
            raise self.at(node).error(f"eps must be ≥ 0 (it is added to the variance under the root), not "
                                      f"{excerpt(node.value)}", field)
        return eps

    def residual(self, node: yaml.Node) -> bool:
        if not _yaml.is_bool(node):
            raise self.at(node).error(f"residual is true (H = X + the attention's output) or false, not "
                                      f"{_yaml.kind(node)}", "residual")
        return _yaml.bool_value(node)
