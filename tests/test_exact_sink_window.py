"""StreamingLLM's sink tokens with a sliding window (``mask: {sink: k, window: w}``), and decoding
from the cache that keeps only the sink tokens and the window.

References written here: the allowed keys from the rule (key j ≤ i is kept when it is one of the
first k or when i − j < w), NumPy's softmax from the formula, PyTorch's
``F.scaled_dot_product_attention`` with an explicit float mask (0 allowed, −inf masked), and the
decoded row compared with row t of the full masked derivation by exact SymPy equality (the
difference simplifies to 0). Problems are read with ``yaml.safe_load`` (small integers).
"""

from __future__ import annotations

from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn.problem.passes import with_decode

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
EXAMPLE = EXAMPLES / "sink_window.yaml"
GQA = EXAMPLES / "gqa_4_heads_2_kv.yaml"


def _data(path: Path) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def _allowed(n: int, sink: int, window: int) -> np.ndarray:
    """StreamingLLM's rule by hand: causal, and the key is a sink token or inside the window."""
    return np.array([[j <= i and (j < sink or i - j < window) for j in range(n)] for i in range(n)])


def _numpy_attention(Q, K, V, allowed, scale=1.0):
    """softmax(Q·Kᵀ·scale + M)·V with M = 0 / −inf from ``allowed`` (NumPy, float64)."""
    Z = Q @ K.T * scale + np.where(allowed, 0.0, -np.inf)
    E = np.exp(Z - Z.max(axis=1, keepdims=True))
    A = E / E.sum(axis=1, keepdims=True)
    return A, A @ V


# float64 against values rounded from 30 digits: a softmax over 6 keys and a product with 2-digit
# values lose a few units in the last place (2.2e-16 each); 1e-13 leaves room for that, no more
ATOL = 1e-13


from test_exact_sinks import _floats, _write  # noqa: E402  (the sinks' tests' helpers: 30-digit values, a problem file)


def test_the_mask_is_the_sink_tokens_and_the_window():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    p = d.problem
    assert p.mask.kind == "sink-window" and (p.mask.sink, p.mask.window) == (1, 2)
    assert np.array_equal(np.array(p.mask.allowed), _allowed(6, 1, 2))
    # query 6 sees key 1 (the sink) and keys 5, 6 (its window of 2, itself included)
    assert [j + 1 for j, ok in enumerate(p.mask.allowed[5]) if ok] == [1, 5, 6]


@pytest.mark.parametrize("sink, window", [(1, 1), (1, 2), (2, 2), (2, 3), (4, 8)])
def test_weights_and_output_match_numpy_from_the_formula(tmp_path, sink, window):
    """Reference: NumPy written here from softmax(QKᵀ/√d_k + M)·V with the rule's mask."""
    data = _data(EXAMPLE)
    data["mask"] = {"sink": sink, "window": window}
    data.pop("decode")
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    Q, K, V = (np.array(data[k], dtype=np.float64) for k in "QKV")
    A, O = _numpy_attention(Q, K, V, _allowed(len(Q), sink, window))
    assert np.allclose(_floats(d, "A"), A, rtol=0, atol=ATOL)
    assert np.allclose(_floats(d, "O"), O, rtol=0, atol=ATOL)


def test_weights_and_output_match_torch_sdpa_with_an_explicit_float_mask():
    """Reference: PyTorch's scaled_dot_product_attention with attn_mask a float mask (0 / −inf)."""
    torch = pytest.importorskip("torch")
    data = _data(EXAMPLE)
    Q, K, V = (torch.tensor(data[k], dtype=torch.float64) for k in "QKV")
    allowed = torch.tensor(_allowed(6, 1, 2))
    mask = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    O = torch.nn.functional.scaled_dot_product_attention(Q[None], K[None], V[None], attn_mask=mask, scale=1.0)[0]
    A = torch.nn.functional.scaled_dot_product_attention(Q[None], K[None], torch.eye(6, dtype=torch.float64)[None],
                                                         attn_mask=mask, scale=1.0)[0]
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    assert np.allclose(_floats(d, "A"), A.numpy(), rtol=0, atol=ATOL)
    assert np.allclose(_floats(d, "O"), O.numpy(), rtol=0, atol=ATOL)


def _zero(m) -> bool:
    return all(sympy.simplify(x) == 0 for x in m)


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 6])
def test_decoding_from_the_sink_window_cache_equals_the_full_masked_row_exactly(t):
    """Exact: o_t − O[t, :] simplifies to 0, and the cache holds the sink tokens and the window only."""
    problem = with_decode(symattn.load_problem(EXAMPLE), t)
    d = symattn.derive(problem)
    full = symattn.derive(symattn.load_problem(EXAMPLE))
    kept = [j for j in range(t) if j < 1 or t - 1 - j < 2]  # the rule by hand: key 1, then keys t−1 and t
    assert d.step("K_cache").exact == full.step("K").exact.extract(kept, [0, 1])
    assert d.step("V_cache").exact == full.step("V").exact.extract(kept, [0, 1])
    assert d.step("K_cache").rows == tuple(problem.key_tokens[j] for j in kept)
    A, O = full.step("A").exact, full.step("O").exact
    a_t = d.step("a_t").exact
    assert a_t.shape == (1, len(kept))
    assert all(sympy.simplify(a_t[0, c] - A[t - 1, j]) == 0 for c, j in enumerate(kept))
    assert all(A[t - 1, j] == 0 for j in range(6) if j not in kept)  # the evicted keys had weight exactly 0
    assert _zero(d.step("o_t").exact - O.row(t - 1))
    assert list(d.step("o_t_diff").exact) == [0, 0]
    assert symattn.crosscheck(d).passed


