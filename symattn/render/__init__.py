"""Renderers: each reads a :class:`~symattn.Derivation` and returns text."""

from __future__ import annotations

from ._tex import exact_tex_matrix_of_step as step_latex
from .html import render_html
from .json import render_json
from .latex import render_latex
from .markdown import render_markdown
from .outline import select
from .text import render_text

FORMATS = ("latex", "markdown", "text", "json", "html")


def render(derivation, format: str = "latex", *, standalone: bool = True, digits=None, check=None, **layout) -> str:
    """The derivation in ``format`` (one of ``latex``, ``markdown``, ``text``, ``json``, ``html``).

    ``layout`` takes ``max_shown``, ``first``, ``last`` (all but JSON) and
    ``exercise``, ``ask`` (LaTeX, Markdown and HTML).
    """
    if format == "latex":
        return render_latex(derivation, standalone=standalone, digits=digits, check=check, **layout)
    if format == "markdown":
        return render_markdown(derivation, digits=digits, check=check, **layout)
    if format == "text":
        return render_text(derivation, digits=digits, check=check, **layout)
    if format == "json":
        return render_json(derivation, check=check)
    if format == "html":
        return render_html(derivation, digits=digits, check=check, fragment=not standalone, **layout)
    raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "render", "render_html", "render_json", "render_latex", "render_markdown", "render_text", "select", "step_latex"]
