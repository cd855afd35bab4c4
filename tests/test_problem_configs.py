"""from: with the config.json that Hugging Face transformers writes beside a checkpoint.

transformers 5 writes RoPE's settings under ``rope_parameters`` (``{"rope_theta": 100.0,
"rope_type": "default"}``, no top-level ``rope_theta``), older versions ``rope_theta`` and
``rope_scaling``; both spellings are read. Every setting that changes the layer's attention is
either applied (rope_theta, head_dim, a sliding window, GPT-2's scale, BERT's is_decoder) or
refused in one line naming it (any rope_type but default, partial_rotary_factor, relative
positions, soft-capping, a model type whose attention the layout does not follow).

The config files are tests/configs/*.json, written by transformers itself
(tests/configs/make_configs.py), so these tests run without it; where transformers is installed
each is also written afresh, and the layers are compared with the models' own modules.
"""

from __future__ import annotations

import importlib.util
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import sympy

import symattn
from _child import run_cli
from symattn.problem.load import load_problem
from test_problem_checkpoints import _error, _write
from test_problem_layouts import _bert_tensors, _gpt2_tensors, _llama_tensors, _save, _values, _x

CONFIGS = Path(__file__).resolve().parent / "configs"


def _make_configs():
    spec = importlib.util.spec_from_file_location("symattn_make_configs", CONFIGS / "make_configs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["committed", "transformers"])
def config_text(request):
    """The text of a case's config.json: the committed copy, or the one the installed transformers
    writes now."""
    if request.param == "committed":
        return lambda name: (CONFIGS / f"{name}.json").read_text("utf-8")
    pytest.importorskip("transformers")
    make = _make_configs()
    return lambda name: make.written(make.configs()[name])


def _close(got, want):
    """float64 references of a few dot products, an exp and a sum are good to about 1e-15 of the
    largest entry; 1e-12 leaves three digits of room and is far below any real mistake (a RoPE
    base of 10000 for 100 moves the output by about 0.5 here)."""
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


def _dims(config: dict) -> tuple[int, int, int, int]:
    """d_model, n_head, n_kv_head and d_head as transformers reads them from the config."""
    d_model = config.get("hidden_size", config.get("n_embd"))
    n_head = config.get("num_attention_heads", config.get("n_head"))
    n_kv = config.get("num_key_value_heads") or n_head
    return d_model, n_head, n_kv, config.get("head_dim") or d_model // n_head


def _checkpoint(tmp_path, text: str, layout: str):
    """Random float32 tensors of the config's shape saved beside the config's text; the tensors in
    float64 (exact)."""
    config = json.loads(text)
    d_model, n_head, n_kv, d_head = _dims(config)
    tensors = {"llama": lambda: _llama_tensors(d_model, n_head, n_kv, d_head, bias=True),
               "gpt2": lambda: _gpt2_tensors(d_model),
               "bert": lambda: _bert_tensors(d_model)}[layout]()
    t = _save(tmp_path, tensors)
    (tmp_path / "config.json").write_text(text, "utf-8")
    return t


def _from(tmp_path, x, spec: str, extra: str = ""):
    return load_problem(_write(tmp_path, f"X: {json.dumps(np.asarray(x).tolist())}\nfrom: {{{spec}}}\n{extra}"))


# -- an independent float64 reference -------------------------------------------------------------------------


def _rotate(m, theta: float):
    """Hugging Face's RoPE (rotate_half) on the rows of m (n × d_head), positions 0 … n − 1."""
    n, d = m.shape
    inv = theta ** (-np.arange(0, d, 2) / d)
    angle = np.outer(np.arange(n), np.concatenate([inv, inv]))
    half = np.concatenate([-m[:, d // 2:], m[:, :d // 2]], axis=1)
    return m * np.cos(angle) + half * np.sin(angle)


def _attention(x, q, k, v, w_o, b_o, n_head, n_kv, scale, allowed, theta=None):
    """The layer's output: q, k, v the projections (n × heads·d_head), heads in column blocks, the
    K/V heads shared by n_head / n_kv consecutive query heads; ``allowed`` (n × n) the mask."""
    d = q.shape[1] // n_head
    heads = []
    for h in range(n_head):
        g = h // (n_head // n_kv)
        qh, kh, vh = q[:, h * d:(h + 1) * d], k[:, g * d:(g + 1) * d], v[:, g * d:(g + 1) * d]
        if theta is not None:
            qh, kh = _rotate(qh, theta), _rotate(kh, theta)
        s = np.where(allowed, qh @ kh.T * scale, -np.inf)
        a = np.exp(s - s.max(axis=1, keepdims=True))
        heads.append(a / a.sum(axis=1, keepdims=True) @ vh)
    return np.hstack(heads) @ w_o + (0 if b_o is None else b_o)


def _llama_reference(x, t, layer, n_head, n_kv, theta, window=None):
    p = f"model.layers.{layer}.self_attn."
    q, k, v = (x @ t[p + f"{s}_proj.weight"].T + t[p + f"{s}_proj.bias"] for s in "qkv")
    n = x.shape[0]
    i, j = np.indices((n, n))
    allowed = (j <= i) & ((i - j < window) if window else True)
    d = q.shape[1] // n_head
    return _attention(x, q, k, v, t[p + "o_proj.weight"].T, None, n_head, n_kv, d ** -0.5, allowed, theta)


def _gpt2_reference(x, t, layer, n_head, scale):
    p = f"h.{layer}.attn."
    q, k, v = np.split(x @ t[p + "c_attn.weight"] + t[p + "c_attn.bias"], 3, axis=1)
    n = x.shape[0]
    i, j = np.indices((n, n))
    return _attention(x, q, k, v, t[p + "c_proj.weight"], t[p + "c_proj.bias"], n_head, n_head, scale, j <= i)


def _bert_reference(x, t, layer, n_head, causal):
    p = f"bert.encoder.layer.{layer}.attention."
    q, k, v = (x @ t[p + f"self.{s}.weight"].T + t[p + f"self.{s}.bias"] for s in ("query", "key", "value"))
    n = x.shape[0]
    i, j = np.indices((n, n))
    d = q.shape[1] // n_head
    return _attention(x, q, k, v, t[p + "output.dense.weight"].T, t[p + "output.dense.bias"], n_head, n_head,
                      d ** -0.5, (j <= i) if causal else np.ones((n, n), bool))


# -- read and applied --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, theta", [("llama_rope_theta_100", 100), ("qwen2_rope_theta_1e6", 10 ** 6),
                                         ("llama", 10000)])
def test_rope_theta_under_rope_parameters_is_read(tmp_path, config_text, name, theta):
    """transformers 5 writes rope_theta only inside rope_parameters: that base is the one used,
    exactly, and the layer is what an independent NumPy RoPE gives with it."""
    text = config_text(name)
    config = json.loads(text)
    assert "rope_theta" not in config and config["rope_parameters"]["rope_theta"] == theta
    t = _checkpoint(tmp_path, text, "llama")
    x = _x(4, 16)
    p = _from(tmp_path, x, "file: model.safetensors, layout: llama, layer: 1, heads: all")
    assert p.rope.base == theta and p.kv_heads == 2 and p.mask.kind == "causal"
    _close(_values(symattn.derive(p), "O"), _llama_reference(x.astype(float), t, 1, 4, 2, float(theta)))
    # the same as giving the base in from:
    given = _from(tmp_path, x, f"file: model.safetensors, layout: llama, layer: 1, heads: all, rope_theta: {theta}")
    assert given.rope == p.rope


def test_a_decimal_rope_theta_is_its_decimal_exactly(tmp_path):
    """JSON's 12345.678 is the decimal 12345678/1000, not the binary float nearest to it."""
    _save(tmp_path, _llama_tensors(16, 4, 2, 4))
    (tmp_path / "config.json").write_text('{"num_attention_heads": 4, "num_key_value_heads": 2, '
                                          '"rope_parameters": {"rope_type": "default", "rope_theta": 12345.678}}')
    p = _from(tmp_path, _x(2, 16), "file: model.safetensors, layout: llama, layer: 0, heads: [1]")
    assert p.rope.base == sympy.Rational(12345678, 1000) and p.rope.base != sympy.Rational(Fraction(12345.678))


@pytest.mark.parametrize("config, base", [
    ({"rope_theta": 500000.0}, 500000),  # the old spelling, top level
    ({"rope_theta": 100, "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}}, 100),  # both, agreeing
    ({"rope_scaling": None, "rope_theta": 100.0}, 100),  # LLaMA 2's configs write rope_scaling: null
    ({"rope_scaling": {"type": "default", "rope_theta": 1e2}}, 100),
    ({"partial_rotary_factor": 1.0, "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1}}, 10000),
    ({"sliding_window": None, "use_sliding_window": False, "layer_types": ["full_attention"] * 2}, 10000),
    ({"model_type": "qwen2", "sliding_window": 2, "use_sliding_window": False}, 10000),  # Qwen 2.5 writes this
    ({"model_type": "qwen2_moe", "sliding_window": 0, "use_sliding_window": False}, 10000),
    ({"sliding_window": 4}, 10000),  # a window of 4 hides no key of 4 tokens
    ({"head_dim": 4, "attention_bias": True, "pretraining_tp": 1}, 10000),
])
def test_harmless_settings_and_both_spellings_are_accepted(tmp_path, config, base):
    t = _save(tmp_path, _llama_tensors(16, 4, 2, 4, bias=True),
              {"num_attention_heads": 4, "num_key_value_heads": 2, **config})
    x = _x(4, 16)
    p = _from(tmp_path, x, "file: model.safetensors, layout: llama, layer: 1, heads: all")
    assert p.rope.base == base and p.mask.kind == "causal"
    _close(_values(symattn.derive(p), "O"), _llama_reference(x.astype(float), t, 1, 4, 2, float(base)))


def test_head_dim_is_applied(tmp_path, config_text):
    """head_dim 6 with d_model 16 and 4 heads: q_proj has 4 × 6 rows, the scale is 1/√6 and RoPE
    turns 3 pairs."""
    text = config_text("llama_head_dim_6")
    assert json.loads(text)["head_dim"] == 6
    t = _checkpoint(tmp_path, text, "llama")
    x = _x(3, 16)
    p = _from(tmp_path, x, "file: model.safetensors, layout: llama, layer: 0, heads: all")
    assert p.d_k == 6 and p.rope.base == 100
    _close(_values(symattn.derive(p), "O"), _llama_reference(x.astype(float), t, 0, 4, 2, 100.0))


@pytest.mark.parametrize("name, layer, window", [
    ("mistral_sliding_window_3", 0, 3), ("mistral_sliding_window_3", 1, 3),  # every layer
    ("qwen2_sliding_window_2", 0, None), ("qwen2_sliding_window_2", 1, 2),  # layer_types: full, sliding
    ("mistral", 1, None),  # sliding_window 4096 hides none of 5 keys
])
def test_the_sliding_window_is_applied(tmp_path, config_text, name, layer, window):
    t = _checkpoint(tmp_path, config_text(name), "llama")
    x = _x(5, 16)
    p = _from(tmp_path, x, f"file: model.safetensors, layout: llama, layer: {layer}, heads: all")
    assert (p.mask.kind, p.mask.window) == (("sliding-window", window) if window else ("causal", None))
    _close(_values(symattn.derive(p), "O"), _llama_reference(x.astype(float), t, layer, 4, 2, 10000.0, window))
    # a mask given in the problem replaces the layout's, the window with it
    assert _from(tmp_path, x, f"file: model.safetensors, layout: llama, layer: {layer}, heads: [1]",
                 "mask: none\n").mask.kind == "none"


@pytest.mark.parametrize("name, layer, scale", [
    ("gpt2", 1, "auto"),
    ("gpt2_inverse_layer_idx", 0, 1 / sympy.sqrt(4)),
    ("gpt2_inverse_layer_idx", 1, 1 / (sympy.sqrt(4) * 2)),  # divided by layer + 1
    ("gpt2_unscaled", 1, "none"),  # scale_attn_weights: false
])
def test_gpt2s_scale_is_applied(tmp_path, config_text, name, layer, scale):
    t = _checkpoint(tmp_path, config_text(name), "gpt2")
    x = _x(3, 8)
    p = _from(tmp_path, x, f"file: model.safetensors, layout: gpt2, layer: {layer}, heads: all")
    assert p.scale == scale if isinstance(scale, str) else sympy.simplify(p.scale - scale) == 0
    factor = {"auto": 1 / sympy.sqrt(4), "none": 1}.get(scale, scale) if isinstance(scale, str) else scale
    _close(_values(symattn.derive(p), "O"), _gpt2_reference(x.astype(float), t, layer, 2, float(factor)))
    # the problem's own scale replaces the config's
    assert _from(tmp_path, x, f"file: model.safetensors, layout: gpt2, layer: {layer}, heads: all",
                 "scale: 1/3\n").scale == sympy.Rational(1, 3)


@pytest.mark.parametrize("name, causal", [("bert", False), ("roberta", False), ("bert_decoder", True)])
def test_berts_is_decoder_makes_the_layer_causal(tmp_path, config_text, name, causal):
    t = _checkpoint(tmp_path, config_text(name), "bert")
    x = _x(3, 8)
    p = _from(tmp_path, x, "file: model.safetensors, layout: bert, layer: 1, heads: all")
    assert p.mask.kind == ("causal" if causal else "none")
    _close(_values(symattn.derive(p), "O"), _bert_reference(x.astype(float), t, 1, 2, causal))


# -- refused: one line naming the key ----------------------------------------------------------------------------

REFUSED = [
    ("llama_rope_llama3", "llama", "sets rope_parameters.rope_type 'llama3', which symattn does not apply"),
    ("llama_rope_linear", "llama", "sets rope_parameters.rope_type 'linear', which symattn does not apply"),
    ("llama_rope_dynamic", "llama", "sets rope_parameters.rope_type 'dynamic', which symattn does not apply"),
    ("llama_rope_yarn", "llama", "sets rope_parameters.rope_type 'yarn', which symattn does not apply"),
    ("llama_rope_longrope", "llama", "sets rope_parameters.rope_type 'longrope', which symattn does not apply"),
    ("llama_partial_rotary", "llama", "sets rope_parameters.partial_rotary_factor 0.5 (RoPE on part of each head), "
                                      "which symattn does not apply"),
    ("gemma2", "llama", "is for a 'gemma2' model (model_type), whose attention symattn's llama layout does not follow"),
    ("qwen3", "llama", "is for a qwen3 model, which normalises its queries and keys (QK-norm), but the file has no "
                       "model.layers.1.self_attn.q_norm.weight"),  # a qwen3 config: its q_norm and k_norm are needed
    ("bert_relative_key", "bert", "sets position_embedding_type 'relative_key' (relative positions in the scores), "
                                  "which symattn does not apply"),
]


@pytest.mark.parametrize("name, layout, fragment", REFUSED)
def test_what_symattn_does_not_apply_is_refused(tmp_path, symattn_cli, config_text, name, layout, fragment):
    _checkpoint(tmp_path, config_text(name), layout)
    width = 16 if layout == "llama" else 8
    line = _error(tmp_path, f"X: {json.dumps(_x(4, width).tolist())}\n"
                            f"from: {{file: model.safetensors, layout: {layout}, layer: 1, heads: all}}\n", symattn_cli)
    assert line.startswith("Error: P:2:1: from: the config.json beside 'model.safetensors' ") and fragment in line, line


@pytest.mark.parametrize("config, fragment", [
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "sets rope_scaling.type 'linear'"),  # transformers 4
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}, "rope_theta": 500000.0},
     "sets rope_scaling.rope_type 'llama3'"),
    ({"rope_parameters": {"rope_type": "default", "mrope_section": [1, 1]}}, "sets rope_parameters.mrope_section"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "sets rope_parameters.full_attention"),
    ({"rope_parameters": "default"}, "has rope_parameters 'default', not an object"),
    ({"partial_rotary_factor": 0.25}, "sets partial_rotary_factor 0.25 (RoPE on part of each head)"),
    ({"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}},
     "gives rope_theta 10000.0 and rope_parameters.rope_theta 100.0, which disagree"),
    ({"rope_parameters": {"rope_type": "default"}, "rope_scaling": {"type": "linear"}},
     "gives rope_parameters.rope_type 'default' and rope_scaling.type 'linear', which disagree"),
    ({"n_head": 2}, "gives n_head 2 and num_attention_heads 4, which disagree"),
    ({"rope_parameters": {"rope_theta": -1.0}}, "has rope_parameters.rope_theta -1.0, not a positive number"),
    ({"rope_parameters": {"rope_theta": "100"}}, "has rope_parameters.rope_theta '100', not a positive number"),
    ('"rope_theta": 1e999', "has rope_theta 1e999, not a positive number"),
    ('"rope_theta": -Infinity', "has rope_theta -Infinity, not a positive number"),
    ({"rope_theta": float("nan")}, "has rope_theta NaN, not a positive number"),
    ({"head_dim": 3}, "has head_dim 3, but the 16 rows of model.layers.1.self_attn.q_proj.weight make 4 heads 4 wide"),
    ({"attn_logit_softcapping": 50.0}, "sets attn_logit_softcapping 50.0 (soft-capped scores), which symattn does not "
                                       "apply"),
    ({"query_pre_attn_scalar": 16}, "sets query_pre_attn_scalar 16 (scores scaled by its inverse square root, not by "
                                    "1/√d_head = 1/√4)"),
    ({"attention_multiplier": 0.5}, "sets attention_multiplier 0.5"),
    ({"layer_types": ["full_attention", "chunked_attention"]},
     "gives layer 1 the attention type 'chunked_attention' (layer_types), which symattn does not apply"),
    ({"layer_types": ["full_attention"]}, "has layer_types with 1 entry, none for layer 1"),
    ({"layer_types": "full_attention"}, "has layer_types 'full_attention', not a list"),
    ({"sliding_window": 2}, "sets sliding_window 2, which hides keys from X's 4 tokens, and symattn cannot tell "
                            "whether layer 1 applies it (it has no model_type): give mask: {sliding-window: 2} or "
                            "mask: causal in the problem"),
    ({"model_type": "llama", "sliding_window": 2}, "(model_type 'llama' does not say)"),
    ({"model_type": "qwen2", "sliding_window": 2, "use_sliding_window": True}, "(it has no layer_types)"),
    ({"sliding_window": "wide"}, "has sliding_window 'wide', not a whole number ≥ 1 or null"),
    ({"model_type": "qwen2", "use_sliding_window": "yes", "sliding_window": 2}, "has use_sliding_window 'yes', not "
                                                                               "true or false"),
    ({"model_type": ["llama"]}, "has model_type a list, not a name such as 'llama'"),
])
def test_llama_config_refusals(tmp_path, symattn_cli, config, fragment):
    """Settings written by hand or by older transformers, each refused in one line naming it (a
    string is JSON text that Python's json.dumps would not write)."""
    _save(tmp_path, _llama_tensors(16, 4, 2, 4, bias=True))
    heads = '"num_attention_heads": 4, "num_key_value_heads": 2'
    (tmp_path / "config.json").write_text("{" + heads + ", " + (config if isinstance(config, str) else
                                                                json.dumps(config)[1:-1]) + "}", "utf-8")
    line = _error(tmp_path, f"X: {json.dumps(_x(4, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: llama, layer: 1, heads: all}\n", symattn_cli)
    assert fragment in line, line


def test_the_keys_are_refused_whatever_the_model_type(tmp_path, symattn_cli, config_text):
    """Gemma 2's config without its model_type: its soft-capping is refused by name."""
    config = json.loads(config_text("gemma2"))
    del config["model_type"]
    _checkpoint(tmp_path, json.dumps(config), "llama")
    line = _error(tmp_path, f"X: {json.dumps(_x(4, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: llama, layer: 1, heads: all}\n", symattn_cli)
    assert "sets attn_logit_softcapping 50.0 (soft-capped scores), which symattn does not apply" in line, line


def test_a_mask_in_the_problem_answers_an_undecided_window(tmp_path):
    _save(tmp_path, _llama_tensors(16, 4, 2, 4), {"num_attention_heads": 4, "num_key_value_heads": 2,
                                                  "sliding_window": 2})
    p = _from(tmp_path, _x(4, 16), "file: model.safetensors, layout: llama, layer: 1, heads: [1]",
              "mask: {sliding-window: 2}\n")
    assert (p.mask.kind, p.mask.window) == ("sliding-window", 2)


def test_normalised_queries_without_keys_are_refused(tmp_path, symattn_cli):
    """Qwen 3 normalises each head's queries and keys; a file with q_norm alone is no layer symattn follows
    (both are applied: tests/test_qk_norm.py)."""
    t = _llama_tensors(16, 4, 2, 4)
    t["model.layers.1.self_attn.q_norm.weight"] = np.ones(4, np.float32)
    _save(tmp_path, t, {"num_attention_heads": 4, "num_key_value_heads": 2})
    line = _error(tmp_path, f"X: {json.dumps(_x(4, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: llama, layer: 1, heads: all}\n", symattn_cli)
    assert ("from.layout: 'model.safetensors' has model.layers.1.self_attn.q_norm.weight but no "
            "model.layers.1.self_attn.k_norm.weight: symattn applies QK-norm to the queries and the keys together") in line, line


@pytest.mark.parametrize("config, layout, fragment", [
    ({"n_head": 2, "scale_attn_weights": "no"}, "gpt2", "has scale_attn_weights 'no', not true or false"),
    ({"n_head": 2, "model_type": "gpt_neo"}, "gpt2", "is for a 'gpt_neo' model (model_type)"),
    ({"num_attention_heads": 2, "is_decoder": 1}, "bert", "has is_decoder 1, not true or false"),
    ({"num_attention_heads": 2, "position_embedding_type": "relative_key_query"}, "bert",
     "sets position_embedding_type 'relative_key_query'"),
])
def test_gpt2_and_bert_config_refusals(tmp_path, symattn_cli, config, layout, fragment):
    _save(tmp_path, _gpt2_tensors(8) if layout == "gpt2" else _bert_tensors(8), config)
    line = _error(tmp_path, f"X: {json.dumps(_x(3, 8).tolist())}\n"
                            f"from: {{file: model.safetensors, layout: {layout}, layer: 1, heads: all}}\n", symattn_cli)
    assert fragment in line, line


# -- hostile numbers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, layout", [
    ("n_head", "gpt2"), ("num_key_value_heads", "llama"), ("head_dim", "llama"), ("sliding_window", "llama"),
    ("rope_theta", "llama"),
])
def test_a_million_digit_number_in_the_config(tmp_path, key, layout):
    """A 999,000-digit number is one short Error: line, through the real command line, at once:
    the digits are counted before any conversion, and only an excerpt is shown."""
    tensors = _gpt2_tensors(8) if layout == "gpt2" else _llama_tensors(16, 4, 2, 4)
    _save(tmp_path, tensors)
    heads = {"gpt2": '"n_head": 2, ', "llama": '"num_attention_heads": 4, "num_key_value_heads": 2, '}[layout]
    heads = heads.replace(f'"{key}": ', '"unread": ')
    (tmp_path / "config.json").write_text("{" + heads + f'"{key}": ' + "7" * 999_000 + "}", "utf-8")
    _write(tmp_path, f"X: {json.dumps(_x(6, 16 if layout == 'llama' else 8).tolist())}\n"
                     f"from: {{file: model.safetensors, layout: {layout}, layer: 0, heads: all}}\n")
    run = run_cli(["derive", "p.yaml"], cwd=tmp_path)
    run.assert_bounded()
    line = run.one_error_line()
    assert run.code == 1 and key in line and "777777… (999,000 characters)" in line and len(line) < 400, line


def test_a_million_digit_number_the_layer_does_not_read_costs_nothing(tmp_path):
    _save(tmp_path, _gpt2_tensors(8))
    (tmp_path / "config.json").write_text('{"n_head": 2, "vocab_size": ' + "7" * 999_000 + "}", "utf-8")
    _write(tmp_path, f"X: {json.dumps(_x(3, 8).tolist())}\n"
                     "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: [1]}\n")
    run = run_cli(["derive", "p.yaml", "-f", "json"], cwd=tmp_path)
    run.assert_bounded()
    assert run.code == 0 and json.loads(run.out)["crosscheck"]["passed"] is True, run.err


# -- against transformers' own modules ----------------------------------------------------------------------


def _model(tmp_path, name: str, cls: str, attention: str):
    """The case's model, saved by transformers (config.json and model.safetensors in tmp_path)
    and loaded back from them in float64, its weights drawn from N(0, 1) so that the heads differ."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = getattr(transformers, cls)(_make_configs().configs()[name])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    model.save_pretrained(tmp_path)
    model = getattr(transformers, cls).from_pretrained(tmp_path, dtype=torch.float64, attn_implementation=attention)
    return model.eval()


def _float64_rope(model):
    """transformers computes RoPE's angles in float32 whatever the model's dtype: recompute them
    in float64 from the base transformers read from the config, as its default RoPE does."""
    import torch

    config, rotary = model.config, model.model.rotary_emb
    assert rotary.rope_type == "default" and rotary.attention_scaling == 1.0
    base = config.rope_parameters["rope_theta"]
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary.forward = forward
    return base


def _run(model, ids, x_module, out_module):
    """The input of ``x_module`` and the output of ``out_module`` when the model reads ``ids``."""
    import torch

    seen = {}

    def take_x(module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"])[0]

    def take_out(module, args, out):
        seen["out"] = (out[0] if isinstance(out, tuple) else out)[0]

    hooks = [x_module.register_forward_pre_hook(take_x, with_kwargs=True), out_module.register_forward_hook(take_out)]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return seen["x"].numpy(), seen["out"].numpy()


def _exact_rows(x) -> str:
    """X as exact fractions: the float64 values the module read, each its own dyadic rational."""
    rows = ", ".join("[" + ", ".join(f"{Fraction(float(v)).numerator}/{Fraction(float(v)).denominator}"
                                     for v in row) + "]" for row in x)
    return f"X: [{rows}]\n"


@pytest.mark.parametrize("name, cls, layer, n", [
    ("llama_rope_theta_100", "LlamaForCausalLM", 1, 4),
    ("qwen2_rope_theta_1e6", "Qwen2ForCausalLM", 0, 4),
    ("llama_head_dim_6", "LlamaForCausalLM", 1, 3),
    ("mistral_sliding_window_3", "MistralForCausalLM", 1, 5),
    ("qwen2_sliding_window_2", "Qwen2ForCausalLM", 1, 5),
    ("qwen2_sliding_window_2", "Qwen2ForCausalLM", 0, 5),
])
def test_llama_layers_match_transformers(tmp_path, name, cls, layer, n):
    """The layer's output (o_proj's) from symattn and from the model's own attention module, X the
    module's input; grouped K/V heads, biases, RoPE bases 100 and 10^6, head_dim, sliding windows."""
    model = _model(tmp_path, name, cls, "sdpa")
    base = _float64_rope(model)
    attention = model.model.layers[layer].self_attn
    x, out = _run(model, [3, 1, 4, 1, 5][:n], attention, attention)
    _write(tmp_path, _exact_rows(x) + f"from: {{file: model.safetensors, layout: llama, layer: {layer}, heads: all}}\n")
    p = load_problem(tmp_path / "p.yaml")
    assert p.rope.base == sympy.Rational(Fraction(base))
    _close(_values(symattn.derive(p), "O"), out)


