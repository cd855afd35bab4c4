"""The paper of LaTeX and PDF output: ``--paper a4|letter``, by default from the locale.

Page sizes are read from the compiled PDFs with poppler's ``pdfinfo`` and compared with the
papers' definitions (A4: 210 × 297 mm, ISO 216; Letter: 8.5 × 11 in), converted to PostScript
points (72 a inch) here. The list of Letter regions is compared with the C library's own locale
data where the machine has it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import symattn
from symattn.cli import cli
from symattn.render.paper import LETTER_REGIONS, paper_from_locale

ROOT = Path(__file__).resolve().parent.parent
FOUR = ROOT / "worked_examples" / "causal_4_tokens.yaml"
MM = 72 / 25.4
SIZES = {"a4": (210 * MM, 297 * MM), "letter": (8.5 * 72, 11 * 72)}
LOCALE_VARS = ("LC_ALL", "LC_PAPER", "LANG")

needs_pdf = pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdfinfo") is None,
                               reason="pdflatex and poppler's pdfinfo are needed")


def _page_sizes(pdf: Path) -> set[tuple[float, float]]:
    out = subprocess.run(["pdfinfo", "-f", "1", "-l", "999", str(pdf)], capture_output=True, text=True,
                         check=True).stdout
    sizes = {(float(w), float(h)) for w, h in re.findall(r"Page +\d+ size: +([\d.]+) x ([\d.]+) pts", out)}
    assert sizes, out
    return sizes


def _is(sizes: set[tuple[float, float]], paper: str) -> bool:
    w, h = SIZES[paper]
    return all(abs(a - w) < 0.01 and abs(b - h) < 0.01 for a, b in sizes)  # pdfinfo prints 3 decimals


def _run(args: list[str], env: dict[str, str | None] | None = None):
    env = {**{k: None for k in LOCALE_VARS}, **(env or {})}
    return CliRunner().invoke(cli, args, env=env)


# ------------------------------------------------------------------------------- the locale rule


@pytest.mark.parametrize("region", sorted(LETTER_REGIONS))
def test_each_letter_region_gets_letter(region):
    assert paper_from_locale({"LANG": f"es_{region}.UTF-8"}) == "letter"
    assert paper_from_locale({"LC_PAPER": f"en_{region}"}) == "letter"
    assert paper_from_locale({"LANG": f"fr_{region}@euro"}) == "letter"


@pytest.mark.parametrize("name", ["de_DE.UTF-8", "en_GB.UTF-8", "en_IN", "fr_FR@euro", "ja_JP.eucJP", "pt_BR.UTF-8",
                                  "C", "C.UTF-8", "POSIX", "en", "", "es_ES"])
def test_other_locales_get_a4(name):
    assert paper_from_locale({"LANG": name}) == "a4"


def test_the_paper_category_is_read_as_the_c_library_reads_it():
    # LC_ALL overrides everything; LC_PAPER overrides LANG; an empty variable counts as unset
    assert paper_from_locale({"LC_ALL": "de_DE.UTF-8", "LC_PAPER": "en_US.UTF-8", "LANG": "en_US.UTF-8"}) == "a4"
    assert paper_from_locale({"LC_ALL": "en_CA.UTF-8", "LANG": "de_DE.UTF-8"}) == "letter"
    assert paper_from_locale({"LC_PAPER": "en_GB.UTF-8", "LANG": "en_US.UTF-8"}) == "a4"
    assert paper_from_locale({"LC_PAPER": "es_MX.UTF-8", "LANG": "en_GB.UTF-8"}) == "letter"
    assert paper_from_locale({"LC_ALL": "", "LC_PAPER": "", "LANG": "en_PH.UTF-8"}) == "letter"


def test_the_letter_regions_are_the_c_librarys():
    """The regions whose glibc locale sets LC_PAPER to 279 mm high (directly or by a copy)."""
    folder = Path("/usr/share/i18n/locales")
    if not (folder / "en_US").is_file():
        pytest.skip("the C library's locale sources are not installed")
    copy, letter = {}, set()
    for path in folder.iterdir():
        try:
            text = path.read_text("utf-8", errors="replace")
        except OSError:
            continue
        m = re.search(r"^LC_PAPER\s*\n(.*?)^END LC_PAPER", text, re.S | re.M)
        if not m:
            continue
        c = re.search(r'copy\s+"([^"]+)"', m.group(1))
        if c:
            copy[path.name] = c.group(1)
        elif re.search(r"^\s*height\s+279\b", m.group(1), re.M):
            letter.add(path.name)

    def is_letter(name: str, depth: int = 0) -> bool:
        return name in letter or (depth < 20 and name in copy and is_letter(copy[name], depth + 1))

    regions = {n.split("_", 1)[1].split("@")[0] for n in set(copy) | letter if "_" in n and is_letter(n)}
    assert regions == set(LETTER_REGIONS)


# ------------------------------------------------------------------------------- the LaTeX and the PDF


def test_the_latex_says_its_paper():
    d = symattn.derive(symattn.load_problem(FOUR))
    for paper in ("a4", "letter"):
        tex = symattn.render_latex(d, paper=paper)
        assert f"\\usepackage[{paper}paper,margin=2cm]{{geometry}}" in tex
        assert tex.count("geometry") == 1
    assert "a4paper" in symattn.render_latex(d)  # the library's default, whatever the locale
    with pytest.raises(ValueError, match="paper must be one of 'a4', 'letter', not 'A5'"):
        symattn.render_latex(d, paper="A5")
    with pytest.raises(ValueError, match="markdown does not take paper"):
        symattn.render(d, "markdown", paper="letter")


@needs_pdf
@pytest.mark.parametrize("paper", ["a4", "letter"])
def test_derive_paper_sets_the_pdf_page(paper, tmp_path):
    out = tmp_path / "s.pdf"
    result = _run(["derive", str(FOUR), "--paper", paper, "-o", str(out)], {"LANG": "en_US.UTF-8"})
    assert result.exit_code == 0, result.output
    assert _is(_page_sizes(out), paper)


@needs_pdf
@pytest.mark.parametrize("env,paper", [({"LANG": "en_US.UTF-8"}, "letter"), ({"LANG": "de_DE.UTF-8"}, "a4"),
                                       ({"LANG": "en_US.UTF-8", "LC_PAPER": "en_GB.UTF-8"}, "a4"), ({}, "a4")])
def test_derive_takes_the_paper_from_the_locale(env, paper, tmp_path):
    out = tmp_path / "s.pdf"
    result = _run(["derive", "--exercise", "-o", str(out)], env)
    assert result.exit_code == 0, result.output
    assert _is(_page_sizes(out), paper)
    tex = _run(["derive", "--format", "latex"], env)
    assert f"\\usepackage[{paper}paper,margin=2cm]{{geometry}}" in tex.stdout


@needs_pdf
@pytest.mark.parametrize("paper", ["a4", "letter"])
def test_generate_sheets_are_on_the_paper(paper, tmp_path):
    other = "a4" if paper == "letter" else "letter"
    result = _run(["generate", "--count", "1", "--out-dir", str(tmp_path / "D"), "--sheets", "--paper", paper],
                  {"LANG": "en_US.UTF-8" if other == "letter" else "de_DE.UTF-8"})  # --paper wins over the locale
    assert result.exit_code == 0, result.output
    for part in ("exercise", "solution"):
        assert _is(_page_sizes(tmp_path / "D" / f"variant-01-{part}.pdf"), paper), part


@pytest.mark.parametrize("args,message", [
    (["derive", "--paper", "a4", "--format", "markdown"], "--paper goes with LaTeX or PDF output"),
    (["derive", "--paper", "a4", "-o", "s.html"], "--paper goes with LaTeX or PDF output"),
    (["derive", "--paper", "letter", "--fragment", "--format", "latex"], "--paper goes with a whole LaTeX document"),
    (["derive", "--paper", "b5"], "Invalid value for '--paper'"),
    (["generate", "--count", "1", "--out-dir", "D", "--paper", "a4"], "--paper goes with --sheets pdf"),
    (["generate", "--count", "1", "--out-dir", "D", "--sheets", "html", "--paper", "a4"], "--paper goes with --sheets pdf"),
])
def test_paper_where_there_is_no_page_is_refused(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _run(args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_the_goldens_do_not_follow_the_locale(monkeypatch):
    from test_render_golden import update_golden

    texts = []
    for lang in ("en_US.UTF-8", "de_DE.UTF-8"):
        monkeypatch.setenv("LANG", lang)
        monkeypatch.setenv("LC_ALL", lang)
        texts.append(update_golden.golden_outputs(FOUR)[FOUR.with_suffix(".tex")])
    assert texts[0] == texts[1] and f"[{update_golden.PAPER}paper," in texts[0]
