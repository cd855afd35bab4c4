"""Compiling a standalone LaTeX solution to PDF with a real TeX installation."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable

from ..errors import SymattnError

TEX_PACKAGES = "texlive-latex-base texlive-latex-recommended"


def latex_to_pdf(source: str, timeout: float = 120) -> bytes:
    """The PDF of ``source``, compiled in a temporary folder without shell escape."""
    return compile_latex(source, timeout)[0]


_DISPLAY = re.compile(r"^symattn: display ([0-9.]+)pt of ([0-9.]+)pt$", re.MULTILINE)


def display_scales(log: str) -> list[float]:
    """The factor each display of a compiled solution needed to fit the line (1 when it fits),
    in order, from the widths symattn's ``\\symattnfit`` writes to the LaTeX log. A factor
    below 0.85 means the display was drawn at 0.85 and sticks into the margin.

    >>> display_scales("symattn: display 250.0pt of 500.0pt\\nsymattn: display 625.0pt of 500.0pt")
    [1.0, 0.8]
    """
    return [min(1.0, float(line) / float(display)) for display, line in _DISPLAY.findall(log)]


def compile_latex(source: str, timeout: float = 120) -> tuple[bytes, str]:
    """The PDF of ``source`` and the log of its last pdflatex run (see :func:`display_scales`)."""
    _check_line_lengths(source)
    pdflatex = shutil.which("pdflatex")
    latexmk = shutil.which("latexmk")
    if pdflatex is None:
        raise SymattnError(
            f"writing a PDF needs pdflatex, which is not installed; on Debian or Ubuntu: apt-get install {TEX_PACKAGES}"
        )
    with tempfile.TemporaryDirectory(prefix="symattn-") as tmp:
        tex = Path(tmp) / "solution.tex"
        tex.write_text(source, encoding="utf-8")
        try:
            flags = ["-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode"]
            if latexmk is not None:  # reruns pdflatex as often as the document needs
                command = [latexmk, "-pdf", "-quiet", f"-pdflatex={pdflatex} {' '.join(flags)} %O %S", "solution.tex"]
            else:
                command = [pdflatex, *flags, "solution.tex"]
            run = subprocess.run(
                command,
                cwd=tmp,
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise SymattnError(f"pdflatex did not finish within {timeout:.0f} s") from None
        pdf = Path(tmp) / "solution.pdf"
        if run.returncode != 0 or not pdf.exists():
            log = Path(tmp) / "solution.log"
            # pdflatex writes some fatal errors (a line too long to read) only to its terminal
            text = (log.read_text("utf-8", "replace") if log.exists() else "") + "\n" + run.stdout.decode("utf-8", "replace")
            raise SymattnError("pdflatex failed: " + _log_excerpt(text))
        log = Path(tmp) / "solution.log"
        return pdf.read_bytes(), (log.read_text("utf-8", "replace") if log.exists() else "")


_FLAGS = ("-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode")
_RUNS = 5  # pdflatex runs of one document at most, as latexmk allows
_RERUN = re.compile(r"Rerun to get|Label\(s\) may have changed|Rerun LaTeX")
_SHARED_AT = "\n\\title{"  # the preamble before a sheet's title is the same in every sheet of a batch
_FORMAT_FROM = 4  # documents in a batch from which a preloaded preamble pays for its making


def workers() -> int:
    """The cores this process may run on: as many pdflatex runs at once."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def latex_to_pdfs(sources: Iterable[str], count: int, timeout: float = 120, jobs: int | None = None) -> list[bytes]:
    """The PDFs of ``count`` documents: :func:`compile_latexes` without the logs."""
    return [pdf for pdf, _ in compile_latexes(sources, count, timeout, jobs)]


def compile_latexes(sources: Iterable[str], count: int, timeout: float = 120,
                    jobs: int | None = None) -> list[tuple[bytes, str]]:
    """The PDFs of ``count`` documents and the logs of their last pdflatex runs (see
    :func:`display_scales`). The documents (``sources``) may still be being made: each is
    compiled as soon as it comes, one pdflatex run per core at once. Each PDF is the one
    :func:`latex_to_pdf` makes of its source (pdflatex is run again while its log asks for it);
    documents that share their preamble up to the title load it from a format made once. Every
    run is bounded by ``timeout``; the first document that fails (in order) is the error, and
    no document still waiting is started after a failure."""
    pdflatex = shutil.which("pdflatex")
    if pdflatex is None:
        raise SymattnError(
            f"writing a PDF needs pdflatex, which is not installed; on Debian or Ubuntu: apt-get install {TEX_PACKAGES}"
        )
    pool = ThreadPoolExecutor(max_workers=jobs or workers())
    with tempfile.TemporaryDirectory(prefix="symattn-") as tmp:
        try:
            futures = _submit(pool, pdflatex, sources, count, Path(tmp), timeout)
            return [future.result() for future in futures]  # the first failure in order is raised
        finally:  # after a failure (or ^C) nothing more is started; the runs under way end within timeout
            pool.shutdown(wait=True, cancel_futures=True)


