"""How fast `symattn derive` is end to end, beside a naive SymPy pipeline, NumPy and a bare flint script.

Run: python benchmarks/bench_derive.py            (the full run, a few minutes)
     python benchmarks/bench_derive.py --quick    (n <= 64 only, no 512-token row)
Options: --runs N, --naive-cap S, --symattn-cap S, --sizes 4x4x4,32x128x16,
--no-naive, --seed N, --workdir DIR (keep the problem files), --json PATH.

For each (n, d_model, d_k) in (4, 4, 4), (16, 64, 16), (32, 128, 16),
(64, 256, 64), (128, 768, 64) and (256, 768, 64) it writes a random causal
problem (3-decimal entries, fixed seed) as YAML, and the same matrices as .npy
files, into a temporary folder, then times in this one process:

* symattn: ``symattn derive PROBLEM -o out.tex`` through ``symattn.cli.main``
  (load, exact stages, NumPy cross-check, elided LaTeX), the median of
  --runs runs (one run from n = 256), SymPy's cache cleared before each; and
  once in a fresh process (interpreter start included), which also gives the
  peak memory (ru_maxrss of that process);
* naive: the newcomer's plain ``sympy.Matrix`` pipeline (yaml.safe_load,
  sympy.Rational, exp/sum softmax, evalf(30), sympy.latex of every stage) in a
  child process under a time cap; sizes above one that hit the cap are skipped,
  except (32, 128, 16), the size its target is judged at;
* NumPy: float64 from the YAML (libyaml) through every stage, end to end and
  compute only;
* bare: a bare script, libyaml keeping numbers as text, fractions.Fraction,
  flint fmpq_mat products, a 30-digit arb softmax and output.

It prints one table (medians in seconds; symattn/naive as 1/N, i.e. symattn
is N times faster, "<=1/N" when the naive pipeline hit its cap; symattn/NumPy;
peak MiB), a second table (fresh-process walls, NumPy compute only,
``symattn.load_problem`` of the YAML and of the .npy variant), the exponent of
n that symattn's time grows with (least squares of log time against log n over
the sizes with n >= 16), a 512-token row (one fresh-process run), the start-up
times of ``symattn --help`` and the 4-token demo ``symattn derive`` (median of 5
fresh processes), and the targets with PASS or MISS. Everything is also written
as JSON (default benchmarks/results/bench_derive.json).

Then issue #20's rows (skip them with --no-round-two; --round-two-only runs only
them and start-up), every run a fresh process, symattn and its peer alternating
within a round (--runs rounds; one with --quick):

* layouts at (128, 768, 64) and (512, 768, 64): the same problem written as flow
  rows ``- [..]``, ``yaml.safe_dump``'s default block style, one-line
  ``X: [[..]]``, flow rows with CRLF line ends, and ``{file: ..}`` .npy and .csv
  files (its entries multiples of 1/1024, written out exactly, which a .npy
  file's float64 holds exactly: every layout holds the same exact problem);
  symattn ``derive -o x.tex`` and the floor (the bare script, which reads
  every layout, files included) on each; targets: all within 1.15x of each other,
  each YAML layout <= 1.0x its floor;
* ``-f json`` at 128 tokens beside the LaTeX run (<= 1.5x), and at 256 tokens
  (< 10 s, < 400 MiB peak);
* ``--backward`` at 128 tokens beside the forward run (<= 1.3x);
* the web page, ``-f html``, beside the LaTeX run at (64, 256, 64) and (128, 768, 64) (<= 1.2x
  each; the median of --runs rounds, at least 5);
* long context: (512, 1024, 2048 tokens, 768, 64) causal to LaTeX, once each
  (with --max-size 10000000: 2048 x 768 is past the default size budget);
  target (2048, 768, 64) < 30 s and < 1 GiB, with the growth exponent and how the
  causal mask splits the work;
* the 4-token demo < 0.45 s (the median of the start-up runs above, with bytecode kept as an
  installed symattn has it; the run in the environment as it is is printed beside it).

--quick runs these at smaller sizes (layouts at 32 tokens, JSON and backward at
64, JSON-big at 128, long context 128/256/512, the web page at 32 and 64, one round each):
indicative only, marked so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _problems  # from the folder of this script, put on the path above

SIZES = [(4, 4, 4), (16, 64, 16), (32, 128, 16), (64, 256, 64), (128, 768, 64), (256, 768, 64)]
EXTRA = (512, 768, 64)  # one fresh-process run; skipped by --quick
GPT2 = (128, 768, 64)  # a GPT-2-small head
NAIVE_TARGET = (32, 128, 16)
QUICK_MAX_N = 64
SINGLE_RUN_FROM_N = 256  # from this n every peer runs once
FIT_FROM_N = 16
STARTUP_RUNS = 5
DEFAULT_JSON = HERE / "results" / "bench_derive.json"

TARGETS = {
    "naive_speedup": 500.0,  # symattn at least this many times faster than naive at NAIVE_TARGET
    "peak_mib": 500.0,  # at GPT2
    "extra_seconds": 60.0,  # EXTRA completes within
    "npy_load_seconds": 1.0,  # load_problem of the .npy GPT-2 head
    "help_seconds": 0.3,
    "demo_seconds": 1.5,
}

# A fresh process running the console script's code: its last stdout line
# reports the exit code, the seconds from before the symattn import to the end,
# and the peak resident memory of the process.
_FRESH = """\
import resource, sys, time
start = time.perf_counter()
from symattn.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:  # Linux: ru_maxrss keeps the forking parent's resident size across exec; VmHWM is this process's own
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except (OSError, StopIteration, ValueError):
    pass
