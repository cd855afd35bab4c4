"""``symattn generate --block``: whole-block exercises, held to the guarantees its --help states.

Nothing here trusts the generator's own checks (``symattn.generate.block``). Each problem is made by
the command line, read back with ``yaml.safe_load`` (halves are exact in binary, so the floats YAML
gives are the numbers written), and the block is recomputed here by hand: exactly with
``fractions.Fraction`` at easy and medium (the attention uniform, every stage up to the logits a
fraction), in NumPy float64 at hard. The guarantees, typed in from ``symattn generate --help``:

========  ==============================================================================
all       the MLP's and W_U's weights in the range (0..1, -1..1, -2..2), integers at easy,
          integers and halves at medium and hard; no MLP pre-activation 0 (at hard none
          within 0.1 of 0), ReLU cuts some and passes some; the MLP's output not 0; no
          row of logits constant; |U| ≤ 6, 8, 16 and |logits| ≤ 10, 16, 32; a vocabulary
          of 4 to 6 words holding the tokens' words, each row's target the next word
easy,     the attention uniform (each weight 1/k) and every stage from H to the logits a
medium    fraction with denominators at most 12 (easy) or 24 (medium)
hard      the attention not uniform
========  ==============================================================================

Then the derivation, in every format through the command line, must agree with the hand values
(the JSON's exact entries at easy and medium, its decimals at hard), and ``symattn check`` must
mark the hand values right and a slip wrong.
"""

from __future__ import annotations

import csv
import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import yaml

import symattn

RANGE = {"easy": (0, 1), "medium": (-1, 1), "hard": (-2, 2)}
STEP = {"easy": Fraction(1), "medium": Fraction(1, 2), "hard": Fraction(1, 2)}
U_BOUND = {"easy": 6, "medium": 8, "hard": 16}
Z_BOUND = {"easy": 10, "medium": 16, "hard": 32}
DENOMINATOR = {"easy": 12, "medium": 24}
FORMATS = ("latex", "markdown", "text", "json", "html")
DEFAULT_SENTENCE = "the cat sat on a warm mat".split()


def _fractions(rows) -> np.ndarray:
    """A YAML matrix (or one row) as Fractions, exactly (YAML's floats here are halves)."""
    rows = rows if isinstance(rows[0], list) else [rows]
    return np.array([[Fraction(v) for v in row] for row in rows], dtype=object)


def _norm(x: np.ndarray, kind: str, gamma, beta, exact: bool) -> np.ndarray:
    """A LayerNorm or RMSNorm of each row with ε = 0, by hand."""
    d = x.shape[1]
    centred = x - x.sum(axis=1, keepdims=True) / d if kind == "layernorm" else x
    spread = (centred * centred).sum(axis=1, keepdims=True) / d
    if exact:
        roots = []
        for (v,) in spread:
            n, m = math.isqrt(v.numerator), math.isqrt(v.denominator)
            assert v > 0 and n * n == v.numerator and m * m == v.denominator, f"√{v} is not a fraction"
            roots.append([Fraction(n, m)])
        root = np.array(roots, dtype=object)
    else:
        root = np.sqrt(spread.astype(float))
    out = centred / root * gamma
    return out + beta if beta is not None else out


