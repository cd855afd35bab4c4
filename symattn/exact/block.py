"""The rest of the block and the model's head, exactly and at high precision: the MLP's activations,
the softmax over the vocabulary and the cross-entropy of each row.

Exactly, each entry is a SymPy expression built when read (:class:`LazyMatrix`): GELU is
``x/2·(1 + erf(x/√2))``, GPT-2's tanh form ``x/2·(1 + tanh(√(2/π)(x + 0.044715x³)))`` with
0.044715 = 44715/10⁶, SiLU ``x/(1 + e^{−x})``; ReLU takes the sign of its argument, decided
exactly for a rational and by a certified evaluation otherwise. ``P_ij = 1/Σ_k e^{z_ik − z_ij}``
(e^{z_ij}/Σ_k e^{z_ik}, each exponent a difference of two logits), and ``−log P[i, t] =
log Σ_k e^{z_ik − z_it}``.

At high precision (for the decimals shown and for ``symattn check``) the same formulas on each
entry's value: in flint's ball arithmetic for the activations, the softmax over the vocabulary and
the cross-entropy (each number read into arb exactly, the midpoints returned as mpmath numbers),
in mpmath for ReLU.
"""

from __future__ import annotations

import flint
import mpmath
import sympy

from ..errors import SymattnError
from sympy import QQ

from ..numbers.matrices import is_rational, rational_matrix
from .arb import arb_precision, arb_to_mpf
from .evaluation import to_mpf
from .lazy import LazyMatrix, rational_rows

GELU_TANH_C = sympy.Rational(44715, 10**6)  # GPT-2's cubic term, exactly as its code writes 0.044715
SIGN_DPS = 60  # the digits a sign is decided at; below 10^-50 the entry is tested for an exact 0
LN2 = "log2"


def _sign(x: sympy.Expr) -> int:
    """The sign of an exact number: exactly for a rational, else from its value when that is clear
    of 0, else an exact test for 0 (refused when neither decides)."""
    if x.is_Rational:
        return 1 if x > 0 else -1 if x < 0 else 0
    if x.is_positive:
        return 1
    if x.is_negative:
        return -1
    value = to_mpf(x, SIGN_DPS)
    if abs(value) > mpmath.mpf(10) ** -50:
        return 1 if value > 0 else -1
    if sympy.simplify(x) == 0:
        return 0
    raise SymattnError("ReLU cannot decide the sign of an entry within 10^-50 of 0: give other numbers")


def relu(x: sympy.Expr) -> sympy.Expr:
    return x if _sign(x) > 0 else sympy.Integer(0)


EXACT = {
    "relu": relu,
    "relu2": lambda x: relu(x) ** 2,
    "gelu": lambda x: x / 2 * (1 + sympy.erf(x / sympy.sqrt(2))),
    "gelu-tanh": lambda x: x / 2 * (1 + sympy.tanh(sympy.sqrt(2 / sympy.pi) * (x + GELU_TANH_C * x**3))),
    "silu": lambda x: x / (1 + sympy.exp(-x)),
    # linear attention's feature maps: elu(x) + 1 is e^x for x ≤ 0 (exact: e^{rational} stays a power of e)
    "elu1": lambda x: x + 1 if _sign(x) > 0 else sympy.exp(x),
    "identity": lambda x: x,
}


def _step(x: sympy.Expr) -> sympy.Expr:
    """ReLU's derivative: 1 where the entry is positive, else 0 (0 at 0, as PyTorch takes it)."""
    return sympy.Integer(1 if _sign(x) > 0 else 0)


def _gelu_tanh_slope(x: sympy.Expr) -> sympy.Expr:
    """GPT-2's GELU, differentiated: ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3c x²), t = tanh(√(2/π)(x + c x³))."""
    root = sympy.sqrt(2 / sympy.pi)
    t = sympy.tanh(root * (x + GELU_TANH_C * x**3))
    return (1 + t) / 2 + x * (1 - t**2) * root * (1 + 3 * GELU_TANH_C * x**2) / 2


def _silu_slope(x: sympy.Expr) -> sympy.Expr:
    """SiLU, differentiated: σ(x)(1 + x(1 − σ(x))), σ(x) = 1/(1 + e^{−x})."""
    s = 1 / (1 + sympy.exp(-x))
    return s * (1 + x * (1 - s))


DERIVATIVE = "d:"  # the prefix of an activation's derivative's name: "d:gelu" is GELU'
EXACT.update({
    DERIVATIVE + "relu": _step,
    DERIVATIVE + "relu2": lambda x: 2 * relu(x),
    DERIVATIVE + "gelu": lambda x: (1 + sympy.erf(x / sympy.sqrt(2))) / 2 + x * sympy.exp(-x**2 / 2) / sympy.sqrt(2 * sympy.pi),
    DERIVATIVE + "gelu-tanh": _gelu_tanh_slope,
    DERIVATIVE + "silu": _silu_slope,
})


def _mp_relu(x):
    return x if x > 0 else mpmath.mpf(0)


NUMERIC = {
    "relu": _mp_relu,
    "relu2": lambda x: _mp_relu(x) ** 2,
    "gelu": lambda x: x / 2 * (1 + mpmath.erf(x / mpmath.sqrt(2))),
    "gelu-tanh": lambda x: x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf(44715) / 10**6 * x**3))),
    "silu": lambda x: x / (1 + mpmath.exp(-x)),
    "elu1": lambda x: x + 1 if x > 0 else mpmath.exp(x),
    "identity": lambda x: x,
}


