"""gpt-oss's learned attention sinks (``sink:``): one more logit s per query head in every row's
softmax denominator, a_ij = e^{ŝ_ij − m_i} / (Z_i + e^{s − m_i}) with m_i the maximum over the
scores and s.

References, each written here: NumPy from that formula (``_numpy_sink_softmax``); Hugging Face's
own ``eager_attention_forward`` of ``transformers.models.gpt_oss`` (it concatenates the sink as
an extra logit column, subtracts the row maximum over scores and sink, takes the softmax and drops
the sink's column), called with a stand-in module holding the sinks; exact SymPy equality for the
rows' sums and for a decoded row against the full derivation. Problems are read with
``yaml.safe_load`` (small integers).
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn.problem.passes import with_backward, with_decode, with_tiling

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
EXAMPLE = EXAMPLES / "learned_sinks.yaml"
GQA = EXAMPLES / "gqa_4_heads_2_kv.yaml"
SINK_WINDOW = EXAMPLES / "sink_window.yaml"
# float64 against values rounded from 30 digits: a softmax over at most 6 keys and a product with
# small values lose a few units in the last place (2.2e-16 each); 1e-13 leaves room for that, no more
ATOL = 1e-13


def _data(path: Path) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def _floats(d, id: str) -> np.ndarray:
    """Stage ``id``'s exact values evaluated at 30 digits, as float64."""
    return np.array(d.evaluate(id, 30), dtype=np.float64)


def _write(tmp_path: Path, data: dict, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), "utf-8")
    return path


def _numpy_sink_softmax(Z: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
    """The formula: m_i = max(max_j Z_ij, s), a_ij = e^{Z_ij − m_i} / (Σ_j e^{Z_ij − m_i} + e^{s − m_i});
    returns A and the sink's share e^{s − m_i} / (…) of each row."""
    m = np.maximum(Z.max(axis=1, keepdims=True), s)
    E = np.exp(Z - m)
    denominator = E.sum(axis=1, keepdims=True) + np.exp(s - m)
    return E / denominator, np.exp(s - m) / denominator


def _causal(n: int) -> np.ndarray:
    return np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)


def _example_heads(data: dict) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    X = np.array(data["X"], dtype=np.float64)
    return [(X @ np.array(h["W_Q"], dtype=np.float64), X @ np.array(h["W_K"], dtype=np.float64),
             X @ np.array(h["W_V"], dtype=np.float64)) for h in data["heads"]]


@pytest.mark.parametrize("sinks", [[0, 2], [-3, "1/2"], [10, -10], ["0.25", 1]])
def test_each_heads_weights_sink_share_and_output_match_numpy_from_the_formula(tmp_path, sinks):
    """Reference: NumPy written here from a_ij = e^{ŝ_ij − m_i} / (Z_i + e^{s − m_i})."""
    data = _data(EXAMPLE)
    data["sink"] = sinks
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    outputs = []
    for h, (Q, K, V) in enumerate(_example_heads(data), 1):
        s = float(Fraction(str(sinks[h - 1])))
        A, share = _numpy_sink_softmax(Q @ K.T + _causal(3), s)  # scale: none
        assert np.allclose(_floats(d, f"head{h}.A"), A, rtol=0, atol=ATOL)
        assert np.allclose(_floats(d, f"head{h}.A_sink"), share, rtol=0, atol=ATOL)
        assert np.allclose(A.sum(axis=1) + share[:, 0], 1.0, rtol=0, atol=ATOL)
        outputs.append(A @ V)
        assert np.allclose(_floats(d, f"head{h}.O"), outputs[-1], rtol=0, atol=ATOL)
    O = np.concatenate(outputs, axis=1) @ np.array(data["W_O"], dtype=np.float64)
    assert np.allclose(_floats(d, "O"), O, rtol=0, atol=ATOL)
    assert symattn.crosscheck(d).passed


def test_the_example_by_hand():
    """Head 1's row 2 ties its scores 0, 0 with s = 0: 1/3 each and 1/3 to the sink, exactly."""
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    A, share = d.step("head1.A").exact, d.step("head1.A_sink").exact
    assert [A[1, 0], A[1, 1], A[1, 2], share[1, 0]] == [sympy.Rational(1, 3)] * 2 + [0, sympy.Rational(1, 3)]
    e = sympy.E
    # head 2's row 1: score 0 against s = 2, so m_1 = 2 and a_11 = e^{-2} / (e^{-2} + 1)
    assert sympy.simplify(d.step("head2.A").exact[0, 0] - e**-2 / (e**-2 + 1)) == 0
    assert sympy.simplify(d.step("head2.A_sink").exact[0, 0] - 1 / (e**-2 + 1)) == 0


