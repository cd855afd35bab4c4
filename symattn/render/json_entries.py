"""The entries of a JSON stage as text: exact entries as SymPy's ``sstr`` writes them, and decimals.

The exact entries of rational softmax rows (the weights ``A`` and the outputs ``O = A·V`` with
rational ``V``) are written straight from the rows' structure (exponents, ``Z_i`` written once
per row, ``V``'s entries) in the very text SymPy's ``sstr`` gives for the expression
(:class:`_RowText`); everything else is printed from its SymPy expression. Rational stages come
from their exact fractions (:class:`_Fractions`), once per distinct entry. :mod:`.json` writes
the document around them.
"""

from __future__ import annotations

import math
from functools import cached_property
from itertools import chain
from operator import add, itemgetter
from typing import TYPE_CHECKING, Callable

import mpmath
import sympy

from sympy import QQ
from sympy.printing.precedence import PRECEDENCE, precedence
from sympy.printing.str import StrPrinter

from ..exact.lazy import LazyMatrix, fmpq_matrix, qq_entries
from ..numbers.matrices import is_rational, scaled_integers
from ..numbers.sympy_internals import exp_term_order_key, rational_order_key
from .numbers import NEG_INF, qq_text
from .entries import written_exactly

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


def approx_float(v) -> float | None:
    return None if v is None or mpmath.isinf(v) else float(v)


class _Printer(StrPrinter):
    """``sympy.sstr(x, order="none")``, remembering the sums it is told will come back: a row's
    normaliser Z_i is in every weight and output of the row, and is written once."""

    def __init__(self, recurring=()) -> None:
        super().__init__({"order": "none"})
        self._recurring = set(recurring)
        self._sums: dict = {}  # the texts of recurring sums, of the powers e^x, and of cos and sin

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
            # (a product is never bracketed in a sum: its precedence is Mul's, or Add's when negative)
            plain = term.is_Number or term.is_Mul or isinstance(term, sympy.exp)
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

    # a rotary entry's cos(dθ_i) and sin(dθ_i) come back in every score at the distance d
    _print_cos = _print_sin = _print_exp

    def _print_Mul(self, expr):
        # c·e^x with rational c and x, written as StrPrinter writes it (3*exp(-1/2)/4) without
        # its sign and precedence tests.
        split = _coefficient_power(expr)
        if split is None:
            simple = _simple_product(expr)
            return super()._print_Mul(expr) if simple is None else simple(self)
        c, power = split
        p, q = int(c.p), int(c.q)
        text = ("" if abs(p) == 1 else f"{abs(p)}*") + self._print(power) + ("" if q == 1 else f"/{q}")
        return "-" + text if p < 0 else text


_FACTORS = (sympy.cos, sympy.sin, sympy.exp)


def _simple_product(expr):
    """For ``c·f_1·…·f_k`` (a rational c ≠ ±1 or 1, then cosines, sines, powers of e and positive
    rational powers of positive rationals, such as RoPE's scores give), a function of the printer
    that writes it as StrPrinter does (``-3*sqrt(2)*cos(1)/4``) without its sign and precedence
    tests; None for any other product."""
    args = expr.args
    c = args[0]
    if not isinstance(c, sympy.Rational):
        return None
    for f in args[1:]:
        if not (isinstance(f, _FACTORS) or (isinstance(f, sympy.Pow) and isinstance(f.base, sympy.Rational)
                                            and f.base > 0 and isinstance(f.exp, sympy.Rational) and f.exp > 0)):
            return None

    def write(printer) -> str:
        p, q = int(c.p), int(c.q)
        top = ([str(abs(p))] if abs(p) != 1 else []) + [printer._print(f) for f in args[1:]]
        return ("-" if p < 0 else "") + "*".join(top) + ("" if q == 1 else f"/{q}")

    return write


def _coefficient_power(expr) -> "tuple[sympy.Rational, sympy.exp] | None":
    """``(c, e^x)`` when ``expr`` is the product of a rational c and e^x with x rational, else None."""
    if isinstance(expr, sympy.Mul) and len(expr.args) == 2:
        c, power = expr.args
        if isinstance(c, sympy.Rational) and isinstance(power, sympy.exp) and isinstance(power.args[0], sympy.Rational):
            return c, power
    return None


