"""Compiling a standalone LaTeX solution to PDF with a real TeX installation."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

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
