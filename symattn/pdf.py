"""Compiling a standalone LaTeX solution to PDF with a real TeX installation."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from ._errors import SymattnError

TEX_PACKAGES = "texlive-latex-base texlive-latex-recommended"


def latex_to_pdf(source: str, timeout: float = 120) -> bytes:
    """The PDF of ``source``, compiled in a temporary folder without shell escape."""
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
        return pdf.read_bytes()


def _log_excerpt(log: str) -> str:
    """The error lines of a LaTeX log (those starting with '!') and a little context."""
    lines = log.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("!"):
            return " | ".join(l.strip() for l in lines[k : k + 3] if l.strip())
    return (lines[-1] if lines else "no output").strip()
