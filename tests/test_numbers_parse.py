"""Tests for symattn.numbers.parse: exact numbers from the text a user wrote.

Run with:
    python -m pytest tests/test_numbers_parse.py -p no:cacheprovider -o addopts=""
"""

from __future__ import annotations

import builtins
import time

import pytest
import sympy
from sympy import E, Integer, Rational, Symbol, exp, log, sqrt



from symattn.numbers import parse as _numbers
from symattn.numbers.parse import NumberError, is_neg_inf_text, parse_decimal, parse_number


def rejected(text: str, **kwargs) -> str:
    """The message of the NumberError that ``parse_number(text)`` raises."""
    with pytest.raises(NumberError) as info:
        parse_number(text, **kwargs)
    return str(info.value)


def assert_exact_rational(value, p: int, q: int) -> None:
    assert isinstance(value, sympy.Rational), f"{value!r} is {type(value).__name__}, not a Rational"
    assert not isinstance(value, sympy.Float)
    assert (int(value.p), int(value.q)) == (p, q)


# --------------------------------------------------------------------------
# Exact decimals and fractions
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "p", "q"),
    [
        ("0.1", 1, 10),
        ("1e-3", 1, 1000),
        ("1E-3", 1, 1000),
        ("-2.50", -5, 2),
        ("1/3", 1, 3),
        ("-2/5", -2, 5),
        ("2^3 - 1", 7, 1),
        ("2**3 - 1", 7, 1),
        ("0.1*3", 3, 10),
        ("3*0.1", 3, 10),
        ("0.1 + 0.2", 3, 10),
        ("1e-3*2", 1, 500),
        ("-0.1*3", -3, 10),
        ("0.1e1*3", 3, 1),
        (".5", 1, 2),
        ("5.", 5, 1),
        ("+3", 3, 1),
        ("-2", -2, 1),
        ("007", 7, 1),
        ("1.5e+2", 150, 1),
        ("1E3", 1000, 1),
        ("  0.25  ", 1, 4),
        ("2^-1", 1, 2),
        ("2^3^2", 512, 1),  # a power is right-associative: 2^(3^2)
        ("-2^2", -4, 1),  # -(2^2), as written mathematics reads it
        ("(1/2)^2", 1, 4),
        ("(-1/2)^3", -1, 8),
        ("0.5^-2", 4, 1),
        ("1/3 + 1/6", 1, 2),
        ("(1 + 2) * (3 - 4) / 6", -1, 2),
        ("0^0", 1, 1),
        ("2^0.5 * 2^0.5", 2, 1),
        ("0.333333333333333333333", 333333333333333333333, 10**21),
    ],
)
def test_parse_number_exact_rationals(text, p, q):
    assert_exact_rational(parse_number(text), p, q)


def test_point_one_is_one_tenth_not_a_float():
    value = parse_number("0.1")
    assert value == Rational(1, 10)
    assert_exact_rational(value, 1, 10)
    assert not value.atoms(sympy.Float)
    # and it is not the binary float 0.1 taken exactly
    assert value != Rational(*(0.1).as_integer_ratio())


def test_long_decimals_are_exact():
    # 0.1 + 0.2 is exactly 3/10, unlike in binary floating point
    assert parse_number("0.1 + 0.2") - Rational(3, 10) == 0
    assert_exact_rational(parse_number("1e400"), 10**400, 1)
    assert_exact_rational(parse_number("1e-400"), 1, 10**400)
    big = "9" * 400
    assert_exact_rational(parse_number(big), int(big), 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sqrt(2)/2", sqrt(2) / 2),
        ("sqrt(2)", sqrt(2)),
        ("sqrt(8)", 2 * sqrt(2)),
        ("sqrt(2)*sqrt(2)", Integer(2)),
        ("2^(1/2)", sqrt(2)),
        ("4^(1/2)", Integer(2)),
        ("8^(-1/3)", Rational(1, 2)),
        ("2^0.5", sqrt(2)),
        ("exp(1)", E),
        ("exp(1)^2", exp(2)),
        ("exp(0)", Integer(1)),
        ("exp(-1/2)", exp(Rational(-1, 2))),
        ("log(1)", Integer(0)),
        ("log(2)", log(2)),
        ("log(exp(3))", Integer(3)),
        ("1/sqrt(3)", sqrt(3) / 3),
        ("sqrt(0.25)", Rational(1, 2)),
        ("(1 + sqrt(5))/2", (1 + sqrt(5)) / 2),
        ("exp(1) - exp(1)", Integer(0)),
    ],
)
def test_parse_number_exact_expressions(text, expected):
    value = parse_number(text)
    assert sympy.simplify(value - expected) == 0
    assert not value.atoms(sympy.Float)


