"""What an exact entry is made of, whatever the format: over which normaliser it is written,
its numerator, the heads it sums; and whether a step's entries are written at all.

:func:`entry_form` decides how an entry is written (:class:`EntryForm`); ``_tex.py`` prints the
form as LaTeX and ``text.py`` as plain text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import mpmath
import sympy
from sympy import QQ

from ..exact.lazy import all_integers, qq_entries
from ..exact.norms import rational_rows_of
from ..exact.rotary import is_rotary, needs_decimals as rotary_needs_decimals, terms_of as rotary_terms
from .. import stages as registry
from ..numbers.matrices import is_rational, qq_to_sympy
from ..numbers.sympy_internals import mul_in_order, sum_of_distinct
from .numbers import DPS, NEG_INF, is_plain_angle, is_plain_integer

if TYPE_CHECKING:
    from ..exact.derivation import Derivation, Step


@dataclass(frozen=True)
class Over:
    """A sum of ``c·e^x`` terms over a normaliser: row ``row``'s Z_i (0-based), Z_i² when
    ``squared``, or head ``head``'s Z^{(h)}_i.

    ``numerator`` is a SymPy sum, or (for a rational row, no SymPy number built) a tuple of its
    exact ``(c, x)`` pairs in QQ in writing order. It is never zero: a zero entry is plain.
    """

    numerator: object
    row: int
    squared: bool = False
    head: int | None = None
    negative: bool = False  # in a sum of fractions: written − numerator/Z (the numerator is then positive)

    @property
    def parts(self) -> bool:
        """Whether the numerator is given as exact ``(c, x)`` pairs."""
        return isinstance(self.numerator, tuple)

    @property
    def terms(self) -> int:
        """How many terms the numerator has."""
        return len(self.numerator) if self.parts else len(sympy.Add.make_args(self.numerator))


@dataclass(frozen=True)
class EntryForm:
    """How one exact entry is written, whatever the format.

    Either a plain exact ``value`` (a SymPy expression, or a QQ number of a rational step; ``NEG_INF``
    for −∞), or a single fraction ``over`` (a softmax entry over Z_i, a gradient's over Z_i²), or,
    for a sum of fractions (``heads``: the concatenation or the projected output of several heads,
    one fraction per head over that head's normaliser; or a gradient such as dV = Aᵀ dO, one
    fraction per softmax row over its Z_r), a plain ``value`` (None when it is zero) plus those fractions.
    ``wide``: the entry is in a matrix of more than four columns (numerators keep fewer terms).
    """

    value: object = None
    over: tuple[Over, ...] = ()
    heads: bool = False
    wide: bool = False
    sums: bool = False  # ``value`` is a sum of c·e^x terms, or one such sum over another (the online softmax)


_ZERO = sympy.Integer(0)


def entry_form(d: Derivation, step: Step, i: int, j: int) -> EntryForm:
    """How entry (i, j) of ``step`` is written (for many entries, :func:`entry_forms` shares the work)."""
    return entry_forms(d, step)(i, j)


def entry_forms(d: Derivation, step: Step) -> Callable[[int, int], EntryForm]:
    """:func:`entry_form` of each entry of ``step``, reading what the step's entries share once.

    Softmax rows are written over their normaliser Z_i, gradients over Z_i², a sum over heads
    head by head. Only the entries asked for are built, and a rational step's are read from its
    QQ numbers, without a SymPy number each.
    """
    wide = step.shape[1] > 4
    if "heads_sum" in step.shows:
        parts = head_parts_of(d, step)
        return lambda i, j: _heads_form(d, step, parts(i, j), i, j, wide)
    if "exp_sums" in step.shows:
        return lambda i, j: EntryForm(step.lazy[i, j], sums=True)
    qq = _rational_entries(step)
    if qq is not None:
        return lambda i, j: EntryForm(NEG_INF if qq[i][j] is None else qq[i][j])
    base = row_base(d, step)
    return lambda i, j: _form(step, i, j, wide, base)


def row_base(d: Derivation, step: Step) -> int:
    """The number people give ``step``'s first softmax row: the decoded token's t for the decoding
    step's one row (a_t, o_t: its m_t and Z_t are the full computation's row t), else 1."""
    if step.key in (registry.A_T, registry.O_T) and getattr(d.problem, "decode", None) is not None:
        return d.problem.decode
    return 1


def norm_names(step: Step, row: int) -> tuple[str, str]:
    """Row ``row``'s (1-based) maximum and normaliser in LaTeX: ``m_{3}``, ``Z_{3}``; a head's
    ``m^{(2)}_{3}``, ``Z^{(2)}_{3}`` (named per head from the start, as the concatenation reads them)."""
    h = f"^{{({step.head})}}" if step.head is not None else ""
    return f"m{h}_{{{row}}}", f"Z{h}_{{{row}}}"


def _form(step: Step, i: int, j: int, wide: bool, base: int = 1) -> EntryForm:
    h, r0 = step.head, base - 1  # each fraction over its head's Z, numbered as the full computation's rows
    if step.over_rows is not None:  # a sum of fractions, each over its own row's Z_r
        plain, fractions = step.over_rows(i, j)
        over = tuple(Over(-top, r + r0, squared=power == 2, negative=True, head=h) if _single_negative(top)
                     else Over(top, r + r0, squared=power == 2, head=h) for r, power, top in fractions)
        return EntryForm(plain if plain != 0 or not over else None, over, heads=True, wide=wide)
    squared = over_normaliser_squared(step, i, j)
    if squared is not None:
        return EntryForm(_ZERO) if squared == 0 else EntryForm(over=(Over(squared, i + r0, squared=True, head=h),),
                                                                 wide=wide)
    parts = numerator_parts(step, i, j)  # rational rows: no SymPy number built
    if parts is not None:
        return EntryForm(over=(Over(tuple(parts), i + r0, head=h),), wide=wide) if parts else EntryForm(_ZERO)
    numerator = over_normaliser(step, i, j)
    if numerator is None:
        return EntryForm(step.lazy[i, j])
    if numerator == 0:
        return EntryForm(_ZERO)
    return EntryForm(over=(Over(numerator, i + r0, head=h),), wide=wide)


def quotient(x: sympy.Expr) -> "tuple[sympy.Expr, sympy.Expr] | None":
    """``(numerator, denominator)`` of ``x`` built as a numerator times a sum to the power −1
    (``acc/ℓ``), else None. SymPy's ``fraction`` would move each e^{-1} under the bar."""
    if isinstance(x, sympy.Pow) and x.exp == -1 and x.base.is_Add:
        return sympy.Integer(1), x.base
    if not isinstance(x, sympy.Mul):
        return None
    under = [a for a in x.args if a.is_Pow and a.exp == -1 and a.base.is_Add]
    if len(under) != 1:
        return None
    return sympy.Mul(*[a for a in x.args if a is not under[0]]), under[0].base


