"""The worked solution as a sequence of blocks, shared by LaTeX and Markdown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sympy import sstr

from .. import stages as registry
from . import headline, prose
from .escape import tex_token
from .grid import MAX_SHOWN, grid, grid_blocks
from .head import top_lines
from .measure import LINE_WIDTH, SPLIT_WIDTH, answer_box, width
from .numbers import tex
from .matrices import (
    axis_labels,
    approx_tex_blocks,
    exact_tex_blocks,
    form_tex,
    normaliser_lines,
    weighted_sum_tex,
    worked_dot_tex,
)
from .entries import too_long, entry_forms, jacobian_form, jacobian_row, needs_decimals, written_exactly
from .options import RenderOptions
from .outline import given_inputs, select, stages
from .rope import rope_blocks

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


@dataclass(frozen=True)
class Block:
    """One piece of a worked solution.

    ``kind`` is ``section`` (text = heading), ``step`` (text = the step's
    title, extra = its one sentence of why), ``para`` (text = prose in
    plain Unicode with its math marked ⟦…⟧, see :mod:`.prose`) or ``math``
    (text = display LaTeX). User text in prose has passed through
    :func:`.prose.literal`.
    """

    kind: str
    text: str
    extra: str = ""
    # what a ``math`` block draws, for a renderer that builds it from the derivation rather than
    # from ``text`` (the web page): a tuple of Matrix (side by side), a Normalisers or a Jacobian;
    # a ``step`` block's Step (the web page's anchor of the step)
    source: object = None
    # a display of a step's matrix: its entries' form (``exact``, ``decimal`` or ``answer``), on
    # each column block too; what LaTeX keeps on one page with the step's heading
    form: str = ""


@dataclass(frozen=True)
class Matrix:
    """A step's matrix as a display draws it: after ``lhs`` (display LaTeX), its entries in the
    ``form`` ``exact``, ``decimal`` or ``answer`` (empty boxes), all of its columns."""

    lhs: str
    step: "Step"
    form: str


@dataclass(frozen=True)
class Normalisers:
    """The ``m_i`` and ``Z_i`` lines of a softmax step."""

    step: "Step"


@dataclass(frozen=True)
class Jacobian:
    """One row's softmax Jacobian, drawn as a matrix after ``lhs``."""

    lhs: str
    step: "Step"
    row: int


@dataclass(frozen=True)
class Tiles:
    """One query row's online-softmax recurrence table (see :mod:`.tiles`)."""

    step: "Step"
    row: int


def blocks(d: Derivation, options: RenderOptions | None = None, *, shade: bool = False, split: bool = True,
           latex: bool = True) -> list[Block]:
    """The worked solution of ``d`` written with ``options``, renderer-neutral (``shade`` needs
    LaTeX's colortbl).

    ``split`` cuts a matrix too wide for a page into column blocks (a web page scrolls instead).
    Without ``latex`` (and without ``split``) a display drawn from its ``source`` carries no
    LaTeX text: the web page draws it from the derivation. With ``latex``, a matrix shown
    already (:func:`repeated`: a later head's shared mask) is one sentence instead of a display;
    the web page folds it itself.

    ``first``/``last`` limit it to part of the pipeline (the inputs of the
    first shown step are stated as given). ``exercise`` writes the problem
    with empty boxes for the asked stage kinds instead of their values.
    """
    options = options or RenderOptions()
    p = d.problem
    digits = options.digits or p.digits
    max_shown, first, last, exercise, ask = options.max_shown, options.first, options.last, options.exercise, options.ask
    split = split if split or latex else None  # None: the displays' LaTeX is not written (see _displays)
    chosen = select(d, first, last)
    out: list[Block] = [Block("para", _intro(d)), Block("math", headline.formula(p))]
    givens = given_inputs(d, chosen)
    if exercise:
        givens = [s for s in d.steps if s.given] + [s for s in givens if not s.given]
        chosen = [s for s in chosen if not s.given and (ask is None or s.kind in ask)]
    if givens:
        out += _given_blocks(d, givens, max_shown, exercise, split)
    chosen_ids = {s.id for s in chosen}
    for stage in stages(d):
        steps = [s for s in stage.steps if s.id in chosen_ids]
        if not steps:
            continue
        head = f"Head {stage.head} · " if stage.head else ""
        out.append(Block("section", f"{head}Step {stage.number}: {stage.title}"))
        for step in steps:
            out.append(Block("step", step.title, step.why if exercise else step_why(d, step), source=step))
            if exercise:
                # the shape first: it says what to fill in, and a display is never split from
                # the line before it, so no page ends up holding only that line
                out.append(Block("para", f"Shape: {step.shape_note}."))
                out += _displays(f"{step.formula} = ", step, lambda b: _boxes(d, step, max_shown, digits, b),
                                 "answer", split)
            elif latex and repeated(d, step) is not None:  # a page folds it instead (see html.py)
                out.append(Block("para", repeated(d, step)))
            else:
                out += _step_blocks(d, step, digits, max_shown, shade, split)
    if options.check is not None and not exercise:
        out.append(Block("section", "Cross-check"))
        out.append(Block("para", check_sentence(options.check)))
    return out


