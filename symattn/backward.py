"""The backward pass: the exact gradient of the loss with respect to every stage.

:func:`add_backward` continues a derivation's builder after the forward pass,
in the order backpropagation visits the stages::

    dO                                  the upstream gradient dL/dO
    dW_O = concatᵀ dO,  dconcat = dO W_Oᵀ   (several heads; each head's dO is its block)
    dV = Aᵀ dO,  dA = dO Vᵀ             back through the weighted sum
    dŜ_i = A_i ∘ (dA_i − dA_i·A_i)      back through the softmax, row by row
    dS = scale · dŜ                     back through the scaling
    dQ = dS K,  dK = dSᵀ Q              back through the scores
    dW_Q = Xᵀ dQ,  dW_K = Cᵀ dK,  dW_V = Cᵀ dV,  dX (and dC)

Entries are exact and built only when read, from the softmax structure: with
``a_ij = e^{z_ij − m_i} / Z_i`` and ``D_i = Σ_k e^{z_ik − m_i} dA_ik``, the softmax
step is ``dŜ_ij = e^{z_ij − m_i} (dA_ij Z_i − D_i) / Z_i²``, so masked positions
are exactly 0 and each row sums to exactly 0. Values at high precision are
computed from the same relations (never by evaluating large expressions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import mpmath
import sympy
from sympy import QQ

from . import _exact
from ._exact import LazyMatrix, Matrix, SoftmaxRow
from .derivation import Step

Values = list[list[mpmath.mpf]]
# Gradient entries are sums of fractions over the rows' normalisers, and their size grows
# quickly with n: above this many scores (n_q·n_k) a worked solution shows them in decimals.
EXACT_LIMIT = 64
# Up to this many entries, a written-out gradient's exact entries are read to show its exact zeros
# as 0 in decimals (they are built for the worked solution anyway).
ZERO_CHECK_LIMIT = 4096


@dataclass(frozen=True)
class _GradStep(Step):
    """A gradient: its values at high precision come from ``values_of`` (the stage's relation,
    evaluated on earlier stages' values)."""

    values_of: Callable | None = field(default=None, repr=False, compare=False)
    # Entries written over Z_i² (the softmax's normaliser, squared): ``over_z_squared(i, j)`` is the
    # numerator; ``jacobian`` holds the softmax rows, shown as diag(a) − a aᵀ for one row.
    over_z_squared: Callable | None = field(default=None, repr=False, compare=False)
    jacobian: tuple[SoftmaxRow, ...] = field(default=(), repr=False, compare=False)
    # False when the exact entries are too long to write out (see EXACT_LIMIT): renderers then
    # show the values in decimals only; ``exact`` still builds them on request.
    written_exactly: bool = True

    def evaluate(self, derivation, dps, subs) -> Values:
        exact = self.lazy
        if _exact.qq_entries(exact) is not None:
            return _exact.evaluate(exact, dps)  # rationals: their values, not a rounded product's
        values = self.values_of(derivation, dps)
        if self.written_exactly and exact.rows * exact.cols <= ZERO_CHECK_LIMIT:
            # A sum that cancels exactly (its exact entry is 0) is 0 in decimals too, not the
            # rounding noise of its terms (such as 1e-45).
            values = [[mpmath.mpf(0) if exact[i, j] == 0 else v for j, v in enumerate(row)]
                      for i, row in enumerate(values)]
        return values


@dataclass(frozen=True)
class HeadInfo:
    """What the backward pass needs of one head's forward pass."""

    prefix: str
    softmax: tuple[SoftmaxRow, ...]
    Q: object
    K: object
    V: object
    factor: sympy.Expr
    W_Q: object = None
    W_K: object = None
    W_V: object = None


_WHY = {
    "dO": "Backpropagation starts from the loss: dL/dO says how the loss changes with each output entry.",
    "dW_O": "The output projection is a product, so its weights' gradient is the concatenation (transposed) times dO.",
    "dconcat": "The gradient flows back through W_O to every head's output columns.",
    "dO_head": "This head's share of the upstream gradient: its block of columns of d(concat).",
    "dV": "Each value row was handed on with weight a_ij to every query i, so its gradient collects those weights times dO: Aᵀ dO.",
    "dA": "Each weight a_ij scaled value row j in output row i, so its gradient is the dot product of dO_i with v_j: dO Vᵀ.",
    "dS_masked": (
        "The softmax couples a whole row: raising one score raises its weight and lowers every other, "
        "so the gradient goes through the Jacobian diag(a) − a aᵀ of each row, which gives "
        "dŜ_ij = a_ij (dA_ij − Σ_k a_ik dA_ik). Masked positions have weight 0, so their gradient is exactly 0, "
        "and each row of dŜ sums to exactly 0 (adding a constant to a row of scores changes nothing)."
    ),
    "dS": "The scores were scaled before the mask, so the gradient of the unscaled scores is the scale times dŜ.",
    "dQ": "Score (i, j) is q_i · k_j, so query i's gradient sums the keys weighted by row i of dS: dS K.",
    "dK": "Key j met every query in column j of S, so its gradient sums the queries weighted by column j of dS: dSᵀ Q.",
    "dW_Q": "Q = X W_Q, so the query weights' gradient is Xᵀ dQ.",
    "dW_K": "K = {C} W_K, so the key weights' gradient is {C}ᵀ dK.",
    "dW_V": "V = {C} W_V, so the value weights' gradient is {C}ᵀ dV.",
    "dX": "X reached the loss along three paths (queries, keys and values), so its gradient is their sum.",
    "dX_cross": "X only made the queries here (cross-attention), so its gradient comes through dQ alone.",
    "dX_heads": " With several heads, every head's paths add up.",
    "dcontext": "The context made the keys and the values, so its gradient is the sum of those two paths.",
}


def _t(rows: Values) -> Values:
    return [list(col) for col in zip(*rows)]


def _ones(rows: int, cols: int) -> Matrix:
    return _exact.rational_matrix(rows, cols, [QQ(1)] * (rows * cols))


def product(a, b):
    """``a·b`` exactly: a rational product, or a lazy matrix of unexpanded sums."""
    if _exact.is_rational(a) and _exact.is_rational(b):
        return _exact.matmul(a, b)

    def entry(i: int, j: int) -> sympy.Expr:
        return sympy.Add(*[x * y for x, y in ((a[i, k], b[k, j]) for k in range(a.cols)) if x != 0 and y != 0])

    return LazyMatrix(a.rows, b.cols, entry)


def add_backward(b, infos: list[HeadInfo], X, C, O_id: str) -> None:
    """Add the gradient steps to builder ``b`` (a :class:`symattn.derivation._Builder`)."""
    p = b.p
    n_q = p.n_q
    q_labels, k_labels = b.q_labels, b.k_labels
    ev = lambda d, id, dps: d.evaluate(id, dps)  # noqa: E731
    b.prefix = ""

    written = p.n_q * p.n_k <= EXACT_LIMIT

    def step(id: str, title: str, why: str, formula: str, text: str, shape: str, rows, cols, matrix, values_of,
             **kw) -> Step:
        always = kw.pop("always", False)  # entries short at any size (ones, rationals)
        return b.step(_GradStep, id, title, why, formula, text, shape, rows, cols, matrix=matrix,
                      values_of=values_of, written_exactly=written or always, **kw)

    # -- the upstream gradient ---------------------------------------------------------
    loss = p.backward
    d_out = p.d_out
    O_lazy = b.by_id(O_id).lazy
    if loss.kind == "sum":
        dO = _ones(n_q, d_out)
        formula, text = "dO = \\frac{\\partial L}{\\partial O} = \\mathbf{1}", "dO = ∂L/∂O = 1 (every entry)"
    elif loss.kind in ("weights", "dO"):
        dO = loss.matrix
        formula = "dO = \\frac{\\partial L}{\\partial O} = W" if loss.kind == "weights" else "dO = \\frac{\\partial L}{\\partial O}"
        text = "dO = ∂L/∂O = W" if loss.kind == "weights" else "dO = ∂L/∂O (given)"
    else:  # target
        T = loss.matrix
        dO = LazyMatrix(n_q, d_out, lambda i, j: _exact.tidy(O_lazy[i, j] - T[i, j]))
        formula, text = "dO = \\frac{\\partial L}{\\partial O} = O - T", "dO = ∂L/∂O = O − T"

    def dO_values(d, dps):
        if loss.kind != "target":
            return _exact.evaluate(dO, dps, p.substitutions)
        target = _exact.evaluate(loss.matrix, dps, p.substitutions)
        with mpmath.workdps(dps + 10):
            return [[o - t for o, t in zip(ro, rt)] for ro, rt in zip(ev(d, O_id, dps), target)]

    out_cols = b.by_id(O_id).cols
    step("dO", "The upstream gradient", _WHY["dO"] + " Here " + loss.describe() + ".", formula, text,
         f"{n_q}×{d_out} (like O)", q_labels, out_cols, dO, dO_values, always=loss.kind != "target")

    # -- several heads: back through the output projection ------------------------------
    if p.multi_head:
        concat = b.by_id("concat").lazy
        W_O = p.W_O
        step("dW_O", "Gradient of the output weights", _WHY["dW_O"],
             "dW_O = \\operatorname{concat}^{\\top} dO", "dW_O = concatᵀ·dO",
             f"({concat.cols}×{n_q})·({n_q}×{d_out}) → {W_O.rows}×{W_O.cols} (like W_O)",
             _dims("c", W_O.rows), _dims("o", W_O.cols), product(concat.T, dO),
             lambda d, dps: _exact.mp_matmul(_t(ev(d, "concat", dps)), ev(d, "dO", dps), dps))
        dconcat = product(dO, W_O.T)
        step("dconcat", "Gradient of the concatenation", _WHY["dconcat"],
             "d\\operatorname{concat} = dO\\,W_O^{\\top}", "dconcat = dO·W_Oᵀ",
             f"({n_q}×{d_out})·({W_O.cols}×{W_O.rows}) → {n_q}×{W_O.rows} (like concat)",
             q_labels, _dims("c", W_O.rows), dconcat,
             lambda d, dps: _exact.mp_matmul(ev(d, "dO", dps), _exact.operand(W_O.T, dps, p.substitutions), dps))
        start = 0
        for info in infos:
            width = info.V.cols
            lo = start
            block = LazyMatrix(n_q, width, lambda i, j, lo=lo: dconcat[i, lo + j])
            b.prefix = info.prefix
            step("dO", "This head's upstream gradient", _WHY["dO_head"],
                 f"dO^{{({info.prefix[4:-1]})}} = d\\operatorname{{concat}}_{{[:,\\,{lo + 1}..{lo + width}]}}",
                 f"dO = dconcat[:, {lo + 1}..{lo + width}]", f"{n_q}×{width} (like this head's O)",
                 q_labels, _dims("v", width), block,
                 lambda d, dps, lo=lo, width=width: [row[lo:lo + width] for row in ev(d, "dconcat", dps)])
            start += width
        b.prefix = ""

    # -- each head ------------------------------------------------------------------------
    grads = {}
    for info in infos:
        b.prefix = pre = info.prefix
        dO_h = b.by_id(pre + "dO").lazy
        grads[pre] = _head(b, step, info, dO_h, X, C, q_labels, k_labels)

    # -- the input ------------------------------------------------------------------------
    b.prefix = ""
    if X is None:
        return
    cross = p.context is not None
    several = len(infos) > 1
    paths_X = [(info.prefix + "dQ", info.W_Q) for info in infos]
    paths_C = [(info.prefix + g, w) for info in infos for g, w in (("dK", info.W_K), ("dV", info.W_V))]
    if not cross:
        paths_X += paths_C
    dX = _sum_of_products(b, paths_X)
    why = _WHY["dX_cross"] if cross else _WHY["dX"]
    if several:
        why += _WHY["dX_heads"]
    sum_h = "\\sum_h " if several else ""
    if cross:
        formula, text = f"dX = {sum_h}dQ\\,W_Q^{{\\top}}", f"dX = {'Σ_h ' if several else ''}dQ·W_Qᵀ"
    else:
        formula = f"dX = {sum_h}\\left(dQ\\,W_Q^{{\\top}} + dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)"
        text = f"dX = {'Σ_h ' if several else ''}(dQ·W_Qᵀ + dK·W_Kᵀ + dV·W_Vᵀ)"
    step("dX", "Gradient of the input", why, formula, text, f"{X.rows}×{X.cols} (like X)",
         q_labels, _dims("d", X.cols), dX, _sum_values(paths_X, p))
    if cross:
        several_txt = "Σ_h " if several else ""
        step("dcontext", "Gradient of the context", _WHY["dcontext"] + (_WHY["dX_heads"] if several else ""),
             f"dC = {sum_h}\\left(dK\\,W_K^{{\\top}} + dV\\,W_V^{{\\top}}\\right)",
             f"dC = {several_txt}(dK·W_Kᵀ + dV·W_Vᵀ)", f"{C.rows}×{C.cols} (like the context)",
             k_labels, _dims("d", C.cols), _sum_of_products(b, paths_C), _sum_values(paths_C, p))


def _head(b, step, info: HeadInfo, dO, X, C, q_labels, k_labels) -> None:
    p = b.p
    pre = info.prefix
    rows, V, K, Q, factor = info.softmax, info.V, info.K, info.Q, info.factor
    n_q, n_k = len(rows), V.rows
    ev = lambda d, id, dps: d.evaluate(pre + id, dps)  # noqa: E731
    subs = p.substitutions

    # dV = Aᵀ dO: entry (k, c) = Σ_i a_ik dO_ic
    def dV_entry(k: int, c: int) -> sympy.Expr:
        return sympy.Add(*[rows[i].weight(k) * dO[i, c] for i in range(n_q) if rows[i].raw[k] is not None and dO[i, c] != 0])

    step("dV", "Gradient of the values", _WHY["dV"], "dV = A^{\\top} dO", "dV = Aᵀ·dO",
         f"({n_k}×{n_q})·({n_q}×{V.cols}) → {n_k}×{V.cols} (like V)", k_labels, _dims("v", V.cols),
         LazyMatrix(n_k, V.cols, dV_entry),
         lambda d, dps: _exact.mp_matmul(_t(ev(d, "A", dps)), ev(d, "dO", dps), dps))

    dA = product(dO, V.T)
    step("dA", "Gradient of the weights", _WHY["dA"], "dA = dO\\,V^{\\top}", "dA = dO·Vᵀ",
         f"({n_q}×{V.cols})·({V.cols}×{n_k}) → {n_q}×{n_k} (like A)", q_labels, k_labels, dA,
         lambda d, dps: _exact.mp_matmul(ev(d, "dO", dps), _exact.operand(V.T, dps, subs), dps),
         always=_exact.is_rational(dA))

    # dŜ_ij = e_ij (dA_ij Z_i − D_i) / Z_i², numerators kept for dQ.
    numerators: dict[tuple[int, int], sympy.Expr] = {}
    D: dict[int, sympy.Expr] = {}

    def numerator(i: int, j: int) -> sympy.Expr:
        if (i, j) not in numerators:
            row = rows[i]
            if row.raw[j] is None:
                numerators[(i, j)] = sympy.Integer(0)
            else:
                if i not in D:
                    D[i] = sympy.expand(sympy.Add(*[t * dA[i, k] for k, t in enumerate(row.terms) if t != 0]))
                numerators[(i, j)] = sympy.expand(row.terms[j] * (dA[i, j] * row.normaliser - D[i]))
        return numerators[(i, j)]

    def dS_masked_entry(i: int, j: int) -> sympy.Expr:
        top = numerator(i, j)
        return top if top == 0 else top / rows[i].normaliser ** 2

    step("dS_masked", "Back through the softmax", _WHY["dS_masked"],
         "d\\hat{S}_{ij} = a_{ij}\\Big(dA_{ij} - \\sum_k a_{ik}\\,dA_{ik}\\Big)",
         "dŜ[i,j] = a_ij·(dA[i,j] − Σ_k a_ik·dA[i,k])",
         f"{n_q}×{n_k} (like Ŝ); each row sums to 0", q_labels, k_labels,
         LazyMatrix(n_q, n_k, dS_masked_entry),
         lambda d, dps: _exact.softmax_backward(ev(d, "A", dps), ev(d, "dA", dps), dps),
         over_z_squared=numerator, jacobian=rows)

    dS_masked = b.by_id(pre + "dS_masked").lazy
    scale_tex = _scale_tex(p, factor)
    step("dS", "Back through the scaling", _WHY["dS"],
         f"dS = {scale_tex}\\, d\\hat{{S}}", f"dS = {factor}·dŜ", f"{n_q}×{n_k} (like S)", q_labels, k_labels,
         LazyMatrix(n_q, n_k, lambda i, j: factor * dS_masked[i, j]),
         lambda d, dps: _scaled(ev(d, "dS_masked", dps), factor, dps, subs),
         over_z_squared=lambda i, j: _exact.tidy(factor * numerator(i, j)), jacobian=rows)

    # dQ = dS K: row i shares the denominator Z_i², so each entry is one fraction.
    def dQ_numerator(i: int, c: int) -> sympy.Expr:
        top = sympy.expand(sympy.Add(*[numerator(i, j) * K[j, c] for j in range(n_k) if rows[i].raw[j] is not None]))
        return _exact.tidy(factor * top)

    def dQ_entry(i: int, c: int) -> sympy.Expr:
        top = dQ_numerator(i, c)
        return top if top == 0 else top / rows[i].normaliser ** 2

    step("dQ", "Gradient of the queries", _WHY["dQ"], "dQ = dS\\,K", "dQ = dS·K",
         f"({n_q}×{n_k})·({n_k}×{K.cols}) → {n_q}×{K.cols} (like Q)", q_labels, _dims("q", K.cols),
         LazyMatrix(n_q, K.cols, dQ_entry),
         lambda d, dps: _exact.mp_matmul(ev(d, "dS", dps), _exact.operand(K, dps, subs), dps),
         over_z_squared=dQ_numerator, jacobian=rows)

    dS = b.by_id(pre + "dS").lazy
    step("dK", "Gradient of the keys", _WHY["dK"], "dK = dS^{\\top} Q", "dK = dSᵀ·Q",
         f"({n_k}×{n_q})·({n_q}×{Q.cols}) → {n_k}×{Q.cols} (like K)", k_labels, _dims("k", Q.cols),
         product(dS.T, Q),
         lambda d, dps: _exact.mp_matmul(_t(ev(d, "dS", dps)), _exact.operand(Q, dps, subs), dps))

    if X is None:
        return
    c_name = "C" if p.context is not None else "X"
    for g, inp, name, w in (("Q", X, "X", info.W_Q), ("K", C, c_name, info.W_K), ("V", C, c_name, info.W_V)):
        grad = b.by_id(pre + "d" + g).lazy
        step(f"dW_{g}", f"Gradient of the {_NOUN[g]} weights", _WHY[f"dW_{g}"].format(C=c_name),
             f"dW_{{{g}}} = {name}^{{\\top}} d{g}", f"dW_{g} = {name}ᵀ·d{g}",
             f"({inp.cols}×{inp.rows})·({grad.rows}×{grad.cols}) → {w.rows}×{w.cols} (like W_{g})",
             _dims("d", w.rows), _dims(g.lower(), w.cols), product(inp.T, grad),
             lambda d, dps, g=g, inp=inp: _exact.mp_matmul(_exact.operand(inp.T, dps, subs), ev(d, "d" + g, dps), dps))


_NOUN = {"Q": "query", "K": "key", "V": "value"}


def _sum_of_products(b, paths) -> LazyMatrix:
    """``Σ grad·Wᵀ`` over ``paths`` (gradient step id, weights), exactly."""
    parts = [product(b.by_id(g).lazy, w.T) for g, w in paths]
    rows, cols = parts[0].rows, parts[0].cols
    return LazyMatrix(rows, cols, lambda i, j: sympy.Add(*[m[i, j] for m in parts]))


def _sum_values(paths, p):
    def values(d, dps):
        total = None
        for g, w in paths:
            part = _exact.mp_matmul(d.evaluate(g, dps), _exact.operand(w.T, dps, p.substitutions), dps)
            with mpmath.workdps(dps + 10):
                total = part if total is None else [[x + y for x, y in zip(r, s)] for r, s in zip(total, part)]
        return total

    return values


def _scaled(values: Values, factor: sympy.Expr, dps: int, subs) -> Values:
    with mpmath.workdps(dps + 10):
        f = _exact.to_mpf(factor, dps, subs)
        return [[f * x for x in row] for row in values]


def _scale_tex(p, factor) -> str:
    if p.scale == "auto":
        return "\\frac{1}{\\sqrt{d_k}}"
    return sympy.latex(factor)


def _dims(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i + 1}" for i in range(n))
