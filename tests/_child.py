"""Run the real command line (``python -m symattn ...``) in a child process, bounded.

The child gets an address-space cap (``RLIMIT_AS``, 1 GiB by default) and a CPU-time cap
(``RLIMIT_CPU``, ``CPU_CAP_S``); the result carries its exit code, output, the CPU seconds
it used and its peak resident memory (both from ``wait4``), so a test can assert what a
user would see and what it cost. The cost is CPU time, what the child itself spent: a busy
machine stretches the wall clock, not that. A wall-clock guard (``HANG_S``, minutes) only
ends a child blocked for ever without using the CPU, on a pipe say; it never fires on an
honest machine, however loaded. How long a run takes on the wall clock is a benchmark's
figure (benchmarks/stress_limits.py).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
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


def run_cli(args: list[str], cwd: str | os.PathLike | None = None, timeout: float = HANG_S,
            memory: int = GIB, stdin=subprocess.DEVNULL, cpu: int = CPU_CAP_S) -> Run:
    """``python -m symattn ARGS`` from this checkout, capped at ``memory`` bytes of address space
    and ``cpu`` seconds of CPU time; ``timeout`` is the wall-clock guard against a stuck child."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200", NO_COLOR="1",
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU at cpu s, SIGKILL 5 s later
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU dumps no core into cwd

    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "symattn", *map(str, args)], cwd=cwd, env=env, stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap)
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        chunks[name] = stream.read()

    readers = [threading.Thread(target=drain, args=(n, s)) for n, s in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    hung = threading.Event()

    def kill() -> None:
        hung.set()
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
    over_cpu = os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL) and not hung.is_set()
    killed_by = "the hang guard" if hung.is_set() else "the CPU cap" if over_cpu else ""
    return Run(proc.returncode, chunks.get("out", b"").decode("utf-8", "replace"),
               chunks.get("err", b"").decode("utf-8", "replace"), seconds, usage.ru_utime + usage.ru_stime,
               usage.ru_maxrss * 1024, bool(killed_by), killed_by)
