"""Layer 0 of a GPT-2-small-sized checkpoint, all 12 heads, from token ids: the cost of ln_1 and
the residual stream.

Run: python benchmarks/bench_norm.py            (writes ~500 MB to a temporary folder)
Options: --runs N (default 3), --tokens N (default 16), --format latex|json|markdown|text|html
(default latex), --workdir DIR (keep the checkpoint and problems there; reused when present),
--seed N, --json PATH (default benchmarks/results/bench_norm.json).

The checkpoint is bench_checkpoint.py's (GPT-2 small's names, shapes and layout, random float32,
fixed seed). Two problems read the same 16 token ids' rows of wte.weight, the first rows of
wpe.weight, and every head of layer 0 with ``from: {layout: gpt2, layer: 0, heads: all}``:

- ``norm.yaml``: with ``norm: true, residual: true`` in ``from:``, so X_norm = ln_1(X + PE)
  (ε = 1e-5, exact) feeds the heads and H = X_pos + O is derived;
- ``plain.yaml``: the same without them (the heads read X + PE).

Each is ``python -m symattn derive P -o out.EXT --max-size 3000000`` in a fresh process, the two
alternating, --runs rounds after an untimed warm-up of each (the checkpoint then stays in the page
cache). Reported: the median wall and CPU time and the peak resident memory (ru_maxrss) of each,
and the ratio norm / plain (target ≤ 2×), PASS or MISS, the load before and after, as JSON too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_checkpoint import D_MODEL, HEAD_DIM, VOCAB, child_env, write_checkpoint  # noqa: E402

DEFAULT_JSON = HERE / "results" / "bench_norm.json"
TARGET = 2.0
EXTENSIONS = {"latex": "tex", "json": "json", "markdown": "md", "text": "txt", "html": "html"}


def problem(tokens: list[int], norm: bool) -> str:
    extra = ", norm: true, residual: true" if norm else ""
    return (f"title: GPT-2-sized layer 0, all heads, {len(tokens)} tokens{' with ln_1 and the residual' if norm else ''}\n"
            f"X: {{file: model.safetensors, embeddings: wte.weight, tokens: {json.dumps(tokens)}}}\n"
            "positions: {file: model.safetensors, tensor: wpe.weight}\n"
            f"from: {{file: model.safetensors, layout: gpt2, layer: 0, heads: all, n_head: {D_MODEL // HEAD_DIM}{extra}}}\n")


def run(workdir: Path, env: dict, name: str, out: str, max_size: str = "3000000") -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak resident kilobytes of one fresh ``symattn derive``."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "symattn", "derive", name, "-o", out, "--max-size", max_size],
                             cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"symattn derive {name} failed (exit {code}):\n{err.decode('utf-8', 'replace')}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss


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
        tmp = tempfile.TemporaryDirectory(prefix="symattn-bench-norm-")
        workdir = Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt = workdir / "model.safetensors"
    if not ckpt.exists():
        print(f"writing a GPT-2-small-sized checkpoint to {ckpt} …", flush=True)
        write_checkpoint(ckpt, args.seed)
    import numpy as np

    tokens = sorted(np.random.default_rng(args.seed).choice(VOCAB, size=args.tokens, replace=False).tolist())
    for name, norm in (("norm.yaml", True), ("plain.yaml", False)):
        (workdir / name).write_text(problem(tokens, norm), "utf-8")
    env = child_env(workdir / "pycache")
    out = "out." + EXTENSIONS[args.format]
    load_before = os.getloadavg()[0]
    for name in ("norm.yaml", "plain.yaml"):
        run(workdir, env, name, out)  # warm-up: bytecode written, the checkpoint's pages cached
    times: dict[str, list[tuple[float, float, int]]] = {"norm.yaml": [], "plain.yaml": []}
    for _ in range(args.runs):
        for name in times:
            times[name].append(run(workdir, env, name, out))
    load_after = os.getloadavg()[0]
    rows = {}
    for name, got in times.items():
        rows[name] = {"wall_s": statistics.median(t[0] for t in got), "cpu_s": statistics.median(t[1] for t in got),
                      "max_rss_mb": max(t[2] for t in got) / 1024}
    ratio = rows["norm.yaml"]["wall_s"] / rows["plain.yaml"]["wall_s"]
    cpu_ratio = rows["norm.yaml"]["cpu_s"] / rows["plain.yaml"]["cpu_s"]
    verdict = "PASS" if ratio <= TARGET else "MISS"
    print(f"GPT-2-sized layer 0, 12 heads, {args.tokens} tokens from ids, -o {out}, median of {args.runs} "
          f"(load {load_before:.2f} before, {load_after:.2f} after):")
    for name, row in rows.items():
        print(f"  {name:11s} wall {row['wall_s']:.2f} s  cpu {row['cpu_s']:.2f} s  peak RSS {row['max_rss_mb']:.0f} MB")
    print(f"  with ln_1 and the residual / without: {ratio:.2f}× wall, {cpu_ratio:.2f}× cpu (target ≤ {TARGET}×): "
          f"{verdict}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"tokens": args.tokens, "format": args.format, "runs": args.runs, "rows": rows,
                                     "ratio_wall": ratio, "ratio_cpu": cpu_ratio, "target": TARGET,
                                     "verdict": verdict, "load": [load_before, load_after]}, indent=2) + "\n")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
