"""Pieces every renderer shares: stages grouping, decimals, LaTeX math of entries."""

from __future__ import annotations

import re
from dataclasses import dataclass

import mpmath
import sympy

from .. import _exact
from ..derivation import Derivation, Step
from ._grid import escape_tex, grid, shown

NEG_INF = sympy.S.NegativeInfinity
# Decimals are rounded from values worked to this many digits: the cross-check's own, so each
# stage is evaluated once.
DPS = 30

# The eight stages of the walk-through, and which step ids each one shows.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The input", ("X", "context")),
    ("Project to queries, keys and values", ("W_Q", "Q", "W_K", "K", "W_V", "V")),
    ("Transpose the keys", ("K_T",)),
    ("Score every query against every key", ("S",)),
    ("Scale the scores", ("S_scaled",)),
    ("Apply the mask", ("M", "S_masked")),
    ("Softmax on each row", ("A",)),
    ("Weighted sum of the values", ("O",)),
)
_GIVEN_STAGE = ("The input: queries, keys and values given", ("Q", "K", "V"))


_HEADS_STAGES = (
    ("Concatenate the heads", ("concat",)),
    ("Output projection", ("W_O", "O")),
)


@dataclass(frozen=True)
class Stage:
    number: int
    title: str
    steps: tuple[Step, ...]
    head: int | None = None


def stages(d: Derivation) -> tuple[Stage, ...]:
    """The derivation's steps grouped into numbered stages, in order.

    With several heads: the input, then stages 2 to 8 for each head, then the
    concatenation and the output projection.
    """
    by_id = {s.id: s for s in d.steps}
    p = d.problem
    groups: list[tuple[str, tuple[str, ...], int | None]] = []
    if not p.projected:
        groups.append((*_GIVEN_STAGE, None))
        groups += [(title, ids, None) for title, ids in STAGES[2:]]
    elif not p.multi_head:
        groups += [(title, ids, None) for title, ids in STAGES]
    else:
        groups.append((*STAGES[0], None))
        for h in range(1, len(p.heads) + 1):
            groups += [(title, tuple(f"head{h}.{i}" for i in ids), h) for title, ids in STAGES[1:]]
        groups += [(title, ids, None) for title, ids in _HEADS_STAGES]
    out = []
    for title, ids, head in groups:
        steps = tuple(by_id[i] for i in ids if i in by_id)
        if steps:
            # Each head's stages keep the walk-through's numbers 2 to 8.
            number = [t for t, _ in STAGES].index(title) + 1 if head else len(out) + 1
            if p.multi_head and not head and out:
                number = len(STAGES) + (2 if "projection" in title else 1)
            out.append(Stage(number, title, steps, head))
    if p.backward is not None:
        out += _backward_stages(p, by_id, max((s.number for s in out), default=0))
    return tuple(out)


# The backward pass, stage by stage (per head where the forward pass was per head).
_BACKWARD_HEAD = (
    ("Back through the weighted sum", ("dV", "dA")),
    ("Back through the softmax", ("dS_masked",)),
    ("Back through the scaling", ("dS",)),
    ("Back to the queries and keys", ("dQ", "dK")),
    ("Back to the projection weights", ("dW_Q", "dW_K", "dW_V")),
)


def _backward_stages(p, by_id: dict, last: int) -> list[Stage]:
    """The gradient stages, numbered on from the forward pass's ``last``."""
    groups: list[tuple[str, tuple[str, ...], int | None, int]] = [("Backward: the upstream gradient", ("dO",), None, 1)]
    per_head = _BACKWARD_HEAD
    if p.multi_head:
        groups.append(("Back through the output projection", ("dW_O", "dconcat"), None, 2))
        per_head = (("This head's upstream gradient", ("dO",)),) + _BACKWARD_HEAD
        for h in range(1, len(p.heads) + 1):
            groups += [(title, tuple(f"head{h}.{i}" for i in ids), h, 3 + k) for k, (title, ids) in enumerate(per_head)]
        after = 3 + len(per_head)
    else:
        groups += [(title, ids, None, 2 + k) for k, (title, ids) in enumerate(per_head)]
        after = 2 + len(per_head)
    groups.append(("Back to the input", ("dX", "dcontext"), None, after))
    out = []
    for title, ids, head, number in groups:
        steps = tuple(by_id[i] for i in ids if i in by_id)
        if steps:
            out.append(Stage(last + number, title, steps, head))
    return out