def test_exp_one_is_eulers_number_exactly():
    assert parse_number("exp(1)") is sympy.E


def test_caret_is_power_not_xor():
    assert parse_number("2^3") == 8  # xor would give 1
    assert parse_number("2^3 - 1") == 7
    assert parse_number("3^2") == 9  # xor would give 1
    assert parse_number("2 ^ 10") == 1024


def test_underscored_integer_literal_is_read_as_its_digits():
    assert parse_number("1_000") == 1000


def test_result_types_are_sympy():
    assert isinstance(parse_number("3"), sympy.Integer)
    assert isinstance(parse_number("3.0"), sympy.Integer)
    assert isinstance(parse_number("sqrt(2)"), sympy.Expr)


# --------------------------------------------------------------------------
# parse_decimal
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "p", "q"),
    [
        ("-2.50", -5, 2),
        ("0.1", 1, 10),
        ("1e-3", 1, 1000),
        ("  12  ", 12, 1),
        ("+0.125", 1, 8),
        ("-.5", -1, 2),
        ("3.", 3, 1),
        ("1e400", 10**400, 1),
        ("0", 0, 1),
        ("-0.0", 0, 1),
    ],
)
def test_parse_decimal_exact(text, p, q):
    assert_exact_rational(parse_decimal(text), p, q)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("1/3", "'1/3' is not a decimal number"),
        ("abc", "'abc' is not a decimal number"),
        ("", "'' is not a decimal number"),
        ("0x10", "'0x10' is not a decimal number"),
        ("1,5", "'1,5' is not a decimal number"),
        ("1.2.3", "'1.2.3' is not a decimal number"),
        ("nan", "'nan' is not a decimal number"),
        ("inf", "'inf' is not a decimal number"),
        ("sqrt(2)", "'sqrt(2)' is not a decimal number"),
        ("1e401", "the power of ten is larger than 400"),
        ("1e-401", "the power of ten is larger than 400"),
        ("1" * 401, "has more than 400 digits; write it as a fraction or round it"),
        ("0." + "1" * 400, "has more than 400 digits"),
    ],
)
def test_parse_decimal_rejects(text, fragment):
    with pytest.raises(NumberError) as info:
        parse_decimal(text)
    assert fragment in str(info.value)


def test_number_error_is_a_value_error():
    assert issubclass(NumberError, ValueError)


