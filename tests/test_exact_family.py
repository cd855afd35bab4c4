"""The problem family: cross-attention, every mask kind, bias, several heads, symbols.

Nothing here trusts symattn's own numbers. Each problem is written by the test
as YAML *text* (entries are quoted fraction strings), read back with
``yaml.BaseLoader`` (every scalar stays a string) and turned into
``fractions.Fraction`` by hand; the test then recomputes the forward pass

    per head:  Q = X W_Q,  K = C W_K,  V = C W_V,  S = Q Kᵀ        (exact, Fraction)
               A = softmax(S·scale + M + bias),  O = A V            (mpmath, 40 digits)
    then:      O = [O_1 | O_2 | ...] W_O                            (mpmath, 40 digits)

and, when PyTorch is importable, the same with
``torch.nn.functional.scaled_dot_product_attention`` in float64 from the
test's own float inputs.

Sections:
1. ≥ 200 random problems (plus random problems whose mask leaves a row empty);
2. exactness: symbols, bias, heads, the JSON stage order;
3. error messages, with file:line:col counted by hand;
4. ``symattn derive --check torch``.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import mpmath
import pytest
import sympy
import yaml

import symattn
from symattn import SymattnError
from symattn.problem.load import parse_problem
from _reference import allowed_grid, fmatmul, fmatrix, frac, quoted, yaml_matrix

try:
    import torch as _torch
except ImportError:  # pragma: no cover - torch is optional
    _torch = None

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "worked_examples").glob("*.yaml"))

REF_DPS = 40  # digits of the mpmath reference
EXACT_TOL = mpmath.mpf("1e-25")  # symattn (30 digits) against the reference, relative to max(1, |value|)
TORCH_TOL = 1e-10  # torch float64 against symattn, relative to max(1, |value|)

NEG_INF_TEXT = {"-inf", "-.inf", "-.Inf", "-.INF", "-oo"}
STAGES_PER_HEAD = ["W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]


# ---------------------------------------------------------------------------
# Helpers: the CLI, the test's own reading of a problem, the references
# ---------------------------------------------------------------------------




@dataclass
class Ref:
    X: list
    C: list  # the key/value side: context, or X
    heads: list[tuple[list, list, list]]  # (W_Q, W_K, W_V) per head
    W_O: list | None
    multi: bool
    scale: str | Fraction
    allowed: list[list[bool]]
    bias: list | None  # Fraction, or None for -inf

    @property
    def n_q(self):
        return len(self.X)

    @property
    def n_k(self):
        return len(self.C)

    def usable(self, i: int, j: int) -> bool:
        return self.allowed[i][j] and (self.bias is None or self.bias[i][j] is not None)

    def prefix(self, h: int) -> str:
        return f"head{h + 1}." if self.multi else ""


def read_ref(text: str) -> Ref:
    raw = yaml.load(text, Loader=yaml.BaseLoader)
    X = fmatrix(raw["X"])
    C = fmatrix(raw["context"]) if "context" in raw else X
    if "heads" in raw:
        heads = [(fmatrix(h["W_Q"]), fmatrix(h["W_K"]), fmatrix(h["W_V"])) for h in raw["heads"]]
        W_O, multi = fmatrix(raw["W_O"]), True
    else:
        heads = [(fmatrix(raw["W_Q"]), fmatrix(raw["W_K"]), fmatrix(raw["W_V"]))]
        W_O, multi = None, False
    scale_text = raw.get("scale", "auto")
    scale = scale_text if scale_text in ("auto", "none") else frac(scale_text)
    allowed = allowed_grid(raw.get("mask", "none"), len(X), len(C))
    bias = None
    if "bias" in raw:
        bias = [[None if x.strip() in NEG_INF_TEXT else frac(x) for x in row] for row in raw["bias"]]
    return Ref(X, C, heads, W_O, multi, scale, allowed, bias)


def _mpf(f: Fraction) -> mpmath.mpf:
    return mpmath.mpf(f.numerator) / f.denominator


def mp_reference(ref: Ref) -> dict[str, list[list]]:
    """Every head's A and O and the final O at 40 digits (max-subtracted softmax)."""
    out: dict[str, list[list]] = {}
    with mpmath.workdps(REF_DPS):
        outputs = []
        for h, (W_Q, W_K, W_V) in enumerate(ref.heads):
            Q, K, V = fmatmul(ref.X, W_Q), fmatmul(ref.C, W_K), fmatmul(ref.C, W_V)
            S = [[sum((q * k for q, k in zip(q_row, k_row)), Fraction(0)) for k_row in K] for q_row in Q]
            d_k = len(W_Q[0])
            if ref.scale == "auto":
                scale = 1 / mpmath.sqrt(d_k)
            elif ref.scale == "none":
                scale = mpmath.mpf(1)
            else:
                scale = _mpf(ref.scale)
            A = []
            for i in range(ref.n_q):
                z = [_mpf(S[i][j]) * scale + (_mpf(ref.bias[i][j]) if ref.bias is not None else 0)
                     if ref.usable(i, j) else None for j in range(ref.n_k)]
                m = max(x for x in z if x is not None)
                e = [mpmath.mpf(0) if x is None else mpmath.exp(x - m) for x in z]
                total = mpmath.fsum(e)
                A.append([x / total for x in e])
            Vm = [[_mpf(v) for v in row] for row in V]
            O = [[mpmath.fsum(A[i][k] * Vm[k][c] for k in range(ref.n_k)) for c in range(len(Vm[0]))]
                 for i in range(ref.n_q)]
            out[ref.prefix(h) + "A"] = A
            out[ref.prefix(h) + "O"] = O
            outputs.append(O)
        if ref.multi:
            concat = [sum((o[i] for o in outputs), []) for i in range(ref.n_q)]
            W_O = [[_mpf(w) for w in row] for row in ref.W_O]
            out["concat"] = concat
            out["O"] = [[mpmath.fsum(concat[i][k] * W_O[k][c] for k in range(len(W_O))) for c in range(len(W_O[0]))]
                        for i in range(ref.n_q)]
    return out


