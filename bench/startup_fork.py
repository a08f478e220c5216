#!/usr/bin/env python3
"""Start-up and step time of ``octo-dist finetune`` against the Octo fork's own ``scripts/finetune.py``, side by side.

Both get the same command line: the fork's ``scripts/configs/finetune_config.py:full,image_conditioned``, a small
pretrained Octo, the fork's debug dataset (``tests/debug_dataset/bridge_dataset``), batch 8, STEPS steps (10 of them
learning-rate warm-up instead of the config's 2,000, which a short run cannot hold), metrics
fetched every step (``log_interval=1``), no evaluation or checkpoint inside the run, wandb off, JAX on the CPU. One
process each, from a scratch directory, alternating (fork, octo-dist, then octo-dist, fork, ...), ROUNDS times each.

* the fork runs unchanged under ``bench/fork_timing.py``, which stamps each iteration of its training loop; with
  ``log_interval=1`` it waits for every step's metrics, so iteration i+1 starting means step i finished;
* octo-dist's figures are the ones it writes to its run's ``summary.json``; it runs twice a round: as it trains by
  default (``augment_on="auto"``, which on the CPU is the fork's placement, ``"host"``: tf.data's threads augment;
  on GPUs it is ``"device"``) and with ``--config.augment_on=device`` (the images augmented by a program of their
  own on the device, ahead of each step). On this CPU bench that "device" is the same cores the step runs on, so
  device augmentation competes with the step; on a GPU it does not. The targets are read on the default run.

Figures per run, on one definition for both: time to first step (process start, as ``harness.process_started``
reads it, to the first step finished), steady step (median of the step-to-step intervals from the third step on),
peak memory (the child's ``ru_maxrss`` from ``os.wait4``), wall (process creation to exit; octo-dist also writes its
final checkpoint, which the fork does not do at ``save_interval > num_steps``). Prints the medians, the ratio
octo-dist / fork next to its target, octo-dist's start-up phases and the command line; asserts nothing. Exits
non-zero only when a run fails.

The pretrained model (unless --pretrained): a tiny Octo (``finetune_smoke_config.py``'s) trained 2 steps by
``octo-dist finetune`` on the same debug dataset at the fork config's image size (256x256) and window (1), which
also leaves the dataset statistics cached for both. Its ``config.json`` holds ``optimizer.frozen_keys``, as a
checkpoint of Octo's own pretraining does (the fork's ``full`` mode reads it).

The fork's tree is --fork, else the one the importable ``octo`` package sits in; where neither is found the bench
prints one ``skipped`` line and exits 0.

Then ``--profile`` runs (1) of each under ``bench/step_profile.py`` print where a steady step's time goes, side by
side: the step's call (on a CPU it returns when the step is computed), the main thread's waits for input, its
metric fetches and host-to-device copies, the rest of the loop, the work worker threads did beside the step, and
compilations after the second step.

usage: bench/startup_fork.py [--fork PATH] [--pretrained DIR] [--rounds 2] [--steps 60] [--profile 1]
"""

import argparse
import importlib.util
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Tuple

import psutil

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 1800
CONFIG = "scripts/configs/finetune_config.py:full,image_conditioned"
DATA = "tests/debug_dataset"
WARMUP_STEPS = 10
# ratio octo-dist / fork that each figure should reach: the first step a third of the fork's or less (the start-up
# work octo-dist overlaps or skips), the steady step no slower, a quarter of its memory (the shuffle buffer holds
# encoded frames)
TARGETS = {"first_step_s": 0.3, "step_s": 1.0, "maxrss_mib": 0.25, "wall_s": None}
# octo-dist's two runs a round: name -> its --config.augment_on (None: its default; see the module docstring)
OURS = {"octo-dist": None, "octo-dist device-aug": "device"}
ROWS = (
    ("first_step_s", "time to first step (s)", 1.0, "{:.1f}"),
    ("step_s", "steady step (ms)", 1e3, "{:.1f}"),
    ("maxrss_mib", "peak memory (MiB)", 1.0, "{:.0f}"),
    ("wall_s", "wall (s)", 1.0, "{:.1f}"),
)


