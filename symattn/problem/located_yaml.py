"""Reading YAML safely, keeping every node's line and column.

The file is only *composed* (parsed into nodes), never constructed into Python
objects, so no tag can run code and every scalar keeps the text the user wrote:
``0.1`` stays the string ``"0.1"`` until :mod:`symattn.numbers.parse` reads it exactly.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import yaml

from ..errors import SymattnError
from ..text import excerpt
from . import matrix_spans

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


# -- big matrices without a node per number -------------------------------------------------
#
# A model-sized matrix written [[0.12, -0.5, ...], ...] costs libyaml a node and two marks
# per number. A matrix of plain numbers has only one reading, so it is cut out of the text
# before composing (a placeholder [] with the same line breaks keeps every other line and
# column; the marks' character offsets are put back afterwards, see _Cut) and kept as its rows
# of text. Its nodes are composed from its own text only if something asks for them (an entry
# to report, a mask of booleans), with the same lines and columns. :mod:`.matrix_spans` finds them.


class FlowMatrix(yaml.SequenceNode):
    """A matrix of plain numbers cut out of the text: ``rows`` holds each row's text between
    its brackets, every entry matched as a plain number (as :mod:`.matrix_spans` finds them),
    unless the matrix has more entries than the file may hold values (then it is refused for its
    size from the rows' text alone). ``value`` (the usual row and entry nodes) is composed on
    first use."""

    def __init__(self, rows: list[str], text: str, start: int, end: int, start_mark, end_mark,
                 file: str = "<problem>") -> None:
        self.tag = "tag:yaml.org,2002:seq"
        self.file = file
        self.rows = rows
        self.start_mark, self.end_mark = start_mark, end_mark
        self.flow_style = True
        self.anchor = None
        self._text, self._start, self._end = text, start, end
        self._value = None

    @property
    def value(self):
        if self._value is None:
            # The matrix's own text, at its own place: every mark is what the whole file gives.
            before = _blank(self._text[: self._start])
            try:
                self._value = yaml.compose(before + self._text[self._start:self._end], Loader=_CLoader).value
            except yaml.MarkedYAMLError as exc:  # a matrix too large to check before it was cut
                _raise_marked(exc, self.file)
        return self._value

    @value.setter
    def value(self, value) -> None:
        self._value = value

    def row_where(self, file: str, i: int) -> "Where":
        """Where row ``i`` (from 0) starts, as its composed node would say, without composing."""
        pos = self._text.index("[", self._start + 1)  # the first row's bracket
        for _ in range(i):
            pos = self._text.index("[", self._text.index("]", pos))
        line = self._text.count("\n", 0, pos)
        return Where(file, line + 1, pos - (self._text.rfind("\n", 0, pos) + 1) + 1)


class ListMatrix(FlowMatrix):
    """A matrix of plain numbers written as a block list of rows (``layout`` ``"rows"``: an item
    ``- [1, 2]`` per row; ``"block"``: ``- - 1`` then ``  - 2`` per row), cut out of the text.
    ``rows`` holds each row's entries joined by commas. ``value`` is composed on first use from
    the cut text with this list put back, so every mark is what the whole file gives."""

    def __init__(self, rows: list[str], text: str, start: int, end: int, start_mark, end_mark,
                 file: str, cut: "_Cut", k: int, layout: str) -> None:
        super().__init__(rows, text, start, end, start_mark, end_mark, file)
        self.flow_style = False
        self.layout = layout
        self._cut, self._k = cut, k  # the cut text, and which of its placeholders is this list's

    @property
    def value(self):
        if self._value is None:
            cut, k = self._cut, self._k
            # The list put back in its placeholder's place: every line and column is the whole
            # file's, and every character offset is short by what the placeholders before it saved.
            whole = cut.text[: cut.starts[k]] + self._text[self._start:self._end] + cut.text[cut.ends[k]:]
            try:
                root = yaml.compose(whole, Loader=_CLoader)
            except yaml.MarkedYAMLError as exc:  # not expected: the list was checked before it was cut
                _raise_marked(exc, self.file)
            line, col = self.start_mark.line, self.start_mark.column
            stack, seen = [root], set()
            while stack:
                node = stack.pop()
                if id(node) in seen:
                    continue
                seen.add(id(node))
                if isinstance(node, yaml.SequenceNode) and not node.flow_style and \
                        (node.start_mark.line, node.start_mark.column) == (line, col):
                    self._value = node.value
                    _shift_marks(node.value, cut.saved[k])
                    break
                if isinstance(node, yaml.SequenceNode):
                    stack.extend(node.value)
                elif isinstance(node, yaml.MappingNode):
                    stack.extend(child for pair in node.value for child in pair)
            else:
                raise AssertionError(f"no list at line {line + 1}, column {col + 1} of the text put back")
        return self._value

    @value.setter
    def value(self, value) -> None:
        self._value = value

    def row_where(self, file: str, i: int) -> "Where":
        """Where row ``i`` (from 0) starts: its item's "[" or second "-", two columns right of the list."""
        line = self.start_mark.line + (i if self.layout == "rows" else sum(r.count(",") + 1 for r in self.rows[:i]))
        return Where(file, line + 1, self.start_mark.column + 3)


def _blank(text: str) -> str:
    """``text`` with every character but the line breaks made a space (lines and columns kept)."""
    return "\n".join(map(" ".__mul__, map(len, text.split("\n"))))


class _Cut:
    """``text`` with each span (a matrix cut out) replaced by a placeholder: ``[]`` for a flow
    matrix, ``- []`` (a list of one empty list) for a list of rows.

    A placeholder keeps the span's line breaks, and on its last line the column of its closing
    bracket, so every node after it has the line and column it has in ``text``; a span of one
    line becomes ``[]`` outright (nothing but a comment follows it on its line). Everything else
    in a span is dropped, where blanks of the same extent would have libyaml scan megabytes twice
    (the check of the text, then composing it). Only the marks' character offsets (and columns
    after a span of one line) then differ from ``text``'s: :meth:`mark` puts a mark back in its
    place in ``text``.
    """

    def __init__(self, text: str, spans) -> None:
        pieces, last = [], 0
        self.starts: list[int] = []  # each placeholder's extent in the cut text
        self.ends: list[int] = []
        self.saved: list[int] = []  # characters saved before each placeholder
        self.through: list[int] = []  # characters saved up to the end of each placeholder
        self.one_line: list[tuple[int, int]] = []  # each span's (last line, columns saved on it)
        saved = line = 0
        for start, end, _rows, layout in spans:
            pieces.append(text[last:start])
            line += text.count("\n", last, start)
            head = "[" if layout == "flow" else "- ["
            breaks = text.count("\n", start, end)
            if breaks:
                tail = end - text.rfind("\n", start, end) - 2  # the last line's characters before "]"
                placeholder = head + "\n" * breaks + " " * tail + "]"
            else:
                placeholder = head + "]"
            self.starts.append(start - saved)
            self.saved.append(saved)
            self.one_line.append((line + breaks, 0) if breaks else (line, end - start - len(placeholder)))
            saved += end - start - len(placeholder)
            self.through.append(saved)
            self.ends.append(end - saved)
            pieces.append(placeholder)
            line += breaks
            last = end
        pieces.append(text[last:])
        self.text = "".join(pieces)

    def mark(self, mark):
        """``mark`` (of the cut text) at its place in the whole text."""
        k = bisect.bisect_right(self.ends, mark.index)  # placeholders that end at or before it
        if k == 0:
            return mark
        line, columns = self.one_line[k - 1]
        column = mark.column + columns if mark.line == line else mark.column
        return type(mark)(mark.name, mark.index + self.through[k - 1], mark.line, column, None, None)


def _shift_marks(nodes, saved: int) -> None:
    """Add ``saved`` characters to the offset of every mark of ``nodes`` and the nodes inside."""
    if not saved:
        return
    stack, seen = list(nodes), set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for attr in ("start_mark", "end_mark"):
            m = getattr(node, attr)
            setattr(node, attr, type(m)(m.name, m.index + saved, m.line, m.column, None, None))
        if isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend(child for pair in node.value for child in pair)


def _compose_cut(text: str, spans, cut: _Cut, file: str = "<problem>") -> yaml.Node | None:
    """Compose ``cut`` (``text`` with each span replaced by a placeholder), give every mark its
    place in ``text``, and put a :class:`FlowMatrix` in each placeholder's place. None when any
    placeholder is not where a matrix would be (inside a block of text, say): the caller then
    composes the whole text as usual."""
    places = {}
    line = last = 0
    for k, (start, end, rows, layout) in enumerate(spans):  # in the order of the text: lines counted on from the last
        line += text.count("\n", last, start)
        last = start
        col = start - (text.rfind("\n", 0, start) + 1)
        places[(line, col)] = (start, end, rows, layout, k)
    try:
        root = yaml.compose(cut.text, Loader=_CLoader)
    except (yaml.YAMLError, ValueError):
        return None
    placed = 0
    stack = [root] if root is not None else []
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue  # an alias of a node already walked
        seen.add(id(node))
        node.start_mark, node.end_mark = cut.mark(node.start_mark), cut.mark(node.end_mark)
        if isinstance(node, yaml.MappingNode):
            stack.extend(key for key, _ in node.value)
            children = [value for _, value in node.value]
            swap = lambda k, new: node.value.__setitem__(k, (node.value[k][0], new))  # noqa: E731
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
            swap = node.value.__setitem__
        else:
            continue
        for i, child in enumerate(children):
            key = (child.start_mark.line, child.start_mark.column)  # lines and columns are the whole text's
            place = places.get(key) if isinstance(child, yaml.SequenceNode) and id(child) not in seen else None
            if place is not None and place[3] == "flow" and child.flow_style and not child.value:
                start, end, rows, _layout, _k = place
                marks = cut.mark(child.start_mark), cut.mark(child.end_mark)
                swap(i, FlowMatrix(rows, text, start, end, *marks, file))
                placed += 1
            elif place is not None and place[3] != "flow" and not child.flow_style and _is_placeholder_list(child):
                start, end, rows, layout, k = place
                marks = cut.mark(child.start_mark), cut.mark(child.end_mark)
                swap(i, ListMatrix(rows, text, start, end, *marks, file, cut, k, layout))
                placed += 1
            else:
                stack.append(child)
    return root if placed == len(spans) else None


def _is_placeholder_list(node: yaml.SequenceNode) -> bool:
    """Whether ``node`` is what a placeholder ``- []`` composes to: a list of one empty flow list."""
    if len(node.value) != 1:
        return False
    item = node.value[0]
    return isinstance(item, yaml.SequenceNode) and item.flow_style and not item.value


_SURROGATE = re.compile("[\ud800-\udfff]")  # only a "\ud800" escape can make one: the file was UTF-8
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


MAX_NESTING = 100  # lists and mappings inside each other; a problem file needs 6
_NESTING = {yaml.SequenceStartEvent: 1, yaml.MappingStartEvent: 1, yaml.SequenceEndEvent: -1, yaml.MappingEndEvent: -1}
_VALUES = (yaml.ScalarEvent, yaml.AliasEvent)
_ITEM_LINE = re.compile(r"^[ ]*- ", re.MULTILINE)
_PYTHON_WORDING = 1_000_000  # characters up to which a syntax error is worded by the pure-Python parser


def _count_item_lines(text: str, chunk: int = 1 << 20) -> int:
    """How many lines start with "- " (after spaces), counted a megabyte at a time (cut at line
    breaks) so that millions of matches never sit in memory at once."""
    count, start, n = 0, 0, len(text)
    while start < n:
        end = text.find("\n", start + chunk)
        end = n if end == -1 else end + 1
        count += len(_ITEM_LINE.findall(text, start, end))
        start = end
    return count


def _prescan(text: str, file: str, max_values: int | None, loader_class=None) -> yaml.MarkedYAMLError | None:
    """Walk the parser's events (no nodes are built, nothing recurses) and refuse nesting deeper
    than :data:`MAX_NESTING` and more than ``max_values`` values (scalars and aliases), each at
    the place it happens, before anything is composed. Returns libyaml's syntax error, if any
    (None when the text parses)."""
    loader = (loader_class or _CLoader or yaml.SafeLoader)(text)
    depth = values = 0
    nesting, value_types = _NESTING, _VALUES
    try:
        while True:
            event = loader.get_event()
            if event is None or isinstance(event, yaml.StreamEndEvent):
                return None
            step = nesting.get(type(event))
            if step is not None:
                depth += step
                if depth > MAX_NESTING:
                    mark = event.start_mark
                    raise SymattnError(
                        f"invalid YAML: lists and mappings are nested more than {MAX_NESTING} levels deep",
                        file=file, line=mark.line + 1, col=mark.column + 1,
                    )
            elif max_values is not None and isinstance(event, value_types):
                values += 1
                if values > max_values:
                    mark = event.start_mark
                    raise SymattnError(
                        f"the file holds more than {max_values:,} values (numbers, words and aliases), more than "
                        "its size limit allows; if it is meant to be this large, raise the limit with --max-size",
                        file=file, line=mark.line + 1, col=mark.column + 1,
                    )
    except yaml.MarkedYAMLError as exc:
        return exc
    except (yaml.YAMLError, ValueError):
        return None  # the composing below says what is wrong
    finally:
        loader.dispose()


def compose(text: str, file: str, max_values: int | None = None) -> yaml.Node | None:
    """The node tree of ``text`` (one YAML document), or None for an empty file.

    Nesting is limited to :data:`MAX_NESTING` and the count of values to ``max_values``
    (None: no limit) before anything is composed."""
    if max_values is not None and text.count("- ") > max_values:
        # Each line that starts with "- " is a list item: counted from the text in a moment,
        # where walking the parser's events would take seconds per million.
        items = _count_item_lines(text)
        if items > max_values:
            raise SymattnError(
                f"the file has {items:,} list items (lines starting with '- '), more than its size limit "
                f"allows ({max_values:,} values); if it is meant to be this large, raise the limit with --max-size",
                file=file,
            )
    if _CLoader is not None:
        spans = matrix_spans.flow_matrices(text, max_values)
        if spans:
            cut = _Cut(text, spans)
            if _prescan(cut.text, file, max_values) is None:
                root = _compose_cut(text, spans, cut, file)
                if root is not None:
                    return root
    syntax = _prescan(text, file, max_values)
    if _CLoader is not None:
        if syntax is None:
            try:  # libyaml: the same nodes, tags and marks, many times faster on big files
                return yaml.compose(text, Loader=_CLoader)
            except (yaml.YAMLError, ValueError):
                pass  # the pure-Python parser below words the error (with its place) for the user
        elif len(text) > _PYTHON_WORDING:
            _raise_marked(syntax, file)  # libyaml's own words: the pure-Python parser would take minutes
        else:
            # libyaml may stop before its first event (it looks ahead, and has a nesting limit of
            # its own): the pure-Python parser's events give the nesting with its place.
            _prescan(text, file, max_values, yaml.SafeLoader)
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        _raise_marked(exc, file)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: name its place
        before = text[: exc.position]
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character) if exc.character else None
        what = f"the character U+{char:04X} is not allowed in YAML" if char is not None else exc.reason
        raise SymattnError(f"invalid YAML: {what}; remove it", file=file, line=line, col=col) from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
        raise SymattnError(f"invalid YAML: {first}", file=file) from None


def _raise_marked(exc: yaml.MarkedYAMLError, file: str):
    mark = exc.problem_mark or exc.context_mark
    what = exc.problem or exc.context or "invalid YAML"
    if what.startswith("but found another document"):
        what = "the file holds more than one YAML document (a second '---'); a problem is one document"
    if mark is None:
        raise SymattnError(f"invalid YAML: {what}", file=file) from None
    raise SymattnError(f"invalid YAML: {what}", file=file, line=mark.line + 1, col=mark.column + 1) from None


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
        if isinstance(node, yaml.ScalarNode) and node.style == '"' and _SURROGATE.search(node.value):
            code = ord(_SURROGATE.search(node.value).group())
            raise where(file, node).error(
                f"invalid YAML: the escape of U+{code:04X} names half of a UTF-16 pair, not a character; remove it"
            )
        if id(node) in visited:
            continue  # an alias of a node already checked
        visited.add(id(node))
        if isinstance(node, FlowMatrix):
            continue  # plain numbers only: no tag can hide in it
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
    return excerpt(node.value)
