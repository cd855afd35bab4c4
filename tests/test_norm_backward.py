"""The backward pass through the layer norm and the residual stream.

Each gradient is compared with values computed independently here: central differences of a
forward pass and loss written in this file in mpmath at 60 digits (step 10⁻²⁰, so truncation and
rounding are both below 10⁻³⁵), PyTorch autograd through ``torch.nn.LayerNorm``/``RMSNorm``, and
Hugging Face ``transformers``' own GPT-2 and BERT modules; the classic slips are named by
``symattn check``.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _write
from test_problem_configs import _close, _model
from test_problem_layouts import _values

ROOT = Path(__file__).resolve().parent.parent

X = [[1, 2, 3, 6], [0, 4, 0, 4], [2, 2, 2, 6]]
HEADS = [
    ([[1, 0], [0, 1], [1, 0], [0, 1]], [[1, 0], [0, 1], [0, 1], [1, 0]], [[1, 0], [0, 1], [1, 1], [0, 0]]),
    ([[0, 1], [1, 0], [1, 0], [0, 1]], [[1, 1], [0, 1], [0, 1], [1, 0]], [[1, 0], [0, 1], [1, 0], [0, 0]]),
]
W_O = [[1, 0, 0, 2], [0, 1, 0, 0], [0, -1, 1, 0], [0, 0, 0, 1]]
B_O = [[0, 0, 1, 0]]
T = [[0, 1, 0, 0], [1, 0, 0, -1], [0, 0, 2, 0]]

# (norm, residual, loss): every place and kind, γ with and without the offset, β or none, ε = 0 or not
CASES = [
    ({"type": "layernorm", "weight": [1, 2, 1, "1/2"], "bias": [0, 1, 0, 0], "eps": "1e-5"}, True, "sum"),
    ({"type": "layernorm", "weight": [1, 2, 1, "1/2"], "bias": [0, 1, 0, 0], "eps": 0}, False, "target"),
    ({"type": "layernorm", "eps": "1/10"}, True, "target"),
    ({"type": "rmsnorm", "weight": [1, -1, 2, "1/2"], "eps": "1e-6", "offset": 1}, True, "target"),
    ({"type": "layernorm", "weight": [1, 2, 1, 1], "bias": [0, 1, 0, 0], "eps": "1e-12", "place": "post"}, True,
     "target"),
    (None, True, "sum"),
]


def _yaml_norm(norm) -> str:
    def text(v):
        if isinstance(v, list):
            return "[" + ", ".join(map(text, v)) + "]"
        return f'"{v}"' if "/" in str(v) else str(v)

    return "{" + ", ".join(f"{k}: {text(v)}" for k, v in norm.items()) + "}"


def _text(norm, residual, loss) -> str:
    heads = "".join(f"  - {{W_Q: {q}, W_K: {k}, W_V: {v}}}\n" for q, k, v in HEADS)
    out = f"X: {X}\nheads:\n{heads}W_O: {W_O}\nb_O: {B_O}\nmask: causal\n"
    if norm is not None:
        out += f"norm: {_yaml_norm(norm)}\n"
    if residual:
        out += "residual: true\n"
    out += "backward: {loss: sum}\n" if loss == "sum" else f"backward: {{loss: {{target: {T}}}}}\n"
    return out


# -- an independent forward pass in mpmath ---------------------------------------------------------


def _mp(x) -> mpmath.mpf:
    """A problem's number at the working precision, from its text ("1/2", "1e-5", 3)."""
    top, _, bottom = str(x).partition("/")
    return mpmath.mpf(top) / mpmath.mpf(bottom or 1)


