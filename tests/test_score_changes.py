"""Soft-capping (``softcap: c``, Gemma 2's c·tanh(s/c) before the mask) and a softmax temperature
(``temperature: T``, the masked scores divided by T): their stages, exact values, the side-by-side
rows, every output format, ``symattn check``'s diagnoses, the passes they refuse and ``generate``.

The references, each written here from the formula and named where it is used:

- by hand: the temperature example's S_temp, the four-token example's scaled scores (which the
  README's walk-through gives) halved, as Fractions;
- NumPy from the formula: softmax((c·tanh(QKᵀ·scale/c) + M)/T)·V in float64;
- mpmath at 50 digits: c·tanh(s/c) of each exact scaled score, against the exact entries;
- PyTorch (when installed): ``F.scaled_dot_product_attention`` with ``scale=`` 1/(√d_k·T) for
  the temperature, and ``torch.tanh`` before the mask, then ``torch.softmax``, for the cap.
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

ROOT = Path(__file__).resolve().parent.parent
TEMPERATURE = ROOT / "worked_examples" / "temperature.yaml"
SOFTCAP = ROOT / "worked_examples" / "softcap_sliding_window.yaml"
TOL = 1e-12  # float64 against exact values of size ≤ 10: a few units of 2^-52 times the size, with room


def _problem(tmp_path: Path, text: str, name: str = "p.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return symattn.load_problem(path)


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _allowed(kind, n: int) -> np.ndarray:
    """The mask written from its rule: causal, or a sliding window of w (j ≤ i, i − j < w)."""
    i, j = np.indices((n, n))
    if kind == "causal":
        return j <= i
    return (j <= i) & (i - j < kind["sliding-window"])


def numpy_reference(raw: dict, cap=None, T=None) -> dict[str, np.ndarray]:
    """NumPy from the formula: Q = X·W_Q, ..., S = Q·Kᵀ/√d_k, c·tanh(S/c), + M, /T, softmax, ·V."""
    X, W_Q, W_K, W_V = (np.array(raw[k], dtype=float) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    S = Q @ K.T / np.sqrt(Q.shape[1])
    out = {"S_scaled": S}
    if cap is not None:
        S = out["S_capped"] = cap * np.tanh(S / cap)
    M = np.where(_allowed(raw["mask"], len(X)), 0.0, -np.inf)
    Z = out["S_masked"] = S + M
    if T is not None:
        Z = out["S_temp"] = Z / T
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = out["A"] = E / E.sum(axis=1, keepdims=True)
    out["O"] = A @ V
    return out


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


# -- temperature ----------------------------------------------------------------------------------


def test_temperature_halves_the_masked_scores_exactly():
    """By hand: the four-token example's scaled scores (1 6 4 3 / 6 4 8 2 / 4 8 8 4 / 3 2 4 1, as the
    README's walk-through gives them) under the causal mask, halved."""
    d = symattn.derive(symattn.load_problem(TEMPERATURE))
    scaled = [[1, 6, 4, 3], [6, 4, 8, 2], [4, 8, 8, 4], [3, 2, 4, 1]]
    got = d.step("S_temp").exact
    for i in range(4):
        for j in range(4):
            if j > i:
                assert got[i, j] == -sympy.oo
            else:
                assert Fraction(str(got[i, j])) == Fraction(scaled[i][j], 2), (i, j)


def test_temperature_against_numpy_from_the_formula():
    """NumPy from the formula, T = 2: every stage, and the last row at T = 1 and at T = 2."""
    d = symattn.derive(symattn.load_problem(TEMPERATURE))
    ref = numpy_reference(_raw(TEMPERATURE), T=2.0)
    for key in ("S_masked", "S_temp", "A", "O"):
        np.testing.assert_allclose(d.approx(key), ref[key], atol=TOL, rtol=0)
    side = d.approx("temp_row")
    np.testing.assert_allclose(side[0], _softmax(ref["S_masked"][-1]), atol=TOL, rtol=0)
    np.testing.assert_allclose(side[1], ref["A"][-1], atol=TOL, rtol=0)
    assert side[1].max() < side[0].max()  # T = 2 flattens the row
    assert d.step("temp_row").rows == ("T = 1", "T = 2")


