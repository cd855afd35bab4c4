"""The JSON document written from structure is the one SymPy's printer gives.

``symattn.render.json`` writes the weights and outputs of rational softmax rows straight from
the rows' exponents and V, rational stages from their fractions, and the decimals from the
cross-check's float64 where those are the same floats. Each test computes the document (or an
entry) a second way: the general path (every entry a SymPy expression printed by SymPy's
StrPrinter, every decimal rounded from its 30-digit value, ``json.dumps``), SymPy's own sums,
``fractions.Fraction`` and mpmath at 50 digits, and compares.

Run with:
    python -m pytest -q tests/test_render_json.py
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sympy import QQ, Rational

from symattn import derive, load_problem
from symattn.reference.crosscheck import crosscheck
from symattn.exact.evaluation import mpf_of_qq
from symattn.exact.softmax import SoftmaxRow
from symattn.numbers.sympy_internals import exp_term_order_key, rational_order_key
from symattn.cli import with_backward
from symattn.problem.load import parse_problem
from symattn.render import json as js
from symattn.render import json_entries as je
from symattn.render.entries import written_exactly

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").rglob("*.yaml"))

CASES = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the general path: every entry a SymPy expression, printed by SymPy ------------------------


def general_document(d, check=None) -> str:
    """The JSON as symattn wrote it entry by entry through SymPy: ``step.lazy[i, j]`` printed by
    the StrPrinter (``sstr``, order "none"), each decimal rounded from its 30-digit value."""
    printer = je._Printer(row.normaliser for step in d.steps if step.softmax
                          for row in step.softmax if not row.normaliser_is_number)
    stages = []
    for step in d.steps:
        m = step.lazy
        values = d.evaluate(step.id, 30) if d.can_evaluate else je._numbers_only(m)
        stages.append({
            "id": step.id, "title": step.title, "shape": list(step.shape),
            "exact": ([[je.exact_text(m[i, j], printer) for j in range(m.cols)] for i in range(m.rows)]
                      if written_exactly(step) else None),
            "approx": [[None if v is None or mpmath.isinf(v) else float(v) for v in row] for row in values],
        })
        if "tiles" in step.shows:  # the online softmax's table: not entries, written as as_dict writes it
            stages[-1]["recurrence"] = js.as_dict(d)["stages"][len(stages) - 1]["recurrence"]
    out = {"title": d.problem.title, "dims": d.dims, "stages": stages}
    out.update(js._extras(d))  # RoPE's, shared K/V's and decoding's keys: not entries either
    if check is not None:
        out["crosscheck"] = check.as_dict()
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def both(d, check=None) -> tuple[str, str]:
    streamed: list[str] = []
    js.write_json(d, streamed.append, check=check)
    assert js.render_json(d, check=check) == "".join(streamed)
    return "".join(streamed), general_document(d, check)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_worked_examples_are_byte_identical(path, backward):
    p = load_problem(path)
    if backward and p.kv_heads:
        pytest.skip("no backward pass of grouped K/V heads")
    if backward and p.sinks is not None:
        pytest.skip("no backward pass with learned sinks")
    if backward and p.embeddings_norm is not None:
        pytest.skip("no backward pass through the embeddings' norm")
    if backward and (p.mlp is not None or p.logits is not None):
        pytest.skip("no backward pass through the MLP and the model's head")
    if backward and p.linear is not None:
        pytest.skip("no backward pass of linear attention")
    if backward and p.mla is not None:
        pytest.skip("no backward pass of multi-head latent attention")
    if backward and p.differential is not None:
        pytest.skip("no backward pass of differential attention")
    if backward and (p.softcap is not None or p.temperature is not None):
        pytest.skip("no backward pass through soft-capping or a temperature")
    if backward:
        p = with_backward(p)
    d = derive(p)
    check = crosscheck(d)
    fast, general = both(d, check)
    assert fast == general
    assert json.loads(fast) == js.as_dict(d, check=check)


# -- random problems -----------------------------------------------------------------------


def _number(rng: random.Random, symbols: list[str], ones: bool) -> str:
    kind = rng.random()
    if ones and kind < 0.35:
        return "1"
    if kind < 0.6:
        return str(rng.randint(-2, 2))
    if kind < 0.85:
        return f"{rng.randint(-9, 9)}/{rng.randint(1, 6)}"
    if kind < 0.92 and symbols:
        return rng.choice(symbols)
    if kind < 0.96:
        return rng.choice(["sqrt(2)", "sqrt(2)/2", "-sqrt(3)"])
    return f"{rng.randint(-99999, 99999)}/{rng.choice([1000, 4096, 10**6])}"


def _matrix(rng, rows, cols, symbols, ones=False) -> str:
    return "[" + ", ".join("[" + ", ".join(f'"{_number(rng, symbols, ones)}"' for _ in range(cols)) + "]"
                           for _ in range(rows)) + "]"


def random_problem(seed: int) -> str:
    """A small problem: Q/K/V or X with weights or heads, a mask, a bias, a scale, symbols, a
    backward pass, each at random (small integers make ties among the scores often)."""
    rng = random.Random(seed)
    n, d_k, d_v = rng.randint(1, 5), rng.randint(1, 3), rng.randint(1, 3)
    symbols = ["t"] if rng.random() < 0.15 else []
    lines = [f"title: random {seed}"]
    if symbols:
        lines += ["symbols: [t]", f"values: {{t: {rng.choice(['1/2', '-1', '2'])}}}"]
    layout = rng.random()
    if layout < 0.55:
        lines += [f"Q: {_matrix(rng, n, d_k, symbols)}", f"K: {_matrix(rng, n, d_k, symbols)}",
                  f"V: {_matrix(rng, n, d_v, symbols, ones=True)}"]
    else:
        d_model = rng.randint(1, 3)
        lines.append(f"X: {_matrix(rng, n, d_model, [])}")
        if layout < 0.8:
            lines += [f"W_Q: {_matrix(rng, d_model, d_k, [])}", f"W_K: {_matrix(rng, d_model, d_k, [])}",
                      f"W_V: {_matrix(rng, d_model, d_v, [], ones=True)}"]
        else:
            lines.append("heads:")
            for _ in range(2):
                lines += [f"  - W_Q: {_matrix(rng, d_model, d_k, [])}", f"    W_K: {_matrix(rng, d_model, d_k, [])}",
                          f"    W_V: {_matrix(rng, d_model, d_v, [], ones=True)}"]
            if rng.random() < 0.5:
                lines.append(f"W_O: {_matrix(rng, 2 * d_v, rng.randint(1, 2), [])}")
    mask = rng.random()
    if mask < 0.35:
        lines.append("mask: causal")
    elif mask < 0.5:
        lines.append(f"mask: {{sliding-window: {rng.randint(1, 2)}}}")
    elif mask < 0.65:
        keep = [rng.random() < 0.7 for _ in range(n)]
        keep[0] = True
        lines.append("mask: [" + ", ".join("[" + ", ".join("1" if k else "0" for k in keep) + "]" for _ in range(n)) + "]")
    if rng.random() < 0.2:
        lines.append(f"bias: {_matrix(rng, n, n, symbols)}")
    scale = rng.choice(["none", "none", '"1/2"', '"1/3"'])
    lines.append(f"scale: {scale}" if rng.random() < 0.6 else "# the default scale, 1/sqrt(d_k)")
    if rng.random() < 0.3:
        lines.append("backward: {loss: sum}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(80))
def test_random_problems_are_byte_identical(seed):
    text = random_problem(seed)
    try:
        p = parse_problem(text, f"random{seed}.yaml")
        d = derive(p)
    except Exception as exc:  # a random problem symattn rejects (a fully masked row, say)
        if type(exc).__name__ != "SymattnError":
            raise
        pytest.skip(f"rejected: {exc}")
    check = crosscheck(d)
    fast, general = both(d, check)
    assert fast == general, text


def test_random_problems_reach_every_path():
    """The random problems above take the structured path, with ties among the exponents and
    without, Z_i/Z_i, irrational rows, symbols, heads and gradients (the test is not vacuous)."""
    seen = set()
    for seed in range(80):
        try:
            d = derive(parse_problem(random_problem(seed), "r.yaml"))
        except Exception:
            continue
        seen.add("symbols" if d.problem.symbols else "numbers")
        seen.add("heads" if d.problem.heads else "one head")
        seen.add("backward" if d.problem.backward else "forward")
        for step in d.steps:
            for row in step.softmax:
                if not row.rational:
                    seen.add("irrational row")
                elif not row.normaliser_is_number:
                    exps = [e for e in row.raw if e is not None]
                    seen.add("ties" if len(set(exps)) < len(exps) else "distinct")
            if step.value_columns is not None:
                for i, row in enumerate(step.softmax):
                    if row.rational and not row.normaliser_is_number and step.lazy[i, 0] == 1:
                        seen.add("Z/Z")
    assert seen >= {"symbols", "numbers", "heads", "one head", "backward", "forward", "irrational row",
                    "ties", "distinct"}, seen


# -- one row at a time, against SymPy's own expressions ----------------------------------------

EXPONENTS = st.builds(lambda p, q: Fraction(-p, q), st.integers(1, 40), st.integers(1, 12))
VALUES = st.one_of(
    st.sampled_from([Fraction(v) for v in (-2, -1, 0, 0, 1, 1, 1, 2)] + [Fraction(1, 2), Fraction(-1, 2)]),
    st.builds(Fraction, st.integers(-50, 50), st.integers(1, 9)),
    st.builds(Fraction, st.integers(-10**20, 10**20), st.integers(1, 10**12)),
)


@st.composite
def rows(draw):
    n = draw(st.integers(1, 9))
    pool = [Fraction(0)] + draw(st.lists(EXPONENTS, max_size=6, unique=True))
    distinct = draw(st.booleans())
    if distinct:  # every allowed exponent its own (the fast path)
        raw = [draw(st.one_of(st.none(), st.just("new"))) for _ in range(n)]
        fresh = iter(draw(st.lists(EXPONENTS, min_size=n, max_size=n, unique=True)))
        raw = [None if x is None else next(fresh) for x in raw]
    else:
        raw = draw(st.lists(st.one_of(st.none(), st.sampled_from(pool)), min_size=n, max_size=n))
    raw[draw(st.integers(0, n - 1))] = Fraction(0)
    columns = draw(st.lists(st.lists(VALUES, min_size=n, max_size=n), min_size=1, max_size=3))
    if draw(st.booleans()):
        columns.append([Fraction(1)] * n)  # Σ_j a_ij · 1: the numerator is Z_i itself
    row = SoftmaxRow(Rational(0), tuple(None if x is None else QQ(x.numerator, x.denominator) for x in raw))
    return row, columns


def sstr(x) -> str:
    return sympy.sstr(x, order="none")


def same_value(text: str, x) -> bool:
    """Whether ``text`` parses back to the value of ``x`` (``sympify`` may write it differently:
    ``1/(2*(1 + exp(-1)))`` comes back as ``1/(2*exp(-1) + 2)``)."""
    y = sympy.sympify(text)
    return y == x or sympy.cancel(y - x) == 0


@CASES
@given(rows())
def test_row_texts_are_sympys(case):
    row, columns = case
    text = je._RowText(row)
    for j in range(len(row.raw)):
        assert text.weight(j) == sstr(row.weight(j))
    for column in columns:
        values = [Rational(v.numerator, v.denominator) for v in column]
        expected = sstr(row.weighted_sum(values))
        qq = [QQ(v.numerator, v.denominator) for v in column]
        assert text.output(qq) == expected, (row.raw, column)
        assert text.fast_output(je._Column(qq)) == expected, (row.raw, column)
        assert same_value(expected, row.weighted_sum(values))
    # every column at once, each put in order by one NumPy sort of the row
    expected = [sstr(row.weighted_sum([Rational(v.numerator, v.denominator) for v in column])) for column in columns]
    assert text.outputs(je._Columns([[QQ(v.numerator, v.denominator) for v in column] for column in columns])) == expected


def test_order_keys_sort_as_sympys_sums():
    """rational_order_key and exp_term_order_key put terms where SymPy's Add puts them."""
    rng = random.Random(5)
    special = [Rational(1, 2), Rational(-1), Rational(2), Rational(-2), Rational(-1, 2), Rational(3, 2)]
    for _ in range(400):
        terms = {}
        for _ in range(rng.randint(2, 8)):
            c = rng.choice(special + [Rational(rng.randint(-30, 30) or 1, rng.randint(1, 7)), Rational(1)])
            x = rng.choice([Rational(-1), Rational(-2), Rational(-1, 2)] + [Rational(-rng.randint(1, 40), rng.randint(1, 9))])
            terms[x] = c  # one term per exponent: a collected sum
        built = [c * sympy.exp(x) for x, c in terms.items()]
        expected = list(sympy.Add.make_args(sympy.Add(*built)))
        keyed = sorted(terms.items(), key=lambda t: exp_term_order_key((int(t[1].p), int(t[1].q)), (int(t[0].p), int(t[0].q))))
        assert [c * sympy.exp(x) for x, c in keyed] == expected
    numbers = special + [Rational(0), Rational(1), Rational(7), Rational(-7, 3), Rational(5, 2)]
    for a in numbers:
        for b in numbers:
            if a != b:
                assert (rational_order_key(int(a.p), int(a.q)) < rational_order_key(int(b.p), int(b.q))) == (a.compare(b) < 0)