class Block:
    """One generated block, recomputed by hand from its problem file."""

    def __init__(self, text: str, level: str) -> None:
        self.raw = raw = yaml.safe_load(text)
        self.level, self.exact = level, level != "hard"
        self.mask = self._mask(raw, len(raw["tokens"]))
        X = _fractions(raw["X"])
        norm = raw["norm"]
        assert norm["eps"] == 0
        beta = _fractions(norm["bias"]) if "bias" in norm else None
        self.X_norm = _norm(X, norm["type"], _fractions(norm["weight"]), beta, True)
        assert all(x.denominator == 1 for x in self.X_norm.ravel()), "X_norm is whole"
        heads = raw["heads"] if "heads" in raw else [raw]
        self.S, outputs = [], []
        for h in heads:
            Q, K, V = (self.X_norm.dot(_fractions(h[w])) for w in ("W_Q", "W_K", "W_V"))
            S = Q.dot(K.T)
            self.S.append(S)
            outputs.append(self._attend(S, V, Q.shape[1], raw.get("scale") != "none"))
        O = np.concatenate(outputs, axis=1)
        if "W_O" in raw:
            O = O.dot(_fractions(raw["W_O"]) if self.exact else np.array(raw["W_O"], dtype=float))
        self.H = X + O if self.exact else X.astype(float) + O
        mlp = raw["mlp"]
        self.weights = {name: _fractions(mlp[name]) for name in ("W_1", "b_1", "W_2", "b_2")}
        self.weights["W_U"] = _fractions(raw["logits"]["W_U"])
        w = self.weights if self.exact else {k: v.astype(float) for k, v in self.weights.items()}
        mn = mlp["norm"]
        assert mn["eps"] == 0 and mn["type"] == norm["type"]
        self.H_norm = _norm(self.H, mn["type"], _fractions(mn["weight"]), _fractions(mn["bias"]) if "bias" in mn else None,
                            self.exact)
        if not self.exact:
            self.H_norm = self.H_norm.astype(float)
        self.U = self.H_norm.dot(w["W_1"]) + w["b_1"]
        power = 2 if mlp["activation"] == "relu2" else 1
        self.G = np.where(self.U > 0, self.U, 0) ** power
        self.F = self.G.dot(w["W_2"]) + w["b_2"]
        self.Y = self.H + self.F
        self.last = raw["logits"]["rows"] == "last"
        self.z = (self.Y[-1:] if self.last else self.Y).dot(w["W_U"])
        vocab = raw["logits"]["vocab"]
        self.targets = [vocab.index(t) for t in raw["loss"]["targets"]]
        z = self.z.astype(float)
        logsum = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1)) + z.max(axis=1)
        self.nll = logsum - z[np.arange(len(self.targets)), self.targets]
        self.P = np.exp(z - logsum[:, None])

    @staticmethod
    def _mask(raw, n: int) -> np.ndarray:
        m = raw["mask"]
        if m == "causal":
            return np.array([[j <= i for j in range(n)] for i in range(n)])
        if m == "none":
            return np.ones((n, n), dtype=bool)
        return np.array(m, dtype=bool)  # the padding masks, as a matrix

    def _attend(self, S, V, d_k: int, scale: bool):
        if self.exact:  # uniform: every visible score of a row is the same, each weight 1/k
            for i, row in enumerate(S):
                assert len({s for s, ok in zip(row, self.mask[i]) if ok}) == 1, f"row {i + 1} of S is not uniform"
            A = np.array([[Fraction(int(ok), int(sum(m))) for ok in m] for m in self.mask], dtype=object)
            return A.dot(V)
        s = S.astype(float) / (math.sqrt(d_k) if scale else 1)
        s = np.where(self.mask, s, -np.inf)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).dot(V.astype(float))

    def stages(self) -> dict:
        return {"H": self.H, "H_norm": self.H_norm, "U": self.U, "G": self.G, "F": self.F, "Y": self.Y,
                "logits": self.z}


def check_guarantees(b: Block, tokens: int, words: list[str]) -> None:
    """Every guarantee of ``b.level`` from the table above, from the hand values."""
    level, raw = b.level, b.raw
    lo, hi = RANGE[level]
    for name, m in b.weights.items():
        for x in m.ravel():
            assert lo <= x <= hi and (x / STEP[level]).denominator == 1, f"{name}: {x} at {level}"
    U = b.U.astype(float)
    assert (abs(U) > (0 if b.exact else 0.1)).all(), "a pre-activation is 0 (or within 0.1 of it at hard)"
    assert (U < 0).any() and (U > 0).any(), "ReLU cuts none or every pre-activation"
    assert abs(U).max() <= U_BOUND[level] and abs(b.z.astype(float)).max() <= Z_BOUND[level]
    assert (b.F != 0).any()
    assert all(len(set(row)) > 1 for row in b.z.tolist()), "a row of logits is constant"
    if b.exact:
        for name, m in b.stages().items():
            assert max(Fraction(x).denominator for x in m.ravel()) <= DENOMINATOR[level], name
    else:
        assert any(len({s for s, ok in zip(row, b.mask[i]) if ok}) > 1 for S in b.S for i, row in enumerate(S)), \
            "the attention is uniform at hard"
    vocab = raw["logits"]["vocab"]
    assert 4 <= len(vocab) <= 6 and len(set(vocab)) == len(vocab)
    assert raw["tokens"] == words[:tokens] and set(raw["tokens"]) <= set(vocab)
    targets = raw["loss"]["targets"]
    nxt = words[tokens]
    assert targets == ([nxt] if b.last else words[1:tokens] + [nxt])
    assert nxt in vocab


