"""Every file in tests/bad_inputs/ through `symattn derive FILE -f json`, in-process.

tests/bad_inputs/expected.yaml gives each file's exit code, the LINE:COL that must
follow the file name in the message (where one applies) and a fragment of the
one-line message. Cases marked 'bug' there are package bugs: xfail(strict=True).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from symattn.cli import main

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
def test_bad_input(name, capsys, tmp_path, monkeypatch):
    want = EXPECTED[name]
    monkeypatch.chdir(tmp_path)  # a MARKER written by a YAML tag or an entry would land here
    path = str(HERE / name)
    start = time.perf_counter()
    code = main(["derive", path, "-f", "json"])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
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
    assert elapsed < 3, f"{name} took {elapsed:.1f} s"
