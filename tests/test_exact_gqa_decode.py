"""Grouped-query / multi-query attention (``kv_heads``) and decoding one token from the KV cache
(``decode: t``).

The references are written here: the problems are read with ``yaml.safe_load`` (entries are
small integers), GQA is computed in NumPy by repeating each K/V head ``h/g`` times
(``np.repeat``, PyTorch's ``repeat_interleave`` and Hugging Face's ``repeat_kv`` order: query
head q reads K/V head q // (h/g)) and by PyTorch's ``scaled_dot_product_attention(...,
enable_gqa=True)``; a decoded row is compared with row t of the full causal derivation by exact
SymPy equality; marked answers are built with mpmath from the scores worked out here.
"""

from __future__ import annotations

import json
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
GQA = EXAMPLES / "gqa_4_heads_2_kv.yaml"
MQA = EXAMPLES / "mqa.yaml"
DECODE = EXAMPLES / "decode_step.yaml"
GROUPED = [GQA, MQA]


def _data(path: Path) -> dict:
    return yaml.safe_load(path.read_text("utf-8"))


def _arr(m) -> np.ndarray:
    return np.array(m, dtype=np.float64)


def _causal(n: int) -> np.ndarray:
    return np.where(np.tril(np.ones((n, n), dtype=bool)), 0.0, -np.inf)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _repeat_kv_reference(data: dict) -> dict:
    """Each head's weights and output, the K/V heads repeated h/g times (repeat_interleave order)."""
    X = _arr(data["X"])
    h, g = len(data["heads"]), data["kv_heads"]
    Q = np.stack([X @ _arr(head["W_Q"]) for head in data["heads"]])        # (h, n, d_k)
    K = np.stack([X @ _arr(kv["W_K"]) for kv in data["kv"]])               # (g, n, d_k)
    V = np.stack([X @ _arr(kv["W_V"]) for kv in data["kv"]])               # (g, n, d_v)
    K, V = np.repeat(K, h // g, axis=0), np.repeat(V, h // g, axis=0)      # (h, n, ·): head q reads q // (h/g)
    d_k = Q.shape[-1]
    A = _softmax(Q @ K.transpose(0, 2, 1) / np.sqrt(d_k) + _causal(X.shape[0]))
    O = A @ V
    final = np.concatenate(list(O), axis=1) @ _arr(data["W_O"])
    return {"A": A, "O": O, "K": K, "V": V, "final": final}


@pytest.mark.parametrize("path", GROUPED, ids=lambda p: p.stem)
def test_grouped_heads_match_a_numpy_reference_that_repeats_k_and_v(path):
    data = _data(path)
    ref = _repeat_kv_reference(data)
    d = symattn.derive(symattn.load_problem(path))
    h, g = len(data["heads"]), data["kv_heads"]
    for q in range(h):
        np.testing.assert_allclose(d.approx(f"head{q + 1}.A"), ref["A"][q], atol=1e-12)
        np.testing.assert_allclose(d.approx(f"head{q + 1}.O"), ref["O"][q], atol=1e-12)
    np.testing.assert_allclose(d.approx("O"), ref["final"], atol=1e-12)
    # each group's K and V appear once, under the id of the group's first head
    size = h // g
    for group in range(g):
        first = group * size + 1
        np.testing.assert_allclose(d.approx(f"head{first}.K"), ref["K"][group * size], atol=0)
        np.testing.assert_allclose(d.approx(f"head{first}.V"), ref["V"][group * size], atol=0)
        for other in range(first + 1, first + size):
            for name in ("W_K", "W_V", "K", "V", "K_T"):
                assert f"head{other}.{name}" not in d.ids
    assert symattn.crosscheck(d, torch=False).passed


@pytest.mark.parametrize("path", GROUPED, ids=lambda p: p.stem)
def test_grouped_heads_match_torch_sdpa_with_enable_gqa(path):
    torch = pytest.importorskip("torch")
    data = _data(path)
    X = torch.tensor(data["X"], dtype=torch.float64)
    Q = torch.stack([X @ torch.tensor(head["W_Q"], dtype=torch.float64) for head in data["heads"]])
    K = torch.stack([X @ torch.tensor(kv["W_K"], dtype=torch.float64) for kv in data["kv"]])
    V = torch.stack([X @ torch.tensor(kv["W_V"], dtype=torch.float64) for kv in data["kv"]])
    F = torch.nn.functional
    O = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
    d = symattn.derive(symattn.load_problem(path))
    for q in range(len(data["heads"])):
        np.testing.assert_allclose(d.approx(f"head{q + 1}.O"), O[q].numpy(), atol=1e-12)
    # torch's grouping is the repeat_interleave one the NumPy reference uses
    np.testing.assert_allclose(O.numpy(), _repeat_kv_reference(data)["O"], atol=1e-12)
    assert symattn.crosscheck(d, torch=True).torch.passed


def test_the_gqa_example_tells_the_groupings_apart():
    """Interleaved (tiled) grouping would give other outputs here, so the tests above can tell."""
    data = _data(GQA)
    X = _arr(data["X"])
    K = np.stack([X @ _arr(kv["W_K"]) for kv in data["kv"]])
    V = np.stack([X @ _arr(kv["W_V"]) for kv in data["kv"]])
    tiled_K, tiled_V = np.tile(K, (2, 1, 1)), np.tile(V, (2, 1, 1))  # head q reads q % g
    Q = np.stack([X @ _arr(head["W_Q"]) for head in data["heads"]])
    tiled = _softmax(Q @ tiled_K.transpose(0, 2, 1) + _causal(3)) @ tiled_V
    assert not np.allclose(tiled, _repeat_kv_reference(data)["O"])


def test_the_solution_says_which_heads_read_which_group_and_the_cache_size():
    data = _data(GQA)
    h, g = len(data["heads"]), data["kv_heads"]
    d_k = len(data["heads"][0]["W_Q"][0])
    d = symattn.derive(symattn.load_problem(GQA))
    text = symattn.render_text(d)
    assert "Heads 1 and 2 read K/V group 1" in text and "Heads 3 and 4 read K/V group 2" in text
    assert "Head 2 reads K/V group 1 (K⁽¹⁾ and V⁽¹⁾)" in text
    assert "Head 4 · Step 2: Project to queries (K/V of group 2 above)" in text
    assert f"2 · {g} · {d_k} = {2 * g * d_k}" in text and f"2 · {h} · {d_k} = {2 * h * d_k}" in text
    latex, markdown = symattn.render_latex(d), symattn.render_markdown(d)
    for out in (latex, markdown, symattn.render_html(d)):  # said once at the top too
        assert "heads 1 and 2 read K/V group 1; heads 3 and 4 read K/V group 2" in out
    for out in (latex, markdown):
        assert "K/V group 1" in out and f"2 \\cdot {g} \\cdot {d_k} = {2 * g * d_k}" in out
    out = json.loads(symattn.render_json(d))
    assert out["kv_groups"] == [{"group": 1, "heads": [1, 2], "key_id": "head1.K", "value_id": "head1.V"},
                                {"group": 2, "heads": [3, 4], "key_id": "head3.K", "value_id": "head3.V"}]
    assert out["kv_cache"]["per_token"] == 2 * g * d_k and out["kv_cache"]["without_sharing"] == 2 * h * d_k
    assert [s["id"] for s in out["stages"]] == list(d.ids)


def test_mqa_every_head_reads_the_one_group():
    d = symattn.derive(symattn.load_problem(MQA))
    text = symattn.render_text(d)
    assert "Heads 1, 2 and 3 read K/V group 1" in text and "multi-query attention" in text
    assert [i for i in d.ids if i.endswith(".K")] == ["head1.K"]
    assert json.loads(symattn.render_json(d))["kv_cache"]["per_token"] == 2 * 1 * 1


def test_non_grouped_problems_keep_their_ids_and_json():
    d = symattn.derive(symattn.load_problem(EXAMPLES / "two_heads.yaml"))
    assert "head2.K" in d.ids and "head2.K_T" in d.ids
    out = json.loads(symattn.render_json(d))
    assert set(out) == {"title", "dims", "stages"}


def test_check_follows_through_from_a_groups_keys_to_another_heads_scores():
    # head1.K = X·W_K of group 1 = [[1], [1], [2]]; a slip in its last entry carries into head 2's
    # scores, which read group 1's keys: head 2's queries X·W_Q = [0, 1, 1] times the slipped keys
    answers = "head1.K: [[1], [1], [3]]\nhead2.S: [[0, 0, 0], [1, 1, 3], [1, 1, 3]]\n"
    d = symattn.derive(symattn.load_problem(GQA))
    from symattn.check import mark, parse_answers

    marking = mark(d, parse_answers(answers, "answers.yaml", d))
    status = {s.id: s.status for s in marking.stages}
    assert status == {"head1.K": "wrong", "head2.S": "follows"}


# -- decoding ----------------------------------------------------------------------------------


def _decoded(path: Path, t: int):
    return symattn.derive(with_decode(symattn.load_problem(path), t))


def _zero(m) -> bool:
    return all(sympy.simplify(x) == 0 for x in m)


@pytest.mark.parametrize("t", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ["causal_4_tokens", "causal_dk2"])
def test_the_decoded_row_equals_row_t_of_the_full_causal_derivation_exactly(name, t):
    d = _decoded(EXAMPLES / f"{name}.yaml", t)
    full = symattn.derive(symattn.load_problem(EXAMPLES / f"{name}.yaml"))  # without decode: its own derivation
    A, O = full.step("A").exact, full.step("O").exact
    a_t, o_t = d.step("a_t").exact, d.step("o_t").exact
    assert a_t.shape == (1, t)
    assert all(sympy.simplify(a_t[0, j] - A[t - 1, j]) == 0 for j in range(t))
    assert all(A[t - 1, j] == 0 for j in range(t, A.cols))  # the keys the cache leaves out had weight 0
    assert _zero(o_t - O.row(t - 1))
    assert list(d.step("o_t_diff").exact) == [0] * O.cols  # exactly 0 as derived, not only simplified
    assert d.step("K_cache").exact == full.step("K").exact[:t, :]
    assert d.step("V_cache").exact == full.step("V").exact[:t, :]
    assert d.step("q_t").exact == full.step("Q").exact[t - 1:t, :]
    assert symattn.crosscheck(d).passed


def test_decoding_the_grouped_example_reads_each_groups_cache():
    d = _decoded(GQA, 2)
    full = symattn.derive(symattn.load_problem(GQA))
    assert [i for i in d.ids if i.endswith("K_cache")] == ["head1.K_cache", "head3.K_cache"]
    for q in range(1, 5):
        assert _zero(d.step(f"head{q}.o_t").exact - full.step(f"head{q}.O").exact.row(1))
    text = symattn.render_text(d)
    assert "the KV cache holds 2 g dₖ = 2 · 2 · 1 = 4 numbers per token per layer" in text
    assert symattn.crosscheck(d).passed


def test_decode_cost_table():
    data = _data(DECODE)
    d_k, d_v = len(data["W_Q"][0]), len(data["W_V"][0])
    n = len(data["X"])
    d = symattn.derive(symattn.load_problem(DECODE))
    want = [[t * d_k, t * d_v, t * t * d_k, t * t * d_v] for t in range(1, n + 1)]
    assert d.step("step_cost").exact.tolist() == want
    assert d.step("step_cost").rows == tuple(f"t = {t}" for t in range(1, n + 1))
    for out in (symattn.render_text(d), symattn.render_markdown(d), symattn.render_latex(d, standalone=True),
                symattn.render_html(d)):
        assert "scores (cache)" in out and "scores (full)" in out
    out = json.loads(symattn.render_json(d))
    assert out["decode"] == {"token": 3, "row": 2, "label": "sat", "equals_full_row": True}
    assert next(s for s in out["stages"] if s["id"] == "step_cost")["exact"] == [[str(x) for x in r] for r in want]


def _scaled_row(data: dict, t: int) -> list:
    """Row t of the unmasked scaled scores, by hand: (x_t W_Q)·(x_j W_K) / √d_k."""
    X, WQ, WK = (np.array(data[k], dtype=object) for k in ("X", "W_Q", "W_K"))
    Q, K = X.dot(WQ), X.dot(WK)
    d_k = WQ.shape[1]
    return [mpmath.mpf(int(Q[t - 1].dot(K[j]))) / mpmath.sqrt(d_k) for j in range(len(X))]


def test_check_names_a_cache_row_that_used_a_future_key():
    data = _data(DECODE)
    t, n = data["decode"], len(data["X"])
    V = np.array(data["X"], dtype=object).dot(np.array(data["W_V"], dtype=object))
    s = _scaled_row(data, t)
    with mpmath.workdps(40):
        e = [mpmath.exp(x - max(s)) for x in s]
        future = [x / mpmath.fsum(e) for x in e]  # normalised over all n keys
        o = [mpmath.fsum(future[j] * int(V[j][c]) for j in range(n)) for c in range(V.shape[1])]
    answers = (f"s_t: [{[mpmath.nstr(x, 12) for x in s[:t]]}]\n".replace("'", "")
               + f"a_t: [[{', '.join(mpmath.nstr(x, 10) for x in future[:t])}]]\n"
               + f"o_t: [[{', '.join(mpmath.nstr(x, 10) for x in o)}]]\n")
    d = symattn.derive(symattn.load_problem(DECODE))
    from symattn.check import mark, parse_answers

    marking = {s.id: s for s in mark(d, parse_answers(answers, "answers.yaml", d)).stages}
    assert marking["s_t"].status == "right"  # using a future key changes no cached score
    for id in ("a_t", "o_t"):
        assert marking[id].status == "wrong"
        assert marking[id].diagnosis.text.startswith("the cache row used a future key"), marking[id].diagnosis
    # the right row is marked right
    with mpmath.workdps(40):
        e = e[:t]
        right = [x / mpmath.fsum(e) for x in e]
    good = f"a_t: [[{', '.join(mpmath.nstr(x, 10) for x in right)}]]\n"
    assert mark(d, parse_answers(good, "answers.yaml", d)).stages[0].status == "right"


def test_check_follows_through_from_the_key_cache():
    data = _data(DECODE)
    K = np.array(data["X"], dtype=object).dot(np.array(data["W_K"], dtype=object))[:3].tolist()
    K[2][3] += 1  # a slip in the cached key of token 3
    Q3 = np.array(data["X"], dtype=object).dot(np.array(data["W_Q"], dtype=object))[2]
    s = [sympy.Rational(int(Q3.dot(np.array(k, dtype=object))), 2) for k in K]  # d_k = 4: divided by 2
    answers = f"K_cache: {K}\ns_t: [[{', '.join(str(x) for x in s)}]]\n"
    d = symattn.derive(symattn.load_problem(DECODE))
    from symattn.check import mark, parse_answers

    status = {s.id: s.status for s in mark(d, parse_answers(answers, "answers.yaml", d)).stages}
    assert status == {"K_cache": "wrong", "s_t": "follows"}


def test_a_cache_row_with_a_key_after_t_is_refused_naming_the_future_key(symattn_cli, tmp_path):
    answers = tmp_path / "a.yaml"
    answers.write_text("a_t: [[0.1, 0.2, 0.3, 0.4]]\n")
    result = symattn_cli("check", str(DECODE), str(answers))
    assert result.exit_code == 1
    assert "used a future key" in result.output


@pytest.mark.parametrize("args, fragment", [
    (["causal_4_tokens.yaml", "--decode", "0"], "--decode: token 0 is out of range: there are 4 tokens"),
    (["causal_4_tokens.yaml", "--decode", "5"], "--decode: token 5 is out of range"),
    (["bert_unmasked.yaml", "--decode", "2"], "--decode: decoding from a KV cache needs the causal mask"),
    (["cross_attention_top_left.yaml", "--decode", "1"], "--decode: decoding from a KV cache is for causal self-attention"),
    (["cross_attention_bottom_right.yaml", "--decode", "1"], "--decode: decoding from a KV cache is for causal"),
])
def test_decode_option_refuses_with_one_error_line(symattn_cli, args, fragment):
    result = symattn_cli("derive", str(EXAMPLES / args[0]), *args[1:], "-f", "json")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {EXAMPLES / args[0]}: ") and fragment in lines[0]


def test_decode_option_matches_the_field(symattn_cli):
    by_option = symattn_cli("derive", str(EXAMPLES / "causal_4_tokens.yaml"), "--decode", "3",
                            "-f", "json", "--no-check")
    assert by_option.exit_code == 0, by_option.output
    by_field = json.loads(symattn.render_json(symattn.derive(symattn.load_problem(DECODE))))
    stages = {s["id"]: s["exact"] for s in json.loads(by_option.output)["stages"]}
    for s in by_field["stages"]:
        if s["id"] in ("K_cache", "V_cache", "q_t", "s_t", "a_t", "o_t", "o_t_diff", "step_cost"):
            assert stages[s["id"]] == s["exact"]


def test_an_answer_for_a_grouped_heads_keys_points_to_its_group(symattn_cli, tmp_path):
    answers = tmp_path / "a.yaml"
    answers.write_text("head4.V: [[0], [1], [1]]\n")
    result = symattn_cli("check", str(GQA), str(answers))
    assert result.exit_code == 1
    assert result.output.strip() == (f"Error: {answers}:1:1: head 4 reads K/V group 2, whose V is head3.V "
                                      "(a group's keys and values are written once, with its first head)")


def test_every_new_feature_together_is_cross_checked(tmp_path):
    """LLaMA-style: grouped K/V heads with RoPE (the cache holds the rotated keys), the online softmax
    and a decoding step in one problem; NumPy and, where installed, PyTorch agree with every stage."""
    import symattn

    path = tmp_path / "together.yaml"
    path.write_text(
        "tokens: [a, b, c]\n"
        "X: [[1, 0], [0, 1], [1, 1]]\n"
        "kv_heads: 1\n"
        "heads:\n  - W_Q: [[1, 0], [0, 1]]\n  - W_Q: [[0, 1], [1, 0]]\n"
        "kv:\n  - {W_K: [[1, 0], [0, 1]], W_V: [[1], [0]]}\n"
        "W_O: [[1], [1]]\n"
        'rope: {angles: ["pi/2"]}\n'
        "mask: causal\n"
        "tiling: {block: 2}\n"
        "decode: 3\n", "utf-8")
    d = symattn.derive(symattn.load_problem(path))
    # the decoded row reads the rotated keys: K_cache is the first t rows of K_rot
    assert d.step("head1.K_cache").exact == d.step("head1.K_rot").exact[:3, :]
    assert d.step("head2.q_t").exact == d.step("head2.Q_rot").exact[2:3, :]
    assert all(x == 0 for x in d.step("head2.o_t_diff").exact)
    try:
        import torch  # noqa: F401
        with_torch = True
    except ImportError:
        with_torch = False
    check = symattn.crosscheck(d, torch=with_torch)
    assert check.passed, check.all_mismatches[:3]
    from symattn.render import render

    for form in ("html", "markdown", "text", "json", "latex"):
        assert "cache" in render(d, form, check=check)