def _single_negative(x: sympy.Expr) -> bool:
    """Whether ``x`` is one term with a minus sign (written as ``− x/Z`` in a sum)."""
    return len(sympy.Add.make_args(x)) == 1 and x.could_extract_minus_sign()


def _heads_form(d: Derivation, step: Step, parts: list, i: int, j: int, wide: bool) -> EntryForm:
    plain = sympy.Add(*[x for _, x, over_z in parts if not over_z])
    if step.key in (registry.O_FINAL, registry.H) and d.problem.b_O is not None:
        plain += d.problem.b_O[0, j]  # O = concat W_O + b_O: the bias joins the numbers outside the fractions
    if step.key == registry.H:  # H = X + O: the block's input joins them too
        plain += d.step(registry.Context(d.problem).block).lazy[i, j]
    over = tuple(Over(x, i, head=h) for h, x, over_z in parts if over_z)
    return EntryForm(plain if plain != 0 or not over else None, over, heads=True, wide=wide)


TOO_LONG = (
    "At this size the exact entries are long sums of fractions over the rows' normalisers, so they are "
    "shown in decimals only (symattn.derive(...).step(id).exact builds them)."
)
NORMED_TOO_LONG = (
    "Every entry here carries the norm's roots ⟦\\sqrt{\\sigma_i^2 + \\varepsilon}⟧, irrational for these rows: "
    "the exact entries are too long to print, so they are shown in certified "
    "decimals, computed in ball arithmetic from the exact values (symattn.derive(...).step(id).exact builds them)."
)
STREAM_TOO_LONG = (
    "The exact entries here hold the softmax's sums ⟦Z_i⟧ over exponentials{roots}: too long to print, so they "
    "are shown in certified decimals, computed in ball arithmetic from the exact values "
    "(symattn.derive(...).step(id).exact builds them)."
)
HEAD_NORM_TOO_LONG = (
    "The head's output rows are sums of the two maps' weights, fractions over their rows' sums ⟦Z_i⟧ of "
    "exponentials, and {what}: the exact entries are too long to print, so they are shown in decimals, computed "
    "from the exact values (each entry of ⟦O⟧ in ball arithmetic, then {then} in multiple precision; "
    "symattn.derive(...).step(id).exact builds them)."
)
ROTARY_TOO_LONG = (
    "At this size the exact entries, rational multiples of the cosines and sines of RoPE's angles "
    "({what}), have {terms:,} terms in all, too many to write out, so they are shown in decimals, computed in "
    "ball arithmetic from the exact rationals and angles (symattn.derive(...).step(id).exact builds them)."
)


