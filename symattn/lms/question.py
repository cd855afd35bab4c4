"""One generated variant as a course platform's question: the statement (the given matrices), the
asked stages entry by entry with the answer and its tolerance, and the worked solution as
feedback. Every platform writer (:mod:`.moodle`, :mod:`.qti`) reads these.

The statement and feedback are HTML fragments with TeX math between ``\\(…\\)`` and ``\\[…\\]``,
which MathJax renders (Moodle's MathJax filter, Canvas, PrairieLearn): symattn's own TeX, the
user's text escaped for HTML and kept out of MathJax's reach (a token ``$x$`` stays text).

The tolerance follows ``symattn check``'s rounding rule: an answer written to ``places`` decimal
places is right when it is the exact value rounded to those places, that is, within half a unit
in the last place of the exact value. Each blank's key is the exact value to ``places + 6``
places, its tolerance ``0.5·10^-places``. An entry that is −∞ (a masked score) is no number a
numerical blank can hold: it is shown, not asked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import mpmath

from ..errors import SymattnError
from ..render import prose
from ..render.blocks import Block, Matrix, blocks, symbol_of
from ..render.escape import escape_html
from ..render.numbers import tex
from ..render.options import RenderOptions

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step
    from ..generate.batch import GeneratedProblem

MIN_PLACES, MAX_PLACES = 1, 10  # --places: decimal places asked of each entry
DEFAULT_PLACES = 4
_KEY_EXTRA = 6  # the key carries this many places past the asked ones
_DPS = 40


@dataclass(frozen=True)
class Blank:
    """One asked entry: ``row``, ``col`` count from 0 (people read row + 1, column + 1).

    ``key`` is the exact value to ``places + 6`` decimal places, ``rounded`` to ``places``
    (what a student writes), ``tolerance`` is half a unit in the last asked place (all three
    decimal text, never a binary float); ``exact`` is the entry's exact value and ``tex`` its
    LaTeX."""

    row: int
    col: int
    key: str
    rounded: str
    tolerance: str
    exact: object
    tex: str


@dataclass(frozen=True)
class Asked:
    """An asked stage: its id (``head2.A``), its symbol in LaTeX (``A^{(2)}``), its title, its
    shape, and its entries row by row: a :class:`Blank`, or the LaTeX of an entry shown as given
    (−∞)."""

    id: str
    symbol: str
    title: str
    shape: tuple[int, int]
    entries: tuple[tuple["Blank | str", ...], ...]

    @property
    def blanks(self) -> list[Blank]:
        return [e for row in self.entries for e in row if isinstance(e, Blank)]


@dataclass(frozen=True)
class Question:
    """One variant: ``name`` (``variant-01``), ``title``, ``seed``, ``variant`` (1, 2, ...), the
    statement as parts (HTML fragments, and an :class:`Asked` where its blanks go), the asked
    stages in order, and the worked solution as an HTML fragment."""

    name: str
    title: str
    seed: int | None
    variant: int | None
    parts: tuple["str | Asked", ...]
    asked: tuple[Asked, ...]
    feedback: str

    def statement(self, blanks: Callable[[Asked], str]) -> str:
        """The statement as one HTML fragment, each asked stage drawn by ``blanks``."""
        return "\n".join(part if isinstance(part, str) else blanks(part) for part in self.parts)


def asked_kinds(d: "Derivation", ask: frozenset[str] | None) -> frozenset[str]:
    """The stage kinds asked of ``d``: ``ask``, each one a stage ``d`` computes, or its last stage."""
    computed = [s.kind for s in d if not s.given]
    if ask is None:
        return frozenset({computed[-1]})
    missing = sorted(k for k in ask if k not in computed)
    if missing:
        raise SymattnError(f"--ask: this problem has no stage {', '.join(missing)}; it computes "
                           f"{', '.join(dict.fromkeys(computed))}")
    return frozenset(ask)


def check_places(places: int) -> None:
    if isinstance(places, bool) or not isinstance(places, int) or not MIN_PLACES <= places <= MAX_PLACES:
        raise SymattnError(f"places must be a whole number from {MIN_PLACES} to {MAX_PLACES}, not {places!r}")


def question(p: "GeneratedProblem", d: "Derivation", ask: frozenset[str] | None, places: int) -> Question:
    """The question of the generated problem ``p`` (derived as ``d``), asking ``ask`` (stage
    kinds; None: the last stage) to ``places`` decimal places."""
    check_places(places)
    kinds = asked_kinds(d, ask)
    parts: list[str | Asked] = []
    asked: list[Asked] = []
    for block in blocks(d, RenderOptions(exercise=True, ask=kinds), split=False):
        source = block.source
        if block.kind == "math" and isinstance(source, tuple) and source and isinstance(source[0], Matrix) \
                and source[0].form == "answer":
            stage = _asked(d, source[0].step, places)
            asked.append(stage)
            parts.append(stage)
        else:
            parts.append(block_html(block))
    name = f"variant-{p.variant:02d}" if p.variant is not None else "variant"
    return Question(name=name, title=p.title, seed=p.seed, variant=p.variant, parts=tuple(parts),
                    asked=tuple(asked), feedback=solution_html(d))


def solution_html(d: "Derivation") -> str:
    """The worked solution as an HTML fragment with TeX math."""
    return "\n".join(block_html(b) for b in blocks(d, RenderOptions(), split=False))


def block_html(block: Block) -> str:
    """One block of a worked solution as HTML with TeX math for MathJax."""
    if block.kind == "section":
        return f"<h4>{text_html(block.text)}</h4>"
    if block.kind == "step":
        return f"<p><strong>{text_html(block.text)}.</strong> {prose_html(block.extra)}</p>"
    if block.kind == "para":
        return f"<p>{prose_html(block.text)}</p>"
    return f"<p>{tex_html(block.text, display=True)}</p>"


def text_html(text: str) -> str:
    """Text (the user's among it) as HTML that MathJax leaves alone: ``$x$`` or ``\\(`` stays text."""
    escaped = escape_html(text)
    if any(c in text for c in "$\\`"):
        return f'<span class="tex2jax_ignore mathjax_ignore">{escaped}</span>'
    return escaped


def prose_html(text: str) -> str:
    """symattn's prose with its marked math (see :mod:`symattn.render.prose`) as ``\\(…\\)``."""
    return prose.render(text, text_html, lambda piece: tex_html(piece))


def tex_html(tex_text: str, display: bool = False) -> str:
    """TeX as MathJax reads it from HTML: delimited, and escaped for HTML (``<`` is ``&lt;``)."""
    return escape_html(f"\\[{tex_text}\\]" if display else f"\\({tex_text}\\)")


def _asked(d: "Derivation", step: "Step", places: int) -> Asked:
    rows, cols = step.shape
    exact = step.exact
    value = d.entry_values(step.id, _DPS)
    entries = tuple(tuple(_entry(exact[i, j], value(i, j), i, j, places) for j in range(cols)) for i in range(rows))
    return Asked(id=step.id, symbol=symbol_of(step), title=step.title, shape=(rows, cols), entries=entries)


def _entry(x, v: mpmath.mpf, i: int, j: int, places: int) -> "Blank | str":
    if mpmath.isinf(v):
        return tex(x)
    return Blank(row=i, col=j, key=fixed(v, places + _KEY_EXTRA), rounded=fixed(v, places),
                 tolerance=half_unit(places), exact=x, tex=tex(x))


def half_unit(places: int) -> str:
    """Half a unit in the last of ``places`` decimal places, as decimal text: 4 → ``0.00005``."""
    return "0." + "0" * places + "5"


def fixed(v: mpmath.mpf, places: int) -> str:
    """``v`` rounded to ``places`` decimal places (half away from zero), as decimal text."""
    with mpmath.workdps(_DPS + 10):
        scaled = abs(v) * mpmath.mpf(10) ** places
        n = int(mpmath.floor(scaled + mpmath.mpf(1) / 2))
    digits = str(n).rjust(places + 1, "0")
    text = f"{digits[:-places]}.{digits[-places:]}"
    return ("-" if v < 0 and n != 0 else "") + text
