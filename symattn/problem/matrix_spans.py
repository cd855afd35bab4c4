"""Where matrices of plain numbers are in a problem's YAML text, found by pattern before the
text is composed, so that :func:`symattn.problem.located_yaml.compose` can cut them out (a
model-sized matrix would otherwise cost libyaml a node and two marks per number).

A matrix is found in three layouts: flow (``X: [[1, 2], [3, 4]]``), a list of flow rows (``X:``
then ``- [1, 2]`` per row) or the block style ``yaml.safe_dump`` writes (``- - 1`` then
``  - 2``). Possessive repeats keep no state per entry or row, so the scans are linear in the text.
"""

from __future__ import annotations

import re

_NUMBER = r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:/[0-9]{1,30})?"
# "\r" appears only in a CRLF line break here (a lone CR sends the text down the usual path), so
# it is white space like the "\n" after it.
_CLOSE = re.compile(r"\][ \r\n]*\]")
_BETWEEN_ROWS = re.compile(r"\][ \n]*,[ \n]*\[")
# A matrix: a key at the start of a line (perhaps after "- "), then [[ ... ]] up to the end of
# the line or a comment.
_START = re.compile(r"^(?:[ ]*+- )*+[ ]*+[A-Za-z_][A-Za-z0-9_]*:[ ]+(?=\[[ \r\n]*\[)", re.MULTILINE)
_MATRIX_CHARS = re.compile(r"[-0-9./, \r\n\[\]]*")
_AFTER = re.compile(r"[ ]*(?:[ ]#[^\r\n]*)?(?:\r?\n|\Z)")


# Line breaks YAML knows besides "\n" and "\r\n" (and a byte-order mark, which shifts libyaml's
# index): with any of them, or a "\r" alone, the places are not worth working out, and the text
# is composed as usual.
_ODD_BREAKS = "\x85\u2028\u2029\ufeff"


def _odd_breaks(text: str) -> bool:
    r"""Whether ``text`` has one of :data:`_ODD_BREAKS` or a "\r" not followed by "\n", found by
    C scans of the text (for each character; "\r" and "\r\n" counted) rather than a regular
    expression tried at every character (a tenth of the load of a 3 MB file with CRLF line ends)."""
    return any(c in text for c in _ODD_BREAKS) or ("\r" in text and text.count("\r") != text.count("\r\n"))


# What is between a matrix's outer brackets when it is rows of numbers: ``[1, 2], [3, 4]``.
# Possessive repeats keep no state per entry or row (a 30 MB row is matched in one call, in
# constant memory).
_ROW = rf"\[[ \r\n]*+{_NUMBER}(?:[ \r\n]*+,[ \r\n]*+{_NUMBER})*+[ \r\n]*+\]"
_ROWS = re.compile(rf"{_ROW}(?:[ \r\n]*+,[ \r\n]*+{_ROW})*+")


def _is_rows(inner: str) -> bool:
    """Whether ``inner`` (what is between a matrix's outer brackets) is rows of numbers."""
    return _ROWS.fullmatch(inner) is not None


def _close(text: str, start: int, stop: int) -> int | None:
    """Where the first "]]" (perhaps with white space between) after ``start`` ends, looked for
    a "]" at a time (a row's close) rather than a regular expression per character."""
    pos = text.find("]", start, stop)
    while pos != -1:
        close = _CLOSE.match(text, pos, stop)
        if close is not None:
            return close.end()
        pos = text.find("]", pos + 1, stop)
    return None


def flow_matrices(text: str, max_values: int | None = None) -> list[tuple[int, int, list[str], str]]:
    """``(start, end, rows, layout)`` of each matrix of plain numbers that can be cut out, in
    the order of the text: ``layout`` is ``"flow"`` (``X: [[1, 2], [3, 4]]``), ``"rows"``
    (``X:`` then ``- [1, 2]`` per row) or ``"block"`` (``- - 1`` then ``  - 2``, as
    ``yaml.safe_dump`` writes)."""
    if _odd_breaks(text):
        return []
    lists = _list_matrices(text)
    found = []
    for lo, hi in zip([0] + [end for _, end, _, _ in lists], [start for start, _, _, _ in lists] + [len(text)]):
        # flow matrices between the lists (no list holds a key: it is not looked through again)
        if text.find("[", lo, hi) != -1:
            found += [(start, end, rows, "flow") for start, end, rows in _one_line_matrices(text, max_values, lo, hi)]
    found += lists
    found.sort()
    return found