def locate_fork(given: Optional[str]) -> Tuple[Optional[Path], str]:
    """The fork's source tree (the folder holding ``scripts/finetune.py``), or None and why, with the fix."""
    if given:
        tree = Path(given).resolve()
        if not (tree / "scripts" / "finetune.py").is_file():
            return (
                None,
                f"no scripts/finetune.py under {tree}; pass --fork <the fork's source tree> (FORK=... for make)",
            )
        sys.path.insert(0, str(tree))  # its octo package, for the check below
    spec = importlib.util.find_spec("octo")
    if spec is None or spec.origin is None:
        return (
            None,
            "octo is not importable; make git-deps, or pass --fork <the fork's source tree>",
        )
    # octo/__init__.py -> the tree above the package: a source checkout holds scripts/ there, site-packages does not
    tree = Path(given).resolve() if given else Path(spec.origin).resolve().parents[1]
    if not (tree / "scripts" / "finetune.py").is_file():
        return None, (
            f"octo is installed at {Path(spec.origin).parent} without the fork's scripts/finetune.py; "
            "pass --fork <a checkout of the fork> (FORK=... for make)"
        )
    if not (tree / DATA / "bridge_dataset").is_dir():
        return (
            None,
            f"no {DATA}/bridge_dataset under {tree}; pass --fork <a full checkout of the fork>",
        )
    return tree, ""


def child_env(fork: Path, given: bool) -> dict:
    paths = [str(REPO), *([str(fork)] if given else []), os.environ.get("PYTHONPATH")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
        "JAX_PLATFORMS": "cpu",
        "WANDB_MODE": "disabled",
    }


def run_child(argv: list, cwd: Path, env: dict, log: Path) -> dict:
    """Runs ``argv`` to its end: exit code, creation time, wall and peak memory of this one process (and its
    children), its output in ``log``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    created = psutil.Process(proc.pid).create_time()
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # the session start_new_session made: this run only
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.1)
    ended = time.time()
    proc.returncode = os.waitstatus_to_exitcode(
        status
    )  # reaped here; keeps Popen from waiting again
    return {
        "rc": proc.returncode,
        "created": created,
        "wall_s": ended - created,
        "maxrss_mib": usage.ru_maxrss / 1024,  # KiB on Linux
    }


def failed(what: str, argv: list, rc: int, log: Path) -> int:
    tail = log.read_text(errors="replace")[-4000:]
    print(f"bench-startup-fork: {what} exited {rc}: {shlex.join(argv)}\n{tail}", file=sys.stderr)
    return 1


def make_pretrained(fork: Path, scratch: Path, env: dict) -> Tuple[Optional[Path], int]:
    """A tiny Octo in Octo's ``save_pretrained`` layout, made by ``octo-dist finetune`` (see the module docstring)."""
    save_dir = scratch / "pretrained"
    argv = [
        sys.executable,
        "-m",
        "octo_dist",
        "finetune",
        "--config=finetune_smoke_config.py",
        "--debug",
        "--name=pretrained",
        f"--config.save_dir={save_dir}",
        "--config.dataset_kwargs.name=bridge_dataset",
        f"--config.dataset_kwargs.data_dir={fork / DATA}",
        "--config.num_steps=2",  # a cosine schedule needs decay_steps (num_steps) > warmup_steps (1)
        "--config.save_interval=2",
        "--config.frame_transform_kwargs.resize_size.primary=(256, 256)",
        "--config.window_size=1",
        "--config.traj_transform_kwargs.window_size=1",
    ]
    log = scratch / "pretrained.log"
    r = run_child(argv, scratch, env, log)
    if r["rc"]:
        return None, failed("making the pretrained model", argv, r["rc"], log)
    return next(save_dir.rglob("config.json")).parent, 0


