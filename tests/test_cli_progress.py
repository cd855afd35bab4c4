"""The progress display: on a terminal only, after a delay, erased when done."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import types


from symattn.cli.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_shows_phase_bar_and_detail_on_a_terminal():
    out = _Terminal()
    with Progress(["reading", "stages", "writing"], stream=out, delay=0) as p:
        p.advance("reading")
        p.advance("stages")
        p.note("S_scaled")
        shown = out.getvalue()
    assert "1/3 reading" in shown
    assert "2/3 stages: S_scaled" in shown
    assert "[########................]" in shown  # one phase of three done
    # closing erases the line: the last write is blanks between carriage returns
    assert out.getvalue().endswith("\r")
    assert out.getvalue().rsplit("\r", 2)[-2].strip() == ""


def test_silent_when_not_a_terminal():
    out = io.StringIO()
    with Progress(["a", "b"], stream=out, delay=0) as p:
        p.advance("a")
        p.advance("b")
    assert out.getvalue() == ""


def test_silent_for_quick_work():
    out = _Terminal()
    with Progress(["a", "b"], stream=out, delay=60) as p:
        p.advance("a")
        p.note("X")
        p.advance("b")
    assert out.getvalue() == ""


def test_waits_for_the_delay_then_draws(monkeypatch):
    import symattn.cli.progress as progress_module

    now = [100.0]  # the clock the display reads, moved by hand: a busy machine cannot move it
    monkeypatch.setattr(progress_module, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    out = _Terminal()
    p = Progress(["a", "b"], stream=out, delay=0.05)
    now[0] += 0.04
    p.advance("a")
    assert out.getvalue() == ""
    now[0] += 0.02
    p.advance("b")
    assert "2/2 b" in out.getvalue()
    p.close()


def test_cli_prints_no_progress_into_pipes_and_captured_output(symattn_cli):
    result = symattn_cli("derive", "-f", "text")
    assert result.exit_code == 0
    assert "[#" not in result.output and "\r" not in result.output


def test_real_terminal_gets_the_bar_on_stderr(tmp_path):
    """Through the real entry point under a pseudo-terminal: stage names appear on stderr, stdout stays clean."""
    import symattn.cli.progress as progress_module

    # A one-second delay would make the test slow; the environment cannot change it, so the
    # child lowers it itself before running the command.
    code = (
        "import symattn.cli.progress as p; p.Progress.__init__.__defaults__ = (None, 0.0, None);"
        "from symattn.cli import main; main(['derive', '-o', %r])" % str(tmp_path / "out.tex")
    )
    assert progress_module.Progress.__init__.__defaults__ == (None, 1.0, None)
    leader, follower = pty.openpty()
    proc = subprocess.run([sys.executable, "-c", code], stdin=follower, stdout=subprocess.PIPE,
                          stderr=follower, timeout=120)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    err = b"".join(chunks).decode()
    assert proc.returncode == 0
    for phase in ("reading the problem", "exact stages", "cross-check", "writing LaTeX"):
        assert phase in err
    assert "exact stages: S_scaled" in err
    assert (tmp_path / "out.tex").read_text().startswith("\\documentclass")