def decimal(x: mpmath.mpf, digits: int) -> str:
    """``x`` to ``digits`` significant figures, without trailing zeros.

    >>> decimal(mpmath.mpf(1) / 3, 4)
    '0.3333'
    >>> decimal(mpmath.mpf(2), 4)
    '2'
    """
    if mpmath.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x == 0:
        return "0"
    text = mpmath.nstr(x, digits, min_fixed=-5, max_fixed=digits + 1, strip_zeros=True)
    if text.endswith(".0"):
        text = text[:-2]
    return text


def is_plain_integer(x: sympy.Expr) -> bool:
    return isinstance(x, sympy.Integer)


TOO_LONG = (
    "At this size the exact entries are long sums of fractions over the rows' normalisers, so they are "
    "shown in decimals only (symattn.derive(...).step(id).exact builds them)."
)


def written_exactly(step: Step) -> bool:
    """Whether a worked solution writes the step's exact entries (big gradients: decimals only)."""
    return getattr(step, "written_exactly", True)


def needs_decimals(step: Step) -> bool:
    """Whether decimals help: some entry is not an integer or −∞, and none holds a symbol."""
    if not written_exactly(step):
        return True
    qq = _exact.qq_entries(step.lazy)
    if qq is not None:  # rationals: read the denominators, build no SymPy number
        return any(x is not None and x.denominator != 1 for row in qq for x in row)
    values = getattr(step, "values", None)  # V, for the output step
    if (step.softmax and len(step.rows) * len(step.cols) > _BIG and all(r.rational for r in step.softmax)
            and (values is None or _exact.is_rational(values))):
        # A weight is 0 or 1 only in a row with a single allowed key; with more, weights are fractions.
        if any(sum(e is not None for e in r.raw) > 1 for r in step.softmax):
            return True
        return values is not None and any(x.denominator != 1 for row in _exact.rational_rows(values) for x in row)
    entries = list(_entries(step))
    if any(x.free_symbols for x in entries):
        return False
    return any(not (is_plain_integer(x) or x == NEG_INF) for x in entries)


_BIG = 64  # above this many entries, decide from structure rather than building every entry


def _entries(step: Step):
    if step.softmax and step.kind == "A":
        for row in step.softmax:
            for j in range(len(row.exponents)):
                yield row.weight(j)
    else:
        yield from step.lazy


def tex(x: sympy.Expr) -> str:
    """LaTeX of one exact entry."""
    if isinstance(x, sympy.Rational):
        return qq_tex(x)  # what sympy.latex writes, without its printer
    if x == NEG_INF:
        return "-\\infty"
    return sympy.latex(x)


def qq_tex(x) -> str:
    """LaTeX of a rational (a SymPy Rational or a QQ number), exactly as ``sympy.latex`` writes it."""
    p, q = int(x.numerator), int(x.denominator)
    if q == 1:
        return str(p)
    return f"- \\frac{{{-p}}}{{{q}}}" if p < 0 else f"\\frac{{{p}}}{{{q}}}"


def qq_text(x) -> str:
    """Plain text of a rational, exactly as ``sympy.sstr`` writes it."""
    p, q = int(x.numerator), int(x.denominator)
    return str(p) if q == 1 else f"{p}/{q}"


def _exp_split(term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr] | None:
    """``term`` as ``(c, x)`` with ``term = c·e^x`` and ``c`` free of exponentials, if it is one."""
    coeff, exponent = [], []
    for f in sympy.Mul.make_args(term):
        if isinstance(f, sympy.exp):
            exponent.append(f.args[0])
        elif f is sympy.E:
            exponent.append(sympy.Integer(1))
        elif f.has(sympy.exp) or f.has(sympy.E):
            return None
        else:
            coeff.append(f)
    return sympy.Mul(*coeff), sympy.Add(*exponent)


def exp_sum_tex(expr: sympy.Expr, max_terms: int = 6) -> str:
    """A sum of terms ``c·e^x`` in LaTeX, the largest exponent first.

    >>> exp_sum_tex(2*sympy.exp(-2) + 1 + sympy.exp(-1))
    '1 + e^{-1} + 2 e^{-2}'
    """
    return _exp_sum(expr, tex, lambda x: f"e^{{{tex(x)}}}", "\\left({}\\right)", " ", "\\cdots", max_terms)


def exp_sum_text(expr: sympy.Expr, max_terms: int = 6) -> str:
    """The same in plain text.

    >>> exp_sum_text(2*sympy.exp(-2) + 1 + sympy.exp(-1))
    '1 + exp(-1) + 2*exp(-2)'
    """
    return _exp_sum(expr, text_entry, lambda x: f"exp({text_entry(x)})", "({})", "*", "...", max_terms)


def text_entry(x: sympy.Expr) -> str:
    """Plain text of one exact entry (``sympify`` reads it back)."""
    return "-inf" if x == NEG_INF else sympy.sstr(x, order="none")


