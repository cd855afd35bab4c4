"""How long `symattn generate` and `symattn check` take for a class.

Run: python benchmarks/bench_generate.py [--runs 5] [--count 300] [--students 300] [--seed 0]
     [--json PATH] [--rows plain,sheets,check]

Rows, each the median of --runs fresh processes through the real command line:

* ``plain``: ``generate --count 30`` (no sheets), the figure this benchmark always printed.
* ``sheets``: ``generate --count N --sheets`` beside its floor: the very .tex files symattn
  renders for those sheets (written by the same command with pdflatex out of its PATH),
  compiled by bare ``pdflatex`` runs, as many at once as this process has cores. The two
  alternate run by run. Target: at most 1.0x the floor.
* ``check``: ``check problem.yaml answers/*.yaml`` of --students answer files, some right and
  some with the typical mistakes (a slipped entry, no scaling, no mask, transposed scores, an
  error carried forward, too few places), drawn with --seed. Target: under 5 s.

Prints the machine's load and writes everything as JSON (default
benchmarks/results/bench_generate.json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "bench_generate.json"
SHEETS_RATIO = 1.0  # generate --sheets / the bare pdflatex floor
CHECK_SECONDS = 5.0
FLAGS = ["-no-shell-escape", "-halt-on-error", "-interaction=nonstopmode"]


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def symattn(args: list[str], env: dict | None = None) -> float:
    """Seconds of one fresh ``symattn`` process (an error stops the benchmark)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "symattn", *args], check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def without_pdflatex(empty: Path) -> dict:
    """The environment with nothing on PATH (so no pdflatex): generate --sheets then writes the LaTeX itself."""
    empty.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PATH": str(empty)}


def floor(tex_files: list[Path], work: Path) -> float:
    """Seconds to compile ``tex_files`` with bare pdflatex, one run per core at once."""
    pdflatex = shutil.which("pdflatex")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def one(k_tex):
        k, tex = k_tex
        folder = work / str(k)
        folder.mkdir()
        shutil.copy(tex, folder / "solution.tex")
        subprocess.run([pdflatex, *FLAGS, "solution.tex"], cwd=folder, check=True, capture_output=True,
                       stdin=subprocess.DEVNULL)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=cores()) as pool:
        list(pool.map(one, enumerate(tex_files)))
    return time.perf_counter() - start


def stats(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "runs": times}


def row_plain(args, root: Path) -> dict:
    times = []
    for run in range(args.runs):
        folder = root / f"plain-{run}"
        times.append(symattn(["generate", "--count", "30", "--out-dir", str(folder), "--seed", str(run)]))
        shutil.rmtree(folder)
    out = stats(times)
    print(f"generate --count 30: median {out['median']:.2f} s (min {out['min']:.2f}, max {out['max']:.2f})")
    return out


def row_sheets(args, root: Path) -> dict:
    if shutil.which("pdflatex") is None:
        print("generate --sheets: skipped (no pdflatex)")
        return {"skipped": "no pdflatex"}
    command = ["generate", "--count", str(args.count), "--seed", str(args.seed), "--sheets"]
    tex = root / "tex"
    symattn([*command, "--out-dir", str(tex)], env=without_pdflatex(root / "empty"))
    tex_files = sorted(tex.glob("*.tex"))
    ours, bare = [], []
    for run in range(args.runs):
        folder = root / "sheets"
        ours.append(symattn([*command, "--out-dir", str(folder)]))
        shutil.rmtree(folder)
        bare.append(floor(tex_files, root / "floor"))
    ratio = statistics.median(ours) / statistics.median(bare)
    verdict = "PASS" if ratio <= SHEETS_RATIO else "MISS"
    print(f"generate --count {args.count} --sheets: median {statistics.median(ours):.2f} s; bare pdflatex floor "
          f"({len(tex_files)} files, {cores()} at once) {statistics.median(bare):.2f} s; "
          f"ratio {ratio:.2f}x (target <= {SHEETS_RATIO}x) {verdict}")
    return {"symattn": stats(ours), "floor": stats(bare), "files": len(tex_files), "cores": cores(),
            "ratio": ratio, "target": SHEETS_RATIO, "verdict": verdict}