def torch_reference(ref: Ref):
    """A practitioner's float64 multi-head attention with SDPA, from the test's own float inputs."""
    torch = _torch
    F = torch.nn.functional

    def t(rows):
        return torch.tensor([[float(x) for x in row] for row in rows], dtype=torch.float64)

    attn_mask = torch.tensor(
        [[0.0 if ref.allowed[i][j] else float("-inf") for j in range(ref.n_k)] for i in range(ref.n_q)],
        dtype=torch.float64,
    )
    if ref.bias is not None:
        attn_mask = attn_mask + torch.tensor(
            [[float("-inf") if b is None else float(b) for b in row] for row in ref.bias], dtype=torch.float64
        )
    X, C = t(ref.X), t(ref.C)
    out = {}
    outputs = []
    with torch.no_grad():
        for h, (W_Q, W_K, W_V) in enumerate(ref.heads):
            Q, K, V = X @ t(W_Q), C @ t(W_K), C @ t(W_V)
            d_k = Q.shape[1]
            scale = {"auto": 1.0 / d_k**0.5, "none": 1.0}[ref.scale] if isinstance(ref.scale, str) else float(ref.scale)
            O = F.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=attn_mask, scale=scale)[0]
            out[ref.prefix(h) + "O"] = O.numpy()
            outputs.append(O)
        if ref.multi:
            out["O"] = (torch.cat(outputs, dim=1) @ t(ref.W_O)).numpy()
    return out


def assert_close(got, want, tol, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} rows, expected {len(want)}"
    for i, (g_row, w_row) in enumerate(zip(got, want)):
        assert len(g_row) == len(w_row), f"{what}[{i}]: {len(g_row)} entries, expected {len(w_row)}"
        for j, (g, w) in enumerate(zip(g_row, w_row)):
            g = mpmath.mpf(g) if not isinstance(g, mpmath.mpf) else g
            assert not mpmath.isnan(g) and not mpmath.isinf(g), f"{what}[{i}][{j}] = {g}"
            err = abs(g - w)
            assert err <= tol * max(1, abs(w)), (
                f"{what}[{i}][{j}]: got {mpmath.nstr(g, 30)}, expected {mpmath.nstr(w, 30)} "
                f"(|diff| = {mpmath.nstr(err, 5)})"
            )


def sympy_mpf(x: sympy.Expr) -> mpmath.mpf:
    """An exact SymPy entry evaluated by SymPy itself (not by symattn.evaluate)."""
    v = sympy.N(x, REF_DPS)
    assert v.is_number and v.is_real is not False, x
    return mpmath.mpf(str(v))


# ---------------------------------------------------------------------------
# 1. Random problems
# ---------------------------------------------------------------------------

N_RANDOM = 216
N_EMPTY_ROW = 24
MASK_KINDS = ["none", "causal", "causal-bottom-right", "sliding-window", "matrix-01", "matrix-bool"]


def _entries(rng: random.Random, r: int, c: int) -> list[list[Fraction]]:
    return [[Fraction(rng.randint(-3, 3), rng.choice([1, 1, 2, 3, 4])) for _ in range(c)] for _ in range(r)]


def _shapes(rng: random.Random, kind: str) -> tuple[int, int, bool]:
    n_q = rng.randint(1, 6)
    cross = rng.random() < 0.5
    n_k = rng.randint(1, 6) if cross else n_q
    if kind == "causal-bottom-right" and n_q > n_k:
        n_q, n_k = n_k, n_q  # n_q > n_k would leave row 0 empty (tested separately)
    return n_q, n_k, cross


def _mask(rng: random.Random, kind: str, n_q: int, n_k: int) -> str:
    if kind in ("none", "causal", "causal-bottom-right"):
        return kind
    if kind == "sliding-window":
        w = rng.randint(1, 4)
        # the last query i = n_q - 1 sees keys i - w < j ≤ min(i, n_k - 1): it needs w > n_q - n_k
        w = max(w, n_q - n_k + 1)
        return f"{{sliding-window: {w}}}"
    words = ("0", "1") if kind == "matrix-01" else ("false", "true")
    rows = []
    for _ in range(n_q):
        row = [rng.random() < 0.6 for _ in range(n_k)]
        if not any(row):
            row[rng.randrange(n_k)] = True
        rows.append(row)
    return "[" + ", ".join("[" + ", ".join(words[x] for x in row) + "]" for row in rows) + "]"


