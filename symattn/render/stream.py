"""The web page's picture of the residual stream: the block drawn as one line of sums.

For a problem with the residual stream (``residual: true``, always with ``mlp:`` or ``logits:``)
the page opens with an inline SVG of it: the stream as a vertical line from the block's input
down, and beside it a column per sub-block, in the problem's order: (the norm and) the
attention, (the norm and) the MLP, and the model's head (the last row, the final norm, the
logits, P and the loss). Each column's output comes back to the stream as an arrow into a ⊕
labelled with the sum it makes (``H = X + O``, ``Y = H + F``); behind a post norm (BERT's order)
the stream then passes through the norm's box. Every box and ⊕ is named as the solution names
it (its step's title, the sum's formula, the step numbers) and links to its step on the page.

It is built from the derivation's own steps and the numbered outline (:mod:`.outline`), never
per example: :func:`picture` says what is drawn (tests read it), :func:`stream_svg` draws it.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import stages as registry
from .escape import escape_html
from .outline import Stage, stages

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


@dataclass(frozen=True)
class Box:
    """One box: the stage it ends in (as users write it), the solution's name for it, the steps
    it stands for ("Step 3", "Steps 4–12"), an optional second line, and the step it links to
    (None: not on the page)."""

    name: str
    title: str
    steps: str
    detail: str = ""
    target: str | None = None


@dataclass(frozen=True)
class Sum:
    """A ⊕ on the stream: the stage it makes, its formula (``H = X + O``) and the step it links to."""

    name: str
    formula: str
    steps: str
    target: str | None = None


@dataclass(frozen=True)
class SubBlock:
    """A column beside the stream: what it is (``attention``, ``mlp`` or ``next-token``), its
    label, its boxes top to bottom, the sum that brings its output back (None: the model's head,
    which ends the stream) and the post norm the stream then passes through (or None)."""

    kind: str
    label: str
    boxes: tuple[Box, ...]
    sum: Sum | None = None
    after: Box | None = None


@dataclass(frozen=True)
class Picture:
    start: Box
    blocks: tuple[SubBlock, ...]


ATTENTION, MLP, NEXT_TOKEN = "attention", "mlp", "next-token"


def step_anchor(id: str) -> str:
    """The page's id of a step's heading (``stage-H``, ``stage-head2.A``), escaped for an attribute."""
    return "stage-" + escape_html(id)

# Which part of the picture each numbered step of the solution belongs to, by the stages it holds
# (the first that matches; the steps between the input and the residual sum are the attention's).
_INPUT, _ATTN_NORM, _RESIDUAL, _MLP_NORM, _MLP, _MLP_SUM, _FINAL, _UNEMBED, _PROBS, _LOSS = range(10)
_PARTS = (
    (_RESIDUAL, {registry.H, registry.R}),
    (_MLP_SUM, {registry.Y, registry.Y_SUM}),
    (_MLP_NORM, {registry.H_NORM}),
    (_MLP, {registry.F}),
    (_FINAL, {registry.Y_FINAL}),
    (_UNEMBED, {registry.LOGITS}),
    (_PROBS, {registry.P}),
    (_LOSS, {registry.LOSS}),
    (_ATTN_NORM, {registry.X_NORM}),
    (_INPUT, {registry.X, registry.PE, registry.X_POS, registry.X_EMB}),
)
_ATTENTION = -1


def _part(stage: Stage) -> int:
    keys = {s.key for s in stage.steps}
    return next((part for part, marks in _PARTS if keys & marks), _ATTENTION)


def _numbers(parts: list[Stage]) -> str:
    numbers = sorted({s.number for s in parts})
    if len(numbers) == 1:
        return f"Step {numbers[0]}"
    return f"Steps {numbers[0]}–{numbers[-1]}"


def _norm_name(n) -> str:
    return "RMSNorm" if n.rms else "LayerNorm"


class _Builder:
    """The picture's boxes from the derivation's numbered steps."""

    def __init__(self, d: Derivation, shown: frozenset[str]) -> None:
        self.d, self.shown = d, shown
        self.c = registry.Context(d.problem, None)
        self.parts: dict[int, list[Stage]] = {}
        for stage in stages(d):
            if all(s.kind_of.gradient for s in stage.steps):
                continue  # the backward pass is not part of the stream's picture
            self.parts.setdefault(_part(stage), []).append(stage)

    def target(self, steps) -> str | None:
        """The first of ``steps`` the page shows (the step a box links to)."""
        return next((s.id for s in steps if s.id in self.shown), None)

    def box(self, part: int, title: str | None = None, detail: str = "", name: str | None = None,
            steps: tuple[Step, ...] | None = None) -> Box | None:
        """The box of one part: named by its step's title (or ``title``), ending in the part's
        last step (or ``name``)."""
        found = self.parts.get(part)
        if not found:
            return None
        steps = steps if steps is not None else tuple(s for stage in found for s in stage.steps)
        title = title or next(stage.title for stage in found if steps[-1] in stage.steps)  # the output's step
        return Box(name or steps[-1].kind, title, _numbers(found), detail, self.target(steps))

    def sum(self, part: int, key: str) -> tuple[Sum, Box | None]:
        """The ⊕ of ``key`` (H, R, Y, Y_sum) and, behind a post norm, the norm's box on the stream."""
        found = self.parts[part]
        steps = [s for stage in found for s in stage.steps]
        made = next(s for s in steps if s.key == key)
        rest = steps[steps.index(made) + 1:]
        plus = Sum(made.kind, made.formula_text, _numbers(found), self.target([made]))
        if not rest:
            return plus, None
        norm = self.c.norm if part == _RESIDUAL else self.c.mlp.norm
        out = rest[-1]
        return plus, Box(out.kind, f"{out.kind} = {_norm_name(norm)}({made.kind})", _numbers(found),
                         target=self.target(rest))