def _given_blocks(d: Derivation, givens: list, max_shown: int, exercise: bool, split: bool | None) -> list[Block]:
    """The section that states the given matrices (with an exercise, the bias too)."""
    p = d.problem
    out = [Block("section", "Given")]
    for group in _side_by_side(d, givens, max_shown):
        if len(group) > 1:  # small weight matrices share a line, so the page is not mostly white
            notes = "; ".join(f"{step.title} (⟦{symbol_of(step)}⟧), {step.shape_note}" for step in group)
            out.append(Block("para", notes + ":"))
            out.append(Block("math", ",\\qquad ".join(
                f"{_short_name(step)} = {exact_tex_blocks(d, step, max_shown)[0][1]}" for step in group),
                source=tuple(Matrix(f"{_short_name(step)} = ", step, "exact") for step in group)))
            continue
        step = group[0]
        out.append(Block("para", f"{step.title} (⟦{symbol_of(step)}⟧), {step.shape_note}:"))
        lhs = f"{_short_name(step)} = "
        out += _displays(lhs, step, lambda b: exact_tex_blocks(d, step, max_shown, b), "exact", split)
    if exercise and p.bias is not None:
        n_q, n_k = p.bias.shape
        out.append(Block("para", f"The bias B, {n_q}×{n_k}, added to the mask:"))
        out.append(Block("math", "B = " + grid(n_q, n_k, lambda i, j: tex(p.bias[i, j]), max_shown=max_shown)))
    return out


def _step_blocks(d: Derivation, step: Step, digits: int, max_shown: int, shade: bool,
                 split: bool | None) -> list[Block]:
    """A computed step of the worked solution, after its title: its matrix and how it is made."""
    p = d.problem
    evaluable = d.can_evaluate
    out: list[Block] = []
    if "softmax" in step.shows:
        out.append(Block("math", softmax_def(step)))
    if not written_exactly(step):
        out.append(Block("math", step.formula))
        out.append(Block("para", too_long(step)))
    else:
        lhs = f"{step.formula} = {_parts_tex(p, step, max_shown)}"
        out += _displays(lhs, step, lambda b: exact_tex_blocks(d, step, max_shown, b), "exact", split)
    out.append(Block("para", f"Shape: {step.shape_note}."))
    for dot in step.worked:  # a norm's rows of real floats: their long factors as decimals
        out.append(Block("math", worked_dot_tex(dot, decimals=registry.has_norm(p), digits=digits)))
    out += [Block(kind, text) for kind, text in rope_blocks(d, step)]
    if "softmax" in step.shows:
        for line in normaliser_lines(d, step, digits, max_shown):
            out.append(Block("math", line, source=Normalisers(step)))
    if "jacobian" in step.shows:
        out += jacobian_blocks(step, max_shown)
    if "weighted_sum" in step.shows and step.softmax and evaluable and (not registry.has_norm(p) or written_exactly(step)):
        line = weighted_sum_tex(d, step, digits)
        if line:
            out.append(Block("math", line))
    if needs_decimals(step) and evaluable:
        out += _displays(f"{_short_name(step)} \\approx ", step,
                         lambda b: approx_tex_blocks(d, step, digits, max_shown, shade, b), "decimal", split)
    if "tiles" in step.shows:
        out += tile_blocks(d, step, max_shown)
    if "top" in step.shows and evaluable:
        out += [Block("para", line) for line in top_lines(d, step, digits)]
    return out


