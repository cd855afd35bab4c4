"""``symattn generate --sink S`` (a learned sink logit in every head) and ``--mask
sink-window:K,W`` (StreamingLLM's mask): the generated problems carry them, keep the easy level's
guarantee counting the sink among a row's exponents (checked here from the generated integers),
and ``--from`` keeps them; bad options are refused with one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import symattn

EXAMPLE = Path(__file__).resolve().parent.parent / "worked_examples" / "learned_sinks.yaml"


def test_generate_gives_every_head_the_sink_and_keeps_the_easy_guarantee():
    """At easy each softmax row has at most two distinct exponents, the sink's counted: checked
    here from the generated integers (scaled scores with d_k = 1 are the scores)."""
    problems = symattn.generate(5, seed=4, tokens=4, d_model=2, d_k=1, d_v=1, heads=2, sink=1,
                                mask="sink-window:1,2")
    for p in problems:
        assert p.sinks == (1, 1) and p.mask.kind == "sink-window" and (p.mask.sink, p.mask.window) == (1, 2)
        X = np.array(p.X.tolist(), dtype=np.int64)
        for head in p.heads:
            S = (X @ np.array(head.W_Q.tolist(), dtype=np.int64)) @ (X @ np.array(head.W_K.tolist(), dtype=np.int64)).T
            for i in range(4):
                seen = {int(S[i, j]) for j in range(4) if j <= i and (j < 1 or i - j < 2)} | {1}
                assert len(seen) <= 2
        d = symattn.derive(p)
        assert symattn.crosscheck(d).passed
        assert "sink: [1, 1]" in p.to_yaml() and "mask: {sink: 1, window: 2}" in p.to_yaml()


def test_generate_from_a_problem_with_sinks_keeps_them():
    for p in symattn.generate(2, seed=1, base=EXAMPLE):
        assert p.sinks == (0, 2)
    base = symattn.generate(1, seed=2, tokens=4, d_model=2, d_k=1, d_v=1, mask="sink-window:1,2")[0]
    for p in symattn.generate(2, seed=5, base=base, vary="inputs"):
        assert (p.mask.kind, p.mask.sink, p.mask.window) == ("sink-window", 1, 2)


@pytest.mark.parametrize("args, fragment", [
    (["--sink", "12"], "12 is not in the range"),
    (["--sink", "1", "--block"], "--sink does not go with --block yet"),
    (["--mask", "sink-window:0,2"], "--mask sink-window:K,W needs two whole numbers ≥ 1"),
    (["--mask", "sink-window:1,2", "--cross", "3"], "is for self-attention"),
])
def test_generate_refuses_bad_sink_options_with_one_error_line(symattn_cli, args, fragment):
    result = symattn_cli("generate", *args)
    assert result.exit_code != 0
    assert fragment in result.output, result.output