def too_long(step: Step) -> str:
    """Why a step is shown in decimals only (see :func:`written_exactly`)."""
    terms = rotary_terms(step.value)
    if terms is None:
        kind = step.kind_of
        if _behind_head_norm(step):
            if kind.key == registry.O_MS:
                return HEAD_NORM_TOO_LONG.format(what="each mean square sums the squares of such a row",
                                                 then="the mean squares")
            return HEAD_NORM_TOO_LONG.format(what="the norm divides each row by the root ⟦\\sqrt{\\mathrm{ms}_i + "
                                             "\\varepsilon}⟧ of such a sum of squares", then="the norm")
        if kind is not None and not kind.gradient and kind.order >= registry.BY_KEY[registry.H].order:
            post = kind.order >= registry.BY_KEY[registry.R_HAT].order
            return STREAM_TOO_LONG.format(roots=", and the norm's roots ⟦\\sqrt{\\sigma_i^2 + \\varepsilon}⟧ of sums of "
                                          "them" if post else "")
        return NORMED_TOO_LONG if _irrational_norm(step.derivation) else TOO_LONG
    score = ("each score a sum over the pairs ⟦i⟧ of ⟦\\alpha_i \\cos(d\\theta_i) + \\beta_i \\sin(d\\theta_i)⟧, "
             "⟦d⟧ the key's position minus the query's")
    if step.key in (registry.Q_ROT, registry.K_ROT, registry.K_T):
        what = "each ⟦a\\cos(p\\theta_i) - b\\sin(p\\theta_i)⟧"
    elif step.softmax:
        what = "in the exponents of the weights, differences of two scores, " + score
    else:
        what = score
    return ROTARY_TOO_LONG.format(what=what, terms=terms)


def _behind_head_norm(step: Step) -> bool:
    """Whether the step is differential attention's per-head norm (``diff_transformer:``), or reads it
    before the residual stream (concat, the output projection)."""
    kind, d = step.kind_of, step.derivation
    differential = getattr(d.problem, "differential", None) if d is not None else None
    return (kind is not None and not kind.gradient and differential is not None and differential.paper is not None
            and registry.BY_KEY[registry.O_MS].order <= kind.order < registry.BY_KEY[registry.H].order)