def picture(d: Derivation, shown: frozenset[str] = frozenset()) -> Picture | None:
    """What the picture of ``d``'s residual stream draws (None: the problem has no residual
    stream). ``shown``: the ids of the steps the page shows, which the boxes link to."""
    c = registry.Context(d.problem, None)
    if not c.residual:
        return None
    b = _Builder(d, shown)
    p = d.problem
    tokens = ", ".join(p.tokens)
    start = b.box(_INPUT, detail=textwrap.shorten(f"{p.n_q} tokens: {tokens}", 56, placeholder=" …"))
    blocks = [_attention(b, p)]
    if c.mlp is not None:
        made = [s for stage in b.parts[_MLP] for s in stage.steps if not s.given]  # U (or U_gate, U_up), G, F
        boxes = [b.box(_MLP_NORM), b.box(_MLP, detail="; ".join(s.formula_text for s in made))]
        plus, after = b.sum(_MLP_SUM, registry.Y_SUM if c.mlp.post else registry.Y)
        label = "MLP" + (" (post-norm)" if c.mlp.post else "")
        blocks.append(SubBlock(MLP, label, tuple(x for x in boxes if x), plus, after))
    if c.logits is not None:
        blocks.append(_next_token(b, c))
    return Picture(start, tuple(blocks))


def _attention(b: _Builder, p) -> SubBlock:
    heads = len(p.heads) if p.multi_head else 1
    what = [f"{heads} heads" if heads > 1 else "one head"]
    if p.kv_heads:
        what.append(f"{p.kv_heads} K/V {'group' if p.kv_heads == 1 else 'groups'}")
    if p.rope is not None:
        what.append("RoPE")
    formula = ("softmax(Q·Kᵀ/√d_k + M)·V" if p.linear is None else "linear: φ(Q)φ(K)ᵀ masked, normalised, ·V")
    if p.differential is not None:
        formula = "(softmax(Q₁·K₁ᵀ/√d_k + M) − λ·softmax(Q₂·K₂ᵀ/√d_k + M))·V" + (", then ·W_O" if p.multi_head else "")
    attention = b.box(_ATTENTION, title="Attention: " + ", ".join(what), detail=formula, name=registry.O)
    post = b.c.norm is not None and b.c.norm.post
    plus, after = b.sum(_RESIDUAL, registry.R if post else registry.H)
    boxes = tuple(x for x in (b.box(_ATTN_NORM), attention) if x)
    return SubBlock(ATTENTION, "Attention" + (" (post-norm)" if post else ""), boxes, plus, after)


