"""The ``symattn`` command line, against the CLI and JSON contract.

Every behaviour is checked three ways where it matters: in-process through
click's ``CliRunner``, through the real entry point ``python -m symattn`` in a
subprocess, and through the installed ``symattn`` console script (skipped when
it is not on PATH).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
import sympy
from click.testing import CliRunner

import symattn
from symattn.cli import cli, main
from _child import CliResult, SymattnCli, run_cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "worked_examples"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
BUILTIN = EXAMPLES / "causal_4_tokens.yaml"
BUILTIN_TITLE = "Causal self-attention on four tokens"

# The contract: stage ids, in this order, for one head.
PROJECTED_IDS = ["X", "W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
GIVEN_IDS = ["Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
SPEC_STAGE_KEYS = {"id", "title", "shape", "exact", "approx"}
SPEC_CROSSCHECK_KEYS = {"reference", "max_abs_error", "tolerance", "passed", "per_stage"}
SPEC_DIMS_KEYS = {"n_q", "n_k", "d_model", "d_k", "d_v", "heads"}
HEAD_IDS = ["W_Q", "W_K", "W_V", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O"]
# linear: instead of K_T … A, then O and the recurrent form (then state_cost, after the heads)
LINEAR_IDS = ["phi_Q", "phi_K", "S_lin", "z_lin", "A_lin", "O", "z_state", "S_state", "rec_num", "rec_den", "O_rec",
              "O_rec_diff"]
# differential: the second map after A, then the differential map and O (instead of A's own O)
DIFFERENTIAL_IDS = ["W_Q2", "W_K2", "Q_2", "K_2", "S_2", "S_2masked", "A_2", "A_diff", "A_diff_sums", "O"]
# decode: t adds token t's row from the KV cache after each head's stages, then the cost table
DECODE_IDS = ["K_cache", "V_cache", "q_t", "s_t", "a_t", "o_t", "o_t_diff"]
# with kv_heads, a K/V group's stages are listed once, with the group's first query head
GROUP_IDS = {"W_K", "W_V", "b_K", "b_V", "K", "V", "K_rot", "K_T", "K_cache", "V_cache"}


def _biases(raw: dict) -> list[str]:
    """The projection biases a problem file gives (b_Q, b_K, b_V; at the top or in its heads)."""
    heads = raw.get("heads") or [raw]
    return [b for b in ("b_Q", "b_K", "b_V") if b in heads[0] or b in (raw.get("kv") or [{}])[0]]


def _from_layer(raw: dict, folder: Path) -> dict:
    """The fields a ``from:`` layer of one head fills, worked out from the checkpoint's tensor
    names: its biases, when the layout's bias tensor of that layer is in the file."""
    spec = raw["from"]
    from safetensors import safe_open

    with safe_open(str(folder / spec["file"]), framework="numpy") as f:
        names = set(f.keys())
    layer = spec["layer"]
    bias = {"gpt2": f"h.{layer}.attn.c_attn.bias", "llama": f"layers.{layer}.self_attn.q_proj.bias",
            "bert": f"layer.{layer}.attention.self.query.bias"}[spec["layout"]]
    biases = {"b_Q": None, "b_K": None, "b_V": None} if any(name.endswith(bias) for name in names) else {}
    out: dict = dict(biases)
    if spec["heads"] == "all" or len(spec["heads"]) > 1:  # several heads: W_O (and b_O) after them
        count = spec["n_head"] if spec["heads"] == "all" else len(spec["heads"])
        out["heads"] = [dict(biases) for _ in range(count)]
        proj = {"gpt2": f"h.{layer}.attn.c_proj.bias", "llama": f"layers.{layer}.self_attn.o_proj.bias",
                "bert": f"layer.{layer}.attention.output.dense.bias"}[spec["layout"]]
        if any(name.endswith(proj) for name in names):
            out["b_O"] = None
    if spec.get("norm"):  # the layout's norm: LayerNorm with γ and β (gpt2, bert), RMSNorm with γ (llama)
        out["norm"] = {"type": "rmsnorm" if spec["layout"] == "llama" else "layernorm", "weight": None,
                       **({} if spec["layout"] == "llama" else {"bias": None}),
                       **({"place": "post"} if spec["layout"] == "bert" else {})}
    if spec.get("residual"):
        out["residual"] = True
    if spec.get("embeddings") and spec["layout"] != "llama":  # the positions; bert's token types and LayerNorm
        out["positions"] = True
        if spec["layout"] == "bert":
            out.update(token_types=True, embeddings_norm={"type": "layernorm", "weight": None, "bias": None})
    if spec["layout"] == "llama":  # RoPE, and K/V heads shared in groups when there are fewer
        out["rope"] = True
        if spec.get("n_kv_head", spec.get("n_head")) != spec.get("n_head"):
            out["kv_heads"] = spec["n_kv_head"]
    out.update(_from_block(raw, spec))
    return out


def _layout_norm(layout: str, post: bool = False) -> dict:
    """A layout's norm as a problem spells it: RMSNorm with γ (llama), LayerNorm with γ and β."""
    return {"type": "rmsnorm", "weight": None} if layout == "llama" else \
        {"type": "layernorm", "weight": None, "bias": None, **({"place": "post"} if post else {})}


def _from_block(raw: dict, spec: dict) -> dict:
    """What ``block: true`` (the layer's norm, the residual, the second norm and the MLP) and
    ``logits: {from: true}`` (the final norm and the unembedding) fill in."""
    out: dict = {}
    layout = spec["layout"]
    if spec.get("block"):
        if "norm" not in spec:
            out["norm"] = _layout_norm(layout, post=layout == "bert")
        out["residual"] = True
        weights = {"W_gate": None, "W_up": None, "W_down": None} if layout == "llama" else \
            {"W_1": None, "b_1": None, "W_2": None, "b_2": None}
        out["mlp"] = {"norm": _layout_norm(layout, post=layout == "bert"), **weights}
    if isinstance(raw.get("logits"), dict) and raw["logits"].get("from"):
        out["logits"] = {**{k: v for k, v in raw["logits"].items() if k != "from"}, "norm": _layout_norm(layout),
                         "W_U": None}
    return out