# --------------------------------------------------------------------------
# Rejections, each with a sentence that says what is wrong
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        # not-a-number and infinities
        ("nan", "'nan' (not a number) is not allowed; write an exact number"),
        (".nan", "'.nan' (not a number) is not allowed; write an exact number"),
        ("NaN", "'NaN' (not a number) is not allowed"),
        (".NaN", "'.NaN' (not a number) is not allowed"),
        ("inf", "'inf' is not a finite number"),
        (".inf", "'.inf' is not a finite number"),
        ("+.inf", "'+.inf' is not a finite number"),
        ("Infinity", "'Infinity' is not a finite number"),
        ("oo", "'oo' is not a finite number"),
        ("-inf", "'-inf': -inf is only allowed in a mask or bias matrix"),
        ("-.inf", "'-.inf': -inf is only allowed in a mask or bias matrix"),
        ("-oo", "-inf is only allowed in a mask or bias matrix"),
        # names
        ("abc", "'abc' is not a number or a declared symbol; declare it under 'symbols' to use it as a symbol"),
        ("e", "'e' is not a number or a declared symbol; write exp(1) for e"),
        ("pi", "'pi' is not a number or a declared symbol"),
        ("sqrt", "sqrt is a function: write sqrt(...)"),
        ("2*x + 1", "'x' is not a number or a declared symbol"),
        ("__import__", "'__import__' is not a number or a declared symbol"),
        # attribute access, lambdas, calls
        ("(1).real", "attribute access (.) is not allowed in a number"),
        ("(2).__class__", "attribute access (.) is not allowed in a number"),
        ("lambda: 1", "a lambda is not allowed in a number"),
        ("(lambda: 1)()", "a lambda cannot be called (only sqrt, exp, log)"),
        ("sin(1)", "the function sin is not allowed (only sqrt, exp, log)"),
        ("abs(-1)", "the function abs is not allowed (only sqrt, exp, log)"),
        ("eval('1')", "the function eval is not allowed (only sqrt, exp, log)"),
        ("exec('1')", "the function exec is not allowed"),
        ("open('x')", "the function open is not allowed"),
        ("__import__('os')", "the function __import__ is not allowed"),
        ("math.sqrt(2)", "attribute access (.) cannot be called (only sqrt, exp, log)"),
        ("sympy.sqrt(2)", "attribute access (.) cannot be called"),
        ("sqrt(2, 3)", "sqrt takes exactly one argument"),
        ("sqrt()", "sqrt takes exactly one argument"),
        ("sqrt(x=2)", "sqrt takes exactly one argument"),
        ("exp(*[1])", "exp takes exactly one argument"),
        # complex numbers and non-real values
        ("1j", "a complex number is not allowed in a number"),
        ("2+3j", "a complex number is not allowed in a number at character 3"),
        ("log(-1)", "'log(-1)' is not a real number"),
        ("sqrt(-1)", "'sqrt(-1)' is not a real number"),
        ("sqrt(-4) + 1", "is not a real number"),
        ("(-8)^(1/3)", "is not a real number"),
        # non-finite values
        ("1/0", "division by zero"),
        ("2*(1/0)", "'2*(1/0)': division by zero at character 4"),
        ("1/(1 - 1)", "division by zero"),
        ("1/0.0", "division by zero"),
        ("0^(-1)", "division by zero"),
        ("0^-2", "division by zero"),
        ("log(0)", "log(0) is not a finite number"),
        ("log(1 - 1)", "log(0) is not a finite number"),
        # values too large to compute
        ("10**10**10", "the exponent 10000000000 is too large (at most 1000)"),
        ("10^10^10", "the exponent 10000000000 is too large (at most 1000)"),
        ("9^9^9", "is too large (at most 1000)"),
        ("2^(1/1001)", "the exponent 1/1001 is too large (at most 1000)"),
        ("(2^1000)^1000", "the power is too large to compute exactly"),
        ("(1/2)^(-2000)", "is too large (at most 1000)"),
        ("1e401", "the power of ten is larger than 400"),
        ("1" * 401, "has more than 400 digits"),
        ("1" * 401 + " + 1", "a number has more than 400 digits"),
        ("1+" * 1001 + "1", "the entry is longer than 2000 characters"),
        ("-" * 100 + "1", "nested more than 60 levels deep"),
        ("(" * 300 + "1" + ")" * 300, "is not a number or an expression"),
        # empty entries
        ("", "the entry is empty; write a number"),
        ("   ", "the entry is empty; write a number"),
        ("\t", "the entry is empty; write a number"),
        # other Python syntax
        ("True", "a boolean is not allowed in a number"),
        ("False", "a boolean is not allowed in a number"),
        ("None", "None is not allowed in a number"),
        ("'1'", "a string is not allowed in a number"),
        ("[1]", "a collection is not allowed in a number"),
        ("(1, 2)", "a collection is not allowed in a number"),
        ("{1: 2}", "a collection is not allowed in a number"),
        ("1 < 2", "a comparison is not allowed in a number"),
        ("1 and 2", "and/or is not allowed in a number"),
        ("x[0]", "indexing ([...]) is not allowed in a number"),
        ("1 if 1 else 2", "is not allowed in a number"),
        ("[c for c in ()]", "is not allowed in a number"),
        ("1//2", "the operator // is not allowed"),
        ("1 % 2", "the operator % is not allowed"),
        ("1 | 2", "the operator | is not allowed"),
        ("1 & 2", "the operator & is not allowed"),
        ("1 << 2", "the operator << is not allowed"),
        ("0x10", "0x10 is not a decimal number"),
        ("0b101", "0b101 is not a decimal number"),
        ("1 +", "'1 +' is not a number or an expression"),
        ("1,5", "a collection is not allowed in a number"),
        ("1\n+1", "an entry must be on one line"),
        ("1:30", "is not a number or an expression"),
    ],
)
def test_parse_number_rejects(text, fragment):
    assert fragment in rejected(text)


def test_rejections_are_fast():
    """Hostile entries are refused from their shape, not by computing them."""
    for text in ["10**10**10", "9^9^9^9", "(2^1000)^1000^1000", "2^" * 500 + "2", "1+" * 999 + "1"]:
        start = time.process_time()  # CPU time: a busy machine stretches the wall clock, not this
        with pytest.raises(NumberError):
            parse_number(text)
        assert time.process_time() - start < 1.0, text


def test_long_message_quotes_a_shortened_entry():
    message = rejected("abc" + "+1" * 100)
    assert "'abc+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1...'" in message


# --------------------------------------------------------------------------
# -inf, allowed only on request (mask and bias matrices)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["-inf", "-.inf", "-.Inf", "-.INF", "-infinity", "-Infinity", "-oo", "  -inf  "])
def test_neg_inf_allowed_on_request(text):
    assert parse_number(text, allow_neg_inf=True) is sympy.S.NegativeInfinity
    assert is_neg_inf_text(text)


@pytest.mark.parametrize("text", ["inf", ".inf", "+inf", "nan", "1/0", "-inf + 1", "-1/0", "log(0)"])
def test_allow_neg_inf_does_not_allow_other_non_finite_values(text):
    with pytest.raises(NumberError):
        parse_number(text, allow_neg_inf=True)