@pytest.mark.parametrize("path", [EXAMPLE, GQA])
def test_each_row_and_its_sink_share_sum_to_one_exactly(tmp_path, path):
    data = _data(path)
    data["sink"] = [1, -1] if path == EXAMPLE else [0, 1, "1/2", -2]
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    for h in range(1, len(data["heads"]) + 1):
        A, share = d.step(f"head{h}.A").exact, d.step(f"head{h}.A_sink").exact
        for i in range(A.rows):
            assert sympy.simplify(sum(A.row(i)) + share[i, 0] - 1) == 0
            assert share[i, 0] != 0


def _hf_eager(torch, Q, K, V, sinks, mask, groups):
    """Hugging Face's gpt-oss attention itself: ``eager_attention_forward`` with a stand-in module
    holding the sinks (Q (1, h, n, d), K and V (1, g, n, d)); returns the output (1, n, h, d_v) and
    the weights (1, h, n, n)."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    module = SimpleNamespace(sinks=torch.tensor(sinks, dtype=torch.float64), num_key_value_groups=groups,
                             training=False)
    return gpt_oss.eager_attention_forward(module, Q, K, V, mask, scaling=1.0)  # the example's scale: none


def test_weights_and_outputs_match_hugging_faces_gpt_oss_eager_attention(tmp_path):
    """Reference: transformers' gpt_oss eager_attention_forward (sink as an extra logit column)."""
    torch = pytest.importorskip("torch")
    data = _data(EXAMPLE)
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    heads = _example_heads(data)
    Q = torch.tensor(np.stack([h[0] for h in heads]))[None]          # (1, h, n, d_k)
    K = torch.tensor(np.stack([h[1] for h in heads]))[None]
    V = torch.tensor(np.stack([h[2] for h in heads]))[None]
    mask = torch.tensor(_causal(3))[None, None]
    out, weights = _hf_eager(torch, Q, K, V, [float(s) for s in data["sink"]], mask, groups=1)
    for h in range(2):
        assert np.allclose(_floats(d, f"head{h + 1}.A"), weights[0, h].numpy(), rtol=0, atol=ATOL)
        assert np.allclose(_floats(d, f"head{h + 1}.O"), out[0, :, h].numpy(), rtol=0, atol=ATOL)


def test_grouped_heads_with_sinks_match_hugging_faces_gpt_oss_eager_attention(tmp_path):
    """Sinks with GQA: 4 query heads, 2 K/V heads, one sink per query head; HF repeats K and V
    itself (num_key_value_groups = 2)."""
    torch = pytest.importorskip("torch")
    data = _data(GQA)
    data["sink"] = [0, 1, "1/2", -2]
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    X = torch.tensor(data["X"], dtype=torch.float64)
    Q = torch.stack([X @ torch.tensor(h["W_Q"], dtype=torch.float64) for h in data["heads"]])[None]
    K = torch.stack([X @ torch.tensor(kv["W_K"], dtype=torch.float64) for kv in data["kv"]])[None]
    V = torch.stack([X @ torch.tensor(kv["W_V"], dtype=torch.float64) for kv in data["kv"]])[None]
    mask = torch.tensor(_causal(3))[None, None]
    # symattn's scale is auto, 1/√d_k with d_k = 1: the same as the scaling 1.0 given to HF
    out, weights = _hf_eager(torch, Q, K, V, [0.0, 1.0, 0.5, -2.0], mask, groups=2)
    for h in range(4):
        assert np.allclose(_floats(d, f"head{h + 1}.A"), weights[0, h].numpy(), rtol=0, atol=ATOL)
        assert np.allclose(_floats(d, f"head{h + 1}.O"), out[0, :, h].numpy(), rtol=0, atol=ATOL)
    assert symattn.crosscheck(d, torch=True).passed  # and SDPA with the sink as one more zero key


def _zero(m) -> bool:
    return all(sympy.simplify(x) == 0 for x in m)


