"""Problem files: read, validate and turn into an immutable :class:`~symattn.problem.model.Problem`.

Everything a user can get wrong is found by the reader (:mod:`symattn.problem.reader`), before
any arithmetic, and reported as one :class:`~symattn.SymattnError` line naming the file, line,
column and field.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SymattnError
from ..reading import FileError, read_regular
from .budget import BYTES_PER_NUMBER, MAX_SIZE
from .model import Problem
from .reader.document import Reader


def load_problem(source: str | os.PathLike, max_size: int = MAX_SIZE) -> Problem:
    """Read a problem from a file path, or from YAML text (a string with a newline).

    >>> p = load_problem("Q: [[1, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[1], [2]]\\nmask: causal\\n")
    >>> p.n_q, p.n_k, p.d_k, p.mask.allowed
    (1, 2, 2, ((True, False),))
    """
    if isinstance(source, str) and ("\n" in source or source.lstrip().startswith("{")):
        return parse_problem(source, "<problem>", base_dir=None, max_size=max_size)
    path = Path(source)
    name = str(source)
    limit = BYTES_PER_NUMBER * max_size
    try:
        data = read_regular(
            path, limit,
            "the file is {size} bytes, more than the limit of {limit} for " + f"{max_size:,} numbers; "
            "if it is meant to be this large, raise the limit with --max-size",
            noun="problem file",
        )
    except FileError as exc:
        raise SymattnError(str(exc), file=name) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SymattnError(
            f"the file is not UTF-8 text (bad byte at offset {exc.start})", file=name
        ) from None
    return parse_problem(text, name, base_dir=path.resolve().parent, max_size=max_size)


def parse_problem(text: str, file: str, base_dir: Path | None = None, max_size: int = MAX_SIZE) -> Problem:
    """Validate the YAML ``text`` of a problem; ``file`` names it in messages.

    ``max_size`` bounds the count of numbers in all its matrices together, so a
    small file that repeats a row through YAML aliases cannot demand millions.
    """
    return Reader(file, base_dir, max_size).read(text)