def flags(fork: Path, model: Path, steps: int, save_dir: Path) -> list:
    return [
        f"--config={fork / CONFIG}",
        f"--config.pretrained_path={model}",
        f"--config.dataset_kwargs.data_dir={fork / DATA}",
        "--config.batch_size=8",
        f"--config.num_steps={steps}",
        # The config's 2,000 warm-up steps exceed a short run: optax's cosine schedule then fails on both sides.
        f"--config.optimizer.learning_rate.warmup_steps={min(WARMUP_STEPS, steps - 1)}",
        "--config.log_interval=1",
        f"--config.eval_interval={steps + 1}",
        f"--config.save_interval={steps + 1}",
        f"--config.save_dir={save_dir}",
        "--debug",
    ]


def steady(ends: list) -> Optional[float]:
    """Median step-to-step interval from the third step on (as octo-dist's summary computes ``median_step_s``)."""
    gaps = [b - a for a, b in zip(ends[1:], ends[2:])]
    return statistics.median(gaps) if gaps else None


def profiler(run_dir: Path, step: str, profile: bool) -> list:
    """The command prefix that runs a side under ``bench/step_profile.py`` (nothing for a timed run: the wrappers
    cost a little per call)."""
    if not profile:
        return [sys.executable]
    return [
        sys.executable,
        str(REPO / "bench" / "step_profile.py"),
        str(run_dir / "profile.json"),
    ] + [
        "--step",
        step,
    ]


def profiled(r: dict, run_dir: Path, profile: bool) -> dict:
    if not profile:
        return r
    from step_profile import breakdown

    return {**r, "profile": breakdown(json.loads((run_dir / "profile.json").read_text()))}


def run_fork(
    fork: Path, model: Path, steps: int, scratch: Path, env: dict, n, profile: bool = False
) -> Tuple[dict, int]:
    run_dir = scratch / f"fork-{n}"
    run_dir.mkdir()
    stamps = run_dir / "iteration_starts.json"
    argv = [
        *profiler(run_dir, "train_step", profile),
        str(REPO / "bench" / "fork_timing.py"),
        str(stamps),
        str(fork / "scripts" / "finetune.py"),
        *flags(fork, model, steps, run_dir / "runs"),
    ]
    r = run_child(argv, run_dir, env, run_dir / "log")
    if r["rc"]:
        return r, failed("the fork's finetune.py", argv, r["rc"], run_dir / "log")
    stamped = json.loads(stamps.read_text())
    ends = stamped["iteration_starts"][1:]  # iteration i+1 starts when step i is done
    r = {**r, "first_step_s": ends[0] - stamped["process_started"], "step_s": steady(ends)}
    return profiled(r, run_dir, profile), 0


def run_octo_dist(
    fork: Path,
    model: Path,
    steps: int,
    scratch: Path,
    env: dict,
    n,
    profile: bool = False,
    augment_on: Optional[str] = None,
) -> Tuple[dict, int]:
    run_dir = scratch / f"octo-dist-{augment_on or 'default'}-{n}"
    run_dir.mkdir()
    argv = [
        *profiler(run_dir, "compiled", profile),
        "-m",
        "octo_dist",
        "finetune",
        *flags(fork, model, steps, run_dir / "runs"),
        # octo-dist's own field, which the fork's config file lacks (finetune takes it all the same)
        *([f"--config.augment_on={augment_on}"] if augment_on else []),
    ]
    r = run_child(argv, run_dir, env, run_dir / "log")
    if r["rc"]:
        return r, failed("octo-dist finetune", argv, r["rc"], run_dir / "log")
    summary = json.loads(next((run_dir / "runs").rglob("summary.json")).read_text())
    # time_to_first_step_s: its process start -> first step done, as fork_timing.py measures the fork's
    r = {
        **r,
        "first_step_s": summary["time_to_first_step_s"],
        "step_s": summary["median_step_s"],
        "startup": summary.get("startup") or {},
        "beside": summary.get("startup_beside") or {},
    }
    return profiled(r, run_dir, profile), 0