def _displays(lhs: str, step: Step, draw, form: str, split: bool | None = True) -> list[Block]:
    """``lhs`` and the step's matrix (its entries in ``form``, see :class:`Matrix`) as one display,
    or, when the matrix is too wide to show at 85 % or more and ``split`` is set, as several:
    column blocks drawn by ``draw(budget)``, each introduced by a line naming its columns.
    With ``split`` None the display is not drawn: its text is empty, its source says what it holds."""
    if split is None:
        return [Block("math", "", source=(Matrix(lhs, step, form),))]
    parts = draw(SPLIT_WIDTH - width(lhs) if split else None)
    if len(parts) == 1:
        return [Block("math", lhs + parts[0][1], source=(Matrix(lhs, step, form),), form=form)]
    out = []
    for (a, b), matrix in parts:
        which = f"Column {a + 1}" if a == b else f"Columns {a + 1} to {b + 1}"
        out.append(Block("para", f"{which} of {step.shape[1]}:"))
        out.append(Block("math", lhs + matrix, form=form))
    return out


def _side_by_side(d: Derivation, givens: list[Step], max_shown: int) -> list[list[Step]]:
    """The given steps in groups drawn on one line: consecutive unlabelled matrices (weights)
    whose displays fit the line together at full size; every other step alone."""
    groups: list[list[Step]] = []
    used = 0.0
    for step in givens:
        w = None
        if not step.kind_of.labelled:
            w = width(f"{_short_name(step)} = {exact_tex_blocks(d, step, max_shown)[0][1]},\\qquad ")
        if w is not None and groups and groups[-1][-1].kind_of.labelled is False and used + w <= LINE_WIDTH:
            groups[-1].append(step)
            used += w
        else:
            groups.append([step])
            used = w or 0.0
    return groups


def _boxes(d: Derivation, step: Step, max_shown: int, digits: int, budget: float | None = None):
    """An empty answer box per entry, laid out like the step's matrix, each as wide and tall
    as the entry's exact form (or a decimal of ``digits`` places, if wider); the sheet's
    source holds only the sizes, never the answers."""
    rows, cols = step.shape
    row_labels, col_labels = axis_labels(step)
    if written_exactly(step):
        form = entry_forms(d, step)
        cell = lambda i, j: answer_box(form_tex(form(i, j)), digits)  # noqa: E731
    else:
        cell = lambda i, j: answer_box("", digits)  # noqa: E731
    return grid_blocks(rows, cols, cell, max_shown=max_shown, row_labels=row_labels, col_labels=col_labels,
                       budget=budget)


def softmax_def(step: Step) -> str:
    """The softmax written with the step's own names: ``A_{ij} = e^{Ŝ_ij − m_i}/Z_i`` …; a head's
    ``A^{(2)}_{ij}``, ``m^{(2)}_i``, ``Z^{(2)}_i``; the decoding step's ``a_{t,j}``, ``s_{t,j}``, ``m_t``,
    ``Z_t``; with a learned sink s, its term in the maximum and in Z."""
    h = f"^{{({step.head})}}" if step.head is not None else ""
    if step.key == registry.A_T:
        w, s, i, j, k = "a", "s", "t", "t,j", "t,k"
    else:
        w, s, i, j, k = registry.BY_KEY[registry.A].symbol, "\\hat{S}", "i", "ij", "ik"
    m, z = f"m{h}_{i}", f"Z{h}_{i}"
    sink = any(r.sink is not None for r in step.softmax)
    top = f"\\max_k {s}{h}_{{{k}}}"
    top = f"\\max\\bigl({top},\\ s\\bigr)" if sink else top
    return (f"{w}{h}_{{{j}}} = \\frac{{e^{{{s}{h}_{{{j}}} - {m}}}}}{{{z}}},\\qquad {m} = {top},\\qquad "
            f"{z} = \\sum_k e^{{{s}{h}_{{{k}}} - {m}}}" + (f" + e^{{s - {m}}}" if sink else ""))


