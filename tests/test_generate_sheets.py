"""A batch's PDF sheets compiled at once: the same PDFs as one at a time, and nothing written when one fails.

The PDFs are compared with those ``latex_to_pdf`` makes of the same LaTeX one by one (the path
``symattn derive -o x.pdf`` takes): byte for byte once the dates are fixed (SOURCE_DATE_EPOCH) and
the document /ID (a hash of the file's name and time) is set aside, and as text by pdftotext.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import symattn
from symattn.errors import SymattnError
from symattn.render import render_latex
from symattn.render.pdf import latex_to_pdf, latex_to_pdfs

pytestmark = pytest.mark.skipif(shutil.which("pdflatex") is None and not os.environ.get("CI"),
                                reason="pdflatex is not installed")

_ID = re.compile(rb"/ID \[<[0-9A-F]+> <[0-9A-F]+>\]")


@pytest.fixture
def fixed_dates(monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    monkeypatch.setenv("FORCE_SOURCE_DATE", "1")


def _sources(count: int, seed: int = 5) -> list[str]:
    out = []
    for p in symattn.generate(count, seed=seed):
        d = symattn.derive(p)
        out += [render_latex(d, exercise=True), render_latex(d)]
    return out


def _text(pdf: bytes, tmp_path: Path, name: str) -> str:
    (tmp_path / f"{name}.pdf").write_bytes(pdf)
    return subprocess.run(["pdftotext", "-layout", str(tmp_path / f"{name}.pdf"), "-"], check=True,
                          capture_output=True, text=True).stdout


def test_parallel_sheets_are_the_pdfs_made_one_at_a_time(tmp_path: Path, fixed_dates) -> None:
    sources = _sources(3)  # 6 documents: enough to share one preloaded preamble
    alone = [latex_to_pdf(s) for s in sources]
    one_worker = latex_to_pdfs(iter(sources), len(sources), jobs=1)
    three = latex_to_pdfs(iter(sources), len(sources), jobs=3)
    assert len(one_worker) == len(three) == len(sources)
    for k, (a, b, c) in enumerate(zip(alone, one_worker, three)):
        assert _ID.sub(b"", a) == _ID.sub(b"", b) == _ID.sub(b"", c), k
    if shutil.which("pdftotext"):
        texts = [_text(a, tmp_path, f"a{k}") for k, a in enumerate(alone)]
        assert texts == [_text(c, tmp_path, f"c{k}") for k, c in enumerate(three)]
        assert len(set(texts)) == len(texts)  # each document is its own, in order
        assert "Attention exercise, variant 2" in texts[2]


def test_a_failing_sheet_is_the_error_of_that_document_alone(monkeypatch) -> None:
    sources = _sources(3)
    broken = sources[3].replace("\\end{document}", "\\undefinedcommandhere\n\\end{document}")
    with pytest.raises(SymattnError) as alone:
        latex_to_pdf(broken)
    with pytest.raises(SymattnError) as batch:
        latex_to_pdfs(iter(sources[:3] + [broken] + sources[4:]), len(sources), jobs=2)
    assert str(batch.value) == str(alone.value)
    assert str(batch.value).startswith("pdflatex failed: ! Undefined control sequence")
    assert "\n" not in str(batch.value)


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_failing_compile_leaves_the_folder_as_it_was(tmp_path: Path, monkeypatch, symattn_cli) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    (folder / "variant-01.yaml").write_text("an older variant\n")
    before = _listing(folder)
    real = symattn.render.render_latex
    calls = []

    def fails_on_the_fifth(d, **options):
        calls.append(1)
        source = real(d, **options)
        return source.replace("\\end{document}", "\\undefinedcommandhere\n\\end{document}") if len(calls) == 5 else source

    monkeypatch.setattr(symattn.render, "render_latex", fails_on_the_fifth)
    with pytest.raises(SymattnError, match="^pdflatex failed: ! Undefined control sequence"):
        symattn.write_exercises(symattn.generate(4, seed=2), folder, sheets="pdf", force=True)
    assert _listing(folder) == before
    calls.clear()
    result = symattn_cli("generate", "--count", "4", "--seed", "2", "--out-dir", str(folder), "--sheets", "--force")
    assert result.code == 1
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("Error: pdflatex failed: ! Undefined control sequence"), errors
    assert _listing(folder) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_the_batch_writes_the_sheets_of_each_variant_in_order(tmp_path: Path, fixed_dates) -> None:
    problems = symattn.generate(4, seed=9)
    symattn.write_exercises(problems, tmp_path / "D", sheets="pdf")
    for k, p in enumerate(problems, 1):
        d = symattn.derive(p)
        for part, exercise in (("exercise", True), ("solution", False)):
            written = (tmp_path / "D" / f"variant-{k:02d}-{part}.pdf").read_bytes()
            assert _ID.sub(b"", written) == _ID.sub(b"", latex_to_pdf(render_latex(d, exercise=exercise))), (k, part)