def exact_text(x: sympy.Expr, printer: StrPrinter | None = None) -> str:
    """SymPy's str form (``sympify`` reads it back exactly), without the costly term sorting."""
    if x == NEG_INF:
        return "-oo"
    if isinstance(x, sympy.Rational):
        return qq_text(x)
    return (printer or _Printer()).doprint(x)


def _numbers_only(m: sympy.Matrix) -> list[list]:
    """Decimals where an entry holds no symbol (None where it does): symbols without values."""
    from ..exact.evaluation import to_mpf

    return [[None if m[i, j].free_symbols else to_mpf(m[i, j], 30) for j in range(m.cols)] for i in range(m.rows)]


# -- the weights and outputs of rational softmax rows, written from their structure --------------


def _pq(x) -> tuple[int, int]:
    return int(x.numerator), int(x.denominator)


def _over(sign: str, body: str, q: int, z: str) -> str:
    """``sign·body / (q·Z)`` as SymPy's str writes a single term over a sum: ``3*exp(-1)/(4*(Z))``."""
    return f"{sign}{body}/({z})" if q == 1 else f"{sign}{body}/({q}*({z}))"


class _RowText:
    """The exact text of a rational softmax row's weights and outputs, as ``sympy.sstr`` (order
    "none") writes ``row.weight(j)`` and ``row.weighted_sum(column)``.

    Z_i's text and each power ``exp(x)`` are made once. A numerator's terms are put in SymPy's
    canonical order (:func:`symattn.numbers.sympy_internals.exp_term_order_key`): the number first, then each
    ``c·e^x`` by c and x, then each ``e^x`` by x. Exponents are keyed by ``(p, q)`` (hashing
    flint's fmpq goes through a Fraction).
    """

    def __init__(self, row) -> None:
        self.row = row
        raw = row.raw
        self.allowed = [k for k, e in enumerate(raw) if e is not None]
        self.number = row.normaliser_is_number  # every allowed exponent is 0: Z_i is their count
        if self.number:
            return
        self.pq = pq = [None if e is None else _pq(e) for e in raw]
        self.power_at = ["" if x is None or x[0] == 0 else f"exp({x[0]}/{x[1]})" if x[1] != 1 else f"exp({x[0]})"
                         for x in pq]
        exponents = {pq[k] for k in self.allowed}
        # With every allowed exponent distinct, a numerator's terms are V's entries themselves.
        self.distinct = len(exponents) == len(self.allowed)
        if self.distinct:
            self.top = next(k for k in self.allowed if pq[k][0] == 0)  # the maximum's position
            self.others = [k for k in self.allowed if k != self.top]
            ordered = sorted((rational_order_key(*pq[k]), k) for k in self.others)
            n = len(raw)
            rank = [0] * n  # each exponent's place in SymPy's order
            for r, (_, k) in enumerate(ordered):
                rank[k] = r
            # A term's sort key is c's rank·n² (see _Column) + this: the exponent's rank·n + position.
            self.key = [r * n + k for k, r in enumerate(rank)]
            self.others_key = [self.key[k] for k in self.others]
            self.z_parts = None
            self.z = "1" + "".join([" + " + self.power_at[k] for _, k in ordered])
        else:
            self.power = {pq[k]: self.power_at[k] for k in self.allowed}
            self.z_parts = self._parts(row.numerator_parts())
            self.z = self.sum_text(self.z_parts)

    def weight(self, j: int) -> str:
        if self.row.raw[j] is None:
            return "0"
        if self.number:
            return "1" if len(self.allowed) == 1 else f"1/{len(self.allowed)}"
        power = self.power_at[j]
        return f"{power or 1}/({self.z})"

    def output(self, column: list) -> str:
        """``Σ_j a_ij v_j`` for rational values ``column`` (QQ)."""
        if self.number:
            return qq_text(sum((column[k] for k in self.allowed), QQ(0)) / len(self.allowed))
        if self.distinct:
            return self.fast_output(_Column(column))
        return self.over_z(self._parts(self.row.numerator_parts(column)))

    @staticmethod
    def _parts(parts: list) -> list:
        return [(_pq(c), _pq(e)) for c, e in parts]

    def over_z(self, parts: list) -> str:
        """``numerator / Z_i`` for the numerator's ``(c, x)`` parts as ``(p, q)`` pairs (none zero)."""
        if not parts:
            return "0"
        if parts == self.z_parts:
            return "1"  # Z_i / Z_i: SymPy's quotient of a sum by itself
        if len(parts) > 1:
            return f"({self.sum_text(parts)})/({self.z})"
        ((p, q), e), = parts
        sign = "-" if p < 0 else ""
        if e[0] == 0:
            return _over(sign, str(abs(p)), q, self.z)
        return _over(sign, ("" if abs(p) == 1 else f"{abs(p)}*") + self.power[e], q, self.z)

    def sum_text(self, parts: list) -> str:
        """The numerator ``Σ c·e^x`` (parts as in :meth:`over_z`) as SymPy's str writes the sum."""
        number = [c for c, e in parts if e[0] == 0]
        terms = sorted(((c, e) for c, e in parts if e[0] != 0), key=lambda t: exp_term_order_key(*t))
        out = [f"{number[0][0]}" if number[0][1] == 1 else f"{number[0][0]}/{number[0][1]}"] if number else []
        for (p, q), e in terms:
            body = ("" if abs(p) == 1 else f"{abs(p)}*") + self.power[e] + ("" if q == 1 else f"/{q}")
            out.append((("-" if p < 0 else "") if not out else (" - " if p < 0 else " + ")) + body)
        return "".join(out)

    def fast_output(self, column: "_Column") -> str:
        """:meth:`output` for one column of V, with the terms' texts and order read from
        ``column`` (the row's exponents distinct: each coefficient is one entry of V)."""
        if self.number or not self.distinct:
            return self.output(column.values)
        nonzero, n = column.nonzero, len(column.nonzero)
        if column.zeros:
            ks = [k for k in self.others if nonzero[k]]
            keys = list(map(add, map(column.key.__getitem__, ks), map(self.key.__getitem__, ks)))
        else:
            keys = list(map(add, map(column.key.__getitem__, self.others), self.others_key))
        keys.sort()
        return self._sorted_output(column, list(map(n.__rmod__, keys)))

    def outputs(self, columns: "_Columns") -> list[str]:
        """:meth:`fast_output` for every column of V at once: each column's terms put in order by
        one NumPy sort of the row (the same keys: c's rank·n² + the exponent's rank·n + k)."""
        if self.number or not self.distinct or not self.others or not columns.columns:
            return [self.fast_output(column) for column in columns.columns]
        import numpy as np

        others = np.array(self.others, dtype=np.intp)
        keys = columns.key[:, others] + np.array(self.others_key, dtype=np.int64)
        width = len(self.others)
        if columns.zeros:
            zero = columns.zero[:, others]
            keys[zero] = np.iinfo(np.int64).max  # a zero coefficient's term is not written: sorted last, cut
            counts = (width - zero.sum(axis=1)).tolist()
        else:
            counts = [width] * len(columns.columns)
        order = others[np.argsort(keys, axis=1)]  # column c's terms, positions k in SymPy's order
        # every column's terms as (sign and |p|*, e^x, /q) pieces, picked by NumPy, joined once each
        pieces = np.empty((len(columns.columns), width, 3), dtype=object)
        pieces[:, :, 0] = columns.before[columns.index, order]
        pieces[:, :, 1] = np.array(self.power_at, dtype=object)[order]
        pieces[:, :, 2] = columns.after[columns.index, order]
        pieces = pieces.reshape(len(columns.columns), 3 * width).tolist()
        top, total, out = self.top, len(self.allowed), []
        for c, (column, count) in enumerate(zip(columns.columns, counts)):
            constant = column.nonzero[top]
            if count < 2 or (count + constant == total and all(column.one[k] for k in self.allowed)):
                out.append(self._sorted_output(column, order[c, :count].tolist()))  # one term, or Z_i / Z_i
                continue
            text = "".join(pieces[c] if count == width else pieces[c][:3 * count])
            if constant:
                text = column.text[top] + text
            else:
                text = ("-" if text[1] == "-" else "") + text[3:]
            out.append(f"({text})/({self.z})")
        return out

    def _sorted_output(self, column: "_Column", ks: list) -> str:
        """The output whose numerator's non-constant terms are at positions ``ks``, in SymPy's order."""
        top = self.top
        constant = column.nonzero[top]
        if len(ks) + constant <= 1:
            if constant:
                return self._single(column, top)
            return self._single(column, ks[0]) if ks else "0"
        if len(ks) + constant == len(self.allowed) and all(column.one[k] for k in self.allowed):
            return "1"  # Z_i / Z_i: SymPy's quotient of a sum by itself
        if len(ks) > 1:  # the terms' pieces picked and joined in C (itemgetter, zip), not term by term
            pick = itemgetter(*ks)
            text = "".join(chain.from_iterable(zip(pick(column.before), pick(self.power_at), pick(column.after))))
        else:
            k, = ks
            text = column.before[k] + self.power_at[k] + column.after[k]
        if constant:
            text = column.text[top] + text
        else:
            text = ("-" if text[1] == "-" else "") + text[3:]
        return f"({text})/({self.z})"

    def _single(self, column: "_Column", k: int) -> str:
        """The output when its numerator is the one term at position k."""
        p, q = column.pq[k]
        sign = "-" if p < 0 else ""
        if k == self.top:
            return _over(sign, str(abs(p)), q, self.z)
        return _over(sign, ("" if abs(p) == 1 else f"{abs(p)}*") + self.power_at[k], q, self.z)


