"""Renderers: each reads a :class:`~symattn.Derivation` and returns text.

``symattn.render`` is this package; calling it calls :func:`render`:

>>> import symattn
>>> d = symattn.derive(symattn.load_problem("Q: [[0, 0]]\\nK: [[1, 0], [0, 1]]\\nV: [[2], [4]]\\n"))
>>> print(symattn.render(d, "text", symattn.RenderOptions(first="O")).splitlines()[-1])
    t_1 [ 3]
"""

from __future__ import annotations

from dataclasses import fields, replace

from ..callable_package import make_callable
from .matrices import exact_tex_matrix_of_step as step_latex
from .latex import render_latex
from .options import FORMATS, RenderOptions
from .outline import select

# The other formats' modules are imported when first used (the web page's MathML converter alone
# takes a tenth of a second to import): symattn.render.render_html and the others still work.
_LAZY = {"render_html": ".html", "render_json": ".json", "render_markdown": ".markdown", "render_text": ".text"}
_MODULES = {"latex": ".latex", "markdown": ".markdown", "myst": ".myst", "text": ".text", "json": ".json", "html": ".html"}
_OPTIONS = tuple(f.name for f in fields(RenderOptions))


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def render(derivation, format: str = "latex", options: RenderOptions | None = None, **keywords) -> str:
    """The derivation in ``format`` (one of ``latex``, ``markdown``, ``myst``, ``text``, ``json``, ``html``),
    written with ``options`` (a :class:`RenderOptions`; None: the defaults).

    The options can be given as keywords too (``standalone``, ``digits``, ``check``, ``max_shown``,
    ``first``, ``last``, ``exercise``, ``ask``); with ``options`` they replace its values. An
    unknown format, a bad value or an option the format does not read (``exercise`` for text or
    JSON; ``max_shown``, ``first``, ``last`` for JSON) is refused with a ValueError.
    """
    from importlib import import_module

    if options is not None and not isinstance(options, RenderOptions):
        raise ValueError(f"options must be a symattn.RenderOptions (or None), not {type(options).__name__}")
    unknown = [k for k in keywords if k not in _OPTIONS]
    if unknown:
        from ..text import did_you_mean

        raise TypeError(f"render() got an unexpected keyword argument {unknown[0]!r}"
                        f"{did_you_mean(unknown[0], _OPTIONS)}; the options are {', '.join(_OPTIONS)}")
    options = replace(options or RenderOptions(), **keywords)
    options.refuse_unused(format)
    return import_module(_MODULES[format], __name__).document(derivation, options)


make_callable(__name__, render)  # symattn.render is this package; calling it calls render()


__all__ = ["FORMATS", "RenderOptions", "render", "render_html", "render_json", "render_latex", "render_markdown",
           "render_text", "select", "step_latex"]