def test_temperature_against_pytorch_sdpa_scale():
    """PyTorch: SDPA with scale = 1/(√d_k·T) gives softmax(QKᵀ/(√d_k·T) + M)·V; the causal mask's
    −∞ is unchanged by 1/T, so it is the problem's A and O."""
    torch = pytest.importorskip("torch")
    raw = _raw(TEMPERATURE)
    X, W_Q, W_K, W_V = (torch.tensor(raw[k], dtype=torch.float64) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scale = 1 / (2.0 * 2.0)  # 1/√4 and T = 2
    O = torch.nn.functional.scaled_dot_product_attention(Q[None], K[None], V[None], is_causal=True, scale=scale)[0]
    A = torch.nn.functional.scaled_dot_product_attention(Q[None], K[None], torch.eye(4, dtype=torch.float64)[None],
                                                         is_causal=True, scale=scale)[0]
    d = symattn.derive(symattn.load_problem(TEMPERATURE))
    np.testing.assert_allclose(d.approx("A"), A.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(d.approx("O"), O.numpy(), atol=TOL, rtol=0)
    assert symattn.crosscheck(d, torch=True).passed


def test_a_temperature_below_one_sharpens(tmp_path):
    """T = 1/2 doubles the masked scores (NumPy from the formula) and the last row gets sharper."""
    text = TEMPERATURE.read_text(encoding="utf-8").replace("temperature: 2", 'temperature: "1/2"')
    d = symattn.derive(_problem(tmp_path, text))
    ref = numpy_reference(_raw(TEMPERATURE), T=0.5)
    np.testing.assert_allclose(d.approx("A"), ref["A"], atol=TOL, rtol=0)
    side = d.approx("temp_row")
    assert side[1].max() > side[0].max()
    assert "sharper" in d.step("temp_row").why


# -- soft-capping ----------------------------------------------------------------------------------


def test_softcap_entries_are_exact_tanh():
    """mpmath at 50 digits: each entry is 5·tanh(s/5) of the exact scaled score s (an integer here)."""
    d = symattn.derive(symattn.load_problem(SOFTCAP))
    scaled = d.step("S_scaled").exact
    capped = d.step("S_capped").exact
    values = d.evaluate("S_capped", 40)
    with mpmath.workdps(50):
        for i in range(4):
            for j in range(4):
                s = int(scaled[i, j])
                assert str(capped[i, j]) == ("0" if s == 0 else f"5*tanh({Fraction(s, 5)})")
                assert abs(values[i][j] - 5 * mpmath.tanh(mpmath.mpf(s) / 5)) < mpmath.mpf(10) ** -35
                assert abs(values[i][j]) < 5


def test_softcap_with_a_sliding_window_against_numpy():
    """NumPy from the formula: c·tanh(S_scaled/c) before the window's mask, then the softmax."""
    d = symattn.derive(symattn.load_problem(SOFTCAP))
    raw = _raw(SOFTCAP)
    ref = numpy_reference(raw, cap=5.0)
    for key in ("S_capped", "S_masked", "A", "O"):
        np.testing.assert_allclose(d.approx(key), ref[key], atol=TOL, rtol=0)
    side = d.approx("cap_row")
    uncapped = ref["S_scaled"][-1] + np.where(_allowed(raw["mask"], 4)[-1], 0.0, -np.inf)
    np.testing.assert_allclose(side[0], _softmax(uncapped), atol=TOL, rtol=0)
    np.testing.assert_allclose(side[1], ref["A"][-1], atol=TOL, rtol=0)
    assert d.step("cap_row").rows == ("no cap", "c = 5")
    assert (d.approx("A")[~_allowed(raw["mask"], 4)] == 0).all()  # the window's keys stay exactly 0


def test_softcap_against_pytorch_tanh_before_the_mask():
    """PyTorch: the scores capped with torch.tanh, then the sliding window's −∞, then torch.softmax."""
    torch = pytest.importorskip("torch")
    raw = _raw(SOFTCAP)
    X, W_Q, W_K, W_V = (torch.tensor(raw[k], dtype=torch.float64) for k in ("X", "W_Q", "W_K", "W_V"))
    Q, K, V = X @ W_Q, X @ W_K, X @ W_V
    scores = 5.0 * torch.tanh((Q @ K.T / 2.0) / 5.0)
    mask = torch.zeros(4, 4, dtype=torch.float64).masked_fill(~torch.from_numpy(_allowed(raw["mask"], 4)), float("-inf"))
    A = torch.softmax(scores + mask, dim=-1)
    d = symattn.derive(symattn.load_problem(SOFTCAP))
    np.testing.assert_allclose(d.approx("A"), A.numpy(), atol=TOL, rtol=0)
    np.testing.assert_allclose(d.approx("O"), (A @ V).numpy(), atol=TOL, rtol=0)
    assert symattn.crosscheck(d, torch=True).passed


HEADS = """\
tokens: [a, b, c]
X: [[1, 0], [0, 1], [1, 1]]
heads:
  - {W_Q: [[2, 0], [0, 2]], W_K: [[3, 1], [1, 3]], W_V: [[1], [0]]}
  - {W_Q: [[1, 1], [1, -1]], W_K: [[2, 0], [0, 1]], W_V: [[0], [1]]}
W_O: [[1, 0], [0, 1]]
mask: {sliding-window: 2}
scale: "1/2"
softcap: 3
temperature: "3/2"
"""


def test_softcap_and_temperature_together_in_two_heads(tmp_path):
    """NumPy from the formula, per head: softmax((3·tanh(S/2/3) + M)/(3/2))·V, then W_O."""
    d = symattn.derive(_problem(tmp_path, HEADS))
    raw = yaml.safe_load(HEADS)
    X = np.array(raw["X"], dtype=float)
    M = np.where(_allowed(raw["mask"], 3), 0.0, -np.inf)
    outs = []
    for h, head in enumerate(raw["heads"], 1):
        Q, K, V = (X @ np.array(head[k], dtype=float) for k in ("W_Q", "W_K", "W_V"))
        Z = (3 * np.tanh(Q @ K.T * 0.5 / 3) + M) / 1.5
        E = np.exp(Z - Z.max(axis=1, keepdims=True))
        A = E / E.sum(axis=1, keepdims=True)
        np.testing.assert_allclose(d.approx(f"head{h}.S_temp"), Z, atol=TOL, rtol=0)
        np.testing.assert_allclose(d.approx(f"head{h}.A"), A, atol=TOL, rtol=0)
        assert {f"head{h}.cap_row", f"head{h}.temp_row"} <= set(d.ids)
        outs.append(A @ V)
    np.testing.assert_allclose(d.approx("O"), np.hstack(outs) @ np.array(raw["W_O"], dtype=float), atol=TOL, rtol=0)


# -- every format ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path, ids, words", [
    (TEMPERATURE, ("S_temp", "temp_row"), ("Divide by the temperature", "T = 2")),
    (SOFTCAP, ("S_capped", "cap_row"), ("Soft-cap the scores", "no cap")),
])
def test_every_format_shows_the_new_stages(path, ids, words):
    d = symattn.derive(symattn.load_problem(path))
    data = json.loads(symattn.render(d, "json"))
    listed = [s["id"] for s in data["stages"]]
    assert all(i in listed for i in ids)
    for fmt in ("latex", "markdown", "text", "html"):
        text = symattn.render(d, fmt)
        for w in words:
            assert w in text, (fmt, w)
    assert "tanh" in symattn.render(d, "text") if path == SOFTCAP else "Ŝ / T" in symattn.render(d, "text")