def test_allow_neg_inf_still_reads_ordinary_numbers():
    assert_exact_rational(parse_number("0.1", allow_neg_inf=True), 1, 10)


def test_is_neg_inf_text_false_for_other_text():
    for text in ["inf", "-1", "0", "", "- inf"]:
        assert not is_neg_inf_text(text)


# --------------------------------------------------------------------------
# Declared symbols
# --------------------------------------------------------------------------


def test_declared_symbols_are_used():
    a, b = Symbol("a"), Symbol("b")
    value = parse_number("2*a + 1/2", symbols={"a": a})
    assert value == 2 * a + Rational(1, 2)
    assert parse_number("a^2 - b", symbols={"a": a, "b": b}) == a**2 - b
    assert parse_number("sqrt(a)", symbols={"a": a}) == sqrt(a)


def test_undeclared_name_lists_declared_symbols():
    a, b = Symbol("a"), Symbol("b")
    message = rejected("c", symbols={"b": b, "a": a})
    assert "'c' is not a number or a declared symbol; declared symbols: a, b" in message


def test_symbolic_exponent_is_rejected():
    a = Symbol("a")
    assert "an exponent must be a number (use exp(...) for e to a symbolic power)" in rejected("2^a", symbols={"a": a})


def test_irrational_exponent_is_rejected():
    assert "an exponent must be an integer or a fraction such as 1/2" in rejected("2^sqrt(2)")


# --------------------------------------------------------------------------
# Never evaluated: hostile entries run nothing
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("__import__('os').system('touch {m}')", "attribute access (.) cannot be called (only sqrt, exp, log)"),
        ("(lambda: __import__('os').system('touch {m}'))()", "a lambda cannot be called"),
        ("exec(\"open('{m}', 'w')\")", "the function exec is not allowed"),
        ("eval(\"open('{m}', 'w')\")", "the function eval is not allowed"),
        ("open('{m}', 'w')", "the function open is not allowed"),
        ("sqrt(open('{m}', 'w'))", "the function open is not allowed"),
        ("1 + __import__('os').system('touch {m}')", "attribute access (.) cannot be called"),
        ("().__class__.__bases__[0].__subclasses__()", "cannot be called"),
    ],
)
def test_injection_runs_nothing(tmp_path, template, fragment):
    marker = tmp_path / "symattn_pwned_marker"
    text = template.format(m=marker)
    assert fragment in rejected(text)
    assert not marker.exists()


def test_no_eval_exec_or_sympify_on_user_text(monkeypatch):
    """Entry text never reaches eval, exec, sympify or parse_expr."""
    seen: list[str] = []
    real_eval, real_exec = builtins.eval, builtins.exec

    def spy_eval(source, *args, **kwargs):
        seen.append(repr(source))
        return real_eval(source, *args, **kwargs)

    def spy_exec(source, *args, **kwargs):
        seen.append(repr(source))
        return real_exec(source, *args, **kwargs)

    import sympy.parsing.sympy_parser as sympy_parser

    def no_parse_expr(source, *args, **kwargs):
        seen.append(repr(source))
        raise AssertionError("parse_expr called")

    monkeypatch.setattr(builtins, "eval", spy_eval)
    monkeypatch.setattr(builtins, "exec", spy_exec)
    monkeypatch.setattr(sympy_parser, "parse_expr", no_parse_expr)
    assert parse_number("sqrt(2)/2 + 0.1*3 + 2^3") == sqrt(2) / 2 + Rational(3, 10) + 8
    with pytest.raises(NumberError):
        parse_number("__import__('os').getcwd()")
    assert not [s for s in seen if "sqrt(2)" in s or "__import__" in s or "0.1" in s]


def test_module_does_not_reference_eval():
    import inspect

    source = inspect.getsource(_numbers)
    code_lines = [line for line in source.splitlines() if not line.lstrip().startswith("#")]
    code = "\n".join(code_lines)
    for forbidden in ("eval(", "exec(", "sympify(", "parse_expr("):
        assert forbidden not in code.replace("literal_eval(", ""), forbidden


# --------------------------------------------------------------------------
# Regressions: bugs found by these tests and fixed
# --------------------------------------------------------------------------


def test_division_by_hidden_zero_is_rejected():
    with pytest.raises(NumberError):
        parse_number("1/(log(4) - 2*log(2))")


def test_power_size_limit_cannot_be_bypassed_with_an_irrational_factor():
    with pytest.raises(NumberError) as info:
        parse_number("(2^1000*sqrt(2))^1000")
    assert "too large" in str(info.value)


def test_error_after_caret_quotes_entry_as_written():
    message = rejected("2^2 + foo")
    assert "'2^2 + foo'" in message
    assert "at character 7" in message