def random_problem(rng: random.Random, index: int) -> str:
    kind = MASK_KINDS[index % len(MASK_KINDS)]
    n_q, n_k, cross = _shapes(rng, kind)
    d_model = rng.randint(1, 5)
    lines = [f"title: random problem {index}", f"X: {yaml_matrix(_entries(rng, n_q, d_model))}"]
    if cross:
        lines.append(f"context: {yaml_matrix(_entries(rng, n_k, d_model))}")
    n_heads = rng.choice([0, 1, 1, 2, 2, 3, 3])  # 0: the top-level W_Q, W_K, W_V (one head, no W_O)
    if n_heads == 0:
        d_k, d_v = rng.randint(1, 5), rng.randint(1, 5)
        lines += [f"W_Q: {yaml_matrix(_entries(rng, d_model, d_k))}",
                  f"W_K: {yaml_matrix(_entries(rng, d_model, d_k))}",
                  f"W_V: {yaml_matrix(_entries(rng, d_model, d_v))}"]
    else:
        lines.append("heads:")
        width = 0
        for _ in range(n_heads):
            d_k, d_v = rng.randint(1, 5), rng.randint(1, 5)
            width += d_v
            lines += [f"  - W_Q: {yaml_matrix(_entries(rng, d_model, d_k))}",
                      f"    W_K: {yaml_matrix(_entries(rng, d_model, d_k))}",
                      f"    W_V: {yaml_matrix(_entries(rng, d_model, d_v))}"]
        lines.append(f"W_O: {yaml_matrix(_entries(rng, width, rng.randint(1, 4)))}")
    mask_text = _mask(rng, kind, n_q, n_k)
    lines.append(f"mask: {mask_text}")
    if rng.random() < 0.5:
        allowed = allowed_grid(yaml.load(mask_text, Loader=yaml.BaseLoader), n_q, n_k)
        bias = []
        for i in range(n_q):
            keep = rng.choice([j for j in range(n_k) if allowed[i][j]])  # stays allowed and finite
            bias.append([Fraction(rng.randint(-4, 4), rng.choice([1, 2, 3]))
                         if j == keep or rng.random() < 0.75 else rng.choice(["-inf", '"-inf"', "-.inf"])
                         for j in range(n_k)])
        lines.append(f"bias: {yaml_matrix(bias)}")
    lines.append("scale: " + rng.choice(["auto", "auto", "auto", "none", quoted(Fraction(rng.randint(1, 4), rng.randint(1, 3)))]))
    return "\n".join(lines) + "\n"


def empty_row_problem(rng: random.Random, index: int) -> tuple[str, int]:
    """A cross-attention problem with n_q > n_k whose mask leaves a row empty; and that row."""
    n_k = rng.randint(1, 5)
    n_q = rng.randint(n_k + 1, 6)
    d_model, d_k, d_v = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 3)
    if index % 2 == 0:
        mask, row = "causal-bottom-right", 0  # rows i < n_q - n_k see no key
    else:
        w = rng.randint(1, n_q - n_k)  # rows i ≥ n_k + w - 1 see no key
        mask, row = f"{{sliding-window: {w}}}", n_k + w - 1
    text = (
        f"X: {yaml_matrix(_entries(rng, n_q, d_model))}\n"
        f"context: {yaml_matrix(_entries(rng, n_k, d_model))}\n"
        f"W_Q: {yaml_matrix(_entries(rng, d_model, d_k))}\n"
        f"W_K: {yaml_matrix(_entries(rng, d_model, d_k))}\n"
        f"W_V: {yaml_matrix(_entries(rng, d_model, d_v))}\n"
        f"mask: {mask}\n"
    )
    if rng.random() < 0.5:
        text += f"bias: {yaml_matrix(_entries(rng, n_q, n_k))}\n"
    return text, row


_rng = random.Random(20250611)
RANDOM_PROBLEMS = [random_problem(_rng, i) for i in range(N_RANDOM)]
EMPTY_ROW_PROBLEMS = [empty_row_problem(_rng, i) for i in range(N_EMPTY_ROW)]


def mask_kind(text: str) -> str:
    line = next(l for l in text.splitlines() if l.startswith("mask: "))[len("mask: "):]
    if line.startswith("{sliding-window:"):
        return "sliding-window"
    if line.startswith("[["):
        return "matrix-bool" if "true" in line else "matrix-01"
    return line


def test_random_problems_cover_the_family():
    refs = [(t, read_ref(t)) for t in RANDOM_PROBLEMS]
    assert len(refs) >= 200
    kinds = [mask_kind(t) for t, _ in refs]
    for kind in MASK_KINDS:
        assert kinds.count(kind) >= 30, (kind, kinds.count(kind))
    assert sum(r.bias is not None for _, r in refs) >= 60
    assert sum(r.bias is not None and any(b is None for row in r.bias for b in row) for _, r in refs) >= 20
    assert sum("context:" in t for t, _ in refs) >= 60
    assert sum("context:" in t and r.n_q > r.n_k for t, r in refs) >= 15
    assert sum("context:" in t and r.n_q < r.n_k for t, r in refs) >= 15
    assert sum(r.n_q > r.n_k and mask_kind(t) == "causal" for t, r in refs) >= 3  # top-left causal, n_q > n_k
    for n in (1, 2, 3):
        assert sum(r.multi and len(r.heads) == n for _, r in refs) >= 20, n
    assert sum(not r.multi for _, r in refs) >= 20
    assert sum(r.multi and len({len(w[0][0]) for w in r.heads}) > 1 for _, r in refs) >= 20  # d_k differs
    assert sum(r.scale == "auto" for _, r in refs) >= 100
    # every problem keeps an allowed finite position in every row, by construction
    for _, r in refs:
        assert all(any(r.usable(i, j) for j in range(r.n_k)) for i in range(r.n_q))


