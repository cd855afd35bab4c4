"""Run the real command line (``python -m symattn ...``) in a child process, bounded.

The child gets an address-space cap (``RLIMIT_AS``, 1 GiB by default) and a CPU-time cap
(``RLIMIT_CPU``, ``CPU_CAP_S``); the result carries its exit code, output, the CPU seconds
it used and its peak resident memory (both from ``wait4``), so a test can assert what a
user would see and what it cost. The child is started by a small launcher (:data:`LAUNCHER`), a
fresh process that sets the caps and forks it: Linux counts a child's peak memory from the
process it was forked from, and a test worker grown to hundreds of MiB would lend it its own. The cost is CPU time, what the child itself spent: a busy
machine stretches the wall clock, not that. A wall-clock guard (``HANG_S``, minutes) only
ends a child blocked for ever without using the CPU, on a pipe say; it never fires on an
honest machine, however loaded. How long a run takes on the wall clock is a benchmark's
figure (benchmarks/stress_limits.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
# What assert_bounded allows a run: a result or one Error: line in seconds of CPU time. The
# costliest hostile case today (600,000 token ids) takes 9 s of CPU, and about as much on a
# loaded machine (CPU time, unlike the wall clock, barely moves with load); 20 s leaves it a
# margin of two, and still fails a conversion or a search that grows out of bounds.
CPU_LIMIT_S = 20.0
CPU_CAP_S = 60  # RLIMIT_CPU: a child past this much CPU time is killed (SIGXCPU, then SIGKILL)
HANG_S = 600.0  # a child still running after this long on the wall clock is killed: it is stuck


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float  # on the wall clock, for messages: load stretches it, so never assert on it
    cpu_seconds: float  # user + system CPU time of the child (and of any children it waited for)
    peak_bytes: int
    killed: bool
    killed_by: str = ""  # "the CPU cap" or "the hang guard", when killed

    def one_error_line(self) -> str:
        """The single ``Error: `` line of a refusal (asserting there is exactly one)."""
        lines = self.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), f"exit {self.code}: {self.err!r}"
        return lines[0]

    def assert_bounded(self, limit_s: float = CPU_LIMIT_S) -> None:
        """Exit 0 or 1, never a traceback, one ``Error:`` line on exit 1, in ``limit_s`` CPU seconds."""
        assert not self.killed, (f"killed by {self.killed_by} after {self.cpu_seconds:.1f} s of CPU time "
                                 f"({self.seconds:.1f} s on the wall clock; stderr: {self.err[-300:]!r})")
        assert "Traceback" not in self.out + self.err, self.err
        assert self.code in (0, 1), f"exit {self.code}: {self.err!r}"
        if self.code == 1 and not self.out.strip():
            self.one_error_line()
        assert self.cpu_seconds < limit_s, f"took {self.cpu_seconds:.1f} s of CPU time ({self.seconds:.1f} s on the wall clock)"


SCRIPT = shutil.which("symattn")  # the installed console script, when it is on PATH


def entry_point(how: str = "auto") -> list[str]:
    """The command that runs symattn: ``how`` is ``python-m`` (``python -m symattn``), ``script``
    (the console script on PATH) or ``auto`` (the console script when it is on PATH, else python -m)."""
    if how == "script" or how == "auto" and SCRIPT is not None:
        assert SCRIPT is not None, "the symattn console script is not on PATH"
        return [SCRIPT]
    return [sys.executable, "-m", "symattn"]


def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a child running symattn: this checkout first on the path, then ``env``."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))


# The launcher: ``python -c LAUNCHER FD MEMORY CPU PROGRAM ARGS...`` caps its address space at MEMORY
# bytes ("-": none) and its CPU time at CPU seconds, forks PROGRAM under the same caps, waits for it,
# writes its CPU seconds and peak resident KiB to FD, and ends as it ended (its exit code, or its signal).
LAUNCHER = """
import os, resource, signal, sys
fd, memory, cpu = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if memory != "-":
    resource.setrlimit(resource.RLIMIT_AS, (int(memory), int(memory)))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU at cpu s, SIGKILL 5 s later
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU dumps no core into cwd
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execv(sys.argv[4], sys.argv[4:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
os.write(fd, f"{usage.ru_utime + usage.ru_stime} {usage.ru_maxrss}".encode())
os.close(fd)
if os.WIFSIGNALED(status):
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
os._exit(os.waitstatus_to_exitcode(status))
"""


def run_cli(args: list[str], cwd: str | os.PathLike | None = None, timeout: float = HANG_S,
            memory: int | None = GIB, stdin=subprocess.DEVNULL, cpu: int = CPU_CAP_S, how: str = "python-m",
            env: dict[str, str] | None = None, steady: bool = True, stdout=subprocess.PIPE) -> Run:
    """``python -m symattn ARGS`` from this checkout (``how``: see :func:`entry_point`), capped at
    ``memory`` bytes of address space (None: no cap) and ``cpu`` seconds of CPU time; ``timeout`` is
    the wall-clock guard against a stuck child; ``env`` is added to the environment (``steady``:
    after a wide terminal, no colour and one BLAS thread, so that runs compare). ``stdout`` is
    captured unless it is given a file to write to (``/dev/full``, say): then ``out`` is empty."""
    steady_env = {"COLUMNS": "200", "NO_COLOR": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                  "MKL_NUM_THREADS": "1"} if steady else {}
    env = child_env({**steady_env, **(env or {})})

    report_r, report_w = os.pipe()  # the launcher writes the child's CPU seconds and peak memory here
    launcher = [sys.executable, "-c", LAUNCHER, str(report_w), "-" if memory is None else str(memory), str(cpu)]
    start = time.monotonic()
    try:
        proc = subprocess.Popen([*launcher, *entry_point(how), *map(str, args)], cwd=cwd, env=env, stdin=stdin,
                                stdout=stdout, stderr=subprocess.PIPE, pass_fds=(report_w,),
                                start_new_session=True)  # the hang guard ends the launcher and the child together
    finally:
        os.close(report_w)
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        chunks[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))
               if s is not None]
    for t in readers:
        t.start()
    hung = threading.Event()

    def kill() -> None:
        hung.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    with os.fdopen(report_r, "rb") as report:
        measured = report.read().split()
    # the child's own figures; the launcher's (which waited for it) if it was killed before writing them
    cpu_seconds, peak = (float(measured[0]), int(measured[1])) if len(measured) == 2 else (
        usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
    seconds = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    over_cpu = os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL) and not hung.is_set()
    killed_by = "the hang guard" if hung.is_set() else "the CPU cap" if over_cpu else ""
    return Run(proc.returncode, chunks.get("out", b"").decode("utf-8", "replace"),
               chunks.get("err", b"").decode("utf-8", "replace"), seconds, cpu_seconds, peak * 1024,
               bool(killed_by), killed_by)


# -- the CLI in process, and through the real entry point (the conftest's symattn_cli fixture) ----------


@dataclass
class CliResult:
    """What a run of ``symattn ARGS`` printed and returned. ``output`` is what a terminal shows
    (click's interleaving of both streams in process; stdout then stderr from a child);
    ``exception`` is what escaped the command in process (None from a child)."""

    code: int
    stdout: str
    stderr: str
    output: str
    exception: BaseException | None = None
    exc_info: tuple | None = None

    @property
    def exit_code(self) -> int:  # as click's Result names it
        return self.code

    @property
    def returncode(self) -> int:  # as subprocess names it
        return self.code


class SymattnCli:
    """``symattn ARGS`` three ways: ``cli(*args)`` in process through click's CliRunner,
    ``cli.main(*args)`` through :func:`symattn.cli.main` (exit codes, signals and internal errors
    as the console script has them) with the output captured, and ``cli.entry(*args)`` through the
    real entry point in a child process (:func:`run_cli`); ``cli.bounded(*args)`` is a child under
    a memory and CPU cap that reports what it cost."""

    def __call__(self, *args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                 input: str | bytes | None = None, catch_exceptions: bool = True,
                 show_traceback: bool = False) -> CliResult:
        """In process through CliRunner; with ``show_traceback``, an exception the command let
        escape is appended to stderr as the traceback a user would have seen."""
        from click.testing import CliRunner

        from symattn.cli import cli

        with _working_directory(cwd):
            r = CliRunner().invoke(cli, [str(a) for a in args], prog_name="symattn", env=env, input=input,
                                   catch_exceptions=catch_exceptions)
        stderr = r.stderr
        if show_traceback and r.exception is not None and not isinstance(r.exception, SystemExit):
            stderr += "".join(traceback.format_exception(*r.exc_info))
        return CliResult(r.exit_code, r.stdout, stderr, r.output, r.exception, r.exc_info)

    def main(self, *args, cwd: str | os.PathLike | None = None) -> CliResult:
        """In process through ``symattn.cli.main(argv)``, standard output and error captured."""
        from symattn.cli import main

        out, err = io.TextIOWrapper(io.BytesIO(), "utf-8"), io.TextIOWrapper(io.BytesIO(), "utf-8")
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            with _working_directory(cwd):
                code = main([str(a) for a in args])
        finally:
            sys.stdout, sys.stderr = saved
        texts = []
        for stream in (out, err):
            stream.flush()
            texts.append(stream.buffer.getvalue().decode("utf-8", "replace"))
        return CliResult(code, texts[0], texts[1], texts[0] + texts[1])

    def entry(self, *args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
              how: str = "auto", memory: int | None = None, cpu: int = 10 * CPU_CAP_S,
              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) -> CliResult:
        """Through the real entry point (see :func:`entry_point` for ``how``) in a child process
        running this checkout, bounded as :func:`run_cli` bounds it (``stdout``: a file to write
        standard output to instead of capturing it)."""
        r = run_cli([str(a) for a in args], cwd=cwd, memory=memory, cpu=cpu, how=how,
                    env={"PYTHONIOENCODING": "utf-8", **(env or {})}, stdin=stdin, steady=False, stdout=stdout)
        assert not r.killed, f"killed by {r.killed_by} ({r.err[-300:]!r})"
        return CliResult(r.code, r.out, r.err, r.out + r.err)

    def bounded(self, *args, cwd: str | os.PathLike | None = None, memory: int | None = GIB, cpu: int = CPU_CAP_S,
                **kwargs) -> Run:
        """``python -m symattn ARGS`` in a child process capped at ``memory`` bytes of address space
        and ``cpu`` seconds of CPU time, and what it cost: a :class:`Run` (``cpu_seconds``,
        ``peak_bytes``, ``assert_bounded``; a child killed by a cap is reported, not raised). The
        other keywords are :func:`run_cli`'s."""
        return run_cli([str(a) for a in args], cwd=cwd, memory=memory, cpu=cpu, **kwargs)


class _working_directory:
    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = path

    def __enter__(self) -> None:
        self.old = os.getcwd()
        if self.path is not None:
            os.chdir(self.path)

    def __exit__(self, *exc) -> None:
        os.chdir(self.old)
