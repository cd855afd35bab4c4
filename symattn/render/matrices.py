"""LaTeX matrices of a step: exact, in decimals (optionally shaded), and the lines worked beside them."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import sympy

from .escape import tex_token
from .grid import MAX_SHOWN, grid, grid_blocks, shown
from .numbers import (
    DPS,
    MAX_CELL_TERMS,
    MAX_TERMS,
    tex_decimal,
    exp_parts_tex,
    exp_sum_tex,
    factor_tex,
    tex,
    value_tex,
)
from ..exact.lazy import LazyRows
from ..stages.ids import A_T, O_T, TOKEN_AXES
from .entries import (
    EntryForm, Over, entry_forms, norm_names, normaliser_is_number, quotient, row_base, written_exactly,
)

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


_LAZY_LABELS = 4096  # labels from which only those shown are written (a column per word of the vocabulary)


def axis_labels(step: Step) -> tuple[list[str] | None, list[str] | None]:
    """Row and column labels for a matrix: tokens as written (``tex_token``), dimensions as math."""
    if not step.kind_of.labelled:  # weights
        return None, None
    tokens = lambda names: ([tex_token(n) for n in names] if len(names) < _LAZY_LABELS  # noqa: E731
                            else LazyRows(len(names), lambda i: tex_token(names[i])))  # a vocabulary: those shown
    dims = lambda names: [re.sub(r"([a-z])([0-9]+)", r"\1_{\2}", n) for n in names]  # noqa: E731
    rows, cols = ((tokens if axis in TOKEN_AXES else dims)(names) for axis, names in zip(step.axes, (step.rows, step.cols)))
    return rows, cols


def exact_tex_matrix(d: Derivation, step: Step, max_shown: int = MAX_SHOWN) -> str:
    return exact_tex_blocks(d, step, max_shown)[0][1]


def exact_tex_blocks(d: Derivation, step: Step, max_shown: int = MAX_SHOWN, budget: float | None = None):
    """The exact matrix in column blocks of estimated width at most ``budget`` (see ``grid_blocks``)."""
    rows, cols = step.shape
    form = entry_forms(d, step)
    row_labels, col_labels = axis_labels(step)
    return grid_blocks(rows, cols, lambda i, j: form_tex(form(i, j)), max_shown=max_shown,
                       row_labels=row_labels, col_labels=col_labels, budget=budget)


def form_tex(form: EntryForm) -> str:
    """LaTeX of an entry written as ``form``: fractions over Z_i (Z_i², a head's Z^{(h)}_i)."""
    if form.heads:  # a head's numerator keeps all its MAX_TERMS, however wide the matrix
        terms = [("-" if over.negative else "") + _over_tex(over, MAX_TERMS) for over in form.over]
        if form.value is not None:
            terms.insert(0, value_tex(form.value))
        return " + ".join(terms).replace("+ -", "- ")
    if form.sums:
        return sums_tex(form.value)
    if not form.over:
        return value_tex(form.value)
    # Inside a wide matrix a numerator keeps fewer terms (MAX_CELL_TERMS).
    return _over_tex(form.over[0], MAX_CELL_TERMS if form.wide else MAX_TERMS)


def sums_tex(x) -> str:
    """A sum of c·e^x terms (the largest exponent first), or a quotient of two such sums."""
    split = quotient(x)
    if split is not None:
        return f"\\dfrac{{{_sum_tex(split[0])}}}{{{_sum_tex(split[1])}}}"
    return _sum_tex(x)


def _sum_tex(x) -> str:
    return exp_sum_tex(x) if x.has(sympy.exp) else value_tex(x)


def _over_tex(over: Over, max_terms: int) -> str:
    if over.parts:
        top = exp_parts_tex(list(over.numerator), max_terms)
    else:
        top = exp_sum_tex(over.numerator, max_terms)
    if over.head is not None:
        z = f"Z^{{({over.head})}}_{{{over.row + 1}}}"
        z = f"\\bigl({z}\\bigr)^{{2}}" if over.squared else z
    else:
        z = f"Z_{{{over.row + 1}}}" + ("^{2}" if over.squared else "")
    return f"\\dfrac{{{top}}}{{{z}}}"


def exact_tex_matrix_of_step(step: Step, max_shown: int = MAX_SHOWN) -> str:
    """A step's exact matrix on its own, every entry written out in full (no Z_i to refer to)."""
    rows, cols = step.shape
    row_labels, col_labels = axis_labels(step)
    return grid(rows, cols, lambda i, j: tex(step.lazy[i, j]), max_shown=max_shown,
                row_labels=row_labels, col_labels=col_labels)


def approx_tex_matrix(d: Derivation, step: Step, digits: int, max_shown: int = MAX_SHOWN, shade: bool = False) -> str:
    """Decimals of a step; with ``shade``, the weights' cells are shaded by size (LaTeX's colortbl)."""
    return approx_tex_blocks(d, step, digits, max_shown, shade)[0][1]


def approx_tex_blocks(d: Derivation, step: Step, digits: int, max_shown: int = MAX_SHOWN, shade: bool = False,
                      budget: float | None = None):
    """The same in column blocks of estimated width at most ``budget`` (see ``grid_blocks``)."""
    value = d.entry_values(step.id, max(digits + 5, DPS))
    rows, cols = step.shape
    row_labels, col_labels = axis_labels(step)
    shading = None
    if shade and step.is_softmax:
        shading = lambda i, j: _shade(step.softmax[i].is_masked(j), value(i, j))  # noqa: E731
    return grid_blocks(
        rows, cols, lambda i, j: tex_decimal(value(i, j), digits), max_shown=max_shown,
        row_labels=row_labels, col_labels=col_labels, shade=shading, budget=budget,
    )


def _shade(masked: bool, weight) -> str:
    """A grey proportional to the weight (see :mod:`.shades`: black digits keep 4.5:1 contrast on the
    darkest, and a photocopy stays readable); masked cells unshaded, their digits grey."""
    from .shades import MASKED_TEXT, grey

    if masked:
        return f"\\color[gray]{{{MASKED_TEXT:.2f}}}"
    return f"\\cellcolor[gray]{{{grey(weight):.2f}}}"


def normaliser_lines(d: Derivation, step: Step, digits: int, max_shown: int = MAX_SHOWN) -> list[str]:
    """``m_i`` and ``Z_i`` of every drawn row whose normaliser is not a plain number, as one
    ``aligned`` block (its ``=`` signs in line); no block when every normaliser is a number."""
    lines = []
    for i in shown(len(step.softmax), max_shown):
        if i is None:
            lines.append("\\vdots & & \\vdots &")
            continue
        if normaliser_is_number(step.softmax[i]):
            continue
        m, z = normaliser_tex(d, step, i, digits)
        m = m.replace(' = ', ' &= ', 1) if ' = ' in m else m.replace(' \\approx ', ' &\\approx ', 1)
        lines.append(f"{m}, & {z.replace(' = ', ' &= ', 1)}")
    if not any("&=" in line for line in lines):
        return []
    return ["\\begin{aligned} " + " \\\\ ".join(lines) + " \\end{aligned}"]


def normaliser_tex(d: Derivation, step: Step, i: int, digits: int) -> tuple[str, str]:
    """Row ``i``'s ``m_i = …`` and ``Z_i = … ≈ …`` (the decimal when the problem can be evaluated)."""
    row = step.softmax[i]
    r = i + row_base(d, step)  # the full computation's row: the decoded token's t in a decoding step
    m_r, z_r = norm_names(step, r)
    h = f"^{{({step.head})}}" if step.head is not None else ""
    score = f"s{h}_{{{r},k}}" if step.key == A_T else f"\\hat{{S}}{h}_{{{r}k}}"
    # with a learned sink, Z_i has the sink's term too
    total = f"\\sum_k e^{{{score} - {m_r}}}" + (f" + e^{{s - {m_r}}}" if row.sink is not None else "")
    if not written_exactly(step):  # too long to write: the decimals alone (RoPE at size)
        dps = max(digits + 5, DPS)
        return (f"{m_r} \\approx {tex_decimal(row.maximum_value(dps), digits)}",
                f"{z_r} = {total} \\approx "
                f"{tex_decimal(row.evaluate_normaliser(dps), digits)}")
    m = f"{m_r} = {tex(row.maximum)}"
    z = (
        f"{z_r} = {total} = "
        f"{exp_parts_tex(row.numerator_parts()) if row.rational else exp_sum_tex(row.normaliser)}"
    )
    subs = d.problem.substitutions
    if subs is not None:
        z += f" \\approx {tex_decimal(row.evaluate_normaliser(max(digits + 5, DPS), subs), digits)}"
    return m, z


WORKED_EXACT_CHARS = 24  # with decimals=True, a longer factor (a norm's row over its root) is a decimal


WORKED_ROOT_CHARS = 16  # a factor over a row's root longer than this is written as its decimal


def worked_dot_tex(dot, decimals: bool = False, digits: int = 4) -> str:
    """One entry worked as a dot product; with ``decimals``, each factor too long to read exactly
    (a real float over its row's root) as a decimal, and the value then ≈ its decimal."""
    terms, n = dot.terms, len(dot.terms)
    kept = [terms[k] for k in (range(n) if n <= MAX_TERMS else (0, 1, 2, n - 1))]  # only these are read
    rounded = []

    def factor(x) -> str:
        if decimals and (len(str(x)) > WORKED_EXACT_CHARS or not x.is_Rational and len(str(x)) > WORKED_ROOT_CHARS):
            rounded.append(x)
            return tex_decimal(_mp(x), digits)
        return factor_tex(x)

    products = [f"{factor(a)} \\cdot {factor(b)}" for a, b in kept]
    if n > MAX_TERMS:
        products = products[:3] + ["\\cdots"] + products[-1:]
    products = " + ".join(products)
    left = _vec_name(dot.left)
    right = _vec_name(dot.right)
    if getattr(dot, "bias", None) is not None:  # Q = X W_Q + b_Q: the bias entry is added
        right += f" + b_{{{dot.target},{dot.j + 1}}}"
        products += f" + {factor(dot.bias)}"
    value = f"\\approx {tex_decimal(_mp(dot.value), digits)}" if rounded or (
        decimals and len(str(dot.value)) > WORKED_EXACT_CHARS) else f"= {tex(dot.value)}"
    equals = "\\approx" if rounded else "="
    return f"{_sub(dot.target, dot.i, dot.j)} = {left} \\cdot {right} {equals} {products} {value}"


def _mp(x):
    from ..exact.evaluation import to_mpf

    return to_mpf(x, 30)


def _vec_name(name: str) -> str:
    # "q_1" -> "q_{1}", "W_Q[:,1]" -> "W_{Q}[:,1]"
    m = re.fullmatch(r"([A-Za-z])_([A-Za-z0-9]+)(.*)", name)
    if not m:
        return name
    return f"{m.group(1)}_{{{m.group(2)}}}{m.group(3)}"


def _sub(name: str, i: int, j: int) -> str:
    return f"{name}_{{{i + 1}{j + 1}}}" if max(i, j) < 9 else f"{name}_{{{i + 1},{j + 1}}}"


def weighted_sum_tex(d: Derivation, step: Step, digits: int) -> str | None:
    """The last output row worked as a weighted average of value rows, in decimals."""
    values = step.values
    if values is None or values.rows > 6:
        return None
    i = len(step.softmax) - 1  # only this row is shown: only this row is evaluated
    terms = []
    for j, a in enumerate(step.softmax[i].evaluate(max(digits + 5, DPS), d.problem.substitutions)):
        if a == 0:
            continue
        v = grid(1, values.cols, lambda _, c: tex(values[j, c]), max_shown=MAX_SHOWN)
        terms.append(f"{tex_decimal(a, digits)}\\,{v}")
    if step.key == O_T:  # the decoded row: its weights a_t over the cached values
        return "o_t = \\sum_j a_{t,j}\\, v_j \\approx " + " + ".join(terms)
    return f"o_{{{i + 1}}} = \\sum_j A_{{{i + 1}j}}\\, v_j \\approx " + " + ".join(terms)