def _matmul(a, b):
    return [[mpmath.fsum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _norm_rows(rows, norm, gamma, beta):
    eps = _mp(norm.get("eps", "1e-5" if norm["type"] == "layernorm" else "1e-6"))
    out = []
    for r in rows:
        d = len(r)
        centred = [x - mpmath.fsum(r) / d for x in r] if norm["type"] == "layernorm" else list(r)
        root = mpmath.sqrt(mpmath.fsum(x * x for x in centred) / d + eps)
        out.append([centred[k] / root * ((norm.get("offset", 0) + gamma[k]) if gamma is not None else 1)
                    + (beta[k] if beta is not None else 0) for k in range(d)])
    return out


def _loss(x, norm, residual, loss, gamma=None, beta=None) -> mpmath.mpf:
    """The loss of the whole layer from its input ``x``, written out: the norm, two causal heads, W_O, b_O,
    the residual and the norm behind it, then Σ H or ½‖H − T‖²."""
    pre = norm is not None and norm.get("place", "pre") == "pre"
    xin = _norm_rows(x, norm, gamma, beta) if pre else x
    n, outputs = len(x), []
    for q, k, v in HEADS:
        Q, K, V = (_matmul(xin, [[_mp(e) for e in row] for row in w]) for w in (q, k, v))
        A = []
        for i in range(n):
            s = [mpmath.fsum(Q[i][c] * K[j][c] for c in range(2)) / mpmath.sqrt(2) for j in range(i + 1)]
            top = max(s)
            e = [mpmath.exp(z - top) for z in s]
            A.append([w / mpmath.fsum(e) for w in e] + [mpmath.mpf(0)] * (n - i - 1))
        outputs.append(_matmul(A, V))
    concat = [outputs[0][i] + outputs[1][i] for i in range(n)]
    O = [[o + _mp(b) for o, b in zip(row, B_O[0])] for row in _matmul(concat, [[_mp(e) for e in r] for r in W_O])]
    H = [[a + b for a, b in zip(r, s)] for r, s in zip(x, O)] if residual else O
    if norm is not None and norm.get("place") == "post":
        H = _norm_rows(H, norm, gamma, beta)
    if loss == "sum":
        return mpmath.fsum(e for row in H for e in row)
    return mpmath.fsum((h - t) ** 2 for hr, tr in zip(H, T) for h, t in zip(hr, tr)) / 2


STEP = mpmath.mpf(10) ** -20


def _central(f, values):
    """∂f/∂values[k] for each k by central differences at 60 digits, step 10⁻²⁰."""
    out = []
    for k in range(len(values)):
        up, down = list(values), list(values)
        up[k] += STEP
        down[k] -= STEP
        out.append((f(up) - f(down)) / (2 * STEP))
    return out


@pytest.mark.parametrize("norm, residual, loss", CASES)
def test_gradients_against_central_differences_in_mpmath(tmp_path, norm, residual, loss):
    """dX, dγ and dβ (and dH) against the mpmath pass written above. At 60 digits with step 10⁻²⁰ the
    truncation, h²·f‴/6, and the rounding, 10⁻⁶⁰/h, are both below 10⁻³⁵; 10⁻²⁵ leaves room for f‴ up
    to 10¹⁰ and is still far below any wrong term."""
    d = symattn.derive(load_problem(_write(tmp_path, _text(norm, residual, loss))))
    with mpmath.workdps(60):
        x = [[_mp(e) for e in row] for row in X]
        gamma = None if norm is None or "weight" not in norm else [_mp(e) for e in norm["weight"]]
        beta = None if norm is None or "bias" not in norm else [_mp(e) for e in norm["bias"]]
        flat = [e for row in x for e in row]
        dX = _central(lambda v: _loss([v[4 * i:4 * i + 4] for i in range(3)], norm, residual, loss, gamma, beta), flat)
        want = {"dX": [dX[4 * i:4 * i + 4] for i in range(3)]}
        if gamma is not None:
            want["dnorm_gamma"] = [_central(lambda g: _loss(x, norm, residual, loss, g, beta), gamma)]
        if beta is not None:
            want["dnorm_beta"] = [_central(lambda b: _loss(x, norm, residual, loss, gamma, b), beta)]
        for stage, rows in want.items():
            got = d.evaluate(stage, 40)
            for i, row in enumerate(rows):
                for j, value in enumerate(row):
                    assert abs(got[i][j] - value) <= mpmath.mpf(10) ** -25 * (1 + abs(value)), (stage, i, j)
    assert symattn.crosscheck(d).passed


def test_the_layernorm_jacobian_rows_sum_to_zero_and_with_eps_0_are_orthogonal_to_x_hat(tmp_path):
    """Each row of the gradient back through a LayerNorm sums to 0 (the mean is taken away), and with
    ε = 0 it is orthogonal to its row of X̂ (so is the scale), to 40 digits; with ε > 0 it is not."""
    with mpmath.workdps(45):
        for norm, orthogonal in ((CASES[0][0], False), (CASES[1][0], True)):
            d = symattn.derive(load_problem(_write(tmp_path, _text(norm, False, "target"))))
            dX, x_hat = d.evaluate("dX", 45), d.evaluate("X_hat", 45)
            for row, hat in zip(dX, x_hat):
                assert abs(mpmath.fsum(row)) < mpmath.mpf(10) ** -40
                dot = abs(mpmath.fsum(a * b for a, b in zip(row, hat)))
                assert (dot < mpmath.mpf(10) ** -40) == orthogonal, dot


def test_hand_sized_gradients_are_exact(tmp_path):
    """With ε = 0 and perfect-square variances the roots are rational: every gradient is written exactly,
    and dβ is exactly the column sums of dX_norm."""
    import sympy

    text = (ROOT / "worked_examples" / "layernorm_head.yaml").read_text() + "backward: {loss: sum}\n"
    d = symattn.derive(load_problem(_write(tmp_path, text)))
    for stage in ("dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta", "dX"):
        assert d.step(stage).written_exactly, stage
    dxn, dbeta = d.step("dX_norm").exact, d.step("dnorm_beta").exact
    for j in range(dxn.cols):
        assert sympy.simplify(sum(dxn[i, j] for i in range(dxn.rows)) - dbeta[0, j]) == 0


def test_irrational_roots_are_shown_in_certified_decimals(tmp_path):
    d = symattn.derive(load_problem(_write(tmp_path, _text(CASES[4][0], True, "target"))))
    assert not d.step("dR").written_exactly and not d.step("dX").written_exactly
    doc = json.loads(symattn.render(d, "json"))
    by_id = {s["id"]: s for s in doc["stages"]}
    assert by_id["dR"]["exact"] is None and by_id["dR"]["approx"]


# -- the stages, in order, in every format --------------------------------------------------------------


def test_stage_order_and_every_format(tmp_path):
    d = symattn.derive(load_problem(_write(tmp_path, _text(CASES[0][0], True, "sum"))))
    ids = list(d.ids)
    assert ids.index("H") < ids.index("dH") < ids.index("dO") < ids.index("head1.dV")
    assert ids.index("head2.db_V" if "head2.db_V" in ids else "head2.dW_V") < ids.index("dX_norm") \
        < ids.index("dX_hat") < ids.index("dnorm_gamma") < ids.index("dnorm_beta") < ids.index("dX")
    post = symattn.derive(load_problem(_write(tmp_path, _text(CASES[4][0], True, "target"))))
    ids = list(post.ids)
    assert ids.index("H") < ids.index("dH") < ids.index("dR_hat") < ids.index("dnorm_gamma") < ids.index("dR") \
        < ids.index("dO") < ids.index("dX")
    text = symattn.render(post, "text")  # the worked solution derives dR before it says dO = dR
    assert text.index("Back through the norm (dR)") < text.index("(dO): dO = dR")
    for fmt, fragments in (("latex", ("Back through the norm", "d\\gamma")), ("markdown", ("Back through the norm",)),
                           ("text", ("Gradient of the norm's weight (dγ)", "Back to the normalised rows (dX̂)")),
                           ("html", ("dX_hat", "Back through the norm"))):
        out = symattn.render(d, fmt)
        assert all(f in out for f in fragments), fmt


# -- symattn check names the slips of the backward pass ----------------------------------------------------


def _marked(d, answers: dict) -> dict:
    return {s["id"]: s for s in json.loads(symattn.check(d, answers).to_json())["stages"]}


def test_check_names_the_slips(tmp_path):
    d = symattn.derive(load_problem(_write(tmp_path, _text(CASES[0][0], True, "sum"))))
    v = d.approx
    dxh, xh, root = v("dX_hat"), v("X_hat"), np.sqrt(v("norm_var") + 1e-5)
    slips = {
        "the residual's path was left out": ("dX", v("dX") - v("dH")),
        "the norm's Jacobian was left out": ("dX", dxh / root + v("dH")),
        "the mean's path was left out": ("dX", (dxh - xh * (dxh * xh).mean(1, keepdims=True)) / root + v("dH")),
        "γ was not applied on the way back": ("dX_hat", v("dX_norm")),
        "the normalised rows were left out": ("dnorm_gamma", v("dnorm_beta")),
    }
    for fragment, (stage, answer) in slips.items():
        marked = _marked(d, {stage: answer.tolist()})[stage]
        assert marked["status"] == "wrong" and fragment in marked["diagnosis"], (fragment, marked)
    right = _marked(d, {s: v(s).tolist() for s in ("dH", "dX_norm", "dX_hat", "dnorm_gamma", "dnorm_beta", "dX")})
    assert all(right[s]["status"] == "right" for s in right if s in ("dX", "dnorm_gamma", "dX_hat"))
    # a wrong dX̂ is followed through: dX made from it is marked as following
    wrong_hat = v("dX_norm")
    follow = dict(zip(("dX_hat", "dX"), (wrong_hat, None)))
    x = (wrong_hat - wrong_hat.mean(1, keepdims=True) - xh * (wrong_hat * xh).mean(1, keepdims=True)) / root + v("dH")
    follow["dX"] = x
    marked = _marked(d, {k: a.tolist() for k, a in follow.items()})
    assert marked["dX_hat"]["status"] == "wrong" and marked["dX"]["status"] == "follows"


# -- transformers' own modules --------------------------------------------------------------------------


def test_gpt2_block_gradients_match_transformers(tmp_path):
    """From token ids through ln_1, the attention and the residual, L = Σ H: the gradients of ln_1's
    weight and bias, of c_attn's query weights and of the token embeddings (X; X + PE has the same),
    against autograd through the model itself in float64."""
    model = _model(tmp_path, "gpt2", "GPT2LMHeadModel", "eager")  # skips without torch and transformers
    ids = [3, 1, 4, 1, 5]
    block = model.transformer.h[0]
    # the whole model runs (its own causal mask and positions); H is what block 0's ln_2 receives
    x = model.transformer.wte.weight.detach()[ids][None].clone().requires_grad_()
    seen = {}
    hook = block.ln_2.register_forward_pre_hook(lambda m, args: seen.setdefault("H", args[0]))
    model(inputs_embeds=x)
    hook.remove()
    seen["H"].sum().backward()
    _write(tmp_path, "X: {file: model.safetensors, embeddings: transformer.wte.weight, tokens: [3, 1, 4, 1, 5]}\n"
                     "positions: {file: model.safetensors, tensor: transformer.wpe.weight}\n"
                     "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, norm: true, residual: true}\n"
                     "backward: {loss: sum}\n")
    d = symattn.derive(load_problem(tmp_path / "p.yaml"))
    _close(_values(d, "dX"), x.grad[0].numpy())
    _close(_values(d, "dnorm_gamma"), block.ln_1.weight.grad.numpy()[None])
    _close(_values(d, "dnorm_beta"), block.ln_1.bias.grad.numpy()[None])
    d_k = model.config.n_embd // model.config.n_head
    _close(_values(d, "head2.dW_Q"), block.attn.c_attn.weight.grad.numpy()[:, d_k:2 * d_k])


def test_bert_post_norm_gradients_match_transformers(tmp_path):
    """BERT's order, H = LN(X + attention output), L = ½‖H − T‖²: dX, dγ and dβ of the attention
    output's LayerNorm against autograd through BertAttention."""
    model = _model(tmp_path, "bert", "BertModel", "eager")  # skips without torch and transformers
    import torch
    attention = model.encoder.layer[0].attention
    torch.manual_seed(0)
    rows = torch.randint(-3, 4, (3, model.config.hidden_size)).double() / 4
    target = torch.randint(-2, 3, (3, model.config.hidden_size)).double()
    x = rows[None].clone().requires_grad_()
    H = attention(x)[0]
    (0.5 * ((H[0] - target) ** 2).sum()).backward()

    def lines(m):
        return "[" + ", ".join("[" + ", ".join(str(Fraction(float(v))) for v in r) + "]" for r in m) + "]"

    _write(tmp_path, f"X: {lines(rows)}\nfrom: {{file: model.safetensors, layout: bert, layer: 0, heads: all, "
                     f"norm: true}}\nbackward: {{loss: {{target: {lines(target)}}}}}\n")
    d = symattn.derive(load_problem(tmp_path / "p.yaml"))
    _close(_values(d, "dX"), x.grad[0].numpy())
    _close(_values(d, "dnorm_gamma"), attention.output.LayerNorm.weight.grad.numpy()[None])
    _close(_values(d, "dnorm_beta"), attention.output.LayerNorm.bias.grad.numpy()[None])