print("BENCH-RESULT", code, seconds, peak, flush=True)
"""


# -- small helpers -------------------------------------------------------------------


def size_name(size: tuple[int, int, int]) -> str:
    return "({}, {}, {})".format(*size)


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    sizes = []
    for part in text.split(","):
        fields = part.strip().lower().split("x")
        if len(fields) != 3 or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise argparse.ArgumentTypeError(f"{part!r}: write a size as NxD_MODELxD_K, e.g. 32x128x16")
        sizes.append(tuple(int(f) for f in fields))
    return sizes


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def maxrss_mib(value: float) -> float:
    """ru_maxrss in MiB: kilobytes on Linux, bytes on macOS."""
    return value / (1024 * 1024) if sys.platform == "darwin" else value / 1024


def fit_exponent(points: list[tuple[int, float]]) -> float | None:
    """The slope of log t against log n by least squares (None with fewer than two n)."""
    points = [(n, t) for n, t in points if t and t > 0]
    if len({n for n, _ in points}) < 2:
        return None
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def symattn_command() -> tuple[list[str], str]:
    """The installed console script (next to this Python first), else python -m symattn."""
    beside = Path(sys.executable).parent / "symattn"
    if beside.exists():
        return [str(beside)], str(beside)
    found = shutil.which("symattn")
    if found:
        return [found], found
    return [sys.executable, "-m", "symattn"], "python -m symattn (no symattn console script found)"


def clear_caches() -> None:
    try:
        from sympy.core.cache import clear_cache

        clear_cache()
    except ImportError:
        pass
    gc.collect()


# -- symattn -----------------------------------------------------------------------


def call_cli(argv: list[str]) -> tuple[int, str]:
    """Run ``symattn.cli.main(argv)`` here; returns its exit code and what it wrote to stderr."""
    from symattn.cli import main as cli_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return int(code or 0), err.getvalue()


def symattn_in_process(path: Path, tex: Path, runs: int) -> dict:
    times = []
    for _ in range(runs):
        clear_caches()
        start = time.perf_counter()
        code, err = call_cli(["derive", str(path), "-o", str(tex)])
        seconds = time.perf_counter() - start
        if code != 0:
            return {"times": times, "median": median(times), "error": f"exit code {code}: {err.strip()[-500:]}"}
        times.append(seconds)
    return {"times": times, "median": median(times), "error": None}


def symattn_fresh(path: Path, tex: Path, cap: float) -> dict:
    """``symattn derive PATH -o TEX`` in a fresh process: wall seconds, seconds inside, peak MiB."""
    cmd = [sys.executable, "-c", _FRESH, "derive", str(path), "-o", str(tex)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"wall": None, "inside": None, "peak_mib": None, "timed_out": True, "cap": cap,
                "error": f"did not finish within the cap of {cap:g} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH-RESULT")]
    if not lines:
        return {"wall": wall, "inside": None, "peak_mib": None, "timed_out": False,
                "error": f"exit code {proc.returncode}: {proc.stderr.strip()[-500:]}"}
    _, code, inside, peak = lines[-1].split()
    out = {"wall": wall, "inside": float(inside), "peak_mib": maxrss_mib(float(peak)), "timed_out": False,
           "error": None}
    if int(code) != 0:
        out["error"] = f"exit code {code}: {proc.stderr.strip()[-500:]}"
    return out


def time_load(path: Path, runs: int) -> dict:
    import symattn

    times = []
    try:
        for _ in range(runs):
            clear_caches()
            start = time.perf_counter()
            symattn.load_problem(path)
            times.append(time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001  (recorded, the benchmark goes on)
        return {"times": times, "median": median(times), "error": f"{type(exc).__name__}: {exc}"}
    return {"times": times, "median": median(times), "error": None}


# -- the peers ----------------------------------------------------------------------


def naive_child(path: Path, cap: float) -> dict:
    """The naive pipeline in a fresh process; the cap counts from when its clock starts (after imports)."""
    script = str(HERE / "_problems.py")
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, script, "naive", str(path)], stdout=subprocess.PIPE,
                                stderr=err, text=True)
        first = proc.stdout.readline()
        timed_out = False
        if first.strip() == "START":
            try:
                proc.wait(timeout=cap)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                timed_out = True
        rest = proc.stdout.read()
        proc.stdout.close()
        proc.wait()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if timed_out:
        return {"seconds": None, "timed_out": True, "cap": cap, "error": None}
    lines = [ln for ln in (first + rest).splitlines() if ln.startswith("{")]
    if not lines:
        return {"seconds": None, "timed_out": False, "error": f"exit code {proc.returncode}: {stderr.strip()[-500:]}"}
    result = json.loads(lines[-1])
    if not result["ok"]:
        return {"seconds": None, "timed_out": False, "error": result["error"]}
    return {"seconds": result["result"], "timed_out": False, "error": None}


def numpy_runs(path: Path, runs: int) -> dict:
    total, compute = [], []
    try:
        for _ in range(runs):
            gc.collect()
            t, c = _problems.numpy_peer(path)
            total.append(t)
            compute.append(c)
    except Exception as exc:  # noqa: BLE001
        return {"times": total, "median": median(total), "compute_median": median(compute),
                "error": f"{type(exc).__name__}: {exc}"}
    return {"times": total, "median": median(total), "compute_times": compute, "compute_median": median(compute),
            "error": None}


def bare_runs(path: Path, runs: int) -> dict:
    times = []
    try:
        for _ in range(runs):
            gc.collect()
            times.append(_problems.bare(path))
    except Exception as exc:  # noqa: BLE001
        return {"times": times, "median": median(times), "error": f"{type(exc).__name__}: {exc}"}
    return {"times": times, "median": median(times), "error": None}


def bare_fresh(path: Path, cap: float) -> dict:
    """The bare script run as a script, in a fresh process (interpreter start and imports included)."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(HERE / "_problems.py"), "bare", str(path)],
                              check=False, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"wall": None, "error": f"did not finish within {cap:g} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines or not json.loads(lines[-1])["ok"]:
        return {"wall": None, "error": (lines[-1] if lines else proc.stderr.strip()[-500:])}
    return {"wall": wall, "error": None}


# -- start-up -----------------------------------------------------------------------


def startup(command: list[str], args: list[str], runs: int = STARTUP_RUNS, bytecode: bool = True) -> dict:
    """Median wall time of ``runs`` fresh processes. With ``bytecode`` Python may keep the
    compiled modules (PYTHONDONTWRITEBYTECODE removed, one uncounted run first), as an installed
    symattn has them (pip compiles them at install); else the environment is left as it is,
    and with PYTHONDONTWRITEBYTECODE set a checkout's own modules are compiled on every run."""
    env = None
    if bytecode:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        subprocess.run(command + args, check=False, capture_output=True, timeout=120, env=env)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(command + args, check=False, capture_output=True, timeout=120, env=env)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0 or not proc.stdout:
            return {"times": times, "median": None,
                    "error": f"exit code {proc.returncode}: {proc.stderr.decode('utf-8', 'replace').strip()[-300:]}"}
    return {"times": times, "median": median(times), "error": None}


