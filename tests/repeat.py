"""Run pytest N times in a row, stopping at the first failure, optionally beside CPU-bound hog processes.

    python tests/repeat.py --times 5 --hogs 2 -- -m mpi      # what `make test-repeat N=5 HOGS=2` runs

A test that fails one time in three throws work away at random; this is how a change shows it does not. The hogs
are plain busy loops in separate processes (one per core here), started before the first run and killed after the
last, so the tests see a machine as loaded as a shared CI runner. Prints one line per run and a closing count.
"""

from __future__ import annotations

import argparse
import multiprocessing
import subprocess
import sys
import time


def _spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--times", type=int, default=5, help="runs in a row (default: 5)")
    parser.add_argument(
        "--hogs", type=int, default=0, help="CPU-bound processes running beside them (default: 0)"
    )
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest, after --")
    args = parser.parse_args(argv)
    if args.times < 1 or args.hogs < 0:
        parser.error(
            f"--times {args.times} --hogs {args.hogs}; expected --times >= 1 and --hogs >= 0"
        )
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    passed = 0
    try:
        for i in range(1, args.times + 1):
            start = time.monotonic()
            code = subprocess.call(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args]
            )
            print(
                f"repeat: run {i}/{args.times} beside {args.hogs} hog(s): pytest exit {code} "
                f"in {time.monotonic() - start:.0f} s",
                flush=True,
            )
            if code != 0:
                break
            passed += 1
    finally:
        for h in hogs:
            h.kill()
    print(
        f"repeat: runs of `pytest {' '.join(args.pytest_args)}` beside {args.hogs} hog(s)",
        flush=True,
    )
    print(f"repeat: {passed} passed, {0 if passed == args.times else 1} failed", flush=True)
    return 0 if passed == args.times else 1


if __name__ == "__main__":
    sys.exit(main())
