"""Writing what symattn makes, without harming anything that is not symattn's.

* An output file is written to a temporary file beside it and renamed over it,
  so a failed or interrupted run leaves the old file untouched; the temporary
  file is removed on an error, on Ctrl-C and on SIGTERM.
* ``-o`` naming a symbolic link writes the file the link points to (as a
  shell's ``>`` does); the link stays a link.
* ``-o`` naming a character device (``/dev/null``, a terminal) or a FIFO writes
  into it in place, as a shell's ``>`` does: it is never renamed over. A FIFO
  that no program is reading is an error rather than a wait. A folder, a block
  device (a disk) or a socket is refused.
* A batch of files (``generate --count``) is built in a temporary folder and
  moved in only when every file is made; existing files are replaced only when
  asked (``--force``).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import click

_TEMPS: set[str] = set()  # temporary files and folders this process is writing now


def cleanup() -> None:
    """Remove every temporary file or folder still being written (after SIGTERM, say)."""
    for tmp in list(_TEMPS):
        _remove(tmp)
        _TEMPS.discard(tmp)


def _remove(tmp: str) -> None:
    try:
        if os.path.isdir(tmp) and not os.path.islink(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            os.unlink(tmp)
    except OSError:
        pass


def _mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _fail(path: Path, what: str) -> click.ClickException:
    return click.ClickException(f"{path}: {what}")


def check_output(path: Path) -> str | None:
    """What ``path`` is when :func:`write_file` writes into it in place (``"a character device"``
    or ``"a FIFO"``), else None; a folder, a block device or a socket is refused with one
    ``Error:`` line (exit 1). The command line asks this before any work, so a wrong ``-o``
    costs no derivation and leaves nothing behind."""
    try:
        st = os.stat(path)  # follows links
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _fail(path, f"cannot write there: {exc.strerror or exc}") from None
    kind = _kind(st.st_mode)
    if kind in ("a character device", "a FIFO"):
        return kind
    if kind is not None:
        raise _fail(path, f"is {kind}; symattn writes regular files, devices such as /dev/null and FIFOs")
    return None


def write_file(path: Path, data) -> None:
    """Write ``data`` to ``path`` all at once: a failure leaves the old file untouched.

    ``data`` is bytes, or a function that writes the text piece by piece with the ``write`` it is
    given (a stream such as the JSON of a model-sized head), UTF-8 encoded.

    A symbolic link is followed; a character device or a FIFO is written in
    place; a folder, a block device or a socket is refused (see the module's
    documentation).
    """
    kind = check_output(path)
    if kind is not None:
        _write_in_place(path, data, kind)
        return
    target = Path(os.path.realpath(path))  # a link's target, so the link itself is not replaced
    folder = target.parent
    if not folder.is_dir():
        raise _fail(path, f"the folder {folder} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise _fail(path, f"cannot write there: {exc.strerror or exc}") from None
    _TEMPS.add(tmp)
    try:
        if callable(data):
            with os.fdopen(fd, "wb") as f:
                stream(data, lambda text: f.write(text.encode("utf-8")))
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o666 & ~_mode())  # mkstemp makes 0600; an output is an ordinary file
        os.replace(tmp, target)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError):
            raise _fail(path, f"cannot write there: {exc.strerror or exc}") from None
        raise
    finally:
        _TEMPS.discard(tmp)


_STREAM_CHUNK = 1 << 20  # characters gathered before they are encoded and written together


def stream(data, put) -> None:
    """Run ``data(write)``, handing ``put`` the text it writes about a megabyte at a time: many
    small pieces are joined (and then encoded, written or echoed) once each megabyte."""
    pending: list[str] = []
    size = 0

    def write(piece: str) -> None:
        nonlocal size
        pending.append(piece)
        size += len(piece)
        if size >= _STREAM_CHUNK:
            put("".join(pending))
            pending.clear()
            size = 0

    data(write)
    if pending:
        put("".join(pending))


def _write_in_place(path: Path, data: bytes, kind: str) -> None:
    """Write into a device or a FIFO as a shell's ``>`` would (never renaming over it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        if exc.errno == errno.ENXIO and kind == "a FIFO":
            raise _fail(path, "is a FIFO that no program is reading; start the reader first") from None
        raise _fail(path, f"cannot write there: {exc.strerror or exc}") from None
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)  # the reader sets the pace from here on
        def put(chunk: bytes) -> None:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]

        if callable(data):
            stream(data, lambda text: put(text.encode("utf-8")))
        else:
            put(data)
    except OSError as exc:
        raise _fail(path, f"cannot write there: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


class StdoutError(click.ClickException):
    """Standard output cannot be written (a full disk, say)."""


def silence_stdout() -> None:
    """After standard output failed: point it at /dev/null, so the interpreter's last flush
    of what is still buffered cannot fail again (which would print a second message)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test's capture): nothing is flushed at exit
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except OSError:
        pass


def echo(text: str, nl: bool = True) -> None:
    """``click.echo`` to standard output, with a full disk or a closed pipe as an ``Error:`` line."""
    try:
        click.echo(text, nl=nl)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(f"cannot write to standard output: {exc.strerror or exc}") from None


class Batch:
    """Files made together, moved into ``folder`` only when all of them are made.

    ``names`` are the files the batch will hold. Without ``force``, any of
    them that exists already is an error listing them, before anything is
    made. Use as a context manager; :meth:`path` gives where to write each
    file meanwhile (a temporary folder beside or inside ``folder``), and a
    clean exit moves them in. An error leaves ``folder`` as it was.
    """

    def __init__(self, folder: Path, names: list[str], force: bool) -> None:
        self.folder = folder
        self.names = names
        self.force = force
        self.tmp: str | None = None
        # a folder, or a path to one still to be made: refused before anything is made
        if folder.exists() and not folder.is_dir():
            raise _fail(folder, "is not a folder")
        where = folder.resolve()
        while not where.is_dir():  # the nearest folder that exists: the rest is made when the batch is moved in
            if where.exists():
                raise _fail(folder, f"{where} is not a folder")
            where = where.parent
        self.where = where
        existing = []
        for name in names:
            try:
                st = os.stat(folder / name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _fail(folder / name, f"cannot write there: {exc.strerror or exc}") from None
            kind = _kind(st.st_mode)
            if kind is not None:
                raise _fail(folder / name, f"is {kind}; symattn will not replace it")
            existing.append(name)
        if existing and not force:
            shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
            raise click.ClickException(
                f"{folder}: would overwrite {shown} ({len(existing)} existing file{'s' * (len(existing) != 1)}); "
                "nothing was written; add --force to replace them, or choose another --out-dir"
            )

    def __enter__(self) -> "Batch":
        folder = self.folder
        try:
            self.tmp = tempfile.mkdtemp(prefix=f".{folder.resolve().name}.", suffix=".tmp", dir=self.where)
        except OSError as exc:
            raise _fail(folder, f"cannot write there: {exc.strerror or exc}") from None
        _TEMPS.add(self.tmp)
        return self

    def path(self, name: str) -> Path:
        assert self.tmp is not None and name in self.names, name
        return Path(self.tmp) / name

    def write(self, name: str, data: bytes) -> None:
        """Write file ``name`` (a path inside the folder: a course platform's files have their own folders)."""
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def __exit__(self, exc_type, exc, tb) -> None:
        tmp = self.tmp
        try:
            if exc_type is None:
                self._move_in()
        finally:
            _remove(tmp)
            _TEMPS.discard(tmp)

    def _move_in(self) -> None:
        mode = 0o666 & ~_mode()
        for name in self.names:
            os.chmod(Path(self.tmp) / name, mode)
        if not self.folder.exists():
            try:  # the whole folder at once
                self.folder.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(self.tmp, 0o777 & ~_mode())
                os.rename(self.tmp, self.folder)
                return
            except OSError:
                try:
                    self.folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise _fail(self.folder, f"cannot make the folder: {exc.strerror or exc}") from None
        moved: list[Path] = []
        try:
            for name in self.names:
                src, dst = Path(self.tmp) / name, self.folder / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                if self.force:
                    os.replace(src, dst)
                    continue
                try:  # a link fails if the name was taken meanwhile: nothing is replaced
                    os.link(src, dst)
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK) or dst.exists():
                        raise
                    os.replace(src, dst)  # a file system without hard links
                moved.append(dst)
        except OSError as exc:
            for dst in moved:
                _remove(str(dst))
            if exc.errno == errno.EEXIST:
                raise _fail(Path(exc.filename2 or exc.filename or self.folder),
                            "appeared while the batch was made; nothing was written; add --force to replace it") from None
            raise _fail(self.folder, f"cannot write there: {exc.strerror or exc}") from None