def contract_ids(example: Path) -> list[str]:
    """The contract's stage ids for a problem file, in order, worked out from its fields."""
    raw = yaml.safe_load(example.read_text("utf-8"))
    if "from" in raw:
        raw.update(_from_layer(raw, example.parent))
    if "mlp" in raw or "logits" in raw:  # both read the residual stream
        raw["residual"] = True
    return _forward_ids(raw) + _block_ids(raw) + (_gradient_ids(raw) if "backward" in raw else [])


def _block_ids(raw: dict) -> list[str]:
    """The ids of the MLP (issue 31): its norm, its weights and stages, the block's output; then
    the model's head: the final norm, the unembedding, the logits, P, and the loss."""
    ids: list[str] = []
    mlp, logits = raw.get("mlp"), raw.get("logits")

    def renamed(norm_ids: list[str], prefix: str) -> list[str]:
        return [prefix + i[len("norm"):] if i.startswith("norm_") else i for i in norm_ids]

    if mlp is not None:
        norm = mlp.get("norm")
        post = norm is not None and norm.get("place") == "post"
        if norm is not None and not post:
            ids += renamed(_norm_ids(norm, "H_hat", "H_norm"), "mlp")
        if "W_gate" in mlp:
            ids += ["W_gate", "W_up", "U_gate", "U_up", "G", "W_down", "F"]
        else:
            ids += ["W_1"] + ["b_1"] * ("b_1" in mlp) + ["U", "G", "W_2"] + ["b_2"] * ("b_2" in mlp) + ["F"]
        ids += ["Y_sum", *renamed(_norm_ids(norm, "Y_hat", "Y"), "mlp")] if post else ["Y"]
    if logits is not None:
        ids += ["Y_last"] * (logits.get("rows") == "last")
        if "norm" in logits:
            ids += renamed(_norm_ids(logits["norm"], "Y_final_hat", "Y_final"), "final")
        ids += ["W_U", "logits", "P"] + (["nll", "L"] if "loss" in raw else [])
    return ids


def _mla_ids(raw: dict) -> list[str]:
    """mla: the latent and the weights, then per head its assembled Q, K, V, the usual head and the absorption,
    then the cache table, concat and W_O."""
    compressed = "W_DQ" in raw["mla"]
    ids = ["X", "W_DKV", "c_KV", "W_KR", "k_R", "k_R_rot"] + ["W_DQ", "c_Q"] * compressed
    ids += ["W_UK", "W_UV", "W_UQ" if compressed else "W_Q", "W_QR"]
    per_head = ["q_C", "q_R", "q_R_rot", "K_C", "Q", "K", "V", "K_T", "S", "S_scaled", "M", "S_masked", "A", "O",
                "q_abs", "S_abs", "S_abs_diff"]
    ids += [f"head{h}.{i}" for h in range(1, raw["mla"]["heads"] + 1) for i in per_head]
    return ids + ["mla_cache", "concat", "W_O"] + ["b_O"] * ("b_O" in raw) + ["O"]


