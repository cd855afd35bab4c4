"""LaTeX worked solutions: a standalone document or a fragment for ``\\input``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import prose
from .blocks import blocks
from .grid import MAX_SHOWN
from .escape import escape_tex
from .options import RenderOptions
from .paper import DEFAULT_PAPER, geometry

if TYPE_CHECKING:
    from ..exact.derivation import Derivation


def _prose(text: str) -> str:
    """symattn's own sentences: the marked math (⟦…⟧, see :mod:`.prose`) as inline math, the rest escaped."""
    return prose.render(text, escape_tex, prose.latex)


# Lets a fragment compile in a document that does not load colortbl (then unshaded).
# \symattnfit scales a display wider than the line down to fit, never below 0.85 (the renderer
# splits wider matrices into column blocks first), and writes each display's natural width to
# the log ("symattn: display <width> of <line width>"), from which symattn.render.pdf.display_scales
# reads the factors used.
_FRAGMENT_HEADER = r"""% symattn worked solution, for \input in a document that loads amsmath and amssymb (and colortbl for shading)
\providecommand{\cellcolor}[2][]{}
\providecommand{\color}[2][]{}
\ifdefined\symattnbox\else\newsavebox{\symattnbox}\fi
\providecommand{\symattnfit}[1]{\sbox{\symattnbox}{#1}\typeout{symattn: display \the\wd\symattnbox\space of \the\linewidth}\ifdim\wd\symattnbox>\linewidth\ifdefined\resizebox\ifdim\dimexpr 1pt*\linewidth/\wd\symattnbox\relax<0.85pt\scalebox{0.85}{\usebox{\symattnbox}}\else\resizebox{\linewidth}{!}{\usebox{\symattnbox}}\fi\else\usebox{\symattnbox}\fi\else\usebox{\symattnbox}\fi}
"""

_PREAMBLE_ON = r"""\documentclass[11pt]{article}
\usepackage[T1]{fontenc}
\usepackage[utf8]{inputenc}
\IfFileExists{lmodern.sty}{\usepackage{lmodern}}{}
\usepackage{amsmath,amssymb}
@GEOMETRY@\usepackage{colortbl}
\usepackage{graphicx}
\setcounter{MaxMatrixCols}{64}
\allowdisplaybreaks
\renewcommand{\arraystretch}{1.3}
"""


def preamble(paper: str = DEFAULT_PAPER) -> str:
    """The standalone document's preamble, on ``paper`` ("a4" or "letter")."""
    return _PREAMBLE_ON.replace("@GEOMETRY@", geometry(paper))


_PREAMBLE = preamble()


def render_latex(
    derivation: Derivation,
    *,
    standalone: bool = True,
    digits: int | None = None,
    check=None,
    max_shown: int = MAX_SHOWN,
    first: str | None = None,
    last: str | None = None,
    exercise: bool = False,
    ask: frozenset[str] | None = None,
    paper: str = DEFAULT_PAPER,
) -> str:
    """The worked solution as LaTeX (a full document unless ``standalone=False``): :func:`document`
    with these options (see :class:`~symattn.RenderOptions`)."""
    return document(derivation, RenderOptions(standalone, digits, check, max_shown, first, last, exercise, ask,
                                                 paper))


def document(derivation: Derivation, options: RenderOptions) -> str:
    """The worked solution as LaTeX (a full document unless ``options.standalone`` is False).

    The weights are shaded by size with colortbl; a fragment \\input into a
    document without colortbl still compiles, unshaded.
    """
    lines: list[str] = []
    parts = blocks(derivation, options, shade=True)
    for k, block in enumerate(parts):
        if block.kind == "section":
            lines.append(f"\\section*{{{_prose(block.text)}}}")
        elif block.kind == "step":
            lines.append(f"\\paragraph{{{_prose(block.text)}.}} {_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(_prose(block.text))
        else:
            # A display wider than the page is scaled down to fit (never up).
            lines.append(f"\\[\n\\symattnfit{{$\\displaystyle {block.text}$}}\n\\]")
        if block.kind in ("para", "step") and k + 1 < len(parts) and parts[k + 1].kind == "math":
            continue  # a display is part of the paragraph introducing it: never a page apart
        lines.append("")
    body = "\n".join(lines).rstrip() + "\n"
    body = _FRAGMENT_HEADER + body  # the standalone document holds the fragment as it is
    if not options.standalone:
        return body
    exercise = options.exercise
    title = escape_tex(("Exercise: " if exercise else "") + derivation.problem.title)
    # an exercise sheet has a compact heading: room for its answer boxes, no near-empty last page
    heading = (f"{{\\centering\\Large\\bfseries {title}\\par}}\n\\medskip\n" if exercise
               else f"\\title{{{title}}}\n\\date{{}}\n\\begin{{document}}\n\\maketitle\n")
    if exercise:
        heading = f"\\title{{{title}}}\n\\begin{{document}}\n" + heading
    return (
        preamble(options.paper)
        + heading + "\n"
        + body
        + "\n\\end{document}\n"
    )
