"""A class marked at once (``check_class``, ``symattn check`` of many files) gives each file the
marking it gets alone: the comparisons of entries it shares between files change no verdict."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

import symattn
from symattn.check import check_class

PROBLEM = """\
Q: [[1, 0], [0, 2], [1, 1]]
K: [[1, 1], [0, 1], [2, 0]]
V: [[1, 2], [3, 0], [0, 1]]
mask: causal
"""


def _rows(m):
    return "[" + ", ".join("[" + ", ".join(m[i]) + "]" for i in range(len(m))) + "]"


def _exact(d, id):
    return [[Fraction(str(v)) if v != float("-inf") else None for v in row] for row in d.evaluate(id, 30)]


def _class(folder: Path, d, count: int, seed: int) -> list[Path]:
    """Answer files written by hand: S and S_scaled exactly or with a slip, S with Q·K (no
    transpose) or transposed, A and O as decimals to 2-5 places, rounded or cut, or a rounding slip."""
    rng = random.Random(seed)
    import mpmath

    exact = {id: d.evaluate(id, 30) for id in ("S", "S_scaled", "A", "O")}
    files = []
    for n in range(count):
        lines = []
        for id, grid in exact.items():
            if rng.random() < 0.2:
                continue
            places = rng.choice([2, 3, 4, 5])
            rows = []
            for i, row in enumerate(grid):
                cells = []
                for j, v in enumerate(row):
                    if v == mpmath.ninf:
                        cells.append("-inf")
                        continue
                    x = float(v)
                    if rng.random() < 0.1:
                        x += rng.choice([1, -1, 10 ** -places])  # a slip, or the last place off
                    cells.append(f"{x:.{places}f}" if id in ("A", "O") else str(round(x, 6)))
                rows.append(cells)
            if id == "S" and rng.random() < 0.2:
                rows = [list(r) for r in zip(*rows)]
            lines.append(f"{id}: {_rows(rows)}")
        file = folder / f"s{n:02d}.yaml"
        file.write_text("\n".join(lines) + "\n" if lines else "S: [[1, 2]]\n")
        files.append(file)
    return files


@pytest.mark.parametrize("options", [{}, {"precision": "exact"}, {"tolerance": 0.01}, {"precision": "float32"}])
def test_a_class_marked_at_once_is_each_file_marked_alone(tmp_path: Path, options) -> None:
    d = symattn.derive(symattn.load_problem(PROBLEM))
    files = _class(tmp_path, d, 40, seed=len(options))
    marked = check_class(d, [(str(f), f) for f in files], **options)
    for f, got in zip(files, marked.files):
        try:
            alone = symattn.check(d, f, **options)
        except symattn.SymattnError as exc:
            assert got.marking is None and got.error == str(exc)
            continue
        assert got.marking is not None, got.error
        assert got.marking.as_dict() == alone.as_dict()
        assert str(got.marking) == str(alone)
    statuses = {s.status for f in marked.files if f.marking for s in f.marking.stages}
    assert {"right", "wrong"} <= statuses  # the class has both, so the shared comparisons were put to the test


def test_the_command_line_reports_a_class_as_each_file_alone(tmp_path: Path, symattn_cli) -> None:
    import json

    (tmp_path / "p.yaml").write_text(PROBLEM)
    d = symattn.derive(symattn.load_problem(PROBLEM))
    files = _class(tmp_path, d, 12, seed=7)
    together = json.loads(symattn_cli("check", "-f", "json", str(tmp_path / "p.yaml"), *map(str, files)).stdout)
    assert [entry.pop("file") for entry in together["files"]] == [str(f) for f in files]
    for f, entry in zip(files, together["files"]):
        alone = json.loads(symattn_cli("check", "-f", "json", str(tmp_path / "p.yaml"), str(f)).stdout)
        assert entry == alone, f