@pytest.mark.parametrize("index", range(N_RANDOM))
def test_random_problem(index):
    text = RANDOM_PROBLEMS[index]
    ref = read_ref(text)
    d = symattn.derive(parse_problem(text, f"random_{index}.yaml"))
    want = mp_reference(ref)

    # ids: exactly the stages of the contract, in order
    expected_ids = ["X"] + (["context"] if "context:" in text else [])
    for h in range(len(ref.heads)):
        expected_ids += [ref.prefix(h) + s for s in STAGES_PER_HEAD]
    if ref.multi:
        expected_ids += ["concat", "W_O", "O"]
    assert list(d.ids) == expected_ids, text
    assert d.dims["heads"] == len(ref.heads) and d.dims["n_q"] == ref.n_q and d.dims["n_k"] == ref.n_k

    # every head's A and O, and the final O, against the test's own 40-digit reference
    with mpmath.workdps(REF_DPS):
        for stage, values in want.items():
            assert_close(d.evaluate(stage, 30), values, EXACT_TOL, f"{text}\nevaluate({stage!r}, 30)")
        # masked (or -inf-biased) positions have weight exactly 0
        for h in range(len(ref.heads)):
            A = d.step(ref.prefix(h) + "A").exact
            for i in range(ref.n_q):
                for j in range(ref.n_k):
                    if not ref.usable(i, j):
                        assert A[i, j] == 0 and A[i, j].is_zero, (ref.prefix(h) + "A", i, j, A[i, j])
        # now and then the exact expressions themselves, evaluated by SymPy
        if index % 12 == 0:
            for stage in want:
                if stage == "concat":
                    continue
                m = d.step(stage).exact
                got = [[sympy_mpf(m[i, j]) for j in range(m.cols)] for i in range(m.rows)]
                assert_close(got, want[stage], EXACT_TOL, f"{text}\nN({stage}.exact)")

    check = symattn.crosscheck(d)
    assert check.passed is True, f"{text}\n{[str(m) for m in check.mismatches]}"
    assert check.skipped is None

    if _torch is not None:
        theirs = torch_reference(ref)
        for stage, values in theirs.items():
            exact = d.evaluate(stage, 30)
            for i in range(ref.n_q):
                for j in range(values.shape[1]):
                    e = float(exact[i][j])
                    assert abs(e - values[i, j]) <= TORCH_TOL * max(1.0, abs(e)), (text, stage, i, j, e, values[i, j])
        if index % 4 == 0:
            with_torch = symattn.crosscheck(d, torch=True)
            assert with_torch.passed is True and with_torch.torch.passed is True, [str(m) for m in with_torch.all_mismatches]


@pytest.mark.parametrize("index", range(N_EMPTY_ROW))
def test_random_problem_with_an_empty_row_is_an_error_naming_the_row(index):
    text, row = EMPTY_ROW_PROBLEMS[index]
    ref = read_ref(text)
    assert ref.n_q > ref.n_k
    assert not any(ref.allowed[row]) and all(any(r) for r in ref.allowed[:row]), "the test's own expectation"
    with pytest.raises(SymattnError) as info:
        symattn.derive(parse_problem(text, "p.yaml"))
    message = str(info.value)
    assert message.startswith("p.yaml:6:7: mask: "), message  # `mask: ` is line 6; the value starts in column 7
    assert f"row {row + 1} with no key to attend to" in message, message
    assert "nan" not in message.lower()


def test_causal_top_left_with_more_queries_than_keys_never_leaves_a_row_empty():
    text = (
        "X: [[1, 0], [0, 1], [1, 1], [2, 0], [0, 2]]\ncontext: [[1, 2], [3, -1]]\n"
        'W_Q: [[1, 0], [0, 1]]\nW_K: [[1, "1/2"], [0, 1]]\nW_V: [[1], [2]]\nmask: causal\n'
    )
    ref = read_ref(text)
    d = symattn.derive(parse_problem(text, "p.yaml"))
    A = d.step("A").exact
    assert A[0, 0] == 1 and A[0, 1] == 0  # query 0 sees key 0 only
    with mpmath.workdps(REF_DPS):
        assert_close(d.evaluate("A", 30), mp_reference(ref)["A"], EXACT_TOL, "A")
    assert symattn.crosscheck(d).passed is True


# ---------------------------------------------------------------------------
# 2. Exactness: symbols, bias, heads
# ---------------------------------------------------------------------------

A_SYM = sympy.Symbol("a")
SYMBOLIC = "symbols: [a]\nQ: [[a, 1]]\nK: [[1, 0], [0, 1]]\nV: [[1], [0]]\nscale: none\n"


def test_symbol_gives_the_general_weight_formula():
    d = symattn.derive(parse_problem(SYMBOLIC, "p.yaml"))
    A, O = d.step("A").exact, d.step("O").exact
    a = A_SYM
    assert sympy.simplify(A[0, 0] - 1 / (1 + sympy.exp(1 - a))) == 0, A[0, 0]
    assert sympy.simplify(A[0, 1] - 1 / (1 + sympy.exp(a - 1))) == 0, A[0, 1]
    for i in range(A.rows):
        assert sympy.simplify(sum(A.row(i)) - 1) == 0, A.row(i)
    assert sympy.simplify(O[0, 0] - 1 / (1 + sympy.exp(1 - a))) == 0, O[0, 0]
    assert A.free_symbols == {a} and O.free_symbols == {a}
    assert d.step("S").exact == sympy.ImmutableMatrix([[a, 1]])
    for step in d.steps:
        assert not step.exact.atoms(sympy.Float), step.id


def test_symbol_with_values_is_cross_checked():
    d = symattn.derive(parse_problem(SYMBOLIC + "values: {a: 1/2}\n", "p.yaml"))
    assert d.step("A").exact.free_symbols == {A_SYM}, "values must not enter the derivation"
    check = symattn.crosscheck(d)
    assert check.passed is True and check.skipped is None
    with mpmath.workdps(REF_DPS):
        w = 1 / (1 + mpmath.exp(mpmath.mpf(1) / 2))
        assert_close(d.evaluate("A", 30), [[w, 1 - w]], EXACT_TOL, "A at a = 1/2")
        assert_close(d.evaluate("O", 30), [[w]], EXACT_TOL, "O at a = 1/2")
    if _torch is not None:
        with_torch = symattn.crosscheck(d, torch=True)
        assert with_torch.passed is True and with_torch.torch.passed is True


