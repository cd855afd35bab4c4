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


# \symattnkeep{head}{rest} keeps a step on one page: inside it no page may break (\symattnwhole:
# no break between lines, around displays, between paragraphs or before a heading), so TeX's page
# builder, with the page's true heights and the shrink of its glue, moves a step that does not fit
# to the next page whole, breaking before its heading. The step is measured first (typeset once
# in a box, its log lines and box warnings silenced): a step taller than a page keeps only its
# head (heading, reason and first display) together and breaks after it as usual.
# Lets a fragment compile in a document that does not load colortbl (then unshaded).
# \symattnfit scales a display wider than the line down to fit, never below 0.85 (the renderer
# splits wider matrices into column blocks first), and writes each display's natural width to
# the log ("symattn: display <width> of <line width>"), from which symattn.render.pdf.display_scales
# reads the factors used.
_FRAGMENT_HEADER = r"""% symattn worked solution, for \input in a document that loads amsmath and amssymb (and colortbl for shading)
\providecommand{\cellcolor}[2][]{}
\providecommand{\color}[2][]{}
\ifdefined\symattnbox\else\newsavebox{\symattnbox}\fi
\ifdefined\symattnmeasure\else\newsavebox{\symattnmeasure}\fi
\providecommand{\symattnquiet}[1]{}
\providecommand{\symattnpar}{\endgraf\nobreak}
\providecommand{\symattnwhole}[2]{\penalty\csname @secpenalty\endcsname\begingroup\let\par\symattnpar\interlinepenalty10000 \predisplaypenalty10000 \postdisplaypenalty10000 \csname @secpenalty\endcsname10000 #1#2\par\endgroup}
\providecommand{\symattnboth}[2]{#1#2}
\providecommand{\symattnsize}[1]{\setbox\symattnmeasure\vbox{\hsize\linewidth\let\typeout\symattnquiet\hbadness10000 \hfuzz\maxdimen\vbadness10000 \vfuzz\maxdimen#1}}
\providecommand{\symattntall}[2]{\symattnsize{#1}\ifdim\dimexpr\ht\symattnmeasure+\dp\symattnmeasure\relax>\textheight\expandafter\symattnboth\else\expandafter\symattnwhole\fi{#1}{}#2}
\providecommand{\symattnfits}[2]{\symattnsize{#1#2}\ifdim\dimexpr\ht\symattnmeasure+\dp\symattnmeasure\relax>\textheight\expandafter\symattntall\else\expandafter\symattnwhole\fi{#1}{#2}\penalty0 }
\providecommand{\symattnkeep}[2]{\par\ifinner\expandafter\symattnboth\else\expandafter\symattnfits\fi{#1}{#2}}
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


def keep_spans(parts: list) -> tuple[set[int], set[int], set[int]]:
    """Where each step's \\symattnkeep opens, ends its head and closes, as indices into ``parts``.

    A step runs from its heading (its stage's, for the stage's first step) to its decimal table
    (the exact display and its decimals belong together), or, without one, to its matrix and
    the line after it; its head ends with its first display. A step without a display (a line
    saying the mask is head 1's) opens the keep of the stage's next step, or is kept whole when
    it is its stage's last: its heading does not end a page alone."""
    opens: set[int] = set()
    splits: set[int] = set()
    closes: set[int] = set()
    pending = None  # where the display-less steps before this one began
    for k, block in enumerate(parts):
        if block.kind != "step":
            continue
        start = k - 1 if k > 0 and parts[k - 1].kind == "section" else k
        start = start if pending is None else pending
        stop = next((j for j in range(k + 1, len(parts)) if parts[j].kind in ("step", "section")), len(parts))
        body = range(k + 1, stop)
        first = next((j for j in body if parts[j].kind == "math"), None)
        if first is None:
            pending = start if stop < len(parts) and parts[stop].kind == "step" else None
            if pending is None:
                opens.add(start)
                splits.add(stop - 1)
                closes.add(stop - 1)
            continue
        pending = None
        opens.add(start)
        splits.add(first)
        closes.add(_keep_end(parts, body, stop) or first)
    return opens, splits, closes


def _keep_end(parts: list, body: range, stop: int) -> int | None:
    """A step's last kept block: its last decimal table, or its last matrix and its Shape line."""
    shown = [j for j in body if parts[j].form == "decimal"]
    if shown:
        return shown[-1]
    matrices = [j for j in body if parts[j].form]
    end = matrices[-1] if matrices else None
    if end is not None and end + 1 < stop and parts[end + 1].kind == "para":
        end += 1  # its Shape line
    return end


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
    opens, splits, closes = keep_spans(parts)
    for k, block in enumerate(parts):
        if k in opens:
            lines.append("\\symattnkeep{%")
        if block.kind == "section":
            lines.append(f"\\section*{{{_prose(block.text)}}}")
        elif block.kind == "step":
            lines.append(f"\\paragraph{{{_prose(block.text)}.}} {_prose(block.extra)}")
        elif block.kind == "para":
            lines.append(_prose(block.text))
        else:
            # A display wider than the page is scaled down to fit (never up).
            lines.append(f"\\[\n\\symattnfit{{$\\displaystyle {block.text}$}}\n\\]")
        glued = block.kind in ("para", "step") and k + 1 < len(parts) and parts[k + 1].kind == "math"
        if not glued:  # a display is part of the paragraph introducing it: never a page apart
            lines.append("")
        if k in splits:
            lines.append("}{%")
        if k in closes:
            lines.append("}")
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
