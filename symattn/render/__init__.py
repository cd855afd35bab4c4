"""Renderers: each reads a :class:`~symattn.Derivation` and returns text."""

from __future__ import annotations

from .matrices import exact_tex_matrix_of_step as step_latex
from .latex import render_latex
from .outline import select

FORMATS = ("latex", "markdown", "text", "json", "html")

# The other formats' modules are imported when first used (the web page's MathML converter alone
# takes a tenth of a second to import): symattn.render.render_html and the others still work.
_LAZY = {"render_html": ".html", "render_json": ".json", "render_markdown": ".markdown", "render_text": ".text"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def render(derivation, format: str = "latex", *, standalone: bool = True, digits=None, check=None, **layout) -> str:
    """The derivation in ``format`` (one of ``latex``, ``markdown``, ``text``, ``json``, ``html``).

    ``layout`` takes ``max_shown``, ``first``, ``last`` (all but JSON) and
    ``exercise``, ``ask`` (LaTeX, Markdown and HTML).
    """
    if format == "latex":
        return render_latex(derivation, standalone=standalone, digits=digits, check=check, **layout)
    if format == "markdown":
        from .markdown import render_markdown

        return render_markdown(derivation, digits=digits, check=check, **layout)
    if format == "text":
        from .text import render_text

        return render_text(derivation, digits=digits, check=check, **layout)
    if format == "json":
        from .json import render_json

        return render_json(derivation, check=check)
    if format == "html":
        from .html import render_html

        return render_html(derivation, digits=digits, check=check, fragment=not standalone, **layout)
    raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "render", "render_html", "render_json", "render_latex", "render_markdown", "render_text", "select", "step_latex"]
