"""Reading YAML safely, keeping every node's line and column.

The file is only *composed* (parsed into nodes), never constructed into Python
objects, so no tag can run code and every scalar keeps the text the user wrote:
``0.1`` stays the string ``"0.1"`` until :mod:`symattn._numbers` reads it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from ._errors import SymattnError

# Plain data, and the tags PyYAML's resolver gives plain scalars on its own
# ('=' is !!value, 2024-05-01 is !!timestamp, '<<' is !!merge): symattn reads
# those as text.
_STANDARD_TAGS = {
    "tag:yaml.org,2002:" + name
    for name in ("str", "int", "float", "bool", "null", "seq", "map", "value", "timestamp", "merge")
}
_BOOL_TAG = "tag:yaml.org,2002:bool"
_NULL_TAG = "tag:yaml.org,2002:null"


def _fast_loader():
    """libyaml's parser, resolving only null and booleans: symattn reads numbers from their
    text itself, so PyYAML's int and float patterns (run in Python for every scalar) are
    skipped. None without libyaml."""
    if not hasattr(yaml, "CSafeLoader"):
        return None

    class Loader(yaml.CSafeLoader):
        pass

    keep = {"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool"}
    Loader.yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag in keep]
        for first, resolvers in yaml.CSafeLoader.yaml_implicit_resolvers.items()
    }
    return Loader


_CLoader = _fast_loader()
MAX_NODES = 5_000_000  # nodes visited through aliases before we give up


@dataclass(frozen=True)
class Where:
    """A place in a file, for error messages (1-based line and column)."""

    file: str
    line: int | None = None
    col: int | None = None

    def error(self, message: str, field: str | None = None) -> SymattnError:
        return SymattnError(message, file=self.file, line=self.line, col=self.col, field=field)


def where(file: str, node: yaml.Node) -> Where:
    mark = node.start_mark
    return Where(file, mark.line + 1, mark.column + 1)


def compose(text: str, file: str) -> yaml.Node | None:
    """The node tree of ``text`` (one YAML document), or None for an empty file."""
    if _CLoader is not None:
        try:  # libyaml: the same nodes, tags and marks, many times faster on big files
            return yaml.compose(text, Loader=_CLoader)
        except (yaml.YAMLError, ValueError):
            pass  # the pure-Python parser below words the error (with its place) for the user
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or exc.context or "invalid YAML"
        if what.startswith("but found another document"):
            what = "the file holds more than one YAML document (a second '---'); a problem is one document"
        if mark is None:
            raise SymattnError(f"invalid YAML: {what}", file=file) from None
        raise SymattnError(
            f"invalid YAML: {what}", file=file, line=mark.line + 1, col=mark.column + 1
        ) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: name its place
        before = text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character) if exc.character else None
        what = f"the character U+{char:04X} is not allowed in YAML" if char is not None else exc.reason
        raise SymattnError(f"invalid YAML: {what}; remove it", file=file, line=line, col=col) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise SymattnError(f"invalid YAML: {first}", file=file) from None


def check_tags(root: yaml.Node, file: str) -> None:
    """Reject any explicit tag outside plain YAML data (``!!python/...`` and friends)."""
    seen = 0
    stack = [root]
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            raise where(file, node).error(
                f"the file expands to more than {MAX_NODES:,} YAML nodes through aliases"
            )
        if node.tag not in _STANDARD_TAGS:
            raise where(file, node).error(
                f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')!r} is not allowed;"
                " problem files hold plain numbers, strings, lists and mappings"
            )
        if id(node) in visited:
            continue  # an alias of a node already checked
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append(key)
                stack.append(value)


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def is_bool(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _BOOL_TAG


def bool_value(node: yaml.ScalarNode) -> bool:
    return node.value.lower() in ("true", "yes", "on", "y")


def kind(node: yaml.Node) -> str:
    """How a node is described in an error message."""
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if is_null(node):
        return "empty"
    return repr(node.value)