# -- the decimals: rounding a fraction once or its 30-digit value -------------------------------


def test_rounding_once_is_rounding_twice_within_the_bounds():
    """For p/q with q < 2^80 and |p| < 2^128, float64 of the 40-digit value (how the JSON's decimals
    were made) is p/q correctly rounded, also next to the midpoints between two float64 numbers
    (where a double rounding goes wrong)."""
    rng = random.Random(2)
    prec = mpmath.libmp.dps_to_prec(40)
    assert prec >= 136
    for _ in range(3000):
        q = rng.randint(1, 2**80 - 1)
        if rng.random() < 0.6:  # next to a midpoint: (2k+1)·2^(e−1) with a 53-bit k
            e = rng.randint(-100, 20)
            mid = Fraction((2 * rng.randint(2**52, 2**53 - 1) + 1) * 2**60, 2**61) * Fraction(2) ** e
            p = round(mid * q) + rng.randint(-2, 2)
        else:
            p = rng.randint(-(2**128) + 1, 2**128 - 1)
        if p == 0 or abs(p).bit_length() > 128:
            continue
        x = QQ(p, q)
        with mpmath.workdps(40):
            twice = float(mpf_of_qq(x))
        assert twice == p / q, (p, q)
        assert je._once_is_twice([[x]])
    assert not je._once_is_twice([[QQ(1, 2**81)]]) and not je._once_is_twice([[QQ(2**129, 3)]])