def _short_name(step: Step) -> str:
    """The stage's symbol in LaTeX (from the registry)."""
    return step.kind_of.symbol


def _first_head_step(d: Derivation, step: Step) -> "Step | None":
    """The same stage of the problem's first head, for a step of a later head; else None."""
    if step.head is None or step.kind_of is None or not step.kind_of.per_head:
        return None
    first = registry.Context(d.problem).heads[0]
    id = registry.stage_id(step.kind, first)
    return d.step(id) if step.head != first and id in d else None


_REPEAT_LIMIT = 256  # entries: a bigger matrix is not compared (a page that size is long for other reasons)


def repeated(d: Derivation, step: Step) -> str | None:
    """Prose saying that ``step``'s matrix is, entry for entry, one already shown, for a page that
    folds it away; None when it is new. Two cases only, where the equality is the problem's
    structure and not a coincidence of its numbers: a later head's mask that is an earlier
    head's (a causal mask is every head's), and scores scaled by exactly 1 (√d_k = 1, or no
    scaling). A result that happens to equal another (two heads' weights alike, a sum whose
    other term is 0) is drawn: its working differs."""
    rows, cols = step.shape
    if step.given or rows * cols > _REPEAT_LIMIT or not step.written_exactly:
        return None
    if step.kind == registry.M:
        first = _first_head_step(d, step)
        if first is not None and first.shape == step.shape and first.exact == step.exact:
            return f"⟦{symbol_of(step)}⟧ is head {first.head}'s ⟦{symbol_of(first)}⟧, entry for entry."
    elif step.kind == registry.S_SCALED:
        scores = registry.stage_id(registry.S, step.head)
        if scores in d and d.step(scores).written_exactly and d.step(scores).exact == step.exact \
                and _scale_is_one(d, step):
            return f"⟦{symbol_of(step)}⟧ is ⟦{symbol_of(d.step(scores))}⟧ above, entry for entry: the scale is 1."
    return None


def _scale_is_one(d: Derivation, step: Step) -> bool:
    """Whether the scores of ``step``'s head are multiplied by exactly 1."""
    p = d.problem
    heads = getattr(p, "heads", None)
    d_k = heads[step.head - 1].d_k if step.head is not None and heads else p.d_k
    return p.scale_for(d_k) == 1


def step_why(d: Derivation, step: Step) -> str:
    """The step's why, said once: a later head whose why is an earlier head's word for word (the
    same reason, the same numbers) is pointed back to the first head that gave it; one that only
    adds to it (which K/V group it reads) says only what it adds."""
    if _first_head_step(d, step) is None:
        return step.why
    for h in registry.Context(d.problem).heads:
        if h == step.head:
            break
        id = registry.stage_id(step.kind, h)
        said = d.step(id).why if id in d else ""
        if len(said) < 60 or not step.why.startswith(said):
            continue
        if said == step.why:
            return f"The same as for head {h} (its reason is given there)."
        return f"As for head {h}.{step.why[len(said):]}"  # only what this head adds
    return step.why


def symbol_of(step: Step) -> str:
    """The step's symbol in LaTeX as the solution writes it, with its head's number: ``A^{(4)}``,
    ``W_Q^{(1)}``, ``a_t``; what prose, captions and labels name a step by (its id is for programs)."""
    symbol = step.kind_of.symbol if step.kind_of is not None else step.kind
    if step.head is None:
        return symbol
    top = "^{\\top}"
    if symbol.endswith(top):  # a transpose: the head's number first, K^{(2)\top}
        return registry.head_sup_tex(symbol[:-len(top)], step.head, transposed=True)
    if symbol.startswith("\\frac"):  # a fraction (S/√d_k): in brackets, then the head's number
        return f"\\left({symbol}\\right)^{{({step.head})}}"
    return registry.head_sup_tex(symbol, step.head)