class _Column:
    """What every output of one rational column of V shares: its entries' texts and order."""

    def __init__(self, values: list) -> None:
        self.values = values
        n = len(values)
        self.pq = [_pq(v) for v in values]
        self.nonzero = [p != 0 for p, _ in self.pq]
        self.one = [x == (1, 1) for x in self.pq]
        self.text = [str(p) if q == 1 else f"{p}/{q}" for p, q in self.pq]
        # A term c·e^x is written: its sign and |p|* before exp(x), /q after; c = 1 is e^x alone.
        self.before = [(" - " if p < 0 else " + ") + ("" if abs(p) == 1 else f"{abs(p)}*") for p, _ in self.pq]
        self.after = ["" if q == 1 else f"/{q}" for _, q in self.pq]
        keys = [(1,) if x == (1, 1) else (0, rational_order_key(*x)) for x in self.pq]
        order = {key: r for r, key in enumerate(sorted(set(keys)))}
        self.key = [order[key] * n * n for key in keys]  # by c first; equal c: by the exponent (_RowText.key)
        self.zeros = not all(self.nonzero)


class _Columns:
    """Every rational column of V (as :class:`_Column`), with their sort keys and zeros as NumPy
    arrays (a row of each per column) for :meth:`_RowText.outputs`."""

    def __init__(self, columns: list) -> None:
        import numpy as np

        self.columns = [_Column(c) for c in columns]
        self.key = np.array([c.key for c in self.columns], dtype=np.int64)
        self.zero = ~np.array([c.nonzero for c in self.columns], dtype=bool)
        self.zeros = any(c.zeros for c in self.columns)
        self.before = np.array([c.before for c in self.columns], dtype=object)
        self.after = np.array([c.after for c in self.columns], dtype=object)
        self.index = np.arange(len(self.columns))[:, None]  # each column's own row of before and after


