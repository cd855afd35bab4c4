"""``symattn generate``: hand-friendly exercises from a seed.

Nothing here trusts the generator's own checks (``symattn.generate.exercises.niceness``).
Every generated file is read back as YAML text with ``yaml.safe_load`` and the
guarantees of its level, as documented in the docstring of
``symattn.generate``, are recomputed by hand with integer arithmetic and
``fractions.Fraction``:

========  ======================================================================
all       entries of X, context and the weights are integers in the range; Q, K,
          V and the scores are integers with |Q|, |K|, |V| ≤ PROJ and |S| ≤ SCORE;
          no row is fully masked; in each head some softmax row that has a
          choice is not uniform; no two variants of a batch are equal
easy      range 0..1, PROJ 4, SCORE 8; scaled scores are integers; at most two
          distinct exponents per softmax row
medium    range -1..1, PROJ 6, SCORE 16; scaled scores are integers, halves or
          thirds
hard      range -2..2, PROJ 12, SCORE 48; scaled scores exact
========  ======================================================================

Every generated problem must also load, derive and pass the numeric
cross-check. Option combinations the generator cannot honour must raise
``SymattnError`` (exit code 1 on the command line), never another exception.

Sections:
1. Hypothesis properties over seeds and options (library and command line);
2. reproducibility: ``-o`` twice, ``--count/--out-dir`` twice, index.csv, header;
3. ``--sheets``;
4. ``--from ... --vary weights|inputs``;
5. error messages and exit codes;
6. the benchmark script is not a test.

Tests marked ``xfail(strict=True)`` with a reason starting "BUG:" document
behaviour of the package believed to be wrong; they start failing (XPASS) when
it is fixed, so the marker can then be removed.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import symattn
import symattn.generate.exercises as gen
from symattn import SymattnError
from _child import CliResult, SymattnCli
from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
CAUSAL_4 = ROOT / "worked_examples" / "causal_4_tokens.yaml"

# The documented guarantees, typed in from the docstring (not read from the package).
RANGE = {"easy": (0, 1), "medium": (-1, 1), "hard": (-2, 2)}
PROJ = {"easy": 4, "medium": 6, "hard": 12}
SCORE = {"easy": 8, "medium": 16, "hard": 48}
DENOMINATORS = {"easy": {1}, "medium": {1, 2, 3}, "hard": None}

# The generator tries up to symattn.generate.exercises.MAX_TRIES candidates (200,000) before it
# gives up with a SymattnError. A few shapes (easy, two heads, 4-5 tokens, d_model 4)
# need hundreds of thousands of tries, i.e. many seconds. The property tests lower the
# limit so that the file runs in well under a minute; giving up is then the documented
# SymattnError ("no problem met ..."), which the tests accept and count as an event.
CAPPED_TRIES = 20_000

PROPERTY_SETTINGS = {"deadline": None, "database": None, "suppress_health_check": [HealthCheck.too_slow]}


def capped_tries():
    return mock.patch.object(gen, "MAX_TRIES", CAPPED_TRIES)


# --------------------------------------------------------------------------- helpers


@dataclass(frozen=True)
class Case:
    """One set of `symattn generate` options (and the seed)."""

    tokens: int
    d_model: int
    d_k: int
    d_v: int
    heads: int
    cross: int | None
    mask: str
    level: str
    scale: bool
    seed: int
    words: str | None = None

    @property
    def n_k(self) -> int:
        return self.cross if self.cross is not None else self.tokens

    def spec(self) -> gen.Spec:
        return gen.Spec(
            tokens=self.tokens, d_model=self.d_model, d_k=self.d_k, d_v=self.d_v, mask=self.mask, heads=self.heads,
            cross=self.cross, scale=self.scale, level=self.level,
            words=tuple(self.words.split()) if self.words else None,
        )

    def argv(self) -> list[str]:
        args = ["generate", "--tokens", str(self.tokens), "--d-model", str(self.d_model), "--d-k", str(self.d_k),
                "--d-v", str(self.d_v), "--heads", str(self.heads), "--mask", self.mask, "--level", self.level,
                "--seed", str(self.seed)]
        if self.cross is not None:
            args += ["--cross", str(self.cross)]
        if not self.scale:
            args.append("--no-scale")
        if self.words is not None:
            args += ["--words", self.words]
        return args

    def expected_mask(self) -> list[list[bool]]:
        """The allowed positions (query i, key j), from problem-format.md and the --mask help."""
        n_q, n_k = self.tokens, self.n_k
        kind, _, arg = self.mask.partition(":")
        if kind == "none":
            return [[True] * n_k for _ in range(n_q)]
        if kind == "causal":
            return [[j <= i for j in range(n_k)] for i in range(n_q)]
        if kind == "causal-bottom-right":
            return [[j <= i + (n_k - n_q) for j in range(n_k)] for i in range(n_q)]
        if kind == "sliding-window":
            w = int(arg)
            return [[j <= i and i - j < w for j in range(n_k)] for i in range(n_q)]
        if kind == "padding":  # the last P keys hidden
            p = int(arg)
            return [[j < n_k - p for j in range(n_k)] for _ in range(n_q)]
        raise AssertionError(self.mask)

    def leaves_a_row_empty(self) -> bool:
        return not all(any(row) for row in self.expected_mask())


@st.composite
def cases(draw, words: bool = False) -> Case:
    level = draw(st.sampled_from(["easy", "medium", "hard"]))
    scale = draw(st.booleans())
    tokens = draw(st.integers(1, 5))
    d_model = draw(st.integers(1, 4))
    # easy and medium need a perfect-square d_k when the scores are scaled
    d_k = draw(st.sampled_from([1, 4]) if scale and level != "hard" else st.integers(1, 4))
    d_v = draw(st.integers(1, 3))
    heads = draw(st.integers(1, 2))
    cross = draw(st.none() | st.integers(1, 5))
    n_k = cross if cross is not None else tokens
    kinds = ["none", "causal", "causal-bottom-right", "sliding-window"] + (["padding"] if n_k >= 2 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "sliding-window":
        mask = f"sliding-window:{draw(st.integers(1, 3))}"
    elif kind == "padding":
        mask = f"padding:{draw(st.integers(1, n_k - 1))}"
    else:
        mask = kind
    seed = draw(st.integers(0, 2**64))
    label = None
    if words:
        alphabet = st.sampled_from(list("abcxyzAZ09éß\"'\\:#{}[],&*!|>%@-?"))
        label = draw(st.none() | st.lists(st.text(alphabet, min_size=1, max_size=5), min_size=1, max_size=12).map(" ".join))
    return Case(tokens, d_model, d_k, d_v, heads, cross, mask, level, scale, seed, label)


def int_matrix(raw, name: str, rows: int, cols: int) -> list[list[int]]:
    assert isinstance(raw, list) and len(raw) == rows, f"{name}: expected {rows} rows, got {raw!r}"
    for row in raw:
        assert isinstance(row, list) and len(row) == cols, f"{name}: expected {cols} columns, got {row!r}"
        for v in row:
            assert type(v) is int, f"{name}: entry {v!r} is not a YAML integer"
    return raw


def matmul(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    return [[sum(a[i][t] * b[t][j] for t in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def transpose(a: list[list[int]]) -> list[list[int]]:
    return [list(col) for col in zip(*a)]


def mask_from_yaml(raw: dict, n_q: int, n_k: int) -> list[list[bool]]:
    m = raw.get("mask", "none")
    if m == "none":
        return [[True] * n_k for _ in range(n_q)]
    if m == "causal":
        return [[j <= i for j in range(n_k)] for i in range(n_q)]
    if m == "causal-bottom-right":
        return [[j <= i + n_k - n_q for j in range(n_k)] for i in range(n_q)]
    if isinstance(m, dict):
        assert list(m) == ["sliding-window"], m
        w = m["sliding-window"]
        assert type(w) is int and w >= 1, m
        return [[j <= i and i - j < w for j in range(n_k)] for i in range(n_q)]
    int_matrix(m, "mask", n_q, n_k)
    assert all(v in (0, 1) for row in m for v in row), m
    return [[v == 1 for v in row] for row in m]


def check_problem(text: str, case: Case, lo_hi: tuple[int, int] | None = None, derive: bool = True) -> dict:
    """Every documented guarantee of ``case.level``, recomputed from the YAML text; returns the YAML."""
    level = case.level
    lo, hi = lo_hi or RANGE[level]
    assert text.startswith("# Made by: symattn generate"), text.splitlines()[0]
    raw = yaml.safe_load(text)

    X = int_matrix(raw["X"], "X", case.tokens, case.d_model)
    if case.cross is not None:
        C = int_matrix(raw["context"], "context", case.cross, case.d_model)
        assert isinstance(raw["context_tokens"], list) and len(raw["context_tokens"]) == case.cross
    else:
        assert "context" not in raw and "context_tokens" not in raw
        C = X
    assert isinstance(raw["tokens"], list) and len(raw["tokens"]) == case.tokens
    assert all(isinstance(t, str) for t in raw["tokens"])
    if case.heads == 1:
        assert "heads" not in raw and "W_O" not in raw
        head_maps = [raw]
    else:
        assert "W_Q" not in raw and len(raw["heads"]) == case.heads
        head_maps = raw["heads"]
    heads = [
        (int_matrix(h["W_Q"], "W_Q", case.d_model, case.d_k), int_matrix(h["W_K"], "W_K", case.d_model, case.d_k),
         int_matrix(h["W_V"], "W_V", case.d_model, case.d_v))
        for h in head_maps
    ]
    extra = []
    if case.heads > 1:
        W_O = raw["W_O"]
        extra.append(int_matrix(W_O, "W_O", case.heads * case.d_v, len(W_O[0])))

    # entries within the range
    for name, m in [("X", X), ("context", C)] + [(f"W{k}", w) for h in heads for k, w in zip("QKV", h)] + [("W_O", w) for w in extra]:
        for row in m:
            for v in row:
                assert lo <= v <= hi, f"{name}: entry {v} outside {lo}..{hi}"

    # the mask: as asked for, and no row fully masked
    mask = mask_from_yaml(raw, case.tokens, case.n_k)
    assert mask == case.expected_mask()
    assert all(any(row) for row in mask), "a row is fully masked"
    assert raw.get("scale", "auto") == ("auto" if case.scale else "none")
    assert "bias" not in raw

    choice_rows = [i for i, row in enumerate(mask) if sum(row) > 1]
    for W_Q, W_K, W_V in heads:
        Q, K, V = matmul(X, W_Q), matmul(C, W_K), matmul(C, W_V)
        biggest = max(abs(v) for m in (Q, K, V) for row in m for v in row)
        assert biggest <= PROJ[level], f"|Q|,|K|,|V| reach {biggest} > {PROJ[level]}"
        S = matmul(Q, transpose(K))
        assert max(abs(v) for row in S for v in row) <= SCORE[level]
        root = math.isqrt(case.d_k)
        if not case.scale:
            scaled = [Fraction(s) for row in S for s in row]
        elif root * root == case.d_k:
            scaled = [Fraction(s, root) for row in S for s in row]
        else:
            assert level == "hard", "√d_k is irrational below level hard"
            scaled = None
        if DENOMINATORS[level] is not None:
            bad = [s for s in scaled if s.denominator not in DENOMINATORS[level]]
            assert not bad, f"scaled scores {bad} at level {level}"
        allowed = [{S[i][j] for j in range(case.n_k) if mask[i][j]} for i in range(case.tokens)]
        if level == "easy":
            assert all(len(a) <= 2 for a in allowed), f"more than two distinct exponents in a row: {allowed}"
        if choice_rows:
            assert any(len(allowed[i]) > 1 for i in choice_rows), "every softmax row of this head is uniform"

    if derive:
        d = symattn.derive(symattn.load_problem(text))
        result = symattn.crosscheck(d)
        assert result.passed, result
    return raw


def yaml_body(text: str) -> dict:
    """The problem without its comments and title: what makes two variants equal."""
    raw = yaml.safe_load(text)
    raw.pop("title", None)
    return raw


CLI = SymattnCli()  # the conftest's symattn_cli, for the helpers below


def invoke(args: list[str], **kwargs):
    result = CLI(*args, **kwargs)
    # click turns a ClickException/UsageError into SystemExit; anything else is a crash
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{type(result.exception).__name__}: {result.exception}"
    )
    assert "Traceback" not in result.output
    return result


def run_module(args: list[str], cwd: Path) -> CliResult:
    """The real entry point in a fresh process (so sys.argv is the command line)."""
    return CLI.entry(*args, cwd=cwd, how="python-m")


# --------------------------------------------------------------------------- 1. properties


@settings(max_examples=300, **PROPERTY_SETTINGS)
@given(case=cases())
@example(case=Case(5, 2, 4, 2, 1, 3, "causal-bottom-right", "easy", True, 0))  # rows 1 and 2 see no key
@example(case=Case(5, 2, 1, 1, 2, 2, "sliding-window:2", "hard", False, 3))  # row 5 sees no key
@example(case=Case(1, 1, 1, 1, 1, 1, "none", "easy", True, 0))  # one key: no row has a choice
def test_library_problems_meet_their_level(case: Case) -> None:
    spec = case.spec()
    event(f"mask {case.mask.partition(':')[0]}, {'cross' if case.cross else 'self'}-attention")
    with capped_tries():
        if case.leaves_a_row_empty():
            with pytest.raises(SymattnError, match="no key to attend"):
                gen.generate(spec, case.seed)
            event("rejected: a row has no key")
            return
        try:
            drawn = gen.generate(spec, case.seed)
        except SymattnError as exc:
            assert "no problem met" in str(exc), str(exc)
            event("gave up within the capped tries")
            return
    event(f"generated ({case.level})")
    text = gen.to_yaml(spec, drawn, "symattn generate (test)", f"seed {case.seed}")
    check_problem(text, case)
    # the same seed draws the same problem again
    with capped_tries():
        assert gen.generate(spec, case.seed).key() == drawn.key()


@settings(max_examples=50, **PROPERTY_SETTINGS)
@given(case=cases(words=True))
@example(case=Case(2, 2, 4, 2, 1, 1, "causal-bottom-right", "medium", True, 1))  # rejected: row 1 sees no key
def test_command_line_problems_meet_their_level(case: Case) -> None:
    with tempfile.TemporaryDirectory() as folder, capped_tries():
        out = Path(folder) / "p.yaml"
        result = invoke(case.argv() + ["-o", str(out)])
        if case.leaves_a_row_empty():
            assert result.exit_code == 1, result.output
            assert "no key to attend" in result.stderr
            assert not out.exists()
            return
        if result.exit_code == 1 and "no problem met" in result.stderr:
            event("gave up within the capped tries")
            return
        assert result.exit_code == 0, result.output
        text = out.read_text("utf-8")
    raw = check_problem(text, case)
    words = case.words.split() if case.words else list(gen.DEFAULT_WORDS)
    assert raw["tokens"] == [words[i] if i < len(words) else f"t{i + 1}" for i in range(case.tokens)]
    # the command line writes what the library draws (all but the header line)
    with capped_tries():
        drawn = gen.generate(case.spec(), case.seed)
    expected = gen.to_yaml(case.spec(), drawn, "x", f"Attention exercise (seed {case.seed})")
    assert text.splitlines()[1:] == expected.splitlines()[1:]


@st.composite
def doubtful_specs(draw) -> tuple[gen.Spec, str | None]:
    """Options that may be invalid, with the reason they must be rejected (None: may be accepted)."""
    def mostly(valid, invalid):  # one field in eight is drawn from the invalid values
        return draw(st.integers(0, 7).flatmap(lambda k: invalid if k == 0 else valid))

    level = mostly(st.sampled_from(["easy", "medium", "hard"]), st.sampled_from(["expert", "", "Easy"]))
    tokens = mostly(st.integers(1, 5), st.sampled_from([-1, 0, 17]))
    d_model = mostly(st.integers(1, 4), st.sampled_from([0, 17]))
    d_k = mostly(st.integers(1, 4), st.sampled_from([0, 9, 16, 17]))
    d_v = mostly(st.integers(1, 3), st.sampled_from([0, 17]))
    heads = mostly(st.integers(1, 2), st.sampled_from([0, 17]))
    cross = mostly(st.none() | st.integers(1, 5), st.sampled_from([-1, 0, 17]))
    scale = draw(st.booleans())
    kind = mostly(st.sampled_from(["none", "causal", "causal-bottom-right", "sliding-window", "padding"]),
                  st.sampled_from(["casual", "padd", "sliding", "", "window", "Causal", "none "]))
    arg = None
    # (an argument after none/causal/causal-bottom-right is silently ignored: a known bug, tested on its own)
    if kind in ("sliding-window", "padding") or (kind not in ("none", "causal", "causal-bottom-right")
                                                  and draw(st.integers(0, 3)) == 0):
        arg = mostly(st.integers(0, 6).map(str), st.sampled_from(["", "x", "-1", "1.5", "+1", " 2", "99"]))
    mask = kind if arg is None else f"{kind}:{arg}"
    rng = mostly(st.none() | st.tuples(st.integers(-3, 1), st.integers(0, 3)),
                 st.tuples(st.integers(-11, 11), st.integers(-11, 11)))
    spec = gen.Spec(tokens=tokens, d_model=d_model, d_k=d_k, d_v=d_v, mask=mask, heads=heads, cross=cross,
                    scale=scale, level=level, range=rng)

    reason = None
    if level not in RANGE:
        reason = "level"
    elif any(not 1 <= v <= 16 for v in (tokens, d_model, d_k, d_v, heads)) or (cross is not None and not 1 <= cross <= 16):
        reason = "size"
    elif rng is not None and (rng[0] > rng[1] or max(map(abs, rng)) > 9):
        reason = "range"
    elif scale and level != "hard" and math.isqrt(d_k) ** 2 != d_k:
        reason = "√d_k"
    else:
        n_k = cross if cross is not None else tokens
        ok_arg = arg is not None and arg.isascii() and arg.isdigit()
        valid_mask = (
            (kind in ("none", "causal", "causal-bottom-right") and arg is None)
            or (kind == "sliding-window" and ok_arg and int(arg) >= 1)
            or (kind == "padding" and ok_arg and 1 <= int(arg) < n_k)
        )
        if not valid_mask:
            reason = "mask"
        if reason is None:
            case = Case(tokens, d_model, d_k, d_v, heads, cross, mask, level, scale, 0)
            if case.leaves_a_row_empty():
                reason = "empty row"
    return spec, reason


@settings(max_examples=200, **PROPERTY_SETTINGS)
@given(data=doubtful_specs(), seed=st.integers(0, 2**32))
def test_rejected_options_raise_symattn_error(data, seed: int) -> None:
    """Any option combination either generates or raises SymattnError, never another exception."""
    spec, reason = data
    with mock.patch.object(gen, "MAX_TRIES", 2_000):
        try:
            drawn = gen.generate(spec, seed)
        except SymattnError as exc:
            event(f"SymattnError ({reason or 'gave up'})")
            if reason is None:
                assert "no problem met" in str(exc), str(exc)
            return
    event("generated")
    assert reason is None, f"options should have been rejected ({reason}): {spec}"
    case = Case(spec.tokens, spec.d_model, spec.d_k, spec.d_v, spec.heads, spec.cross, spec.mask, spec.level,
                spec.scale, seed)
    check_problem(gen.to_yaml(spec, drawn, "symattn generate (test)", "t"), case, lo_hi=spec.range, derive=False)


def test_causal_bottom_right_with_fewer_keys_than_queries_is_rejected() -> None:
    for cross in range(1, 5):
        with pytest.raises(SymattnError, match="query 1 with no key"):
            gen.generate(gen.Spec(tokens=5, cross=cross, mask="causal-bottom-right"), 0)
    result = invoke(["generate", "--tokens", "3", "--cross", "2", "--mask", "causal-bottom-right"])
    assert result.exit_code == 1 and "no key to attend" in result.stderr


@pytest.mark.parametrize("mask", ["causal:3", "none:abc", "causal-bottom-right:"])
def test_argument_of_a_mask_without_one_is_rejected(mask: str) -> None:
    with pytest.raises(SymattnError):
        gen.generate(gen.Spec(tokens=2, mask=mask), 0)


@pytest.mark.parametrize("mask", ["sliding-window:²", "padding:²"])
def test_superscript_digit_in_mask_is_a_symattn_error(mask: str) -> None:
    with pytest.raises(SymattnError):
        gen.generate(gen.Spec(mask=mask), 0)


def test_negative_seed_is_a_clear_error(capsys) -> None:
    code = main(["generate", "--seed", "-1"])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert "internal error" not in err


def test_negative_seed_library_raises_symattn_error() -> None:
    with pytest.raises(SymattnError):
        gen.generate(gen.Spec(), -1)


# --------------------------------------------------------------------------- 2. reproducibility


def test_same_seed_same_file_and_header(tmp_path: Path) -> None:
    args = ["--tokens", "3", "--d-model", "3", "--d-k", "4", "--d-v", "2", "--mask", "sliding-window:2",
            "--level", "medium", "--seed", "11", "-o", "p.yaml"]
    texts = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        proc = run_module(["generate", *args], tmp_path / name)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        texts.append((tmp_path / name / "p.yaml").read_bytes())
    assert texts[0] == texts[1]
    text = texts[0].decode("utf-8")
    assert text.splitlines()[0] == "# Made by: symattn generate " + " ".join(args)
    case = Case(3, 3, 4, 2, 1, None, "sliding-window:2", "medium", True, 11)
    check_problem(text, case)
    # writing the same file again (over the old one) gives the same bytes
    proc = run_module(["generate", *args], tmp_path / "first")
    assert proc.returncode == 0 and (tmp_path / "first" / "p.yaml").read_bytes() == texts[0]


def test_batch_is_reproducible_with_an_index(tmp_path: Path) -> None:
    args = ["generate", "--count", "5", "--out-dir", "D", "--seed", "7"]
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        proc = run_module(args, tmp_path / name)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
    first, second = tmp_path / "first" / "D", tmp_path / "second" / "D"
    names = sorted(p.name for p in first.iterdir())
    assert names == ["index.csv"] + [f"variant-{k:02d}.yaml" for k in range(1, 6)]
    assert sorted(p.name for p in second.iterdir()) == names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name

    with open(first / "index.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["variant"], r["seed"], r["file"]) for r in rows] == [
        (str(k), str(7 + k - 1), f"variant-{k:02d}.yaml") for k in range(1, 6)
    ]
    bodies = []
    default = Case(4, 4, 4, 4, 1, None, "causal", "easy", True, 0)
    for r in rows:
        text = (first / r["file"]).read_text("utf-8")
        header = text.splitlines()[0]
        assert header.startswith("# Made by: symattn generate --count 5 --out-dir D --seed 7"), header
        assert f"seed {r['seed']}" in header
        check_problem(text, default)
        bodies.append(yaml_body(text))
        # the seed in the index draws this variant again
        drawn = gen.generate(gen.Spec(), int(r["seed"]))
        assert yaml_body(gen.to_yaml(gen.Spec(), drawn, "x", "t")) == bodies[-1]
    assert all(a != b for i, a in enumerate(bodies) for b in bodies[i + 1:]), "two variants are equal"


def test_batch_variants_differ_even_when_seeds_collide(tmp_path: Path) -> None:
    """1 token, all sizes 1, entries 0..1: 16 possible problems, so seeds collide; all 16 must differ."""
    args = ["generate", "--tokens", "1", "--d-model", "1", "--d-k", "1", "--d-v", "1", "--mask", "none",
            "--count", "16", "--out-dir", str(tmp_path / "D")]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    bodies = [yaml_body((tmp_path / "D" / f"variant-{k:02d}.yaml").read_text("utf-8")) for k in range(1, 17)]
    keys = {repr(b) for b in bodies}
    assert len(keys) == 16
    case = Case(1, 1, 1, 1, 1, None, "none", "easy", True, 0)
    for k in range(1, 17):
        check_problem((tmp_path / "D" / f"variant-{k:02d}.yaml").read_text("utf-8"), case, derive=False)


def test_index_seed_reproduces_each_variant_even_after_a_collision(tmp_path: Path) -> None:
    opts = ["--tokens", "1", "--d-model", "1", "--d-k", "1", "--d-v", "1", "--mask", "none"]
    result = invoke(["generate", *opts, "--count", "16", "--out-dir", str(tmp_path / "D")])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "D" / "index.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        single = invoke(["generate", *opts, "--seed", r["seed"]])
        assert single.exit_code == 0
        assert yaml_body(single.stdout) == yaml_body((tmp_path / "D" / r["file"]).read_text("utf-8")), r


def test_header_records_the_options_when_run_in_process(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["host-program", "unrelated", "--flag"])
    out = tmp_path / "p.yaml"
    assert main(["generate", "--seed", "5", "--tokens", "3", "-o", str(out)]) == 0
    assert out.read_text("utf-8").splitlines()[0] == f"# Made by: symattn generate --seed 5 --tokens 3 -o {out}"


def test_header_with_a_group_option(tmp_path: Path) -> None:
    proc = run_module(["--debug", "generate", "--seed", "3", "-o", "p.yaml"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    header = (tmp_path / "p.yaml").read_text("utf-8").splitlines()[0]
    assert header in ("# Made by: symattn generate --seed 3 -o p.yaml",
                      "# Made by: symattn --debug generate --seed 3 -o p.yaml"), header


# --------------------------------------------------------------------------- 3. --sheets


def test_sheets_are_pdfs(tmp_path: Path) -> None:
    if shutil.which("pdflatex") is None:
        if os.environ.get("CI"):
            pytest.fail("pdflatex is missing on CI; --sheets cannot be tested")
        pytest.skip("pdflatex is not installed")
    result = invoke(["generate", "--count", "2", "--out-dir", str(tmp_path / "D"), "--sheets", "--seed", "3"])
    assert result.exit_code == 0, result.output
    for k in (1, 2):
        for kind in ("exercise", "solution"):
            pdf = tmp_path / "D" / f"variant-{k:02d}-{kind}.pdf"
            assert pdf.is_file(), sorted(p.name for p in (tmp_path / "D").iterdir())
            assert pdf.read_bytes().startswith(b"%PDF"), pdf
    assert (tmp_path / "D" / "index.csv").is_file()
    assert (tmp_path / "D" / "variant-01-exercise.pdf").read_bytes() != (tmp_path / "D" / "variant-01-solution.pdf").read_bytes()


@pytest.mark.parametrize("sheets", [None, "html", "pdf"])
def test_index_lists_every_file_of_the_batch(tmp_path: Path, sheets) -> None:
    """index.csv keeps variant, seed, file first and in order; with sheets each row also names its variant's
    exercise and solution sheet (relative paths), and every file of the folder is in it exactly once."""
    if sheets == "pdf" and shutil.which("pdflatex") is None and not os.environ.get("CI"):
        pytest.skip("pdflatex is not installed")
    folder = tmp_path / "D"
    result = invoke(["generate", "--count", "3", "--out-dir", str(folder), "--seed", "4",
                     *(["--sheets", sheets] if sheets else [])])
    assert result.exit_code == 0, result.output
    with open(folder / "index.csv", newline="", encoding="utf-8") as f:
        header, *rows = list(csv.reader(f))
    extra = ["exercise", "solution"] if sheets else []
    assert header == ["variant", "seed", "file", *extra]
    suffix = {"html": ".html", "pdf": ".pdf"}.get(sheets)
    listed = []
    for k, row in enumerate(rows, 1):
        assert row[:3] == [str(k), str(4 + k - 1), f"variant-{k:02d}.yaml"]
        assert row[3:] == [f"variant-{k:02d}-{part}{suffix}" for part in extra]
        listed += row[2:]
    on_disk = sorted(p.name for p in folder.iterdir() if p.name != "index.csv")
    assert sorted(listed) == on_disk and len(set(listed)) == len(listed)
    for name in listed[1:] if sheets else ():
        assert not Path(name).is_absolute() and (folder / name).stat().st_size > 0
    if sheets == "html":  # each names the right sheet: the exercise has empty boxes, the solution none
        for row in rows:
            assert 'class="box"' in (folder / row[3]).read_text("utf-8")
            assert 'class="box"' not in (folder / row[4]).read_text("utf-8")


# --------------------------------------------------------------------------- 4. --from


def weights_of(raw: dict) -> list:
    """The weight matrices of a problem file, in order (W_O last)."""
    if "heads" in raw:
        return [h[w] for h in raw["heads"] for w in ("W_Q", "W_K", "W_V")] + [raw["W_O"]]
    return [raw["W_Q"], raw["W_K"], raw["W_V"]]


def shapes(matrices: list) -> list[tuple[int, int]]:
    return [(len(m), len(m[0])) for m in matrices]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_from_vary_weights_keeps_inputs_tokens_and_mask(tmp_path: Path, seed: int) -> None:
    base = yaml.safe_load(CAUSAL_4.read_text("utf-8"))
    out = tmp_path / "v.yaml"
    result = invoke(["generate", "--from", str(CAUSAL_4), "--vary", "weights", "--seed", str(seed), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text("utf-8")
    raw = yaml.safe_load(text)
    assert raw["X"] == base["X"]
    assert raw["tokens"] == base["tokens"]
    assert raw["mask"] == base["mask"]
    assert raw.get("scale", "auto") == base.get("scale", "auto")
    assert shapes(weights_of(raw)) == shapes(weights_of(base))
    assert any(raw[w] != base[w] for w in ("W_Q", "W_K", "W_V")), "no weight matrix changed"
    d = symattn.derive(symattn.load_problem(text))
    assert symattn.crosscheck(d).passed


@pytest.mark.parametrize("flags", [["--tokens", "3"], ["--mask", "none"], ["--no-scale"], ["--d-k", "2", "--heads", "2"],
                                   ["--words", "a b c d"], ["--tokens", "4"]])
def test_from_refuses_the_shape_options_it_would_ignore(tmp_path: Path, flags: list) -> None:
    """--from keeps the problem's shape, mask, heads and words: a shape option beside it would be
    silently ignored (even one equal to the default, --tokens 4), so it is a usage error naming it."""
    out = tmp_path / "v.yaml"
    result = invoke(["generate", "--from", str(CAUSAL_4), "--seed", "1", *flags, "-o", str(out)])
    assert result.exit_code == 2, result.output
    named = [f for f in flags if f.startswith("--")]
    assert f"{', '.join(named)} cannot go with --from" in result.output
    assert not out.exists()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_from_vary_inputs_keeps_weights(tmp_path: Path, seed: int) -> None:
    base = yaml.safe_load(CAUSAL_4.read_text("utf-8"))
    out = tmp_path / "v.yaml"
    result = invoke(["generate", "--from", str(CAUSAL_4), "--vary", "inputs", "--seed", str(seed), "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text("utf-8")
    raw = yaml.safe_load(text)
    for w in ("W_Q", "W_K", "W_V"):
        assert raw[w] == base[w], w
    assert raw["X"] != base["X"]
    assert shapes([raw["X"]]) == shapes([base["X"]])
    assert raw["tokens"] == base["tokens"] and raw["mask"] == base["mask"]
    d = symattn.derive(symattn.load_problem(text))
    assert symattn.crosscheck(d).passed


TINY = """\
X: [[1, 0], [0, 1]]
W_Q: [[1], [0]]
W_K: [[0], [1]]
W_V: [[1], [1]]
mask: none
"""


def test_from_vary_weights_never_returns_the_base(tmp_path: Path) -> None:
    # only 24 weight triples of entries 0..1 meet the easy guarantees for this X, so a batch of 24 holds
    # every one of them, including the base's own weights, unless the base is excluded
    (tmp_path / "tiny.yaml").write_text(TINY, "utf-8")
    base = yaml.safe_load(TINY)
    result = invoke(["generate", "--from", str(tmp_path / "tiny.yaml"), "--vary", "weights", "--count", "24",
                     "--out-dir", str(tmp_path / "D")])
    if result.exit_code == 1:  # acceptable: fewer than 24 new variants exist
        assert "Error" in result.stderr
        return
    assert result.exit_code == 0, result.output
    for k in range(1, 25):
        raw = yaml.safe_load((tmp_path / "D" / f"variant-{k:02d}.yaml").read_text("utf-8"))
        assert weights_of(raw) != weights_of(base), f"variant {k} has the base's weights"


@pytest.mark.parametrize("field, value", [("scale", "1/2"), ("bias", "[[0, -1], [0, 0]]")])
def test_from_keeps_scale_and_bias(tmp_path: Path, field: str, value: str) -> None:
    (tmp_path / "b.yaml").write_text(TINY + f"{field}: {value}\n", "utf-8")
    out = tmp_path / "v.yaml"
    result = invoke(["generate", "--from", str(tmp_path / "b.yaml"), "--vary", "weights", "--seed", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    raw = yaml.safe_load(out.read_text("utf-8"))
    assert raw.get(field) == yaml.safe_load(f"{field}: {value}")[field]


def test_from_keeps_the_shape_of_W_O(tmp_path: Path) -> None:
    base_text = """\
