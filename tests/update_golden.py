"""Regenerate the golden files of worked_examples/: ``python tests/update_golden.py``.

Each ``worked_examples/NAME.yaml`` (and ``worked_examples/large/NAME.yaml``) gets ``NAME.tex`` (standalone LaTeX) and
``NAME.md`` (Markdown) beside it, and the examples of ``HTML`` their web page ``NAME.html``, rendered without the cross-check paragraph
(whose float figures may differ between NumPy builds). ``tests/test_render_golden.py``
checks that the committed files equal a fresh rendering; review their diff
like code.
"""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"
HTML = ("causal_4_tokens",)  # the examples whose web page is committed too
PAPER = "a4"  # given explicitly: the command line's default follows the locale, a golden never does


def golden_outputs(path: Path) -> dict[Path, str]:
    """The golden files of one example and their expected text."""
    import symattn

    d = symattn.derive(symattn.load_problem(path))
    out = {
        path.with_suffix(".tex"): symattn.render_latex(d, standalone=True, paper=PAPER),
        path.with_suffix(".md"): symattn.render_markdown(d),
    }
    if path.stem in HTML:
        out[path.with_suffix(".html")] = symattn.render_html(d)
    return out


def main() -> int:
    for example in sorted(EXAMPLES.glob("**/*.yaml")):
        for target, text in golden_outputs(example).items():
            old = target.read_text("utf-8") if target.exists() else None
            if old != text:
                target.write_text(text, "utf-8")
                print(f"updated {target.relative_to(EXAMPLES.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