# -- symattn check ---------------------------------------------------------------------------------


def _diagnosis(d, answers: dict) -> dict:
    marking = json.loads(symattn.check(d, answers).to_json())
    return {s["id"]: s.get("diagnosis", "") for s in marking["stages"]}


def test_check_names_the_temperature_multiplied():
    d = symattn.derive(symattn.load_problem(TEMPERATURE))
    masked = d.approx("S_masked")
    times = [[("-inf" if np.isinf(x) else str(int(x * 2))) for x in row] for row in masked]
    weights = np.round(np.apply_along_axis(_softmax, 1, masked * 2), 6).tolist()
    assert "multiplied by T instead of dividing" in _diagnosis(d, {"S_temp": times})["S_temp"]
    assert "multiplied by T instead of dividing" in _diagnosis(d, {"A": weights})["A"]
    # both answered: A is right from the student's own S_temp (follow-through), and marked so
    marking = json.loads(symattn.check(d, {"S_temp": times, "A": weights}).to_json())
    assert [s["status"] for s in marking["stages"]] == ["wrong", "follows"]


def test_check_names_the_temperature_left_out_and_follows_through():
    d = symattn.derive(symattn.load_problem(TEMPERATURE))
    masked = d.approx("S_masked")
    plain = np.round(np.apply_along_axis(_softmax, 1, masked), 6).tolist()
    assert "temperature was left out" in _diagnosis(d, {"A": plain})["A"]
    # a wrong S_temp, then A right from it: marked as following through
    wrong = [[("-inf" if np.isinf(x) else str(x)) for x in row] for row in masked.tolist()]
    marking = json.loads(symattn.check(d, {"S_temp": wrong, "A": plain}).to_json())
    assert [s["status"] for s in marking["stages"]] == ["wrong", "follows"]


