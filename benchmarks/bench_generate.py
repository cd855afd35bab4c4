"""How long `symattn generate` takes for a batch of easy exercises.

Run: python benchmarks/bench_generate.py
Prints the wall time of generating 30 easy 4-token variants (each derived and
cross-checked before it is written), the median of 5 runs, through the real
command line in a fresh process.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time


def main() -> None:
    times = []
    for run in range(5):
        with tempfile.TemporaryDirectory() as folder:
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "symattn", "generate", "--count", "30", "--out-dir", folder, "--seed", str(run)],
                check=True,
                capture_output=True,
            )
            times.append(time.perf_counter() - start)
    print(f"30 easy 4-token variants: median {statistics.median(times):.2f} s over 5 runs "
          f"(min {min(times):.2f} s, max {max(times):.2f} s)")


if __name__ == "__main__":
    main()
