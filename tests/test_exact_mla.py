"""Multi-head latent attention (mla:, DeepSeek-V2/V3): the latent, the shared rotated key, each head's
assembled Q, K, V, the absorption and the cache per token, exactly.

References written here, each test saying which it uses:
- the worked example by hand: Fractions, with RoPE's quarter turns (cos and sin of p·π/2 are 0 and ±1);
- NumPy float64 from the DeepSeek-V2 paper's formulas (section 2.1.2-2.1.3, eqs. 9-19): c_KV = W_DKV h_t,
  k_C = W_UK c_KV, v_C = W_UV c_KV, k_R = RoPE(W_KR h_t), c_Q = W_DQ h_t, q_C = W_UQ c_Q, q_R = RoPE(W_QR c_Q),
  q = [q_C; q_R], k = [k_C; k_R], o = Σ_j softmax_j(qᵀk_j / √(d_h + d_R)) v_j, u = W_O[o_1; …; o_h]
  (written for rows: h_t is a row of X), with RoPE written here twice (rotate_half and complex pairs);
  and with the RMSNorm after the latents (the paper's appendix) for norm_kv and norm_q;
- PyTorch: F.scaled_dot_product_attention over the Q, K, V assembled here with torch (skips without torch);
- transformers' own DeepseekV3Attention with the problem's weights loaded in (skips without transformers);
- mpmath at 50 digits for the softmax's powers of e;
- SymPy's simplify of each absorbed score minus the assembled one.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn.check import load_answers, mark
from symattn.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "mla.yaml"
EPS = np.finfo(np.float64).eps
# every entry is a few short dot products (d_model, d_c, d_h + d_R ≤ 8 terms), a rotation, a softmax of
# at most 4 terms and the output projection: fewer than 100 roundings of relative size ≤ eps each, on
# numbers of size at most about 100 (relative to max(1, |x|))
TOL = 100 * EPS * 100


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def _fr(m) -> list[list[Fraction]]:
    return [[Fraction(str(x)) for x in row] for row in m]


def _mul(a, b):
    return [[sum((a[i][k] * b[k][j] for k in range(len(b))), Fraction(0)) for j in range(len(b[0]))]
            for i in range(len(a))]


def _cols(m, first, width):
    return [row[first:first + width] for row in m]


def _quarter_turns(m):
    """RoPE with d_R = 2 and θ = π/2 by hand: row p's pair turned by p quarter turns."""
    cos, sin = {0: 1, 1: 0, 2: -1, 3: 0}, {0: 0, 1: 1, 2: 0, 3: -1}
    return [[a * cos[p % 4] - b * sin[p % 4], a * sin[p % 4] + b * cos[p % 4]] for p, (a, b) in enumerate(m)]


def _hand(example: dict) -> dict:
    """The worked example's stages by hand, in Fractions: per head (Q, K, V, S)."""
    m = example["mla"]
    X = _fr(example["X"])
    c_kv = _mul(X, _fr(m["W_DKV"]))
    k_rot = _quarter_turns(_mul(X, _fr(m["W_KR"])))
    out = {"c_KV": c_kv, "k_R_rot": k_rot}
    for h in range(m["heads"]):
        q_c = _mul(X, _cols(_fr(m["W_Q"]), 2 * h, 2))
        q_rot = _quarter_turns(_mul(X, _cols(_fr(m["W_QR"]), 2 * h, 2)))
        k_c = _mul(c_kv, _cols(_fr(m["W_UK"]), 2 * h, 2))
        Q = [a + b for a, b in zip(q_c, q_rot)]
        K = [a + b for a, b in zip(k_c, k_rot)]
        V = _mul(c_kv, _cols(_fr(m["W_UV"]), 2 * h, 2))
        S = _mul(Q, [list(r) for r in zip(*K)])
        out[h + 1] = {"q_C": q_c, "K_C": k_c, "Q": Q, "K": K, "V": V, "S": S}
    return out


def _exact(d, stage) -> list[list]:
    return [list(r) for r in d.step(stage).exact.tolist()]