def test_check_names_softcapping_after_the_mask():
    """Capped after the mask, tanh(−∞) = −1: the masked keys score −c = −5 and get weight."""
    d = symattn.derive(symattn.load_problem(SOFTCAP))
    raw = _raw(SOFTCAP)
    after = 5 * np.tanh(numpy_reference(raw)["S_masked"] / 5)  # −∞ → −5
    weights = np.apply_along_axis(_softmax, 1, after)
    assert "soft-capped after the mask" in _diagnosis(d, {"S_masked": np.round(after, 6).tolist()})["S_masked"]
    assert "soft-capped after the mask" in _diagnosis(d, {"A": np.round(weights, 6).tolist()})["A"]


def test_check_names_softcapping_the_unscaled_scores():
    d = symattn.derive(symattn.load_problem(SOFTCAP))
    S = d.approx("S")
    got = _diagnosis(d, {"S_capped": np.round(5 * np.tanh(S / 5), 6).tolist()})
    assert "soft-capped the unscaled scores" in got["S_capped"]


# -- refusals and generate -------------------------------------------------------------------------


@pytest.mark.parametrize("call", ["with_backward", "with_tiling", "with_decode"])
@pytest.mark.parametrize("path", [TEMPERATURE, SOFTCAP])
def test_the_passes_that_recompute_the_scores_are_refused(path, call):
    p = symattn.load_problem(path)
    args = {"with_backward": (), "with_tiling": (2,), "with_decode": (3,)}[call]
    with pytest.raises(symattn.SymattnError, match="is not derived with"):
        getattr(symattn, call)(p, *args)


@pytest.mark.parametrize("path, line", [(TEMPERATURE, 'temperature: "2"'), (SOFTCAP, 'softcap: "5"')])
def test_generate_from_keeps_the_field(path, line):
    variant = symattn.generate(1, seed=3, base=path)[0]
    assert line in variant.to_yaml().splitlines()


def test_generate_options_write_the_fields():
    p = symattn.generate(1, seed=1, temperature="2", softcap="50")[0]
    lines = p.to_yaml().splitlines()
    assert 'temperature: "2"' in lines and 'softcap: "50"' in lines
    d = symattn.derive(p)
    assert {"S_capped", "S_temp", "cap_row", "temp_row"} <= set(d.ids)


def test_generate_command_line_options(symattn_cli, tmp_path):
    r = symattn_cli("generate", "--temperature", "1/2", "--seed", "2", "-o", str(tmp_path / "t.yaml"))
    assert r.code == 0, r.output
    assert 'temperature: "1/2"' in (tmp_path / "t.yaml").read_text(encoding="utf-8").splitlines()
    r = symattn_cli("generate", "--softcap", "0", "--seed", "2")
    assert r.code != 0 and "softcap must be positive" in r.output
    r = symattn_cli("generate", "--from", str(SOFTCAP), "--temperature", "2")
    assert r.code != 0 and "--temperature cannot go with --from" in r.output


def test_with_grouped_heads_rope_and_a_norm_against_pytorch():
    """The tiny LLaMA block (RMSNorm, 4 query heads on 2 K/V heads, RoPE, the SwiGLU MLP) with both:
    the package's NumPy reference and PyTorch (SDPA's scale= for T, torch.tanh before the mask,
    enable_gqa's repeat) agree with every exact stage."""
    pytest.importorskip("torch")
    from symattn.problem.load import parse_problem

    path = ROOT / "worked_examples" / "tiny_llama_block.yaml"
    text = path.read_text(encoding="utf-8") + "softcap: 50\ntemperature: 2\n"
    d = symattn.derive(parse_problem(text, "llama.yaml", path.parent))
    assert {"head1.S_capped", "head4.S_temp", "head3.cap_row"} <= set(d.ids)
    check = symattn.crosscheck(d, torch=True)
    assert check.passed, str(check)