def _irrational_norm(d: "Derivation | None") -> bool:
    """Whether the derivation's norm divides by irrational roots (its normalised rows are not rational)."""
    return d is not None and not all(rational_rows_of(d.step(key).value) for key in registry.hat_keys(d.problem))


def written_exactly(step: Step) -> bool:
    """Whether a worked solution writes the step's exact entries (big gradients: decimals only)."""
    return step.written_exactly


def needs_decimals(step: Step) -> bool:
    """Whether decimals help: some entry is not an integer or −∞, and none holds a symbol."""
    if not written_exactly(step):
        return True
    if is_rotary(step.value):  # RoPE's fast path: read from the balls, no entry built
        return rotary_needs_decimals(step.value)
    if is_rational(step.lazy):  # rationals: one common denominator, no SymPy number
        return not all_integers(step.lazy)
    qq = qq_entries(step.lazy)
    if qq is not None:  # rationals: read the denominators, build no SymPy number
        return any(x is not None and x.denominator != 1 for row in qq for x in row)
    values = step.values  # V, for the output step
    if (step.softmax and len(step.rows) * len(step.cols) > _BIG and all(r.rational for r in step.softmax)
            and (values is None or is_rational(values))):
        # A weight is 0 or 1 only in a row with a single allowed key; with more, weights are fractions.
        if any(sum(e is not None for e in r.raw) > 1 for r in step.softmax):
            return True
        return values is not None and not all_integers(values)
    if "heads_sum" in step.shows and _some_value_is_not_an_integer(step):
        return True
    if len(step.rows) * len(step.cols) > _BIG and hasattr(type(step.lazy), "mp_values") \
            and _some_value_is_not_an_integer(step):
        return True  # a matrix that holds its values (a norm's rows): decided from them, no entry built
    entries = list(_entries(step))
    if any(x.free_symbols for x in entries):
        return False
    return any(not (is_plain_integer(x) or x == NEG_INF) for x in entries)


_BIG = 64  # above this many entries, decide from structure rather than building every entry
_FAR = mpmath.mpf(10) ** -12  # 30-digit values are good to ~1e-28; farther than this from an integer, it is none


def _some_value_is_not_an_integer(step: Step) -> bool:
    """Whether some entry of a sum over heads is, by its 30-digit value, certainly not an integer
    (computed by the step's relation on the heads' values), so that no exact entry (a long sum
    of fractions over the heads' normalisers, expanded) is built to decide it."""
    d = step.derivation
    if d is None or d.problem.symbols or not d.can_evaluate:
        return False
    for row in d.evaluate(step.id, DPS):
        for v in row:
            if abs(v - mpmath.nint(v)) > _FAR * max(1, abs(v)):
                return True
    return False


def _entries(step: Step):
    if step.is_softmax:
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
    if step.is_softmax:
        return row.terms[j]
    return row.weighted_numerator(list(step.values.col(j)))


def numerator_parts(step: Step, i: int, j: int) -> list | None:
    """What :func:`over_normaliser` gives, as exact ``(c, x)`` pairs in QQ in writing order, when
    row i and the values are rational (no SymPy expression is built); else None."""
    if not step.softmax:
        return None
    row = step.softmax[i]
    if not row.rational or normaliser_is_number(row):
        return None
    if step.is_softmax:
        return [] if row.raw[j] is None else [(QQ(1), row.raw[j])]
    columns = step.value_columns
    return None if columns is None else row.numerator_parts(columns[j])


def normaliser_is_number(row) -> bool:
    return row.normaliser_is_number


def over_normaliser_squared(step: Step, i: int, j: int) -> sympy.Expr | None:
    """The numerator of a gradient entry (i, j) written over Z_i², else None."""
    numerator_of = step.over_z_squared
    if numerator_of is None or normaliser_is_number(step.jacobian[i]):
        return None
    return numerator_of(i, j)