MAX_TERMS = 6  # terms of a sum written before it is elided
MAX_CELL_TERMS = 3  # the same inside a matrix of more than four columns


def _exp_sum(expr, show, power_of, paren: str, times: str, ellipsis: str, max_terms: int = 6) -> str:
    parts = []
    for term in sympy.Add.make_args(expr):
        split = _exp_split(term)
        if split is None:
            return show(expr)
        parts.append(split)
    parts.sort(key=lambda cx: -float(cx[1]) if cx[1].is_number else 0.0)
    return _exp_parts(parts, show, power_of, paren, times, ellipsis, max_terms)


def exp_parts_tex(parts: list, max_terms: int = 6) -> str:
    """LaTeX of ``Σ c·e^x`` from exact ``(c, x)`` pairs in QQ, already in order (see
    ``SoftmaxRow.numerator_parts``): what :func:`exp_sum_tex` writes for the same sum."""
    return _exp_parts(parts, qq_tex, lambda x: f"e^{{{qq_tex(x)}}}", "\\left({}\\right)", " ", "\\cdots", max_terms)


def exp_parts_text(parts: list, max_terms: int = 6) -> str:
    """Plain text of the same (what :func:`exp_sum_text` writes)."""
    return _exp_parts(parts, qq_text, lambda x: f"exp({qq_text(x)})", "({})", "*", "...", max_terms)