@pytest.mark.parametrize("name, layer", [("gpt2_inverse_layer_idx", 1), ("gpt2_unscaled", 0), ("gpt2", 1)])
def test_gpt2_layers_match_transformers(tmp_path, name, layer):
    model = _model(tmp_path, name, "GPT2LMHeadModel", "eager")
    attention = model.transformer.h[layer].attn
    x, out = _run(model, [3, 1, 4], attention, attention)
    _write(tmp_path, _exact_rows(x) + f"from: {{file: model.safetensors, layout: gpt2, layer: {layer}, heads: all}}\n")
    _close(_values(symattn.derive(load_problem(tmp_path / "p.yaml")), "O"), out)


@pytest.mark.parametrize("name", ["bert", "bert_decoder"])
def test_bert_layers_match_transformers(tmp_path, name):
    model = _model(tmp_path, name, "BertModel", "eager")
    attention = model.encoder.layer[1].attention
    x, out = _run(model, [3, 1, 4], attention.self, attention.output.dense)
    _write(tmp_path, _exact_rows(x) + "from: {file: model.safetensors, layout: bert, layer: 1, heads: all}\n")
    _close(_values(symattn.derive(load_problem(tmp_path / "p.yaml")), "O"), out)


def test_llama3_scaling_written_by_transformers_is_refused(tmp_path, symattn_cli):
    model = _model(tmp_path, "llama_rope_llama3", "LlamaForCausalLM", "sdpa")
    assert model.config.rope_parameters["rope_type"] == "llama3"
    line = _error(tmp_path, f"X: {json.dumps(_x(3, 16).tolist())}\n"
                            "from: {file: model.safetensors, layout: llama, layer: 0, heads: all}\n", symattn_cli)
    assert line == ("Error: P:2:1: from: the config.json beside 'model.safetensors' sets rope_parameters.rope_type "
                    "'llama3', which symattn does not apply (it applies plain RoPE, rope_type default): give rope: "
                    "{base: ...} in the problem to use plain RoPE angles"), line