def _next_token(b: _Builder, c) -> SubBlock:
    """The model's head: the last row (rows: last), the final norm, the logits, P and the loss."""
    boxes = []
    for part in (_FINAL, _UNEMBED):
        steps = tuple(s for stage in b.parts.get(part, ()) for s in stage.steps)
        last = tuple(s for s in steps if s.key == registry.Y_LAST)
        if last:  # the last row, in the final norm's step (or the logits')
            boxes.append(Box(last[0].kind, last[0].title, _numbers(b.parts[part]), "", b.target(last)))
        rest = tuple(s for s in steps if s.key != registry.Y_LAST)
        if rest:
            boxes.append(b.box(part, steps=rest, title=b.parts[part][0].title))
    rows = "" if c.ce is None else f"{len(c.ce.rows)} {'row' if len(c.ce.rows) == 1 else 'rows'}"
    boxes += [b.box(_PROBS, detail=f"a softmax over the {c.logits.size:,} words of the vocabulary"),
              b.box(_LOSS, detail=f"the mean of −log P[i, t_i] over {rows}")]
    label = "The next token" + (" (the logit lens)" if c.logits.lens else "")
    return SubBlock(NEXT_TOKEN, label, tuple(x for x in boxes if x))


# -- drawing -------------------------------------------------------------------------------------

# Narrow enough for a phone at full size (a wider window shows it as drawn, a narrower one scales it).
_W, _S, _BX = 360, 30, 76  # the picture's width, the stream's x, the side boxes' left edge
_BW = _W - _BX - 8  # a side box's width
_LINE, _GAP, _R = 16, 20, 11  # a line of text, the gap between boxes, a ⊕'s radius
_CHARS = 36  # characters of a title per line in a side box (12.5 px system-ui, about 7 px each)


def stream_svg(pic: Picture) -> str:
    """The picture as a figure with an inline SVG (its text escaped; every box a link when its
    step is on the page)."""
    out: list[str] = []
    stream_top = _box(out, pic.start, 10, 10, _W - 20, "start")
    y, end = stream_top, stream_top
    for block in pic.blocks:
        y, end = _sub_block(out, block, y + 12)
    if pic.blocks[-1].sum is not None:  # the stream goes on: the block's output, to the next layer
        block = pic.blocks[-1]
        name = block.after.name if block.after is not None else block.sum.name
        end += 18
        out.append(f'<polygon class="stream-end" points="{_S - 9},{end:g} {_S + 9},{end:g} {_S},{end + 14:g}"/>'
                   f'<text x="{_S + 16}" y="{end + 12:g}" class="detail">{escape_html(name)}: the block\'s output</text>')
        y = max(y, end + 14)
    height = y + 12
    said = "; ".join(_said(block) for block in pic.blocks)
    desc = f"From {pic.start.name} down the residual stream: {said}."
    return (
        f'<figure class="stream"><svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height:g}" '
        f'viewBox="0 0 {_W} {height:g}" role="group" aria-labelledby="stream-t" aria-describedby="stream-d">'
        '<title id="stream-t">The residual stream through the block</title>'
        f'<desc id="stream-d">{escape_html(desc)}</desc>'
        '<defs><marker id="stream-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0 0L10 5L0 10z"/></marker></defs>'
        f'<line class="stream-line" x1="{_S}" y1="{stream_top:g}" x2="{_S}" y2="{end:g}"/>{"".join(out)}</svg>'
        "<figcaption>The block as its residual stream (the thick line): each column beside it reads the "
        "stream, and each ⊕ adds the column's output back, named by the sum it makes. Every box links to "
        "its step below.</figcaption></figure>"
    )


def _said(block: SubBlock) -> str:
    names = ", then ".join(f"{b.name} ({b.title})" for b in block.boxes)
    text = f"{block.label}: {names}"
    if block.sum is not None:
        text += f", added back as {block.sum.formula}"
    if block.after is not None:
        text += f", then {block.after.title}"
    return text