def _forward_ids(raw: dict) -> list[str]:
    if "mla" in raw:
        return _mla_ids(raw)
    given, head_ids = GIVEN_IDS, HEAD_IDS
    if "rope" in raw:  # RoPE rotates Q and K before the keys are transposed
        given, head_ids = (ids[:ids.index("V") + 1] + ["Q_rot", "K_rot"] + ids[ids.index("V") + 1:]
                           for ids in (GIVEN_IDS, HEAD_IDS))
    if "qk_norm" in raw:  # QK-norm after the projections (RMSNorm: the mean square, x̂, γ, the output), before RoPE
        norm = ["ms", "hat", "gamma", "norm"]
        q = [{"ms": "q_norm_ms", "hat": "Q_hat", "gamma": "q_norm_gamma", "norm": "Q_norm"}[k] for k in norm]
        k = [{"ms": "k_norm_ms", "hat": "K_hat", "gamma": "k_norm_gamma", "norm": "K_norm"}[k] for k in norm]
        given, head_ids = (ids[:ids.index("V") + 1] + q + k + ids[ids.index("V") + 1:] for ids in (given, head_ids))
    if "softcap" in raw:  # the cap between the scaling and the mask; one row without and with it after A
        given, head_ids = (ids[:ids.index("M")] + ["S_capped"] + ids[ids.index("M"):] for ids in (given, head_ids))
    if "temperature" in raw:  # the temperature after the mask
        given, head_ids = (ids[:ids.index("A")] + ["S_temp"] + ids[ids.index("A"):] for ids in (given, head_ids))
    rows = ["cap_row"] * ("softcap" in raw) + ["temp_row"] * ("temperature" in raw)
    if rows:
        given, head_ids = (ids[:ids.index("A") + 1] + rows + ids[ids.index("A") + 1:] for ids in (given, head_ids))
    if "sink" in raw:  # a learned sink: what it absorbed, after the weights
        given, head_ids = (ids[:ids.index("A") + 1] + ["A_sink"] + ids[ids.index("A") + 1:]
                           for ids in (given, head_ids))
    if "differential" in raw:  # the second map, the difference and its O after the first map's A
        given, head_ids = (ids[:ids.index("A") + 1] + DIFFERENTIAL_IDS for ids in (given, head_ids))
    tiled = ["m_tiled", "l_tiled", "acc_tiled", "O_tiled"] if "tiling" in raw else []  # after each head's O
    if "linear" in raw:  # linear attention: its features and both forms instead of K_T … A; the state's cost after
        given, head_ids = (ids[:ids.index("K_T")] + LINEAR_IDS for ids in (GIVEN_IDS, HEAD_IDS))
    if "Q" in raw:
        return given + tiled + (DECODE_IDS + ["step_cost"] if "decode" in raw else []) + ["state_cost"] * ("linear" in raw)
    ids = ["X"] + (["context"] if "context" in raw else []) + (["PE", "X_pos"] if "positions" in raw else [])
    if "token_types" in raw:  # TT between PE and X_pos: X_pos = X + PE + TT
        ids.insert(ids.index("X_pos"), "TT")
    if "embeddings_norm" in raw:  # the embeddings' own norm, whose output X_emb is the layer's input
        ids += ["emb" + i[len("norm"):] if i.startswith("norm_") else i
                for i in _norm_ids(raw["embeddings_norm"], "X_emb_hat", "X_emb")]
    norm = raw.get("norm")
    post = norm is not None and norm.get("place") == "post"
    if norm is not None and not post:
        ids += _norm_ids(norm, "X_hat", "X_norm")
    biases = _biases(raw)  # after the weights, before the projections
    head_ids = head_ids[:3] + biases + head_ids[3:] if biases and "Q" not in raw else head_ids
    per_head = head_ids + tiled + (DECODE_IDS if "decode" in raw else [])
    cost = ["step_cost"] if "decode" in raw else ["state_cost"] if "linear" in raw else []
    # behind the attention: H = X + O, or with a post norm R = X + O and its norm H
    residual = (["R"] + _norm_ids(norm, "R_hat", "H")) if post else ["H"] if raw.get("residual") else []
    if "heads" not in raw:
        return ids + per_head + cost + residual
    n = len(raw["heads"])
    size = n // raw.get("kv_heads", n)  # query heads per K/V group
    for h in range(1, n + 1):
        first = (h - 1) % size == 0
        ids += [f"head{h}.{i}" for i in per_head if first or i not in GROUP_IDS]
    return ids + cost + ["concat", "W_O"] + (["b_O"] if "b_O" in raw else []) + ["O"] + residual


def _norm_ids(norm: dict, hat: str, out: str) -> list[str]:
    """A norm's stage ids: its row statistics, the normalised rows, γ and β when given, its output."""
    stats = ["norm_ms"] if norm["type"] == "rmsnorm" else ["norm_mean", "norm_var"]
    return (stats + [hat] + (["norm_gamma"] if "weight" in norm else []) + (["norm_beta"] if "bias" in norm else [])
            + [out])


def _block_gradient_ids(raw: dict) -> list[str]:
    """Back from the cross-entropy (issue 31): the head's and the MLP's gradients, before dH."""
    if (raw.get("backward") or {}).get("loss") != "cross-entropy":
        return []
    mlp, logits = raw.get("mlp"), raw["logits"]

    def weights(norm: dict, prefix: str) -> list[str]:
        return [f"d{prefix}_gamma"] * ("weight" in norm) + [f"d{prefix}_beta"] * ("bias" in norm)

    ids = ["dlogits", "dW_U"]
    if "norm" in logits:
        ids += ["dY_final", "dY_final_hat", *weights(logits["norm"], "final")]
    ids += ["dY_last"] * (logits.get("rows") == "last")
    if mlp is None:
        return ids
    norm = mlp.get("norm")
    post = norm is not None and norm.get("place") == "post"
    ids += ["dY"] + (["dY_hat", *weights(norm, "mlp"), "dY_sum"] if post else []) + ["dF"]
    if "W_gate" in mlp:
        ids += ["dW_down", "dG", "dU_gate", "dU_up", "dW_gate", "dW_up"]
    else:
        ids += ["db_2"] * ("b_2" in mlp) + ["dW_2", "dG", "dU"] + ["db_1"] * ("b_1" in mlp) + ["dW_1"]
    if norm is not None and not post:
        ids += ["dH_norm", "dH_hat", *weights(norm, "mlp")]
    return ids


def _gradient_ids(raw: dict) -> list[str]:
    """The backward pass's stage ids (issue 9), in the order backpropagation visits them."""
    head = ["dV", "dA", "dS_masked", "dS"] + (["dQ_rot", "dK_rot"] if "rope" in raw else []) + ["dQ", "dK"]
    if "Q" in raw:
        return ["dO"] + head
    head += ["dW_Q", "dW_K", "dW_V"] + ["d" + b for b in _biases(raw)]
    norm = raw.get("norm")
    post = norm is not None and norm.get("place") == "post"
    # the norm's weight and bias gradients, where it has them (issue 30)
    params = [] if norm is None else ["dnorm_gamma"] * ("weight" in norm) + ["dnorm_beta"] * ("bias" in norm)
    top = ["dH"] if raw.get("residual") or post else []  # the loss on the residual stream H
    top = _block_gradient_ids(raw) + top  # back from the cross-entropy to H
    top += ["dR_hat", *params, "dR"] if post else []  # then back through a post norm
    pre = ["dX_norm", "dX_hat", *params] if norm is not None and not post else []  # the paths reach X_norm
    tail = pre + ["dX"] + (["dcontext"] if "context" in raw else [])
    if "heads" not in raw:
        return top + ["dO"] + head + tail
    ids = top + ["dO", "dW_O"] + (["db_O"] if "b_O" in raw else []) + ["dconcat"]
    heads = range(1, len(raw["heads"]) + 1)  # every head's share dO first, as the README says
    ids += [f"head{h}.dO" for h in heads]
    size = len(raw["heads"]) // raw.get("kv_heads", len(raw["heads"]))
    shared = {"dV", "dK", "dK_rot", "dW_K", "dW_V", "db_K", "db_V"}  # a K/V group's, after its last head
    for h in heads:
        ids += [f"head{h}.{i}" for i in head if size == 1 or i not in shared]
        if size > 1 and h % size == 0:
            ids += [f"head{h - size + 1}.{i}" for i in head if i in shared]
    return ids + tail

