"""``symattn generate --count N --sheets --one-file``: every variant's exercise in one exercises.pdf and
its solution in one solutions.pdf, each variant from a new page, read back page by page with
poppler's pdftotext (``-f k -l k``) and checked against index.csv and the variants' own problem files."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import symattn
from symattn.errors import SymattnError

needs_pdf = pytest.mark.skipif(not all(shutil.which(tool) for tool in ("pdflatex", "pdftotext", "pdfinfo")),
                               reason="pdflatex or poppler's pdftotext/pdfinfo is not installed")


def _page(pdf: Path, k: int) -> str:
    return subprocess.run(["pdftotext", "-layout", "-f", str(k), "-l", str(k), str(pdf), "-"], check=True,
                          capture_output=True, text=True).stdout


def _info(pdf: Path) -> dict[str, str]:
    out = subprocess.run(["pdfinfo", str(pdf)], check=True, capture_output=True, text=True).stdout
    return {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in out.splitlines())}


def _index(folder: Path) -> list[dict[str, str]]:
    with open(folder / "index.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _footer(text: str) -> tuple[int, int, int] | None:
    """(variant, seed, page) of a page's footer "Variant 3 (seed 9), page 2"."""
    found = re.findall(r"Variant (\d+) \(seed (\d+)\), page (\d+)", text)
    return tuple(map(int, found[-1])) if found else None


@pytest.fixture(scope="module")
def batch(tmp_path_factory, symattn_cli) -> Path:
    folder = tmp_path_factory.mktemp("one") / "class"
    result = symattn_cli("generate", "--count", "3", "--seed", "11", "--out-dir", folder, "--sheets", "--one-file",
                         "--paper", "a4")
    assert result.code == 0, result.output
    return folder


@needs_pdf
def test_the_folder_holds_two_pdfs_the_problem_files_and_an_index_of_pages(batch: Path) -> None:
    assert sorted(p.name for p in batch.iterdir()) == ["exercises.pdf", "index.csv", "solutions.pdf",
                                                       "variant-01.yaml", "variant-02.yaml", "variant-03.yaml"]
    rows = _index(batch)
    assert list(rows[0]) == ["variant", "seed", "file", "exercise_page", "solution_page"]
    assert [(r["variant"], r["file"]) for r in rows] == [("1", "variant-01.yaml"), ("2", "variant-02.yaml"),
                                                         ("3", "variant-03.yaml")]
    for r in rows:  # each seed is the one its problem file's header names
        assert f"seed {r['seed']})" in (batch / r["file"]).read_text().splitlines()[0]
    for column in ("exercise_page", "solution_page"):
        assert rows[0][column] == "1"
        assert [int(r[column]) for r in rows] == sorted(int(r[column]) for r in rows)


@needs_pdf
@pytest.mark.parametrize("part", ["exercises", "solutions"])
def test_each_variant_starts_a_new_page_and_every_page_names_its_variant(batch: Path, part: str) -> None:
    rows = _index(batch)
    pdf = batch / f"{part}.pdf"
    total = int(_info(pdf)["Pages"])
    column = "exercise_page" if part == "exercises" else "solution_page"
    starts = [int(r[column]) for r in rows] + [total + 1]
    for k, r in enumerate(rows):
        variant, seed = int(r["variant"]), int(r["seed"])
        first = _page(pdf, starts[k])
        heading = first.split("\n\n")[0]  # the title, the variant and seed and (on an exercise) the name line
        assert f"Attention exercise, variant {variant}" in heading
        assert re.search(rf"Variant {variant}\s+Seed {seed}\b", heading), heading
        assert ("Name:" in first.splitlines()[2]) == (part == "exercises")
        # every page of the variant, and no other, has its footer, numbered from 1
        pages = [_footer(_page(pdf, p)) for p in range(starts[k], starts[k + 1])]
        assert pages == [(variant, seed, j) for j in range(1, len(pages) + 1)]
        assert len(pages) >= 2


@needs_pdf
def test_a_variants_pages_hold_its_own_numbers(batch: Path) -> None:
    rows = _index(batch)
    seen = set()
    for r in rows:
        problem = yaml.safe_load((batch / r["file"]).read_text())
        words, X, W_Q = problem["tokens"], problem["X"], problem["W_Q"]
        # the exercise's first page gives X, each row after its token's word
        given = _page(batch / "exercises.pdf", int(r["exercise_page"]))
        for word, row in zip(words, X):
            assert re.search(rf"\b{word}\s+" + r"\s+".join(map(str, row)) + r"\s*$", given, re.MULTILINE), (r, word)
        # the solution works out Q_11 from row 1 of X and column 1 of W_Q, as computed here
        terms = [(x, w[0]) for x, w in zip(X[0], W_Q)]
        q11 = " + ".join(f"{x} · {w}" for x, w in terms) + f" = {sum(x * w for x, w in terms)}"
        pages = "".join(_page(batch / "solutions.pdf", p) for p in range(int(r["solution_page"]),
                                                                       int(r["solution_page"]) + 3))
        assert re.search(r"Q11 = x1 · WQ \[:, 1\] = " + re.escape(q11), pages), (r, q11)
        seen.add((str(X), str(W_Q)))
    assert len(seen) == len(rows)  # the variants differ, so each page's numbers are its own