def symbol_text(step: Step) -> str:
    """:func:`symbol_of` in plain text: ``A⁽⁴⁾``, ``Q^rot⁽¹⁾`` (a superscripted symbol keeps its own)."""
    symbol = step.kind_of.symbol if step.kind_of is not None else step.kind
    if step.head is not None and "^{" in symbol and not symbol.endswith("^{\\top}"):
        return prose.text_of(symbol) + registry.head_sup(step.head)
    return prose.text_of(symbol_of(step))


def _parts_tex(p, step: Step, max_shown: int = MAX_SHOWN) -> str:
    """For M with a bias: the mask and the bias shown before their sum."""
    if "mask_parts" not in step.shows or p.bias is None:
        return ""
    n_q, n_k = p.bias.shape
    mask = grid(n_q, n_k, lambda i, j: "0" if p.mask.allowed[i][j] else "-\\infty", max_shown=max_shown)
    bias = grid(n_q, n_k, lambda i, j: tex(p.bias[i, j]), max_shown=max_shown)
    return f"{mask} + {bias} = "


def _intro(d: Derivation) -> str:
    p = d.problem
    tokens, key_tokens = (prose.literal(", ".join(t)) for t in (p.tokens, p.key_tokens))
    if p.multi_head:
        dims = [(h.d_k, h.d_v) for h in p.heads]
        widths = (f"each with d_k = {dims[0][0]}, d_v = {dims[0][1]}" if len(set(dims)) == 1 else
                  "; ".join(f"head {h}: d_k = {k}, d_v = {v}" for h, (k, v) in enumerate(dims, 1)))
        side = (
            f"{p.n_q} query tokens ({tokens}) attending to {p.n_k} context tokens ({key_tokens})"
            if p.context is not None
            else f"{p.n_q} tokens ({tokens})"
        )
        what = (
            f"{side} with d_model = {p.d_model}, {len(p.heads)} heads ({widths}) "
            f"and an output projection to d_out = {p.W_O.cols}"
        )
    elif p.projected:
        what = (
            f"{p.n_q} tokens ({tokens}) with d_model = {p.d_model}, "
            f"projected to queries and keys of width d_k = {p.d_k} and values of width d_v = {p.d_v}"
        )
        if p.context is not None:
            what = (
                f"{p.n_q} query tokens ({tokens}) attending to {p.n_k} context tokens "
                f"({key_tokens}), d_model = {p.d_model}, d_k = {p.d_k}, d_v = {p.d_v}"
            )
    else:
        what = f"{p.n_q} queries and {p.n_k} keys given directly, d_k = {p.d_k}, d_v = {p.d_v}"
    scale = {"auto": f"scores scaled by 1/√d_k = 1/√{p.d_k}", "none": "no scaling"}.get(
        p.scale if isinstance(p.scale, str) else "", f"scores scaled by {p.scale}"
    )
    if p.scale == "auto" and p.multi_head:
        scale = "each head's scores scaled by 1/√d_k"
    if p.linear is not None:  # no softmax, no scale: the feature map of the unscaled q and k
        scale = (f"linear attention with the feature map {'elu(x) + 1' if p.linear.feature == 'elu1' else p.linear.feature}"
                 " on the unscaled queries and keys (no softmax, no 1/√d_k)")
    if getattr(p, "mla", None) is not None:  # the heads' widths come from the latent
        m = p.mla
        what += (f"; multi-head latent attention: a latent of d_c = {m.d_c} per token and one shared rotated key "
                 f"of d_R = {m.d_R}, each head's key d_h + d_R = {m.d_h} + {m.d_R} wide")
        scale = f"each head's scores scaled by 1/√(d_h + d_R) = 1/√{m.d_h + m.d_R}" if p.scale == "auto" else scale
    if p.differential is not None:  # two softmax maps, the second subtracted λ times
        scale += (f"; differential attention: a second map from W_Q2 and W_K2, through the same scale and mask, "
                  f"subtracted λ = {sstr(p.differential.lam)} times from the first")
        if p.differential.paper is not None:
            scale += ", each head's output normalised (RMSNorm) and multiplied by 1 − λ_init, as in the paper"
    bias = "; a bias is added to the mask" if p.bias is not None else ""
    if p.positions is not None:  # said after the sizes: the projections read X + PE
        what += ("; sinusoidal positions (base " + str(p.positions.base) + ") are added to X"
                 if p.positions.kind == "sinusoidal" else "; learned positions are added to X")
        what += ", and the token types" if p.token_types is not None else ""
    what += _norms_said(p)
    heads = ((registry.B_Q, "query"), (registry.B_K, "key"), (registry.B_V, "value"))
    biases = [(b, word) for b, word in heads if p.projected and any(getattr(h, b) is not None for h in p.heads)]
    biases += [(registry.B_O, "output")] if p.b_O is not None else []
    if biases:  # said after the sizes, as the positions are
        what += (f"; the projections add the {_word_list([word for _, word in biases])} "
                 f"bias{'es' if len(biases) > 1 else ''} ⟦" + "⟧, ⟦".join(b for b, _ in biases) + "⟧ to every row")
    symbols = ""
    if p.symbols:
        names = ", ".join(s.name for s in p.symbols)
        symbols = f" Entries hold the symbols {names}, so the results are general formulas"
        if p.substitutions is not None:
            at = ", ".join(f"{s.name} = {v}" for s, v in p.values)
            symbols += f"; decimals and the cross-check use {at}"
        symbols += "."
    return f"The problem: {what}; mask: {p.mask.rule()}{bias}; {scale}{headline.scores_said(p)}. Every number below is exact.{symbols}{_sharing(p)}"