def _one_line_matrices(text: str, max_values: int | None = None, lo: int = 0,
                       hi: int | None = None) -> list[tuple[int, int, list[str]]]:
    """``(start, end, rows)`` of each matrix of plain numbers written in flow style whose key
    is between ``lo`` and ``hi``. A matrix with more commas than ``max_values`` is cut out
    unchecked: it is refused for its size from its rows' text alone."""
    found = []
    pos = 0
    for m in _START.finditer(text, lo, len(text) if hi is None else hi):
        start = m.end()
        if start < pos:
            continue
        # Only brackets, numbers and separators up to the closing "]]": a run that cannot hold
        # another key, so the runs are disjoint and the scan stays linear in the text.
        run = _MATRIX_CHARS.match(text, start)
        end = _close(text, start, run.end())
        if end is None:
            continue
        body = text[start:end]
        if not _AFTER.match(text, end):
            continue
        inner = body[1:-1].strip(" \r\n")
        if not (inner.startswith("[") and inner.endswith("]")):
            continue
        unchecked = max_values is not None and text.count(",", start, end) > max_values
        if not unchecked and not _is_rows(inner):
            continue
        rows = _BETWEEN_ROWS.split(inner[1:-1].replace("\r", "") if "\r" in inner else inner[1:-1])
        if unchecked and not inner.count("[") == inner.count("]") == len(rows):
            continue  # brackets inside a row: not a matrix, whatever its size
        found.append((start, end, rows))
        pos = end
    return found


# -- matrices written as a block list, a row per item ----------------------------------------
#
# ``X:`` alone on its line, then a row per list item, every item at one indentation: flow rows
# (``- [1, 2]``) or the block style ``yaml.safe_dump`` writes (``- - 1``, then ``  - 2`` below).
# Such a list of plain numbers is cut out the same way; its placeholder ``- []`` keeps the
# list's first "-" and its line breaks (see located_yaml._Cut), so the rest of the file composes as it would
# around the list.

# A key alone on its line, then the first item of a list on the next: "- " after ``indent``.
# Found from its colon (a quick scan for ":"), then the line is read back to its start.
_COLON_ALONE = re.compile(r":[ ]*(?=\r?\n([ ]*)- )")
_KEY_BEFORE = re.compile(r"((?:[ ]*+- )*+[ ]*+)[A-Za-z_][A-Za-z0-9_]*")
# After a list: blank and comment lines, then the end of the text or the next line with text.
_NEXT_LINE = re.compile(r"[ ]*(?:\r?\n[ ]*(?:#[^\r\n]*)?(?=\r?\n|\Z))*+(?:\r?\n([ ]*)([^ \r\n])|[ ]*\Z)")


_LIST_PATTERNS: dict[tuple[str, int], re.Pattern] = {}


def _list_pattern(layout: str, indent: int) -> re.Pattern:
    """The items of a list of rows after its first "- ", each at ``indent`` spaces. Possessive
    repeats keep no state per item, so a list of a million entries is matched in one call."""
    pattern = _LIST_PATTERNS.get((layout, indent))
    if pattern is None:
        pattern = _LIST_PATTERNS[(layout, indent)] = re.compile(_list_regex(layout, indent))
    return pattern


# A number in a list of rows may also have a power of ten of one or two digits, as
# ``yaml.safe_dump`` writes small floats (``1.0e-05``).
_LIST_NUMBER = r"-?[0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][-+]?[0-9]{1,2})?(?:/[0-9]{1,30})?"


def _list_regex(layout: str, indent: int) -> str:
    ind, n = " " * indent, _LIST_NUMBER
    if layout == "rows":
        row = rf"\[[ ]*+{n}(?:[ ]*+,[ ]*+{n})*+[ ]*+\][ ]*+"
    else:
        row = rf"- {n}[ ]*+(?:\r?\n{ind}  - {n}[ ]*+)*+"
    return rf"{row}(?:\r?\n{ind}- {row})*+"


def _list_matrices(text: str) -> list[tuple[int, int, list[str], str]]:
    """``(start, end, rows, layout)`` of each list of rows of plain numbers (layout ``"rows"`` or
    ``"block"``) that is a key's value: its items at the key's column or right of it, and the
    next line with text (not a comment) left of them, or at their column and not an item."""
    found = []
    pos = 0
    crlf = "\r" in text
    while True:
        m = _COLON_ALONE.search(text, pos)
        if m is None:
            break
        pos = m.end()
        key = _KEY_BEFORE.fullmatch(text, text.rfind("\n", 0, m.start()) + 1, m.start())
        if key is None:
            continue
        indent = len(m.group(1))
        if indent < len(key.group(1)):
            continue  # an item of an outer list, not the key's value
        start = m.end() + (text[m.end()] == "\r") + 1 + indent  # the first item's "-"
        layout = "rows" if text.startswith("[", start + 2) else "block" if text.startswith("- ", start + 2) else None
        if layout is None:
            continue
        items = _list_pattern(layout, indent).match(text, start + 2)
        if items is None:
            continue
        end = len(text[start:items.end()].rstrip(" ")) + start
        after = _NEXT_LINE.match(text, end)
        if after is None or (after.group(2) is not None and (after.group(2) == "\t" or
                len(after.group(1)) > indent or (len(after.group(1)) == indent and after.group(2) == "-"))):
            continue  # the list goes on in a way the pattern does not know: composed as usual
        body = text[start:end].replace("\r", "") if crlf else text[start:end]
        if layout == "rows":
            rows = [line.strip(" ")[3:-1] for line in body.split("\n")]
        else:
            # "  - " starts a row's next entry, "- - " the next row: distinct, so one pass each.
            rows = body[4:].replace(f"\n{m.group(1)}  - ", ",").split(f"\n{m.group(1)}- - ")
        found.append((start, end, rows, layout))
        pos = end  # a list holds no key: the search goes on after it
    return found
