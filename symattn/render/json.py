"""JSON output, exactly as the CLI/JSON contract gives it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import mpmath
import sympy

from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.printing.str import StrPrinter

from .. import stages as registry
from .._exact import LazyMatrix
from ._print import NEG_INF, qq_text
from .entries import written_exactly
from .rope import rope_json

if TYPE_CHECKING:
    from ..derivation import Derivation


def _approx(v) -> float | None:
    return None if v is None or mpmath.isinf(v) else float(v)


class _Printer(StrPrinter):
    """``sympy.sstr(x, order="none")``, remembering the sums it is told will come back: a row's
    normaliser Z_i is in every weight and output of the row, and is written once."""

    def __init__(self, recurring=()) -> None:
        super().__init__({"order": "none"})
        self._recurring = set(recurring)
        self._sums: dict = {}  # the texts of recurring sums, and of the powers e^x

    def _print_Add(self, expr, order=None):
        if expr not in self._recurring:
            return self._sum(expr, order)  # a numerator: written once, not kept
        text = self._sums.get(expr)
        if text is None:
            text = self._sums[expr] = self._sum(expr, order)
        return text

    def _sum(self, expr, order) -> str:
        # StrPrinter._print_Add, with the precedence test skipped for the terms of a softmax sum
        # (c·e^x, e^x, numbers), which never need brackets in a sum.
        out = []
        for term in self._as_ordered_terms(expr, order=order):
            t = self._print(term)
            if t.startswith("-") and not term.is_Add:
                sign, t = "-", t[1:]
            else:
                sign = "+"
            plain = term.is_Number or isinstance(term, sympy.exp) or _coefficient_power(term) is not None
            if term.is_Add or (not plain and precedence(term) < PRECEDENCE["Add"]):
                t = f"({t})"
            out.extend([sign, t])
        sign = out.pop(0)
        return ("" if sign == "+" else sign) + " ".join(out)

    def _print_exp(self, expr):
        text = self._sums.get(expr)  # each row's powers come back in every entry of the row
        if text is None:
            text = self._sums[expr] = self._print_Function(expr)
        return text

    def _print_Mul(self, expr):
        # c·e^x with rational c and x, written as StrPrinter writes it (3*exp(-1/2)/4) without
        # its sign and precedence tests.
        split = _coefficient_power(expr)
        if split is None:
            return super()._print_Mul(expr)
        c, power = split
        p, q = int(c.p), int(c.q)
        text = ("" if abs(p) == 1 else f"{abs(p)}*") + self._print(power) + ("" if q == 1 else f"/{q}")
        return "-" + text if p < 0 else text


def _coefficient_power(expr) -> "tuple[sympy.Rational, sympy.exp] | None":
    """``(c, e^x)`` when ``expr`` is the product of a rational c and e^x with x rational, else None."""
    if isinstance(expr, sympy.Mul) and len(expr.args) == 2:
        c, power = expr.args
        if isinstance(c, sympy.Rational) and isinstance(power, sympy.exp) and isinstance(power.args[0], sympy.Rational):
            return c, power
    return None


def _exact(x: sympy.Expr, printer: StrPrinter | None = None) -> str:
    """SymPy's str form (``sympify`` reads it back exactly), without the costly term sorting."""
    if x == NEG_INF:
        return "-oo"
    if isinstance(x, sympy.Rational):
        return qq_text(x)
    return (printer or _Printer()).doprint(x)


def _numbers_only(m: sympy.Matrix) -> list[list]:
    """Decimals where an entry holds no symbol (None where it does): symbols without values."""
    from .._exact import to_mpf

    return [[None if m[i, j].free_symbols else to_mpf(m[i, j], 30) for j in range(m.cols)] for i in range(m.rows)]


def as_dict(derivation: Derivation, *, check=None) -> dict:
    d = derivation
    stages = []
    printer = _Printer(row.normaliser for step in d.steps if step.softmax
                       for row in step.softmax if not row.normaliser_is_number)
    for step in d.steps:
        m = step.lazy
        values = d.evaluate(step.id, 30) if d.can_evaluate else _numbers_only(m)
        entry = m.peek if isinstance(m, LazyMatrix) else m.__getitem__  # each entry is read once
        stages.append(
            {
                "id": step.id,
                "title": step.title,
                "shape": list(step.shape),
                # null where a big gradient's entries are too long to write (see backward.EXACT_LIMIT)
                "exact": ([[_exact(entry((i, j)), printer) for j in range(m.cols)] for i in range(m.rows)]
                          if written_exactly(step) else None),
                "approx": [[_approx(v) for v in row] for row in values],
            }
        )
        if "tiles" in step.shows:  # the online softmax's recurrence, row by row (rows 0-based)
            from .._exact import to_mpf
            from . import tiles

            stages[-1]["recurrence"] = tiles.as_json(
                d, step, _exact, lambda x: _approx(to_mpf(x, 30)) if d.can_evaluate else None)
    out = {"title": d.problem.title, "dims": d.dims, "stages": stages}
    rope = rope_json(d)
    if rope is not None:  # only with RoPE: every other problem's JSON is as it was
        out["rope"] = rope
    out.update(_sharing_and_decoding(d))
    if check is not None:
        out["crosscheck"] = check.as_dict()
    return out


def _sharing_and_decoding(d: Derivation) -> dict:
    """With kv_heads, which query heads read which K/V group; with decode, the decoded token; with
    either, the KV cache's size per token (numbers per layer). Nothing for other problems."""
    p = d.problem
    out: dict = {}
    if p.kv_heads:
        out["kv_groups"] = [{"group": g, "heads": heads, "key_id": registry.stage_id(registry.K, heads[0]),
                             "value_id": registry.stage_id(registry.V, heads[0])} for g, heads in registry.kv_groups(p)]
    if p.kv_heads or p.decode:
        out["kv_cache"] = registry.kv_cache_size(p)
    if p.decode:
        diffs = [d.step(registry.stage_id(registry.O_T_DIFF, h)).exact for h in registry.Context(p).heads]
        out["decode"] = {"token": p.decode, "row": p.decode - 1, "label": p.tokens[p.decode - 1],
                         "equals_full_row": all(x == 0 for m in diffs for x in m)}
    return out


def render_json(derivation: Derivation, *, check=None, digits: int | None = None) -> str:
    """The derivation as one JSON object (``digits`` is accepted and unused: JSON keeps full floats)."""
    return json.dumps(as_dict(derivation, check=check), indent=2, ensure_ascii=False) + "\n"