def _norms_said(p) -> str:
    """The norms and the residual stream, in the problem's first sentence."""
    def kind(n):
        return "RMSNorm" if n.rms else "LayerNorm"

    out = ""
    if p.embeddings_norm is not None:
        out += f"; the embeddings' {kind(p.embeddings_norm)} gives the layer's input"
    if p.norm is not None:
        out += (f"; a {kind(p.norm)} behind the attention normalises the residual sum (post-norm)" if p.norm.post
                else f"; a {kind(p.norm)} in front of the attention normalises each token")
    if p.residual and (p.norm is None or not p.norm.post):
        out += "; the residual stream adds the output to the input"
    return out


def _word_list(words: list[str]) -> str:
    """``query, key and value``."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _sharing(p) -> str:
    """Grouped-query attention and decoding, said once at the top (nothing for other problems)."""
    out = ""
    if p.kv_heads:
        kind = "multi-query attention" if p.kv_heads == 1 else "grouped-query attention"
        groups = "; ".join(f"{_heads(heads)} read K/V group {g}" for g, heads in registry.kv_groups(p))
        out += f" The heads share keys and values in {p.kv_heads} K/V {'group' if p.kv_heads == 1 else 'groups'} ({kind}): {groups}."
    if p.decode:
        out += (f" Token {p.decode} ({prose.literal(p.tokens[p.decode - 1])}) is then decoded from the KV cache "
                "and shown to equal its row of the full computation.")
    return out


def _heads(heads: list[int]) -> str:
    if len(heads) == 1:
        return f"head {heads[0]}"
    return "heads " + ", ".join(str(h) for h in heads[:-1]) + f" and {heads[-1]}"


# One entry of a row's softmax Jacobian, in the prose markup.
JACOBIAN_ENTRY = "⟦\\partial a_j/\\partial \\hat{s}_k = a_j(\\delta_{jk} - a_k)⟧"


def jacobian_blocks(step: Step, max_shown: int = MAX_SHOWN) -> list[Block]:
    """Blocks showing one row's softmax Jacobian in full."""
    i = jacobian_row(step)
    row = step.jacobian[i]
    n = len(row.raw)
    token = prose.literal(step.rows[i])
    cols = [tex_token(c) for c in step.cols]
    jac = grid(n, n, lambda j, k: form_tex(jacobian_form(row, i, j, k)), max_shown=max_shown,
               row_labels=cols, col_labels=cols)
    lhs = rf"J^{{({i + 1})}} = \operatorname{{diag}}(a_{{{i + 1}}}) - a_{{{i + 1}}}\,a_{{{i + 1}}}^{{\top}} = "
    return [
        Block("para", f"The softmax Jacobian of row {i + 1} ({token}), entry by entry {JACOBIAN_ENTRY}; "
                      "masked keys have a zero row and column:"),
        Block("math", lhs + jac, source=Jacobian(lhs, step, i)),
        Block("math", rf"d\hat{{S}}_{{{i + 1}}} = J^{{({i + 1})}}\,dA_{{{i + 1}}}^{{\top}}"
                      r"\quad\text{(each row of } J \text{ sums to 0, so each row of } d\hat{S} \text{ does too)}"),
    ]


