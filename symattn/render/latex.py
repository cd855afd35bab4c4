"""LaTeX worked solutions: a standalone document or a fragment for ``\\input``."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..stages import KINDS
from ._blocks import blocks
from ._grid import MAX_SHOWN
from ._grid import escape_tex as escape

if TYPE_CHECKING:
    from ..derivation import Derivation

# The subscripted names symattn's own sentences use, written as math. Only
# these: a token such as a_b in the same sentence stays text as written.
_MATH_NAMES = {
    name: "\\ensuremath{" + tex + "}"
    for name, tex in {
        "d_model": "d_{\\mathrm{model}}",
        "d_k": "d_k",
        "d_v": "d_v",
        "n_q": "n_q",
        "n_k": "n_k",
        "m_i": "m_i",
        "Z_i": "Z_i",
        "d_out": "d_{\\mathrm{out}}",
        **{k.name: k.name for k in KINDS if k.source is not None and not k.labelled},  # W_Q, W_K, W_V, W_O
    }.items()
}
_MATH_NAME_RE = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(_MATH_NAMES) + r")(?![A-Za-z0-9_])")


def _prose(text: str) -> str:
    """symattn's own sentences: escaped, with d_k, n_q, W_Q ... as math."""
    parts = _MATH_NAME_RE.split(text)
    return "".join(_MATH_NAMES[p] if k % 2 else escape(p) for k, p in enumerate(parts))


# Lets a fragment compile in a document that does not load colortbl (then unshaded).
# \symattnfit scales a display wider than the line down to fit, never below 0.85 (the renderer
# splits wider matrices into column blocks first), and writes each display's natural width to
# the log ("symattn: display <width> of <line width>"), from which symattn.pdf.display_scales
# reads the factors used.
_FRAGMENT_HEADER = r"""% symattn worked solution, for \input in a document that loads amsmath and amssymb (and colortbl for shading)
\providecommand{\cellcolor}[2][]{}
\providecommand{\color}[2][]{}
\ifdefined\symattnbox\else\newsavebox{\symattnbox}\fi
\providecommand{\symattnfit}[1]{\sbox{\symattnbox}{#1}\typeout{symattn: display \the\wd\symattnbox\space of \the\linewidth}\ifdim\wd\symattnbox>\linewidth\ifdefined\resizebox\ifdim\dimexpr 1pt*\linewidth/\wd\symattnbox\relax<0.85pt\scalebox{0.85}{\usebox{\symattnbox}}\else\resizebox{\linewidth}{!}{\usebox{\symattnbox}}\fi\else\usebox{\symattnbox}\fi\else\usebox{\symattnbox}\fi}
"""

_PREAMBLE = r"""\documentclass[11pt]{article}
\usepackage[T1]{fontenc}
\usepackage[utf8]{inputenc}
\IfFileExists{lmodern.sty}{\usepackage{lmodern}}{}
\usepackage{amsmath,amssymb}
\usepackage[margin=2cm]{geometry}
\usepackage{colortbl}
\usepackage{graphicx}
\setcounter{MaxMatrixCols}{64}
\allowdisplaybreaks
\renewcommand{\arraystretch}{1.3}
"""


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
) -> str:
    """The worked solution as LaTeX (a full document unless ``standalone=False``).

    The weights are shaded by size with colortbl; a fragment \\input into a
    document without colortbl still compiles, unshaded.
    """
    lines: list[str] = []
    parts = blocks(
        derivation, digits, check, max_shown=max_shown, shade=True, first=first, last=last, exercise=exercise, ask=ask
    )
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
    if not standalone:
        return body
    title = escape(("Exercise: " if exercise else "") + derivation.problem.title)
    # an exercise sheet has a compact heading: room for its answer boxes, no near-empty last page
    heading = (f"{{\\centering\\Large\\bfseries {title}\\par}}\n\\medskip\n" if exercise
               else f"\\title{{{title}}}\n\\date{{}}\n\\begin{{document}}\n\\maketitle\n")
    if exercise:
        heading = f"\\title{{{title}}}\n\\begin{{document}}\n" + heading
    return (
        _PREAMBLE
        + heading + "\n"
        + body
        + "\n\\end{document}\n"
    )