def test_symbol_without_values_skips_the_crosscheck():
    d = symattn.derive(parse_problem(SYMBOLIC, "p.yaml"))
    check = symattn.crosscheck(d)
    assert check.passed is None
    assert check.skipped and "values" in check.skipped
    with pytest.raises(SymattnError, match="values"):
        d.evaluate("A", 30)


@pytest.mark.parametrize("fmt", ["latex", "markdown", "text"])
def test_cli_symbol_without_values_prints_a_note_and_exits_0(symattn_cli, tmp_path, fmt):
    (tmp_path / "p.yaml").write_text(SYMBOLIC, "utf-8")
    r = symattn_cli("derive", "p.yaml", "--format", fmt, cwd=tmp_path)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exc_info
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith("Note:") and "values" in r.stderr, r.stderr
    assert "Error" not in r.stderr
    assert r.stdout.strip()


def test_cli_json_symbol_without_values_prints_a_note_and_exits_0(symattn_cli, tmp_path):
    (tmp_path / "p.yaml").write_text(SYMBOLIC, "utf-8")
    r = symattn_cli("derive", "p.yaml", "--format", "json", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith("Note:") and "Error" not in r.stderr, r.stderr
    data = json.loads(r.stdout)
    assert data["crosscheck"]["passed"] is None and data["crosscheck"].get("skipped")
    A = next(s for s in data["stages"] if s["id"] == "A")
    assert sympy.simplify(sympy.sympify(A["exact"][0][0]) - 1 / (1 + sympy.exp(1 - A_SYM))) == 0


SYM_RNG = random.Random(777)


def _symbolic_problem(rng: random.Random):
    """Entries ``p*a + q*b + r`` with the numbers they take at the values."""
    va, vb = Fraction(rng.randint(-3, 3), 2), Fraction(rng.randint(1, 3), 3)
    n_q, n_k, d_model = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2)

    def entries(r, c):
        text, value = [], []
        for i in range(r):
            t_row, v_row = [], []
            for j in range(c):
                p, q, s = rng.randint(-1, 1), rng.randint(-1, 1), Fraction(rng.randint(-2, 2), rng.choice([1, 2]))
                if i == j == 0:
                    p = 1  # every matrix holds a symbol
                t_row.append(f'"{p}*a + {q}*b + {s}"')
                v_row.append(str(p * va + q * vb + s))
            text.append("[" + ", ".join(t_row) + "]")
            value.append("[" + ", ".join(f'"{v}"' for v in v_row) + "]")
        return "[" + ", ".join(text) + "]", "[" + ", ".join(value) + "]"

    mats = {"X": entries(n_q, d_model), "context": entries(n_k, d_model), "W_Q": entries(d_model, 2),
            "W_K": entries(d_model, 2), "W_V": entries(d_model, 1)}
    mask = "causal-bottom-right" if n_q <= n_k else "causal"
    symbolic = "symbols: [a, b]\n" + "".join(f"{k}: {t}\n" for k, (t, _) in mats.items()) + f"mask: {mask}\n"
    numeric = "".join(f"{k}: {v}\n" for k, (_, v) in mats.items()) + f"mask: {mask}\n"
    return symbolic, f"values: {{a: {va}, b: {vb}}}\n", numeric


SYMBOLIC_PROBLEMS = [_symbolic_problem(SYM_RNG) for _ in range(6)]


@pytest.mark.parametrize("index", range(len(SYMBOLIC_PROBLEMS)))
def test_symbolic_problem_stays_symbolic_and_checks_at_its_values(index):
    symbolic, values, numeric = SYMBOLIC_PROBLEMS[index]
    d = symattn.derive(parse_problem(symbolic + values, "p.yaml"))
    assert d.step("X").exact.free_symbols, "entries with symbols must stay symbolic"
    assert d.step("O").exact.free_symbols <= {A_SYM, sympy.Symbol("b")}
    want = mp_reference(read_ref(numeric))
    with mpmath.workdps(REF_DPS):
        assert_close(d.evaluate("A", 30), want["A"], EXACT_TOL, "A at the values")
        assert_close(d.evaluate("O", 30), want["O"], EXACT_TOL, "O at the values")
    assert symattn.crosscheck(d).passed is True
    without = symattn.crosscheck(symattn.derive(parse_problem(symbolic, "p.yaml")))
    assert without.passed is None and without.skipped


BIAS = (
    "X: [[1, 0], [0, 1], [1, 1]]\n"                       # 1
    "context: [[1, 0], [0, 1], [1, 1], [2, -1]]\n"        # 2
    'W_Q: [[1, 0], [0, 1]]\nW_K: [[1, "1/2"], [0, 1]]\n'  # 3, 4
    "W_V: [[1, 0], [0, 1]]\n"                             # 5
    "mask: causal-bottom-right\n"                         # 6
    'bias: [["1/2", -inf, 3, 0], ["-inf", 0, 2, "-1/3"], [1, -.inf, -2, "5/4"]]\n'
    "scale: none\n"
)


