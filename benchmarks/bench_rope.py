"""RoPE at model size: `symattn derive` with `rope: {base: 10000}` beside the same problem without it.

Run: python benchmarks/bench_rope.py              (5 rounds, every format, both sizes)
Options: --runs N (rounds, default 5), --sizes 16x64x8,128x768x64, --formats latex,json,...,
--workdir DIR (keep the problems), --json PATH (default benchmarks/results/bench_rope.json).

For each (n, d_model, d_k) it writes the benchmark's random causal problem (3-decimal entries,
fixed seed; benchmarks/_problems.py) and the same problem with ``rope: {base: 10000}``, then,
for each output format, runs ``python -m symattn derive PROBLEM -f FORMAT -o OUT`` in fresh
processes, the RoPE run and its peer alternating within each round, and reports the medians and
their ratio. ``latex+backward`` and ``json+backward`` add ``--backward`` (L = sum of O), so the
gradients back through the rotation are timed beside the same gradients without it. Target: the RoPE run at most 1.5x its peer, in every format, at both sizes
(issue #29). The machine's load (os.getloadavg) is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _problems import write_problem  # noqa: E402

SIZES = ((16, 64, 8), (128, 768, 64))
FORMATS = ("latex", "markdown", "text", "json", "html", "latex+backward", "json+backward")
SUFFIX = {"latex": "tex", "markdown": "md", "text": "txt", "json": "json", "html": "html"}
TARGET = 1.5


def run(problem: Path, fmt: str, out: Path) -> float:
    base, _, extra = fmt.partition("+")
    flags = ["--backward"] if extra == "backward" else []
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "symattn", "derive", str(problem), "-f", base, "-o", str(out), *flags],
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"symattn derive {problem.name} -f {fmt} failed: {done.stderr.strip()}")
    return seconds


def bench(folder: Path, size, formats, runs: int, log) -> list[dict]:
    n, d_model, d_k = size
    plain, _ = write_problem(folder, n, d_model, d_k)
    rope = folder / "rope.yaml"
    rope.write_text(plain.read_text(encoding="utf-8") + "rope: {base: 10000}\n", encoding="utf-8")
    rows = []
    for fmt in formats:
        times = {"rope": [], "plain": []}
        for _ in range(runs):
            for name, path in (("rope", rope), ("plain", plain)):
                times[name].append(run(path, fmt, folder / f"{name}.{SUFFIX[fmt.partition('+')[0]]}"))
        r, p = statistics.median(times["rope"]), statistics.median(times["plain"])
        row = {"size": list(size), "format": fmt, "rope_s": r, "plain_s": p, "ratio": r / p,
               "pass": r / p <= TARGET, "runs": runs, "rope_all": times["rope"], "plain_all": times["plain"]}
        log(f"  ({n}, {d_model}, {d_k}) {fmt:14s} rope {r:6.2f} s   without {p:6.2f} s   "
            f"{r / p:4.2f}x  {'PASS' if row['pass'] else 'MISS'}")
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default=",".join("x".join(map(str, s)) for s in SIZES))
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path, default=HERE / "results" / "bench_rope.json")
    args = parser.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    formats = args.formats.split(",")
    print(f"load before: {os.getloadavg()}  cores: {os.cpu_count()}  python {platform.python_version()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        for size in sizes:
            rows += bench(root / "x".join(map(str, size)), size, formats, args.runs, print)
    print(f"load after: {os.getloadavg()}")
    print(f"targets: RoPE <= {TARGET}x the same problem without it, every format: "
          f"{'PASS' if all(r['pass'] for r in rows) else 'MISS'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "load": os.getloadavg()}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
