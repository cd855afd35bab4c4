"""Projection biases: Q = X W_Q + b_Q, K = C W_K + b_K, V = C W_V + b_V and O = concat W_O + b_O.

Checked by hand (fractions written out here), against NumPy written in the test, against
PyTorch's own modules (``F.linear`` and ``nn.MultiheadAttention(bias=True)``) and their autograd,
and through every renderer, the bad-input messages and ``symattn check``'s marking.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy
import yaml

import symattn
from symattn import SymattnError, derive, load_problem
from symattn.check import mark, parse_answers
from symattn.reference.numeric import numeric_stages
from symattn.reference.numeric_backward import numeric_gradients

from test_render_latex import compile_latex, pdf_text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "worked_examples" / "projection_bias.yaml"

SINGLE = """\
X: [[1, 0], [0, 1], [1, 1]]
W_Q: [[1, 2], [0, 1]]
b_Q: [1, -1]
W_K: [[1, 0], [1, 1]]
b_K: [[0, 2]]
W_V: [[2, 1], [1, 0]]
b_V: [1/2, 3]
mask: causal
backward:
  loss: sum
"""


def fractions(m) -> list[list[Fraction]]:
    return [[Fraction(int(x.p), int(x.q)) for x in row] for row in sympy.Matrix(m).tolist()]


def hand_product(a, b) -> list[list[Fraction]]:
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def plus_row(m, row) -> list[list[Fraction]]:
    return [[x + b for x, b in zip(r, row)] for r in m]


def close(got, want, rel=1e-12) -> None:
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= rel * max(1.0, float(np.abs(want).max())), (got, want)


def values(d, sid) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in d.evaluate(sid, 30)])


# -- 1. the numbers, by hand ---------------------------------------------------------------


def test_projections_by_hand():
    d = derive(load_problem(SINGLE))
    X = [[1, 0], [0, 1], [1, 1]]
    Q = plus_row(hand_product(X, [[1, 2], [0, 1]]), [1, -1])
    K = plus_row(hand_product(X, [[1, 0], [1, 1]]), [0, 2])
    V = plus_row(hand_product(X, [[2, 1], [1, 0]]), [Fraction(1, 2), 3])
    assert Q == [[2, 1], [1, 0], [2, 2]]  # X row 1 = (1, 0): (1, 2) + (1, −1)
    assert fractions(d.step("Q").exact) == Q
    assert fractions(d.step("K").exact) == K
    assert fractions(d.step("V").exact) == V
    assert fractions(d.step("b_V").exact) == [[Fraction(1, 2), 3]]
    # the scores read the biased queries and keys
    assert fractions(d.step("S").exact) == hand_product(Q, [list(c) for c in zip(*K)])


def test_output_bias_by_hand_in_the_exact_entries_and_every_renderer():
    """Row 1 of the worked example: head 1 sees only token 1 (value 2), head 2 too (value 1);
    concat = (2, 1), times W_O = [[1, 2], [1, −1]] gives (3, 3), plus b_O = (1/2, 0): (7/2, 3)."""
    d = derive(load_problem(EXAMPLE))
    O = d.step("O")
    assert O.exact[0, 0] == sympy.Rational(7, 2) and O.exact[0, 1] == 3
    # every other entry: the exact value minus b_O is concat·W_O
    concat, W_O = d.step("concat").exact, d.step("W_O").exact
    for i in range(3):
        for j in range(2):
            plain = sum(concat[i, k] * W_O[k, j] for k in range(2))
            assert sympy.simplify(O.exact[i, j] - plain - [sympy.Rational(1, 2), 0][j]) == 0
    text = symattn.render_text(d)
    block = text[text.index("Output projection (O)"):]
    assert re.search(r"I\s+\[\s*7/2\s+3\]", block), block[:800]
    markdown = symattn.render_markdown(d)
    assert r"O = \operatorname{concat}\,W_O + b_O" in markdown
    assert r"\text{I} & \dfrac{7}{2} & 3" in markdown.split(r"O = \operatorname{concat}\,W_O + b_O")[1][:400]


def test_the_worked_entry_adds_the_bias():
    d = derive(load_problem(SINGLE))
    (dot,) = d.step("Q").worked
    assert dot.bias == 1 and dot.value == 2  # Q_11 = 1·1 + 0·0 + 1
    latex = symattn.render_latex(d, standalone=True)
    assert r"Q_{11} = x_{1} \cdot W_{Q}[:,1] + b_{Q,1} = 1 \cdot 1 + 0 \cdot 0 + 1 = 2" in latex
    assert r"Q = X\,W_{Q} + b_{Q}" in latex


def test_gradients_by_hand():
    """db = the column sums of the projection's gradient; db_K is exactly 0 (a key bias adds a
    constant to each row of scores); db_V = 1ᵀ Aᵀ dO is the column sums of dO (A's rows sum to 1)."""
    d = derive(load_problem(SINGLE))
    for g in ("Q", "K", "V"):
        grad = d.evaluate("d" + g, 40)
        with mpmath.workdps(40):
            sums = [mpmath.fsum(col) for col in zip(*grad)]
        got = d.evaluate("db_" + g, 40)[0]
        assert all(abs(x - y) <= mpmath.mpf(10) ** -30 * max(1, abs(y)) for x, y in zip(got, sums)), (g, got, sums)
    assert all(x == 0 for x in d.step("db_K").exact)
    assert d.evaluate("db_K", 30) == [[0, 0]]
    assert all(abs(x - 3) < mpmath.mpf(10) ** -25 for x in d.evaluate("db_V", 30)[0])  # L = Σ O: 3 rows of ones


# -- 2. NumPy and PyTorch ------------------------------------------------------------------


def test_numpy_written_here():
    p = load_problem(EXAMPLE)
    d = derive(p)
    X = np.array([[1, 0], [0, 1], [1, 1]], dtype=float)
    raw = yaml.safe_load(EXAMPLE.read_text("utf-8"))
    outputs = []
    for h, head in enumerate(raw["heads"], 1):
        def proj(w, b):
            return X @ np.array(head[w], dtype=float) + np.array([float(Fraction(str(x))) for x in head[b]])
        Q, K, V = proj("W_Q", "b_Q"), proj("W_K", "b_K"), proj("W_V", "b_V")
        S = Q @ K.T + np.where(np.tril(np.ones((3, 3))) > 0, 0.0, -np.inf)  # scale: none
        A = np.exp(S - S.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        for name, m in (("Q", Q), ("K", K), ("V", V), ("A", A)):
            close(values(d, f"head{h}.{name}"), m)
        outputs.append(A @ V)
    O = np.hstack(outputs) @ np.array(raw["W_O"], dtype=float) + np.array([0.5, 0.0])
    close(values(d, "O"), O)
    ref = numeric_stages(p)
    for sid in ("head1.b_Q", "head2.b_V", "b_O", "O"):
        close(ref[sid], values(d, sid))


def test_crosscheck_passes_with_biases_everywhere():
    pytest.importorskip("torch")
    d = derive(load_problem(EXAMPLE))
    check = symattn.crosscheck(d, torch=True)
    assert check.passed, check.all_mismatches
    assert {"head1.b_Q", "head2.db_K", "b_O", "db_O"} <= set(check.per_stage)
    assert {"head2.db_K", "db_O"} <= set(check.torch.per_stage)
    assert {"head1.db_Q", "db_O"} <= set(check.finite_differences.per_stage)


def _mha_problem(seed: int, n: int = 4, heads: int = 2, d_head: int = 2, causal: bool = True) -> str:
    """A problem nn.MultiheadAttention can hold: d_model = heads·d_head, every projection biased."""
    rng = np.random.default_rng(seed)
    e = heads * d_head

    def m(r, c):
        return str([[f"{v:.2f}" for v in row] for row in rng.normal(size=(r, c))]).replace("'", "")

    lines = [f"X: {m(n, e)}", "heads:"]
    for _ in range(heads):
        lines += [f"  - W_Q: {m(e, d_head)}", f"    b_Q: {m(1, d_head)[1:-1]}",
                  f"    W_K: {m(e, d_head)}", f"    b_K: {m(1, d_head)}",
                  f"    W_V: {m(e, d_head)}", f"    b_V: {m(1, d_head)[1:-1]}"]
    lines += [f"W_O: {m(e, e)}", f"b_O: {m(1, e)[1:-1]}", f"mask: {'causal' if causal else 'none'}",
              "backward: {loss: sum}"]
    return "\n".join(lines) + "\n"


def _f64(m) -> np.ndarray:
    return np.array([[float(x) for x in row] for row in sympy.Matrix(m).tolist()])


@pytest.mark.parametrize("seed, causal", [(1, True), (2, False), (3, True)])
def test_against_torch_multihead_attention(seed, causal):
    """nn.MultiheadAttention(bias=True) in float64 holding the same weights (in_proj_weight is
    [W_Q; W_K; W_V] of every head, out × in), its weights per head and its output, and the
    gradients of every bias and weight from autograd of L = Σ O."""
    torch = pytest.importorskip("torch")
    p = load_problem(_mha_problem(seed, causal=causal))
    d = derive(p)
    h, e = len(p.heads), p.d_model
    mha = torch.nn.MultiheadAttention(e, h, bias=True, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for k, name in enumerate(("Q", "K", "V")):
            W = np.hstack([_f64(getattr(w, "W_" + name)) for w in p.heads])  # d_model × (h·d_head)
            b = np.hstack([_f64(getattr(w, "b_" + name)) for w in p.heads])[0]
            mha.in_proj_weight[k * e:(k + 1) * e] = torch.from_numpy(W.T)
            mha.in_proj_bias[k * e:(k + 1) * e] = torch.from_numpy(b)
        mha.out_proj.weight.copy_(torch.from_numpy(_f64(p.W_O).T))
        mha.out_proj.bias.copy_(torch.from_numpy(_f64(p.b_O)[0]))
    x = torch.from_numpy(_f64(p.X))[None]
    mask = torch.ones(p.n_q, p.n_k, dtype=torch.bool).triu(1) if causal else None  # True: may not attend
    out, weights = mha(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
    for k in range(h):
        close(values(d, f"head{k + 1}.A"), weights[0, k].detach().numpy())
    close(values(d, "O"), out[0].detach().numpy())
    out.sum().backward()
    grads = {"db_O": mha.out_proj.bias.grad[None], "dW_O": mha.out_proj.weight.grad.T}
    for k, name in enumerate(("Q", "K", "V")):
        bias = mha.in_proj_bias.grad[k * e:(k + 1) * e]
        weight = mha.in_proj_weight.grad[k * e:(k + 1) * e].T
        for j in range(h):
            cols = slice(j * p.heads[j].d_k, (j + 1) * p.heads[j].d_k)
            grads[f"head{j + 1}.db_{name}"] = bias[cols][None]
            grads[f"head{j + 1}.dW_{name}"] = weight[:, cols]
    for sid, g in grads.items():
        close(values(d, sid), g.detach().numpy())


def test_single_head_against_torch_linear():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    p = load_problem(SINGLE)
    d = derive(p)
    X = torch.from_numpy(_f64(p.X)).requires_grad_()
    head = p.heads[0]
    leaves = {}
    proj = {}
    for name in ("Q", "K", "V"):
        W = leaves["dW_" + name] = torch.from_numpy(_f64(getattr(head, "W_" + name))).requires_grad_()
        b = leaves["db_" + name] = torch.from_numpy(_f64(getattr(head, "b_" + name))[0]).requires_grad_()
        proj[name] = F.linear(X, W.T, b)
        close(values(d, name), proj[name].detach().numpy())
    mask = torch.zeros(3, 3, dtype=torch.float64).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), -math.inf)
    O = F.scaled_dot_product_attention(proj["Q"][None], proj["K"][None], proj["V"][None], attn_mask=mask)[0]
    close(values(d, "O"), O.detach().numpy())
    O.sum().backward()
    for sid, t in leaves.items():
        close(values(d, sid), t.grad.numpy().reshape(values(d, sid).shape))
    close(values(d, "dX"), X.grad.numpy())


def test_numpy_backward_reference_has_the_bias_gradients():
    p = load_problem(SINGLE)
    g = numeric_gradients(p)
    d = derive(p)
    for sid in ("db_Q", "db_K", "db_V"):
        close(g[sid], values(d, sid))
    assert np.abs(g["db_K"]).max() < 1e-12


def test_grouped_heads_share_their_groups_biases():
    """With kv_heads, b_K and b_V sit in the kv groups (once per group, under the group's first head)."""
    torch = pytest.importorskip("torch")
    text = """\
X: [[1, 0], [0, 1], [1, 1]]
kv_heads: 1
heads:
  - {W_Q: [[1], [0]], b_Q: [1]}
  - {W_Q: [[0], [1]], b_Q: [-1]}
kv:
  - {W_K: [[1], [1]], b_K: [2], W_V: [[1], [0]], b_V: [[1/4]]}
W_O: [[1], [1]]
b_O: [3]
mask: causal
"""
    p = load_problem(text)
    d = derive(p)
    ids = [s.id for s in d.steps]
    assert "head1.b_K" in ids and "head2.b_K" not in ids and "head2.b_Q" in ids
    K = [[3], [3], [4]]  # X W_K + 2
    assert fractions(d.step("head1.K").exact) == K
    assert fractions(d.step("head1.V").exact) == [[Fraction(5, 4)], [Fraction(1, 4)], [Fraction(5, 4)]]
    check = symattn.crosscheck(d, torch=True)
    assert check.passed, check.all_mismatches
    assert {"head1.A", "head2.A", "O"} <= set(check.torch.per_stage)


# -- 3. reading: the forms of a bias and what is wrong with one ------------------------------


def test_a_bias_from_files(tmp_path):
    """A checkpoint stores a bias as a 1-dimensional tensor: it is one row (a slice with cols:);
    a 1-dimensional .npy likewise. float32 values are their exact dyadic rationals."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    b = np.array([0.1, -2.5, 3.0, 0.375], dtype=np.float32)
    safetensors_numpy.save_file({"attn.c_attn.bias": b}, str(tmp_path / "model.safetensors"))
    np.save(tmp_path / "bk.npy", np.array([1.5, -1.0]))
    (tmp_path / "p.yaml").write_text(
        "X: [[1, 0], [0, 1]]\nW_Q: [[1, 0], [0, 1]]\n"
        "b_Q: {file: model.safetensors, tensor: attn.c_attn.bias, cols: '1:3'}\n"
        "W_K: [[1, 0], [0, 1]]\nb_K: {file: bk.npy}\nW_V: [[1], [1]]\n"
        "b_V: {file: model.safetensors, tensor: attn.c_attn.bias, cols: '0:1'}\n", "utf-8")
    p = load_problem(tmp_path / "p.yaml")
    assert fractions(p.heads[0].b_Q) == [[Fraction(-5, 2), 3]]
    assert fractions(p.heads[0].b_K) == [[Fraction(3, 2), -1]]
    assert fractions(p.heads[0].b_V) == [[Fraction(*float(np.float32(0.1)).as_integer_ratio())]]


BAD = [
    ("X: [[1, 0]]\nW_Q: [[1, 0], [0, 1]]\nb_Q: [1, 2, 3]\nW_K: [[1, 0], [0, 1]]\nW_V: [[1], [0]]\n",
     "<problem>:3:6: b_Q: has 3 entries, W_Q has 2 columns: the bias adds one number to each column of X·W_Q"),
    ("X: [[1, 0]]\nW_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nb_K: [[1, 2], [3, 4]]\nW_V: [[1], [0]]\n",
     "<problem>:4:6: b_K: is 2×2; a bias is one row, such as [1, 2] or [[1, 2]], added to every row of X·W_K"),
    ("X: [[1, 0]]\nW_Q: [[1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1]]\nb_V: [1]\n",
     "<problem>:4:1: b_V: b_V is the bias of X·W_V, but W_V is missing"),
    ("Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1]]\nb_Q: [1, 2]\n",
     "<problem>:4:1: b_Q: b_Q is the bias of the projection X·W_Q; with Q, K and V given directly there is no "
     "projection to add it to (add it to the given matrix yourself, or give X with the weights)"),
    ("X: [[1, 0]]\nW_Q: [[1], [0]]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\nb_O: [1]\n",
     "<problem>:5:1: b_O: b_O is the bias of the output projection concat·W_O, but W_O is missing "
     "(b_O goes with heads and W_O)"),
    ("X: [[1, 0]]\nheads:\n  - {W_Q: [[1], [0]], W_K: [[1], [0]], W_V: [[1], [0]], b_Q: [1]}\n"
     "  - {W_Q: [[1], [0]], W_K: [[1], [0]], W_V: [[1], [0]]}\nW_O: [[1], [1]]\n",
     "<problem>:4:6: b_Q: b_Q is given for head 1 but not for head 2: give every head its b_Q, or none"),
    ("X: [[1, 0]]\nheads:\n  - {W_Q: [[1], [0]], W_K: [[1], [0]], W_V: [[1], [0]]}\nW_O: [[1, 1]]\n"
     "b_O: [1, 2, 3]\n",
     "<problem>:5:6: b_O: has 3 entries, W_O has 2 columns: the bias adds one number to each column of concat·W_O"),
    ("X: [[1, 0]]\nb_Q: [1]\nheads:\n  - {W_Q: [[1], [0]], W_K: [[1], [0]], W_V: [[1], [0]]}\nW_O: [[1]]\n",
     "<problem>:2:1: b_Q: with heads, each head gives its own b_Q, b_K, b_V: move the top-level b_Q into heads"),
    ("X: [[1, 0]]\nW_Q: [[1], [0]]\nb_Q: [x]\nW_K: [[1], [0]]\nW_V: [[1], [0]]\n",
     "<problem>:3:7: b_Q item 1: "),
]


@pytest.mark.parametrize("text, message", BAD, ids=range(len(BAD)))
def test_bad_biases(text, message):
    with pytest.raises(SymattnError) as err:
        load_problem(text)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_a_bad_bias_on_the_command_line(symattn_cli, tmp_path):
    (tmp_path / "p.yaml").write_text(BAD[0][0], "utf-8")
    result = symattn_cli("derive", tmp_path / "p.yaml")
    assert result.exit_code == 1
    assert "p.yaml:3:6: b_Q: has 3 entries, W_Q has 2 columns" in result.output
    assert "Traceback" not in result.output


# -- 4. the renderers and JSON ---------------------------------------------------------------


def test_json_has_the_bias_stages(symattn_cli, tmp_path):
    result = symattn_cli("derive", EXAMPLE, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    by_id = {s["id"]: s for s in data["stages"]}
    assert by_id["head1.b_Q"]["exact"] == [["1", "-1"]] and by_id["head1.b_Q"]["shape"] == [1, 2]
    assert by_id["b_O"]["exact"] == [["1/2", "0"]]
    assert by_id["head2.db_K"]["exact"] == [["0", "0"]]
    assert by_id["db_O"]["exact"] == [["3", "3"]]  # L = Σ O over 3 rows
    assert data["crosscheck"]["passed"] is True
    order = [s["id"] for s in data["stages"]]
    assert order.index("head1.W_V") < order.index("head1.b_Q") < order.index("head1.Q")
    assert order.index("W_O") < order.index("b_O") < order.index("O")


def test_html_and_text_show_the_bias():
    d = derive(load_problem(SINGLE))
    html = symattn.render_html(d)
    assert "Query bias" in html and "Gradient of the key bias" in html
    text = symattn.render_text(d)
    assert "Q = X·W_Q + b_Q" in text and "db_K = 1ᵀ·dK (the column sums of dK)" in text


def test_latex_compiles(tmp_path):
    d = derive(load_problem(EXAMPLE))
    pdf = compile_latex(tmp_path, "bias", symattn.render_latex(d, standalone=True))
    words = pdf_text(pdf)
    assert "Query bias" in words and "Output bias" in words and "Gradient of the output bias" in words


def test_problems_without_bias_have_no_bias_stages():
    d = derive(load_problem(ROOT / "worked_examples" / "two_heads.yaml"))
    assert not [s.id for s in d.steps if "b_" in s.id.split(".")[-1][:2]]


# -- 5. symattn check ------------------------------------------------------------------------


def _rows(m) -> list[list[str]]:
    return [[str(x) for x in row] for row in sympy.Matrix(m).tolist()]


def test_check_names_a_forgotten_bias_and_follows_it_through():
    """A student who forgot b_Q: their Q is X·W_Q; their S = Q Kᵀ from it is marked as following."""
    d = derive(load_problem(SINGLE))
    X, W_Q, K = (d.step(s).exact for s in ("X", "W_Q", "K"))
    Q_slip = X * W_Q  # no bias
    S_slip = Q_slip * K.T
    answers = parse_answers(yaml.safe_dump({"Q": _rows(Q_slip), "S": _rows(S_slip)}), "a.yaml", d)
    marking = {s.id: s for s in mark(d, answers).stages}
    assert marking["Q"].status == "wrong"
    assert "the bias b_Q was not added" in marking["Q"].diagnosis.text
    assert marking["S"].status == "follows" and marking["S"].follows_from == ("Q",)


def test_check_marks_a_bias_gradient():
    d = derive(load_problem(SINGLE))
    db_V = [[f"{x:.4f}" for x in row] for row in values(d, "db_V")]
    dV = [[f"{x:.4f}" for x in row] for row in values(d, "dV")]
    dV_slip = [row[:] for row in dV]
    dV_slip[0][0] = f"{float(dV[0][0]) + 1:.4f}"
    answers = parse_answers(yaml.safe_dump({"dV": dV_slip, "db_V": [[f"{float(dV_slip[0][0]) + float(dV[1][0]) + float(dV[2][0]):.4f}", db_V[0][1]]]}), "a.yaml", d)
    marking = {s.id: s for s in mark(d, answers).stages}
    assert marking["dV"].status == "wrong"
    assert marking["db_V"].status == "follows", marking["db_V"]
    right = parse_answers(yaml.safe_dump({"db_V": db_V, "db_K": [["0", "0"]]}), "a.yaml", d)
    assert all(s.status == "right" for s in mark(d, right).stages)