class _Fractions:
    """A rational stage's entries as numerators over one common denominator (its fmpq_mat's, or
    the int64 numerators a problem's decimals were read as), read once for both the exact texts
    and the decimals."""

    def __init__(self, numerators, denominator: int, shape: tuple[int, int]) -> None:
        """``numerators``: a list of ints (row by row), or an int64 array of ``shape``."""
        import numpy as np

        self.shape = shape
        self.denominator = denominator
        if isinstance(numerators, list):
            self.big = max(abs(max(numerators, default=0)), abs(min(numerators, default=0)))
            self.small = self.denominator < 2**62 and self.big < 2**62
            self.array = np.array(numerators, dtype=np.int64).reshape(shape) if self.small else None
        else:
            self.big = int(np.abs(numerators).max()) if numerators.size else 0
            self.small = self.denominator < 2**62 and self.big < 2**62
            self.array = numerators
        self.count = shape[0] * shape[1]

    @classmethod
    def of(cls, m, dense) -> "_Fractions":
        """A stage's fractions: the int64 numerators it was read as (a problem's decimals), else
        its fmpq_mat's numerators over their common denominator."""
        scaled = scaled_integers(m)
        if scaled is not None:
            return cls(scaled[0], scaled[1], scaled[0].shape)
        numerators, denominator = dense.numer_denom()
        return cls([int(x) for x in numerators.entries()], int(denominator), (dense.nrows(), dense.ncols()))

    @cached_property
    def _repeated(self):
        """``(distinct numerators, the first position of each, each entry's index into them)`` as
        NumPy arrays when the numerators fit in 63 bits and at most half of the entries are distinct
        (a problem's inputs: a few thousand decimals over a large X); else None. Each distinct
        entry is then written once, and the rows are made of those texts."""
        import numpy as np

        if not self.small or self.count < 64:
            return None
        distinct, first, where = np.unique(self.array.ravel(), return_index=True, return_inverse=True)
        return (distinct, first, where.reshape(self.shape)) if 2 * len(distinct) <= self.count else None

    def texts(self) -> "Callable[[int], list[str]] | None":
        """Row i's entries as text (``p`` or ``p/q`` in lowest terms), reduced with NumPy when every
        numerator and the denominator fit in 63 bits; else None."""
        if not self.small:
            return None
        if self._repeated is not None:
            distinct, _, where = self._repeated
            return _rows_of(_fraction_texts(distinct, self.denominator), where)
        return lambda i: _fraction_texts(self.array[i], self.denominator)

    def float_texts(self, values) -> "Callable[[int], list[str]] | None":
        """Row i of ``values`` (the stage's float64 array, every entry finite) as JSON writes each
        float, when the entries repeat (see :attr:`_repeated`): each distinct value's text made once."""
        if self._repeated is None:
            return None
        _, first, where = self._repeated
        return _rows_of(list(map(float.__repr__, values.ravel()[first].tolist())), where)

    def rounded_once_is_twice(self) -> bool:
        """See :func:`_once_is_twice`."""
        return self.denominator.bit_length() <= 80 and self.big.bit_length() <= 128