def test_rounding_twice_can_differ_beyond_the_bounds():
    """The bounds matter: a p/q just above a midpoint with a huge q rounds differently twice."""
    q = 2**150 + 1
    mid = Fraction(2**53 + 1, 2**53)  # halfway between 1 and 1 + 2^-52
    p = math.ceil(mid * q)  # just above the midpoint: rounds up once, to the midpoint (then down) twice
    with mpmath.workdps(40):
        twice = float(mpf_of_qq(QQ(p, q)))
    assert p / q == 1 + 2**-52 and twice == 1.0
    assert not je._once_is_twice([[QQ(p, q)]])


# -- a model-shaped problem: each sampled entry against the softmax structure -------------------


def _bench_problem(n: int, d_model: int, d_k: int, seed: int = 0) -> str:
    rng = random.Random(seed)

    def m(r, c, sd):
        return "[" + ", ".join("[" + ", ".join(f"{round(rng.gauss(0, sd), 3):.3f}" for _ in range(c)) + "]"
                               for _ in range(r)) + "]"

    return (f"title: sampled\nX: {m(n, d_model, 1.0)}\nW_Q: {m(d_model, d_k, 0.3)}\nW_K: {m(d_model, d_k, 0.3)}\n"
            f"W_V: {m(d_model, d_k, 0.3)}\nmask: causal\n")


