"""The committed worked solutions in worked_examples/ equal a fresh rendering.

A change to the renderers changes these files: run ``python tests/update_golden.py``
and review the diff of worked_examples/*.tex and *.md like code before committing.
"""

from __future__ import annotations

import difflib
import importlib.util
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("**/*.yaml"))  # large/ too: rendering is cheap
HOW_TO_FIX = "run `python tests/update_golden.py` and review the diff of worked_examples/ before committing"


def _load_update_golden():
    path = Path(__file__).resolve().parent / "update_golden.py"
    spec = importlib.util.spec_from_file_location("symattn_tests_update_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


update_golden = _load_update_golden()


def test_there_are_worked_examples():
    assert len(EXAMPLE_FILES) >= 5, EXAMPLE_FILES
    assert update_golden.EXAMPLES.resolve() == EXAMPLES.resolve()


def _read_committed(path: Path) -> str:
    # bytes, so a stray '\r' is a difference; only a CRLF checkout is forgiven
    return path.read_bytes().decode("utf-8").replace("\r\n", "\n")


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_golden_files_are_up_to_date(example):
    expected = update_golden.golden_outputs(example)
    suffixes = [".html", ".md", ".tex"] if example.stem in update_golden.HTML else [".md", ".tex"]
    assert sorted(p.suffix for p in expected) == suffixes
    for target, text in sorted(expected.items()):
        rel = target.relative_to(ROOT)
        assert target.exists(), f"{rel} is missing: {HOW_TO_FIX}"
        committed = _read_committed(target)
        if committed != text:
            diff = "".join(
                list(
                    difflib.unified_diff(
                        committed.splitlines(keepends=True),
                        text.splitlines(keepends=True),
                        fromfile=f"{rel} (committed)",
                        tofile=f"{rel} (rendered now)",
                    )
                )[:60]
            )
            pytest.fail(f"{rel} is out of date with the renderer: {HOW_TO_FIX}\n{diff}", pytrace=False)


def test_no_orphan_golden_files():
    """Every .tex/.md/.html in worked_examples/ belongs to a problem (a deleted example takes its files along)."""
    stems = {p.stem for p in EXAMPLE_FILES}
    orphans = sorted(
        p.name for p in EXAMPLES.iterdir()
        if (p.suffix in (".tex", ".md") and p.stem not in stems) or (p.suffix == ".html" and p.stem not in update_golden.HTML)
    )
    assert orphans == [], f"golden files without a problem file: {orphans}"


def test_builtin_example_is_the_worked_example():
    builtin = ROOT / "symattn" / "data" / "causal_4_tokens.yaml"
    worked = EXAMPLES / "causal_4_tokens.yaml"
    assert builtin.read_bytes() == worked.read_bytes(), (
        "symattn/data/causal_4_tokens.yaml (what `symattn derive` shows) differs from "
        "worked_examples/causal_4_tokens.yaml: copy one over the other"
    )
    # and the installed package reads that very file
    packaged = resources.files("symattn").joinpath("data/causal_4_tokens.yaml").read_bytes()
    assert packaged == worked.read_bytes()
