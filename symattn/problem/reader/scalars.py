"""The reader's part for the scalar and list fields: title, tokens labels, digits, scale, symbols
and their values, and every number of a matrix entry (read once per text)."""

from __future__ import annotations

import keyword
import re
from pathlib import Path

import sympy
import yaml

from .. import located_yaml as _yaml
from ...numbers.parse import NumberError, check_size, is_positive, parse_number
from ...text import LongNumber, did_you_mean, excerpt, whole_number
from ..places import item_field, plural

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_RESERVED = {"sqrt", "exp", "log", "e", "inf", "nan", "oo"}


class ScalarFields:
    """Numbers, whole numbers, labels, symbols and the other scalar fields."""

    def whole(self, node: yaml.Node, field: str, what: str) -> int:
        """A whole number ≥ 1 written plainly (``2``, not ``2.0`` or ``"2"``)."""
        value = self.plain_whole(node, field)
        if value is not None and value >= 1:
            return value
        raise self.at(node).error(f"{what} must be a whole number ≥ 1, not {_yaml.kind(node)}", field)

    def plain_whole(self, node: yaml.Node, field: str) -> int | None:
        """The whole number ``node`` writes plainly in the digits 0-9 (``2``; not ``2.0``, ``"2"``
        or ``²``), else None; one with more digits than any count has is refused here, before
        it is converted."""
        if not (isinstance(node, yaml.ScalarNode) and not node.style):
            return None
        try:
            return whole_number(node.value)
        except LongNumber as exc:
            raise self.at(node).error(str(exc), field) from None

    def read_symbols(self, node) -> dict[str, sympy.Symbol]:
        if node is None:
            return {}
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(f"symbols is a list of names such as [a, b], not {_yaml.kind(node)}", "symbols")
        out: dict[str, sympy.Symbol] = {}
        for i, item in enumerate(node.value):
            name = item.value if isinstance(item, yaml.ScalarNode) else None
            field = item_field("symbols", i)
            if not isinstance(name, str) or not _NAME.fullmatch(name) or keyword.iskeyword(name):
                raise self.at(item).error(
                    f"a symbol is a name of letters, digits and _ starting with a letter, not {_yaml.kind(item)}", field
                )
            if name in _RESERVED or hasattr(sympy, name):
                raise self.at(item).error(
                    f"{name!r} is taken (a function, constant or SymPy name); choose another name such as {name}_1", field
                )
            if name in out:
                raise self.at(item).error(f"the symbol {excerpt(name)} is declared twice", field)
            out[name] = sympy.Symbol(name)
        return out

    def read_values(self, node) -> dict[sympy.Symbol, sympy.Expr]:
        if node is None:
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.at(node).error(f"values is a mapping such as {{a: 1/2}}, not {_yaml.kind(node)}", "values")
        out: dict[sympy.Symbol, sympy.Expr] = {}
        for k, v in node.value:
            name = getattr(k, "value", None)
            if name not in self.symbols:
                declared = ", ".join(self.symbols) or "none"
                raise self.at(k).error(
                    f"{excerpt(name)} is not a declared symbol (declared: {declared}){did_you_mean(str(name), self.symbols, ignore_case=True)}",
                    "values",
                )
            symbol = self.symbols[name]
            if symbol in out:
                raise self.at(k).error(f"{excerpt(name)} is given twice", "values")
            value = self.number(v, f"values.{name}", use_symbols=False)
            out[symbol] = value
        return out

    def title(self, node: yaml.Node | None) -> str:
        if node is None:
            if self.file.startswith("<"):
                return "Scaled dot-product attention"
            stem = Path(self.file).stem.replace("_", " ").replace("-", " ").strip()
            return stem[:1].upper() + stem[1:] if stem else "Scaled dot-product attention"
        if not isinstance(node, yaml.ScalarNode) or _yaml.is_null(node):
            raise self.at(node).error(f"the title must be text, not {_yaml.kind(node)}", "title")
        return node.value.strip()

    def labels(self, node, name: str, n: int, of: str, prefix: str, ids: list[int] | None = None) -> tuple[str, ...]:
        """The rows' labels: given, else the token ids the rows were looked up by (#464), else t_1, t_2, ...."""
        if node is None:
            return tuple(f"#{i}" for i in ids) if ids is not None else tuple(f"{prefix}_{i + 1}" for i in range(n))
        if not isinstance(node, yaml.SequenceNode):
            raise self.at(node).error(f"{name} must be a list of labels such as [The, cat, sat], not {_yaml.kind(node)}", name)
        if len(node.value) != n:
            raise self.at(node).error(
                f"{name} has {len(node.value)} {plural(len(node.value), 'label')} but {of} has {n} {plural(n, 'row')}",
                name,
            )
        out = []
        for i, item in enumerate(node.value):
            if not isinstance(item, yaml.ScalarNode) or _yaml.is_null(item) or not item.value.strip():
                raise self.at(item).error(f"a label must be a word, not {_yaml.kind(item)}", item_field(name, i))
            out.append(item.value.strip())
        return tuple(out)

    def digits(self, node) -> int:
        if node is None:
            return 4
        value = self.plain_whole(node, "digits")
        if value is not None and 1 <= value <= 50:
            return value
        raise self.at(node).error(f"digits must be a whole number from 1 to 50, not {_yaml.kind(node)}", "digits")

    def scale(self, node):
        if node is None:
            return "auto"
        if isinstance(node, yaml.ScalarNode) and node.value in ("auto", "none"):
            return node.value
        if not isinstance(node, yaml.ScalarNode):
            raise self.at(node).error(f"scale must be auto, none or a number, not {_yaml.kind(node)}", "scale")
        value = self.number(node, "scale", use_symbols=False)
        if not is_positive(value):
            raise self.at(node).error(f"scale must be positive, not {value}", "scale")
        return value

    def number(self, node: yaml.Node, field: str, allow_neg_inf: bool = False, use_symbols: bool = True) -> sympy.Expr:
        if not isinstance(node, yaml.ScalarNode):
            raise self.at(node).error(f"expected a number, not {_yaml.kind(node)}", field)
        if _yaml.is_null(node):
            raise self.at(node).error("the entry is empty; write a number", field)
        if _yaml.is_bool(node):
            raise self.at(node).error(f"{node.value!r} is a boolean, not a number", field)
        # An alias is the same node: its entry is read once (60,000 aliases of one expensive
        # expression cost one reading). The text and what is allowed are part of the key.
        key = (node.value, allow_neg_inf)
        value = self.read_numbers.get(key)
        if value is None:
            try:
                value = check_size(node.value, parse_number(node.value, symbols=self.symbols, allow_neg_inf=allow_neg_inf))
            except NumberError as exc:
                raise self.at(node).error(str(exc), field) from None
            self.read_numbers[key] = value
        if value.free_symbols and not use_symbols:
            names = ", ".join(sorted(s.name for s in value.free_symbols))
            raise self.at(node).error(f"{excerpt(node.value)} holds the symbol(s) {names}; this must be a plain number", field)
        return value
