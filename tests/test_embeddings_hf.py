"""from: {embeddings: true}, from token ids, against Hugging Face transformers' own modules.

References: the outputs (or inputs) of transformers' own modules, captured by forward hooks while
the tiny seeded models of tests/configs (BertModel, RobertaModel, GPT2LMHeadModel, saved with
save_pretrained and loaded back in float64) read the same token ids: the embeddings' output
(``model.embeddings``, which computes the positions, RoBERTa's from the ids, the token-type rows
and its LayerNorm), the attention's dense output (``attention.output.dense``) and what
BertAttention returns (after the post norm); for GPT-2 the inputs of ``ln_1`` (wte[ids] + wpe)
and ``ln_2`` (the residual stream after the attention). All compared at 1e-12.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import symattn
from symattn.problem.load import load_problem
from test_problem_checkpoints import _write
from test_problem_configs import _close, _model
from test_problem_layouts import _values

IDS = [3, 1, 4, 1, 5]


def _seen(model, ids, taps, token_types=None):
    """What each (module, "in"/"out") of ``taps`` receives or returns when the model reads ``ids``
    (with ``token_types`` as token_type_ids, when given; no attention mask: every token is attended)."""
    import torch

    seen, hooks = {}, []

    def keep(name, value):
        seen.setdefault(name, (value[0] if isinstance(value, tuple) else value)[0])

    for name, (module, side) in taps.items():
        if side == "in":
            hooks.append(module.register_forward_pre_hook(
                lambda m, args, kwargs, name=name: keep(name, args[0] if args else kwargs["hidden_states"]),
                with_kwargs=True))
        else:
            hooks.append(module.register_forward_hook(lambda m, args, out, name=name: keep(name, out)))
    kwargs = {} if token_types is None else {"token_type_ids": torch.tensor([token_types])}
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return {k: v.numpy() for k, v in seen.items()}


def _bert_taps(model):
    attention = model.encoder.layer[0].attention
    return {"X_emb": (model.embeddings, "out"), "O": (attention.output.dense, "out"), "H": (attention, "out")}


def _derive_ids(tmp_path, ids, extra=""):
    """The problem of layer 0 of the BERT-like checkpoint in tmp_path, from token ids."""
    _write(tmp_path, f"X: {{file: model.safetensors, embeddings: embeddings.word_embeddings.weight, tokens: {ids}}}\n"
                     "from: {file: model.safetensors, layout: bert, layer: 0, heads: all, norm: true, "
                     f"embeddings: true{extra}}}\n")
    p = load_problem(tmp_path / "p.yaml")
    return p, symattn.derive(p)


def _agree(d, seen):
    for stage in ("X_emb", "O", "H"):
        _close(_values(d, stage), seen[stage])


def test_bert_from_ids_matches_transformers(tmp_path):
    model = _model(tmp_path, "bert", "BertModel", "eager")
    assert model.config.layer_norm_eps == 1e-12
    seen = _seen(model, IDS, _bert_taps(model))
    p, d = _derive_ids(tmp_path, IDS)
    assert p.embeddings_norm.kind == "layernorm" and p.embeddings_norm.eps == sympy.Rational(1, 10 ** 12)
    assert p.token_type_ids == (0,) * len(IDS)
    row0 = model.embeddings.token_type_embeddings.weight.detach().numpy()[0]
    _close(_values(d, "TT"), np.tile(row0, (len(IDS), 1)))
    table = model.embeddings.position_embeddings.weight.detach().numpy()
    _close(_values(d, "PE"), table[:len(IDS)])
    _agree(d, seen)


def test_bert_token_types_match_transformers(tmp_path):
    model = _model(tmp_path, "bert", "BertModel", "eager")
    types = [0, 0, 1, 1, 1]
    assert model.config.type_vocab_size >= 2
    seen = _seen(model, IDS, _bert_taps(model), token_types=types)
    p, d = _derive_ids(tmp_path, IDS, f", token_types: {types}")
    assert p.token_type_ids == tuple(types)
    table = model.embeddings.token_type_embeddings.weight.detach().numpy()
    _close(_values(d, "TT"), table[types])
    _agree(d, seen)
    # the types matter: type 1's rows differ from type 0's, so the default's H is not this one
    assert not np.allclose(_seen(model, IDS, _bert_taps(model))["H"], seen["H"])


@pytest.mark.parametrize("ids, positions", [([3, 4, 5, 6, 7], [2, 3, 4, 5, 6]),
                                            ([3, 4, 1, 5, 6], [2, 3, 1, 4, 5])])
def test_roberta_from_ids_matches_transformers(tmp_path, ids, positions):
    """RoBERTa counts positions from pad_token_id + 1, skipping the padding tokens (which sit at
    pad_token_id); with no attention mask the padding token is attended like any other."""
    model = _model(tmp_path, "roberta", "RobertaModel", "eager")
    assert model.config.model_type == "roberta" and model.config.pad_token_id == 1
    seen = _seen(model, ids, _bert_taps(model))
    p, d = _derive_ids(tmp_path, ids)
    assert p.embeddings_norm.eps == sympy.Rational(1, 10 ** 12)
    table = model.embeddings.position_embeddings.weight.detach().numpy()
    _close(_values(d, "PE"), table[positions])
    _agree(d, seen)


def test_gpt2_embeddings_true_matches_transformers(tmp_path):
    model = _model(tmp_path, "gpt2", "GPT2LMHeadModel", "eager")
    block = model.transformer.h[0]
    seen = _seen(model, IDS, {"X_pos": (block.ln_1, "in"), "H": (block.ln_2, "in")})
    _write(tmp_path, f"X: {{file: model.safetensors, embeddings: transformer.wte.weight, tokens: {IDS}}}\n"
                     "from: {file: model.safetensors, layout: gpt2, layer: 0, heads: all, norm: true, residual: true, "
                     "embeddings: true}\n")
    p = load_problem(tmp_path / "p.yaml")
    assert p.residual and p.embeddings_norm is None
    d = symattn.derive(p)
    wte, wpe = (model.transformer.wte.weight.detach().numpy(), model.transformer.wpe.weight.detach().numpy())
    _close(seen["X_pos"], wte[IDS] + wpe[:len(IDS)])  # the hook agrees with the formula
    _close(_values(d, "X_pos"), seen["X_pos"])
    _close(_values(d, "H"), seen["H"])