def test_bias_is_added_to_the_mask_exactly():
    ref = read_ref(BIAS)
    d = symattn.derive(parse_problem(BIAS, "p.yaml"))
    M, Z, A = d.step("M").exact, d.step("S_masked").exact, d.step("A").exact
    S_scaled = d.step("S_scaled").exact
    for i in range(ref.n_q):
        for j in range(ref.n_k):
            b = ref.bias[i][j]
            if not ref.allowed[i][j] or b is None:
                assert M[i, j] == -sympy.oo and Z[i, j] == -sympy.oo, (i, j, M[i, j], Z[i, j])
                assert A[i, j] == 0 and A[i, j].is_zero, (i, j, A[i, j])
            else:
                assert M[i, j] == sympy.Rational(b.numerator, b.denominator), (i, j, M[i, j])
                assert Z[i, j] == S_scaled[i, j] + M[i, j]
                assert A[i, j].is_positive, (i, j, A[i, j])
    # a -inf in the bias at a position the mask allows gives weight exactly 0
    assert ref.allowed[0][1] and ref.bias[0][1] is None and A[0, 1] == 0
    assert ref.allowed[1][0] and ref.bias[1][0] is None and A[1, 0] == 0
    assert ref.allowed[2][1] and ref.bias[2][1] is None and A[2, 1] == 0
    assert not ref.allowed[0][3] and ref.bias[0][3] == 0 and M[0, 3] == -sympy.oo  # the mask wins over a finite bias
    for i in range(A.rows):
        assert sympy.simplify(sum(A.row(i)) - 1) == 0
    with mpmath.workdps(REF_DPS):
        want = mp_reference(ref)
        assert_close(d.evaluate("A", 30), want["A"], EXACT_TOL, "A")
        assert_close(d.evaluate("O", 30), want["O"], EXACT_TOL, "O")
    assert symattn.crosscheck(d).passed is True


def test_mask_and_bias_that_leave_a_row_empty_are_an_error_naming_the_row():
    text = (
        "Q: [[1, 0], [0, 1], [1, 1]]\n"
        "K: [[1, 0], [0, 1], [1, 1]]\n"
        "V: [[1], [2], [3]]\n"
        "mask: causal\n"
        "bias: [[0, 0, 0], [-inf, -inf, 0], [0, 0, 0]]\n"
    )
    # row 1 may attend to keys 0 and 1 (causal), and the bias sends both to -inf
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:5:7: bias: "), message
    assert "row 2 with no key" in message and "mask and bias" in message, message
    assert info.value.field == "bias" and info.value.line == 5 and info.value.col == 7


HEADS = (
    "X: [[1, 0, 1], [0, 2, 1]]\n"
    'context: [[1, 1, 0], [2, 0, "1/2"], [0, 3, 1]]\n'
    "heads:\n"
    '  - {W_Q: [[1, 0], [0, 1], [1, 1]], W_K: [[1, "1/2"], [0, 1], [1, 0]], W_V: [[1], [2], [0]]}\n'
    '  - {W_Q: [[1, 0, 1], [0, 0, 1], [1, 1, 0]], W_K: [[0, 1, 1], [1, 0, 0], [0, 0, 1]], W_V: [[1, 0], [0, 1], ["1/3", 1]]}\n'
    "W_O: [[1, 0], [2, 1], [0, -1]]\n"
    "mask: causal-bottom-right\n"
)


def test_heads_concat_and_output_projection_are_exact():
    d = symattn.derive(parse_problem(HEADS, "p.yaml"))
    O1, O2 = d.step("head1.O").exact, d.step("head2.O").exact
    assert O1.shape == (2, 1) and O2.shape == (2, 2)
    assert any(e.has(sympy.sqrt(2)) or e.has(sympy.sqrt(3)) for e in d.step("head1.S_scaled").exact)
    concat = d.step("concat").exact
    assert concat.shape == (2, 3)
    stacked = sympy.Matrix.hstack(O1, O2)
    for i in range(2):
        for j in range(3):
            assert sympy.simplify(concat[i, j] - stacked[i, j]) == 0, (i, j)
    W_O = d.step("W_O").exact
    assert W_O == sympy.ImmutableMatrix([[1, 0], [2, 1], [0, -1]])
    O = d.step("O").exact
    product = concat * W_O
    assert O.shape == (2, 2)
    for i in range(2):
        for j in range(2):
            assert sympy.simplify(O[i, j] - product[i, j]) == 0, (i, j)
    with mpmath.workdps(REF_DPS):
        want = mp_reference(read_ref(HEADS))
        for stage in ("head1.A", "head1.O", "head2.A", "head2.O", "concat", "O"):
            assert_close(d.evaluate(stage, 30), want[stage], EXACT_TOL, stage)
    assert d.dims["heads"] == 2 and d.dims["d_k"] == [2, 3] and d.dims["d_v"] == [1, 2]
    assert d.dims["n_q"] == 2 and d.dims["n_k"] == 3 and d.dims["d_model"] == 3