def test_the_worked_example_by_hand():
    """Reference: Fractions by hand (quarter turns), and mpmath at 50 digits for the softmax and W_O."""
    example = _load(EXAMPLE)
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    hand = _hand(example)
    assert _exact(d, "c_KV") == hand["c_KV"] and _exact(d, "k_R_rot") == hand["k_R_rot"]
    mpmath.mp.dps = 50
    outputs = []
    for h in (1, 2):
        for name in ("Q", "K", "V", "S"):
            assert _exact(d, f"head{h}.{name}") == hand[h][name], (h, name)
        assert _exact(d, f"head{h}.S_scaled") == [[x / 2 for x in r] for r in hand[h]["S"]]  # 1/√(2 + 2)
        rows = []
        for i, row in enumerate(hand[h]["S"]):  # causal: keys j ≤ i
            e = [mpmath.e ** (mpmath.mpf(row[j].numerator) / row[j].denominator / 2) for j in range(i + 1)]
            z = mpmath.fsum(e)
            rows.append([mpmath.fsum(e[j] / z * hand[h]["V"][j][k] for j in range(i + 1)) for k in range(2)])
        outputs.append(rows)
    W_O = _fr(example["W_O"])
    concat = [a + b for a, b in zip(*outputs)]
    O = d.step("O").exact
    for i in range(3):
        for k in range(2):
            want = mpmath.fsum(concat[i][r] * W_O[r][k] for r in range(4))
            assert abs(sympy.N(O[i, k], 45) - sympy.Float(str(want), 45)) < sympy.Float("1e-40")
    assert _exact(d, "mla_cache") == [[4, 12], [12, 36], [6, 18]]  # d_c + d_R; 2·(2 + 2 + 2); 1·6


# -- the paper's formulas in NumPy ----------------------------------------------------------------


