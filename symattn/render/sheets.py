"""A batch's sheets in one LaTeX document (``symattn generate --count N --sheets --one-file``):
every variant's exercise (or solution) on pages of its own, headed by its variant number and
seed (the exercise with a line for the student's name), its pages numbered from 1 in a footer
that names the variant, so loose pages find their sheet again.

The variants share one preamble and so one copy of each font in the PDF. Nothing in a sheet
is numbered or labelled (``\\section*``, ``\\[ \\]``), so the variants cannot clash; the page
and footnote counters start again at each. Each variant writes
``symattn: variant K pages P`` to the log once its last page is out (see :func:`variant_pages`).
The PDF's /ID is a hash of the document, not of the temporary file's name and the time, so
with ``SOURCE_DATE_EPOCH`` set the same document gives the same bytes.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Iterable

from .escape import escape_tex
from .latex import render_latex, preamble

if TYPE_CHECKING:
    from ..exact.derivation import Derivation

# The footer of every page names its variant; \symattnfoot is set at the start of each.
_PAGE_STYLE = r"""\makeatletter
\newcommand{\symattnfoot}{}
\def\ps@symattnsheet{\def\@oddhead{}\let\@evenhead\@oddhead\def\@oddfoot{\hfil\small\symattnfoot\hfil}\let\@evenfoot\@oddfoot}
\makeatother
\pagestyle{symattnsheet}
"""

_PAGES = re.compile(r"^symattn: variant ([0-9]+) pages ([0-9]+)$", re.MULTILINE)


def sheets_latex(sheets: Iterable[tuple[Derivation, int, int]], *, exercise: bool, paper: str) -> str:
    """One document of the ``(derivation, variant, seed)`` sheets in order: their exercises, or
    with ``exercise=False`` their worked solutions, on ``paper`` ("a4" or "letter")."""
    parts = []
    for d, variant, seed in sheets:
        body = render_latex(d, standalone=False, exercise=exercise)
        title = escape_tex(("Exercise: " if exercise else "Solution: ") + d.problem.title)
        who = (r"\par\medskip\noindent\textbf{Name:}\ \rule{0.45\linewidth}{0.4pt}" if exercise else "")
        parts.append(
            "\\clearpage\n\\setcounter{page}{1}\\setcounter{footnote}{0}\n"
            f"\\renewcommand{{\\symattnfoot}}{{Variant {variant} (seed {seed}), page \\thepage}}\n"
            f"{{\\centering\\Large\\bfseries {title}\\par}}\n\\medskip\n"
            f"{{\\centering Variant {variant}\\quad Seed {seed}\\par}}{who}\n\\bigskip\n\n"
            f"{body}\n"
            # once the variant's last page is out, its page count (the page counter starts at 1)
            f"\\clearpage\\typeout{{symattn: variant {variant} pages \\the\\numexpr\\value{{page}}-1\\relax}}\n"
        )
    body = "".join(parts)
    trailer = hashlib.sha256(body.encode("utf-8")).hexdigest()[:32]
    return (preamble(paper) + _PAGE_STYLE + f"\\pdftrailerid{{{trailer}}}\n\\begin{{document}}\n" + body
            + "\\end{document}\n")


def variant_pages(log: str) -> list[int]:
    """The first page of each variant of a compiled :func:`sheets_latex` document, in order, from its log.

    >>> variant_pages("symattn: variant 1 pages 3\\nsymattn: variant 2 pages 2\\nsymattn: variant 3 pages 4\\n")
    [1, 4, 6]
    """
    first, pages = 1, []
    for _, count in _PAGES.findall(log):
        pages.append(first)
        first += int(count)
    return pages