def _mp_gelu_tanh_slope(x):
    root = mpmath.sqrt(2 / mpmath.pi)
    c = mpmath.mpf(44715) / 10**6
    t = mpmath.tanh(root * (x + c * x**3))
    return (1 + t) / 2 + x * (1 - t**2) * root * (1 + 3 * c * x**2) / 2


def _mp_silu_slope(x):
    s = 1 / (1 + mpmath.exp(-x))
    return s * (1 + x * (1 - s))


NUMERIC.update({
    DERIVATIVE + "relu": lambda x: mpmath.mpf(1 if x > 0 else 0),
    DERIVATIVE + "relu2": lambda x: 2 * _mp_relu(x),
    DERIVATIVE + "gelu": lambda x: (1 + mpmath.erf(x / mpmath.sqrt(2))) / 2 + x * mpmath.exp(-x**2 / 2) / mpmath.sqrt(2 * mpmath.pi),
    DERIVATIVE + "gelu-tanh": _mp_gelu_tanh_slope,
    DERIVATIVE + "silu": _mp_silu_slope,
})
RATIONAL = {"identity": lambda x, zero: x, "relu": lambda x, zero: x if x > 0 else zero, "relu2": lambda x, zero: x * x if x > 0 else zero,
            DERIVATIVE + "relu": lambda x, zero: QQ(1) if x > 0 else zero,
            DERIVATIVE + "relu2": lambda x, zero: 2 * x if x > 0 else zero}  # a rational stays rational


def _arb_gelu_tanh(x):
    c = (2 / flint.arb.pi()).sqrt()  # at the working precision, as each call makes it
    return x / 2 * (1 + (c * (x + flint.fmpq(44715, 10**6) * x * x * x)).tanh())


ARB = {  # the same in ball arithmetic, for rows of many entries (an MLP's hidden layer)
    "gelu": lambda x: x / 2 * (1 + (x / flint.arb(2).sqrt()).erf()),
    "gelu-tanh": _arb_gelu_tanh,
    "silu": lambda x: x / (1 + (-x).exp()),
}


def arb_activated(rows, name: str, dps: int):
    """``act`` of each entry of rows of mpmath numbers at ``dps`` digits, in ball arithmetic (each
    number read into arb exactly), or None for an activation it leaves to mpmath (ReLU's)."""
    f = ARB.get(name)
    if f is None:
        return None
    with arb_precision(dps):
        return [[arb_to_mpf(f(flint.arb(x))) for x in row] for row in rows]


def activate(m, name: str):
    """``act(m)`` entry by entry, exactly (each entry built when read); ``name`` ``d:act`` is the
    activation's derivative."""
    f = EXACT[name]
    if is_rational(m) and name in RATIONAL:  # a rational stays rational, read without SymPy
        zero, g = QQ(0), RATIONAL[name]
        return rational_matrix(m.rows, m.cols, [g(x, zero) for row in rational_rows(m) for x in row])
    return LazyMatrix(m.rows, m.cols, lambda i, j: f(m[i, j]))


def _over_sum(z, i: int, j: int) -> sympy.Expr:
    """Σ_k e^{z_ik − z_ij}: row i's softmax denominator seen from column j (each exponent short)."""
    return sympy.Add(*[sympy.exp(z[i, k] - z[i, j]) for k in range(z.cols)])


def row_softmax(z):
    """The softmax of each row over every column (the vocabulary: nothing is masked), each entry
    written ``P_ij = 1/Σ_k e^{z_ik − z_ij}`` (the same number as e^{z_ij}/Σ_k e^{z_ik})."""
    return LazyMatrix(z.rows, z.cols, lambda i, j: 1 / _over_sum(z, i, j))


def nll(z, targets, rows, base: str | None = None):
    """``−log P[r, t] = log Σ_k e^{z_rk − z_rt}`` for each used row ``r`` of the logits and its
    target ``t`` (one column); ``base`` log2 divides by log 2 (a slip)."""

    def entry(i: int, j: int) -> sympy.Expr:
        value = sympy.log(_over_sum(z, rows[i], targets[i]))
        return value / sympy.log(2) if base == LN2 else value

    return LazyMatrix(len(rows), 1, entry)


def _exponentials(row):
    """``(m, [e^{x − m}])`` of a row of finite mpmath numbers in ball arithmetic (m its largest,
    found on the exact values), under :func:`arb_precision` (each number read into arb exactly)."""
    top = max(row)
    m = flint.arb(top)
    return top, [(flint.arb(x) - m).exp() for x in row]


def numeric_row_softmax(z, dps: int):
    """The softmax of each row of mpmath numbers at ``dps`` digits, in ball arithmetic: a row over
    the vocabulary is 50,257 exponentials (the midpoints, exactly as mpmath numbers)."""
    out = []
    with arb_precision(dps):
        for row in z:
            e = _exponentials(row)[1]
            total = sum(e, flint.arb(0))
            out.append([arb_to_mpf(x / total) for x in e])
    return out


def numeric_nll(z, targets, rows, dps: int, base: str | None = None):
    """:func:`nll` on mpmath rows at ``dps`` digits: ``m + log Σ_k e^{z_k − m} − z_t`` in ball arithmetic."""
    out = []
    with arb_precision(dps):
        for r, t in zip(rows, targets):
            row = z[r]
            top, e = _exponentials(row)
            value = flint.arb(top) + sum(e, flint.arb(0)).log() - flint.arb(row[t])
            out.append([arb_to_mpf(value / flint.arb(2).log() if base == LN2 else value)])
    return out