@pytest.mark.parametrize("t", [1, 2, 3])
def test_decoding_with_sinks_and_grouped_heads_equals_the_full_row_exactly(tmp_path, t):
    data = _data(GQA)
    data["sink"] = [0, 1, "1/2", -2]
    path = _write(tmp_path, data)
    full = symattn.derive(symattn.load_problem(path))
    d = symattn.derive(with_decode(symattn.load_problem(path), t))
    for q in range(1, 5):
        assert _zero(d.step(f"head{q}.a_t").exact - full.step(f"head{q}.A").exact[t - 1, :t])
        assert _zero(d.step(f"head{q}.o_t").exact - full.step(f"head{q}.O").exact.row(t - 1))
        assert list(d.step(f"head{q}.o_t_diff").exact) == [0]
    assert symattn.crosscheck(d).passed


def test_sinks_with_the_sink_window_cache_decode_exactly(tmp_path):
    """Both parts together: a learned sink and StreamingLLM's cache, token 6 from keys 1, 5, 6."""
    data = _data(SINK_WINDOW)
    data["sink"] = "3/2"
    path = _write(tmp_path, data)
    d = symattn.derive(symattn.load_problem(path))
    data.pop("decode")
    full = symattn.derive(symattn.load_problem(_write(tmp_path, data, "full.yaml")))
    assert _zero(d.step("o_t").exact - full.step("O").exact.row(5))
    assert list(d.step("o_t_diff").exact) == [0, 0]
    Q, K, V = (np.array(data[k], dtype=np.float64) for k in "QKV")
    kept = [0, 4, 5]
    a, _ = _numpy_sink_softmax((Q[5:6] @ K[kept].T), 1.5)
    assert np.allclose(_floats(d, "a_t"), a, rtol=0, atol=ATOL)
    assert symattn.crosscheck(d).passed


def _mark(d, answers: str):
    from symattn.check import mark, parse_answers

    return {s.id: s for s in mark(d, parse_answers(answers, "answers.yaml", d)).stages}


def _head1_rows(data: dict, sink_in: str) -> list[list]:
    """Head 1 of the example, with mpmath: the weights with the sink left out ('missing') or its
    term added to every allowed numerator ('numerator')."""
    Q, K, _ = _example_heads(data)[0]
    s = float(data["sink"][0])
    rows = []
    with mpmath.workdps(40):
        for i in range(3):
            z = [mpmath.mpf(Q[i] @ K[j]) for j in range(i + 1)]
            m = max(z + [s])
            e = [mpmath.exp(x - m) for x in z]
            total = mpmath.fsum(e) + mpmath.exp(s - m)
            if sink_in == "missing":
                row = [x / mpmath.fsum(e) for x in e]
            else:
                row = [(x + mpmath.exp(s - m)) / total for x in e]
            rows.append(row + [mpmath.mpf(0)] * (2 - i))
    return rows


@pytest.mark.parametrize("slip, name", [("missing", "the sink was left out"),
                                        ("numerator", "the sink was added to the numerator")])
def test_check_names_the_sink_mistakes_in_the_weights_and_the_output(slip, name):
    data = _data(EXAMPLE)
    rows = _head1_rows(data, slip)
    V = _example_heads(data)[0][2]
    with mpmath.workdps(40):
        out = [[mpmath.fsum(r[j] * V[j][0] for j in range(3))] for r in rows]
    text = lambda m: "[" + ", ".join("[" + ", ".join(mpmath.nstr(x, 12) for x in r) + "]" for r in m) + "]"
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    marks = _mark(d, f"head1.A: {text(rows)}\n")
    assert marks["head1.A"].status == "wrong"
    assert marks["head1.A"].diagnosis.text.startswith(name), marks["head1.A"].diagnosis
    marks = _mark(d, f"head1.O: {text(out)}\n")
    assert marks["head1.O"].status == "wrong"
    assert marks["head1.O"].diagnosis.text.startswith(name), marks["head1.O"].diagnosis


def test_check_follows_through_from_the_weights_to_the_sink_share():
    """A slip in head 1's weights (row 1 written 3/4 instead of e/(e+1)): the sink's share read
    from them, 1 − 3/4, follows through."""
    data = _data(EXAMPLE)
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    exact = [[float(x) for x in r] for r in d.step("head1.A").exact.evalf(30).tolist()]
    exact[0][0] = 0.75
    shares = [[1 - sum(r)] for r in exact]
    text = lambda m: "[" + ", ".join("[" + ", ".join(repr(x) for x in r) + "]" for r in m) + "]"
    marks = _mark(d, f"head1.A: {text(exact)}\nhead1.A_sink: {text(shares)}\n")
    assert marks["head1.A"].status == "wrong"
    assert marks["head1.A_sink"].status == "follows"


