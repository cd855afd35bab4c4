"""Layer 0 of a GPT-2-small-sized checkpoint (d_model 768, 12 heads, d_ff 3072) from 16 token ids:
the cost of the whole block (``from: {block: true}``) and of the logits of the last position over
the 50,257-word vocabulary (``logits: {from: true, rows: last}``).

Run: python benchmarks/bench_block.py            (writes ~500 MB to a temporary folder)
Options: --runs N (default 3), --tokens N (default 16), --format latex|json|markdown|text|html
(default latex), --workdir DIR (keep the checkpoint and problems there; reused when present),
--seed N, --json PATH (default benchmarks/results/bench_block.json).

The checkpoint is bench_checkpoint.py's (GPT-2 small's names, shapes and layout, random float32,
fixed seed). Four problems read the same token ids' rows of wte.weight and layer 0 with
``from: {layout: gpt2, layer: 0, heads: all, embeddings: true, ...}``:

- ``attention.yaml``: ``norm: true, residual: true``: ln_1, the 12 heads and H = X_pos + O;
- ``block.yaml``: ``block: true``: the same, then ln_2, the MLP (c_fc, GELU, c_proj) and Y = H + F;
- ``logits.yaml``: ``block: true`` and ``logits: {from: true, rows: last}``: then ln_f, the logits of
  the last position against wte (tied), P and −log P of a target;
- ``backward.yaml``: the logits problem with ``backward: {loss: cross-entropy}``: every gradient from
  the loss back to X and every weight; the backward pass is its time less the logits problem's.

Each is ``python -m symattn derive P -o out.EXT --max-size 60000000`` in a fresh process, in turn,
--runs rounds after an untimed warm-up of each. Reported: the median wall and CPU time and the
peak resident memory (ru_maxrss) of each, the ratio block / attention, and the logits' extra time
over the block, and the backward pass over the forward (targets: the block under 10 s and 2 GiB,
the logits under 10 s more, the backward pass at most 1.5× the forward), as JSON too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_checkpoint import VOCAB, child_env, write_checkpoint  # noqa: E402
from bench_norm import EXTENSIONS, run  # noqa: E402

DEFAULT_JSON = HERE / "results" / "bench_block.json"
PROBLEMS = {
    "attention.yaml": "norm: true, residual: true",
    "block.yaml": "block: true",
    "logits.yaml": "block: true",
    "backward.yaml": "block: true",
}


def problem(tokens: list[int], name: str) -> str:
    extra = PROBLEMS[name]
    text = (f"title: GPT-2-sized layer 0, {name[:-5]}, {len(tokens)} tokens\n"
            f"X: {{file: model.safetensors, embeddings: wte.weight, tokens: {json.dumps(tokens)}}}\n"
            f"from: {{file: model.safetensors, layout: gpt2, layer: 0, heads: all, n_head: 12, embeddings: true, {extra}}}\n")
    if name in ("logits.yaml", "backward.yaml"):
        text += f"logits: {{from: true, rows: last, top: 5}}\nloss: {{targets: [{tokens[0]}]}}\n"
    if name == "backward.yaml":
        text += "backward: {loss: cross-entropy}\n"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--format", choices=sorted(EXTENSIONS), default="latex")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    tmp = None
    workdir = args.workdir
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="symattn-bench-block-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "model.safetensors"
    if not ckpt.exists():
        print(f"writing a GPT-2-small-sized checkpoint to {ckpt} …", flush=True)
        write_checkpoint(ckpt, args.seed)
    import numpy as np

    tokens = sorted(np.random.default_rng(args.seed).choice(VOCAB, size=args.tokens, replace=False).tolist())
    for name in PROBLEMS:
        (workdir / name).write_text(problem(tokens, name), "utf-8")
    env = child_env(workdir / "pycache")
    out = "out." + EXTENSIONS[args.format]
    load_before = os.getloadavg()[0]
    for name in PROBLEMS:
        run(workdir, env, name, out, "60000000")  # warm-up: bytecode written, the checkpoint's pages cached
    times: dict[str, list] = {name: [] for name in PROBLEMS}
    for _ in range(args.runs):
        for name in times:
            times[name].append(run(workdir, env, name, out, "60000000"))
    load_after = os.getloadavg()[0]
    rows = {name: {"wall_s": statistics.median(t[0] for t in got), "cpu_s": statistics.median(t[1] for t in got),
                   "max_rss_mb": max(t[2] for t in got) / 1024} for name, got in times.items()}
    ratio = rows["block.yaml"]["wall_s"] / rows["attention.yaml"]["wall_s"]
    extra = rows["logits.yaml"]["wall_s"] - rows["block.yaml"]["wall_s"]
    print(f"GPT-2-sized layer 0, 12 heads, d_ff 3072, {args.tokens} tokens from ids, -o {out}, median of {args.runs} "
          f"(load {load_before:.2f} before, {load_after:.2f} after):")
    for name, row in rows.items():
        print(f"  {name:15s} wall {row['wall_s']:.2f} s  cpu {row['cpu_s']:.2f} s  peak RSS {row['max_rss_mb']:.0f} MB")
    block = rows["block.yaml"]
    print(f"  the block / the attention alone: {ratio:.2f}× wall; the block {block['wall_s']:.2f} s, "
          f"{block['max_rss_mb']:.0f} MB (target < 10 s, < 2048 MB): "
          f"{'PASS' if block['wall_s'] < 10 and block['max_rss_mb'] < 2048 else 'MISS'}")
    print(f"  the last position's logits over {VOCAB:,} words: {extra:+.2f} s (target < 10 s more): "
          f"{'PASS' if extra < 10 else 'MISS'}")
    forward, backward = rows["logits.yaml"]["wall_s"], rows["backward.yaml"]["wall_s"] - rows["logits.yaml"]["wall_s"]
    print(f"  the backward pass from the loss to every weight: {backward:+.2f} s, {backward / forward:.2f}× the forward "
          f"pass ({forward:.2f} s; target ≤ 1.5×): {'PASS' if backward <= 1.5 * forward else 'MISS'}; "
          f"peak RSS {rows['backward.yaml']['max_rss_mb']:.0f} MB")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"tokens": args.tokens, "format": args.format, "runs": args.runs, "rows": rows,
                                     "ratio_block_attention": ratio, "logits_extra_s": extra,
                                     "backward_over_forward": backward / forward,
                                     "load": [load_before, load_after]}, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