def rope_np(x: np.ndarray, thetas: np.ndarray, pairing: str) -> np.ndarray:
    """RoPE written twice: Hugging Face's x·cos + rotate_half(x)·sin (half), complex pairs (interleaved)."""
    n, d = x.shape
    freqs = np.outer(np.arange(n), thetas)
    if pairing == "half":
        emb = np.concatenate([freqs, freqs], axis=1)
        return x * np.cos(emb) + np.concatenate([-x[:, d // 2:], x[:, :d // 2]], axis=1) * np.sin(emb)
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * freqs)
    return np.stack([z.real, z.imag], axis=2).reshape(n, d)


def deepseek_v2(example: dict, thetas: np.ndarray, allowed: np.ndarray) -> tuple[list, np.ndarray]:
    """The paper's equations 9-19 for the rows of X: every head's o_t and u_t = W_O [o_1; …; o_h]."""
    f = lambda m: np.array([[float(Fraction(str(x))) for x in r] for r in m])  # noqa: E731
    m = example["mla"]
    X, h = f(example["X"]), m["heads"]
    rms = lambda x, norm: x / np.sqrt((x * x).mean(axis=1, keepdims=True) + float(Fraction(str(norm.get("eps", "1e-6"))))) \
        * (f([norm["weight"]])[0] if "weight" in norm else 1.0)  # noqa: E731  RMSNorm (DeepSeek's latent norms)
    c_kv = X @ f(m["W_DKV"])
    c_kv = rms(c_kv, m["norm_kv"]) if "norm_kv" in m else c_kv
    k_r = rope_np(X @ f(m["W_KR"]), thetas, m["rope"].get("pairing", "half"))
    c_q = X @ f(m["W_DQ"]) if "W_DQ" in m else X
    c_q = rms(c_q, m["norm_q"]) if "norm_q" in m else c_q
    W_q = f(m["W_UQ"]) if "W_DQ" in m else f(m["W_Q"])
    d_h, d_R, d_v = W_q.shape[1] // h, k_r.shape[1], f(m["W_UV"]).shape[1] // h
    heads = []
    for i in range(h):
        q = np.hstack([c_q @ W_q[:, i * d_h:(i + 1) * d_h],
                       rope_np(c_q @ f(m["W_QR"])[:, i * d_R:(i + 1) * d_R], thetas, m["rope"].get("pairing", "half"))])
        k = np.hstack([c_kv @ f(m["W_UK"])[:, i * d_h:(i + 1) * d_h], k_r])
        v = c_kv @ f(m["W_UV"])[:, i * d_v:(i + 1) * d_v]
        s = np.where(allowed, q @ k.T / np.sqrt(d_h + d_R), -np.inf)
        a = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append((a / a.sum(axis=1, keepdims=True)) @ v)
    return heads, np.hstack(heads) @ f(example["W_O"])


BASE = """X: [[1, 2, 0, -1], [0, 1, 1, 2], [2, -1, 1, 0]]
W_O: [[1, 0], [0, 1], [1, 1], [2, -1], [0, 1], [1, 0], [1, 1], [-1, 0]]
"""
# W_DQ and W_UQ, base 10000 (cos 1, sin 1/100: irrational), half pairing, 2 heads of d_v 4: also the
# first Hugging Face case's, there with the latent norms
W_DQ_BASE_HALF = """mla:
  heads: 2
  W_DKV: [[1, 0], [0, 1], [1, 1], [0, -1]]
  W_UK: [[1, 0, 2, -1, 0, 1], [0, 1, 1, 1, -1, 0]]
  W_UV: [[1, 0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 1, 1, -1]]
  W_KR: [[1, 0, 0, 1], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1]]
  W_DQ: [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]]
  W_UQ: [[1, 0, 0, 0, 1, 1], [0, 1, 1, 0, 0, 1], [1, 1, 0, 1, 0, 0]]
  W_QR: [[1, 0, 0, 1, 0, 1, 1, 0], [0, 1, 1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0, 1, 1]]
  rope: {base: 10000}
"""
CASES = {
    # W_DQ and W_UQ, base 10000 (cos 1, sin 1/100: irrational), half pairing, no mask, 2 heads of d_v 4
    "w_dq-base-half": (BASE + "mask: none\n" + W_DQ_BASE_HALF, None),
    # W_Q, the angles 1/3 and 1/5, interleaved pairs, causal, 4 heads (MHA, GQA with 2 groups, MQA)
    "w_q-angles-interleaved": ("""X: [[1, 2, 0, -1], [0, 1, 1, 2], [2, -1, 1, 0]]
W_O: [[1, 0], [0, 1], [1, 1], [2, -1]]
mask: causal
mla:
  heads: 4
  W_DKV: [[1, 0], [0, 1], [1, 1], [0, -1]]
  W_UK: [[1, 0, 2, -1], [0, 1, 1, 1]]
  W_UV: [[1, 0, 0, 1], [0, 1, 1, 0]]
  W_KR: [[1, 0, 0, 1], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 1, 1]]
  W_Q: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]]
  W_QR: [[1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0], [0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0, 0, 1], [1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0]]
  rope: {angles: ["1/3", "1/5"], pairing: interleaved}
""", np.array([1 / 3, 1 / 5])),
}


def _case(name: str, tmp_path: Path):
    text, thetas = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    example = yaml.safe_load(text)
    if thetas is None:
        d_R = len(example["mla"]["W_KR"][0])
        thetas = 10000.0 ** (-2.0 * np.arange(d_R // 2) / d_R)
    return example, thetas, symattn.derive(symattn.load_problem(path))


def _close(a, b) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= TOL * np.maximum(1.0, np.abs(b))))


@pytest.mark.parametrize("name", list(CASES))
def test_every_head_matches_the_papers_formulas_in_numpy(name, tmp_path):
    """Reference: the DeepSeek-V2 paper's equations in NumPy float64 (deepseek_v2, rope_np above)."""
    example, thetas, d = _case(name, tmp_path)
    heads, u = deepseek_v2(example, thetas, np.array(d.problem.mask.allowed, bool))
    for h, o in enumerate(heads, 1):
        assert _close(d.approx(f"head{h}.O"), o), h
    assert _close(d.approx("O"), u)


def test_the_worked_example_matches_the_papers_formulas_in_numpy():
    """Reference: the same NumPy equations on the worked example (θ = π/2)."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    _, u = deepseek_v2(_load(EXAMPLE), np.array([np.pi / 2]), np.array(d.problem.mask.allowed, bool))
    assert _close(d.approx("O"), u)


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_over_the_assembled_heads(name, tmp_path):
    """Reference: PyTorch's F.scaled_dot_product_attention over Q, K, V assembled here with torch."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    example, thetas, d = _case(name, tmp_path)
    m = example["mla"]
    t = lambda w: torch.tensor([[float(Fraction(str(x))) for x in r] for r in w], dtype=torch.float64)  # noqa: E731
    X, h = t(example["X"]), m["heads"]
    pairing = m["rope"].get("pairing", "half")
    rot = lambda x: torch.from_numpy(rope_np(x.numpy(), thetas, pairing))  # noqa: E731
    c_kv, k_r = X @ t(m["W_DKV"]), rot(X @ t(m["W_KR"]))
    c_q = X @ t(m["W_DQ"]) if "W_DQ" in m else X
    W_q = t(m["W_UQ"]) if "W_DQ" in m else t(m["W_Q"])
    d_h, d_R, d_v = W_q.shape[1] // h, k_r.shape[1], t(m["W_UV"]).shape[1] // h
    Q = torch.stack([torch.cat([c_q @ W_q[:, i * d_h:(i + 1) * d_h], rot(c_q @ t(m["W_QR"])[:, i * d_R:(i + 1) * d_R])], 1)
                     for i in range(h)])
    K = torch.stack([torch.cat([c_kv @ t(m["W_UK"])[:, i * d_h:(i + 1) * d_h], k_r], 1) for i in range(h)])
    V = torch.stack([c_kv @ t(m["W_UV"])[:, i * d_v:(i + 1) * d_v] for i in range(h)])
    O = F.scaled_dot_product_attention(Q[None], K[None], V[None], is_causal=example.get("mask") == "causal")[0]
    for i in range(h):
        assert _close(d.approx(f"head{i + 1}.O"), O[i].numpy()), i
    assert _close(d.approx("O"), (torch.cat(list(O), 1) @ t(example["W_O"])).numpy())
    assert symattn.crosscheck(d, torch=True).passed


@pytest.mark.parametrize("name", [*CASES, "worked"])
def test_absorbed_and_assembled_scores_are_exactly_equal(name, tmp_path):
    """Reference: SymPy's simplify of S_abs − S entry by entry (cos 1, sin 1/100 and the like stay exact)."""
    d = symattn.derive(symattn.load_problem(EXAMPLE)) if name == "worked" else _case(name, tmp_path)[2]
    for h in range(1, d.problem.mla.heads + 1):
        diff = d.step(f"head{h}.S_abs_diff").exact
        assert all(x == 0 for x in diff), h
        S, S_abs = d.step(f"head{h}.S").exact, d.step(f"head{h}.S_abs").exact
        assert all(sympy.simplify(S_abs[i, j] - S[i, j]) == 0 for i in range(S.rows) for j in range(S.cols))
    data = json.loads(symattn.render_json(d))
    assert data["mla"]["absorbed_equal"] is True


def test_the_cache_table_against_mha_and_gqa(tmp_path):
    """Reference: the counts by hand: MLA d_c + d_R = 2 + 4; MHA, GQA, MQA g·(d_h + d_R + d_v) = g·(1 + 4 + 1)."""
    _, _, d = _case("w_q-angles-interleaved", tmp_path)
    assert _exact(d, "mla_cache") == [[6, 18], [24, 72], [12, 36], [6, 18]]
    data = json.loads(symattn.render_json(d))["mla"]
    assert data["cache_per_token"] == {"mla": 6, "mha": 24, "gqa": [{"groups": 2, "numbers": 12},
                                                                     {"groups": 1, "numbers": 6}]}
    assert data["times_smaller"] == "4"
    text = symattn.render_text(d)
    assert "MLA's cache is 4 times smaller" in text and "GQA (2 groups)" in text and "MQA (1 group)" in text


# -- symattn check ------------------------------------------------------------------------------


def _mark(d, answers: dict, tmp_path) -> dict:
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump({k: [[str(x) for x in r] for r in v] for k, v in answers.items()}))
    return {s["id"]: s for s in mark(d, load_answers(path, d)).as_dict()["stages"]}


def test_check_names_rope_applied_to_the_compressed_part(tmp_path):
    """Reference: by hand in Fractions: q_C and K_C turned by the quarter turns too, the scores from them."""
    every = _hand(_load(EXAMPLE))
    hand, k_rot = every[1], every["k_R_rot"]
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    q_wrong = [a + b[2:] for a, b in zip(_quarter_turns(hand["q_C"]), hand["Q"])]
    k_wrong = [a + b for a, b in zip(_quarter_turns(hand["K_C"]), k_rot)]
    s_wrong = _mul(q_wrong, [list(r) for r in zip(*k_wrong)])
    by_id = _mark(d, {"head1.Q": q_wrong, "head1.K": k_wrong, "head1.S": s_wrong}, tmp_path)
    for name in ("head1.Q", "head1.K"):
        assert by_id[name]["status"] == "wrong", by_id[name]
        assert "RoPE applied to the compressed part" in by_id[name]["diagnosis"], by_id[name]
    assert by_id["head1.S"]["status"] == "follows"  # right from the student's own Q and K
    alone = _mark(d, {"head1.S": s_wrong}, tmp_path)["head1.S"]
    assert alone["status"] == "wrong" and "RoPE applied to the compressed part" in alone["diagnosis"], alone
    latent = _mark(d, {"c_KV": _quarter_turns(every["c_KV"])}, tmp_path)["c_KV"]
    assert latent["status"] == "wrong" and "RoPE applied to the compressed part" in latent["diagnosis"], latent


def test_check_names_the_scale_by_root_d_h(tmp_path):
    """Reference: the hand scores S over √d_h = √2 instead of √(d_h + d_R) = 2, rounded here."""
    hand = _hand(_load(EXAMPLE))
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    scaled = [[f"{float(x) / np.sqrt(2):.4f}" for x in r] for r in hand[2]["S"]]
    by_id = _mark(d, {"head2.S_scaled": scaled}, tmp_path)["head2.S_scaled"]
    assert by_id["status"] == "wrong" and "scaled by 1/√d_h instead of 1/√(d_h + d_R)" in by_id["diagnosis"], by_id
    # carried to the weights and the output: the causal softmax of S/√2 and its product with V, in NumPy
    S, V = (np.array([[float(x) for x in r] for r in hand[2][k]]) for k in ("S", "V"))
    z = np.where(np.tril(np.ones((3, 3), bool)), S / np.sqrt(2), -np.inf)
    A = np.exp(z - z.max(axis=1, keepdims=True))
    A /= A.sum(axis=1, keepdims=True)
    rounded = lambda m: [[f"{x:.6f}" for x in r] for r in m]  # noqa: E731
    for name, value in (("head2.A", A), ("head2.O", A @ V)):
        mark_ = _mark(d, {name: rounded(value)}, tmp_path)[name]
        assert mark_["status"] == "wrong" and "1/√d_h instead of 1/√(d_h + d_R)" in mark_["diagnosis"], mark_


def test_right_answers_pass(tmp_path):
    """Reference: the derivation's own exact values, marked right (no mistake is named on a right answer)."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    answers = {s.id: [list(r) for r in s.exact.tolist()] for s in d
               if s.id.split(".")[-1] in ("c_KV", "k_R_rot", "Q", "K", "V", "S", "S_scaled", "S_abs", "q_abs")}
    by_id = _mark(d, answers, tmp_path)
    assert by_id and all(s["status"] == "right" for s in by_id.values()), by_id


# -- every format, and what is refused ----------------------------------------------------------


def test_every_format_shows_the_absorption_and_the_cache(tmp_path, capsys):
    for fmt, marks in (("text", ["S_abs − S", "MLA (latent and rotated key)", "k_R_rot = RoPE(k_R)"]),
                       ("markdown", ["S_{abs} - S", "MHA (2 heads)", "The absorption"]),
                       ("latex", ["S_{abs} - S", "MQA (1 group)"]),
                       ("html", ["head1.S_abs_diff", "mla_cache"]),
                       ("json", ['"absorbed_equal": true', '"times_smaller": "3"'])):
        assert main(["derive", str(EXAMPLE), "-f", fmt]) == 0
        out = capsys.readouterr().out
        for text in marks:
            assert text in out, (fmt, text)


@pytest.mark.parametrize("option, field", [(["--backward"], "backward"), (["--tiled", "2"], "--tiled"),
                                           (["--decode", "2"], "--decode")])
def test_passes_mla_has_none_of_are_refused_in_one_line(option, field, capsys):
    code = main(["derive", str(EXAMPLE), "-f", "text", *option])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1 and err.startswith("Error: ")
    assert f"{field}: " in err and "mla" in err, err


# -- symattn generate --mla ---------------------------------------------------------------------


@pytest.mark.parametrize("level, seed", [("easy", 0), ("easy", 5), ("medium", 1), ("hard", 2)])
def test_generated_mla_exercises_keep_their_guarantees(level, seed, tmp_path):
    """Reference: NumPy written here from the generated file (quarter turns as rope_np with θ = π/2): the
    level's bounds (easy 4 and 8, medium 6 and 16, hard 12 and 48), whole numbers, a non-uniform row per
    head, and scores unlike those with RoPE on the compressed part."""
    (problem,) = symattn.generate(seed=seed, level=level, tokens=3, mla=True)
    raw = yaml.safe_load(problem.to_yaml())
    m = raw["mla"]
    assert m["heads"] == 2 and m["rope"] == {"angles": ["pi/2"]}
    f = lambda w: np.array(w, dtype=float)  # noqa: E731
    X = f(raw["X"])
    proj, bound = {"easy": (4, 8), "medium": (6, 16), "hard": (12, 48)}[level]
    rot = lambda x: np.rint(rope_np(x, np.array([np.pi / 2]), "half"))  # noqa: E731  (whole numbers)
    c_kv, k_rot = X @ f(m["W_DKV"]), rot(X @ f(m["W_KR"]))
    allowed = np.tril(np.ones((3, 3), bool)) if raw["mask"] == "causal" else np.ones((3, 3), bool)
    for h in range(2):
        q_c, k_c = X @ f(m["W_Q"])[:, 2 * h:2 * h + 2], c_kv @ f(m["W_UK"])[:, 2 * h:2 * h + 2]
        q_rot = rot(X @ f(m["W_QR"])[:, 2 * h:2 * h + 2])
        S = np.hstack([q_c, q_rot]) @ np.hstack([k_c, k_rot]).T
        wrong = np.hstack([rot(q_c), q_rot]) @ np.hstack([rot(k_c), k_rot]).T
        V = c_kv @ f(m["W_UV"])[:, 2 * h:2 * h + 2]
        assert max(np.abs(a).max() for a in (q_c, q_rot, k_c, V)) <= proj and np.abs(S).max() <= bound
        assert not np.array_equal(np.where(allowed, S, 0), np.where(allowed, wrong, 0))
        assert any(allowed[i].sum() > 1 and len(set(S[i][allowed[i]])) > 1 for i in range(3))
        assert _close(symattn.derive(problem).approx(f"head{h + 1}.S"), S)
    assert symattn.crosscheck(symattn.derive(problem)).passed
    assert symattn.generate(seed=seed, level=level, tokens=3, mla=True)[0].to_yaml() == problem.to_yaml()


@pytest.mark.parametrize("options, words", [(["--heads", "3"], "--heads"), (["--d-k", "2"], "--d-k"),
                                            (["--linear", "relu"], "--linear"), (["--no-scale"], "--no-scale"),
                                            (["--mask", "sliding-window:2"], "causal or none")])
def test_generate_mla_refuses_what_it_cannot_follow(options, words, capsys):
    assert main(["generate", "--mla", *options]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and words in err, err


# -- Hugging Face's DeepseekV3Attention -----------------------------------------------------------

# HF_CASES: (problem text, rope_interleave); W_O is h·d_v × d_model, as o_proj maps back to hidden_size
HF_CASES = {
    "w_dq-norms-half": ("""X: [[1, 2, 0, -1], [0, 1, 1, 2], [2, -1, 1, 0]]
W_O: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [2, -1, 0, 1], [0, 1, 1, 1], [1, 0, -1, 0], [1, 1, 0, 0], [-1, 0, 2, 1]]
mask: causal
""" + W_DQ_BASE_HALF + """  norm_kv: {weight: [2, "1/2"], eps: 1/100}
  norm_q: {weight: [1, 2, "1/4"], eps: 1e-6}
