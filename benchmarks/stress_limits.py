"""The largest problem each default limit accepts, run for real: its time and peak memory.

Run: python benchmarks/stress_limits.py            (every row, a few minutes)
     python benchmarks/stress_limits.py --only json,backward
Options: --timeout S (per row, default 300), --keep DIR (keep the problem files).

Not a timed test: it prints one line per row (the command, seconds, peak MiB
of the child process, exit code) so the defaults of symattn.problem.budget can be
judged against their aim, every accepted problem in about a minute and 2 GiB
on a 2-core machine. Each row is the largest problem of its kind that the
default --max-size still accepts, and the row after it (one token more)
must be refused in well under a second.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from symattn.problem.budget import (DEARER, HEADS, PDF_HEADS, ROPE_WORK, SCORE_CELLS, SCORE_CELLS_IRRATIONAL,  # noqa: E402
                             SCORE_WORK_IRRATIONAL)


def qkv(n: int, d: int, scale: str = "none") -> str:
    """Q, K and V of n tokens and width d; small integer entries (-3..3), a causal mask."""
    import numpy as np

    rng = np.random.default_rng(0)

    def mat() -> str:
        return "[" + ", ".join("[" + ", ".join(str(int(x)) for x in row) + "]" for row in rng.integers(-3, 4, (n, d))) + "]"

    return f"mask: causal\nscale: {scale}\nQ: {mat()}\nK: {mat()}\nV: {mat()}\n"


def rope(n: int, d: int, scale: str = "none") -> str:
    """Q, K and V as :func:`qkv` makes them, turned by RoPE with base 10000 (cos 1, sin 1, ...)."""
    return "rope: {base: 10000}\n" + qkv(n, d, scale)


def heads(count: int, d: int, scale: str = "none") -> str:
    """``count`` heads of width ``d`` on two tokens (d_model 2): the cost of a head of its own."""
    w = "[" + ", ".join(["[" + ", ".join(["1"] * d) + "]"] * 2) + "]"
    head = f"  - {{W_Q: {w}, W_K: {w}, W_V: {w}}}\n"
    w_o = "[" + ", ".join(["[1, 0]"] * (count * d)) + "]"
    return f"mask: causal\nscale: {scale}\nX: [[1, 2], [3, 1]]\nheads:\n{head * count}W_O: {w_o}\n"


MAKERS = {"rope": rope, "heads": heads}


def rows() -> list[tuple[str, int, int, str, list[str]]]:
    """(name, n, d, scale, extra arguments): the largest problem each default accepts (a name
    starting "rope" or "heads" is made by that function of :data:`MAKERS`, its n the heads).

    One size up is one token more, except where that stays within the budget: the numbers row
    grows to 578 x 578 (beyond 1,000,000 numbers), the wide row's d_k by two (still irrational)."""
    side = int(SCORE_CELLS ** 0.5)
    json_side = int((SCORE_CELLS // DEARER) ** 0.5)
    back_side = json_side
    back_json_side = int((SCORE_CELLS // DEARER // DEARER) ** 0.5)
    irr_side = int(SCORE_CELLS_IRRATIONAL ** 0.5)
    irr_d = SCORE_WORK_IRRATIONAL // (irr_side * irr_side)  # 2 at the defaults
    rope_side = int((ROPE_WORK // 4) ** 0.5)
    wide_d = SCORE_WORK_IRRATIONAL // 100 - 1  # 10 tokens: as wide a d_k as the score terms allow
    while int(wide_d ** 0.5) ** 2 == wide_d:
        wide_d -= 1  # keep the scale irrational
    return [
        ("numbers: 576 x 576 Q, K, V (995,328 numbers, scale 1/24)", 576, 576, "auto", ["-o", "out.tex"]),
        (f"score cells, LaTeX: {side} tokens, d = 1", side, 1, "none", ["-o", "out.tex"]),
        (f"score cells, Markdown: {side} tokens, d = 1", side, 1, "none", ["-o", "out.md"]),
        (f"score cells, text: {side} tokens, d = 1", side, 1, "none", ["-o", "out.txt"]),
        (f"score cells, PDF: {side} tokens, d = 1", side, 1, "none", ["-o", "out.pdf"]),
        (f"score cells, JSON: {json_side} tokens, d = 1", json_side, 1, "none", ["-o", "out.json"]),
        (f"backward, LaTeX: {back_side} tokens, d = 1", back_side, 1, "none", ["--backward", "-o", "out.tex"]),
        (f"backward, JSON: {back_json_side} tokens, d = 1", back_json_side, 1, "none", ["--backward", "-o", "out.json"]),
        (f"irrational scale: {irr_side} tokens, d_k = {irr_d}", irr_side, irr_d, "auto", ["-o", "out.tex"]),
        (f"irrational scale, wide: 10 tokens, d_k = {wide_d}", 10, wide_d, "auto", ["-o", "out.tex"]),
        (f"irrational scale, JSON: {irr_side // 2} tokens, d_k = {irr_d}", irr_side // 2, irr_d, "auto",
         ["-o", "out.json"]),
        (f"irrational scale, backward: {irr_side // 2} tokens, d_k = {irr_d}", irr_side // 2, irr_d, "auto",
         ["--backward", "-o", "out.tex"]),
        (f"rope, base 10000: {rope_side} tokens, d_k = 4", rope_side, 4, "auto", ["-o", "out.tex"]),
        (f"heads, LaTeX: {HEADS} heads of 2 tokens, d_k = 1", HEADS, 1, "none", ["-o", "out.tex"]),
        (f"heads, PDF: {PDF_HEADS} heads of 2 tokens, d_k = 1", PDF_HEADS, 1, "none", ["-o", "out.pdf"]),
        (f"heads, web page: {HEADS // DEARER} heads of 2 tokens, d_k = 1", HEADS // DEARER, 1, "none",
         ["-o", "out.html"]),
        (f"heads, JSON: {HEADS // DEARER} heads of 2 tokens, d_k = 1", HEADS // DEARER, 1, "none", ["-o", "out.json"]),
    ]


def run(args: list[str], cwd: Path, timeout: float) -> tuple[float, float, object, str]:
    """Seconds, peak MiB (ru_maxrss of the child), exit code (or 'timeout') and the last stderr line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.monotonic()
    with open(cwd / "stderr.txt", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "symattn", *args], cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=err, stdin=subprocess.DEVNULL, env=env)
        code: object
        deadline = start + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                code = "timeout"
                break
            time.sleep(0.05)
    seconds = time.monotonic() - start
    proc.returncode = 0  # reaped above
    lines = (cwd / "stderr.txt").read_text("utf-8", "replace").strip().splitlines()
    return seconds, usage.ru_maxrss / 1024, code, (lines[-1] if lines else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--only", help="comma-separated words; run the rows whose name holds one")
    ap.add_argument("--keep", type=Path, help="keep the problem files in this folder")
    o = ap.parse_args()
    folder = o.keep or Path(tempfile.mkdtemp(prefix="symattn-stress-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores; every row in a fresh process; the next size up must be refused")
    for name, n, d, scale, extra in rows():
        if o.only and not any(w in name for w in o.only.split(",")):
            continue
        make = MAKERS.get(name.split(",")[0], qkv)
        (folder / "p.yaml").write_text(make(n, d, scale), "utf-8")
        seconds, peak, code, last = run(["derive", "p.yaml", *extra], folder, o.timeout)
        up = (578, 578) if name.startswith("numbers") else (n, d + 2) if n == 10 else (n + 1, d)
        (folder / "p.yaml").write_text(make(*up, scale), "utf-8")
        refused_in, _, refused_code, refusal = run(["derive", "p.yaml", *extra], folder, 60)
        refused = refused_code == 1 and ("size budget" in refusal or "size limit" in refusal)
        print(f"{name:58s} {seconds:7.1f} s {peak:7.0f} MiB  exit {code}"
              + (f"  ({last[:80]})" if code != 0 else "")
              + f"   one size up: {'refused' if refused else 'NOT refused'} in {refused_in:.1f} s", flush=True)


if __name__ == "__main__":
    main()
