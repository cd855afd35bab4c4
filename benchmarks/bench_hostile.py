"""Every hostile input of tests/test_cli_hostile.py through the real command line: how long
each refusal takes on the wall clock, its CPU time and peak memory.

Run: python benchmarks/bench_hostile.py            (every case, about a minute)
     python benchmarks/bench_hostile.py --only million,safetensors

The tests assert each refusal's CPU time (tests/_child.py: under 20 s), which load does not
stretch; the wall-clock aim lives here: each case under 10 s on an idle 2-core machine.
Prints one line per case (wall seconds, CPU seconds, peak MiB, exit code) and MISS for a
case over the aim; exits 1 if any case misses it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import test_cli_hostile as hostile  # noqa: E402
from _child import run_cli  # noqa: E402

AIM_S = 10.0


def cases():
    """(name, argv, files, special) for each hostile case, as the tests run them."""
    for case, files, special, _ in hostile.DERIVE:
        target = "p.yaml" if "p.yaml" in files or "p.yaml" in special else next(iter(special))
        yield f"derive {case}", ["derive", target, "-f", "json"], files, special
    for case, files, special, _ in hostile.CHECK:
        target = "a.yaml" if "a.yaml" in special or any(f.startswith("a.yaml") for f in files) else next(iter(special))
        yield f"check {case}", ["check", hostile.CAUSAL, target], files, special


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated substrings of the case names to run")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    misses = 0
    for name, argv, files, special in cases():
        if wanted and not any(w in name for w in wanted):
            continue
        with tempfile.TemporaryDirectory(prefix="symattn-hostile-") as folder:
            keep = hostile._make(Path(folder), files, special)
            r = run_cli(argv, cwd=folder)
            for s in keep:
                s.close()
        miss = r.seconds >= AIM_S or r.killed
        misses += miss
        print(f"{'MISS' if miss else 'ok  '} {r.seconds:6.2f} s wall {r.cpu_seconds:6.2f} s CPU "
              f"{r.peak_bytes / (1 << 20):7.1f} MiB exit {r.code}  {name}", flush=True)
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
