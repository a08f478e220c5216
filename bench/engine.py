#!/usr/bin/env python3
"""Step time of N processes x 1 device vs 1 process x N devices, per train step and model size, side by side.

For each model (the tiny policy; the same transformer at Octo-Small's parameter count, ~27 M; a tiny Octo from
config when octo is importable) and each step function, runs bench/step_worker.py both ways on the CPU (the
environments of `octo-dist smoke --check-equivalence`) and prints: the all-reduces in the compiled step and their
bytes, the median steady step time both ways, their ratio (target <= 1.15; the step `auto` picks on the CPU is
marked `default`), and the effective all-reduce bandwidth (the step's all-reduce bytes over the time those same
all-reduces take alone between the processes), next to this machine's loopback TCP bandwidth, measured first in
the same run (the physical limit of gloo between local processes). Prints; asserts nothing.

usage: bench/engine.py [--models tiny octo-small-sized] [--step-fn jit shard_map] [--np 2] [--rounds R]
"""

import argparse
import importlib.util
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from octo_dist.apps.smoke import equivalence

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "bench" / "step_worker.py"
# model -> (global batch, steps, rounds): the big model's steps take about a second here, the tiny one's tens of ms,
# which the load of a shared machine blurs more (best of 3 rounds).
MODELS = {"tiny": (32, 20, 3), "octo-small-sized": (4, 5, 1), "octo": (8, 10, 1)}
LOOPBACK_BYTES = 256 << 20
LOOPBACK_TIMEOUT_S = 60
# The sender: connect to the port given and write the bytes given, 1 MiB at a time.
SENDER = (
    "import socket, sys\n"
    "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=%d)\n"
    "chunk = bytes(1 << 20)\n"
    "for _ in range(int(sys.argv[2]) >> 20): s.sendall(chunk)\n"
    "s.close()\n" % LOOPBACK_TIMEOUT_S
)


def loopback_bandwidth(nbytes: int = LOOPBACK_BYTES) -> float:
    """Bytes per second from one local process to another over TCP on 127.0.0.1 (``nbytes``, bounded in time)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(LOOPBACK_TIMEOUT_S)
        sender = subprocess.Popen(
            [sys.executable, "-c", SENDER, str(server.getsockname()[1]), str(nbytes)]
        )
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(LOOPBACK_TIMEOUT_S)
                buf = bytearray(4 << 20)
                got, start = 0, time.perf_counter()
                while got < nbytes:
                    n = conn.recv_into(buf)
                    if not n:
                        raise RuntimeError(f"loopback sender closed after {got} of {nbytes} bytes")
                    got += n
                elapsed = time.perf_counter() - start
        finally:
            sender.wait(timeout=LOOPBACK_TIMEOUT_S)
    return nbytes / elapsed


def run_pair(model: str, step_fn: str, np_: int, rounds, tmp: Path) -> dict:
    """Best-of-``rounds`` median step times of 1 process x N devices and N processes x 1 device, alternated."""
    batch, steps, model_rounds = MODELS[model]
    rounds = rounds or model_rounds
    base = [
        str(WORKER),
        "--model",
        model,
        "--step-fn",
        step_fn,
        "--global-batch",
        str(batch),
        "--steps",
        str(steps),
        "--init-timeout",
        "300",
    ]
    ref_env, dist_env = (dict(e, PYTHONPATH=str(REPO)) for e in equivalence.environments(np_))
    mpirun = equivalence.mpirun_path(sys.executable)
    runs = {
        "reference": ([sys.executable, *base, "--launcher", "single"], ref_env),
        "distributed": (
            [
                mpirun,
                "--oversubscribe",
                "-np",
                str(np_),
                sys.executable,
                *base,
                "--count-collectives",
            ],
            dist_env,
        ),
    }
    best = {}
    for r in range(rounds):  # alternate, so drift in the machine's load hits both alike
        for name, (argv, env) in runs.items():
            record = tmp / f"{model}-{step_fn}-{name}-{r}.json"
            proc = subprocess.run(
                [*argv, "--record", str(record)], env=env, cwd=REPO, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise SystemExit(
                    f"bench: {model} {step_fn} {name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
                )
            rec = json.loads(record.read_text())
            if name not in best or rec["step_time_median_s"] < best[name]["step_time_median_s"]:
                best[name] = rec
    return best


def main():
    from octo_dist.engine import parallel as engine

    p = argparse.ArgumentParser()
    p.add_argument(
        "--models",
        nargs="+",
        choices=tuple(MODELS),
        default=None,
        help="default: tiny, octo-small-sized, and octo when it is importable",
    )
    p.add_argument(
        "--step-fn", nargs="+", default=["jit", "shard_map"], choices=("jit", "shard_map")
    )
    p.add_argument("--np", type=int, default=2)
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="default: 3 for the tiny policy, 1 for the larger ones",
    )
    a = p.parse_args()
    models = a.models or ["tiny", "octo-small-sized"] + (
        ["octo"] if importlib.util.find_spec("octo") else []
    )
    if not a.models and "octo" not in models:
        print("(octo not importable: no tiny Octo row)")
    default = engine.resolve_step_fn("auto", "cpu", 2)  # both layouts run 2 devices
    loopback = max(loopback_bandwidth() for _ in range(2))
    print(
        f"loopback TCP, 127.0.0.1, one local process to another: {loopback / 1e9:.2f} GB/s "
        f"({LOOPBACK_BYTES >> 20} MiB, best of 2): the most gloo can move between local processes"
    )
    rounds = f"{a.rounds}" if a.rounds else "/".join(str(MODELS[m][2]) for m in models)
    print(
        f"median steady step time, best of {rounds} round(s); `{default}` is what step_fn='auto' (the default) runs "
        f"on the CPU; effective all-reduce bandwidth = the step's all-reduce bytes / the time they take alone "
        f"between the {a.np} processes"
    )
    head = (
        f"{'model':<17} {'params':>11} {'step':<18} {'all-reduces':>11} {'bytes':>9} "
        f"{f'1 proc x {a.np} dev':>14} {f'{a.np} proc x 1 dev':>14} {'ratio':>6}  "
        f"{'eff. all-reduce bw':>18} {'of loopback':>11}  reads/rank/step"
    )
    print(head)
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        for model in models:
            for fn in a.step_fn:
                r = run_pair(model, fn, a.np, a.rounds, Path(tmp))
                ref, dist = r["reference"], r["distributed"]
                nbytes = sum(dist["all_reduces"])
                bw = (
                    nbytes / dist["all_reduce_alone_s"]
                    if dist["all_reduce_alone_s"]
                    else float("nan")
                )
                label = fn + (" (default)" if fn == default else "")
                print(
                    f"{model:<17} {dist['params']:>11,} {label:<18} {len(dist['all_reduces']):>11} "
                    f"{nbytes / 1e6:>6.2f} MB {ref['step_time_median_s'] * 1e3:>11.1f} ms "
                    f"{dist['step_time_median_s'] * 1e3:>11.1f} ms "
                    f"{dist['step_time_median_s'] / ref['step_time_median_s']:>6.2f}  "
                    f"{bw / 1e9:>13.3f} GB/s {bw / loopback:>10.0%}  "
                    f"{dist['reads_per_step']} (expected {dist['global_batch'] // a.np})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