@needs_pdf
def test_the_same_seed_gives_the_same_bytes(tmp_path: Path, monkeypatch, symattn_cli) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for name in ("a", "b"):  # the same command (its header is in the problem files), in two places
        (tmp_path / name).mkdir()
        result = symattn_cli("generate", "--count", "2", "--seed", "4", "--out-dir", "class", "--sheets",
                             "--one-file", cwd=tmp_path / name)
        assert result.code == 0, result.output
    a, b = tmp_path / "a" / "class", tmp_path / "b" / "class"
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())
    for path in a.iterdir():
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


@needs_pdf
def test_latex_specials_in_the_words_are_printed_as_typed_on_letter_paper(tmp_path: Path, symattn_cli) -> None:
    words = [r"\end{document}", "50%_#1", "{$x^~}", r"&\\par"]
    result = symattn_cli("generate", "--count", "2", "--seed", "1", "--out-dir", str(tmp_path / "w"), "--sheets",
                         "--one-file", "--paper", "letter", "--words", " ".join(words))
    assert result.code == 0, result.output
    for part in ("exercises", "solutions"):
        pdf = tmp_path / "w" / f"{part}.pdf"
        assert _info(pdf)["Page size"].startswith("612 x 792")  # US Letter in points
        second = int(_index(tmp_path / "w")[1]["exercise_page" if part == "exercises" else "solution_page"])
        text = _page(pdf, second)
        assert "Variant 2" in text
        assert "4 tokens (\\end{document}, 50%_#1, {$x^~}, &\\\\par)" in re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("sheets", [[], ["--sheets", "html"]])
def test_one_file_without_pdf_sheets_is_a_usage_error(tmp_path: Path, symattn_cli, sheets) -> None:
    result = symattn_cli("generate", "--count", "2", "--out-dir", str(tmp_path / "x"), "--one-file", *sheets)
    assert result.code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --one-file goes with --sheets pdf (one PDF of the exercises, one of the solutions)"
                      + ("; the web pages of --sheets html are one per variant" if sheets else "")]
    assert not (tmp_path / "x").exists()
    with pytest.raises(SymattnError, match=r"^one_file \(--one-file\) goes with sheets='pdf'"):
        symattn.write_exercises(symattn.generate(1), tmp_path / "y", sheets=sheets[-1] if sheets else None,
                                one_file=True)
    assert not (tmp_path / "y").exists()


@needs_pdf
def test_a_failing_compile_leaves_the_folder_as_it_was(tmp_path: Path, monkeypatch) -> None:
    import symattn.render.sheets as sheets

    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "exercises.pdf").write_bytes(b"last year's\n")
    (folder / "variant-01.yaml").write_text("an older variant\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    real = sheets.render_latex

    def broken_second_variant(d, **options):
        source = real(d, **options)
        return source + "\\undefinedcommandhere\n" if d.problem.title.endswith("variant 2") else source

    monkeypatch.setattr(sheets, "render_latex", broken_second_variant)
    with pytest.raises(SymattnError, match="^pdflatex failed: ! Undefined control sequence"):
        symattn.write_exercises(symattn.generate(3, seed=2), folder, sheets="pdf", one_file=True, force=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_without_pdflatex_the_two_documents_are_written_as_latex(tmp_path: Path, monkeypatch) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "pdflatex" else real(name, *a, **k))
    problems = symattn.generate(2, seed=3)
    written = symattn.write_exercises(problems, tmp_path / "t", sheets="pdf", one_file=True)
    assert sorted(p.name for p in written) == ["exercises.tex", "index.csv", "solutions.tex", "variant-01.yaml",
                                               "variant-02.yaml"]
    assert [(r["variant"], r["exercise_page"], r["solution_page"]) for r in _index(tmp_path / "t")] == [
        ("1", "", ""), ("2", "", "")]
    tex = (tmp_path / "t" / "exercises.tex").read_text()
    assert tex.count("\\begin{document}") == 1 and tex.count("\\clearpage\n\\setcounter{page}{1}") == 2
    assert tex.index("variant 1") < tex.index("variant 2")
    assert "Name:" in tex and "Name:" not in (tmp_path / "t" / "solutions.tex").read_text()