def _submit(pool: ThreadPoolExecutor, pdflatex: str, sources: Iterable[str], count: int, tmp: Path,
            timeout: float) -> list:
    """Each source handed to the pool as it comes, until one already compiled has failed."""
    formats: dict[str, str | None] = {}
    futures = []
    for k, source in enumerate(sources):
        _check_line_lengths(source)
        if any(f.done() and f.exception() is not None for f in futures):
            break
        shared = source.find(_SHARED_AT) + 1 if count >= _FORMAT_FROM else 0
        preamble = source[:shared]
        if preamble and preamble not in formats:
            formats[preamble] = _make_format(pdflatex, preamble, tmp / f"format-{len(formats)}", timeout)
        fmt = formats.get(preamble)
        futures.append(pool.submit(_compile_one, pdflatex, source, tmp / str(k), timeout, fmt, len(preamble)))
    return futures


def _make_format(pdflatex: str, preamble: str, folder: Path, timeout: float) -> str | None:
    """A format holding ``preamble`` already read (its path without ``.fmt``), None if it cannot be made."""
    folder.mkdir()
    (folder / "preamble.tex").write_text(preamble + "\\dump\n", encoding="utf-8")
    try:
        run = subprocess.run([pdflatex, "-ini", "-jobname=preamble", *_FLAGS, "&pdflatex", "preamble.tex"],
                             cwd=folder, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    made = folder / "preamble.fmt"
    return str(made.with_suffix("")) if run.returncode == 0 and made.exists() else None


def _compile_one(pdflatex: str, source: str, folder: Path, timeout: float, fmt: str | None,
                 skip: int) -> tuple[bytes, str]:
    """One document's PDF: from the format ``fmt`` that holds its first ``skip`` characters, when
    there is one; a failure is compiled again as a whole, so its error is the one it has alone."""
    folder.mkdir()
    if fmt is None:
        (folder / "solution.tex").write_text(source, encoding="utf-8")
        return _runs([pdflatex, *_FLAGS, "solution.tex"], folder, timeout)
    (folder / "body.tex").write_text(source[skip:], encoding="utf-8")
    try:
        return _runs([pdflatex, f"-fmt={fmt}", "-jobname=solution", *_FLAGS, "body.tex"], folder, timeout)
    except SymattnError as exc:
        if not str(exc).startswith("pdflatex failed"):
            raise
        return _compile_one(pdflatex, source, folder / "alone", timeout, None, 0)


def _runs(command: list[str], folder: Path, timeout: float) -> tuple[bytes, str]:
    """pdflatex run in ``folder`` until its log asks for no other run (at most :data:`_RUNS`)."""
    for _ in range(_RUNS):
        try:
            run = subprocess.run(command, cwd=folder, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SymattnError(f"pdflatex did not finish within {timeout:.0f} s") from None
        pdf, log = folder / "solution.pdf", folder / "solution.log"
        text = log.read_text("utf-8", "replace") if log.exists() else ""
        if run.returncode != 0 or not pdf.exists():
            raise SymattnError("pdflatex failed: " + _log_excerpt(text + "\n" + run.stdout.decode("utf-8", "replace")))
        if not _RERUN.search(text):
            break
    return pdf.read_bytes(), text


TEX_LINE_LIMIT = 200_000  # characters: TeX Live's buf_size, the longest line pdflatex reads


def _check_line_lengths(source: str) -> None:
    """A line longer than pdflatex can read is named before it is tried (a very long title, say)."""
    for number, line in enumerate(source.split("\n"), start=1):
        if len(line) >= TEX_LINE_LIMIT:
            start = line[:40]
            raise SymattnError(
                f"cannot make the PDF: line {number} of the LaTeX is {len(line):,} characters long "
                f"(it starts {start!r}), and pdflatex reads at most {TEX_LINE_LIMIT:,} characters a line; "
                "shorten the title, tokens or entries, or write .tex or .md instead"
            )


# Causes of pdflatex failures, by the start of TeX's error line, in words a user can act on.
_CAUSES = {
    "! Unable to read an entire line": "a line of the LaTeX is longer than pdflatex can read "
                                       "(a very long title, tokens or entries)",
    "! TeX capacity exceeded": "the document is too large for pdflatex's memory; write .tex or .md instead",
    "! Dimension too large": "a number is too large for TeX to typeset",
}


def _log_excerpt(log: str) -> str:
    """The error lines of a LaTeX log (those starting with '!', also right after a file's
    closing parenthesis) and a little context, led by the cause in words when it is known."""
    lines = log.splitlines()
    for k, line in enumerate(lines):
        bang = line.find("! ")
        if bang == 0 or (bang > 0 and set(line[:bang]) <= {")", " "}):
            first = line[bang:]
            excerpt = " | ".join(l.strip() for l in [first, *lines[k + 1 : k + 3]] if l.strip())
            cause = next((why for start, why in _CAUSES.items() if first.startswith(start)), None)
            return f"{cause} ({excerpt})" if cause else excerpt
    return (lines[-1] if lines else "no output").strip()