def test_the_solution_states_the_cache_size_and_the_cost_table_uses_it():
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    text = symattn.render_text(d)
    assert "The cache holds rows 1, 5 to 6 of K: 3 keys, never more than 1 + 2 = 3" in text
    assert "K_cache = K[1, 5..6, :]" in text
    want = [[min(t, 3) * 2, min(t, 3) * 2, t * t * 2, t * t * 2] for t in range(1, 7)]
    assert d.step("step_cost").exact.tolist() == want


def test_sink_window_with_grouped_heads_decodes_each_groups_cache_exactly(tmp_path):
    """GQA with the sink window: 4 query heads, 2 K/V groups, 5 tokens, sink 1 and window 2, token 5."""
    torch = pytest.importorskip("torch")
    data = _data(GQA)
    data["X"] = data["X"] + [[2, 1], [0, 2]]
    data["tokens"] = data["tokens"] + ["and", "left"]
    data["mask"] = {"sink": 1, "window": 2}
    full = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    data["decode"] = 5
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data, "decode.yaml")))
    assert [i for i in d.ids if i.endswith("K_cache")] == ["head1.K_cache", "head3.K_cache"]
    for q in range(1, 5):
        assert d.step(f"head{q}.a_t").exact.shape == (1, 3)  # keys 1, 4 and 5
        assert _zero(d.step(f"head{q}.o_t").exact - full.step(f"head{q}.O").exact.row(4))
    # each head's weights against SDPA with enable_gqa and the explicit float mask
    X = torch.tensor(data["X"], dtype=torch.float64)
    Q = torch.stack([X @ torch.tensor(h["W_Q"], dtype=torch.float64) for h in data["heads"]])
    K = torch.stack([X @ torch.tensor(kv["W_K"], dtype=torch.float64) for kv in data["kv"]])
    eye = torch.eye(5, dtype=torch.float64).expand(2, -1, -1)
    mask = torch.zeros(5, 5, dtype=torch.float64).masked_fill(~torch.tensor(_allowed(5, 1, 2)), float("-inf"))
    A = torch.nn.functional.scaled_dot_product_attention(Q, K, eye, attn_mask=mask, enable_gqa=True)
    for q in range(4):
        assert np.allclose(_floats(full, f"head{q + 1}.A"), A[q].numpy(), rtol=0, atol=ATOL)
    assert symattn.crosscheck(d).passed


def test_check_names_a_cache_that_evicted_nothing():
    """A student who kept every key 1..6 in the cache: o_t over all of them, with mpmath here."""
    data = _data(EXAMPLE)
    Q, K, V = (np.array(data[k], dtype=object) for k in "QKV")
    s = [int(Q[5].dot(K[j])) for j in range(6)]  # scale: none
    with mpmath.workdps(40):
        e = [mpmath.exp(x - max(s)) for x in s]
        o = [mpmath.fsum(e[j] * int(V[j][c]) for j in range(6)) / mpmath.fsum(e) for c in range(2)]
    answers = f"o_t: [[{', '.join(mpmath.nstr(x, 12) for x in o)}]]\n"
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    from symattn.check import mark, parse_answers

    stage = mark(d, parse_answers(answers, "answers.yaml", d)).stages[0]
    assert stage.status == "wrong"
    assert stage.diagnosis.text.startswith("the cache kept every earlier key"), stage.diagnosis


def test_check_follows_through_from_the_sink_window_cache():
    data = _data(EXAMPLE)
    K = [data["K"][0], data["K"][4], data["K"][5]]
    K = [list(r) for r in K]
    K[1][0] += 1  # a slip in the cached key of token 5
    q = data["Q"][5]
    s = [q[0] * k[0] + q[1] * k[1] for k in K]
    answers = f"K_cache: {K}\ns_t: [{s}]\n"
    d = symattn.derive(symattn.load_problem(EXAMPLE))
    from symattn.check import mark, parse_answers

    status = {s.id: s.status for s in mark(d, parse_answers(answers, "answers.yaml", d)).stages}
    assert status == {"K_cache": "wrong", "s_t": "follows"}


def test_a_sink_window_in_a_list_is_anded_with_the_others(tmp_path):
    data = _data(EXAMPLE)
    data.pop("decode")
    data["mask"] = [{"sink": 1, "window": 2}, {"valid-length": 5}]
    d = symattn.derive(symattn.load_problem(_write(tmp_path, data)))
    want = _allowed(6, 1, 2) & (np.arange(6) < 5)[None, :]
    assert np.array_equal(np.array(d.problem.mask.allowed), want)
    assert symattn.crosscheck(d).passed


def test_the_json_names_the_cached_keys():
    import json

    out = json.loads(symattn.render_json(symattn.derive(symattn.load_problem(EXAMPLE))))
    assert out["decode"] == {"token": 6, "row": 5, "label": "mat", "equals_full_row": True,
                             "cached_rows": [0, 4, 5], "max_cached": 3}
    causal = json.loads(symattn.render_json(symattn.derive(symattn.load_problem(EXAMPLES / "decode_step.yaml"))))
    assert "cached_rows" not in causal["decode"]  # a causal cache: keys 1..t, as before