@pytest.mark.parametrize("with_context", [True, False], ids=["context", "self"])
def test_json_of_a_multi_head_problem_has_the_stage_ids_in_order(symattn_cli, tmp_path, with_context):
    text = HEADS if with_context else HEADS.replace(
        'context: [[1, 1, 0], [2, 0, "1/2"], [0, 3, 1]]\n', "").replace("causal-bottom-right", "causal")
    (tmp_path / "p.yaml").write_text(text, "utf-8")
    r = symattn_cli("derive", "p.yaml", "--format", "json", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    want = ["X"] + (["context"] if with_context else [])
    for h in (1, 2):
        want += [f"head{h}.{s}" for s in STAGES_PER_HEAD]
    want += ["concat", "W_O", "O"]
    assert [s["id"] for s in data["stages"]] == want
    assert data["dims"]["heads"] == 2
    assert data["dims"]["n_k"] == (3 if with_context else 2)
    assert data["crosscheck"]["passed"] is True
    shapes = {s["id"]: s["shape"] for s in data["stages"]}
    assert shapes["concat"] == [2, 3] and shapes["W_O"] == [3, 2] and shapes["O"] == [2, 2]
    assert shapes["head1.A"] == shapes["head2.A"] == [2, data["dims"]["n_k"]]
    # the exact strings read back (sympify) to the derivation's exact values
    d = symattn.derive(parse_problem(text, "p.yaml"))
    by_id = {s["id"]: s for s in data["stages"]}
    for stage in ("head1.A", "head2.O", "concat", "O"):
        m = d.step(stage).exact
        for i in range(m.rows):
            for j in range(m.cols):
                back = sympy.sympify(by_id[stage]["exact"][i][j])
                assert back == m[i, j] or sympy.simplify(back - m[i, j]) == 0, (stage, i, j)
                assert abs(by_id[stage]["approx"][i][j] - float(sympy.N(m[i, j], 20))) <= 1e-12 * max(1, abs(float(sympy.N(m[i, j]))))


# ---------------------------------------------------------------------------
# 3. Error messages (file:line:col counted by hand)
# ---------------------------------------------------------------------------

ERRORS = {
    # line 4 is `W_K: ...`; the key W_K starts in column 1
    "context-W_K-shape": (
        "X: [[1, 2, 3]]\n"
        "context: [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1], [2, 2, 2]]\n"
        "W_Q: [[1, 0], [0, 1], [1, 1]]\n"
        "W_K: [[1, 0], [0, 1]]\n"
        "W_V: [[1], [2], [3]]\n",
        "p.yaml:4:1: W_K: context is 5×3 but W_K is 2×2: context·W_K needs W_K to have 3 rows",
    ),
    # line 5 is `W_V: ...`: X·W_Q and context·W_K fit, context·W_V does not
    "context-W_V-shape": (
        "X: [[1, 2, 3]]\n"
        "context: [[1, 2, 3], [4, 5, 6]]\n"
        "W_Q: [[1, 0], [0, 1], [1, 1]]\n"
        "W_K: [[1, 0], [0, 1], [1, 1]]\n"
        "W_V: [[1], [2]]\n",
        "p.yaml:5:1: W_V: context is 2×3 but W_V is 2×1: context·W_V needs W_V to have 3 rows",
    ),
    # `  - {` is 5 characters: W_Q starts in column 6
    "head-W_Q-shape": (
        "X: [[1, 0]]\n"
        "heads:\n"
        "  - {W_Q: [[1], [0], [1]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "W_O: [[1]]\n",
        "p.yaml:3:6: head1.W_Q: X is 1×2 but head1.W_Q is 3×1: X·W_Q needs W_Q to have 2 rows",
    ),
    # `  - {W_Q: [[1, 0], [0, 1]], ` is 28 characters: W_K starts in column 29
    "head-d_k-mismatch": (
        "X: [[1, 0]]\n"
        "heads:\n"
        "  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "  - {W_Q: [[1, 0], [0, 1]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "W_O: [[1], [2]]\n",
        "p.yaml:4:29: head2.W_K: head2.W_Q is 2×2 but head2.W_K is 2×1: "
        "Q·Kᵀ needs W_Q and W_K to have the same number of columns (d_k)",
    ),
    "heads-without-W_O": (
        "X: [[1, 0]]\n"
        "heads: [{W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}]\n",
        "p.yaml:2:1: W_O: heads need W_O",
    ),
    "W_O-rows": (
        "X: [[1, 0]]\n"
        "heads:\n"
        "  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}\n"
        "  - {W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1, 0], [0, 1]]}\n"
        "W_O: [[1], [2]]\n",
        "p.yaml:5:1: W_O: the concatenated heads are 1×3 (1 + 2 value columns) but W_O is 2×1: "
        "concat·W_O needs W_O to have 3 rows",
    ),
    "top-level-W_Q-with-heads": (
        "X: [[1, 0]]\n"
        "W_Q: [[1], [0]]\n"
        "heads: [{W_Q: [[1], [0]], W_K: [[1], [1]], W_V: [[1], [0]]}]\n"
        "W_O: [[1]]\n",
        "p.yaml:2:1: ",
    ),
    # `heads: [{W_Q: [[1], [0]], ` is 26 characters: W_k starts in column 27
    "unknown-key-in-head": (
        "X: [[1, 0]]\n"
        "heads: [{W_Q: [[1], [0]], W_k: [[1], [1]], W_V: [[1], [0]]}]\n"
        "W_O: [[1]]\n",
        "p.yaml:2:27: heads item 1: unknown field 'W_k' in a head (did you mean 'W_K'?)",
    ),
    # `Q: [[` is 5 characters: a starts in column 6
    "undeclared-symbol": (
        "Q: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:1:6: Q row 1, column 1: 'a' is not a number or a declared symbol",
    ),
    # `W_K: [[1, 0], [` is 15 characters: the quoted entry starts in column 16
    "undeclared-symbol-in-expression": (
        "symbols: [a]\nX: [[1, 0]]\nW_Q: [[a], [1]]\n"
        'W_K: [[1, 0], ["2*b + 1", 1]]\n'
        "W_V: [[1], [0]]\n",
        "p.yaml:4:16: W_K row 2, column 1: '2*b + 1': 'b' is not a number or a declared symbol",
    ),
    # `symbols: [` is 10 characters: the name starts in column 11
    "symbol-named-sqrt": (
        "symbols: [sqrt]\nQ: [[1, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:1:11: symbols item 1: 'sqrt' is taken",
    ),
    "symbol-named-gamma": (
        "symbols: [b, gamma]\nQ: [[b, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:1:14: symbols item 2: 'gamma' is taken",
    ),
    # `values: {` is 9 characters: the key starts in column 10
    "values-undeclared": (
        "symbols: [alpha]\nvalues: {alpah: 1}\nQ: [[alpha, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:10: values: 'alpah' is not a declared symbol (declared: alpha) (did you mean 'alpha'?)",
    ),
    "values-without-symbols": (
        "values: {a: 1}\nQ: [[1, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:1:10: values: 'a' is not a declared symbol",
    ),
    # `values: {a: ` is 12 characters: the value starts in column 13
    "values-not-a-number": (
        "symbols: [a]\nvalues: {a: x}\nQ: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:13: values.a: 'x' is not a number",
    ),
    "values-a-list": (
        "symbols: [a]\nvalues: {a: [1]}\nQ: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:13: values.a: expected a number, not a list",
    ),
    "values-a-boolean": (
        "symbols: [a]\nvalues: {a: true}\nQ: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:13: values.a: 'true' is a boolean, not a number",
    ),
    "values-minus-inf": (
        "symbols: [a]\nvalues: {a: -inf}\nQ: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:13: values.a: '-inf'",
    ),
    "values-nan": (
        "symbols: [a]\nvalues: {a: .nan}\nQ: [[a, 1]]\nK: [[1, 0]]\nV: [[1]]\n",
        "p.yaml:2:13: values.a: '.nan'",
    ),
    # `bias: ` is 6 characters: the matrix starts in column 7
    "bias-shape": (
        "X: [[1, 0]]\ncontext: [[1, 0], [0, 1]]\nW_Q: [[1], [0]]\nW_K: [[1], [1]]\nW_V: [[1], [0]]\n"
        "bias: [[0, 0], [0, 0]]\n",
        "p.yaml:6:7: bias: bias is 2×2 but the scores are 1×2",
    ),
    "bias-plus-inf": (
        "Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nbias: [[0, inf]]\n",
        "p.yaml:4:12: bias row 1, column 2: 'inf'",
    ),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_message(name):
    text, expected = ERRORS[name]
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "p.yaml")
    message = str(info.value)
    assert message.startswith(expected), f"\n got: {message}\nwant: {expected}..."
    assert "\n" not in message and "Traceback" not in message


def test_shapes_are_checked_before_any_arithmetic(monkeypatch):
    """The shape error comes out of reading the problem; no product is ever attempted."""
    import symattn.exact.products as exact

    def forbidden(*args, **kwargs):
        raise AssertionError("arithmetic before the shapes were checked")

    monkeypatch.setattr(exact, "matmul", forbidden)
    text, expected = ERRORS["context-W_K-shape"]
    with pytest.raises(SymattnError) as info:
        symattn.derive(symattn.load_problem(text))
    assert "context is 5×3 but W_K is 2×2: context·W_K needs W_K to have 3 rows" in str(info.value)
    assert info.value.field == "W_K" and (info.value.line, info.value.col) == (4, 1)


def test_top_level_weights_with_heads_error_names_the_field():
    text, _ = ERRORS["top-level-W_Q-with-heads"]
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "p.yaml")
    assert str(info.value).startswith("p.yaml:2:1: W_Q: "), str(info.value)
    assert info.value.field == "W_Q"


def test_top_level_weights_with_heads_error_says_what_to_do():
    text, _ = ERRORS["top-level-W_Q-with-heads"]
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:2:1: ")
    assert "W_Q" in message and "heads" in message


def test_values_entry_naming_a_declared_symbol_has_a_true_message():
    text = "symbols: [a, b]\nvalues: {a: b, b: 1}\nQ: [[a, b]]\nK: [[1, 0]]\nV: [[1]]\n"
    with pytest.raises(SymattnError) as info:
        parse_problem(text, "p.yaml")
    message = str(info.value)
    assert message.startswith("p.yaml:2:13: values.a: "), message
    assert "not a declared symbol" not in message and "declare it" not in message, message


# ---------------------------------------------------------------------------
# 4. symattn derive --check torch
# ---------------------------------------------------------------------------


def test_there_are_worked_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_cli_check_torch_on_worked_example(symattn_cli, path, tmp_path):
    pytest.importorskip("torch")
    r = symattn_cli("derive", path, "--format", "json", "--check", "torch", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    check = json.loads(r.stdout)["crosscheck"]
    assert check["passed"] is True
    assert check["torch"]["passed"] is True, check["torch"]
    assert "torch" in check["torch"]["reference"]
    stages = check["torch"]["per_stage"]
    weights = "phi_Q" if "linear:" in path.read_text("utf-8") else "A"  # linear attention: no A, its features
    assert "O" in stages and any(s == weights or s.endswith("." + weights) for s in stages), stages


def test_cli_check_torch_on_multi_head_cross_attention(symattn_cli, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "p.yaml").write_text(BIAS.replace("scale: none\n", ""), "utf-8")
    (tmp_path / "h.yaml").write_text(HEADS, "utf-8")
    for name in ("p.yaml", "h.yaml"):
        r = symattn_cli("derive", name, "--format", "json", "--check", "torch", cwd=tmp_path)
        assert r.exit_code == 0, r.stderr
        check = json.loads(r.stdout)["crosscheck"]
        assert check["passed"] is True and check["torch"]["passed"] is True
    assert set(check["torch"]["per_stage"]) >= {"head1.A", "head1.O", "head2.A", "head2.O", "O"}


def test_cli_check_torch_without_torch_is_a_clear_error(symattn_cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(ImportError):
        import torch  # noqa: F401
    path = ROOT / "worked_examples" / "causal_4_tokens.yaml"
    r = symattn_cli("derive", path, "--format", "json", "--check", "torch", cwd=tmp_path)
    assert r.exit_code == 1, (r.exit_code, r.stderr, r.exc_info)
    assert r.stdout == ""
    assert r.stderr.startswith("Error: "), r.stderr
    assert "pip install 'symattn[torch]'" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    # the NumPy check alone still works without PyTorch
    r = symattn_cli("derive", path, "--format", "json", cwd=tmp_path)
    assert r.exit_code == 0 and json.loads(r.stdout)["crosscheck"]["passed"] is True