def _rational_entries(step: Step) -> "list[list] | None":
    """The QQ entries (None for −∞) of a rational step that is written entry by entry, else None."""
    if step.softmax or step.over_z_squared is not None or step.over_rows is not None:
        return None
    return qq_entries(step.lazy)


def head_parts(d: Derivation, step: Step, i: int, j: int) -> list[tuple[int, sympy.Expr, bool]]:
    """Entry (i, j) of the concatenation or of the projected output, head by head.

    Each part is ``(h, x, over_z)``: head h contributes ``x / Z^{(h)}_i`` when
    ``over_z``, else the exact number ``x``.
    """
    return head_parts_of(d, step)(i, j)


def head_parts_of(d: Derivation, step: Step) -> Callable[[int, int], list[tuple[int, sympy.Expr, bool]]]:
    """:func:`head_parts` of each entry of ``step``, reading the heads once.

    A head's numerator ``Σ_c w_c Σ_k v_kc e^{x_k}`` is, expanded, ``Σ_k (Σ_c w_c v_kc) e^{x_k}``
    (like terms collected): with rational weights and values the coefficients are summed in QQ
    and each of the row's exponentials expanded once, the sum SymPy's ``expand`` of the whole
    numerator gives, without building and expanding it.
    """
    p = d.problem
    outputs = [d.step(i) for i in registry.resolve("heads", registry.Context(p))]
    offsets = [0]
    for o in outputs:
        offsets.append(offsets[-1] + o.shape[1])
    weights = sympy.eye(offsets[-1]) if step.key == registry.CONCAT or p.W_O is None else p.W_O
    expanded: dict = {}  # (head, row) -> the row's exponentials, expanded (None where masked)

    def parts(i: int, j: int) -> list[tuple[int, sympy.Expr, bool]]:
        out = []
        for h, o in enumerate(outputs, 1):
            column = [weights[offsets[h - 1] + c, j] for c in range(o.shape[1])]
            over_z = bool(o.softmax) and not normaliser_is_number(o.softmax[i])
            total = _collected(o, i, column, expanded.setdefault((h, i), {})) if over_z else None
            if total is None:
                total = sympy.Integer(0)
                for c, w in enumerate(column):
                    if w != 0:
                        total += (over_normaliser(o, i, c) if over_z else o.lazy[i, c]) * w
                total = sympy.expand(total, power_exp=False, power_base=False, log=False)
            if total != 0:
                out.append((h, total, over_z))
        return out

    return parts


def _collected(o: Step, i: int, column: list, expanded: dict) -> "sympy.Expr | None":
    """``expand(Σ_c w_c · numerator_c)`` of output ``o``'s row i, ``column`` the weights w_c,
    built from QQ coefficients; None unless the weights and ``o``'s values are rational."""
    columns = o.value_columns
    if columns is None or not all(isinstance(w, sympy.Rational) for w in column):
        return None
    if not expanded:
        expanded["terms"] = [None if e is None else sympy.expand(t, power_exp=False, power_base=False, log=False)
                             for e, t in zip(o.softmax[i].raw, o.softmax[i].terms)]
    qw = [(columns[c], QQ(int(w.p), int(w.q))) for c, w in enumerate(column) if w != 0]
    coefficients: dict = {}  # each distinct exponential (or 1) and its coefficient, summed in QQ
    for k, t in enumerate(expanded["terms"]):
        if t is None:
            continue
        coefficients[t] = coefficients.get(t, QQ(0)) + sum((w * v[k] for v, w in qw), QQ(0))
    if not all(isinstance(t, sympy.exp) or t == 1 for t in coefficients):  # any other term: SymPy's sum
        return sympy.Add(*[sympy.Mul(qq_to_sympy(c), t) for t, c in coefficients.items() if c])
    # Like terms are collected already: the canonical sum is built without SymPy's passes over
    # every term (each exponent of a rotary score is a long sum of cosines and sines).
    return sum_of_distinct([qq_to_sympy(c) if t == 1 else t if c == 1 else mul_in_order(qq_to_sympy(c), t)
                            for t, c in coefficients.items() if c])