def tile_blocks(d: Derivation, step: Step, max_shown: int = MAX_SHOWN) -> list[Block]:
    """The online softmax worked row by row: each worked row's recurrence table, its output row
    and its exact difference from row i of A·V."""
    from . import tiles

    rows = tiles.shown_rows(d, step, max_shown)
    out = [Block("para", "Row by row, block by block (each table starts from "
                         "⟦m^{(0)} = -\\infty⟧, ⟦\\ell^{(0)} = 0⟧, ⟦\\mathrm{acc}^{(0)} = 0⟧):")]
    for i in rows:
        if i is None:
            out.append(Block("para", "⋮ (the rows in between are worked the same way)"))
            continue
        w = tiles.worked_row(d, step, i)
        out.append(Block("para", tiles.intro(d, step, w, max_shown)))
        out.append(Block("math", tiles.table_tex(w, max_shown), source=Tiles(step, i)))
        out.append(Block("math", tiles.output_tex(step, w, max_shown)))
        out.append(Block("para", tiles.DIFFERENCE_SENTENCE.format(i=i + 1)))
        out.append(Block("math", tiles.difference_tex(w, max_shown)))
    if tiles.every_row_exact(d, step):
        out.append(Block("para", "Every row, worked here or not, comes out the same: the one pass over the keys "
                                 "gives the output of the whole softmax exactly."))
        out.append(Block("math", f"{_short_name(step)} - O = 0"))
    return out


def check_sentence(check) -> str:
    if check.passed is None:
        return f"No numeric cross-check: {check.skipped}."
    if not check.passed:
        return f"The cross-check FAILED: {prose.literal(str(check.all_mismatches[0]))}."
    sentence = (
        f"Every stage agrees with an independent NumPy float64 evaluation of the same problem: "
        f"the largest difference is {check.max_abs_error:.1e} (tolerance {check.tolerance:.0e})."
    )
    if check.torch is not None:
        items = ["weights", "outputs"] + (["gradients"] if check.finite_differences is not None else [])
        compared = {registry.split_id(i)[1] for i in check.torch.per_stage}
        items += [name for key, name in ((registry.X_EMB, "the embeddings' norm (F.layer_norm)"),
                                         (registry.X_NORM, "the norm's output (F.layer_norm or F.rms_norm)"),
                                         (registry.H, "the residual stream"),
                                         (registry.G, "the MLP's activation (nn.GELU, F.silu, F.relu)"),
                                         (registry.Y, "the block's output"), (registry.LOGITS, "the logits"),
                                         (registry.P, "the probabilities (F.softmax)"),
                                         (registry.LOSS, "the loss (F.cross_entropy)")) if key in compared]
        linear = registry.PHI_Q in compared
        if linear:  # no SDPA: the recurrent form with F.relu or F.elu and cumulative sums
            items = ["feature maps", "states", "outputs"] + items[2:]
        what = ", ".join(items[:-1]) + " and " + items[-1]
        torch_what = ("PyTorch's own functions (F.relu or F.elu, and the states as cumulative sums)"
                      if linear else "PyTorch's scaled_dot_product_attention")
        sentence += (
            f" The {what} also agree with {torch_what} in float64: "
            f"the largest difference is {check.torch.max_abs_error:.1e}."
        )
    fd = check.finite_differences
    if fd is not None:
        if fd.skipped:
            sentence += f" The gradients were not compared with finite differences: {fd.skipped}."
        else:
            sentence += (
                f" The gradients agree with central finite differences of the NumPy forward pass: "
                f"the largest difference is {fd.max_abs_error:.1e}, each entry within its own bound from the "
                f"step and the loss's rounding (the largest {fd.tolerance:.1e})."
            )
    return sentence
