"""A progress display on standard error for derivations that take a while.

It shows the current phase and a bar, only when standard error is a terminal
(never in a pipe, a log or a test run) and only once the work has taken longer
than a second, so quick commands print nothing extra. It erases itself when done.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24  # characters of the bar


class Progress:
    """``phases`` are the names of the steps, in order; call :meth:`advance` as each begins."""

    def __init__(self, phases: list[str], stream: TextIO | None = None, delay: float = 1.0,
                 enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.phases = phases
        self.delay = delay
        self.start = time.monotonic()
        self.index = -1
        self.detail = ""
        self.drawn = 0  # characters on the line now

    def advance(self, phase: str) -> None:
        """Phase ``phase`` begins (nothing happens when the display is off)."""
        if not self.enabled:
            return
        self.index = self.phases.index(phase)
        self.detail = ""
        self._draw()

    def note(self, detail: str) -> None:
        """What the current phase is doing now (a stage id, say)."""
        self.detail = detail
        self._draw()

    def _draw(self) -> None:
        if not self.enabled or time.monotonic() - self.start < self.delay:
            return
        done = max(self.index, 0)
        filled = WIDTH * done // len(self.phases)
        bar = "#" * filled + "." * (WIDTH - filled)
        name = self.phases[self.index] if self.index >= 0 else ""
        line = f"[{bar}] {done + 1}/{len(self.phases)} {name}"
        if self.detail:
            line += f": {self.detail}"
        line = line[:79]
        self.stream.write("\r" + line.ljust(self.drawn))
        self.stream.flush()
        self.drawn = len(line)

    def close(self) -> None:
        """Erase the line, so the command's own output starts clean."""
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
            self.drawn = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
