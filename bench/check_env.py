#!/usr/bin/env python3
"""Median wall time of `octo-dist check-env` (fast mode) vs `python -c "import jax"`, same environment.

Target: ratio <= 0.25 (check-env at most a quarter of `import jax`). Prints; asserts nothing.
"""

import statistics
import subprocess
import sys
import time

RUNS = 7


def median_seconds(cmd):
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    profile = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    check = median_seconds([sys.executable, "-m", "octo_dist", "check-env", "--profile", profile])
    jax = median_seconds([sys.executable, "-c", "import jax"])
    print(f"runs each: {RUNS}")
    print(f"octo-dist check-env --profile {profile}: {check:.3f} s (median)")
    print(f"python -c 'import jax':             {jax:.3f} s (median)")
    print(f"ratio check-env / import jax:       {check / jax:.2f}  (target <= 0.25)")


if __name__ == "__main__":
    main()