# -- one size -----------------------------------------------------------------------


def bench_size(size, folder: Path, args, state: dict, log) -> dict:
    n, d_model, d_k = size
    runs = 1 if n >= SINGLE_RUN_FROM_N else args.runs
    yaml_path, npy_path = _problems.write_problem(folder, n, d_model, d_k, args.seed)
    tex = folder / "out.tex"
    row = {"n": n, "d_model": d_model, "d_k": d_k, "runs": runs, "yaml_bytes": yaml_path.stat().st_size}

    # symattn: first once in a fresh process (time cap, peak memory), then here.
    if state["symattn_capped"] is not None:
        row["symattn"] = {"median": None, "times": [], "error": f"skipped: {state['symattn_capped']} hit the cap"}
        row["symattn_fresh"] = {"wall": None, "peak_mib": None, "error": "skipped"}
    else:
        log(f"  symattn, fresh process (cap {args.symattn_cap:g} s) ...")
        row["symattn_fresh"] = fresh = symattn_fresh(yaml_path, tex, args.symattn_cap)
        if fresh.get("timed_out"):
            state["symattn_capped"] = size_name(size)
            row["symattn"] = {"median": None, "times": [], "error": fresh["error"]}
        else:
            log(f"  symattn, {runs} run(s) in this process ...")
            row["symattn"] = symattn_in_process(yaml_path, tex, runs)

    log("  NumPy ...")
    row["numpy"] = numpy_runs(yaml_path, args.runs if n < SINGLE_RUN_FROM_N else 1)
    if state["bare_missing"] is None:
        log("  bare script ...")
        row["bare"] = bare_runs(yaml_path, runs)
        row["bare_fresh"] = bare_fresh(yaml_path, max(args.symattn_cap, 60))
    else:
        row["bare"] = {"median": None, "times": [], "error": f"skipped: {state['bare_missing']}"}

    if args.no_naive:
        row["naive"] = {"seconds": None, "timed_out": False, "error": "skipped (--no-naive)"}
    elif state["naive_capped"] is not None and size != NAIVE_TARGET:
        row["naive"] = {"seconds": None, "timed_out": False,
                        "error": f"skipped: the naive pipeline hit the cap at {state['naive_capped']}"}
    else:
        log(f"  naive sympy.Matrix pipeline (cap {args.naive_cap:g} s) ...")
        times, result = [], None
        for _ in range(args.naive_runs):
            result = naive_child(yaml_path, args.naive_cap)
            if result["seconds"] is None:
                break
            times.append(result["seconds"])
        row["naive"] = {"times": times, "seconds": median(times), "timed_out": result["timed_out"],
                        "cap": args.naive_cap, "error": result["error"]}
        if result["timed_out"] and state["naive_capped"] is None:
            state["naive_capped"] = size_name(size)

    log("  symattn.load_problem, YAML and .npy ...")
    row["load_yaml"] = time_load(yaml_path, runs)
    row["load_npy"] = time_load(npy_path, runs)
    row["ratios"] = ratios(row)
    return row


def ratios(row: dict) -> dict:
    sym = row["symattn"].get("median")
    out = {"naive_over_symattn": None, "naive_lower_bound": False, "symattn_over_numpy": None,
           "symattn_over_bare": None}
    if sym:
        naive = row["naive"]
        if naive.get("seconds"):
            out["naive_over_symattn"] = naive["seconds"] / sym
        elif naive.get("timed_out"):
            out["naive_over_symattn"] = naive["cap"] / sym
            out["naive_lower_bound"] = True
        if row["numpy"].get("median"):
            out["symattn_over_numpy"] = sym / row["numpy"]["median"]
        if row.get("bare", {}).get("median"):
            out["symattn_over_bare"] = sym / row["bare"]["median"]
    return out


# -- printing -----------------------------------------------------------------------


def fmt_s(value: float | None, missing: str = "-") -> str:
    if value is None:
        return missing
    if value >= 100:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"