""", False),
    "w_q-norm-interleaved": ("""X: [[1, 2, 0, -1], [0, 1, 1, 2], [2, -1, 1, 0], [1, 1, 1, 1]]
W_O: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [2, -1, 0, 1]]
mask: causal
mla:
  heads: 2
  W_DKV: [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, -1, 1]]
  W_UK: [[1, 0, 2, -1], [0, 1, 1, 1], [1, 1, 0, 0]]
  W_UV: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 1, 1]]
  W_KR: [[1, 0], [0, 1], [1, 0], [0, 1]]
  W_Q: [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0], [0, 0, 1, 1]]
  W_QR: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]]
  rope: {base: 10000, pairing: interleaved}
  norm_kv: {eps: 1/10}
""", True),
}
# Hugging Face's RMSNorm, its rotary module (cos and sin of p·θ_i) and its eager softmax compute in float32:
# each normalised latent entry, each cos, sin and weight is within about 4 units of 2^-24 (relative) of its
# float64 value, and every later stage multiplies that by at most the sum of the absolute weights along its
# path (below 64 here)
HF_TOL = 4 * 2.0**-24 * 64


def _hf_attention(example: dict, interleave: bool, float64_norms: bool, monkeypatch):
    """DeepseekV3Attention with the problem's weights (nn.Linear stores out × in: the transposes), head h's
    blocks where Hugging Face splits q_b_proj (or q_proj) and kv_b_proj per head; returns o_proj's output."""
    torch = pytest.importorskip("torch")
    ds = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    from transformers import DeepseekV3Config

    if float64_norms:  # the same three lines as Hugging Face's, without the cast to float32
        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
        monkeypatch.setattr(ds.DeepseekV3RMSNorm, "forward", forward)
    m = example["mla"]
    t = lambda w: torch.tensor([[float(Fraction(str(x))) for x in r] for r in w], dtype=torch.float64)  # noqa: E731
    X, h = t(example["X"]), m["heads"]
    d_c, d_R = len(m["W_DKV"][0]), len(m["W_KR"][0])
    d_h, d_v = len(m["W_UK"][0]) // h, len(m["W_UV"][0]) // h
    d_cq = len(m["W_DQ"][0]) if "W_DQ" in m else None
    config = DeepseekV3Config(hidden_size=X.shape[1], num_attention_heads=h, num_key_value_heads=h,
                              q_lora_rank=d_cq, kv_lora_rank=d_c, qk_nope_head_dim=d_h, qk_rope_head_dim=d_R,
                              v_head_dim=d_v, rope_interleave=interleave, attention_bias=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    config._attn_implementation = "sdpa" if float64_norms else "eager"  # eager takes its softmax in float32
    attn = ds.DeepseekV3Attention(config, 0).to(torch.float64)
    blocks = lambda a, wa, b, wb: torch.cat([torch.cat([a[:, i * wa:(i + 1) * wa], b[:, i * wb:(i + 1) * wb]], 1)  # noqa: E731
                                             for i in range(h)], 1).T
    W_up = t(m["W_UQ"]) if d_cq else t(m["W_Q"])
    with torch.no_grad():
        if d_cq:
            attn.q_a_proj.weight.copy_(t(m["W_DQ"]).T)
            attn.q_b_proj.weight.copy_(blocks(W_up, d_h, t(m["W_QR"]), d_R))
            norm_q = m["norm_q"]
            attn.q_a_layernorm.weight.copy_(t([norm_q["weight"]])[0] if "weight" in norm_q else torch.ones(d_cq))
            attn.q_a_layernorm.variance_epsilon = float(Fraction(str(norm_q.get("eps", "1e-6"))))
        else:
            attn.q_proj.weight.copy_(blocks(W_up, d_h, t(m["W_QR"]), d_R))
        attn.kv_a_proj_with_mqa.weight.copy_(torch.cat([t(m["W_DKV"]), t(m["W_KR"])], 1).T)
        norm_kv = m["norm_kv"]
        attn.kv_a_layernorm.weight.copy_(t([norm_kv["weight"]])[0] if "weight" in norm_kv else torch.ones(d_c))
        attn.kv_a_layernorm.variance_epsilon = float(Fraction(str(norm_kv.get("eps", "1e-6"))))
        attn.kv_b_proj.weight.copy_(blocks(t(m["W_UK"]), d_h, t(m["W_UV"]), d_v))
        attn.o_proj.weight.copy_(t(example["W_O"]).T)
        n = X.shape[0]
        position_ids = torch.arange(n)[None]
        if float64_norms:  # cos and sin of p·θ_i in float64, laid out as Hugging Face's cat(freqs, freqs)
            theta = 10000.0 ** (-torch.arange(0, d_R, 2, dtype=torch.float64) / d_R)
            freqs = torch.outer(torch.arange(n, dtype=torch.float64), theta)
            cos, sin = torch.cat([freqs, freqs], 1).cos()[None], torch.cat([freqs, freqs], 1).sin()[None]
        else:
            cos, sin = ds.DeepseekV3RotaryEmbedding(config)(X[None], position_ids)
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)[None, None]
        out, _ = attn(X[None], (cos.to(torch.float64), sin.to(torch.float64)), mask)
    return out[0].numpy()


