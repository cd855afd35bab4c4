"""Reading the ``rope:`` field of a problem file (see :mod:`symattn.problem.rope`).

``rope: {base: 10000, pairing: half}`` or ``rope: {angles: ["pi/6", "pi/3"], pairing: interleaved}``;
every mistake is one error line with the file, line, column and field.
"""

from __future__ import annotations

import sympy
import yaml

from .. import located_yaml as _yaml
from ...numbers.parse import NumberError, is_positive, parse_number
from ...text import did_you_mean, excerpt
from ..rope import DEFAULT_BASE, DEFAULT_PAIRING, PAIRINGS, Rope

KEYS = ("base", "angles", "pairing")
USAGE = 'rope: {base: 10000} or rope: {angles: ["pi/6", "pi/3"]}, with pairing: half or interleaved'


def read_rope(reader, key: yaml.Node, node: yaml.Node, d_ks: list[int], n_q: int, n_k: int, *,
              multi: bool, cross: bool) -> Rope:
    """The problem's :class:`Rope` from the ``rope:`` node (``reader`` is the problem's :class:`~symattn.problem.reader.document.Reader`)."""
    at = reader.at
    if not isinstance(node, yaml.MappingNode):
        raise at(node).error(f"{USAGE}; not {_yaml.kind(node)}", "rope")
    given: dict[str, yaml.Node] = {}
    for k, v in node.value:
        name = k.value if isinstance(k, yaml.ScalarNode) else None
        if name not in KEYS:
            raise at(k).error(f"unknown rope setting {_yaml.kind(k) if name is None else excerpt(name)}"
                              f"{did_you_mean(name, KEYS)}; the settings are base, angles and pairing", "rope")
        if name in given:
            raise at(k).error(f"rope.{name} is given twice", "rope")
        given[name] = v
    if "base" in given and "angles" in given:
        raise at(given["angles"]).error("give rope.base or rope.angles, not both", "rope.angles")
    if cross:
        raise at(key).error("RoPE is for self-attention: with a context the queries and keys are "
                            "positions of two different sequences; remove rope or context", "rope")
    if n_q != n_k:
        raise at(key).error(f"RoPE rotates query and key p by the same position p, so Q and K need the "
                            f"same tokens; here Q has {n_q} rows and K has {n_k}", "rope")
    for h, d_k in enumerate(d_ks, 1):
        if d_k % 2:
            whose = f"head {h}'s d_k" if multi else "d_k"
            raise at(key).error(f"RoPE rotates pairs of components, so d_k must be even; {whose} is {d_k}", "rope")
    pairing = DEFAULT_PAIRING
    if "pairing" in given:
        p = given["pairing"]
        word = p.value if isinstance(p, yaml.ScalarNode) and not _yaml.is_null(p) else None
        if word not in PAIRINGS:
            what = excerpt(word) if word is not None else _yaml.kind(p)
            raise at(p).error(f"unknown pairing {what}{did_you_mean(word, PAIRINGS)}; use half (Hugging Face's "
                              "rotate_half: i with i + d_k/2) or interleaved (RoFormer: 2i with 2i + 1)",
                              "rope.pairing")
        pairing = word
    if "angles" in given:
        return Rope(pairing, angles=_angles(reader, given["angles"], d_ks))
    base = sympy.Integer(DEFAULT_BASE)
    if "base" in given:
        b = given["base"]
        if not isinstance(b, yaml.ScalarNode) or _yaml.is_null(b) or _yaml.is_bool(b):
            raise at(b).error(f"the base must be a number, not {_yaml.kind(b)}", "rope.base")
        base = _number(reader, b, "rope.base", allow_pi=False)
        if not is_positive(base):
            raise at(b).error(f"the base must be positive, not {b.value}", "rope.base")
    return Rope(pairing, base=base)


def _number(reader, node: yaml.ScalarNode, field: str, allow_pi: bool) -> sympy.Expr:
    try:
        return parse_number(str(node.value), symbols={}, allow_pi=allow_pi)
    except NumberError as exc:
        raise reader.at(node).error(str(exc), field) from None


def _angles(reader, node: yaml.Node, d_ks: list[int]) -> tuple[sympy.Expr, ...]:
    at = reader.at
    if not isinstance(node, yaml.SequenceNode) or not node.value:
        raise at(node).error('rope.angles is a list of angles such as ["pi/6", "pi/3"], one per pair of '
                             f"components, not {_yaml.kind(node)}", "rope.angles")
    angles = []
    for i, item in enumerate(node.value):
        field = f"rope.angles item {i + 1}"
        if not isinstance(item, yaml.ScalarNode) or _yaml.is_null(item) or _yaml.is_bool(item):
            raise at(item).error(f"an angle is a number or an expression such as \"pi/6\", not {_yaml.kind(item)}",
                                 field)
        angles.append(_number(reader, item, field, allow_pi=True))
    for d_k in sorted(set(d_ks)):
        if len(angles) != d_k // 2:
            raise at(node).error(f"{len(angles)} angle{'s' if len(angles) != 1 else ''} given, but "
                                 f"d_k = {d_k} has d_k/2 = {d_k // 2} pairs of components: give one angle per pair",
                                 "rope.angles")
    return tuple(angles)
