"""The end of a test run counts the skipped tests by reason, so a run says plainly what it
did not test (a missing pdflatex, browser, Node package or PyTorch) and how much of it."""

from __future__ import annotations

from collections import Counter


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