# A small valid problem (queries, keys and values given) used by the file tests.
SMALL_PROBLEM = "title: Small\nQ: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\n"

SCRIPT = shutil.which("symattn")
PDFLATEX = shutil.which("pdflatex")


# -- running the command three ways -------------------------------------------------


Run = CliResult


class Invoker:
    """Runs ``symattn ARGS`` in the folder ``cwd`` one of three ways (the conftest's symattn_cli)."""

    def __init__(self, kind: str, cwd: Path, cli: SymattnCli) -> None:
        self.kind = kind
        self.cwd = cwd
        self.cli = cli

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Run:
        if self.kind == "clirunner":
            # an exception CliRunner swallowed, which the real entry point would have had to handle,
            # shows as the traceback a user would have seen, so "no Traceback" checks catch it
            return self.cli(*args, cwd=self.cwd, env=env, show_traceback=True)
        return self.cli.entry(*args, cwd=self.cwd, env=env, how={"python-m": "python-m"}.get(self.kind, "script"))


@pytest.fixture(params=["clirunner", "python-m", "console-script"])
def run(request, tmp_path, symattn_cli) -> Invoker:
    if request.param == "console-script" and SCRIPT is None:
        pytest.skip("the symattn console script is not on PATH")
    return Invoker(request.param, tmp_path, symattn_cli)


@pytest.fixture
def run_inproc(tmp_path, symattn_cli) -> Invoker:
    """CliRunner only, for the checks that run many times over."""
    return Invoker("clirunner", tmp_path, symattn_cli)