@pytest.mark.parametrize("name", list(HF_CASES))
def test_hugging_faces_deepseek_v3_attention(name, tmp_path, monkeypatch):
    """Reference: transformers' own DeepseekV3Attention (kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj split
    per head, q_a_proj/q_a_layernorm/q_b_proj or q_proj, its RoPE with or without rope_interleave, o_proj)
    with the problem's weights loaded in, float64: as it is (eager; its RMSNorm, rotary module and softmax in
    float32, HF_TOL), and with its RMSNorm's cast to float32 lifted, cos, sin given in float64 and its sdpa
    attention (TOL)."""
    text, interleave = HF_CASES[name]
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    example = yaml.safe_load(text)
    d = symattn.derive(symattn.load_problem(path))
    exact = np.asarray(d.approx("O"), float)
    as_is = _hf_attention(example, interleave, False, monkeypatch)
    assert np.all(np.abs(as_is - exact) <= HF_TOL * np.maximum(1.0, np.abs(exact))), np.abs(as_is - exact).max()
    assert _close(exact, _hf_attention(example, interleave, True, monkeypatch))
    assert all(x == 0 for h in (1, 2) for x in d.step(f"head{h}.S_abs_diff").exact)  # absorbed through the norm too


@pytest.mark.parametrize("name", list(HF_CASES))
def test_the_latent_norms_match_the_papers_formulas_in_numpy(name, tmp_path):
    """Reference: the NumPy equations above with RMSNorm after the compressed latents (DeepSeek-V2, appendix:
    the extra RMSNorm layers after c_KV and c_Q), and each norm's mean squares by hand in Fractions."""
    text, interleave = HF_CASES[name]
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    example = yaml.safe_load(text)
    d = symattn.derive(symattn.load_problem(path))
    d_R = len(example["mla"]["W_KR"][0])
    _, u = deepseek_v2(example, 10000.0 ** (-2.0 * np.arange(d_R // 2) / d_R), np.array(d.problem.mask.allowed, bool))
    assert _close(d.approx("O"), u)
    c_kv = _mul(_fr(example["X"]), _fr(example["mla"]["W_DKV"]))
    assert _exact(d, "kv_norm_ms") == [[sum(x * x for x in r) / len(r)] for r in c_kv]
