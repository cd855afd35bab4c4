"""Exact numbers from the text a user wrote.

Every entry of a problem file becomes a SymPy number without passing through a
binary float: ``0.1`` is read from its text as 1/10. Strings such as
``"sqrt(2)/2"`` go through a small parser of our own over Python's ``ast``
that accepts numbers, declared symbols, ``+ - * / ** ^``, unary signs,
parentheses and ``sqrt``/``exp``/``log``, and nothing else. No user text ever
reaches ``eval``, ``exec``, ``sympify`` or ``parse_expr``.

>>> parse_number("0.1")
1/10
>>> parse_number("1e-3")
1/1000
>>> parse_number("sqrt(2)/2")
sqrt(2)/2
>>> parse_number("2^3 - 1")
7
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction
from typing import Mapping

import flint
import sympy

from .sympy_internals import QQMatrix, flint_matrix, is_rational_matrix, qq_dense
from ..text import excerpt as _short

# Limits that keep a small hostile entry from costing a large amount of work.
MAX_TEXT = 2000  # characters in one entry
MAX_DIGITS = 400  # digits in one literal
MAX_EXPONENT_TEN = 400  # |e| in a decimal literal such as 1e-3
MAX_POWER = 1000  # |p| and |q| of an exponent p/q
MAX_POWER_BITS = 20000  # bits of an exact integer power's result
MAX_DEPTH = 60  # nesting depth of an expression
MAX_FUNCTION_DEPTH = 4  # exp, log, sqrt and e^... inside each other
MAX_EXP_ARGUMENT = 1000  # |x| in exp(x): e^1000 is about 10^434
MAX_VALUE_BITS = 14000  # bits of any integer in an entry's exact value (Python prints at most 4300 digits)

_INT_RE = re.compile(r"[-+]?[0-9]+\Z")
_DEC_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")
_NEG_INF = {"-inf", "-.inf", "-.Inf", "-.INF", "-infinity", "-Infinity", "-oo"}
_POS_INF = {"inf", ".inf", ".Inf", ".INF", "+inf", "+.inf", "infinity", "Infinity", "oo"}
_NAN = {"nan", ".nan", ".NaN", ".NAN", "NaN", "NAN"}
_FUNCTIONS = {"sqrt": sympy.sqrt, "exp": sympy.exp, "log": sympy.log}


class NumberError(ValueError):
    """An entry that is not an exact number; the loader adds file, line and field."""


def is_neg_inf_text(text: str) -> bool:
    """Whether ``text`` spells minus infinity (``-inf``, ``-.inf``, ...)."""
    return text.strip() in _NEG_INF


def parse_decimal(text: str) -> sympy.Rational:
    """An integer or decimal literal, exactly, from its text.

    >>> parse_decimal("-2.50")
    -5/2
    """
    text = text.strip()
    if not _DEC_RE.match(text):
        raise NumberError(f"{_short(text)} is not a decimal number")
    mantissa, _, exponent = text.lower().partition("e")
    if sum(c.isdigit() for c in mantissa) > MAX_DIGITS:
        raise NumberError(
            f"{_short(text)} has more than {MAX_DIGITS} digits; write it as a fraction or round it"
        )
    # the exponent's digits are bounded before int() reads them (its cost grows with their square)
    if exponent and (len(exponent.lstrip("+-").lstrip("0")) > 4 or abs(int(exponent)) > MAX_EXPONENT_TEN):
        raise NumberError(
            f"{_short(text)}: the power of ten is larger than {MAX_EXPONENT_TEN}; use a smaller number"
        )
    value = Fraction(text)
    return sympy.Rational(value.numerator, value.denominator)


def parse_number(
    text: str,
    *,
    symbols: Mapping[str, sympy.Symbol] | None = None,
    allow_neg_inf: bool = False,
    allow_pi: bool = False,
) -> sympy.Expr:
    """An exact number (or an expression in declared ``symbols``) from ``text``.

    ``allow_pi`` lets ``pi`` stand for π (in angles, such as RoPE's ``"pi/6"``).
    Raises :class:`NumberError` with a sentence saying what is wrong.
    """
    symbols = symbols or {}
    text = text.strip()
    if not text:
        raise NumberError("the entry is empty; write a number")
    if len(text) > MAX_TEXT:
        raise NumberError(f"the entry is longer than {MAX_TEXT} characters")
    if text in _NEG_INF:
        if allow_neg_inf:
            return sympy.S.NegativeInfinity
        raise NumberError(f"{text!r}: -inf is only allowed in a mask or bias matrix")
    if text in _POS_INF:
        raise NumberError(f"{text!r} is not a finite number")
    if text in _NAN:
        raise NumberError(f"{text!r} (not a number) is not allowed; write an exact number")
    if _DEC_RE.match(text):
        return parse_decimal(text)
    if "\n" in text or "\r" in text:
        raise NumberError("an entry must be on one line")
    source, positions = _caret_to_power(text)
    try:
        tree = ast.parse(source, mode="eval")
    except RecursionError:
        raise NumberError(f"{_short(text)} is nested too deeply") from None
    except (SyntaxError, ValueError) as exc:
        raise NumberError(f"{_short(text)} is not a number or an expression ({_syntax_reason(exc)})") from None
    constants = {"pi": sympy.pi} if allow_pi else {}
    value, ball = _Builder(text, source, positions, symbols, constants).build(tree.body, 0)
    return _check_value(text, value, ball)


def _caret_to_power(text: str) -> tuple[str, list[int]]:
    """``text`` with each ``^`` written ``**`` (a caret is a power, as in written
    mathematics), and for each character of the result its index in ``text``."""
    out: list[str] = []
    positions: list[int] = []
    for k, ch in enumerate(text):
        if ch == "^":
            out.append("**")
            positions += [k, k]
        else:
            out.append(ch)
            positions.append(k)
    positions.append(len(text))
    return "".join(out), positions


def bits(x: sympy.Expr) -> int:
    """The largest bit length of any integer or fraction inside ``x``."""
    return max(
        (max(int(r.p).bit_length(), int(r.q).bit_length()) for r in x.atoms(sympy.Rational)),
        default=1,
    )


def check_size(text: str, value: sympy.Expr) -> sympy.Expr:
    """``value`` (read from ``text``) if it is below 10^300 in size, as every problem entry must be;
    a plain decimal such as 1e400 is read exactly by :func:`parse_decimal`, and refused here."""
    if value.is_Rational and abs(value) > MAX_MAGNITUDE:
        raise NumberError(f"{_short(text.strip())} is larger than 10^300 in size; use smaller numbers")
    return value


def is_zero(x: sympy.Expr) -> bool:
    """Whether the exact number ``x`` is 0, even when it is not written as 0."""
    if x.is_zero is not None or x.free_symbols:
        return bool(x.is_zero)
    approx = sympy.N(x, 30)
    if approx.is_number and abs(approx) > sympy.Float("1e-25"):
        return False
    return x.equals(0) is not False


def is_positive(x: sympy.Expr) -> bool:
    """Whether the exact real number ``x`` is > 0 (decided exactly or at 30 digits)."""
    if x.is_positive is not None:
        return bool(x.is_positive)
    if is_zero(x):
        return False
    return bool(sympy.N(x, 30) > 0)


def _syntax_reason(exc: Exception) -> str:
    if isinstance(exc, SyntaxError) and exc.msg:
        return exc.msg
    return str(exc) or "invalid syntax"


MAX_MAGNITUDE = sympy.Integer(10) ** 300  # float64 ends near 1.8e308; the numeric check must follow


def _check_value(text: str, value: sympy.Expr, ball=None) -> sympy.Expr:
    """``value`` if it is a finite real number below 10^300 in size. ``ball`` (a complex ball
    enclosing it, None with symbols) decides that without asking SymPy to evaluate anything."""
    if value.has(sympy.nan, sympy.zoo) or value.has(sympy.oo) or value.has(-sympy.oo):
        raise NumberError(f"{_short(text)} is not a finite number")
    if bits(value) > MAX_VALUE_BITS:
        raise NumberError(f"{_short(text)}: its exact value holds a number of more than {MAX_VALUE_BITS:,} bits "
                          "(about 4,200 digits); use smaller numbers")
    if value.is_Rational:
        if abs(value) > MAX_MAGNITUDE:
            raise NumberError(f"{_short(text)} is larger than 10^300 in size; use smaller numbers")
        return value
    if value.free_symbols:
        return value
    if ball is None:
        ball = _Balls.of(value)
    if ball is None or not ball.is_finite():
        raise NumberError(f"{_short(text)} is too large or too hard to evaluate; use smaller numbers")
    if ball.real.abs_lower() > _ARB_MAX:
        raise NumberError(f"{_short(text)} is larger than 10^300 in size; use smaller numbers")
    if ball.real.abs_upper() > _ARB_MAX:  # undecided even at the highest precision tried
        raise NumberError(f"{_short(text)} is larger than 10^300 in size, or too close to it to tell; "
                          "use smaller numbers")
    if value.is_extended_real is False:
        raise NumberError(f"{_short(text)} is not a real number")
    if value.is_extended_real is None and ball.imag.abs_lower() > _ARB_TINY:
        raise NumberError(f"{_short(text)} is not a real number")
    return value


class _Balls:
    """Complex balls (python-flint's acb) that enclose each value as it is built, so its size is
    known before SymPy is asked to do anything with it."""

    PRECISIONS = (128, 1024, 16384)  # bits; a wide ball is worked out again at the next

    @staticmethod
    def of(value: sympy.Expr):
        """A ball around a SymPy number built from rationals, E, pi, exp, log and powers; None
        when it holds anything else."""
        for prec in _Balls.PRECISIONS:
            with _flint_prec(prec):
                ball = _Balls._ball(value)
            if ball is None or _narrow(ball):
                return ball
        return ball

    @staticmethod
    def _ball(x):
        if x.is_Rational:
            return flint.acb(flint.arb(flint.fmpq(int(x.p), int(x.q))))
        if x is sympy.E:
            return flint.acb(1).exp()
        if x is sympy.pi:
            return flint.acb(flint.arb.pi())
        if x is sympy.I:
            return flint.acb(0, 1)
        args = [_Balls._ball(a) for a in x.args]
        if any(a is None for a in args):
            return None
        if isinstance(x, sympy.Add):
            return sum(args[1:], args[0])
        if isinstance(x, sympy.Mul):
            out = args[0]
            for a in args[1:]:
                out = out * a
            return out
        if isinstance(x, sympy.Pow):
            return args[0] ** args[1]
        if isinstance(x, sympy.exp):
            return args[0].exp()
        if isinstance(x, sympy.log):
            return args[0].log()
        return None


def _narrow(ball) -> bool:
    """Whether a ball is tight enough to decide sizes and signs: its radius is a small part of
    its midpoint (or tiny)."""
    if not ball.is_finite():
        return False
    for part in (ball.real, ball.imag):
        rad = part.rad()
        if rad > _ARB_TINY and rad > part.mid().abs_lower() * flint.arb(2) ** -40:
            return False
    return True


class _flint_prec:
    """python-flint's working precision (a global), set for a ``with`` block."""

    def __init__(self, prec: int) -> None:
        self.prec = prec

    def __enter__(self) -> None:
        self.old = flint.ctx.prec
        flint.ctx.prec = self.prec

    def __exit__(self, *exc) -> None:
        flint.ctx.prec = self.old


_ARB_MAX = flint.arb(10) ** 300
_ARB_TINY = flint.arb(10) ** -15
_ARB_EXP_MAX = flint.arb(MAX_EXP_ARGUMENT)
_ARB_HUGE = flint.arb(10) ** 1000  # no value on the way may be larger


class _Builder:
    """Turns an ``ast`` tree of an allowed shape into a SymPy expression."""

    def __init__(self, text: str, source: str, positions: list[int], symbols: Mapping[str, sympy.Symbol],
                 constants: Mapping[str, sympy.Expr] | None = None) -> None:
        self.text = text  # what the user wrote: quoted in messages
        self.source = source  # what ast parsed (carets written **)
        self.positions = positions
        self.symbols = symbols
        self.constants = constants or {}  # names such as pi, where the caller allows them

    def fail(self, node: ast.AST, what: str) -> NumberError:
        if ast.get_source_segment(self.source, node) == self.source:
            return NumberError(what)  # the message already names the whole entry
        col = getattr(node, "col_offset", None)
        col = self.positions[col] if col is not None else None
        where = f" at character {col + 1}" if col is not None and col > 0 else ""
        return NumberError(f"{_short(self.text)}: {what}{where}")

    def too_large(self, node: ast.AST) -> NumberError:
        if ast.get_source_segment(self.source, node) == self.source:
            return NumberError(f"{_short(self.text)} is larger than 10^300 in size; use smaller numbers")
        return self.fail(node, "this part is larger than 10^300 in size; use smaller numbers")

    def build(self, node: ast.AST, depth: int, functions: int = 0) -> tuple[sympy.Expr, object]:
        """The value of ``node`` and a complex ball around it (None once a symbol is involved).
        ``functions`` counts the exp, log, sqrt and e^... it is inside."""
        if depth > MAX_DEPTH:
            raise self.fail(node, f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, ast.Constant):
            return self.ball(node, self.constant(node))
        if isinstance(node, ast.Name):
            value = self.name(node)
            return value, None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            operand, ball = self.build(node.operand, depth + 1, functions)
            if isinstance(node.op, ast.USub):
                return -operand, None if ball is None else -ball
            return operand, ball
        if isinstance(node, ast.BinOp):
            return self.binop(node, depth, functions)
        if isinstance(node, ast.Call):
            return self.call(node, depth, functions)
        raise self.fail(node, f"{_describe(node)} is not allowed in a number")

    def ball(self, node: ast.AST, value: sympy.Expr, ball=...) -> tuple[sympy.Expr, object]:
        """``value`` with its ball (worked out from the value when not given), refused when the
        ball says it is beyond any size symattn works with."""
        if ball is ...:
            ball = _Balls.of(value) if not value.free_symbols else None
        if ball is not None:
            if not ball.is_finite() or ball.real.abs_lower() > _ARB_HUGE or ball.imag.abs_lower() > _ARB_HUGE:
                raise self.too_large(node)
        return value, ball

    def constant(self, node: ast.Constant) -> sympy.Expr:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(node, f"{_describe(node)} is not allowed in a number")
        literal = ast.get_source_segment(self.source, node) or ""
        literal = literal.replace("_", "")
        if isinstance(value, int) and _INT_RE.match(literal):
            if len(literal) > MAX_DIGITS:
                raise self.fail(node, f"a number has more than {MAX_DIGITS} digits")
            return sympy.Integer(int(literal))
        if _DEC_RE.match(literal):
            return parse_decimal(literal)
        raise self.fail(node, f"{literal or 'this literal'} is not a decimal number")

    def name(self, node: ast.Name) -> sympy.Expr:
        if node.id in self.symbols:
            return self.symbols[node.id]
        if node.id in self.constants:
            return self.constants[node.id]
        hint = ""
        if self.constants:
            hint = "; the names allowed here are " + ", ".join(sorted(self.constants))
        elif node.id == "e":
            hint = "; write exp(1) for e"
        elif node.id in _FUNCTIONS:
            hint = f"; {node.id} is a function: write {node.id}(...)"
        elif self.symbols:
            hint = "; declared symbols: " + ", ".join(sorted(self.symbols))
        else:
            hint = "; declare it under 'symbols' to use it as a symbol"
        raise self.fail(node, f"{node.id!r} is not a number or a declared symbol{hint}")

    def binop(self, node: ast.BinOp, depth: int, functions: int) -> tuple[sympy.Expr, object]:
        op = node.op
        if not isinstance(op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.BitXor)):
            raise self.fail(node, f"the operator {_OP_NAMES.get(type(op), type(op).__name__)} is not allowed")
        if isinstance(op, ast.Pow) and isinstance(node.left, ast.Name) and node.left.id == "e" \
                and self.symbols.get("e") is sympy.E:
            if functions >= MAX_FUNCTION_DEPTH:  # e^x is exp(x)
                raise self.fail(node, f"exp, log and sqrt are nested more than {MAX_FUNCTION_DEPTH} deep")
            functions += 1
        (left, lb), (right, rb) = self.build(node.left, depth + 1, functions), self.build(node.right, depth + 1, functions)
        both = lb is not None and rb is not None
        if isinstance(op, ast.Add):
            return self.ball(node, left + right, lb + rb if both else None)
        if isinstance(op, ast.Sub):
            return self.ball(node, left - right, lb - rb if both else None)
        if isinstance(op, ast.Mult):
            self.check_bits(node, left, right)
            return self.ball(node, left * right, lb * rb if both else None)
        if isinstance(op, ast.Div):
            if (rb is None or rb.contains(0)) and is_zero(right):
                raise self.fail(node, "division by zero")
            self.check_bits(node, left, right)
            return self.ball(node, left / right, lb / rb if both and not rb.contains(0) else None)
        return self.power(node, left, right, lb, functions)

    def check_bits(self, node: ast.AST, *values: sympy.Expr) -> None:
        """A product or quotient adds the sizes of its numbers: refuse before computing it."""
        if sum(bits(v) for v in values) > 2 * MAX_VALUE_BITS:
            raise self.fail(node, "the numbers are too large to compute exactly")

    def power(self, node: ast.AST, base: sympy.Expr, exponent: sympy.Expr, base_ball,
              functions: int) -> tuple[sympy.Expr, object]:
        if base is sympy.E:  # e^x, where e is allowed (answers files): the exponential
            return self.exp(node, exponent, functions)
        if exponent.free_symbols:
            raise self.fail(node, "an exponent must be a number (use exp(...) for e to a symbolic power)")
        if not exponent.is_Rational:
            raise self.fail(node, "an exponent must be an integer or a fraction such as 1/2")
        p, q = int(exponent.p), int(exponent.q)
        if abs(p) > MAX_POWER or q > MAX_POWER:
            raise self.fail(node, f"the exponent {exponent} is too large (at most {MAX_POWER})")
        if p < 0 and is_zero(base):
            raise self.fail(node, "division by zero")
        # Checked before computing: a power of any base multiplies the size of its numbers.
        if bits(base) * max(abs(p), 1) > MAX_POWER_BITS:
            raise self.fail(node, "the power is too large to compute exactly")
        if base_ball is not None:
            with _flint_prec(128):  # the size of the result, before SymPy computes it
                size = abs(base_ball).upper()
                if size > 1 and size.log() * abs(p) / q > _ARB_HUGE.log():
                    raise self.too_large(node)
        return self.ball(node, base**exponent)

    def exp(self, node: ast.AST, arg: sympy.Expr, functions: int) -> tuple[sympy.Expr, object]:
        """e to ``arg``, refused when ``arg`` is beyond ±1000 (e^1000 is about 10^434)."""
        if not arg.free_symbols:
            ball = _Balls.of(arg)
            if ball is None or not ball.is_finite() or ball.real.abs_lower() > _ARB_EXP_MAX:
                big = ball is None or not ball.is_finite() or ball.real.lower() > 0
                if big:
                    raise self.too_large(node)
                raise self.fail(node, f"e to a power below -{MAX_EXP_ARGUMENT} is too small to work with; "
                                "use smaller numbers")
        return self.ball(node, sympy.exp(arg))

    def call(self, node: ast.Call, depth: int, functions: int) -> tuple[sympy.Expr, object]:
        func = node.func
        if not isinstance(func, ast.Name) or func.id not in _FUNCTIONS:
            if isinstance(func, ast.Name):
                raise self.fail(node, f"the function {func.id} is not allowed (only sqrt, exp, log)")
            raise self.fail(node, f"{_describe(func)} cannot be called (only sqrt, exp, log)")
        if node.keywords or len(node.args) != 1 or isinstance(node.args[0], ast.Starred):
            raise self.fail(node, f"{func.id} takes exactly one argument")
        if functions >= MAX_FUNCTION_DEPTH:
            raise self.fail(node, f"exp, log and sqrt are nested more than {MAX_FUNCTION_DEPTH} deep")
        arg, ball = self.build(node.args[0], depth + 1, functions + 1)
        if func.id == "log" and arg == 0:
            raise self.fail(node, "log(0) is not a finite number")
        if func.id == "exp":
            return self.exp(node, arg, functions)
        if func.id == "log" and ball is not None and ball.contains(0):
            if is_zero(arg):
                raise self.fail(node, "log(0) is not a finite number")
            ball = None  # worked out again, more precisely, from the value
        return self.ball(node, _FUNCTIONS[func.id](arg))


_OP_NAMES = {
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.MatMult: "@",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.BitOr: "|",
    ast.BitAnd: "&",
}


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return "a string"
        if isinstance(node.value, bool):
            return "a boolean"
        if isinstance(node.value, complex):
            return "a complex number"
        return repr(node.value)
    if isinstance(node, ast.Attribute):
        return "attribute access (.)"
    if isinstance(node, ast.Subscript):
        return "indexing ([...])"
    if isinstance(node, (ast.Lambda,)):
        return "a lambda"
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        return "a collection"
    if isinstance(node, ast.Compare):
        return "a comparison"
    if isinstance(node, ast.BoolOp):
        return "and/or"
    return type(node).__name__


_EXACT_FLOAT = 2**53  # integers up to this size are exact float64 values


def rationals_float64(dm):
    """A QQ DomainMatrix as a float64 array, each entry correctly rounded (NaN beyond float64's range).

    With a common denominator ``D`` and numerators that are exact float64 values, one
    float64 division per entry is correctly rounded (IEEE 754); otherwise each entry is
    rounded by Python from its own fraction. A big matrix goes a block of rows at a time
    (each block by the first way that applies to it), so no list of all its numerators is made.
    """
    import numpy as np

    rows, cols = dm.shape
    fmpq_mat = flint_matrix(dm)
    if fmpq_mat is None or not rows * cols:
        return np.array([[qq_float(x) for x in row] for row in dm.to_list()], dtype=np.float64).reshape(rows, cols)
    numerators, denominator = fmpq_mat.numer_denom()
    d = int(denominator)
    out = np.empty((rows, cols), dtype=np.float64)
    step = max(1, _FLOAT_BLOCK // cols)
    for first in range(0, rows, step):
        last = min(rows, first + step)
        block = [numerators[i, j] for i in range(first, last) for j in range(cols)]
        values = _block_float64(block, d)
        if values is None:
            values = [qq_float(fmpq_mat[i, j]) for i in range(first, last) for j in range(cols)]
        out[first:last] = np.asarray(values, dtype=np.float64).reshape(last - first, cols)
    return out


_FLOAT_BLOCK = 1 << 18  # entries rounded to float64 at a time by rationals_float64


def _block_float64(numerators: list, d: int):
    """``numerators / d`` (flint integers over a common denominator) as float64, each correctly
    rounded, when one float64 operation per entry does it; else None."""
    import numpy as np

    top, bottom = max(numerators), min(numerators)
    if d <= _EXACT_FLOAT and top <= _EXACT_FLOAT and bottom >= -_EXACT_FLOAT:
        return np.fromiter(map(float, numerators), dtype=np.float64, count=len(numerators)) / float(d)
    if d & (d - 1) == 0:  # binary fractions (from .npy files): one rounding, then exact scaling
        try:
            values = np.ldexp(np.fromiter((float(int(x)) for x in numerators), dtype=np.float64,
                                          count=len(numerators)), -(d.bit_length() - 1))
        except OverflowError:
            return None
        if np.isfinite(values).all():
            tiny = np.abs(values[values != 0])
            if not tiny.size or tiny.min() >= 2.0**-1022:  # no subnormal result: the scaling was exact
                return values
    return None


_FLOAT64 = "_float64_values"  # where a QQMatrix keeps its entries as float64


def matrix_float64(m):
    """The entries of a rational matrix (a DomainMatrix-backed one) as float64, each correctly
    rounded (NaN beyond float64's range), or None when ``m`` is not one. A QQMatrix computes
    them once and keeps them read-only (the cross-check and the NumPy reference both read them)."""
    kept = m.__dict__ if isinstance(m, QQMatrix) else None
    if kept is not None and _FLOAT64 in kept:
        return kept[_FLOAT64]
    if not is_rational_matrix(m):
        return None
    values = rationals_float64(qq_dense(m))
    if kept is not None:
        keep_float64(m, values)
    return values


def keep_float64(m: QQMatrix, values) -> None:
    """Make ``values`` (read-only from now on) the float64 entries :func:`matrix_float64` gives for ``m``."""
    values.flags.writeable = False
    m.__dict__[_FLOAT64] = values


def qq_float(x) -> float:
    try:
        return int(x.numerator) / int(x.denominator)
    except OverflowError:
        return float("nan")  # beyond float64: the cross-check is skipped for such problems