def jacobian_row(step: Step) -> int:
    """The row whose softmax Jacobian is shown: the first with two or more allowed keys."""
    return next((i for i, r in enumerate(step.jacobian) if sum(e is not None for e in r.raw) > 1), 0)


def jacobian_form(row, i: int, j: int, k: int) -> EntryForm:
    """Entry (j, k) of row i's softmax Jacobian written as the gradients are: its numerator over
    ``Z_i²`` (a_j(δ_jk − a_k) = e_j(δ_jk Z_i − e_k) / Z_i², ``e`` the row's terms)."""
    if row.raw[j] is None or row.raw[k] is None:
        return EntryForm(_ZERO)
    if normaliser_is_number(row):
        return EntryForm(jacobian_entry(row, j, k))
    t, z = row.terms, row.normaliser
    top = jacobian_diagonal_top(t[j], z) if j == k else -t[j] * t[k]
    return EntryForm(over=(Over(top, i, squared=True),), wide=len(row.raw) > 4)


def jacobian_diagonal_top(t_j: sympy.Expr, z: sympy.Expr) -> sympy.Expr:
    """``expand(t_j·(Z − t_j))``, the numerator of a diagonal Jacobian entry over ``Z²``.

    Where one factor is 1 and the other a sum of powers ``e^{x_1 + … + x_m}`` with plain terms
    ``x`` (see :func:`_expands_to_itself`), the expansion is built directly: SymPy's ``expand``
    writes each such power as the product ``e^{x_1}···e^{x_m}``, after expanding every term of
    every exponent (a rotary row's exponents have 64 terms: a quarter of a second each). Anything
    else is left to ``expand``."""
    rest = z - t_j
    other = rest if t_j == 1 else t_j if rest == 1 else None
    parts = [] if other is None else [_split_power(term) for term in sympy.Add.make_args(other)]
    if not parts or any(part is None for part in parts):
        return sympy.expand(t_j * rest)
    return sympy.Add(*parts)


def _split_power(term: sympy.Expr) -> "sympy.Expr | None":
    """``expand(term)`` for a power ``e^{x_1 + … + x_m}`` of plain terms: ``e^{x_1}···e^{x_m}``
    (SymPy's evaluation turns ``e^1`` into ``E`` and leaves the others as they are); else None."""
    if not isinstance(term, sympy.exp):
        return None
    xs = sympy.Add.make_args(term.args[0])
    if not all(_expands_to_itself(x) for x in xs):
        return None
    return sympy.Mul(*[sympy.exp(x) if x.is_Rational else sympy.exp(x, evaluate=False) for x in xs])


def _expands_to_itself(x: sympy.Expr) -> bool:
    """Whether ``x`` is a rational, or a product of rationals, square roots (or other rational
    powers) of positive integers, and cosines or sines of plain angles: ``expand`` leaves it as it
    is, and SymPy's evaluation of ``e^x`` finds no multiple of iπ or logarithm in it."""
    for f in sympy.Mul.make_args(x):
        if f.is_Rational:
            continue
        if isinstance(f, sympy.Pow) and f.base.is_Integer and f.base > 0 and f.exp.is_Rational:
            continue
        if isinstance(f, (sympy.cos, sympy.sin)) and is_plain_angle(f.args[0]):
            continue
        return False
    return True


def jacobian_entry(row, j: int, k: int) -> sympy.Expr:
    """Entry (j, k) of the softmax Jacobian diag(a) − a aᵀ of one row: a_j(δ_jk − a_k), exactly."""
    if row.raw[j] is None or row.raw[k] is None:
        return sympy.Integer(0)
    t, z = row.terms, row.normaliser
    top = jacobian_diagonal_top(t[j], z) if j == k else -t[j] * t[k]
    return top / z**2
