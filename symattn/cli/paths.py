"""The commands' files: outputs refused before any work (a folder, the problem itself, one of its
inputs), written all at once, and standard output."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

import click

_READING: list[str] | None = None  # the files opened while a problem is read (see inputs)
_HOOKED = False


def _audit(event: str, args: tuple) -> None:
    if _READING is not None and event == "open" and isinstance(args[0], (str, os.PathLike)):
        _READING.append(os.fspath(args[0]))


class inputs:
    """Records every file opened while a problem is read (the problem and its .csv and .npy
    matrices), so that no output is written over one of them."""

    def __enter__(self) -> list[str]:
        global _READING, _HOOKED
        if not _HOOKED:
            sys.addaudithook(_audit)  # audit hooks stay for the process: one, switched by _READING
            _HOOKED = True
        _READING = []
        return _READING

    def __exit__(self, *exc) -> None:
        global _READING
        _READING = None


def refuse_input(path: Path | None, read: list[str], what: str, problem: Path | None = None,
                 itself: str = "the problem file itself") -> None:
    """Refuse an output ``path`` that is the problem or one of the files ``read`` with it."""
    if path is None:
        return
    if problem is not None and same_file(path, problem):
        raise click.ClickException(f"{path} is {itself}; choose another output path")
    for name in dict.fromkeys(read):
        if os.path.isfile(name) and same_file(path, Path(name)):
            raise click.ClickException(f"{path} is {what} ({name}); choose another output path")


def is_stream(path: Path) -> bool:
    """Whether ``path`` is a character device or a FIFO (written in place, see symattn.writing)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def check_outputs(*paths: Path | None) -> None:
    """Refuse an output path symattn would not write (a folder, a socket, ...) before any work: one
    ``Error:`` line, as every other bad path gets (see symattn.writing)."""
    from ..writing import check_output

    for path in paths:
        if path is not None:
            check_output(path)


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def write_atomic(path: Path, data: "bytes | Callable[[Callable[[str], object]], None]") -> None:
    """Write ``data`` to ``path`` all at once (see symattn.writing): a failure leaves the old file untouched.
    ``data`` is the bytes, or a function that writes the text piece by piece with the ``write`` it is
    given (streamed into the temporary file, which replaces ``path`` only when the last piece is written)."""
    from ..writing import write_file

    write_file(path, data)


def echo(text: str, nl: bool = True) -> None:
    """Standard output; a full disk is an ``Error:`` line (see symattn.writing)."""
    from ..writing import echo as _write

    _write(text, nl)
