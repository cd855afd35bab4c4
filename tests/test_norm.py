"""The layer norm and the residual stream (norm:, residual:, from: {norm: true, residual: true}).

References: the hand values of small rows; NumPy written here; mpmath at 40 digits for the exact
entries; torch.nn.LayerNorm and torch.nn.RMSNorm; and Hugging Face transformers' own GPT-2,
LLaMA and BERT modules on models written by save_pretrained, read back in float64 and run from
token ids (forward hooks take what each module receives and returns).
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
import sympy

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _error, _write
from test_problem_configs import _close, _model
from test_problem_layouts import _values

ROOT_EXAMPLES = Path(__file__).resolve().parent.parent / "worked_examples"
X = [[1, 2, 3, 6], [0, 4, 0, 4], [2, 2, 2, 6]]
HEAD = ("W_Q: [[1, 0], [0, 1], [1, 0], [0, 1]]\nW_K: [[1, 0], [0, 1], [0, 1], [1, 0]]\n"
        "W_V: [[1, 0], [0, 1], [1, 1], [0, 0]]\nmask: causal\n")
TWO_HEADS = ("heads:\n"
             "  - {W_Q: [[1, 0], [0, 1], [1, 0], [0, 1]], W_K: [[1, 0], [0, 1], [0, 1], [1, 0]], "
             "W_V: [[1, 0], [0, 1], [1, 1], [0, 0]]}\n"
             "  - {W_Q: [[0, 1], [1, 0], [1, 0], [0, 1]], W_K: [[1, 1], [0, 1], [0, 1], [1, 0]], "
             "W_V: [[1, 0], [0, 1], [1, 0], [0, 0]]}\n"
             "W_O: [[1, 0, 0, 2], [0, 1, 0, 0], [0, -1, 1, 0], [0, 0, 0, 1]]\nb_O: [0, 0, 1, 0]\nmask: causal\n")


def _derive(tmp_path, text):
    return symattn.derive(load_problem(_write(tmp_path, text)))


def _exact(d, stage):
    return d.step(stage).exact


def _numpy_norm(x, kind, gamma=None, beta=None, eps=0.0):
    x = np.asarray(x, dtype=np.float64)
    if kind == "rmsnorm":
        y = x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + eps)
    else:
        mu = x.mean(axis=1, keepdims=True)
        y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    if gamma is not None:
        y = y * np.asarray(gamma, dtype=np.float64)
    if beta is not None:
        y = y + np.asarray(beta, dtype=np.float64)
    return y


# -- the stages, exactly ----------------------------------------------------------------------------


def test_layernorm_stages_by_hand(tmp_path):
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: layernorm, weight: [1, 2, 1, 1], bias: [0, 1, 0, 0], eps: 0}}\n"
                          + HEAD)
    assert list(_exact(d, "norm_mean")) == [3, 2, 3]
    assert list(_exact(d, "norm_var")) == [sympy.Rational(7, 2), 4, 3]  # (4 + 1 + 0 + 9)/4, 16/4, (1+1+1+9)/4
    hat = _exact(d, "X_hat")
    assert list(hat.row(1)) == [-1, 1, -1, 1]  # (x − 2)/√4
    assert hat[0, 3] == 3 / sympy.sqrt(sympy.Rational(7, 2))
    assert list(hat.row(2)) == [-1 / sympy.sqrt(3)] * 3 + [3 / sympy.sqrt(3)]
    x_norm = _exact(d, "X_norm")
    assert x_norm[1, 1] == 3 and x_norm[2, 1] == 1 - 2 / sympy.sqrt(3)  # 2·(−1/√3) + 1
    # the projections read X_norm: Q = X_norm·W_Q, exactly
    w_q = sympy.Matrix([[1, 0], [0, 1], [1, 0], [0, 1]])
    assert sympy.simplify(sympy.Matrix(_exact(d, "Q")) - sympy.Matrix(x_norm) * w_q) == sympy.zeros(3, 2)


def test_rmsnorm_stages_by_hand(tmp_path):
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: rmsnorm, weight: [1, 2, 1, 1], eps: 1/2}}\n" + HEAD)
    assert list(_exact(d, "norm_ms")) == [sympy.Rational(50, 4), 8, 12]  # (1 + 4 + 9 + 36)/4, 32/4, 48/4
    assert "norm_mean" not in d.ids and "norm_var" not in d.ids and "norm_beta" not in d.ids
    assert _exact(d, "X_hat")[1, 1] == 4 / sympy.sqrt(sympy.Rational(17, 2))  # 4/√(8 + 1/2)
    assert _exact(d, "X_norm")[1, 1] == 8 / sympy.sqrt(sympy.Rational(17, 2))


def test_eps_is_exact_from_its_text(tmp_path):
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: layernorm, eps: 1e-5}}\n" + HEAD)
    assert d.problem.norm.eps == sympy.Rational(1, 100000)
    assert _exact(d, "X_hat")[1, 1] == 2 / sympy.sqrt(4 + sympy.Rational(1, 100000))


@pytest.mark.parametrize("norm", [
    "{type: layernorm, weight: [1, 2, 1, 1], bias: [0, 1, 0, 0], eps: 0}",
    "{type: layernorm, weight: [\"1/2\", 3, -1, 1], bias: [1, 1, \"-1/3\", 0], eps: 1e-5}",
    "{type: rmsnorm, weight: [1, 2, 1, 1], eps: 1e-6}",
    "{type: rmsnorm, weight: [0, 2, 1, 1], eps: 1e-6, offset: 1}",
    "{type: layernorm}",
])
@pytest.mark.parametrize("residual", [False, True])
def test_every_stage_against_numpy_and_mpmath(tmp_path, norm, residual):
    """Every stage against NumPy written here, and every exact entry at 40 digits against mpmath."""
    d = _derive(tmp_path, f"X: {X}\nnorm: {norm}\n" + TWO_HEADS + ("residual: true\n" if residual else ""))
    n = d.problem.norm
    gain = None if n.weight is None else np.array([[float(v) + n.offset for v in n.weight]])
    beta = None if n.bias is None else np.array([[float(v) for v in n.bias]])
    x_norm = _numpy_norm(X, n.kind, gain, beta, float(n.eps))
    np.testing.assert_allclose(_values(d, "X_norm"), x_norm, rtol=1e-13, atol=1e-13)
    if residual:
        np.testing.assert_allclose(_values(d, "H"), np.array(X) + _values(d, "O"), rtol=1e-13, atol=1e-13)
    with mpmath.workdps(40):
        for stage in ("X_hat", "X_norm", "head1.S", "head2.A", "O") + (("H",) if residual else ()):
            exact = d.step(stage).exact
            at40 = d.evaluate(stage, 40)
            for i in range(exact.rows):
                for j in range(exact.cols):
                    value = mpmath.mpf(str(sympy.N(exact[i, j], 45)))
                    assert abs(value - at40[i][j]) <= mpmath.mpf(10) ** -35 * (1 + abs(value)), (stage, i, j)
    assert symattn.crosscheck(d).passed


def test_post_norm_against_numpy(tmp_path):
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: layernorm, weight: [1, 2, 1, 1], bias: [0, 1, 0, 0], eps: 1e-12, "
                          "place: post}\n" + TWO_HEADS)
    assert d.problem.residual and "X_norm" not in d.ids
    r = np.array(X) + _values(d, "O")
    np.testing.assert_allclose(_values(d, "R"), r, rtol=1e-13)
    want = _numpy_norm(r, "layernorm", [[1, 2, 1, 1]], [[0, 1, 0, 0]], 1e-12)
    np.testing.assert_allclose(_values(d, "H"), want, rtol=1e-12, atol=1e-12)
    assert symattn.crosscheck(d).passed


def test_torch_layer_norm_and_rms_norm(tmp_path):
    torch = pytest.importorskip("torch")
    x = torch.tensor(X, dtype=torch.float64)
    ln = torch.nn.LayerNorm(4, eps=1e-5, dtype=torch.float64)
    rms = torch.nn.RMSNorm(4, eps=1e-6, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor([0.5, 3, -1, 1]))
        ln.bias.copy_(torch.tensor([1, 1, -0.25, 0]))
        rms.weight.copy_(torch.tensor([1, 2, 1, 0.5]))
        want_ln, want_rms = ln(x).numpy(), rms(x).numpy()
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: layernorm, weight: [1/2, 3, -1, 1], bias: [1, 1, -1/4, 0], "
                          "eps: 1e-5}\n" + HEAD)
    np.testing.assert_allclose(_values(d, "X_norm"), want_ln, rtol=1e-14, atol=1e-14)
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: rmsnorm, weight: [1, 2, 1, 1/2], eps: 1e-6}}\n" + HEAD)
    np.testing.assert_allclose(_values(d, "X_norm"), want_rms, rtol=1e-14, atol=1e-14)


def test_every_format_shows_the_norm(tmp_path):
    p = load_problem(_write(tmp_path, f"X: {X}\nnorm: {{type: layernorm, weight: [1, 2, 1, 1], eps: 0}}\n"
                                      + TWO_HEADS + "residual: true\n"))
    d = symattn.derive(p)
    for fmt in ("latex", "markdown", "text", "json", "html"):
        out = symattn.render(d, fmt)
        assert fmt == "json" or "Normalise each token (LayerNorm)" in out and "The residual stream" in out, fmt
        assert ("X_norm" if fmt in ("text", "json", "html") else "X_{norm}") in out, fmt
    doc = json.loads(symattn.render(d, "json"))
    ids = [s["id"] for s in doc["stages"]]
    assert ids.index("norm_mean") < ids.index("X_norm") < ids.index("head1.Q") and ids[-1] == "H"


# -- check marks the norm's slips ----------------------------------------------------------------------


@pytest.mark.parametrize("stage, slip, fragment", [
    ("X_hat", lambda x: _numpy_norm(x, "layernorm", eps=0.0) * np.sqrt(3 / 4), "d − 1"),
    ("norm_var", lambda x: ((x - x.mean(1, keepdims=True)) ** 2).sum(1, keepdims=True) / 3, "d − 1"),
    ("X_hat", lambda x: _numpy_norm(x.T, "layernorm").T, "over the tokens"),
    ("X_hat", lambda x: _numpy_norm(x, "rmsnorm"), "other norm"),
])
def test_check_diagnoses_the_slips(tmp_path, stage, slip, fragment):
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: layernorm, weight: [1, 2, 1, 1], bias: [0, 1, 0, 0], eps: 0}}\n"
                          + HEAD)
    answer = slip(np.array(X, dtype=np.float64))
    text = symattn.check(d, {stage: answer.tolist()}).to_json()
    assert fragment in text, text


# -- transformers' own modules, from token ids -----------------------------------------------------------


def _keep(seen: dict, name: str, batch) -> None:
    """The first sequence of ``batch`` under ``name`` (a hook that returns nothing changes nothing)."""
    seen.setdefault(name, batch[0])


def _hooks(model, ids, taps):
    """What each (module, "in"/"out") of ``taps`` receives or returns when the model reads ``ids``."""
    import torch

    seen, hooks = {}, []
    for name, (module, side) in taps.items():
        if side == "in":
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, kwargs, name=name: _keep(seen, name, args[0] if args else kwargs["hidden_states"]),
                with_kwargs=True))
        else:
            hooks.append(module.register_forward_hook(
                lambda m, args, out, name=name: _keep(seen, name, out[0] if isinstance(out, tuple) else out)))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return {k: v.numpy() for k, v in seen.items()}


IDS = [3, 1, 4, 1, 5]


def test_gpt2_from_token_ids_matches_transformers(tmp_path):
    model = _model(tmp_path, "gpt2", "GPT2LMHeadModel", "eager")
    block = model.transformer.h[0]
    seen = _hooks(model, IDS, {"x_norm": (block.ln_1, "out"), "O": (block.attn, "out"), "H": (block.ln_2, "in")})
    _write(tmp_path, "X: {file: model.safetensors, embeddings: transformer.wte.weight, tokens: [3, 1, 4, 1, 5]}\n"
                     "positions: {file: model.safetensors, tensor: transformer.wpe.weight}\n"
                     "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, norm: true, residual: true}\n")
    p = load_problem(tmp_path / "p.yaml")
    assert p.norm.kind == "layernorm" and p.norm.eps == sympy.Rational(1, 100000) and p.residual
    d = symattn.derive(p)
    _close(_values(d, "X_norm"), seen["x_norm"])
    _close(_values(d, "O"), seen["O"])
    _close(_values(d, "H"), seen["H"])


def _float64_rms(module):
    """transformers' LlamaRMSNorm computes in float32 whatever the model's dtype; the same formula
    in float64 (x·rsqrt(mean(x²) + ε)·γ), so the comparison can be at 1e-12."""
    import torch

    def forward(x):
        return module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))

    module.forward = forward


def test_llama_from_token_ids_matches_transformers(tmp_path):
    model = _model(tmp_path, "llama", "LlamaForCausalLM", "sdpa")
    from test_problem_configs import _float64_rope

    _float64_rope(model)
    layer = model.model.layers[0]
    unpatched = _hooks(model, IDS, {"x_norm": (layer.input_layernorm, "out")})
    _float64_rms(layer.input_layernorm)
    seen = _hooks(model, IDS, {"x_norm": (layer.input_layernorm, "out"), "O": (layer.self_attn, "out"),
                               "H": (layer.post_attention_layernorm, "in")})
    _write(tmp_path, "X: {file: model.safetensors, embeddings: model.embed_tokens.weight, tokens: [3, 1, 4, 1, 5]}\n"
                     "from: {file: model.safetensors, layout: llama, layer: 0, heads: all, norm: true, residual: true}\n")
    p = load_problem(tmp_path / "p.yaml")
    assert p.norm.kind == "rmsnorm" and p.norm.eps == sympy.Rational(1, 10 ** 6) and p.kv_heads == 2
    d = symattn.derive(p)
    x_norm = _values(d, "X_norm")
    _close(x_norm, seen["x_norm"])
    _close(_values(d, "O"), seen["O"])
    _close(_values(d, "H"), seen["H"])
    # the unpatched module rounds to float32 (24 bits): within a few units of 2^-24 of each entry
    np.testing.assert_allclose(x_norm, unpatched["x_norm"], rtol=4 * 2.0 ** -24, atol=4 * 2.0 ** -24)


def test_bert_post_norm_matches_transformers(tmp_path):
    model = _model(tmp_path, "bert", "BertModel", "eager")
    attention = model.encoder.layer[0].attention
    seen = _hooks(model, [3, 1, 4], {"x": (attention, "in"), "H": (attention.output, "out")})
    rows = ", ".join("[" + ", ".join(f"{Fraction(float(v))}" for v in row) + "]" for row in seen["x"])
    _write(tmp_path, f"X: [{rows}]\n"
                     "from: {file: model.safetensors, layout: bert, layer: 0, heads: all, norm: true}\n")
    p = load_problem(tmp_path / "p.yaml")
    assert p.norm.post and p.residual and p.norm.eps == sympy.Rational(1, 10 ** 12)
    _close(_values(symattn.derive(p), "H"), seen["H"])


# -- bad input: one line at the field ---------------------------------------------------------------------


@pytest.mark.parametrize("text, fragment", [
    (f"X: {X}\nnorm: {{type: layernorm, weight: [1, 2, 1]}}\n" + HEAD,
     "norm.weight: has 3 entries, but X has d_model = 4 columns"),
    (f"X: {X}\nnorm: {{type: layernorm, eps: -1e-5}}\n" + HEAD, "norm.eps: eps must be ≥ 0"),
    (f"X: {X}\nnorm: {{type: rmsnorm, bias: [0, 0, 0, 0]}}\n" + HEAD, "norm.bias: rmsnorm has no bias"),
    (f"X: {X}\nnorm: {{type: batchnorm}}\n" + HEAD, "norm.type: unknown norm type 'batchnorm'"),
    (f"X: {X}\nnorm: {{type: layernorm, place: middle}}\n" + HEAD, "norm.place: place is pre"),
    (f"X: {X}\nresidual: true\n" + HEAD, "residual: the residual H = X + O needs O as wide as X"),
    ("X: [[1, 1, 1, 1], [0, 4, 0, 4]]\nnorm: {type: layernorm, eps: 0}\n" + HEAD,
     "norm.eps: row 1 of X: its entries are all equal (variance 0), and eps is 0"),
    (f"X: {X}\nresidual: true\nbackward: {{dO: {X}}}\n" + TWO_HEADS, "backward: with the residual the loss is on "
     "the block's output H: give dH"),
    (f"X: {X}\nnorm: {{type: layernorm}}\nbackward: {{dH: [[1, 0], [0, 1], [1, 1]]}}\n" + HEAD,
     "backward: dH is the gradient of the residual stream, which this problem does not have"),
    (f"X: {X}\nresidual: true\nbackward: {{dH: [[1, 0], [0, 1], [1, 1]]}}\n" + TWO_HEADS, "backward.dH: "),
    # sin 0 = 0 and cos 0 = 1: position 0 of X + PE is [1, 1, 1, 1] (later rows hold transcendental entries)
    ("X: [[1, 0, 1, 0], [0, 4, 0, 4]]\npositions: sinusoidal\nnorm: {type: layernorm, eps: 0}\n" + HEAD,
     "norm.eps: row 1 of X + PE: its entries are all equal (variance 0), and eps is 0"),
    ("X: [[0, 0, 0, 0], [0, 4, 0, 4]]\nnorm: {type: rmsnorm, eps: 0}\n" + HEAD,
     "norm.eps: row 1 of X: every entry is 0, and eps is 0"),
    (f"X: {X}\nnorm: true\n" + HEAD, "norm: norm: true takes the norm from a checkpoint's layer"),
    ("Q: [[1, 0]]\nK: [[1, 0]]\nV: [[1, 0]]\nnorm: {type: layernorm}\n", "norm: the norm normalises each row of X"),
])
def test_bad_norm_inputs(tmp_path, symattn_cli, text, fragment):
    assert fragment in _error(tmp_path, text, symattn_cli)


def test_a_pre_norm_layout_refuses_place_post(tmp_path, symattn_cli):
    _model(tmp_path, "gpt2", "GPT2LMHeadModel", "eager")
    line = _error(tmp_path, f"X: {json.dumps(np.ones((2, 8)).tolist())}\n"
                            "norm: {type: layernorm, place: post}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all}\n", symattn_cli)
    assert "norm.place: gpt2 layers normalise before the attention" in line, line


def test_a_checkpoint_without_the_norm_lists_close_names(tmp_path, symattn_cli):
    from test_problem_layouts import _gpt2_tensors, _save

    _save(tmp_path, _gpt2_tensors(8))
    line = _error(tmp_path, f"X: {json.dumps(np.ones((2, 8)).tolist())}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], n_head: 2, norm: true}\n",
                  symattn_cli)
    assert "from.norm:" in line and "has no tensor 'h.0.ln_1.bias'" in line and "close: 'h.0.ln_1.weight'" in line, line


def test_residual_needs_every_head(tmp_path, symattn_cli):
    _model(tmp_path, "gpt2", "GPT2LMHeadModel", "eager")
    line = _error(tmp_path, f"X: {json.dumps(np.ones((2, 8)).tolist())}\n"
                            "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1], residual: true}\n",
                  symattn_cli)
    assert "residual: the residual stream adds the whole layer's output" in line, line


# -- generate --norm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_generated_norm_exercises_are_hand_friendly(norm, seed):
    (p,) = symattn.generate(seed=seed, norm=norm, residual=True)
    assert p.norm.kind == norm and p.norm.eps == 0 and p.residual
    d = symattn.derive(p)
    x = np.array(p.X.tolist(), dtype=np.float64)
    want = _numpy_norm(x, norm)  # NumPy from the drawn X: the normalised rows are ±1
    np.testing.assert_allclose(_values(d, "X_hat"), want, rtol=0, atol=1e-15)
    assert set(np.unique(want)) <= {-1.0, 1.0}
    for stage in ("X_hat", "X_norm", "Q", "K", "V", "S"):
        assert all(x.is_Integer for x in d.step(stage).exact), stage  # whole numbers, as at the easy level
    assert len({tuple(r) for r in _values(d, "X_norm").tolist()}) >= 3
    assert symattn.crosscheck(d).passed


@pytest.mark.parametrize("args, fragment", [
    (["--norm", "layernorm", "--d-model", "3"], "--norm layernorm needs an even --d-model"),
    (["--residual", "--d-v", "2"], "--residual adds the output to X"),
    (["--norm", "batchnorm"], "Invalid value for '--norm'"),
])
def test_generate_norm_refusals(symattn_cli, args, fragment):
    r = symattn_cli.main("generate", *args)
    assert r.code in (1, 2) and fragment in r.stderr, r.stderr


def test_generate_from_a_normed_problem_is_refused(tmp_path, symattn_cli):
    path = _write(tmp_path, f"X: {X}\nnorm: {{type: layernorm, eps: 0}}\n" + HEAD)
    r = symattn_cli.main("generate", "--from", path)
    assert r.code == 1 and "does not vary problems with a norm" in r.stderr, r.stderr
    r = symattn_cli.main("generate", "--from", path, "--norm", "rmsnorm")
    assert r.code == 2 and "--norm cannot go with --from" in r.stderr, r.stderr


def test_check_follows_through_and_names_the_residual_and_gamma(tmp_path):
    """A wrong X̂ (the unbiased variance) diagnosed, and X_norm made from it marked as following
    through; H = O (the residual left out) and X_norm = X̂ (γ left out) named."""
    d = symattn.derive(load_problem(ROOT_EXAMPLES / "layernorm_head.yaml"))
    x = np.array([[1, 3, 1, 3], [0, 4, 0, 4], [1, 1, 5, 5]], dtype=np.float64)
    mu = x.mean(axis=1, keepdims=True)
    x_hat = (x - mu) / np.sqrt(((x - mu) ** 2).sum(axis=1, keepdims=True) / 3)
    x_norm = x_hat * np.array([1, 2, 1, 0.5]) + np.array([0, 1, 0, 0])
    marked = {s["id"]: s for s in json.loads(symattn.check(d, {"X_hat": x_hat.tolist(),
                                                               "X_norm": x_norm.tolist()}).to_json())["stages"]}
    assert marked["X_hat"]["status"] == "wrong" and "d − 1" in marked["X_hat"]["diagnosis"]
    assert marked["X_norm"]["status"] == "follows"
    d = _derive(tmp_path, f"X: {X}\nnorm: {{type: rmsnorm, weight: [1, 2, 1, 1], eps: 0}}\n" + TWO_HEADS
                + "residual: true\n")
    O, X_hat = _values(d, "O"), _values(d, "X_hat")
    marked = {s["id"]: s for s in json.loads(symattn.check(d, {"H": O.tolist(), "X_norm": X_hat.tolist()}).to_json())["stages"]}
    assert marked["H"]["diagnosis"] == "the residual was left out: H = O"
    assert marked["X_norm"]["diagnosis"].startswith("γ was left out")


def test_the_page_explains_a_normalised_entry_from_its_rows_statistics():
    """Pointing at X̂_{1,1} of the LayerNorm example shows (x − μ)/√(σ² + ε) with row 1's numbers:
    (1 − 2)/√(1 + 0) = −1 (x_11 = 1, μ_1 = 2, σ_1² = 1)."""
    d = symattn.derive(load_problem(ROOT_EXAMPLES / "layernorm_head.yaml"))
    page = symattn.render(d, "html")
    start = page.index('data-for="X_hat"')
    first = page[start:page.index("</template>", start)]
    assert "&#x003BC;" in first and "&#x003C3;" in first and "&#x003B5;" in first  # μ_1, σ_1², ε
    numbers = re.findall(r"<mn>([^<]*)</mn>", first.split("&#x02248;")[1])  # after the first ≈
    assert numbers == ["1", "2", "1", "0"], numbers  # (1 − (2)) / √(1 + 0)
    assert first.rstrip().endswith("<mn>1</mn></math>") and "&#x02212;</mo><mn>1</mn></math>" in first  # ≈ −1


def test_one_feature_has_no_unbiased_slip_to_name(tmp_path):
    """With d_model = 1 the unbiased variance would divide by d − 1 = 0: that slip is not tried,
    and a wrong answer is marked wrong without a crash."""
    d = _derive(tmp_path, "X: [[1], [2]]\nnorm: {type: layernorm, eps: 1/2}\nW_Q: [[1]]\nW_K: [[1]]\nW_V: [[1]]\n")
    assert list(_exact(d, "norm_var")) == [0, 0] and list(_exact(d, "X_hat")) == [0, 0]
    marked = json.loads(symattn.check(d, {"norm_var": [[1], [1]], "X_hat": [[1], [1]]}).to_json())["stages"]
    assert [(s["id"], s["status"]) for s in marked] == [("norm_var", "wrong"), ("X_hat", "wrong")]


def test_the_stages_before_the_norm_are_written_as_without_it(tmp_path):
    """Sinusoidal positions' X_pos (entries of sines and cosines) is written exactly with a norm,
    as it is without one: the norm's decimals-past-a-width rule starts at the norm's own stages."""
    # d_model = 6: base^(2i/d) = 10^(4/3), and X_pos[3, 6] is −1/3 + cos(10^(1/3)/500), 26 characters
    text = ('X: [[1, 3, 1, 3, 0, 1], [0, 4, 0, 4, 1, 1], [1, 1, 5, 5, 2, "-1/3"]]\npositions: sinusoidal\n'
            "W_Q: [[1, 0], [0, 1], [1, 0], [0, 1], [1, 1], [0, 0]]\nW_K: [[1, 0], [0, 1], [0, 1], [1, 0], [0, 0], [1, 1]]\n"
            "W_V: [[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 1]]\n")
    plain = _derive(tmp_path, text)
    assert len(str(plain.step("X_pos").exact[2, 5])) > 24
    normed = _derive(tmp_path, text + "norm: {type: layernorm, eps: 1e-5}\n")
    assert plain.step("X_pos").written_exactly and normed.step("X_pos").written_exactly
    assert not normed.step("X_hat").written_exactly  # entries over roots of sums of sines: decimals