def median_of(runs: list, key: str) -> Optional[float]:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


# The per-step breakdown's rows: label, the cell of one side's breakdown (bench/step_profile.breakdown), and
# the key whose ratio octo-dist / fork is printed (None: no ratio).
PROFILE_ROWS = (
    ("devices", lambda b: str(b["devices"]), None),
    ("step to step (ms)", lambda b: _ms(b["interval_s"]), "interval_s"),
    ("  the step's call (ms)", lambda b: _ms(b["step_s"]), "step_s"),
    ("  waiting for input (ms)", lambda b: _ms(b["input_s"]), None),
    ("  metric fetches (n, ms)", lambda b: f"{b['fetch_n']:.0f}, {_ms(b['fetch_s'])}", None),
    ("  host->device (n, ms)", lambda b: f"{b['h2d_n']:.0f}, {_ms(b['h2d_s'])}", None),
    ("  the rest (ms)", lambda b: _ms(b["other_s"]), None),
    (
        "host->device per step (MB)",
        lambda b: f"{(b['h2d_bytes'] + b['step_h2d_bytes'] + b['beside_h2d_bytes']) / 1e6:.2f}",
        None,
    ),
    ("  of it inside the step's call", lambda b: f"{b['step_h2d_bytes'] / 1e6:.2f}", None),
    ("beside the step, threads (ms)", lambda b: _ms(b["beside_s"]), None),
    ("compilations (steady steps)", lambda b: str(b["compile_n"]), None),
)


def report_profile(profiles: dict) -> None:
    """One profiled run of each, side by side: where a steady step's time goes (bench/step_profile.py)."""
    f, o = profiles.get("fork"), profiles.get("octo-dist")
    if not f or not o:
        print("per-step profile: too few steps recorded")
        return
    print(
        f"per-step profile, one run each under bench/step_profile.py (median of steps 3-{f['steps'] + 2}; the step's "
        "call waits for its work on a CPU, jax < 0.4.31):"
    )
    print(f"  {'':<32} {'fork':>10} {'octo-dist':>10} {'ratio':>6}")
    for label, cell, key in PROFILE_ROWS:
        shown = f"{o[key] / f[key]:.2f}" if key and f[key] else ""
        print(f"  {label:<32} {cell(f):>10} {cell(o):>10} {shown:>6}")