def _derive_json(symattn_cli, path: Path) -> dict:
    r = symattn_cli.main("derive", path, "-f", "json")
    assert r.code == 0, r.stderr
    return {s["id"]: s for s in json.loads(r.stdout)["stages"]}


def check_derivation(b: Block, stages: dict) -> None:
    """The derivation's values are the hand values: exactly up to the logits at easy and medium."""
    for name, mine in b.stages().items():
        stage = stages[name]
        if b.exact:
            assert stage["exact"] is not None, f"{name} is not exact"
            assert [[Fraction(x) for x in row] for row in stage["exact"]] == mine.tolist(), name
        np.testing.assert_allclose(np.array(stage["approx"], dtype=float), mine.astype(float), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
    if b.exact:  # the attention's weights are 1/k over the visible keys, written as fractions
        weights = [s["exact"] for sid, s in stages.items() if sid.split(".")[-1] == "A"]
        assert len(weights) == len(b.S)
        for A in weights:
            assert [[Fraction(x) for x in row] for row in A] == [[Fraction(int(ok), int(sum(m))) for ok in m]
                                                                 for m in b.mask]
    else:
        assert stages["U"]["exact"] is None or stages["logits"]["exact"] is None  # certified decimals past H
    np.testing.assert_allclose(np.array(stages["P"]["approx"]), b.P, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(np.array(stages["nll"]["approx"])[:, 0], b.nll, rtol=1e-12)
    assert math.isclose(stages["L"]["approx"][0][0], b.nll.mean(), rel_tol=1e-12)


CASES = [  # (level, seed, extra options)
    ("easy", 0, []), ("easy", 1, ["--tokens", "3"]), ("easy", 2, ["--norm", "rmsnorm", "--rows", "all"]),
    ("medium", 0, []), ("medium", 3, ["--activation", "relu2", "--d-ff", "2"]),
    ("medium", 5, ["--rows", "all", "--tokens", "3", "--mask", "none"]),
    ("hard", 0, []), ("hard", 4, ["--norm", "rmsnorm", "--d-ff", "4"]), ("hard", 7, ["--rows", "all", "--no-scale"]),
    ("easy", 6, ["--heads", "2", "--d-k", "1", "--d-v", "2", "--tokens", "3"]),
]


@pytest.mark.parametrize("level, seed, extra", CASES, ids=[f"{lv}-{s}-{' '.join(e)}" for lv, s, e in CASES])
def test_block_exercises_meet_their_level_and_derive(tmp_path, symattn_cli, level, seed, extra):
    path = tmp_path / "p.yaml"
    r = symattn_cli.main("generate", "--block", "--level", level, "--seed", str(seed), *extra, "-o", path)
    assert r.code == 0, r.stderr
    text = path.read_text("utf-8")
    assert text.startswith("# Made by: symattn generate --block") and "Transformer block exercise" in text
    tokens = int(extra[extra.index("--tokens") + 1]) if "--tokens" in extra else 4
    b = Block(text, level)
    check_guarantees(b, tokens, DEFAULT_SENTENCE)
    check_derivation(b, _derive_json(symattn_cli, path))
    for fmt in FORMATS:
        r = symattn_cli.main("derive", path, "-f", fmt, "-o", tmp_path / f"out.{fmt}")
        assert r.code == 0 and "Error" not in r.stderr, (fmt, r.stderr)
        out = (tmp_path / f"out.{fmt}").read_text("utf-8")
        assert ('"id": "L"' if fmt == "json" else "The cross-entropy loss") in out, fmt
    # the same seed gives the same bytes
    again = path.read_bytes()
    r = symattn_cli.main("generate", "--block", "--level", level, "--seed", str(seed), *extra, "-o", path)
    assert r.code == 0 and path.read_bytes() == again


def _answers(b: Block) -> dict:
    def written(m):
        return [[str(Fraction(x)) if b.exact else f"{float(x):.6f}" for x in row] for row in m.tolist()]

    return {**{name: written(m) for name, m in b.stages().items()}, "L": [[f"{b.nll.mean():.6f}"]]}


@pytest.mark.parametrize("level, seed", [("easy", 0), ("medium", 1), ("hard", 2)])
def test_check_marks_the_hand_values_right_and_a_slip_wrong(tmp_path, symattn_cli, level, seed):
    path = tmp_path / "p.yaml"
    assert symattn_cli.main("generate", "--block", "--level", level, "--seed", str(seed), "-o", path).code == 0
    b = Block(path.read_text("utf-8"), level)
    answers = _answers(b)
    (tmp_path / "right.yaml").write_text(yaml.safe_dump(answers), "utf-8")
    r = symattn_cli.main("check", path, tmp_path / "right.yaml", "--format", "json")
    assert r.code == 0, r.stdout
    marked = {s["id"]: s["status"] for s in json.loads(r.stdout)["stages"]}
    assert set(marked) == set(answers) and set(marked.values()) == {"right"}, marked
    # the bias b_1 left out of U: U marked wrong, and G (from the right U) right still
    slipped = b.H_norm.dot(b.weights["W_1"] if b.exact else b.weights["W_1"].astype(float))
    answers["U"] = [[str(Fraction(x)) if b.exact else f"{float(x):.6f}" for x in row] for row in slipped.tolist()]
    (tmp_path / "slip.yaml").write_text(yaml.safe_dump(answers), "utf-8")
    r = symattn_cli.main("check", path, tmp_path / "slip.yaml", "--format", "json")
    marked = {s["id"]: s for s in json.loads(r.stdout)["stages"]}
    assert r.code == 1 and marked["U"]["status"] == "wrong", marked["U"]


def test_the_words_the_vocabulary_and_the_targets(tmp_path, symattn_cli):
    """--words gives the tokens and the next word; --vocab the vocabulary; rows all: one target a row."""
    path = tmp_path / "p.yaml"
    r = symattn_cli.main("generate", "--block", "--tokens", "5", "--words", "the cat sat on the mat", "--rows", "all",
                         "-o", path)
    assert r.code == 0, r.stderr
    raw = yaml.safe_load(path.read_text("utf-8"))
    assert raw["tokens"] == ["the", "cat", "sat", "on", "the"]
    assert raw["logits"]["vocab"] == ["the", "cat", "sat", "on", "mat"]  # the different words, in order
    assert raw["loss"]["targets"] == ["cat", "sat", "on", "the", "mat"]
    r = symattn_cli.main("generate", "--block", "--tokens", "3", "--words", "I like cats", "--vocab",
                         "I like cats dogs fish", "-o", path)
    assert r.code == 0, r.stderr
    raw = yaml.safe_load(path.read_text("utf-8"))
    assert raw["logits"]["vocab"] == ["I", "like", "cats", "dogs", "fish"]
    assert raw["loss"]["targets"] == ["dogs"]  # --words has no 4th word: the first of --vocab that is not a token
    d = symattn.derive(symattn.load_problem(path))
    assert d.problem.loss.targets == (3,) and d.problem.logits.vocab == ("I", "like", "cats", "dogs", "fish")
    # two tokens: the vocabulary is filled up to 4 words from the default sentence
    r = symattn_cli.main("generate", "--block", "--tokens", "2", "-o", path)
    assert r.code == 0, r.stderr
    assert yaml.safe_load(path.read_text("utf-8"))["logits"]["vocab"] == ["the", "cat", "sat", "on"]


@pytest.mark.parametrize("args, code, fragment", [
    (["--cross", "2"], 1, "--block cannot go with --cross"),
    (["--activation", "gelu"], 1, "--activation gelu is not for a hand exercise: GELU's Φ (erf) is not a fraction"),
    (["--activation", "silu"], 1, "SiLU's e^(−u) is not a fraction"),
    (["--activation", "swish"], 2, "Invalid value for '--activation'"),
    (["--d-ff", "9"], 1, "--d-ff must be from 1 to 8"),
    (["--vocab", "the cat sat"], 1, "--vocab needs every word of the sentence"),
    (["--vocab", "the cat sat on a a"], 1, "--vocab names 'a' twice"),
    (["--tokens", "3", "--vocab", "the cat sat on a b c"], 1, "--vocab has 7 words; a hand exercise's vocabulary has 4 to 6"),
    (["--tokens", "6"], 1, "more than the 6 of a hand exercise; use fewer --tokens or repeat words in --words"),
    (["--d-v", "2"], 1, "--block adds the attention's output to X"),
    (["--d-model", "3", "--d-v", "3"], 1, "--norm layernorm needs an even --d-model"),
    (["--rows", "first"], 2, "Invalid value for '--rows'"),
])
def test_block_refusals(symattn_cli, args, code, fragment):
    r = symattn_cli.main("generate", "--block", *args)
    assert r.code == code and fragment in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    if code == 1:
        assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("args", [["--d-ff", "2"], ["--activation", "relu2"], ["--vocab", "a b c d"], ["--rows", "all"]])
def test_the_block_options_go_with_block(symattn_cli, args):
    r = symattn_cli.main("generate", *args)
    assert r.code == 2 and f"{args[0]} goes with --block" in r.stderr, r.stderr


def test_block_with_from_is_refused(symattn_cli):
    base = Path(__file__).resolve().parent.parent / "worked_examples" / "causal_4_tokens.yaml"
    r = symattn_cli.main("generate", "--from", base, "--block")
    assert r.code == 2 and "--block cannot go with --from" in r.stderr, r.stderr
    block = base.with_name("block_by_hand.yaml")
    r = symattn_cli.main("generate", "--from", block)
    assert r.code == 1 and "does not vary problems with an MLP or logits" in r.stderr, r.stderr


@pytest.mark.parametrize("sheets", ["html", "pdf"])
def test_a_batch_of_blocks_with_sheets_is_reproducible(tmp_path, symattn_cli, sheets):
    for folder in ("a", "b"):  # the same command (its header names --out-dir) in two folders
        (tmp_path / folder).mkdir()
        r = symattn_cli.main("generate", "--block", "--count", "3", "--seed", "4", "--level", "medium", "--out-dir",
                             "out", "--sheets", sheets, cwd=tmp_path / folder)
        assert r.code == 0, r.stderr
        (tmp_path / folder / "out").rename(tmp_path / f"{folder}-out")
    for folder in ("a", "b"):
        (tmp_path / folder).rmdir()
        (tmp_path / f"{folder}-out").rename(tmp_path / folder)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 3 + 1 + 6 and names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        if name.endswith((".yaml", ".csv", ".html", ".tex")):  # a PDF carries its date
            assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    rows = list(csv.DictReader((tmp_path / "a" / "index.csv").open()))
    bodies = []
    for row in rows:
        text = (tmp_path / "a" / row["file"]).read_text("utf-8")
        b = Block(text, "medium")
        check_guarantees(b, 4, DEFAULT_SENTENCE)
        raw = dict(b.raw)
        raw.pop("title")
        bodies.append(json.dumps(raw, sort_keys=True))
        # each variant is what its seed gives alone
        r = symattn_cli.main("generate", "--block", "--seed", row["seed"], "--level", "medium")
        assert r.stdout.splitlines()[3:] == text.splitlines()[3:]
    assert len(set(bodies)) == 3
    sheet = (tmp_path / "a" / f"variant-01-solution.{'html' if sheets == 'html' else 'pdf'}")
    if sheet.exists() and sheets == "html":
        assert "The cross-entropy loss" in sheet.read_text("utf-8")


def test_the_library_writes_what_the_command_line_writes(tmp_path, symattn_cli):
    r = symattn_cli.main("generate", "--block", "--seed", "9", "--level", "medium", "--rows", "all", "--d-ff", "2",
                         "--words", "I like green cats", "-o", tmp_path / "p.yaml")
    assert r.code == 0, r.stderr
    (p,) = symattn.generate(seed=9, level="medium", block=True, rows="all", d_ff=2, words="I like green cats",
                            command="symattn generate --block --seed 9 --level medium --rows all --d-ff 2 --words "
                                    "'I like green cats' -o " + str(tmp_path / "p.yaml"))
    assert p.to_yaml() == (tmp_path / "p.yaml").read_text("utf-8")
    assert p.mlp is not None and p.logits.last is False and p.loss.targets == (1, 2, 3, 4)
    with pytest.raises(symattn.SymattnError, match="d_ff is an option of the whole block"):
        symattn.generate(d_ff=2)
    with pytest.raises(symattn.SymattnError, match="block is True or False"):
        symattn.generate(block="yes")
    with pytest.raises(symattn.SymattnError, match="a word of the sentence or the vocabulary is empty"):
        symattn.generate(block=True, vocab=["the", "cat", "sat", "on", "a", " "])