def _mpf(x: Fraction) -> mpmath.mpf:
    return mpmath.mpf(x.numerator) / x.denominator


def test_sampled_entries_at_48_tokens_are_the_softmax():
    """At 48 tokens (the benchmark's layout, smaller), sampled entries of A and O parse back with
    ``sympify`` to the derivation's own entries, and their values are those of the softmax computed
    here from S_masked with Fractions and mpmath at 50 digits."""
    n, d_v = 48, 4
    d = derive(parse_problem(_bench_problem(n, 12, d_v), "sampled.yaml"))
    doc = json.loads(js.render_json(d))
    stages = {s["id"]: s for s in doc["stages"]}
    scores = [[None if t == "-oo" else Fraction(t) for t in row] for row in stages["S_masked"]["exact"]]
    values = [[Fraction(t) for t in row] for row in stages["V"]["exact"]]
    rng = random.Random(7)
    mpmath.mp.dps = 50
    try:
        for _ in range(48):
            i = rng.randrange(n)
            allowed = [k for k, s in enumerate(scores[i]) if s is not None]
            top = max(scores[i][k] for k in allowed)
            exps = {k: mpmath.exp(_mpf(scores[i][k] - top)) for k in allowed}
            z = mpmath.fsum(exps.values())
            j = rng.randrange(n)
            a_text = stages["A"]["exact"][i][j]
            a = sympy.sympify(a_text)
            assert same_value(a_text, d.step("A").lazy[i, j])
            expected = exps[j] / z if j in exps else 0
            assert abs(mpmath.mpf(sympy.N(a, 50)) - expected) < mpmath.mpf(10) ** -45
            assert stages["A"]["approx"][i][j] == float(expected)
            c = rng.randrange(d_v)
            o = sympy.sympify(stages["O"]["exact"][i][c])
            assert same_value(stages["O"]["exact"][i][c], d.step("O").lazy[i, c])
            expected = mpmath.fsum(exps[k] * _mpf(values[k][c]) for k in allowed) / z
            assert abs(mpmath.mpf(sympy.N(o, 50)) - expected) < mpmath.mpf(10) ** -40
            assert abs(stages["O"]["approx"][i][c] - float(expected)) <= 1e-15 * max(1.0, abs(float(expected)))
    finally:
        mpmath.mp.dps = 15


