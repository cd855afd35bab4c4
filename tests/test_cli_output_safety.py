"""Nothing that isn't symattn's is overwritten or left behind, and messages tell the truth (issue 21).

Each data-loss row runs the real command line in a child process (``python -m
symattn``) and, where the project does, through click's ``CliRunner`` too;
afterwards the device node, the input file and the teacher's files must be
untouched. Every row ends in exit 0 or 1 with one ``Error:`` line (or a
correct result), well under 10 s.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from symattn.reference.crosscheck import Mismatch
from symattn.render.pdf import TEX_LINE_LIMIT, _check_line_lengths, _log_excerpt
from _child import HANG_S, SymattnCli, child_env

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "causal_4_tokens.yaml"
SMALL = "Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\n"
ROOT_USER = hasattr(os, "geteuid") and os.geteuid() == 0


def invoke(cli: SymattnCli, args: list[str], cwd: Path):
    """The in-process result (click's CliRunner) of ``args`` run in ``cwd`` (no traceback may escape)."""
    result = cli(*args, cwd=cwd)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def in_process(cli: SymattnCli, args: list[str], cwd: Path):
    result = invoke(cli, args, cwd)
    return result.exit_code, result.stderr


def one_error_line(code: int, stderr: str, *fragments: str) -> str:
    assert code == 1, (code, stderr)
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry of ``folder``: its file type and, for a regular file, its bytes."""
    out = {}
    for p in sorted(folder.iterdir()):
        st = os.lstat(p)
        out[p.name] = (stat.S_IFMT(st.st_mode), p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


# -- generate --out-dir: --force, and a failed batch writes nothing ----------------------------


@pytest.mark.parametrize("how", ["python-m", "clirunner"])
def test_batch_refuses_to_overwrite_the_teachers_files(symattn_cli, tmp_path, how):
    (tmp_path / "variant-01.yaml").write_text("# my edited variant\n", "utf-8")
    (tmp_path / "index.csv").write_text("my own index\n", "utf-8")
    (tmp_path / "notes.txt").write_text("keep me\n", "utf-8")
    before = snapshot(tmp_path)
    args = ["generate", "--count", "3", "--out-dir", "."]
    if how == "python-m":
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m")
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(symattn_cli, args, tmp_path)
    line = one_error_line(code, err, "variant-01.yaml", "index.csv", "--force", "nothing was written")
    assert "variant-02.yaml" not in line  # only what exists is listed
    assert snapshot(tmp_path) == before  # untouched, and no temporary folder left behind


def test_batch_with_force_replaces_only_its_own_names(symattn_cli, tmp_path):
    (tmp_path / "variant-01.yaml").write_text("# my edited variant\n", "utf-8")
    (tmp_path / "notes.txt").write_text("keep me\n", "utf-8")
    done = symattn_cli.entry("generate", "--count", "2", "--out-dir", ".", "--force", cwd=tmp_path, how="python-m")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.csv", "notes.txt", "variant-01.yaml", "variant-02.yaml"]
    assert (tmp_path / "notes.txt").read_text("utf-8") == "keep me\n"
    assert (tmp_path / "variant-01.yaml").read_text("utf-8").startswith("# Made by: symattn generate")


@pytest.mark.parametrize("exists", [True, False])
def test_failed_batch_writes_nothing(symattn_cli, tmp_path, exists):
    """1 token and sizes 1 with entries 0..1 give 16 distinct problems: 50 cannot be found."""
    out = tmp_path / "g"
    if exists:
        out.mkdir()
        (out / "mine.yaml").write_text("x: 1\n", "utf-8")
    before = snapshot(tmp_path)
    done = symattn_cli.entry("generate", "--tokens", "1", "--d-model", "1", "--d-k", "1", "--d-v", "1", "--mask", "none",
                             "--count", "50", "--out-dir", "g", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "only 16 different problems", "nothing was written")
    assert snapshot(tmp_path) == before
    if exists:
        assert snapshot(out) == {"mine.yaml": (stat.S_IFREG, b"x: 1\n")}


def test_batch_into_a_new_nested_folder(symattn_cli, tmp_path):
    done = symattn_cli.entry("generate", "--count", "2", "--out-dir", "a/b", cwd=tmp_path, how="python-m")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["index.csv", "variant-01.yaml", "variant-02.yaml"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]
    mode = stat.S_IMODE(os.stat(tmp_path / "a" / "b").st_mode)
    assert mode & 0o755 == 0o755 & ~_umask(), oct(mode)  # an ordinary folder, not mkdtemp's 0700


def _umask() -> int:
    u = os.umask(0)
    os.umask(u)
    return u


def test_force_without_count_is_a_usage_error(symattn_cli, tmp_path):
    done = symattn_cli.entry("generate", "--force", cwd=tmp_path, how="python-m")
    assert done.returncode == 2 and "--force" in done.stderr


# -- every command refuses its own input as output ---------------------------------------------


@pytest.mark.parametrize("how", ["python-m", "clirunner"])
def test_generate_from_refuses_to_overwrite_its_input(symattn_cli, tmp_path, how):
    problem = tmp_path / "p.yaml"
    problem.write_bytes(EXAMPLE.read_bytes())
    args = ["generate", "--from", "p.yaml", "-o", "./p.yaml"]
    if how == "python-m":
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m")
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(symattn_cli, args, tmp_path)
    one_error_line(code, err, "is the --from problem itself")
    assert problem.read_bytes() == EXAMPLE.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_generate_batch_refuses_to_overwrite_its_input_even_with_force(symattn_cli, tmp_path):
    problem = tmp_path / "variant-01.yaml"
    problem.write_bytes(EXAMPLE.read_bytes())
    done = symattn_cli.entry("generate", "--from", "variant-01.yaml", "--count", "2", "--out-dir", ".", "--force",
                             cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "is the --from problem itself")
    assert problem.read_bytes() == EXAMPLE.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["variant-01.yaml"]


MATRIX_FILE_PROBLEM = "X: [[1, 0], [0, 1]]\nW_Q: {file: wq.csv}\nW_K: [[1, 0], [0, 1]]\nW_V: [[1], [0]]\n"


@pytest.mark.parametrize("how", ["python-m", "clirunner"])
@pytest.mark.parametrize("args", [["derive", "p.yaml", "-o", "wq.csv", "-f", "text"],
                                  ["derive", "p.yaml", "-o", "out.tex", "--plot", "./wq.csv"],
                                  ["generate", "--from", "p.yaml", "-o", "wq.csv"]])
def test_a_matrix_file_the_problem_reads_is_never_an_output(symattn_cli, tmp_path, how, args):
    (tmp_path / "p.yaml").write_text(MATRIX_FILE_PROBLEM, "utf-8")
    (tmp_path / "wq.csv").write_text("1,0\n0,1\n", "utf-8")
    before = snapshot(tmp_path)
    if how == "python-m":
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m")
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(symattn_cli, args, tmp_path)
    one_error_line(code, err, "input files", "wq.csv")
    assert snapshot(tmp_path) == before


def test_plot_and_output_on_the_same_file_are_refused(symattn_cli, tmp_path):
    done = symattn_cli.entry("derive", "-o", "a.pdf", "--plot", "./a.pdf", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "--plot and -o name the same file")
    assert list(tmp_path.iterdir()) == []


# -- -o onto what is not a regular file: written in place or refused, never renamed over -----------


@pytest.mark.skipif(not ROOT_USER, reason="making a device node needs root (CI runs the tests as root)")
@pytest.mark.parametrize("how", ["python-m", "clirunner"])
def test_output_to_a_device_node_writes_into_it(symattn_cli, tmp_path, how):
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
    args = ["derive", "-o", "null"]  # no suffix: a device gets what standard output would
    if how == "python-m":
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m")
        code, err = done.returncode, done.stderr
    else:
        code, err = in_process(symattn_cli, args, tmp_path)
    assert code == 0, err
    st = os.lstat(node)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)  # still the device, not a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]  # no temporary file left


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_a_full_device_is_an_error_line(symattn_cli, tmp_path):
    done = symattn_cli.entry("derive", "-o", "/dev/full", "-f", "text", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "/dev/full", "No space left")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_output_to_a_fifo_nobody_reads_is_an_error_not_a_wait(symattn_cli, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = symattn_cli.entry("derive", "-o", "pipe", "-f", "text", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "FIFO", "no program is reading")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_to_a_fifo_with_a_reader_writes_into_it(symattn_cli, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is waiting before symattn starts

    def read() -> None:
        os.set_blocking(fd, True)
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        got.append(b"".join(chunks))

    done = symattn_cli.entry("derive", "-o", "pipe", "-f", "text", cwd=tmp_path, how="python-m")
    reader = threading.Thread(target=read)
    reader.start()
    reader.join(10)
    os.close(fd)
    assert done.returncode == 0, done.stderr
    assert got and got[0].startswith(b"Causal self-attention on four tokens")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_output_to_a_socket_is_refused(symattn_cli, tmp_path):
    path = tmp_path / "sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
    except OSError as exc:  # pragma: no cover - a file system without sockets
        pytest.skip(f"cannot make a socket: {exc}")
    try:
        done = symattn_cli.entry("derive", "-o", "sock", "-f", "text", cwd=tmp_path, how="python-m")
        one_error_line(done.returncode, done.stderr, "is a socket")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
    finally:
        s.close()


def test_output_to_a_folder_named_like_a_file_is_refused(symattn_cli, tmp_path):
    (tmp_path / "out.tex").mkdir()
    (tmp_path / "out.tex" / "keep").write_text("k", "utf-8")
    done = symattn_cli.entry("derive", "-o", "out.tex", cwd=tmp_path, how="python-m")
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr  # click refuses a folder as usage
    assert (tmp_path / "out.tex" / "keep").read_text("utf-8") == "k"


def test_output_through_a_symlink_writes_its_target_and_keeps_the_link(symattn_cli, tmp_path):
    (tmp_path / "real.tex").write_text("old\n", "utf-8")
    os.symlink("real.tex", tmp_path / "link.tex")
    done = symattn_cli.entry("derive", "-o", "link.tex", cwd=tmp_path, how="python-m")
    assert done.returncode == 0, done.stderr
    assert os.path.islink(tmp_path / "link.tex")
    assert (tmp_path / "real.tex").read_text("utf-8").startswith("\\documentclass")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.tex", "real.tex"]


# -- SIGTERM and a full standard output ------------------------------------------------------------


def test_sigterm_while_writing_removes_the_temporary_file(tmp_path):
    """SIGTERM arrives in the middle of writing out.tex: the old file survives and no
    hidden temporary file stays behind, as with Ctrl-C."""
    (tmp_path / "out.tex").write_text("the old solution\n", "utf-8")
    script = textwrap.dedent("""
        import os, signal, sys
        import symattn.writing as out
        real = out.os.chmod
        def chmod(path, mode):  # the temporary file is written; now the signal comes
            os.kill(os.getpid(), signal.SIGTERM)
            real(path, mode)
        out.os = type(os)("os_with_a_signal")
        out.os.__dict__.update({k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
        out.os.chmod = chmod
        from symattn.cli import main
        sys.exit(main(["derive", "-o", "out.tex"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                          env=child_env({"PYTHONIOENCODING": "utf-8"}), timeout=HANG_S)
    one_error_line(done.returncode, done.stderr, "SIGTERM")
    assert (tmp_path / "out.tex").read_text("utf-8") == "the old solution\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tex"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["derive"], ["derive", "-f", "json"], ["check", str(EXAMPLE), "answers.yaml"],
                                  ["generate"]])
def test_a_full_standard_output_is_an_error_line(symattn_cli, tmp_path, args):
    (tmp_path / "answers.yaml").write_text("S: [[2, 12, 8, 6], [10, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]\n", "utf-8")
    with open("/dev/full", "w") as full:
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m", stdout=full)
    one_error_line(done.returncode, done.stderr, "standard output", "No space left")


# -- messages that tell the truth -----------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--backward"]])
def test_scores_float64_cannot_tell_apart_are_not_called_a_bug(symattn_cli, tmp_path, extra):
    (tmp_path / "p.yaml").write_text('Q: [[1]]\nK: [["10^20 + 4"], ["10^20"]]\nV: [[1], [2]]\nscale: none\n', "utf-8")
    done = symattn_cli.entry("derive", "p.yaml", "-f", "text", *extra, cwd=tmp_path, how="python-m")
    assert done.returncode == 0, done.stderr
    assert "bug" not in done.stderr
    assert "NumPy's float64 lacks the precision" in done.stderr
    assert "Note: " in done.stderr and len(done.stderr.splitlines()) == 1
    # the exact weights stand: 1/(1 + e^-4) ≈ 0.982, where float64 would say 0.5
    assert "0.982" in done.stdout


def test_a_real_mismatch_is_still_reported():
    """The precision excuse is not a blanket: a small problem with a wrong reference still fails."""
    import numpy as np

    import symattn
    from symattn.reference.crosscheck import _precision, compare

    d = symattn.derive(symattn.load_problem(SMALL))
    reference = {s.id: np.asarray(d.approx(s.id), dtype=float) for s in d.steps}
    reference["A"] = reference["A"] + 1e-3
    check = _precision(d, compare(d, reference, 1e-9, "numpy float64", every=True))
    assert check.passed is False and check.skipped is None


@pytest.mark.parametrize("reference, who", [
    ("numpy float64", "NumPy"),
    ("torch scaled_dot_product_attention float64", "PyTorch"),
    ("central finite differences of the numpy forward pass", "finite differences"),
])
def test_a_mismatch_names_its_reference(reference, who):
    text = str(Mismatch("dQ", 0, 1, 1.0, 2.0, reference))
    assert f"but {who} gives" in text
    assert text.startswith("dQ[1,2]")


def test_a_line_too_long_for_pdflatex_is_named_before_compiling():
    source = "\\documentclass{article}\n\\title{" + "word " * (TEX_LINE_LIMIT // 5) + "}\n"
    with pytest.raises(Exception) as info:
        _check_line_lengths(source)
    message = str(info.value)
    assert "line 2 of the LaTeX" in message and f"{TEX_LINE_LIMIT:,}" in message and "title" in message
    _check_line_lengths("short\n" * 10)  # nothing to say


def test_a_pdflatex_error_after_a_parenthesis_is_found_and_explained():
    log = "(/usr/share/texlive/graphics.sty\n)\n)! Unable to read an entire line---bufsize=200000.\nPlease increase buf_size in texmf.cnf.\n"
    excerpt = _log_excerpt(log)
    assert excerpt.startswith("a line of the LaTeX is longer than pdflatex can read"), excerpt
    assert "bufsize=200000" in excerpt
    assert _log_excerpt("x\n! Undefined control sequence.\nl.5 \\foo\n") == "! Undefined control sequence. | l.5 \\foo"


def test_a_long_title_in_a_pdf_is_one_error_line_naming_the_cause(symattn_cli, tmp_path):
    (tmp_path / "p.yaml").write_text("title: " + "word " * 50_000 + "\n" + SMALL, "utf-8")
    done = symattn_cli.entry("derive", "p.yaml", "-o", "out.pdf", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "pdflatex reads at most", "shorten the title")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


@pytest.mark.parametrize("how", ["python-m", "clirunner"])
def test_a_folder_among_the_answers_files_is_reported_for_that_file(symattn_cli, tmp_path, how):
    (tmp_path / "a.yaml").write_text("S: [[2, 12, 8, 6], [12, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]\n", "utf-8")
    (tmp_path / "b.yaml").write_text("S: [[2, 12, 8, 6], [10, 8, 16, 4], [8, 16, 16, 8], [6, 4, 8, 2]]\n", "utf-8")
    (tmp_path / "folder").mkdir()
    args = ["check", str(EXAMPLE), "a.yaml", "folder", "b.yaml", "-f", "csv"]
    if how == "python-m":
        done = symattn_cli.entry(*args, cwd=tmp_path, how="python-m")
        code, out = done.returncode, done.stdout
    else:
        result = invoke(symattn_cli, args, tmp_path)
        code, out = result.exit_code, result.stdout
    assert code == 1
    rows = out.splitlines()
    assert rows[0] == "file,passed,S,error"
    assert rows[1] == "a.yaml,true,right,"
    assert rows[2].startswith("folder,,,") and "is a folder" in rows[2]
    assert rows[3] == "b.yaml,false,wrong,"


def test_a_folder_as_the_only_answers_file_is_one_error_line(symattn_cli, tmp_path):
    (tmp_path / "folder").mkdir()
    done = symattn_cli.entry("check", str(EXAMPLE), "folder", cwd=tmp_path, how="python-m")
    one_error_line(done.returncode, done.stderr, "folder: is a folder, not an answers file")
