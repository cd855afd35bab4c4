"""The tests' shared fixture, ``symattn_cli``: the command line in process and through the real
entry point (see :class:`_child.SymattnCli`). The end of a test run counts the skipped tests by
reason, so a run says plainly what it did not test (a missing pdflatex, browser, Node package or
PyTorch) and how much of it."""

from __future__ import annotations

from collections import Counter

import pytest

from _child import SymattnCli


@pytest.fixture(scope="session")
def symattn_cli() -> SymattnCli:
    """``symattn_cli(*args, cwd=...)`` runs ``symattn ARGS`` in process (click's CliRunner),
    ``symattn_cli.main(*args)`` through ``symattn.cli.main`` with its output captured, and
    ``symattn_cli.entry(*args)`` through the installed console script (``python -m symattn``
    when it is not on PATH) in a child running this checkout. Each returns a ``CliResult``:
    ``code``, ``stdout``, ``stderr``, ``output``."""
    return SymattnCli()


def pytest_terminal_summary(terminalreporter) -> None:
    counts: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr  # (path, line, "Skipped: reason") for a skip, also from xdist's workers
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        counts[reason.removeprefix("Skipped: ")] += 1
    if counts:
        terminalreporter.section(f"{sum(counts.values())} skipped, by reason")
        for reason, n in counts.most_common():
            terminalreporter.line(f"{n:6d}  {reason}")
