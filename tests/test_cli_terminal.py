"""``symattn derive`` on a terminal: the text solution, ending in a line naming the other formats.

Standard output is a real pseudo-terminal here (``pty.openpty``), as a newcomer's shell gives it;
piped or redirected output keeps the contract's default, LaTeX.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pty = pytest.importorskip("pty")  # POSIX only

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "causal_4_tokens.yaml"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _on_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``symattn ARGS`` with standard output on a pseudo-terminal; its output, line ends as written."""
    master, slave = pty.openpty()
    import termios

    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR  # the terminal would turn each \n into \r\n
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    proc = subprocess.Popen([sys.executable, "-m", "symattn", *args], stdout=slave, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, cwd=cwd, env=_env())
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    proc.stderr.read()
    return proc.wait(), b"".join(chunks).decode("utf-8")


def _piped(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "symattn", *args], capture_output=True, cwd=cwd, env=_env())


@pytest.mark.parametrize("problem", [None, EXAMPLE], ids=["builtin", "file"])
def test_a_terminal_gets_the_text_solution_and_the_way_to_the_other_formats(problem, tmp_path):
    args = ["derive"] + ([] if problem is None else [str(problem)])
    code, shown = _on_terminal(args, tmp_path)
    assert code == 0
    text = _piped(args + ["--format", "text"], tmp_path)
    assert text.returncode == 0
    body, hint = shown.rstrip("\n").rsplit("\n", 1)
    # everything before the last line is exactly what --format text writes, then one blank line
    assert body + "\n" == text.stdout.decode("utf-8") + "\n"
    assert "\\documentclass" not in shown

    # the last line's commands are real: each gives the format it names
    commands = {}
    assert hint.startswith("Shown as text because this is a terminal. "), hint
    for part in hint.split(". ", 1)[1].split("; "):
        what, command = part.split(": ", 1)
        commands[what] = shlex.split(command)
    assert set(commands) == {"LaTeX", "PDF", "web page"}, hint
    for what, command in commands.items():
        assert command[:2] == ["symattn", "derive"] and (problem is None or command[2] == str(problem))
    latex_code, latex = _on_terminal(commands["LaTeX"][1:], tmp_path)  # on the terminal too: LaTeX as asked
    assert latex_code == 0 and latex.startswith("\\documentclass") and latex.rstrip().endswith("\\end{document}")
    html = _piped(commands["web page"][1:], tmp_path)
    assert html.returncode == 0, html.stderr
    assert (tmp_path / "solution.html").read_text("utf-8").lstrip().lower().startswith("<!doctype html")
    if __import__("shutil").which("pdflatex"):
        pdf = _piped(commands["PDF"][1:], tmp_path)
        assert pdf.returncode == 0, pdf.stderr
        assert (tmp_path / "solution.pdf").read_bytes().startswith(b"%PDF-")


def test_piped_or_redirected_output_keeps_latex(tmp_path):
    piped = _piped(["derive"], tmp_path)
    assert piped.returncode == 0
    out = piped.stdout.decode("utf-8")
    assert out.startswith("\\documentclass") and "Shown as text" not in out
    with open(tmp_path / "out.tex", "wb") as f:  # redirected to a file, as `> out.tex`
        subprocess.run([sys.executable, "-m", "symattn", "derive"], stdout=f, check=True, cwd=tmp_path, env=_env())
    assert (tmp_path / "out.tex").read_bytes() == piped.stdout


@pytest.mark.parametrize("extra", [["--format", "markdown"], ["--exercise"]], ids=["format", "exercise"])
def test_a_terminal_gets_what_is_asked_for(extra, tmp_path):
    """A format given, or a sheet (LaTeX, never text), is written on a terminal as in a pipe, without the hint."""
    code, shown = _on_terminal(["derive", *extra], tmp_path)
    piped = _piped(["derive", *extra], tmp_path)
    assert code == 0 and piped.returncode == 0
    assert shown == piped.stdout.decode("utf-8")
    assert "Shown as text" not in shown