def _sub_block(out: list[str], block: SubBlock, y: float) -> tuple[float, float]:
    """One column beside the stream, from ``y``: the y below it, and the y the stream reaches
    (the ⊕'s or the post norm's; the model's head ends it where it reads it)."""
    out.append(f'<g class="sub-block" data-sub-block="{block.kind}">')
    out.append(f'<text x="{_BX}" y="{y + 12:g}" class="label">{escape_html(block.label)}</text>')
    y += 20
    tap, bottom, middle = y + 13, y, _BX + _BW / 2
    out.append(_arrow(_S, tap, _BX, tap))
    for k, box in enumerate(block.boxes):
        if k:
            out.append(_arrow(middle, bottom, middle, y))
        bottom = _box(out, box, _BX, y, _BW, "side")
        y = bottom + _GAP
    end = tap
    if block.sum is not None:
        end = bottom + 30
        out.append(f'<polyline class="edge" points="{middle:g},{bottom:g} {middle:g},{end:g} {_S + _R + 2},{end:g}" '
                   'marker-end="url(#stream-arrow)"/>')
        out.append(_plus(block.sum, end))
        y = end + _R + 16
    if block.after is not None:
        y = _box(out, block.after, 10, y, _W - 20, "on-stream")
        end, y = y, y + 4
    out.append("</g>")
    return y, end


def _arrow(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="edge" x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" marker-end="url(#stream-arrow)"/>'


def _lines(box: Box, width: float) -> list[str]:
    """The box's title, then its detail, in lines that fit: the detail's formulas (``; ``
    between them) are kept whole on a line when they fit one."""
    chars = int(_CHARS * width / _BW)
    lines = textwrap.wrap(box.title, chars)
    detail: list[str] = []
    for piece in box.detail.split("; ") if box.detail else ():
        if detail and len(detail[-1]) + 2 + len(piece) <= chars:
            detail[-1] += "; " + piece
        else:
            detail += textwrap.wrap(piece, chars)
    return lines + detail


def _height(box: Box, width: float) -> float:
    return 24 + _LINE * len(_lines(box, width)) + 4


def _link(target: str | None, label: str, inner: str, cls: str, attrs: str = "") -> str:
    """``inner`` as a link to the step ``target`` (a group when the page does not show it)."""
    if target is None:
        return f'<g class="{cls}"{attrs}>{inner}</g>'
    return (f'<a href="#{step_anchor(target)}" class="{cls}"{attrs} aria-label="{escape_html(label)}">'
            f"{inner}</a>")


def _box(out: list[str], box: Box, x: float, y: float, w: float, cls: str) -> float:
    """A box at (x, y), ``w`` wide; its bottom."""
    lines = _lines(box, w)
    h = _height(box, w)
    title_lines = len(textwrap.wrap(box.title, int(_CHARS * w / _BW)))
    text = [f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="6"/>',
            f'<text x="{x + 10:g}" y="{y + 18:g}" class="name">{escape_html(box.name)}</text>',
            f'<text x="{x + w - 10:g}" y="{y + 18:g}" class="steps">{escape_html(box.steps)}</text>']
    for k, line in enumerate(lines):
        kind = "title" if k < title_lines else "detail"
        text.append(f'<text x="{x + 10:g}" y="{y + 22 + _LINE * (k + 1):g}" class="{kind}">{escape_html(line)}</text>')
    label = f"{box.name}: {box.title}, {box.steps}"
    out.append(_link(box.target, label, "".join(text), f"box {cls}"))
    return y + h


def _plus(s: Sum, y: float) -> str:
    """A ⊕ on the stream at height ``y``, its sum written beside it."""
    inner = (f'<circle cx="{_S}" cy="{y:g}" r="{_R}"/>'
             f'<line class="cross" x1="{_S - 6}" y1="{y:g}" x2="{_S + 6}" y2="{y:g}"/>'
             f'<line class="cross" x1="{_S}" y1="{y - 6:g}" x2="{_S}" y2="{y + 6:g}"/>'
             f'<text x="{_S + _R + 8}" y="{y - 6:g}" class="sum">{escape_html(s.formula)}</text>')
    return _link(s.target, f"{s.formula}, {s.steps}", inner, "plus", f' data-stage="{escape_html(s.name)}"')