# -- rational stages whose entries repeat: each distinct entry written once ---------------------


def _repeating_problem(n: int, d_model: int, d_k: int, pool: list[str], seed: int) -> str:
    rng = random.Random(seed)

    def m(r, c):
        return "[" + ", ".join("[" + ", ".join(rng.choice(pool) for _ in range(c)) + "]" for _ in range(r)) + "]"

    return (f"title: repeats\nX: {m(n, d_model)}\nW_Q: {m(d_model, d_k)}\nW_K: {m(d_model, d_k)}\n"
            f"W_V: {m(d_model, d_k)}\nmask: causal\n")


@pytest.mark.parametrize("pool", [
    ["0", "1", "-1", "2", "0.5", "-0.25", "0.1", "-3.125", "7"],  # integers, halves, tenths, zero
    ["0.001", "-0.002", "0.003", "1", "0", "-12.5", "0.333"],
    ["12345678901234567890.5", "0.1", "-1", "3"],  # a numerator past 63 bits: each entry on its own
], ids=["small", "thousandths", "huge"])
def test_stages_whose_entries_repeat_are_written_as_each_entry_alone(pool):
    """X (16 × 16) and the weights (16 × 4) drawn from a few values: their exact texts and decimals
    are made once per distinct value and looked up, and the document is the general path's."""
    d = derive(parse_problem(_repeating_problem(16, 16, 4, pool, seed=len(pool)), "repeats.yaml"))
    x = d.step("X").lazy
    fractions = je._Fractions.of(x, _ex_fmpq(x))
    assert (fractions._repeated is not None) == (pool[0] != "12345678901234567890.5")
    # X read as int64 numerators (256 entries: the NumPy reader), unless past 18 digits
    assert (_ex_scaled(x) is not None) == (pool[0] != "12345678901234567890.5")
    check = crosscheck(d)
    fast, general = both(d, check)
    assert fast == general