X: [[1, 0], [0, 1]]
heads:
  - W_Q: [[1], [0]]
    W_K: [[0], [1]]
    W_V: [[1], [1]]
  - W_Q: [[0], [1]]
    W_K: [[1], [1]]
    W_V: [[1], [0]]
W_O: [[1, 0, 1], [0, 1, 1]]
mask: none
"""
    (tmp_path / "h.yaml").write_text(base_text, "utf-8")
    out = tmp_path / "v.yaml"
    result = invoke(["generate", "--from", str(tmp_path / "h.yaml"), "--vary", "weights", "--seed", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    raw = yaml.safe_load(out.read_text("utf-8"))
    assert shapes([raw["W_O"]]) == [(2, 3)]


# --------------------------------------------------------------------------- 5. errors


def run_main(args: list[str], capsys) -> tuple[int, str]:
    captured = CLI.main(*args)  # symattn.cli.main(args), its output captured
    code = captured.code
    text = captured.stdout + captured.stderr
    assert "Traceback" not in text
    assert "internal error" not in text
    return code, captured.stderr


def test_d_k_not_a_square_at_easy(capsys) -> None:
    code, err = run_main(["generate", "--d-k", "2"], capsys)
    assert code == 1
    assert "√2" in err and "--level hard" in err and "--no-scale" in err
    result = invoke(["generate", "--d-k", "2"])
    assert result.exit_code == 1 and "√2" in result.stderr
    # the two ways out that the message suggests both work
    assert invoke(["generate", "--d-k", "2", "--level", "hard", "--d-model", "2"]).exit_code == 0
    assert invoke(["generate", "--d-k", "2", "--no-scale", "--d-model", "2"]).exit_code == 0


def test_mask_typo_suggests_causal(capsys) -> None:
    code, err = run_main(["generate", "--mask", "casual"], capsys)
    assert code == 1
    assert "did you mean 'causal'" in err


def test_reversed_range(capsys) -> None:
    code, err = run_main(["generate", "--range", "5..1"], capsys)
    assert code == 1
    assert "5..1" in err


def test_count_without_out_dir(capsys) -> None:
    code, err = run_main(["generate", "--count", "3"], capsys)
    assert code == 2
    assert "--out-dir" in err
    assert invoke(["generate", "--count", "3"]).exit_code == 2


@pytest.mark.parametrize("args, code", [
    (["--mask", "padding:9"], 1),
    (["--mask", "sliding-window:0"], 1),
    (["--tokens", "0"], 1),
    (["--level", "expert"], 2),
    (["--range", "abc"], 2),
    (["--out-dir", "somewhere"], 2),
    (["-o", "no/such/folder/p.yaml"], 1),
])
def test_other_errors_have_a_message_and_no_traceback(args: list[str], code: int, capsys) -> None:
    got, err = run_main(["generate", *args], capsys)
    assert got == code
    assert "Error" in err


def test_error_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    proc = run_module(["generate", "--mask", "casual"], tmp_path)
    assert proc.returncode == 1
    assert "did you mean 'causal'" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


# --------------------------------------------------------------------------- 6. the benchmark


def test_benchmark_exists_and_is_not_collected() -> None:
    bench = ROOT / "benchmarks" / "bench_generate.py"
    assert bench.is_file()
    compile(bench.read_text("utf-8"), str(bench), "exec")  # valid Python; not run (it takes minutes)
    # pointed at explicitly, pytest finds no test in it ...
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "benchmarks"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 5, proc.stdout + proc.stderr  # 5: no tests collected
    # ... and the default run (testpaths of pyproject.toml) never reaches it
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--continue-on-collection-errors"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert "tests/test_generate_cli.py::" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not [line for line in proc.stdout.splitlines() if line.startswith("benchmarks")]