def test_sinks_from_a_safetensors_checkpoint(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    data = _data(EXAMPLE)
    safetensors_numpy.save_file({"model.layers.0.self_attn.sinks": np.array([0.0, 2.0], dtype=np.float32)},
                                str(tmp_path / "model.safetensors"))
    data["sink"] = {"file": "model.safetensors", "tensor": "model.layers.0.self_attn.sinks"}
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    assert d.problem.sinks == (0, 2)
    want = symattn.derive(symattn.load_problem(EXAMPLE))
    assert d.step("head2.A").exact == want.step("head2.A").exact


@pytest.mark.parametrize("option, fragment", [
    (["--backward"], "--backward: the backward pass with learned sinks is not supported yet"),
    (["--tiled", "2"], "--tiled: the tiled softmax with learned sinks is not supported yet"),
])
def test_options_sinks_do_not_combine_with_are_one_error_line(symattn_cli, option, fragment):
    result = symattn_cli("derive", str(EXAMPLE), *option, "-f", "json")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and fragment in lines[0], result.output


def test_problems_without_sinks_have_no_sink_stage():
    d = symattn.derive(symattn.load_problem(EXAMPLES / "two_heads.yaml"))
    assert not any(i.endswith("A_sink") for i in d.ids)



def test_sinks_with_rope_and_grouped_heads_as_gpt_oss_runs_them(tmp_path):
    """gpt-oss's layout: RoPE, 4 query heads on 2 K/V heads, a sink per query head. Reference: HF's
    eager_attention_forward on the queries and keys rotated here in NumPy (d_k = 2: one pair, the
    token at position p, from 0, turned by p·π/3); the decoded row against the full one exactly."""
    torch = pytest.importorskip("torch")
    data = _data(GQA)
    data["X"] = [[1, 0], [0, 1], [1, 1]]
    data["heads"] = [{"W_Q": [[1, 0], [0, 1]]}, {"W_Q": [[0, 1], [1, 0]]}, {"W_Q": [[1, 1], [0, 1]]},
                     {"W_Q": [[2, 0], [0, 1]]}]
    data["kv"] = [{"W_K": [[1, 0], [1, 1]], "W_V": [[1], [0]]}, {"W_K": [[0, 1], [2, 0]], "W_V": [[0], [1]]}]
    data["rope"] = {"angles": ["pi/3"]}
    data["scale"] = "none"
    data["sink"] = [0, 1, "1/2", -2]
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    X = np.array(data["X"], dtype=np.float64)

    def rotate(x):  # d = 2: one pair, position p turned by p·π/3
        out = np.empty_like(x)
        for p_, (a, b) in enumerate(x):
            c, s = np.cos(p_ * np.pi / 3), np.sin(p_ * np.pi / 3)
            out[p_] = [a * c - b * s, a * s + b * c]
        return out

    Q = torch.tensor(np.stack([rotate(X @ np.array(h["W_Q"], dtype=np.float64)) for h in data["heads"]]))[None]
    K = torch.tensor(np.stack([rotate(X @ np.array(kv["W_K"], dtype=np.float64)) for kv in data["kv"]]))[None]
    V = torch.tensor(np.stack([X @ np.array(kv["W_V"], dtype=np.float64) for kv in data["kv"]]))[None]
    out, weights = _hf_eager(torch, Q, K, V, [0.0, 1.0, 0.5, -2.0], torch.tensor(_causal(3))[None, None], groups=2)
    for h in range(4):
        assert np.allclose(_floats(d, f"head{h + 1}.A"), weights[0, h].numpy(), rtol=0, atol=ATOL)
        assert np.allclose(_floats(d, f"head{h + 1}.O"), out[0, :, h].numpy(), rtol=0, atol=ATOL)
    assert symattn.crosscheck(d, torch=True).passed
    decoded = symattn.derive(with_decode(d.problem, 3))
    for q in range(1, 5):
        assert _zero(decoded.step(f"head{q}.o_t").exact - d.step(f"head{q}.O").exact.row(2))