def assert_one_error_line(r: Run, *fragments: str) -> str:
    """Exit 1, nothing on stdout, exactly one 'Error: ' line on stderr holding ``fragments``."""
    assert "Traceback" not in r.stderr, r.stderr
    assert r.code == 1, (r.code, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{r.stderr}"
    line = lines[0]
    assert line.startswith("Error: "), line
    for fragment in fragments:
        assert fragment in line, f"{fragment!r} not in {line!r}"
    return line


def fresh_latex(path: Path, **kwargs) -> str:
    return symattn.render_latex(symattn.derive(symattn.load_problem(path)), **kwargs)


# -- symattn derive without a problem -----------------------------------------------


def test_derive_without_argument_prints_the_builtin_example(run):
    r = run("derive")
    assert r.code == 0, r.stderr
    assert r.stderr == ""
    out = r.stdout
    assert out.startswith("\\documentclass[11pt]{article}\n")
    assert "\\begin{document}" in out
    assert out.endswith("\\end{document}\n")
    assert BUILTIN_TITLE in out
    assert f"\\title{{{BUILTIN_TITLE}}}" in out
    # The built-in example is the committed worked example: the same steps,
    # followed by the cross-check paragraph that the CLI adds by default.
    without_check = fresh_latex(BUILTIN)
    assert out.startswith(without_check[: -len("\n\\end{document}\n")])
    assert "\\section*{Cross-check}" in out
    assert "Every stage agrees with an independent NumPy float64 evaluation" in out


def test_builtin_example_runs_in_under_five_cpu_seconds(tmp_path):
    """The child's CPU time (a busy machine stretches the wall clock, not that)."""
    r = run_cli(["derive"], cwd=tmp_path)
    r.assert_bounded(5.0)
    assert r.code == 0, r.err
    assert BUILTIN_TITLE in r.out


_GC_PROBE = """
import gc, sys
from symattn.cli.imports import Importing
gc.{before}()
frozen = gc.get_freeze_count()
with Importing():
    from symattn.reference import crosscheck
print(frozen, gc.get_freeze_count(), gc.isenabled(), "sympy" in sys.modules, "numpy" in sys.modules)
"""


@pytest.mark.parametrize("before", ["enable", "disable"])
def test_the_heavy_imports_pause_the_collector_and_freeze_what_they_built(before):
    """The first import of SymPy (a fresh process) freezes the objects it built, and leaves the
    collector as it found it."""
    done = subprocess.run([sys.executable, "-c", _GC_PROBE.format(before=before)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    frozen_before, frozen_after, enabled, sympy_loaded, numpy_loaded = done.stdout.split()
    assert (sympy_loaded, numpy_loaded) == ("True", "True")
    assert int(frozen_before) == 0
    assert int(frozen_after) > 100_000  # SymPy and NumPy's own objects
    assert enabled == str(before == "enable")


def test_a_command_in_process_leaves_the_collector_alone(tmp_path):
    """Once SymPy is imported (as in this test process), a command freezes nothing: a program or
    test that calls main() keeps its garbage collected as before."""
    import gc

    before = gc.get_freeze_count()
    assert main(["derive", "-o", str(tmp_path / "a.tex")]) == 0
    assert gc.get_freeze_count() == before
    assert gc.isenabled()


def test_the_console_script_freezes_its_objects_as_it_ends(tmp_path):
    """main() as the console script runs it (no arguments given) freezes the process's objects
    before interpreter shutdown, having flushed its output: the whole solution is there."""
    probe = ("import gc, sys\nfrom symattn import cli\nfrom symattn.cli.imports import Importing\nwith Importing():\n    from symattn.reference import crosscheck\n"
             "kept = [[k] for k in range(20_000)]  # tracked objects made after the imports were frozen\n"
             "before = gc.get_freeze_count()\nsys.argv = ['symattn', 'derive', '--format', 'text']\n"
             "code = cli.main()\nprint('frozen', before, gc.get_freeze_count(), file=sys.stderr)\nsys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stderr.split("frozen ")[1].split()[:2])
    assert before > 100_000  # the imports' own objects
    assert after >= before + 20_000  # and, as main() ends, what was made since
    expected = CliRunner().invoke(cli, ["derive", "--format", "text"], prog_name="symattn")
    assert expected.exit_code == 0
    assert done.stdout == expected.stdout


def test_fragment_has_no_document_wrapper(run):
    r = run("derive", "--fragment")
    assert r.code == 0, r.stderr
    assert "\\documentclass" not in r.stdout
    assert "\\begin{document}" not in r.stdout
    assert "\\end{document}" not in r.stdout
    assert "\\maketitle" not in r.stdout
    assert "\\section*{Step 1: The input}" in r.stdout
    # a comment and two fallbacks so it compiles without colortbl, then the solution
    head, _, rest = r.stdout.partition("\nThe problem: ")
    assert head.startswith("% symattn worked solution")
    # (and boxes, the macro that fits a display to the line, reporting its width, and those that
    # keep a step on one page): definitions only, each a provided command or a box made once
    lines = head.split("\n")[1:]
    assert "\\providecommand{\\cellcolor}" in head and "\\providecommand{\\symattnkeep}" in head
    assert all(line.startswith(("\\providecommand{", "\\ifdefined\\symattn")) for line in lines), lines
    assert rest.startswith("4 tokens (The, cat, sat, down)")


def test_standalone_flag_gives_a_document(run_inproc):
    r = run_inproc("derive", "--standalone")
    assert r.code == 0
    assert r.stdout.startswith("\\documentclass")


def test_no_check_leaves_out_the_cross_check(run_inproc):
    r = run_inproc("derive", "--no-check")
    assert r.code == 0, r.stderr
    assert "Cross-check" not in r.stdout
    # and it is then exactly the rendering without a check
    assert r.stdout == fresh_latex(BUILTIN)


def test_digits_sets_the_decimal_places(run_inproc):
    problem = EXAMPLES / "causal_dk2.yaml"
    default = run_inproc("derive", problem, "-f", "text")
    eight = run_inproc("derive", problem, "-f", "text", "--digits", "8")
    assert default.code == eight.code == 0
    # S/√2 holds 4·√2 = 5.65685424949...
    assert "5.657 " in default.stdout and "5.6568542" not in default.stdout
    assert "5.6568542 " in eight.stdout


@pytest.mark.parametrize("bad", ["0", "51", "many"])
def test_digits_out_of_range_is_a_usage_error(run_inproc, bad):
    r = run_inproc("derive", "--digits", bad)
    assert r.code == 2
    assert "--digits" in r.stderr
    assert r.stdout == ""


# -- --version and --help -----------------------------------------------------------


def test_version(run):
    r = run("--version")
    assert r.code == 0, r.stderr
    assert r.stdout == f"symattn, version {symattn.__version__}\n"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_group_help(run, flag):
    r = run(flag)
    assert r.code == 0, r.stderr
    assert r.stdout.startswith("Usage: symattn [OPTIONS] COMMAND [ARGS]...")
    assert "--version" in r.stdout
    assert "-h, --help" in r.stdout
    assert "derive" in r.stdout
    assert "Derive every stage of attention" in r.stdout


def test_derive_help_lists_every_spec_option(run):
    r = run("derive", "--help")
    assert r.code == 0, r.stderr
    out = r.stdout
    assert out.startswith("Usage: symattn derive [OPTIONS] [PROBLEM]")
    for option in (
        "-o, --output",
        "-f, --format [latex|markdown|myst|text|json|html]",
        "--standalone / --fragment",
        "--digits",
        "--no-check",
    ):
        assert option in out, f"{option!r} missing from derive --help"
    for suffix in (".tex", ".md", ".json", ".txt", ".pdf", ".html"):
        assert suffix in out


# -- --format json -----------------------------------------------------------------


def test_json_of_the_builtin_example(run):
    r = run("derive", "--format", "json")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == {"title", "dims", "stages", "crosscheck"}
    assert data["title"] == BUILTIN_TITLE
    assert data["dims"] == {"n_q": 4, "n_k": 4, "d_model": 4, "d_k": 4, "d_v": 2, "heads": 1}
    ids = [s["id"] for s in data["stages"]]
    assert ids == PROJECTED_IDS
    for stage in data["stages"]:
        assert SPEC_STAGE_KEYS <= set(stage), stage.keys()

    stage = {s["id"]: s for s in data["stages"]}
    assert stage["X"]["exact"] == [["1", "0", "1", "0"], ["0", "2", "0", "2"], ["1", "1", "1", "1"], ["0", "1", "0", "1"]]
    # causal mask: additive M is 0 on and below the diagonal, -oo above it
    assert stage["M"]["exact"] == [
        ["0", "-oo", "-oo", "-oo"],
        ["0", "0", "-oo", "-oo"],
        ["0", "0", "0", "-oo"],
        ["0", "0", "0", "0"],
    ]
    assert stage["M"]["approx"][0] == [0.0, None, None, None]
    assert stage["S_masked"]["exact"][0] == ["1", "-oo", "-oo", "-oo"]
    assert stage["S_masked"]["approx"][0] == [1.0, None, None, None]
    # Worked by hand: S_scaled row 2 is [6, 4, 8, 2]; masked it keeps [6, 4], so
    # A[1][0] = e^6 / (e^6 + e^4) = 1 / (1 + e^-2) and A[1][1] = e^-2 / (1 + e^-2).
    e = sympy.E
    assert sympy.simplify(sympy.sympify(stage["A"]["exact"][1][0]) - 1 / (1 + e**-2)) == 0
    assert sympy.simplify(sympy.sympify(stage["A"]["exact"][1][1]) - e**-2 / (1 + e**-2)) == 0
    assert stage["A"]["exact"][1][2:] == ["0", "0"]
    assert stage["A"]["approx"][1][0] == pytest.approx(1 / (1 + math.exp(-2)), rel=1e-15)
    # the first query sees only itself: its output is the first value row, V[0] = [2, 1]
    assert stage["O"]["exact"][0] == ["2", "1"]

    check = data["crosscheck"]
    assert set(check) == SPEC_CROSSCHECK_KEYS
    assert check["reference"] == "numpy float64"
    assert check["passed"] is True
    assert 0 <= check["max_abs_error"] <= check["tolerance"]
    assert list(check["per_stage"]) == PROJECTED_IDS


def test_json_stage_keys_are_exactly_the_spec_keys(run_inproc):
    r = run_inproc("derive", "--format", "json")
    data = json.loads(r.stdout)
    for stage in data["stages"]:
        assert set(stage) == SPEC_STAGE_KEYS, f"{stage['id']}: {sorted(stage)}"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_json_exact_entries_read_back_to_the_derivation(run_inproc, example):
    r = run_inproc("derive", example, "--format", "json")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    derivation = symattn.derive(symattn.load_problem(example))

    # the contract's keys; an output projection adds its width d_out
    assert set(data["dims"]) - {"d_out"} == SPEC_DIMS_KEYS
    assert ("d_out" in data["dims"]) == (derivation.problem.W_O is not None)
    expected_ids = contract_ids(example)
    assert [s["id"] for s in data["stages"]] == expected_ids
    assert data["crosscheck"]["passed"] is True
    assert set(data["crosscheck"]["per_stage"]) == set(expected_ids)

    neg_inf = sympy.S.NegativeInfinity
    for stage in data["stages"]:
        step = derivation.step(stage["id"])
        if stage["exact"] is None:  # shown in decimals only, as documented: the approx against 30 digits
            assert not step.written_exactly, stage["id"]
            approx = [[-math.inf if v is None else v for v in row] for row in stage["approx"]]  # None: −∞
            np.testing.assert_allclose(np.array(approx, dtype=float),
                                       [[float(v) for v in row] for row in derivation.evaluate(stage["id"], 30)],
                                       rtol=1e-15, atol=0)
            continue
        exact = step.exact
        rows, cols = stage["shape"]
        assert (rows, cols) == exact.shape
        assert len(stage["exact"]) == len(stage["approx"]) == rows
        for i in range(rows):
            assert len(stage["exact"][i]) == len(stage["approx"][i]) == cols
            for j in range(cols):
                text, approx, want = stage["exact"][i][j], stage["approx"][i][j], exact[i, j]
                where = f"{example.name} {stage['id']}[{i}][{j}] = {text!r}"
                got = sympy.sympify(text)
                if want == neg_inf:
                    assert text == "-oo", where
                    assert got == neg_inf, where
                    assert approx is None, where
                    continue
                assert text != "-oo" and approx is not None, where
                assert got == want or sympy.simplify(got - want) == 0, f"{where} but the derivation has {want}"
                assert isinstance(approx, float), where
                # decimals of a symbolic entry are at the problem's values
                at_values = want.xreplace(dict(derivation.problem.values))
                assert _close(approx, float(sympy.N(at_values, 30))), f"{where}: approx {approx}"


def test_json_masked_entries_in_a_padding_mask(run_inproc):
    # qkv_given masks the last key (padding) for every query.
    data = json.loads(run_inproc("derive", EXAMPLES / "qkv_given.yaml", "-f", "json").stdout)
    stage = {s["id"]: s for s in data["stages"]}
    for i in range(3):
        assert stage["M"]["exact"][i] == ["0", "0", "-oo"]
        assert stage["M"]["approx"][i] == [0.0, 0.0, None]
        assert stage["S_masked"]["exact"][i][2] == "-oo"
        assert stage["S_masked"]["approx"][i][2] is None
        assert stage["A"]["exact"][i][2] == "0"
        assert stage["A"]["approx"][i][2] == 0.0


# -- -o and the output format ---------------------------------------------------------


def _looks_like(kind: str, text: str) -> None:
    if kind == "latex":
        assert text.startswith("\\documentclass"), text[:80]
        assert text.endswith("\\end{document}\n")
    elif kind == "markdown":
        assert text.startswith(f"# {BUILTIN_TITLE}\n"), text[:80]
        assert "\n$$\n" in text
    elif kind == "json":
        assert json.loads(text)["title"] == BUILTIN_TITLE
    elif kind == "text":
        assert text.startswith(f"{BUILTIN_TITLE}\n{'=' * len(BUILTIN_TITLE)}\n"), text[:80]
        assert "\\" not in text.split("\n", 3)[2]
    else:  # pragma: no cover
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "name, kind",
    [("out.tex", "latex"), ("out.md", "markdown"), ("out.markdown", "markdown"), ("out.json", "json"), ("out.txt", "text")],
)
def test_output_suffix_picks_the_format(run, tmp_path, name, kind):
    r = run("derive", "-o", name)
    assert r.code == 0, r.stderr
    assert r.stdout == ""
    written = tmp_path / name
    _looks_like(kind, written.read_text("utf-8"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name], "temporary files left behind"


def test_output_long_option_and_overwrite(run_inproc, tmp_path):
    target = tmp_path / "solution.tex"
    target.write_text("old contents\n")
    r = run_inproc("derive", "--output", "solution.tex", "--fragment")
    assert r.code == 0, r.stderr
    text = target.read_text("utf-8")
    assert "old contents" not in text
    assert "\\documentclass" not in text
    assert "\\section*{Step 1: The input}" in text


@pytest.mark.parametrize("fmt, kind", [("json", "json"), ("markdown", "markdown"), ("text", "text")])
def test_format_option_wins_over_the_suffix(run_inproc, tmp_path, fmt, kind):
    r = run_inproc("derive", "-o", "out.tex", "-f", fmt)
    assert r.code == 0, r.stderr
    _looks_like(kind, (tmp_path / "out.tex").read_text("utf-8"))


@pytest.mark.parametrize("fmt, kind", [("latex", "latex"), ("markdown", "markdown"), ("json", "json"), ("text", "text")])
def test_format_option_on_standard_output(run_inproc, fmt, kind):
    r = run_inproc("derive", "-f", fmt)
    assert r.code == 0, r.stderr
    _looks_like(kind, r.stdout)


@pytest.mark.parametrize("name", ["out.docx", "out", "out.yaml"])
def test_unknown_suffix_is_a_usage_error(run, tmp_path, name):
    r = run("derive", "-o", name)
    assert r.code == 2, (r.code, r.stderr)
    assert r.stdout == ""
    assert "Usage: symattn derive" in r.stderr
    assert f"Error: cannot tell the format from {name!r}" in r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_pdf_with_a_non_latex_format_is_a_usage_error(run_inproc, tmp_path):
    r = run_inproc("derive", "-o", "out.pdf", "-f", "json")
    assert r.code == 2
    assert "--format json cannot be written as a PDF" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(PDFLATEX is None, reason="pdflatex is not installed")
def test_pdf_output(run, tmp_path):
    r = run("derive", "-o", "x.pdf")
    assert r.code == 0, r.stderr
    assert r.stdout == ""
    data = (tmp_path / "x.pdf").read_bytes()
    assert data.startswith(b"%PDF")
    assert b"%%EOF" in data[-64:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.pdf"], "temporary files left behind"


# -- bad problem files ----------------------------------------------------------------

BAD_FILES = {
    # name: (content, the exact place, more text the message must hold)
    "unknown-field": (
        "title: x\nQ: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\nmaks: causal\n",
        "bad.yaml:5:1:",  # 'maks' starts line 5
        ["unknown field 'maks'", "did you mean 'mask'"],
    ),
    "yaml-extra-bracket": (
        "Q: [[1, 0]]\nK: [[1, 0], [0, 1]]]\nV: [[1], [2]]\n",
        "bad.yaml:2:20:",  # 'K: [[1, 0], [0, 1]]' is 19 characters; the stray ']' is column 20
        ["invalid YAML"],
    ),
    "yaml-colon-in-plain-scalar": (
        "Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], [2]]\ntitle: a: b\n",
        "bad.yaml:4:9:",  # 'title: a' is 8 characters; the second ':' is column 9
        ["invalid YAML", "mapping values are not allowed"],
    ),
    "ragged-row": (
        "Q: [[1, 0]]\nK:\n  - [1, 0]\n  - [0, 1, 2]\nV: [[1], [2]]\n",
        "bad.yaml:4:5:",  # '  - ' then the row's '[' at column 5 of line 4
        ["K row 2", "row 2 has 3 entries but row 1 has 2"],
    ),
    "shape-mismatch": (
        "Q: [[1, 0]]\nK: [[1, 0, 0], [0, 1, 0]]\nV: [[1], [2]]\n",
        "bad.yaml:2:1:",  # reported at the key K
        ["Q is 1×2 but K is 2×3"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_problem_file_is_one_error_line(run, tmp_path, case):
    content, place, fragments = BAD_FILES[case]
    (tmp_path / "bad.yaml").write_text(content, "utf-8")
    r = run("derive", "bad.yaml")
    line = assert_one_error_line(r, place, *fragments)
    assert line.startswith(f"Error: {place} ")


def test_missing_problem_file_is_one_error_line(run, tmp_path):
    r = run("derive", "missing.yaml")
    line = assert_one_error_line(r, "missing.yaml", "no such file")
    assert line == "Error: missing.yaml: no such file"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("suffix", [".tex", ".json", ".pdf"])
def test_failed_run_leaves_the_existing_output_untouched(run, tmp_path, suffix):
    (tmp_path / "bad.yaml").write_text(BAD_FILES["ragged-row"][0], "utf-8")
    target = tmp_path / f"out{suffix}"
    original = b"precious old output\n\x00\xff binary tail"
    target.write_bytes(original)
    before = sorted(p.name for p in tmp_path.iterdir())
    r = run("derive", "bad.yaml", "-o", target.name)
    assert_one_error_line(r, "bad.yaml:4:5:")
    assert target.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "temporary files left behind"


@pytest.mark.skipif(os.name != "posix", reason="the fake pdflatex is a shell script")
def test_failed_pdf_compilation_leaves_the_existing_output_untouched(run, tmp_path):
    """A failure after the derivation (pdflatex fails) must not touch the old output either."""
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pdflatex"
    fake.write_text("#!/bin/sh\necho '! Emergency stop.'\necho 'l.1 fake failure'\nexit 1\n")
    fake.chmod(0o755)
    # keep the real interpreter and console script reachable, but find the fake pdflatex first
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    run.cwd = work
    target = work / "out.pdf"
    target.write_bytes(b"%PDF-old")
    r = run("derive", "-o", "out.pdf", env={"PATH": path})  # CliRunner sets os.environ too
    assert_one_error_line(r, "pdflatex failed", "Emergency stop")
    assert target.read_bytes() == b"%PDF-old"
    assert sorted(p.name for p in work.iterdir()) == ["out.pdf"], "temporary files left behind"


def test_output_folder_that_does_not_exist(run, tmp_path):
    r = run("derive", "-o", "nowhere/out.tex")
    assert_one_error_line(r, "does not exist")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "problem_name, args",
    [
        ("p.tex", ["-o", "p.tex"]),  # the suffix makes it look like an output
        ("p.yaml", ["-o", "p.yaml", "-f", "json"]),
        ("p.yaml", ["-o", "./sub/../p.yaml", "-f", "latex"]),  # another spelling of the same path
    ],
)
def test_output_onto_the_problem_file_is_refused(run, tmp_path, problem_name, args):
    (tmp_path / "sub").mkdir()
    problem = tmp_path / problem_name
    original = (EXAMPLES / "qkv_given.yaml").read_bytes()
    problem.write_bytes(original)
    r = run("derive", problem_name, *args)
    assert_one_error_line(r, "is the problem file itself")
    assert problem.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([problem_name, "sub"])
    assert list((tmp_path / "sub").iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_output_onto_a_link_to_the_problem_file_is_refused(run_inproc, tmp_path, how):
    problem = tmp_path / "p.yaml"
    original = (EXAMPLES / "qkv_given.yaml").read_bytes()
    problem.write_bytes(original)
    link = tmp_path / "link.json"
    try:
        (os.symlink if how == "symlink" else os.link)(problem, link)
    except OSError as exc:  # pragma: no cover - filesystems without links
        pytest.skip(f"cannot make a {how}: {exc}")
    r = run_inproc("derive", "p.yaml", "-o", "link.json")
    assert_one_error_line(r, "is the problem file itself")
    assert problem.read_bytes() == original


# -- entries are never executed ---------------------------------------------------------


def test_python_in_an_entry_is_not_executed(run, tmp_path):
    marker = tmp_path / "MARKER"
    entry = f"__import__('os').system('touch {marker.as_posix()}')"
    (tmp_path / "bad.yaml").write_text(f'Q: [[1, 0]]\nK: [[1, 0], [0, 1]]\nV: [[1], ["{entry}"]]\n', "utf-8")
    r = run("derive", "bad.yaml")
    # 'V: [[1], [' is 10 characters: the quoted entry starts at column 11 of line 3
    assert_one_error_line(r, "bad.yaml:3:11:", "V row 2, column 1")
    assert not marker.exists()


def test_python_yaml_tag_is_not_executed(run, tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / "bad.yaml").write_text(
        f'Q: !!python/object/apply:os.system ["touch {marker.as_posix()}"]\nK: [[1]]\nV: [[1]]\n', "utf-8"
    )
    r = run("derive", "bad.yaml")
    assert_one_error_line(r, "bad.yaml:1:4:", "is not allowed")  # the tag starts after 'Q: '
    assert not marker.exists()


# -- errors the user can fix are exit 1, not "internal error" ------------------------------


def test_unwritable_output_is_a_user_error(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / ".out.tex.tmp"))

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    code = main(["derive", "-o", "out.tex"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert code == 1, err
    assert err.startswith("Error: ") and len(err.splitlines()) == 1, err
    assert "bug in symattn" not in err
    assert "Permission denied" in err


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc (a folder nobody can write to)")
def test_unwritable_output_folder_through_the_entry_point(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "symattn", "derive", "-o", "/proc/symattn-test-out.tex"],
        cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: ")
    assert "bug in symattn" not in done.stderr


# -- the tests' child process (tests/_child.py): what it measures is the child's own -------------


def test_a_childs_peak_memory_is_its_own_not_the_test_workers(tmp_path):
    """Linux counts a forked process's peak memory from the process it was forked from: run from a
    test worker grown to 700 MiB, a small command would seem to peak at 700 MiB. The launcher
    forks the command from a fresh process, so its peak is the command's."""
    from _child import run_cli

    grown = bytearray(700 << 20)
    grown[::4096] = b"x" * len(grown[::4096])  # every page touched: resident
    r = run_cli(["--version"], cwd=tmp_path)
    assert r.code == 0 and "symattn" in r.out, r.err
    assert r.peak_bytes < 350 << 20, f"{r.peak_bytes / 2**20:.0f} MiB for --version"
    del grown


def test_the_cpu_cap_ends_a_child_and_says_so(tmp_path):
    """A command past its CPU seconds is killed (SIGXCPU) through the launcher, and the result says
    which guard ended it."""
    from _child import run_cli

    n = 30  # RoPE on its general path (π/6 beside 1/3): some 20 CPU seconds (see the budget's ROPE_WORK)
    rows = "\n".join(f"  - [{(i % 3) - 1}, {i % 2}, 1, {(i * 7) % 5 - 2}]" for i in range(n))
    (tmp_path / "p.yaml").write_text(f"X:\n{rows}\nW_Q: [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]\n"
                                     "W_K: [[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,1]]\nW_V: [[1],[2],[3],[4]]\n"
                                     'rope: {angles: ["pi/6", "1/3"]}\n', encoding="utf-8")
    r = run_cli(["derive", "p.yaml", "-o", "p.tex"], cwd=tmp_path, cpu=2)
    assert r.killed and r.killed_by == "the CPU cap", (r.code, r.cpu_seconds, r.err[-300:])
    # the child's own CPU time, up to its cap: the kernel stops it on a tick of its scheduler clock,
    # which getrusage reports to within a few accounting ticks (10 ms each at HZ = 100): 1.999 s was seen
    assert 2 - 0.05 <= r.cpu_seconds < 10, r.cpu_seconds
    assert not (tmp_path / "p.tex").exists()
