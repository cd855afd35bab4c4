"""What an exact entry is made of, whatever the format: over which normaliser it is written,
its numerator, the heads it sums; and whether a step's entries are written at all."""

from __future__ import annotations

import sympy

from .. import _exact
from ..derivation import Derivation, Step
from ._print import NEG_INF, is_plain_integer

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