def report(runs: dict, a, fork: Path, model: Path) -> None:
    print(
        f"bench-startup-fork: fork = {fork}; pretrained = {model}; median of {a.rounds} run(s) each, "
        f"{a.steps} steps, one process, {os.cpu_count()} CPU(s)"
    )
    print(
        f"{'':<24} {'fork':>9} {'octo-dist':>10} {'ratio':>6} {'device-aug':>10} {'ratio':>6}  target "
        "(octo-dist as it runs by default)"
    )
    for key, label, scale, fmt in ROWS:
        f = median_of(runs["fork"], key)
        cell = lambda v: fmt.format(v * scale) if v is not None else "-"  # noqa: E731
        cells = ""
        for name in OURS:
            o = median_of(runs[name], key)
            ratio = f"{o / f:.2f}" if f and o is not None else "-"
            cells += f" {cell(o):>10} {ratio:>6}"
        target = f"<= {TARGETS[key]}" if TARGETS[key] is not None else ""
        print(f"{label:<24} {cell(f):>9}{cells}  {target}")
    for name in runs:
        each = ", ".join(
            f"{r['first_step_s']:.1f} s / {(r['step_s'] or 0) * 1e3:.0f} ms / {r['maxrss_mib']:.0f} MiB"
            for r in runs[name]
        )
        print(f"  {name} runs (first step / steady step / peak memory): {each}")
    steps = {n: [r["step_s"] for r in runs[n] if r.get("step_s")] for n in runs}
    if all(steps.values()):
        print(
            "  steady step min/median/max (ms): "
            + ", ".join(
                f"{n} {min(v) * 1e3:.0f}/{statistics.median(v) * 1e3:.0f}/{max(v) * 1e3:.0f}"
                for n, v in steps.items()
            )
        )
        for name in OURS:
            # each round's runs ran one after the other: their ratio is the least disturbed by a load that changes
            ratios = [o / f for f, o in zip(steps["fork"], steps[name])]
            print(
                f"  {name} / fork steady step, per round min/median/max: {min(ratios):.2f}/"
                f"{statistics.median(ratios):.2f}/{max(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"
            )
    for key, title in (("startup", "start-up phases"), ("beside", "work beside them")):
        phases = {}
        for r in runs["octo-dist"]:
            for phase, seconds in r[key].items():
                phases.setdefault(phase, []).append(seconds)
        print(
            f"octo-dist {title} (median s): "
            + (", ".join(f"{p} {statistics.median(v):.1f}" for p, v in phases.items()) or "none")
        )
    shown = flags(fork, model, a.steps, Path("<run>/runs"))
    print("command line (both, in a scratch directory; JAX_PLATFORMS=cpu WANDB_MODE=disabled):")
    print(
        f"  fork:      python bench/fork_timing.py <run>/iteration_starts.json {fork}/scripts/finetune.py \\"
    )
    print(f"               {shlex.join(shown)}")
    print(
        f"  octo-dist: python -m octo_dist finetune {shlex.join(shown)} (then --config.augment_on=device)"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--fork",
        help="the fork's source tree, holding scripts/finetune.py (default: the one the octo package is in)",
    )
    p.add_argument(
        "--pretrained",
        help="an Octo checkpoint directory (save_pretrained layout) (default: make a tiny one, see above)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="runs of each, alternating (default: %(default)s)"
    )
    p.add_argument(
        "--profile",
        type=int,
        default=1,
        help="profiled runs of each after the timed ones, for the per-step breakdown (0: none; default: "
        "%(default)s)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=60,
        help="--config.num_steps of each run (default: %(default)s)",
    )
    a = p.parse_args()
    if a.steps < 3 or a.rounds < 1:
        p.error(
            f"--steps {a.steps} --rounds {a.rounds}: expected 3 steps or more (a steady step needs them) "
            "and 1 round or more"
        )
    fork, why = locate_fork(a.fork)
    if fork is None:
        print(f"bench-startup-fork: skipped: {why}")
        return 0
    env = child_env(fork, bool(a.fork))
    with tempfile.TemporaryDirectory(prefix="octo-dist-startup-fork-") as tmp:
        scratch = Path(tmp)
        if a.pretrained:
            model = Path(a.pretrained).resolve()
        else:
            model, rc = make_pretrained(fork, scratch, env)
            if rc:
                return rc
        runs = {"fork": [], **{name: [] for name in OURS}}
        which = {
            "fork": run_fork,
            **{
                name: (lambda *args, on=on, **kw: run_octo_dist(*args, **kw, augment_on=on))
                for name, on in OURS.items()
            },
        }
        for n in range(a.rounds):
            order = list(runs)
            for name in order if n % 2 == 0 else order[::-1]:
                r, rc = which[name](fork, model, a.steps, scratch, env, n)
                if rc:
                    return rc
                runs[name].append(r)
                print(
                    f"  round {n + 1}: {name} first step {r['first_step_s']:.1f} s, wall {r['wall_s']:.1f} s",
                    flush=True,
                )
        report(runs, a, fork, model)
        profiles = {"fork": [], "octo-dist": []}
        for n in range(a.profile):
            for name in ("fork", "octo-dist"):
                r, rc = which[name](
                    fork, model, a.steps, scratch, env, f"profiled-{n}", profile=True
                )
                if rc:
                    return rc
                profiles[name].append(r["profile"])
        if a.profile:
            # the profiled run whose steady step is the median of its side's
            report_profile(
                {
                    n: sorted(p, key=lambda b: (b or {}).get("interval_s", 0))[len(p) // 2]
                    for n, p in profiles.items()
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