def _fraction_texts(numerators, denominator: int) -> list[str]:
    """``p/q`` (``p`` where q = 1) in lowest terms of each numerator (int64) over ``denominator``."""
    import numpy as np

    g = np.gcd(numerators, np.int64(denominator))
    top, bottom = (numerators // g).tolist(), (np.int64(denominator) // g).tolist()
    return [str(p) if q == 1 else f"{p}/{q}" for p, q in zip(top, bottom)]


def _rows_of(words: list, where) -> Callable[[int], list[str]]:
    """Row i of the table whose entry (i, j) is ``words[where[i, j]]``."""
    import numpy as np

    table = np.array(words, dtype=object)[where]
    return lambda i: table[i].tolist()


def _entry_texts(step: "Step", printer: _Printer, fractions: "_Fractions | None") -> Callable[[int], list[str]]:
    """Row i of the step's exact entries, each as text that ``sympify`` reads back exactly."""
    m = step.lazy
    entry = m.peek if isinstance(m, LazyMatrix) else m.__getitem__  # each entry is read once

    def general(i: int) -> list[str]:
        return [exact_text(entry((i, j)), printer) for j in range(m.cols)]

    rows = step.softmax
    if not rows:
        texts = fractions.texts() if fractions is not None else None
        if texts is None:
            qq = qq_entries(m)  # a rational stage: its fractions, no SymPy number each
            if qq is None:
                return general
            texts = lambda i: ["-oo" if x is None else qq_text(x) for x in qq[i]]  # noqa: E731
        texts.plain = True  # digits, signs and slashes: nothing to escape in JSON
        return texts
    if step.is_softmax:
        columns = None
    elif step.value_columns is not None:
        columns = _Columns(step.value_columns)
    else:
        return general

    def structured(i: int) -> list[str]:
        if not rows[i].rational or rows[i].sink is not None:  # a learned sink's Z_i: SymPy's own text
            return general(i)
        row = _RowText(rows[i])
        return [row.weight(j) for j in range(m.cols)] if columns is None else row.outputs(columns)

    structured.plain = all(row.rational for row in rows)  # numbers, exp, brackets and operators only
    return structured


def _fast_floats(d: "Derivation", step: "Step", fractions: "_Fractions | None") -> "list[list] | None":
    """The "approx" entries (floats, None for −∞) without a 30-digit value each, when they are
    the same floats: the weights and outputs from arb (as the 30-digit values are), and a rational
    stage read from its fractions when rounding it once is rounding its 30-digit value (see
    :func:`_once_is_twice`); else None."""
    if d.problem.symbols:
        return None
    if step.softmax:
        if not (all(row.rational for row in step.softmax) and (step.is_softmax or is_rational(step.values))):
            return None
        values = d.approx(step.id)  # rounded from the 30-digit arb values, as the JSON's are
        return None if math.isnan(values.sum()) else values.tolist()  # NaN: beyond float64's range
    kind = step.kind_of
    if kind is not None and kind.by_relation and not kind.gradient:
        return None  # its 30-digit values come from its relation, not from its fractions
    if fractions is not None:  # the array itself: stage_parts makes its rows
        return d.approx(step.id) if fractions.rounded_once_is_twice() else None
    qq = qq_entries(step.lazy)
    if qq is None or not _once_is_twice(qq):
        return None
    values = d.approx(step.id).tolist()
    return [[None if x is None else v for x, v in zip(qrow, vrow)] for qrow, vrow in zip(qq, values)]


def _once_is_twice(qq) -> bool:
    """Whether every rational entry p/q (QQ, None for −∞) rounded to float64 once (as
    :meth:`Derivation.approx` does) is the float64 of its 30-digit value (rounded first to 136
    bits or more, then to 53).

    The two differ only where the first rounding lands exactly on a midpoint between two float64
    numbers that p/q is not on. A p/q that is not such a midpoint lies at least
    ``min(1, 2^(E−1))/q`` from it (``2^E`` the float64 spacing there), and the first rounding moves
    it by at most ``|p/q|·2^−136``: with ``q < 2^80`` and ``|p| < 2^128`` that is always less,
    and every p/q ≠ 0 is a normal float64 (no second rounding below 2^−1022, nor overflow)."""
    return all(x is None or (int(x.denominator).bit_length() <= 80 and int(x.numerator).bit_length() <= 128)
               for row in qq for x in row)


def stage_parts(d: "Derivation", step: "Step", printer: _Printer, float_texts: bool = False):
    """The stage's small fields, and its exact and approximate entries row by row (None when not
    written), and whether those rows are texts with nothing to escape. With ``float_texts`` the
    decimals of a rational stage whose entries repeat come as their JSON texts (see
    :meth:`_Fractions.float_texts`), else as floats."""
    m = step.lazy
    head = {"id": step.id, "title": step.title, "shape": list(step.shape)}
    # null where a big gradient's entries are too long to write (see backward.EXACT_LIMIT)
    dense = None if step.softmax else fmpq_matrix(m)
    fractions = None if dense is None else _Fractions.of(m, dense)
    exact = None
    plain = False
    if written_exactly(step):
        texts = _entry_texts(step, printer, fractions)
        plain = getattr(texts, "plain", False)
        exact = (texts(i) for i in range(m.rows))
    approx = _fast_floats(d, step, fractions) if d.can_evaluate else None
    if approx is None:
        values = d.evaluate(step.id, 30) if d.can_evaluate else _numbers_only(m)
        approx = ([approx_float(v) for v in row] for row in values)
    elif not isinstance(approx, list):  # a rational stage's float64 array
        row = fractions.float_texts(approx) if float_texts else None
        approx = approx.tolist() if row is None else (row(i) for i in range(m.rows))
        return head, m.rows, exact, approx, (plain, row is not None)
    return head, m.rows, exact, approx, (plain, False)


def printer_of(d: "Derivation") -> _Printer:
    return _Printer(row.normaliser for step in d.steps if step.softmax and written_exactly(step)
                    for row in step.softmax if not row.rational and not row.normaliser_is_number)