def _exp_parts(parts: list, show, power_of, paren: str, times: str, ellipsis: str, max_terms: int) -> str:
    if not parts:
        return "0"
    if len(parts) > max_terms:  # a long sum: its first terms and its last (the JSON has every term)
        parts = parts[: max_terms // 2] + [None] + parts[-1:]
    out = ""
    for k, part in enumerate(parts):
        if part is None:
            out += f" + {ellipsis}"
            continue
        c, x = part
        power = "" if x == 0 else power_of(x)
        if not power:
            body = show(c)
        elif c == 1:
            body = power
        elif c == -1:
            body = "-" + power
        elif isinstance(c, sympy.Add):
            body = paren.format(show(c)) + times + power
        else:
            body = show(c) + times + power
        if k and body.startswith("-"):
            out += " - " + body[1:]
        elif k:
            out += " + " + body
        else:
            out += body
    return out


def over_normaliser(step: Step, i: int, j: int) -> sympy.Expr | None:
    """The numerator of entry (i, j) of A or O when its row is written over Z_i, else None."""
    if not step.softmax or normaliser_is_number(step.softmax[i]):
        return None
    row = step.softmax[i]
    if step.kind == "A":
        return row.terms[j]
    return row.weighted_numerator(list(step.values.col(j)))


def numerator_parts(step: Step, i: int, j: int) -> list | None:
    """What :func:`over_normaliser` gives, as exact ``(c, x)`` pairs in QQ in writing order, when
    row i and the values are rational (no SymPy expression is built); else None."""
    if step.kind not in ("A", "O") or not step.softmax:
        return None
    row = step.softmax[i]
    if not row.rational or normaliser_is_number(row):
        return None
    if step.kind == "A":
        return [] if row.raw[j] is None else [(_exact.QQ(1), row.raw[j])]
    columns = getattr(step, "value_columns", None)
    return None if columns is None else row.numerator_parts(columns[j])


def normaliser_is_number(row) -> bool:
    return row.normaliser_is_number


def over_normaliser_squared(step: Step, i: int, j: int) -> sympy.Expr | None:
    """The numerator of a gradient entry (i, j) written over Z_i², else None."""
    numerator_of = getattr(step, "over_z_squared", None)
    if numerator_of is None or normaliser_is_number(step.jacobian[i]):
        return None
    return numerator_of(i, j)


def entry_tex(step: Step, i: int, j: int) -> str:
    """LaTeX of entry (i, j), writing softmax rows over their normaliser Z_i (gradients over Z_i²)."""
    squared = over_normaliser_squared(step, i, j)
    if squared is not None:
        terms = MAX_CELL_TERMS if step.shape[1] > 4 else MAX_TERMS
        return "0" if squared == 0 else rf"\dfrac{{{exp_sum_tex(squared, terms)}}}{{Z_{{{i + 1}}}^{{2}}}}"
    # Inside a wide matrix a numerator keeps fewer terms (MAX_CELL_TERMS).
    terms = MAX_CELL_TERMS if step.shape[1] > 4 else MAX_TERMS
    parts = numerator_parts(step, i, j)
    if parts is not None:
        return f"\\dfrac{{{exp_parts_tex(parts, terms)}}}{{Z_{{{i + 1}}}}}" if parts else "0"
    numerator = over_normaliser(step, i, j)
    if numerator is None:
        return tex(step.lazy[i, j])
    if numerator == 0:
        return "0"
    return f"\\dfrac{{{exp_sum_tex(numerator, terms)}}}{{Z_{{{i + 1}}}}}"


_UNLABELLED = {"W_Q", "W_K", "W_V", "W_O", "dW_Q", "dW_K", "dW_V", "dW_O"}
_KEY_COLUMNS = {"K_T", "S", "S_scaled", "M", "S_masked", "A", "dA", "dS_masked", "dS"}
MAX_SHOWN = 8


def _labels(step: Step) -> tuple[list[str] | None, list[str] | None]:
    """Row and column labels for a matrix: tokens as text, dimensions as math."""
    if step.kind in _UNLABELLED:
        return None, None
    tokens = lambda names: [f"\\text{{{escape_tex(n)}}}" for n in names]  # noqa: E731
    dims = lambda names: [re.sub(r"([a-z])([0-9]+)", r"\1_{\2}", n) for n in names]  # noqa: E731
    rows = dims(step.rows) if step.kind == "K_T" else tokens(step.rows)
    cols = tokens(step.cols) if step.kind in _KEY_COLUMNS else dims(step.cols)
    return rows, cols


def exact_tex_matrix(d: Derivation, step: Step, max_shown: int = MAX_SHOWN) -> str:
    rows, cols = step.shape
    if step.kind in ("concat", "O") and d.problem.multi_head and step.head is None:
        entry = lambda i, j: _heads_entry_tex(d, step, i, j)  # noqa: E731
    elif (qq := _rational_entries(step)) is not None:  # written from their QQ numbers, no SymPy number made
        entry = lambda i, j: "-\\infty" if qq[i][j] is None else qq_tex(qq[i][j])  # noqa: E731
    else:
        entry = lambda i, j: entry_tex(step, i, j)  # noqa: E731
    row_labels, col_labels = _labels(step)
    return grid(rows, cols, entry, max_shown=max_shown, row_labels=row_labels, col_labels=col_labels)


def _rational_entries(step: Step) -> "list[list] | None":
    """The QQ entries (None for −∞) of a rational step that is written entry by entry, else None."""
    if step.softmax or getattr(step, "over_z_squared", None) is not None:
        return None
    return _exact.qq_entries(step.lazy)


def head_parts(d: Derivation, step: Step, i: int, j: int) -> list[tuple[int, sympy.Expr, bool]]:
    """Entry (i, j) of the concatenation or of the projected output, head by head.

    Each part is ``(h, x, over_z)``: head h contributes ``x / Z^{(h)}_i`` when
    ``over_z``, else the exact number ``x``.
    """
    p = d.problem
    outputs = [d.step(f"head{h}.O") for h in range(1, len(p.heads) + 1)]
    offsets = [0]
    for o in outputs:
        offsets.append(offsets[-1] + o.shape[1])
    if step.kind == "concat":
        weights = sympy.eye(offsets[-1])
    else:
        weights = p.W_O
    parts = []
    for h, o in enumerate(outputs, 1):
        over_z = over_normaliser(o, i, 0) is not None
        total = sympy.Integer(0)
        for c in range(o.shape[1]):
            w = weights[offsets[h - 1] + c, j]
            if w != 0:
                total += (over_normaliser(o, i, c) if over_z else o.lazy[i, c]) * w
        total = sympy.expand(total, power_exp=False, power_base=False, log=False)
        if total != 0:
            parts.append((h, total, over_z))
    return parts


def _heads_entry_tex(d: Derivation, step: Step, i: int, j: int) -> str:
    parts = head_parts(d, step, i, j)
    plain = sympy.Add(*[x for _, x, over_z in parts if not over_z])
    terms = [f"\\dfrac{{{exp_sum_tex(x)}}}{{Z^{{({h})}}_{{{i + 1}}}}}" for h, x, over_z in parts if over_z]
    if plain != 0 or not terms:
        terms.insert(0, tex(plain))
    return " + ".join(terms).replace("+ -", "- ")


def exact_tex_matrix_of_step(step: Step, max_shown: int = MAX_SHOWN) -> str:
    """A step's exact matrix on its own, every entry written out in full (no Z_i to refer to)."""
    rows, cols = step.shape
    row_labels, col_labels = _labels(step)
    return grid(rows, cols, lambda i, j: tex(step.lazy[i, j]), max_shown=max_shown,
                row_labels=row_labels, col_labels=col_labels)


def approx_tex_matrix(d: Derivation, step: Step, digits: int, max_shown: int = MAX_SHOWN, shade: bool = False) -> str:
    """Decimals of a step; with ``shade``, the weights' cells are shaded by size (LaTeX's colortbl)."""
    value = d.entry_values(step.id, max(digits + 5, DPS))
    rows, cols = step.shape
    row_labels, col_labels = _labels(step)
    shading = None
    if shade and step.kind == "A":
        shading = lambda i, j: _shade(step.softmax[i].raw[j] is None, value(i, j))  # noqa: E731
    return grid(
        rows, cols, lambda i, j: _tex_decimal(value(i, j), digits), max_shown=max_shown,
        row_labels=row_labels, col_labels=col_labels, shade=shading,
    )


def _shade(masked: bool, weight) -> str:
    """A grey proportional to the weight (readable printed in black and white); masked cells greyed out."""
    if masked:
        return "\\color[gray]{0.6}"
    level = 1 - 0.5 * float(weight)
    return f"\\cellcolor[gray]{{{level:.2f}}}"


def _tex_decimal(v, digits: int) -> str:
    if mpmath.isinf(v):
        return "-\\infty"
    text = decimal(v, digits)
    m = re.fullmatch(r"(-?[0-9.]+)e([-+]?)0*([0-9]+)", text)
    if m:
        sign = "-" if m.group(2) == "-" else ""
        return f"{m.group(1)}\\times 10^{{{sign}{m.group(3)}}}"
    return text


def normaliser_lines(d: Derivation, step: Step, digits: int, max_shown: int = MAX_SHOWN) -> list[str]:
    """``m_i`` and ``Z_i`` of every drawn row whose normaliser is not a plain number."""
    lines = []
    for i in shown(len(step.softmax), max_shown):
        if i is None:
            lines.append("\\vdots")
            continue
        row = step.softmax[i]
        if normaliser_is_number(row):
            continue
        line = (
            f"m_{{{i + 1}}} = {tex(row.maximum)},\\quad Z_{{{i + 1}}} = \\sum_k e^{{\\hat{{S}}_{{{i + 1}k}} - m_{{{i + 1}}}}} = "
            f"{exp_parts_tex(row.numerator_parts()) if row.rational else exp_sum_tex(row.normaliser)}"
        )
        subs = d.problem.substitutions
        if subs is not None:
            line += f" \\approx {_tex_decimal(row.evaluate_normaliser(max(digits + 5, DPS), subs), digits)}"
        lines.append(line)
    return lines


def factor_tex(x: sympy.Expr) -> str:
    """An entry as a factor in a product: negatives and sums in parentheses."""
    s = tex(x)
    if s.startswith("-") or isinstance(x, sympy.Add):
        return f"\\left({s}\\right)"
    return s


def worked_dot_tex(dot) -> str:
    products = [f"{factor_tex(a)} \\cdot {factor_tex(b)}" for a, b in dot.terms]
    if len(products) > MAX_TERMS:
        products = products[:3] + ["\\cdots"] + products[-1:]
    products = " + ".join(products)
    left = _vec_name(dot.left)
    right = _vec_name(dot.right)
    return (
        f"{_sub(dot.target, dot.i, dot.j)} = {left} \\cdot {right} = {products} = {tex(dot.value)}"
    )


def _vec_name(name: str) -> str:
    # "q_1" -> "q_{1}", "W_Q[:,1]" -> "W_{Q}[:,1]"
    m = re.fullmatch(r"([A-Za-z])_([A-Za-z0-9]+)(.*)", name)
    if not m:
        return name
    return f"{m.group(1)}_{{{m.group(2)}}}{m.group(3)}"


def _sub(name: str, i: int, j: int) -> str:
    return f"{name}_{{{i + 1}{j + 1}}}" if max(i, j) < 9 else f"{name}_{{{i + 1},{j + 1}}}"


# -- the document as a sequence of blocks, shared by LaTeX and Markdown ------------


@dataclass(frozen=True)
class Block:
    """One piece of a worked solution.

    ``kind`` is ``section`` (text = heading), ``step`` (text = the step's
    title, extra = its one sentence of why), ``para`` (text = prose in
    plain Unicode, never LaTeX) or ``math`` (text = display LaTeX).
    """

    kind: str
    text: str
    extra: str = ""


# The stage kinds in the order of the formula, for --from/--to and --ask.
KIND_ORDER = (
    "X", "context", "W_Q", "Q", "W_K", "K", "W_V", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O",
    "concat", "W_O", "O_final",
    "dO", "dW_O", "dconcat", "dV", "dA", "dS_masked", "dS", "dQ", "dK", "dW_Q", "dW_K", "dW_V", "dX", "dcontext",
)
# What each computed stage is made from, stated as given when a selection starts there.
_INPUTS = {
    "Q": ("X", "W_Q"), "K": ("kv", "W_K"), "V": ("kv", "W_V"), "K_T": ("K",), "S": ("Q", "K_T"),
    "S_scaled": ("S",), "S_masked": ("S_scaled", "M"), "A": ("S_masked",), "O": ("A", "V"),
    "concat": ("heads",), "O_final": ("concat", "W_O"),
}


def kind_key(d: Derivation, step: Step) -> str:
    """The stage kind of a step, telling the projected output of several heads (O_final) from a head's O."""
    if step.kind == "O" and d.problem.multi_head and step.head is None:
        return "O_final"
    return step.kind


def select(d: Derivation, first: str | None = None, last: str | None = None) -> list[Step]:
    """The steps from stage kind ``first`` to ``last`` (inclusive, in the formula's order)."""
    if last == "O" and d.problem.multi_head:
        last = "O_final"  # the output of the whole layer, after W_O
    if first == "O" and d.problem.multi_head:
        first = "O_final"
    lo = KIND_ORDER.index(first) if first else 0
    hi = KIND_ORDER.index(last) if last else len(KIND_ORDER) - 1
    if hi < lo:
        raise ValueError(f"--from {first} comes after --to {last}")
    return [s for s in d.steps if lo <= KIND_ORDER.index(kind_key(d, s)) <= hi]


def _given_inputs(d: Derivation, chosen: list[Step]) -> list[Step]:
    """What the first shown computed step of each head is made from, when that is not shown."""
    ids = {s.id for s in chosen}
    firsts: dict[str, Step] = {}
    for s in chosen:
        if not s.given:
            firsts.setdefault(s.id[: -len(s.kind)], s)  # keyed by the head prefix
    names: list[str] = []
    for prefix, first in firsts.items():
        for name in _INPUTS.get(kind_key(d, first), ()):
            if name == "kv":
                names.append("context" if d.problem.context is not None else "X")
            elif name == "heads":
                names += [f"head{h}.O" for h in range(1, len(d.problem.heads) + 1)]
            elif name in ("X", "context", "concat", "W_O"):
                names.append(name)
            else:
                names.append(prefix + name)
    unique = list(dict.fromkeys(n for n in names if n not in ids))
    return [d.step(n) for n in unique]


def blocks(
    d: Derivation,
    digits: int | None = None,
    check=None,
    *,
    max_shown: int = MAX_SHOWN,
    shade: bool = False,
    first: str | None = None,
    last: str | None = None,
    exercise: bool = False,
    ask: frozenset[str] | None = None,
) -> list[Block]:
    """The worked solution of ``d``, renderer-neutral (``shade`` needs LaTeX's colortbl).

    ``first``/``last`` limit it to part of the pipeline (the inputs of the
    first shown step are stated as given). ``exercise`` writes the problem
    with empty boxes for the asked stage kinds instead of their values.
    """
    p = d.problem
    digits = digits or p.digits
    chosen = select(d, first, last)
    out: list[Block] = [Block("para", _intro(d)), Block("math", _FORMULA)]
    givens = _given_inputs(d, chosen)
    if exercise:
        givens = [s for s in d.steps if s.given] + [s for s in givens if not s.given]
        chosen = [s for s in chosen if not s.given and (ask is None or kind_key(d, s) in ask or s.kind in ask)]
    if givens:
        out.append(Block("section", "Given"))
        for step in givens:
            out.append(Block("para", f"{step.title} ({step.id}), {step.shape_note}:"))
            out.append(Block("math", f"{_short_name(step)} = {exact_tex_matrix(d, step, max_shown)}"))
        if exercise and p.bias is not None:
            n_q, n_k = p.bias.shape
            out.append(Block("para", f"The bias B, {n_q}×{n_k}, added to the mask:"))
            out.append(Block("math", "B = " + grid(n_q, n_k, lambda i, j: tex(p.bias[i, j]), max_shown=max_shown)))
    chosen_ids = {s.id for s in chosen}
    evaluable = d.can_evaluate
    for stage in stages(d):
        steps = [s for s in stage.steps if s.id in chosen_ids]
        if not steps:
            continue
        head = f"Head {stage.head} · " if stage.head else ""
        out.append(Block("section", f"{head}Step {stage.number}: {stage.title}"))
        for step in steps:
            out.append(Block("step", step.title, step.why))
            if exercise:
                out.append(Block("math", f"{step.formula} = {_boxes(step, max_shown)}"))
                out.append(Block("para", f"Shape: {step.shape_note}."))
                continue
            if step.kind == "A":
                out.append(Block("math", _SOFTMAX_DEF))
            if not written_exactly(step):
                out.append(Block("math", step.formula))
                out.append(Block("para", TOO_LONG))
            else:
                out.append(Block("math", f"{step.formula} = {_parts_tex(p, step, max_shown)}{exact_tex_matrix(d, step, max_shown)}"))
            out.append(Block("para", f"Shape: {step.shape_note}."))
            for dot in step.worked:
                out.append(Block("math", worked_dot_tex(dot)))
            if step.softmax and step.kind == "A":
                for line in normaliser_lines(d, step, digits, max_shown):
                    out.append(Block("math", line))
            if step.kind == "dS_masked":
                out += jacobian_blocks(step, max_shown)
            if step.kind == "O" and step.softmax and evaluable:
                line = weighted_sum_tex(d, step, digits)
                if line:
                    out.append(Block("math", line))
            if needs_decimals(step) and evaluable:
                approx = approx_tex_matrix(d, step, digits, max_shown, shade)
                out.append(Block("math", f"{_short_name(step)} \\approx {approx}"))
    if check is not None and not exercise:
        out.append(Block("section", "Cross-check"))
        out.append(Block("para", check_sentence(check)))
    return out


def _boxes(step: Step, max_shown: int) -> str:
    """An empty answer box per entry, laid out like the step's matrix."""
    rows, cols = step.shape
    row_labels, col_labels = _labels(step)
    return grid(rows, cols, lambda i, j: "\\boxed{\\phantom{0.000}}", max_shown=max_shown,
                row_labels=row_labels, col_labels=col_labels)


_SOFTMAX_DEF = (
    "A_{ij} = \\frac{e^{\\hat{S}_{ij} - m_i}}{Z_i},\\qquad "
    "m_i = \\max_k \\hat{S}_{ik},\\qquad Z_i = \\sum_k e^{\\hat{S}_{ik} - m_i}"
)
_FORMULA = "\\operatorname{Attention}(Q, K, V) = \\operatorname{softmax}\\!\\left(\\frac{Q K^{\\top}}{\\sqrt{d_k}} + M\\right) V"


def _short_name(step: Step) -> str:
    return {
        "S_scaled": "\\frac{S}{\\sqrt{d_k}}",
        "S_masked": "\\hat{S}",
        "K_T": "K^{\\top}",
        "concat": "\\operatorname{concat}",
        "dS_masked": "d\\hat{S}",
        "dconcat": "d\\operatorname{concat}",
        "dcontext": "dC",
    }.get(step.kind, _tex_id(step.kind))


def _tex_id(name: str) -> str:
    head, _, tail = name.partition("_")
    return f"{head}_{{{tail}}}" if tail else head


def _parts_tex(p, step: Step, max_shown: int = MAX_SHOWN) -> str:
    """For M with a bias: the mask and the bias shown before their sum."""
    if step.kind != "M" or p.bias is None:
        return ""
    n_q, n_k = p.bias.shape
    mask = grid(n_q, n_k, lambda i, j: "0" if p.mask.allowed[i][j] else "-\\infty", max_shown=max_shown)
    bias = grid(n_q, n_k, lambda i, j: tex(p.bias[i, j]), max_shown=max_shown)
    return f"{mask} + {bias} = "


def _intro(d: Derivation) -> str:
    p = d.problem
    if p.multi_head:
        widths = ", ".join(f"d_k = {h.d_k}, d_v = {h.d_v}" for h in p.heads)
        side = (
            f"{p.n_q} query tokens ({', '.join(p.tokens)}) attending to {p.n_k} context tokens ({', '.join(p.key_tokens)})"
            if p.context is not None
            else f"{p.n_q} tokens ({', '.join(p.tokens)})"
        )
        what = (
            f"{side} with d_model = {p.d_model}, {len(p.heads)} heads ({widths}) "
            f"and an output projection to d_out = {p.W_O.cols}"
        )
    elif p.projected:
        what = (
            f"{p.n_q} tokens ({', '.join(p.tokens)}) with d_model = {p.d_model}, "
            f"projected to queries and keys of width d_k = {p.d_k} and values of width d_v = {p.d_v}"
        )
        if p.context is not None:
            what = (
                f"{p.n_q} query tokens ({', '.join(p.tokens)}) attending to {p.n_k} context tokens "
                f"({', '.join(p.key_tokens)}), d_model = {p.d_model}, d_k = {p.d_k}, d_v = {p.d_v}"
            )
    else:
        what = f"{p.n_q} queries and {p.n_k} keys given directly, d_k = {p.d_k}, d_v = {p.d_v}"
    scale = {"auto": f"scores scaled by 1/√d_k = 1/√{p.d_k}", "none": "no scaling"}.get(
        p.scale if isinstance(p.scale, str) else "", f"scores scaled by {p.scale}"
    )
    if p.scale == "auto" and p.multi_head:
        scale = "each head's scores scaled by 1/√d_k"
    bias = "; a bias is added to the mask" if p.bias is not None else ""
    symbols = ""
    if p.symbols:
        names = ", ".join(s.name for s in p.symbols)
        symbols = f" Entries hold the symbols {names}, so the results are general formulas"
        if p.substitutions is not None:
            at = ", ".join(f"{s.name} = {v}" for s, v in p.values)
            symbols += f"; decimals and the cross-check use {at}"
        symbols += "."
    return f"The problem: {what}; mask: {p.mask.rule()}{bias}; {scale}. Every number below is exact.{symbols}"


def jacobian_row(step: Step) -> int:
    """The row whose softmax Jacobian is shown: the first with two or more allowed keys."""
    return next((i for i, r in enumerate(step.jacobian) if sum(e is not None for e in r.raw) > 1), 0)


def jacobian_entry(row, j: int, k: int) -> sympy.Expr:
    """Entry (j, k) of the softmax Jacobian diag(a) − a aᵀ of one row: a_j(δ_jk − a_k), exactly."""
    if row.raw[j] is None or row.raw[k] is None:
        return sympy.Integer(0)
    t, z = row.terms, row.normaliser
    top = sympy.expand(t[j] * (z - t[j])) if j == k else -t[j] * t[k]
    return top / z**2


def jacobian_blocks(step: Step, max_shown: int = MAX_SHOWN) -> list[Block]:
    """Blocks showing one row's softmax Jacobian in full."""
    i = jacobian_row(step)
    row = step.jacobian[i]
    n = len(row.raw)
    token = step.rows[i]
    cols = [rf"\text{{{escape_tex(c)}}}" for c in step.cols]
    jac = grid(n, n, lambda j, k: tex(jacobian_entry(row, j, k)), max_shown=max_shown,
               row_labels=cols, col_labels=cols)
    return [
        Block("para", f"The softmax Jacobian of row {i + 1} ({token}), entry by entry "
                      "∂a_j/∂ŝ_k = a_j(δ_jk − a_k); masked keys have a zero row and column:"),
        Block("math", rf"J^{{({i + 1})}} = \operatorname{{diag}}(a_{{{i + 1}}}) - a_{{{i + 1}}}\,a_{{{i + 1}}}^{{\top}} = {jac}"),
        Block("math", rf"d\hat{{S}}_{{{i + 1}}} = J^{{({i + 1})}}\,dA_{{{i + 1}}}^{{\top}}"
                      r"\quad\text{(each row of } J \text{ sums to 0, so each row of } d\hat{S} \text{ does too)}"),
    ]


def check_sentence(check) -> str:
    if check.passed is None:
        return f"No numeric cross-check: {check.skipped}."
    if not check.passed:
        return f"The cross-check FAILED: {check.all_mismatches[0]}."
    sentence = (
        f"Every stage agrees with an independent NumPy float64 evaluation of the same problem: "
        f"the largest difference is {check.max_abs_error:.1e} (tolerance {check.tolerance:.0e})."
    )
    if check.torch is not None:
        what = "weights, outputs and gradients" if check.finite_differences is not None else "weights and outputs"
        sentence += (
            f" The {what} also agree with PyTorch's scaled_dot_product_attention in float64: "
            f"the largest difference is {check.torch.max_abs_error:.1e}."
        )
    fd = check.finite_differences
    if fd is not None:
        if fd.skipped:
            sentence += f" The gradients were not compared with finite differences: {fd.skipped}."
        else:
            sentence += (
                f" The gradients agree with central finite differences of the NumPy forward pass: "
                f"the largest difference is {fd.max_abs_error:.1e} (tolerance {fd.tolerance:.0e})."
            )
    return sentence


def weighted_sum_tex(d: Derivation, step: Step, digits: int) -> str | None:
    """The last output row worked as a weighted average of value rows, in decimals."""
    weights = [row.evaluate(max(digits + 5, DPS), d.problem.substitutions) for row in step.softmax]
    i = len(weights) - 1
    values = step.values
    if values is None or values.rows > 6:
        return None
    terms = []
    for j, a in enumerate(weights[i]):
        if a == 0:
            continue
        v = grid(1, values.cols, lambda _, c: tex(values[j, c]), max_shown=MAX_SHOWN)
        terms.append(f"{_tex_decimal(a, digits)}\\,{v}")
    return f"o_{{{i + 1}}} = \\sum_j A_{{{i + 1}j}}\\, v_j \\approx " + " + ".join(terms)