def fmt_n(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def naive_cell(naive: dict) -> str:
    if naive.get("seconds") is not None:
        return fmt_s(naive["seconds"])
    if naive.get("timed_out"):
        return f"> {naive['cap']:g}"
    return "skip" if str(naive.get("error", "")).startswith("skip") else "error"


def print_tables(rows: list[dict], out) -> None:
    head = (f"{'(n, d_model, d_k)':<18} {'symattn s':>10} {'naive s':>9} {'NumPy s':>9} {'bare s':>8} "
            f"{'sym/naive':>10} {'sym/NumPy':>10} {'sym/bare':>9} {'peak MiB':>9}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        q = r["ratios"]
        sym = r["symattn"]
        sym_cell = fmt_s(sym.get("median")) if sym.get("median") is not None else (
            "> cap" if r["symattn_fresh"].get("timed_out") else "error" if not str(sym.get("error")).startswith("skip") else "skip")
        if q["naive_over_symattn"] is None:
            vs_naive = "-"
        else:
            vs_naive = ("<=" if q["naive_lower_bound"] else "") + "1/" + fmt_n(q["naive_over_symattn"])
        vs_numpy = "-" if q["symattn_over_numpy"] is None else f"{q['symattn_over_numpy']:,.1f}x"
        vs_bare = "-" if q["symattn_over_bare"] is None else f"{q['symattn_over_bare']:,.2f}x"
        peak = r["symattn_fresh"].get("peak_mib")
        print(f"{size_name((r['n'], r['d_model'], r['d_k'])):<18} {sym_cell:>10} {naive_cell(r['naive']):>9} "
              f"{fmt_s(r['numpy'].get('median')):>9} {fmt_s(r['bare'].get('median')):>8} {vs_naive:>10} "
              f"{vs_numpy:>10} {vs_bare:>9} {('-' if peak is None else f'{peak:.0f}'):>9}", file=out)
    print("medians in seconds, end to end (file to last result); symattn includes the cross-check and the "
          "LaTeX; sym/naive 1/N: symattn N times faster", file=out)
    print(file=out)
    head2 = (f"{'(n, d_model, d_k)':<18} {'YAML MB':>8} {'runs':>4} {'sym fresh s':>11} {'bare fresh s':>12} "
             f"{'NumPy compute s':>15} {'load YAML s':>11} {'load .npy s':>11}")
    print(head2, file=out)
    print("-" * len(head2), file=out)
    for r in rows:
        print(f"{size_name((r['n'], r['d_model'], r['d_k'])):<18} {r['yaml_bytes'] / 1e6:>8.2f} {r['runs']:>4} "
              f"{fmt_s(r['symattn_fresh'].get('wall')):>11} {fmt_s(r.get('bare_fresh', {}).get('wall')):>12} "
              f"{fmt_s(r['numpy'].get('compute_median')):>15} {fmt_s(r['load_yaml'].get('median')):>11} "
              f"{fmt_s(r['load_npy'].get('median')):>11}", file=out)
    print("fresh: one run in a new process, interpreter start and imports included; "
          "load: symattn.load_problem(path) only", file=out)
    errors = [(r, peer) for r in rows for peer in ("symattn", "symattn_fresh", "naive", "numpy", "bare", "bare_fresh",
                                                   "load_yaml", "load_npy")
              if r.get(peer, {}).get("error") and not str(r[peer]["error"]).startswith("skip")
              and not (peer == "symattn" and r["symattn_fresh"].get("timed_out"))]
    for r, peer in errors:
        print(f"note: {size_name((r['n'], r['d_model'], r['d_k']))} {peer}: {r[peer]['error']}", file=out)


# -- targets ------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "SKIP" if ok is None else "PASS" if ok else "MISS"


def judge(rows: list[dict], extra: dict | None, gpt2_load: dict | None, start: dict) -> list[dict]:
    by_size = {(r["n"], r["d_model"], r["d_k"]): r for r in rows}
    out = []

    def add(name, ok, measured, note=""):
        out.append({"target": name, "verdict": verdict(ok), "measured": measured, "note": note})

    # 1. 500x the naive pipeline at (32, 128, 16).
    r = by_size.get(NAIVE_TARGET)
    name = f"{size_name(NAIVE_TARGET)}: symattn >= {TARGETS['naive_speedup']:g}x faster than naive, LaTeX included"
    if r is None or r["ratios"]["naive_over_symattn"] is None:
        why = "not measured"
        if r is not None and r["symattn"].get("median") is None:
            why += f" (symattn: {r['symattn'].get('error')})"
        elif r is not None:
            why += f" (naive: {r['naive'].get('error')})"
        add(name, None if r is None or r["symattn"].get("median") is not None else False, why)
    else:
        speedup = r["ratios"]["naive_over_symattn"]
        bound = r["ratios"]["naive_lower_bound"]
        measured = (f"{'>= ' if bound else ''}{fmt_n(speedup)}x (symattn {fmt_s(r['symattn']['median'])} s, naive "
                    f"{naive_cell(r['naive'])} s)")
        if bound and speedup < TARGETS["naive_speedup"]:
            add(name, False, measured, "naive hit its cap: only a lower bound; raise --naive-cap to settle it")
        else:
            add(name, speedup >= TARGETS["naive_speedup"], measured, "lower bound (naive hit its cap)" if bound else "")

    # 2. No slower than the bare script at the GPT-2 head, and peak memory.
    r = by_size.get(GPT2)
    name = f"{size_name(GPT2)}: symattn no slower than the bare libyaml+Fraction+flint script"
    if r is None:
        add(name, None, "not measured")
    elif r["symattn"].get("median") is None:
        add(name, False, f"symattn: {r['symattn'].get('error')}")
    elif r["bare"].get("median") is None:
        add(name, None, f"bare script: {r['bare'].get('error')}")
    else:
        sym, bare = r["symattn"]["median"], r["bare"]["median"]
        add(name + " (medians, this process)", sym <= bare, f"symattn {fmt_s(sym)} s vs bare {fmt_s(bare)} s "
            f"({sym / bare:.2f}x)", f"YAML file {r['yaml_bytes'] / 1e6:.2f} MB")
        sf, bf = r["symattn_fresh"].get("wall"), r.get("bare_fresh", {}).get("wall")
        if sf is not None and bf is not None:
            add(name + " (fresh processes)", sf <= bf, f"symattn {fmt_s(sf)} s vs bare {fmt_s(bf)} s ({sf / bf:.2f}x)",
                "interpreter start and imports included; informational beside the line above")
    name = f"{size_name(GPT2)}: peak memory of symattn < {TARGETS['peak_mib']:g} MiB"
    peak = None if r is None else r["symattn_fresh"].get("peak_mib")
    add(name, None if peak is None else peak < TARGETS["peak_mib"], "not measured" if peak is None else f"{peak:.0f} MiB")

    # 3. The 512-token row.
    name = f"{size_name(EXTRA)}: completes in < {TARGETS['extra_seconds']:g} s (fresh process)"
    if extra is None or (extra["fresh"].get("wall") is None and not extra["fresh"].get("timed_out")):
        add(name, None, "not run" if extra is None else extra["fresh"].get("error", "not run"))
    elif extra["fresh"].get("timed_out"):
        add(name, False, f"> {extra['fresh']['cap']:g} s (cap)")
    else:
        ok = extra["fresh"]["error"] is None and extra["fresh"]["wall"] < TARGETS["extra_seconds"]
        add(name, ok, f"{fmt_s(extra['fresh']['wall'])} s wall, peak {extra['fresh']['peak_mib']:.0f} MiB",
            extra["fresh"]["error"] or "")

    # 4. Loading the GPT-2 head from .npy.
    name = f"{size_name(GPT2)} from .npy files: symattn.load_problem < {TARGETS['npy_load_seconds']:g} s"
    if gpt2_load is None or gpt2_load["npy"].get("median") is None:
        add(name, None, "not measured" if gpt2_load is None else gpt2_load["npy"].get("error"))
    else:
        t = gpt2_load["npy"]["median"]
        add(name, t < TARGETS["npy_load_seconds"], f"{fmt_s(t)} s",
            f"the YAML variant: {fmt_s(gpt2_load['yaml'].get('median'))} s")

    # 5. Start-up.
    for key, label, limit in (("help", "symattn --help", TARGETS["help_seconds"]),
                              ("demo", "symattn derive (4-token demo)", TARGETS["demo_seconds"])):
        t = start[key].get("median")
        add(f"{label} < {limit:g} s wall (median of {STARTUP_RUNS} fresh processes)",
            None if t is None else t < limit, start[key].get("error") or f"{t:.3f} s")
    return out


def print_targets(targets: list[dict], out) -> None:
    print("Targets", file=out)
    for t in targets:
        note = f"  [{t['note']}]" if t["note"] else ""
        print(f"  {t['verdict']:<4}  {t['target']}: {t['measured']}{note}", file=out)


# -- issue #20's rows: layouts, JSON, backward, long context, start-up -------------------

R2 = {
    "layout_sizes": [(128, 768, 64), (512, 768, 64)],
    "layout_spread": 1.15,  # every layout within this factor of the others
    "layout_floor": 1.0,  # symattn / floor, each YAML layout, same round
    "json_size": (128, 768, 64), "json_ratio": 1.5,  # -f json / LaTeX
    "json_big_size": (256, 768, 64), "json_big_seconds": 10.0, "json_big_mib": 400.0,
    "backward_size": (128, 768, 64), "backward_ratio": 1.3,  # --backward / forward
    "html_sizes": [(64, 256, 64), (128, 768, 64)], "html_ratio": 1.2, "html_min_rounds": 5,  # -f html / LaTeX
    "long_sizes": [(512, 768, 64), (1024, 768, 64), (2048, 768, 64)], "long_seconds": 30.0, "long_mib": 1024.0,
    "demo_seconds": 0.45,
}
R2_QUICK = dict(R2, layout_sizes=[(32, 128, 16)], json_size=(64, 256, 64), json_big_size=(128, 768, 64),
                backward_size=(64, 256, 64), long_sizes=[(128, 768, 64), (256, 768, 64), (512, 768, 64)],
                html_sizes=[(32, 128, 16), (64, 256, 64)])


def fresh_run(argv: list[str], cap: float) -> dict:
    """``symattn ARGV`` in a fresh process: wall seconds and peak MiB (see _FRESH)."""
    cmd = [sys.executable, "-c", _FRESH] + argv
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=cap)
    except subprocess.TimeoutExpired:
        return {"wall": None, "peak_mib": None, "error": f"did not finish within {cap:g} s"}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH-RESULT")]
    if not lines or lines[-1].split()[1] != "0":
        code = lines[-1].split()[1] if lines else proc.returncode
        return {"wall": None, "peak_mib": None, "error": f"exit code {code}: {proc.stderr.strip()[-300:]}"}
    return {"wall": wall, "peak_mib": maxrss_mib(float(lines[-1].split()[3])), "error": None}


def medians_of(runs: list[dict]) -> dict:
    walls = [r["wall"] for r in runs if r.get("wall") is not None]
    peaks = [r["peak_mib"] for r in runs if r.get("peak_mib") is not None]
    errors = [r["error"] for r in runs if r.get("error")]
    return {"walls": walls, "median": median(walls), "peak_mib": max(peaks) if peaks else None,
            "error": errors[0] if errors else None}


def round_two(root: Path, args, log) -> dict:
    """Issue #20's rows, every symattn and floor run in a fresh process, alternating within a round."""
    cfg = R2_QUICK if args.quick else R2
    runs, cap = (1 if args.quick else args.runs), args.symattn_cap
    out = {"quick": bool(args.quick), "config": {k: v for k, v in cfg.items()}}

    parts = set(args.round_two_rows.split(","))
    layouts = []
    for size in (cfg["layout_sizes"] if "layouts" in parts else []):
        log(f"layouts {size_name(size)}: {', '.join(_problems.LAYOUTS)}, symattn and the floor, {runs} round(s) ...")
        paths = _problems.write_layouts(root / "layouts_n{}_d{}_k{}".format(*size), *size, seed=args.seed)
        sym = {k: [] for k in paths}
        floor = {k: [] for k in paths}
        for _ in range(runs):
            for layout, path in paths.items():
                sym[layout].append(fresh_run(["derive", str(path), "-o", str(path.with_suffix(".tex"))], cap))
                floor[layout].append(bare_fresh(path, cap))
        row = {"size": list(size), "layouts": {}}
        for layout in paths:
            s, f = medians_of(sym[layout]), medians_of(floor[layout])
            row["layouts"][layout] = {"symattn": s, "floor": f, "bytes": paths[layout].stat().st_size,
                                      "ratio": (s["median"] / f["median"]) if s["median"] and f["median"] else None}
        layouts.append(row)
    out["layouts"] = layouts

    def pair(size, label, extra_args, suffix, rounds=runs):
        folder = root / "n{}_d{}_k{}".format(*size)
        yaml_path, _ = _problems.write_problem(folder, *size, seed=args.seed)
        a, b = [], []
        for _ in range(rounds):  # the LaTeX run and its peer alternate
            a.append(fresh_run(["derive", str(yaml_path), "-o", str(folder / "fwd.tex")], cap))
            b.append(fresh_run(["derive", str(yaml_path), *extra_args, "-o", str(folder / f"out{suffix}")], cap))
        fa, fb = medians_of(a), medians_of(b)
        size_bytes = (folder / f"out{suffix}").stat().st_size if (folder / f"out{suffix}").exists() else None
        return {"size": list(size), "latex": fa, label: fb, "output_bytes": size_bytes, "rounds": rounds,
                "ratio": (fb["median"] / fa["median"]) if fa["median"] and fb["median"] else None}

    out["json"] = out["json_big"] = out["backward"] = None
    if "json" in parts:
        log(f"JSON {size_name(cfg['json_size'])} beside LaTeX ...")
        out["json"] = pair(cfg["json_size"], "json", [], ".json")
        log(f"JSON {size_name(cfg['json_big_size'])} ...")
        folder = root / "json_big"
        yaml_path, _ = _problems.write_problem(folder, *cfg["json_big_size"], seed=args.seed)
        big = medians_of([fresh_run(["derive", str(yaml_path), "-o", str(folder / "out.json")], cap)
                          for _ in range(runs)])
        out["json_big"] = {"size": list(cfg["json_big_size"]), **big, "output_bytes":
                           (folder / "out.json").stat().st_size if (folder / "out.json").exists() else None}
    if "backward" in parts:
        log(f"--backward {size_name(cfg['backward_size'])} beside forward ...")
        out["backward"] = pair(cfg["backward_size"], "backward", ["--backward"], "_b.tex")
    out["html"] = []
    if "html" in parts:
        rounds = 1 if args.quick else max(args.runs, cfg["html_min_rounds"])
        for size in cfg["html_sizes"]:
            log(f"web page {size_name(size)} beside LaTeX, {rounds} round(s) ...")
            out["html"].append(pair(size, "html", ["-f", "html"], ".html", rounds))

    long_rows = []
    for size in (cfg["long_sizes"] if "long" in parts else []):
        log(f"long context {size_name(size)}, causal, LaTeX, once ...")
        folder = root / "long_n{}".format(size[0])
        yaml_path, _ = _problems.write_problem(folder, *size, seed=args.seed)
        long_rows.append({"size": list(size), **fresh_run(["derive", str(yaml_path), "--max-size", "10000000", "-o",
                                                           str(folder / "out.tex")], cap)})
    out["long"] = long_rows
    out["long_exponent"] = fit_exponent([(r["size"][0], r["wall"]) for r in long_rows if r.get("wall")])
    return out


def long_split_sentence(size: tuple[int, int, int]) -> str:
    n, d_model, d_k = size
    proj = 3 * n * d_model * d_k
    scores = n * n * d_k
    kept = n * (n + 1) // 2
    return (f"at {size_name(size)} the projections Q, K, V are {proj / 1e6:.0f} M exact multiply-adds (linear in n), "
            f"QK^T {scores / 1e6:.0f} M (quadratic); the causal mask keeps {kept:,} of the {n * n:,} scores "
            f"({kept / (n * n):.1%}), so the exp/softmax and A·V work, the other quadratic part, is halved")


def judge_round_two(r2: dict, start: dict) -> list[dict]:
    cfg = r2["config"]
    quick = "quick: a smaller size than the target's, indicative only" if r2["quick"] else ""
    out = []

    def add(name, ok, measured, floor="", note="", sized=True):
        note = "; ".join(x for x in (note, quick if sized else "") if x)
        out.append({"target": name, "verdict": verdict(ok), "measured": measured, "floor": floor, "note": note})

    for row in r2["layouts"]:
        size = tuple(row["size"])
        meds = {k: v["symattn"]["median"] for k, v in row["layouts"].items() if v["symattn"]["median"]}
        if len(meds) == len(row["layouts"]):
            spread = max(meds.values()) / min(meds.values())
            add(f"{size_name(size)}: every layout within {cfg['layout_spread']:g}x of the others",
                spread <= cfg["layout_spread"], f"spread {spread:.2f}x (" + ", ".join(
                    f"{k} {fmt_s(v)} s" for k, v in meds.items()) + ")")
        else:
            add(f"{size_name(size)}: every layout within {cfg['layout_spread']:g}x", False,
                "; ".join(f"{k}: {v['symattn']['error']}" for k, v in row["layouts"].items() if v["symattn"]["error"]))
        for layout, v in row["layouts"].items():
            fl = v["floor"]["median"]
            limit = cfg["layout_floor"] if layout not in ("npy", "csv") else None
            label = f"{size_name(size)} {layout}: symattn" + (f" <= {limit:g}x the floor" if limit else " vs its floor (informational)")
            if v["ratio"] is None:
                add(label, False if limit else None, v["symattn"]["error"] or v["floor"]["error"] or "not measured")
            else:
                add(label, (v["ratio"] <= limit) if limit else None,
                    f"{fmt_s(v['symattn']['median'])} s, {v['symattn']['peak_mib']:.0f} MiB, {v['ratio']:.2f}x",
                    f"floor {fmt_s(fl)} s")
    j = r2["json"] or {"size": cfg["json_size"], "ratio": None, "latex": {"median": None}}
    add(f"{size_name(tuple(j['size']))}: -f json <= {cfg['json_ratio']:g}x the LaTeX run",
        None if j["ratio"] is None else j["ratio"] <= cfg["json_ratio"],
        "not measured" if j["ratio"] is None else f"{fmt_s(j['json']['median'])} s, {j['json']['peak_mib']:.0f} MiB, "
        f"{j['ratio']:.2f}x", "" if j["latex"]["median"] is None else f"LaTeX {fmt_s(j['latex']['median'])} s")
    jb = r2["json_big"] or {"size": cfg["json_big_size"], "median": None, "error": "not run", "peak_mib": None}
    add(f"{size_name(tuple(jb['size']))}: -f json < {cfg['json_big_seconds']:g} s and < {cfg['json_big_mib']:g} MiB",
        None if jb["median"] is None else jb["median"] < cfg["json_big_seconds"] and jb["peak_mib"] < cfg["json_big_mib"],
        jb["error"] or f"{fmt_s(jb['median'])} s, {jb['peak_mib']:.0f} MiB, {(jb['output_bytes'] or 0) / 1e6:.0f} MB")
    b = r2["backward"] or {"size": cfg["backward_size"], "ratio": None, "latex": {"median": None}}
    add(f"{size_name(tuple(b['size']))}: --backward <= {cfg['backward_ratio']:g}x the forward pass",
        None if b["ratio"] is None else b["ratio"] <= cfg["backward_ratio"],
        "not measured" if b["ratio"] is None else f"{fmt_s(b['backward']['median'])} s, "
        f"{b['backward']['peak_mib']:.0f} MiB, {b['ratio']:.2f}x", "" if b["latex"]["median"] is None else
        f"forward {fmt_s(b['latex']['median'])} s")
    for h in r2.get("html") or []:
        add(f"{size_name(tuple(h['size']))}: -f html (the web page) <= {cfg['html_ratio']:g}x the LaTeX run",
            None if h["ratio"] is None else h["ratio"] <= cfg["html_ratio"],
            h["html"]["error"] or h["latex"]["error"] or "not measured" if h["ratio"] is None else
            f"{fmt_s(h['html']['median'])} s, {h['html']['peak_mib']:.0f} MiB, {h['ratio']:.2f}x",
            "" if h["latex"]["median"] is None else f"LaTeX {fmt_s(h['latex']['median'])} s",
            note=f"median of {h['rounds']} round(s), fresh processes alternating")
    last = r2["long"][-1] if r2["long"] else None
    exp = r2["long_exponent"]
    if last is not None:
        size = tuple(last["size"])
        add(f"{size_name(size)} causal to LaTeX < {cfg['long_seconds']:g} s and < {cfg['long_mib'] / 1024:g} GiB",
            None if last["wall"] is None else last["wall"] < cfg["long_seconds"] and last["peak_mib"] < cfg["long_mib"],
            last["error"] or f"{fmt_s(last['wall'])} s, {last['peak_mib']:.0f} MiB",
            "", ("growth n^{:.2f} over n = {}; ".format(exp, ", ".join(str(r["size"][0]) for r in r2["long"]))
                 if exp is not None else "") + long_split_sentence(size))
    t = start["demo"].get("median")
    add(f"symattn derive (4-token demo) < {cfg['demo_seconds']:g} s (#20)", None if t is None else t < cfg["demo_seconds"],
        start["demo"].get("error") or f"{t:.3f} s",
        note="bytecode kept, as an installed symattn has it; in this environment as it is: "
             f"{fmt_s(start.get('demo_as_run', {}).get('median'), 'not measured')} s", sized=False)
    return out


def print_round_two(r2: dict, targets: list[dict], out) -> None:
    print("Issue #20 (fresh processes, medians; floor = the bare libyaml+Fraction+flint script reading the same "
          "file, run alternately in the same round)", file=out)
    for row in r2["layouts"]:
        print(f"  layouts at {size_name(tuple(row['size']))}:", file=out)
        for layout, v in row["layouts"].items():
            s, f = v["symattn"], v["floor"]
            peak = "-" if s["peak_mib"] is None else f"{s['peak_mib']:.0f}"
            ratio = "-" if v["ratio"] is None else f"{v['ratio']:.2f}x"
            print(f"    {layout:<10} {v['bytes'] / 1e6:>7.2f} MB  symattn {fmt_s(s['median'], s['error'] or '-'):>6} s "
                  f"{peak:>5} MiB  floor {fmt_s(f['median'], f['error'] or '-'):>6} s  {ratio}", file=out)
    for r in r2["long"]:
        print(f"  long context {size_name(tuple(r['size']))} causal: "
              f"{fmt_s(r['wall'], r['error'] or '-')} s, {'-' if r['peak_mib'] is None else round(r['peak_mib'])} MiB",
              file=out)
    for h in r2.get("html") or []:
        print(f"  web page {size_name(tuple(h['size']))}: LaTeX {fmt_s(h['latex']['median'], h['latex']['error'] or '-')} s, "
              f"-f html {fmt_s(h['html']['median'], h['html']['error'] or '-')} s"
              + ("" if h["ratio"] is None else f", {h['ratio']:.2f}x") + f" ({h['rounds']} round(s))", file=out)
    if r2["long_exponent"] is not None:
        print(f"  long-context growth: time ~ n^{r2['long_exponent']:.2f} (d_model, d_k fixed)", file=out)
    print("Targets of #20", file=out)
    for t in targets:
        extra = "".join(f"  [{x}]" for x in (t["floor"], t["note"]) if x)
        print(f"  {t['verdict']:<4}  {t['target']}: {t['measured']}{extra}", file=out)


# -- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per size for symattn, NumPy and the bare script "
                        "(median; sizes with n >= 256 run once) [3]")
    parser.add_argument("--naive-runs", type=int, default=1, help="runs of the naive pipeline per size [1]")
    parser.add_argument("--naive-cap", type=float, default=120.0, help="seconds the naive pipeline may take [120]")
    parser.add_argument("--symattn-cap", type=float, default=600.0,
                        help="seconds one fresh-process symattn run may take; past it larger sizes are skipped [600]")
    parser.add_argument("--quick", action="store_true",
                        help=f"only sizes with n <= {QUICK_MAX_N}, no {EXTRA[0]}-token row (the GPT-2 head is still "
                             "loaded, for the .npy load target)")
    parser.add_argument("--sizes", type=parse_sizes, help="comma-separated NxD_MODELxD_K instead of the default sizes")
    parser.add_argument("--no-extra", action="store_true", help=f"skip the {EXTRA[0]}-token row")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive pipeline")
    parser.add_argument("--no-round-two", action="store_true", help="skip issue #20's rows (layouts, JSON, backward, web page, "
                        "long context)")
    parser.add_argument("--round-two-only", action="store_true", help="only start-up and issue #20's rows")
    parser.add_argument("--round-two-rows", default="layouts,json,backward,long,html",
                        help="which of issue #20's rows to run, comma-separated [layouts,json,backward,long,html]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random problems [0]")
    parser.add_argument("--workdir", type=Path, help="write (and keep) the problem files here instead of a temporary folder")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write the JSON [{DEFAULT_JSON.relative_to(HERE.parent)}]")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.naive_runs < 1:
        parser.error("--runs and --naive-runs must be at least 1")
    return args


