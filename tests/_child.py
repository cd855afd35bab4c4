"""Run the real command line (``python -m symattn ...``) in a child process, bounded.

The child gets an address-space cap (``RLIMIT_AS``, 1 GiB by default) and is killed after
``timeout`` seconds; the result carries its exit code, output, wall time and peak resident
memory (from ``wait4``), so a test can assert what a user would see and what it cost.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
TIMEOUT_S = 10.0


@dataclass
class Run:
    code: int
    out: str
    err: str
    seconds: float
    peak_bytes: int
    killed: bool

    def one_error_line(self) -> str:
        """The single ``Error: `` line of a refusal (asserting there is exactly one)."""
        lines = self.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), f"exit {self.code}: {self.err!r}"
        return lines[0]

    def assert_bounded(self, limit_s: float = TIMEOUT_S) -> None:
        """Exit 0 or 1, never a traceback, one ``Error:`` line on exit 1, in time."""
        assert not self.killed, f"killed after {self.seconds:.1f} s (stderr: {self.err[-300:]!r})"
        assert "Traceback" not in self.out + self.err, self.err
        assert self.code in (0, 1), f"exit {self.code}: {self.err!r}"
        if self.code == 1 and not self.out.strip():
            self.one_error_line()
        assert self.seconds < limit_s, f"took {self.seconds:.1f} s"


def run_cli(args: list[str], cwd: str | os.PathLike | None = None, timeout: float = TIMEOUT_S,
            memory: int = GIB, stdin=subprocess.DEVNULL) -> Run:
    """``python -m symattn ARGS`` from this checkout, capped at ``memory`` bytes of address space."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", NO_COLOR="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "symattn", *map(str, args)], cwd=cwd, env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap)
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        chunks[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    seconds = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in readers:
        t.join()
    proc.stdout.close()
    proc.stderr.close()
    return Run(proc.returncode, chunks.get("out", b"").decode("utf-8", "replace"),
               chunks.get("err", b"").decode("utf-8", "replace"), seconds, usage.ru_maxrss * 1024, killed.is_set())