def _ex_fmpq(m):
    from symattn.exact.lazy import fmpq_matrix

    return fmpq_matrix(m)


def _ex_scaled(m):
    from symattn.numbers.matrices import scaled_integers

    return scaled_integers(m)


def test_repeated_entries_are_looked_up_where_they_are():
    """Row by row, the looked-up texts and decimals are each entry's own: ``p/q`` in lowest terms
    (a Fraction's) and float64's repr of the correctly rounded value."""
    import flint
    import numpy as np

    rng = random.Random(3)
    pool = [Fraction(rng.randint(-40, 40), rng.choice([1, 2, 3, 8, 10, 1000])) for _ in range(12)]
    rows, cols = 9, 13
    entries = [[rng.choice(pool) for _ in range(cols)] for _ in range(rows)]
    dense = flint.fmpq_mat(rows, cols, [flint.fmpq(x.numerator, x.denominator) for row in entries for x in row])
    fractions = je._Fractions.of(None, dense)
    assert fractions._repeated is not None
    texts = fractions.texts()
    values = np.array([[float(x) for x in row] for row in entries])
    floats = fractions.float_texts(values)
    for i, row in enumerate(entries):
        assert texts(i) == [str(x) for x in row]
        assert floats(i) == [json.dumps(float(x)) for x in row]
    assert je._Fractions.of(None, flint.fmpq_mat(2, 40, list(range(80))))._repeated is None  # all distinct


def test_streamed_text_is_handed_on_a_megabyte_at_a_time():
    from symattn import writing as _output

    pieces = [("x" * k) + "é" for k in range(0, 6000, 7)]  # about 2.6 million characters
    chunks: list[str] = []
    _output.stream(lambda write: [write(p) for p in pieces], chunks.append)
    assert "".join(chunks) == "".join(pieces)
    assert 2 <= len(chunks) <= 4 and all(len(c) >= _output._STREAM_CHUNK for c in chunks[:-1])
    nothing: list[str] = []
    _output.stream(lambda write: None, nothing.append)
    assert nothing == []


# -- the command line: streamed into the temporary file, or to standard output -----------------


def test_cli_writes_the_same_document_to_a_file_and_to_standard_output(tmp_path, capsys):
    from symattn.cli import main

    example = ROOT / "worked_examples" / "two_heads.yaml"
    d = derive(load_problem(example))
    expected = js.render_json(d, check=crosscheck(d))
    target = tmp_path / "out.json"
    assert main(["derive", str(example), "-o", str(target)]) == 0
    assert target.read_text("utf-8") == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    capsys.readouterr()
    assert main(["derive", str(example), "-f", "json"]) == 0
    assert capsys.readouterr().out == expected


def test_a_failure_while_streaming_leaves_the_existing_output_untouched(tmp_path, capsys, monkeypatch):
    from symattn.errors import SymattnError
    from symattn.cli import main

    def failing(derivation, write, *, check=None):
        write('{\n  "title": "half a document')
        raise SymattnError("the disk is full (a test)")

    monkeypatch.setattr(js, "write_json", failing)
    target = tmp_path / "out.json"
    target.write_bytes(b"precious old output\n")
    assert main(["derive", str(ROOT / "worked_examples" / "causal_4_tokens.yaml"), "-o", str(target)]) == 1
    assert "the disk is full" in capsys.readouterr().err
    assert target.read_bytes() == b"precious old output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"], "temporary files left behind"
