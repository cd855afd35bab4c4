"""BERT's embeddings in front of layer 0: the token types (token_types:), the embeddings' own norm
(embeddings_norm:) and from: {embeddings: true}, which reads both and the positions from a
checkpoint.

References: hand values of small rows (exact); NumPy written here, from the checkpoint's own
tensors (BERT's embeddings, its self-attention and its post norm, in float64); the check's
diagnoses of slipped answers. tests/test_embeddings_hf.py compares with transformers' own
BertModel and RobertaModel from token ids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import sympy

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _error, _write
from test_problem_layouts import _bert_tensors, _close, _gpt2_tensors, _save, _values

X = [[1, 3, 2, 2], [0, 2, 4, 2], [3, 1, 1, 3]]
PE = [[0, 0, 1, -1], [1, -1, 0, 0], [0, 1, 0, -1]]
TT = [[1, 0, 0, 1], [1, 0, 0, 1], [1, 0, 0, 1]]
HEAD = ("W_Q: [[1, 0], [0, 1], [1, 1], [0, 0]]\nW_K: [[0, 1], [1, 0], [0, 0], [1, 1]]\n"
        "W_V: [[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]]\nmask: none\n")
HAND = (f"X: {X}\npositions: {PE}\ntoken_types: {TT}\n"
        "embeddings_norm: {type: layernorm, weight: [1, 2, 1, 1], bias: [0, 0, 1, 0], eps: 0}\n" + HEAD)


def _derive(tmp_path, text):
    return symattn.derive(load_problem(_write(tmp_path, text)))


def _layer_norm(x, gamma=None, beta=None, eps=0.0):
    mu = x.mean(axis=1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    return y * (1 if gamma is None else gamma) + (0 if beta is None else beta)


# -- the stages, exactly ------------------------------------------------------------------------------


def test_the_embeddings_norm_by_hand(tmp_path):
    d = _derive(tmp_path, HAND)
    assert d.step("X_pos").exact.tolist() == [[2, 3, 3, 2], [2, 1, 4, 3], [4, 2, 1, 3]]  # X + PE + TT
    assert list(d.step("emb_mean").exact) == [sympy.Rational(5, 2)] * 3
    assert list(d.step("emb_var").exact) == [sympy.Rational(1, 4), sympy.Rational(5, 4), sympy.Rational(5, 4)]
    # row 1: (x − 5/2)/√(1/4) = (−1, 1, 1, −1); times γ = (1, 2, 1, 1), plus β = (0, 0, 1, 0)
    assert d.step("X_emb").exact.row(0).tolist() == [[-1, 2, 2, -1]]
    r = 1 / sympy.sqrt(sympy.Rational(5, 4))  # row 2: (−1/2, −3/2, 3/2, 1/2)/√(5/4)
    assert sympy.simplify(d.step("X_emb").exact[1, 2] - (1 + sympy.Rational(3, 2) * r)) == 0
    # the projections read X_emb, and the residual adds to it
    w_q = sympy.Matrix([[1, 0], [0, 1], [1, 1], [0, 0]])
    assert sympy.simplify(sympy.Matrix(d.step("Q").exact) - sympy.Matrix(d.step("X_emb").exact) * w_q) == \
        sympy.zeros(3, 2)


def test_a_post_norm_behind_the_embeddings_norm_matches_numpy(tmp_path):
    d = _derive(tmp_path, HAND + "norm: {type: layernorm, place: post, weight: [2, 1, 1, 1], eps: 1/100}\n")
    e = _layer_norm(np.array(X, float) + PE + TT, np.array([1, 2, 1, 1.0]), np.array([0, 0, 1, 0.0]))
    _close(_values(d, "X_emb"), e)
    w = {k: np.array(v, float) for k, v in (("q", [[1, 0], [0, 1], [1, 1], [0, 0]]), ("k", [[0, 1], [1, 0], [0, 0], [1, 1]]),
                                           ("v", [[1, 0, 0, 1], [0, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 1]]))}
    s = (e @ w["q"]) @ (e @ w["k"]).T / np.sqrt(2)
    a = np.exp(s - s.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    o = a @ (e @ w["v"])
    _close(_values(d, "R"), e + o)
    _close(_values(d, "H"), _layer_norm(e + o, np.array([2, 1, 1, 1.0]), eps=0.01))


def test_every_format_shows_the_embeddings(tmp_path):
    d = _derive(tmp_path, HAND)
    for fmt in ("latex", "markdown", "text", "html"):
        out = symattn.render(d, fmt)
        assert "Normalise the embeddings (LayerNorm)" in out and "Add the positions and the token types" in out, fmt
        assert ("X_emb" if fmt in ("text", "html") else "X_{emb}") in out, fmt
    ids = [s["id"] for s in json.loads(symattn.render(d, "json"))["stages"]]
    assert ids[:11] == ["X", "PE", "TT", "X_pos", "emb_mean", "emb_var", "X_emb_hat", "emb_gamma", "emb_beta",
                        "X_emb", "W_Q"]


@pytest.mark.parametrize("stage, slip, fragment", [
    ("X_pos", lambda: np.array(X) + PE, "token types were not added"),
    ("X_emb", lambda: _layer_norm(np.array(X, float) + PE + TT, beta=np.array([0, 0, 1, 0.0])), "γ was left out"),
    ("X_emb_hat", lambda: _layer_norm((np.array(X, float) + PE + TT).T).T, "over the tokens"),
])
def test_check_diagnoses_the_embeddings_slips(tmp_path, stage, slip, fragment):
    text = symattn.check(_derive(tmp_path, HAND), {stage: slip().tolist()}).to_json()
    assert fragment in text, text


# -- from: {embeddings: true}, against NumPy on the checkpoint's own tensors -----------------------------------------


def _bert_checkpoint(tmp_path, prefix="bert.", d_model=8, config=None):
    rng = np.random.default_rng(2)
    t = _bert_tensors(d_model=d_model, prefix=prefix)
    for name, shape in (("word_embeddings", (12, d_model)), ("position_embeddings", (16, d_model)),
                        ("token_type_embeddings", (2, d_model))):
        t[f"{prefix}embeddings.{name}.weight"] = rng.standard_normal(shape).astype(np.float32)
    for where in ("embeddings.LayerNorm", "encoder.layer.0.attention.output.LayerNorm"):
        t[f"{prefix}{where}.weight"] = rng.standard_normal(d_model).astype(np.float32)
        t[f"{prefix}{where}.bias"] = rng.standard_normal(d_model).astype(np.float32)
    return _save(tmp_path, t, config={"model_type": "bert", "num_attention_heads": 2, "layer_norm_eps": 1e-12,
                                      **(config or {})})


def _bert_numpy(t, prefix, ids, types, eps=1e-12):
    """BERT's embeddings and its layer 0's attention with the post norm, written out in NumPy."""
    e = prefix + "embeddings."
    x = t[e + "word_embeddings.weight"][ids] + t[e + "position_embeddings.weight"][:len(ids)] + \
        t[e + "token_type_embeddings.weight"][types]
    x = _layer_norm(x, t[e + "LayerNorm.weight"], t[e + "LayerNorm.bias"], eps)
    a = prefix + "encoder.layer.0.attention."
    heads = []
    proj = {n: x @ t[a + f"self.{n}.weight"].T + t[a + f"self.{n}.bias"] for n in ("query", "key", "value")}
    for h in range(2):
        q, k, v = (proj[n][:, 4 * h:4 * h + 4] for n in ("query", "key", "value"))
        s = q @ k.T / 2.0
        w = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append(w / w.sum(axis=1, keepdims=True) @ v)
    o = np.concatenate(heads, axis=1) @ t[a + "output.dense.weight"].T + t[a + "output.dense.bias"]
    return x, _layer_norm(x + o, t[a + "output.LayerNorm.weight"], t[a + "output.LayerNorm.bias"], eps)


@pytest.mark.parametrize("prefix, types", [("bert.", None), ("", [0, 1, 1])])
def test_bert_from_token_ids_matches_numpy(tmp_path, prefix, types):
    t = _bert_checkpoint(tmp_path, prefix)
    extra = f", token_types: {types}" if types else ""
    d = _derive(tmp_path, f"X: {{file: model.safetensors, embeddings: {prefix}embeddings.word_embeddings.weight, "
                          "tokens: [5, 0, 7]}\n"
                          "from: {file: model.safetensors, layout: bert, layer: 0, heads: all, norm: true, "
                          f"embeddings: true{extra}}}\n")
    assert d.problem.embeddings_norm.eps == sympy.Rational(1, 10 ** 12) and d.problem.token_type_ids == \
        tuple(types or [0, 0, 0])
    x, h = _bert_numpy(t, prefix, [5, 0, 7], types or [0, 0, 0])
    _close(_values(d, "X_emb"), x)
    _close(_values(d, "H"), h)


def test_gpt2_embeddings_true_adds_wpe(tmp_path):
    t = _gpt2_tensors(d_model=8)
    t["wpe.weight"] = np.random.default_rng(4).standard_normal((6, 8)).astype(np.float32)
    _save(tmp_path, t, config={"n_head": 2})
    d = _derive(tmp_path, "X: {file: model.safetensors, embeddings: wte.weight, tokens: [1, 2, 9]}\n"
                          "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, embeddings: true}\n")
    _close(_values(d, "X_pos"), t["wte.weight"][[1, 2, 9]].astype(float) + t["wpe.weight"][:3])


# -- bad input: one line at the field -----------------------------------------------------------------------


FROM = "from: {file: model.safetensors, layout: bert, layer: 0, heads: all, norm: true"
IDS = "X: {file: model.safetensors, embeddings: bert.embeddings.word_embeddings.weight, tokens: [5, 0, 7]}\n"


@pytest.mark.parametrize("text, fragment", [
    (f"X: {X}\ntoken_types: {TT}\n" + HEAD, "token_types: token types are added with the positions"),
    (f"X: {X}\npositions: {PE}\ntoken_types: [[1, 0, 0, 1]]\n" + HEAD, "token_types: the token types are 1×4"),
    (f"X: {X}\nembeddings_norm: {{type: layernorm, place: post}}\n" + HEAD,
     "unknown key 'place' in embeddings_norm"),
    (f"X: {X}\nembeddings_norm: true\n" + HEAD, "embeddings_norm: true takes the embeddings' norm from a checkpoint"),
    (f"X: {X}\nembeddings_norm: {{type: rmsnorm, eps: -1}}\n" + HEAD, "embeddings_norm.eps: eps must be ≥ 0"),
    ("X: [[1, 1, 1, 1], [0, 4, 0, 4], [1, 2, 3, 4]]\nembeddings_norm: {type: layernorm, eps: 0}\n" + HEAD,
     "embeddings_norm.eps: row 1 of X: its entries are all equal"),
    (HAND + "backward: {loss: sum}\n", "backward: the backward pass through the embeddings' norm is not derived"),
    (HAND + "norm: {type: layernorm, eps: 0}\n", "norm.eps: with the embeddings' norm in front"),
])
def test_bad_embeddings_inputs(tmp_path, symattn_cli, text, fragment):
    assert fragment in _error(tmp_path, text, symattn_cli)


@pytest.mark.parametrize("text, fragment", [
    (IDS + FROM.replace("layer: 0", "layer: 1") + ", embeddings: true}\n",
     "from.embeddings: the embeddings feed layer 0; layer 1's input is the output of the layers below"),
    (f"X: {[[0.5] * 8] * 3}\n" + FROM + ", embeddings: true}\n",
     "from.embeddings: embeddings: true adds what the model adds to rows of its embedding table"),
    (IDS + "positions: [[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]\n"
     + FROM + ", embeddings: true}\n", "positions: from: {embeddings: true} takes the positions from the checkpoint"),
    (IDS + FROM + ", token_types: [0, 0, 1]}\n", "from.token_types: token_types are read with the embeddings"),
    (IDS + FROM + ", embeddings: true, token_types: [0, 2, 1]}\n",
     "from.token_types item 2: 'model.safetensors''s bert.embeddings.token_type_embeddings.weight has 2 rows"),
    (IDS + FROM + ", embeddings: true, token_types: [0, 1]}\n", "from.token_types: token_types is a list of 3 type ids"),
    (IDS + FROM + ", embeddings: true, token_types: [0, x, 1]}\n", "from.token_types item 2: a token type is a whole"),
])
def test_bad_from_embeddings(tmp_path, symattn_cli, text, fragment):
    _bert_checkpoint(tmp_path)
    assert fragment in _error(tmp_path, text, symattn_cli)


def test_a_checkpoint_without_the_embeddings_norm_lists_close_names(tmp_path, symattn_cli):
    _bert_checkpoint(tmp_path)
    t = {k: v.astype(np.float32) for k, v in _bert_checkpoint(tmp_path).items() if "embeddings.LayerNorm" not in k}
    _save(tmp_path, t, config={"model_type": "bert", "num_attention_heads": 2})
    line = _error(tmp_path, IDS + FROM + ", embeddings: true}\n", symattn_cli)
    assert "from.embeddings: 'model.safetensors' has no tensor 'bert.embeddings.LayerNorm.weight'" in line, line


def test_the_backward_option_and_generate_from_refuse_the_embeddings_norm(tmp_path, symattn_cli):
    path = _write(tmp_path, f"X: {X}\nembeddings_norm: {{type: layernorm, eps: 1/4}}\n" + HEAD)
    r = symattn_cli.main("derive", path, "-f", "json", "--backward")
    assert r.code == 1 and r.stderr.count("\n") == 1 and "backward pass through the embeddings' norm is not derived" \
        in r.stderr, r.stderr
    r = symattn_cli.main("generate", "--from", path, "--seed", "1")
    assert r.code == 1 and "does not vary problems with a norm" in r.stderr and "embeddings_norm:" in r.stderr, \
        r.stderr