def write_class(folder: Path, students: int, seed: int) -> tuple[Path, list[Path]]:
    """A problem and ``students`` answer files: right ones (all or some stages, 4 places) and the
    typical mistakes, each carried on through the later stages as a student would."""
    import numpy as np

    import symattn as sa

    folder.mkdir(parents=True)
    p = sa.generate(1, seed=seed)[0]
    (folder / "problem.yaml").write_text(p.to_yaml(), encoding="utf-8")
    d = sa.derive(p)
    ids = ["Q", "K", "V", "S", "S_scaled", "S_masked", "A", "O"]
    exact = {i: np.array([[float(v) for v in row] for row in d.evaluate(i, 30)]) for i in ids}
    masked = np.isneginf(exact["S_masked"])
    scale = float(exact["S"][~masked][0] / exact["S_scaled"][~masked][0]) if exact["S_scaled"][~masked][0] else 2.0

    def softmax(s):
        e = np.exp(s - s.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    rng = random.Random(seed)
    files = []
    for n in range(students):
        kind = rng.choice(["right", "right", "slip", "no scale", "no mask", "transposed", "carried", "rounded"])
        v = {k: a.copy() for k, a in exact.items()}
        if kind == "slip":
            v[rng.choice(["Q", "S", "O"])][rng.randrange(len(v["Q"])), rng.randrange(v["Q"].shape[1])] += 1
        elif kind == "no scale":
            v["S_scaled"] = v["S"].copy()
        elif kind == "no mask":
            v["A"] = softmax(v["S_scaled"])
            v["O"] = v["A"] @ v["V"]
        elif kind == "transposed":
            v["S"] = v["S"].T.copy()
        elif kind == "carried":  # a slip in K carried through every later stage
            v["K"][0, 0] += 1
            v["S"] = v["Q"] @ v["K"].T
            v["S_scaled"] = v["S"] / scale
            v["S_masked"] = np.where(masked, -np.inf, v["S_scaled"])
            v["A"] = softmax(v["S_masked"])
            v["O"] = v["A"] @ v["V"]
        places = 2 if kind == "rounded" else 4
        stages = rng.sample(ids, rng.randint(3, len(ids))) if kind == "right" else ids
        lines = [f"{k}: [" + ", ".join("[" + ", ".join("-inf" if np.isneginf(x) else f"{x:.{places}f}" for x in row)
                                       + "]" for row in v[k]) + "]" for k in stages]
        file = folder / f"student-{n:03d}.yaml"
        file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        files.append(file)
    return folder / "problem.yaml", files


def row_check(args, root: Path) -> dict:
    problem, files = write_class(root / "class", args.students, args.seed)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "symattn", "check", str(problem), *map(str, files)],
                       capture_output=True)  # exit 1: some answers are wrong
        times.append(time.perf_counter() - start)
    out = stats(times)
    verdict = "PASS" if out["median"] < CHECK_SECONDS else "MISS"
    print(f"check of {args.students} answer files: median {out['median']:.2f} s (min {out['min']:.2f}, "
          f"max {out['max']:.2f}); target < {CHECK_SECONDS} s {verdict}")
    return {**out, "files": args.students, "target_seconds": CHECK_SECONDS, "verdict": verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=300, help="variants of the sheets row")
    parser.add_argument("--students", type=int, default=300, help="answer files of the check row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", default="plain,sheets,check")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    rows = args.rows.split(",")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"on {cores()} cores; {args.runs} runs a row")
    out = {"runs": args.runs, "cores": cores(), "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as tmp:
        for name, row in (("plain", row_plain), ("sheets", row_sheets), ("check", row_check)):
            if name in rows:
                out[name] = row(args, Path(tmp))
    out["load_after"] = os.getloadavg()
    print(f"load average after {out['load_after'][0]:.2f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
