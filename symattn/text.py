"""Whole numbers from what a user typed, short excerpts of it for messages, and the hint for a
misspelt name ("did you mean ...?").

symattn lifts Python's 4,300-digit guard on converting between integers and text (exact
results are printed in full), so every whole number a user writes, in a problem file, an
answers file or on the command line, is read here: in ASCII digits only, with its length
bounded before ``int()`` sees it (that conversion takes time quadratic in the length: a
million digits cost seconds, and a C-level conversion does not stop for a signal).

``str.isdigit()`` is no test for a whole number: it accepts '²', which ``int()`` refuses,
and ``int()`` itself accepts '٣', '３' and '1_000'. Neither is used on user text.

Only the standard library is imported: the command line reads its options with this
module before any heavy import.
"""

from __future__ import annotations

import re

# More digits than any count, size, position or seed symattn works with (2^128 has 39);
# a number this long converts in microseconds.
MAX_WHOLE_DIGITS = 40

_WHOLE = re.compile(r"[0-9]+")
_SIGNED = re.compile(r"[-+]?[0-9]+")


class LongNumber(ValueError):
    """A run of digits longer than a whole number may be; the message says so in one sentence."""

    def __init__(self, text: str, max_digits: int) -> None:
        self.text = text
        self.max_digits = max_digits
        super().__init__(f"{excerpt(text)} has {len(text.lstrip('+-')):,} digits; a whole number here has at most "
                         f"{max_digits}")


def whole_number(text: str, max_digits: int = MAX_WHOLE_DIGITS, signed: bool = False) -> int | None:
    """``text`` as an int when it is written in the ASCII digits 0-9 alone (a leading + or - too
    when ``signed``), else None; :class:`LongNumber` when it has more than ``max_digits`` digits
    (leading zeros count: the length is checked before anything is converted).

    >>> whole_number("42"), whole_number("²"), whole_number("３"), whole_number("1_000"), whole_number(" 1")
    (42, None, None, None, None)
    >>> whole_number("-3", signed=True), whole_number("-3")
    (-3, None)
    >>> try:
    ...     whole_number("7" * 41)
    ... except LongNumber as exc:
    ...     print(exc)
    '7777777777777777777777777777777777777...' has 41 digits; a whole number here has at most 40
    """
    if not isinstance(text, str) or not (_SIGNED if signed else _WHOLE).fullmatch(text):
        return None
    if len(text.lstrip("+-")) > max_digits:
        raise LongNumber(text, max_digits)
    return int(text)


# Unicode's bidirectional controls (the Arabic letter mark, the left-to-right and right-to-left
# marks, embeddings, overrides and isolates): invisible, they reorder the text around them, so
# a token holding U+202E could make what a student reads differ from what was derived.
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_BIDI = re.compile(f"[{BIDI_CONTROLS}]")


def bidi_name(ch: str) -> str:
    """How a bidirectional control is shown: ``U+202E``."""
    return f"U+{ord(ch):04X}"


def show_bidi(text: str) -> str:
    """``text`` with each bidirectional control shown as ``⟨U+202E⟩``, so that it reorders nothing;
    every renderer a person reads uses it (the JSON keeps a token's text exact: it is data).

    >>> show_bidi("ab\u202ecd")
    'ab⟨U+202E⟩cd'
    """
    return _BIDI.sub(lambda m: f"⟨{bidi_name(m.group())}⟩", text) if _BIDI.search(text) else text


def excerpt(text: str, limit: int = 40) -> str:
    """``text`` quoted (``repr``: control and bidirectional characters escaped), cut to its
    first characters when longer than ``limit``: a hostile value is never echoed in full.

    >>> excerpt("abc"), excerpt("x" * 50)
    ("'abc'", "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'")
    """
    text = text if isinstance(text, str) else str(text)
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def quote_path(path) -> str:
    """A path the problem names, quoted for a message: whole up to 120 characters (a real path
    fits), else cut like :func:`excerpt`."""
    return excerpt(str(path), 120)


def shown(value) -> str:
    """A Python value a library call was given, for a message: text by :func:`excerpt`, anything
    else by a bounded ``repr`` (``reprlib``), never in full.

    >>> shown("2"), shown(2.0), shown(list(range(100)))
    ("'2'", '2.0', '[0, 1, 2, 3, 4, 5, ...]')
    """
    import reprlib

    return excerpt(value) if isinstance(value, str) else excerpt(reprlib.repr(value))[1:-1]


def did_you_mean(word, choices, *, ignore_case: bool = False) -> str:
    """`` (did you mean 'S_scaled'?)`` for the closest of ``choices`` to ``word``, else ``""``;
    ``ignore_case``: a choice that is ``word`` but for case is named first.

    >>> did_you_mean("S_scaed", ["S", "S_scaled"]), did_you_mean("x", ["X"], ignore_case=True)
    (" (did you mean 'S_scaled'?)", " (did you mean 'X'?)")
    """
    import difflib

    choices = list(choices)
    if ignore_case and isinstance(word, str):
        lowered = {c.lower(): c for c in choices}
        if word.lower() in lowered:
            return f" (did you mean {lowered[word.lower()]!r}?)"
    close = difflib.get_close_matches(str(word), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