def versions() -> dict:
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    for name in ("symattn", "sympy", "numpy", "yaml", "flint", "mpmath"):
        try:
            out[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            out[name] = None
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sizes = args.sizes or SIZES
    if args.quick:
        sizes = [s for s in sizes if s[0] <= QUICK_MAX_N]
    run_extra = not (args.quick or args.no_extra)
    say = sys.stdout

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    began = time.perf_counter()
    command, command_name = symattn_command()
    state = {"symattn_capped": None, "naive_capped": None, "bare_missing": _problems.bare_available()}
    with contextlib.ExitStack() as stack:
        if args.workdir:
            root = args.workdir.resolve()
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_derive_")))

        log(f"start-up: {command_name} --help and derive, {STARTUP_RUNS} fresh processes each ...")
        start = {"command": command_name, "help": startup(command, ["--help"]), "demo": startup(command, ["derive"]),
                 "demo_as_run": startup(command, ["derive"], bytecode=False)}

        log("warming up (imports) with the built-in demo in this process ...")
        t0 = time.perf_counter()
        code, err = call_cli(["derive", "-o", str(root / "warmup.tex")])
        warmup = {"seconds": time.perf_counter() - t0, "exit_code": code}
        if code != 0:
            log(f"  the demo failed here: {err.strip()}")

        rows = []
        if args.round_two_only:
            sizes = []
        for size in sizes:
            log(f"{size_name(size)} ...")
            try:
                rows.append(bench_size(size, root / "n{}_d{}_k{}".format(*size), args, state, log))
            except Exception as exc:  # noqa: BLE001  (one size's failure is recorded; the rest still run)
                log(f"  failed: {type(exc).__name__}: {exc}")
                rows.append({"n": size[0], "d_model": size[1], "d_k": size[2], "failed": f"{type(exc).__name__}: {exc}"})

        gpt2_row = next((r for r in rows if (r["n"], r["d_model"], r["d_k"]) == GPT2 and "failed" not in r), None)
        if args.round_two_only:
            gpt2_load = None
        elif gpt2_row is not None:
            gpt2_load = {"yaml": gpt2_row["load_yaml"], "npy": gpt2_row["load_npy"], "yaml_bytes": gpt2_row["yaml_bytes"]}
        else:
            log(f"load_problem of the GPT-2 head {size_name(GPT2)}, YAML and .npy ...")
            folder = root / "n{}_d{}_k{}_load".format(*GPT2)
            yaml_path, npy_path = _problems.write_problem(folder, *GPT2, seed=args.seed)
            gpt2_load = {"yaml": time_load(yaml_path, args.runs), "npy": time_load(npy_path, args.runs),
                         "yaml_bytes": yaml_path.stat().st_size}

        r2 = None
        if not args.no_round_two:
            r2 = round_two(root, args, log)

        extra = None
        if run_extra and not args.round_two_only:
            if state["symattn_capped"] is not None:
                extra = {"size": list(EXTRA), "fresh": {"wall": None, "error": f"skipped: {state['symattn_capped']} hit the cap"}}
            else:
                log(f"{size_name(EXTRA)}: symattn once, fresh process (cap {args.symattn_cap:g} s) ...")
                folder = root / "n{}_d{}_k{}".format(*EXTRA)
                yaml_path, _ = _problems.write_problem(folder, *EXTRA, seed=args.seed)
                extra = {"size": list(EXTRA), "yaml_bytes": yaml_path.stat().st_size,
                         "fresh": symattn_fresh(yaml_path, folder / "out.tex", args.symattn_cap)}

    good = [r for r in rows if "failed" not in r]
    exponents = {}
    for peer, key in (("symattn", "median"), ("numpy", "median"), ("bare", "median"), ("naive", "seconds")):
        points = [(r["n"], r[peer].get(key)) for r in good if r["n"] >= FIT_FROM_N and r[peer].get(key)]
        exponents[peer] = {"exponent": fit_exponent(points), "over_n": [n for n, _ in points]}
    targets = judge(good, extra, gpt2_load, start)

    print(f"symattn derive, end to end, beside peers  (Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"seed {args.seed}, runs {args.runs})", file=say)
    if args.quick:
        print(f"--quick: sizes with n > {QUICK_MAX_N} and the {EXTRA[0]}-token row skipped", file=say)
    print(file=say)
    print_tables(good, say)
    for r in rows:
        if "failed" in r:
            print(f"note: {size_name((r['n'], r['d_model'], r['d_k']))} failed: {r['failed']}", file=say)
    print(file=say)
    e = exponents["symattn"]
    if e["exponent"] is None:
        print(f"growth: too few sizes with n >= {FIT_FROM_N} to fit an exponent", file=say)
    else:
        others = ", ".join(f"{p} n^{exponents[p]['exponent']:.2f}" for p in ("naive", "bare", "numpy")
                           if exponents[p]["exponent"] is not None)
        print(f"growth: symattn time ~ n^{e['exponent']:.2f} (least squares of log t vs log n over n = "
              f"{', '.join(map(str, e['over_n']))}; d_model and d_k grow too)" + (f"; {others}" if others else ""),
              file=say)
    if extra is not None:
        f = extra["fresh"]
        if f.get("wall") is not None:
            detail = f"{fmt_s(f['wall'])} s wall in a fresh process ({fmt_s(f['inside'])} s from the import of symattn), " \
                     f"peak {f['peak_mib']:.0f} MiB" + (f"; {f['error']}" if f.get("error") else "")
        else:
            detail = f.get("error") or "not run"
        print(f"{size_name(EXTRA)}, one run: {detail}", file=say)
    if gpt2_load is not None:
        print(f"load_problem {size_name(GPT2)} ({gpt2_load['yaml_bytes'] / 1e6:.2f} MB of YAML): "
              f"YAML {fmt_s(gpt2_load['yaml'].get('median'), gpt2_load['yaml'].get('error') or '-')} s, "
              f".npy {fmt_s(gpt2_load['npy'].get('median'), gpt2_load['npy'].get('error') or '-')} s", file=say)
    print(f"start-up ({command_name}, median of {STARTUP_RUNS} fresh processes): --help "
          f"{fmt_s(start['help'].get('median'), 'error')} s, derive (4-token demo) {fmt_s(start['demo'].get('median'), 'error')} s"
          f" (bytecode kept, as installed; in this environment as it is: "
          f"{fmt_s(start['demo_as_run'].get('median'), 'error')} s)",
          file=say)
    if state["bare_missing"]:
        print(f"note: no bare-script peer: {state['bare_missing']}", file=say)
    print(file=say)
    print_targets(targets, say)
    r2_targets = None
    if r2 is not None:
        print(file=say)
        r2_targets = judge_round_two(r2, start)
        print_round_two(r2, r2_targets, say)
    elapsed = time.perf_counter() - began
    print(file=say)

    report = {
        "benchmark": "bench_derive",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_seconds": elapsed,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "versions": versions(),
        "warmup": warmup,
        "sizes": rows,
        "exponents": exponents,
        "extra": extra,
        "gpt2_load": gpt2_load,
        "startup": start,
        "targets": targets,
        "target_values": TARGETS,
        "round_two": r2,
        "round_two_targets": r2_targets,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"whole run {elapsed:.0f} s; JSON written to {args.json}", file=say)


if __name__ == "__main__":
    main()
