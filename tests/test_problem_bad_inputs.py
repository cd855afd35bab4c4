"""Every file in tests/bad_inputs/ through `symattn derive FILE -f json`, in-process.

tests/bad_inputs/expected.yaml gives each file's exit code, the LINE:COL that must
follow the file name in the message (where one applies) and a fragment of the
one-line message. Cases marked 'bug' there are package bugs: xfail(strict=True).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import yaml


HERE = Path(__file__).parent / "bad_inputs"
EXPECTED = yaml.safe_load((HERE / "expected.yaml").read_text("utf-8"))
CORPUS = sorted(p.name for p in HERE.iterdir() if p.suffix == ".yaml" and p.name != "expected.yaml")


def test_expected_covers_corpus():
    assert sorted(EXPECTED) == CORPUS


def _cases():
    for name in CORPUS:
        bug = EXPECTED.get(name, {}).get("bug")
        marks = [pytest.mark.xfail(reason=bug, strict=True)] if bug else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_cases()))
def test_bad_input(name, symattn_cli, tmp_path, monkeypatch):
    want = EXPECTED[name]
    monkeypatch.chdir(tmp_path)  # a MARKER written by a YAML tag or an entry would land here
    path = str(HERE / name)
    start = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
    r = symattn_cli.main("derive", path, "-f", "json")
    elapsed = time.process_time() - start
    code, out, err = r.code, r.stdout, r.stderr
    assert not (tmp_path / "MARKER").exists() and not (HERE / "MARKER").exists() and not Path("MARKER").exists()
    assert "Traceback" not in out + err
    assert code == want["exit"], err
    if want["exit"] == 0:
        assert err == ""
        assert json.loads(out)["crosscheck"]["passed"] is True
    else:
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("Error: "), err
        assert want["fragment"] in lines[0]
        if "where" in want:
            assert f"{path}:{want['where']}: " in lines[0]
        else:
            assert f"{path}: " in lines[0]
    assert elapsed < 3, f"{name} took {elapsed:.1f} s of CPU time"


# -- files that are not regular files, made at test time (nothing special is committed) ----------

REST = "K: [[1, 0], [0, 1]]\nV: [[1, 2], [3, 4]]\n"


def _symlink_loop(path: Path) -> None:
    other = path.with_name("loop_b" + path.suffix)
    os.symlink(other, path)
    os.symlink(path, other)


def _device(path: Path) -> None:
    """A character device like /dev/null: a node made with mknod where allowed, else a link to /dev/null."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError:
        os.symlink("/dev/null", path)


SPECIAL = {
    # name: (the problem's text, or None when the special file is the problem itself;
    #        the special file's name and how to make it; a fragment of the one-line message)
    "fifo_matrix": ("Q: {file: fifo.csv}\n" + REST, "fifo.csv", os.mkfifo,
                    "Q: 'fifo.csv' is a FIFO (named pipe), not a regular file"),
    "fifo_problem": (None, "p.yaml", os.mkfifo, "is a FIFO (named pipe), not a regular file"),
    "dev_zero_problem": (None, "p.yaml", lambda p: os.symlink("/dev/zero", p), "is a device, not a regular file"),
    "device_matrix": ("Q: {file: null.npy}\n" + REST, "null.npy", _device,
                      "Q: 'null.npy' is a device, not a regular file"),
    "socket_problem": (None, "p.yaml", "socket", "is a socket, not a regular file"),
    "folder_matrix": ("Q: {file: d.csv}\n" + REST, "d.csv", os.mkdir, "Q: 'd.csv' is a folder, not a matrix file"),
    "symlink_loop_matrix": ("Q: {file: loop_a.csv}\n" + REST, "loop_a.csv", _symlink_loop,
                            "Q: cannot read 'loop_a.csv': the path is a loop of symbolic links"),
    "symlink_loop_problem": (None, "p.yaml", _symlink_loop, "the path is a loop of symbolic links"),
}


@pytest.mark.parametrize("case", sorted(SPECIAL))
def test_special_file(case, symattn_cli, tmp_path):
    text, name, make, fragment = SPECIAL[case]
    sock = None
    if make == "socket":
        import socket

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(tmp_path / name))
    else:
        make(tmp_path / name)
    problem = tmp_path / ("p.yaml" if text is None else "problem.yaml")
    if text is not None:
        problem.write_text(text, "utf-8")
    start = time.process_time()
    try:
        r = symattn_cli.main("derive", problem, "-f", "json")
    finally:
        if sock is not None:
            sock.close()
    elapsed = time.process_time() - start
    code, err = r.code, r.stderr
    assert code == 1, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {problem}"), err
    assert fragment in lines[0], lines[0]
    assert elapsed < 3, f"{case} took {elapsed:.1f} s of CPU time"
