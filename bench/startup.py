#!/usr/bin/env python3
"""Time from process start to the first finished step, this checkout against an earlier revision, side by side.

Each job runs alternately from the two source trees (``git archive REV`` unpacked in a temporary directory, and
this working tree), ROUNDS times each, one process each, from a scratch directory; the figures are the ones the
job writes to ``summary.json`` (``time_to_first_step_s``: process start -> first step finished;
``fit_to_first_step_s``: training start -> first step finished, which includes building and reading the data,
printed as "compile+data"; a revision older than summary schema 3 called it ``compile_s``). Jobs:

* ``smoke``: ``octo-dist smoke --model tiny``, always;
* ``finetune``: ``octo-dist finetune`` of the tiny Octo of ``finetune_smoke_config.py`` on the synthetic RLDS data,
  with the default config's shuffle buffer (10,000 frames), when ``octo`` is importable.

Prints medians and ratios to ``before``, and the median steady step time (the overlap of host and device shows
there); asserts nothing. (No row with a persistent compilation cache: on the CPU, JAX caches only under
``--xla_cpu_use_xla_runtime=true``, another runtime.)

usage: bench/startup.py --before REV [--rounds 3] [--jobs smoke finetune]
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900
FIELDS = ("time_to_first_step_s", "fit_to_first_step_s", "wall_s", "median_step_s")
# The default fine-tune config's shuffle buffer (finetune_config.py): what a user's start-up fills.
SHUFFLE_BUFFER = 10000


def unpack(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (``git archive``), without the checkout's git metadata."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True
    )
    if archive.returncode:
        raise SystemExit(
            f"bench/startup.py: no revision {rev!r} in {REPO} ({archive.stderr.decode().strip()}); "
            f"expected a commit of this clone. Fix: git fetch --unshallow, or pass --before <commit>"
        )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def command(job: str, run_dir: Path, data_dir: Path) -> list:
    if job == "smoke":
        return [
            sys.executable,
            "-m",
            "octo_dist",
            "smoke",
            "--model",
            "tiny",
            "--steps",
            "20",
            "--save-dir",
            str(run_dir),
        ]
    return [
        sys.executable,
        "-m",
        "octo_dist",
        "finetune",
        "--config=finetune_smoke_config.py",
        "--debug",
        "--name=bench",
        f"--config.save_dir={run_dir}",
        f"--config.dataset_kwargs.data_dir={data_dir}",
        "--config.num_steps=10",
        f"--config.shuffle_buffer_size={SHUFFLE_BUFFER}",
    ]


def summary_of(job: str, run_dir: Path) -> Path:
    found = sorted(run_dir.rglob("summary.json"))
    if not found:
        raise SystemExit(f"bench/startup.py: {job} left no summary.json under {run_dir}")
    return found[0]


def run_once(variant: str, tree: Path, job: str, scratch: Path, data_dir: Path, n) -> dict:
    run_dir = scratch / f"{job}-{variant}-{n}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "JAX_PLATFORMS": "cpu",
        "WANDB_MODE": "disabled",
    }
    started = time.time()
    proc = subprocess.run(
        command(job, run_dir, data_dir),
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if proc.returncode:
        raise SystemExit(
            f"bench/startup.py: {job} from {tree} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        )
    summary = json.loads(summary_of(job, run_dir).read_text())
    if (
        summary.get("schema", 0) < 3
    ):  # before schema 3, compile_s was the training start -> first step time
        summary = {**summary, "fit_to_first_step_s": summary["compile_s"]}
    return {**{f: summary[f] for f in FIELDS}, "outer_s": time.time() - started}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--before",
        required=True,
        help="the revision to compare with (e.g. a commit before a change)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="runs per tree and job, alternating (default: %(default)s)",
    )
    p.add_argument(
        "--jobs",
        nargs="+",
        default=["smoke", "finetune"],
        choices=["smoke", "finetune"],
        help="default: %(default)s (finetune only where octo is importable)",
    )
    a = p.parse_args()
    jobs = [j for j in a.jobs if j != "finetune" or importlib.util.find_spec("octo") is not None]
    if len(jobs) < len(a.jobs):
        print("finetune skipped: octo is not importable (make git-deps)")
    with tempfile.TemporaryDirectory(prefix="octo-dist-startup-") as tmp:
        scratch = Path(tmp)
        trees = {"before": unpack(a.before, scratch / "before"), "after": REPO}
        data_dir = scratch / "synthetic_rlds"
        if "finetune" in jobs:
            subprocess.run(
                [sys.executable, "-m", "octo_dist.apps.finetune.synthetic_rlds", str(data_dir)],
                cwd=REPO,
                check=True,
                capture_output=True,
                timeout=TIMEOUT_S,
            )
        results = {(job, name): [] for job in jobs for name in trees}
        for n in range(a.rounds):
            for job in jobs:
                for name, tree in trees.items() if n % 2 == 0 else reversed(list(trees.items())):
                    results[(job, name)].append(run_once(name, tree, job, scratch, data_dir, n))
        print(
            f"before = {a.before}, after = this working tree; "
            f"median of {a.rounds} run(s) each, one process, {os.cpu_count()} CPU(s)"
        )
        print(
            f"{'job':<9} {'variant':<8} {'first step (s)':>15} {'ratio':>6} {'compile+data (s)':>17} {'ratio':>6} "
            f"{'wall (s)':>9} {'median step (ms)':>17}"
        )
        for job in jobs:
            med = {
                name: {f: statistics.median(r[f] for r in results[(job, name)]) for f in FIELDS}
                for name in trees
            }
            base = med["before"]
            for name in trees:
                m = med[name]
                print(
                    f"{job:<9} {name:<8} {m['time_to_first_step_s']:>15.2f} "
                    f"{m['time_to_first_step_s'] / base['time_to_first_step_s']:>6.2f} "
                    f"{m['fit_to_first_step_s']:>17.2f} "
                    f"{m['fit_to_first_step_s'] / base['fit_to_first_step_s']:>6.2f} {m['wall_s']:>9.2f} "
                    f"{m['median_step_s'] * 1e3:>17.1f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
