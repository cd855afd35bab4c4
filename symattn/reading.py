"""Reading a user's file: only a regular file, and never more than a limit.

Every file symattn reads (a problem, an answers file, a ``{file: ...}`` matrix) comes
through :func:`read_regular`. It looks at the file with ``stat`` before opening it, so a
FIFO, a device (a link to ``/dev/zero``), a socket or a folder is refused at once instead
of blocking or filling memory; it refuses a size beyond the limit before reading, and
reads at most the limit (plus one byte, to notice a file that grew).
"""

from __future__ import annotations

import errno
import os
import stat



class FileError(Exception):
    """Why a file cannot be read, in a short sentence; the caller adds the file's name and place.
    ``strerror`` is the system's own wording when the system refused (``No such file or directory``)."""

    def __init__(self, message: str, strerror: str | None = None) -> None:
        super().__init__(message)
        self.strerror = strerror or message

_KINDS = (
    (stat.S_ISDIR, "is a folder, not a {noun}"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file; symattn reads only regular files"),
    (stat.S_ISCHR, "is a device, not a regular file; symattn reads only regular files"),
    (stat.S_ISBLK, "is a device, not a regular file; symattn reads only regular files"),
    (stat.S_ISSOCK, "is a socket, not a regular file; symattn reads only regular files"),
)


def file_error(path: str | os.PathLike, noun: str = "file") -> FileError | None:
    """Why ``path`` cannot be read as a regular file, or None if it can; ``noun`` is what the
    file should be ("problem file"), for the message about a folder."""
    text = os.fspath(path)
    if "\x00" in str(text):
        return FileError("the file name holds a NUL byte; no file is named so")
    try:
        st = os.stat(text)
    except OSError as exc:
        return _os_error(exc)
    except ValueError:
        return FileError("the file name holds a NUL byte; no file is named so")
    return _kind_error(st.st_mode, noun)


def _kind_error(mode: int, noun: str) -> FileError | None:
    for test, what in _KINDS:
        if test(mode):
            return FileError(what.format(noun=noun))
    if not stat.S_ISREG(mode):
        return FileError("is not a regular file; symattn reads only regular files")
    return None


def _os_error(exc: OSError) -> FileError:
    reason = {
        errno.ENOENT: "no such file",
        errno.ELOOP: "the path is a loop of symbolic links; it leads to no file",
        errno.ENOTDIR: "no such file (a part of the path is not a folder)",
        errno.EACCES: "permission denied",
        errno.ENAMETOOLONG: "the file name is too long",
    }.get(exc.errno, f"cannot read the file: {exc.strerror or exc}")
    return FileError(reason, exc.strerror if exc.errno != errno.ELOOP else reason)


def read_regular(path: str | os.PathLike, limit: int, too_large: str, noun: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises :class:`FileError` saying what is wrong; ``too_large`` is its message for a
    file beyond ``limit``, formatted with ``size`` and ``limit`` (written with thousands
    separators).
    """
    why = file_error(path, noun)
    if why is not None:
        raise why
    try:
        # O_NONBLOCK: if the file was swapped for a FIFO since the stat, opening does not wait.
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _os_error(exc) from None
    try:
        st = os.fstat(fd)  # what was opened, not what the name pointed to a moment ago
        why = _kind_error(st.st_mode, noun)
        if why is not None:
            raise why
        if st.st_size > limit:
            raise FileError(too_large.format(size=f"{st.st_size:,}", limit=f"{limit:,}"))
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileError(too_large.format(size=f"more than {limit:,}", limit=f"{limit:,}"))
        return b"".join(chunks)
    except OSError as exc:
        raise FileError(f"cannot read the file: {exc.strerror or exc}", exc.strerror) from None
    finally:
        os.close(fd)
