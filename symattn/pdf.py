"""Compiling a standalone LaTeX solution to PDF with a real TeX installation."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ._errors import SymattnError

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
            text = log.read_text("utf-8", "replace") if log.exists() else run.stdout.decode("utf-8", "replace")
            raise SymattnError("pdflatex failed: " + _log_excerpt(text))
        log = Path(tmp) / "solution.log"
        return pdf.read_bytes(), (log.read_text("utf-8", "replace") if log.exists() else "")


def _log_excerpt(log: str) -> str:
    """The error lines of a LaTeX log (those starting with '!') and a little context."""
    lines = log.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("!"):
            return " | ".join(l.strip() for l in lines[k : k + 3] if l.strip())
    return (lines[-1] if lines else "no output").strip()
