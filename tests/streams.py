"""The suite as `make test` runs it as root (CI): five pytests side by side, each cluster stream on a namespace
cluster of its own (OCTOSIM_INSTANCE), its log printed after the rest; one exit status.

    python tests/streams.py              # every stream: the rest in the foreground, the others logged
    python tests/streams.py --list       # each stream's pytest commands, nothing run
    python tests/streams.py --only pbs   # one stream, in the foreground

A cluster stream runs its cluster tests (``-m cluster``) first, then the files it takes ``beside`` them (tests that
mostly wait: paced ranks, fake launchers, a full disk), chosen so that the streams end together. Every other file
is the rest's, a new test file included: no list to edit. The real schedulers' streams run the long scenarios too
(OCTO_DIST_CLUSTER_LONG=1: cancels, lost nodes, minutes each and mostly waiting).

The PBS stream's own tests and test_qdel_stops.py are the longest pair; the Slurm stream's jobs run one rank per
node, so it takes the small files. A fresh-clone CI on 2 cores (nothing else running; load average 8-21 from its
own streams and the image build) ended the streams at: the rest 1587 s, PBS 898 + 581 s, the cluster one 1096 + 317
s, Slurm 890 + 444 s, Grid Engine 707 + 499 s (cluster tests + the files beside them); the rest then gave
test_run_layout, test_engine_ahead and test_bench_fork (202 s there) to Grid Engine, test_decode_scale and
test_convert_frames (about 90 s) to Slurm. The next CI, beside other work (load 16-25), printed each command's time
(CPU: the pytest and what it waited for; a namespace cluster's ranks run under its daemons and are not counted):
the rest 2118 s wall / 537 s CPU; Grid Engine 945 + 988 s (378 s CPU beside); Slurm 1059 + 859; PBS 1249 + 830; the
cluster one 1407 + 582. Then test_engine, test_stop_signals and test_inherited_signals, beside Grid Engine's, became
about 190 s of CPU cheaper, and it took test_rank_zero_first (mostly waiting ranks, 112 s alone) and
test_stop_status_first from the rest. A quiet fresh-clone CI then took 1577 s (venvs 105 s): the rest 1381 s wall /
377 s CPU, PBS 956 + 516 s, the cluster one 1048 + 351, Slurm 897 + 505, Grid Engine 796 + 392. Swapping Grid
Engine's and PBS's files beside made it longer (the rest 1458 s; test_qdel_stops still running at 1625 s).
Then the cluster tests ran fewer jobs (PBS's stream 693 -> 289 s of CPU alone), and PBS's stream took
test_checkpoint_integrity from the cluster one and test_frames, test_device_resize and test_summary from the rest:
a quiet fresh-clone CI took 1150 s (venvs 83 s): the rest 1015 s wall / 284 s CPU, the cluster one 879 + 187, Slurm
543 + 465, Grid Engine 579 + 317 (its h_rt chain 120 s longer since), PBS 432 + 498. Then every cluster job, and
every run one is compared with, compiled fast (helpers.COMPILE_FAST), and the chains' stop windows came from
start-ups measured just before: a quiet fresh-clone CI took 806 s (venvs 78 s): the rest 726 s, the cluster one
415 + 229, Slurm 327 + 334, Grid Engine 412 + 275, PBS 378 + 320. Then test_stop_during_startup went beside the
cluster tests and test_watchdog_child beside Grid Engine's: a quiet fresh-clone CI took 917 s (venvs 88 s; the rest
829 s, the cluster one 552 + 254, Slurm 370 + 399, Grid Engine 446 + 334, PBS 446 + 365), on a machine slower than
before. Its load average was 15-20 while the four cluster streams started their multi-node jobs at once, and a
2-rank job's start-up took 5-8 times its time alone (a compilation of 22 s instead of 3). Grid Engine's and PBS's
streams then ran their files beside first (``cluster_last``): the longest test went from 149 to 112 s, the CI took
951 s; Open MPI 4.1's 2 x 2 job (21 s alone, 81-151 s in CI) then went to the Slurm stream's first half, and
test_decode_scale and test_convert_frames from there to the cluster one's files beside. Two quiet fresh-clone CIs
took 1118 and 1069 s (the rest 909 and 900 s, PBS 732 + 272 and 652 + 320, the cluster one 420 + 432 and 375 + 499,
Slurm 459 + 395 and 468 + 409, Grid Engine 496 + 320 and 490 + 359); the Open MPI 4.1 job took 80 and 124 s at the
end of Slurm's cluster tests. It went to the end of Grid Engine's stream, where the other streams have ended, and
test_summary from PBS's files beside to Slurm's. Three quiet fresh-clone CIs after that took 1109, 1073 and 1183 s
(the rest 992, 890 and 1078 s: the machine's own speed varies that much); their longest tests were 113, 109 and
130 s, a different one each time among about ten single jobs of 4 JAX start-ups (20 s alone, 85-130 s here). On
the next machine, faster (the rest 837-860 s), the Slurm stop chain (99 s) became two tests, and a Slurm job's node
probe no longer hangs when a node is lost while it runs (the lost-node test took 145 s once: its job ended 89 s after
the fault): quiet fresh-clone CIs took 1015, 964 and 1048 s, their longest tests 99, 145 (that probe) and 106 s (the
lost-node test: a job to its first checkpoint, then 37 s to its end); beside two busy processes 1480 s, green.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"


@dataclasses.dataclass(frozen=True)
class Stream:
    name: str
    title: str  # what its cluster tests are, for the log's heading
    instance: str | None  # OCTOSIM_INSTANCE; None: the caller's (cluster 0 by default)
    cluster: tuple[
        str, ...
    ]  # globs under tests/ for its -m cluster run; () : every cluster file no other claims
    beside: tuple[str, ...]  # files under tests/ run beside them (-m "not cluster")
    log: str
    # Its files beside first, then its cluster tests: the streams' multi-node jobs, each several JAX start-ups at
    # once, do not all compete for the cores at the start (see the module's docstring).
    cluster_last: bool = False

    @property
    def long(
        self,
    ) -> bool:  # the real schedulers' (and the PBS imitation's) cancel and lost-node scenarios
        return self.instance is not None


STREAMS = (
    Stream(
        "cluster",
        "the cluster tests",
        None,
        (),
        (
            "test_launch.py",
            "test_launch_injection.py",
            "test_stop_during_startup.py",
            "test_decode_scale.py",
            "test_convert_frames.py",
        ),
        ".cluster/suite.log",
    ),
    Stream(
        "slurm",
        "the real Slurm tests",
        "1",
        ("test_cluster_slurm*.py",),
        (
            "test_runtime.py",
            "test_validate.py",
            "test_step_collectives.py",
            "test_gather.py",
            "test_disk_full.py",
            "test_chain_exit_file.py",
            "test_rank_guard_orphans.py",
            "test_stop_signal_burst.py",
            "test_bench_input.py",
            "test_augment.py",
            "test_summary.py",
        ),
        ".cluster/slurm.log",
    ),
    Stream(
        "gridengine",
        "the real Grid Engine tests",
        "2",
        # Open MPI 4.1's 2 x 2 job in the image (eight JAX start-ups) last of all, when the other streams have
        # ended: 21 s alone, 80-151 s anywhere earlier.
        ("test_cluster_gridengine*.py", "test_cluster_mpi41.py"),
        (
            "test_engine.py",
            "test_inherited_signals.py",
            "test_stop_signals.py",
            "test_run_layout.py",
            "test_engine_ahead.py",
            "test_bench_fork.py",
            "test_rank_zero_first.py",
            "test_stop_status_first.py",
            "test_watchdog_child.py",
        ),
        ".cluster/gridengine.log",
        cluster_last=True,
    ),
    Stream(
        "pbs",
        "the PBS tests, against its imitation",
        "3",
        ("test_cluster_pbs*.py",),
        (
            "test_qdel_stops.py",
            "test_checkpoint_integrity.py",
            "test_frames.py",
            "test_device_resize.py",
        ),
        ".cluster/pbs.log",
        cluster_last=True,
    ),
)
PYTEST = [sys.executable, "-m", "pytest"]
# The streams share the checkout: no cache writes racing each other.
STREAM_PYTEST = [*PYTEST, "-p", "no:cacheprovider"]
STOPPING = threading.Event()  # set on SIGINT/SIGTERM: no stream starts its next command


def claimed(pattern: str) -> list[str]:
    return sorted(str(p.relative_to(REPO)) for p in TESTS.glob(pattern))


def commands(stream: Stream | None) -> list[tuple[dict, list[str]]]:
    """``(environment additions, argv)`` in order: a cluster stream's, or the rest's (``None``)."""
    if stream is None:
        beside = [f"tests/{f}" for s in STREAMS for f in s.beside]
        return [({}, [*PYTEST, "-m", "not cluster", "--durations=30", *ignoring(beside)])]
    env = (
        {"OCTOSIM_INSTANCE": stream.instance, "OCTO_DIST_CLUSTER_LONG": "1"} if stream.long else {}
    )
    if stream.cluster:
        cluster = [f for g in stream.cluster for f in claimed(g)]
    else:  # every cluster test the real schedulers' streams do not run
        cluster = ignoring([f for s in STREAMS for g in s.cluster for f in claimed(g)])
    ordered = [
        (env, [*STREAM_PYTEST, "-m", "cluster", "--durations=15", *cluster]),
        (
            {},
            [*STREAM_PYTEST, "-m", "not cluster", "--durations=10"]
            + [f"tests/{f}" for f in stream.beside],
        ),
    ]
    return ordered[::-1] if stream.cluster_last else ordered


def ignoring(files: list[str]) -> list[str]:
    return [f"--ignore={f}" for f in files]


def shell_line(env: dict, argv: list[str]) -> str:
    return " ".join([*(f"{k}={v}" for k, v in env.items()), *map(shlex.quote, argv)])


def run(stream: Stream | None, out, procs: list) -> int:
    """Run a stream's commands one after the other (each in a session of its own, so an interrupt ends exactly
    them); its status: 0, or the last non-zero one."""
    status = 0
    for env, argv in commands(stream):
        if STOPPING.is_set():
            return 1
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        status = waited(proc, stream.name if stream else "rest", argv) or status
    return status


TIMES: list[
    str
] = []  # a line per command run: its stream, wall and CPU seconds (what balancing reads)


def waited(proc: subprocess.Popen, name: str, argv: list[str]) -> int:
    """Wait for ``proc`` and note its wall and CPU time: user + system of the pytest and every process it waited
    for (a launcher waits for its ranks), so a stream that mostly sleeps shows it, e.g.
    ``pbs -m cluster: 898 s wall, 212 s cpu``."""
    start = time.monotonic()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    args = argv[3:]  # after `python -m pytest`
    marker = args[args.index("-m") + 1]
    TIMES.append(
        f"{name} -m {marker!r}: {time.monotonic() - start:.0f} s wall,"
        f" {usage.ru_utime + usage.ru_stime:.0f} s cpu"
    )
    return proc.returncode


def run_all(procs: list) -> int:
    # 1 until a stream's commands have all run: a stream whose thread failed is not counted as passed
    statuses = {"rest": 1, **{s.name: 1 for s in STREAMS}}

    def logged(stream: Stream) -> None:
        log = REPO / stream.log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            statuses[stream.name] = run(stream, out, procs)

    threads = [threading.Thread(target=logged, args=(s,), daemon=True) for s in STREAMS]
    for t in threads:
        t.start()
    statuses["rest"] = run(None, None, procs)
    for t in threads:
        t.join()
    for s in STREAMS:
        print(
            f"---- {s.title}, then {' '.join(s.beside)} (beside the rest; {s.log}) ----", flush=True
        )
        log = REPO / s.log
        sys.stdout.write(log.read_text(errors="replace") if log.exists() else "(no log)\n")
    print("---- each command's time (wall, and CPU of it and what it waited for) ----")
    print("\n".join(TIMES))
    print(
        f"---- exit status: {', '.join(f'{k} {v}' for k, v in statuses.items())} ----", flush=True
    )
    return 0 if not any(statuses.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["rest", *(s.name for s in STREAMS)]
    parser.add_argument(
        "--list", action="store_true", help="print each stream's pytest commands; run nothing"
    )
    parser.add_argument("--only", choices=names, help="run this stream alone, in the foreground")
    args = parser.parse_args(argv)
    by_name = {s.name: s for s in STREAMS}
    if args.list:
        for name in names:
            for env, cmd in commands(by_name.get(name)):
                print(f"{name}: {shell_line(env, cmd)}")
        return 0
    procs: list = []

    def stop(signum, frame):
        STOPPING.set()
        for p in procs:
            if p.returncode is not None:  # reaped: its pid may be another process's by now
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)  # its own session: the pytest and what it started
            except ProcessLookupError:  # that command had ended
                pass
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.only:
        return run(by_name.get(args.only), None, procs)
    return run_all(procs)


if __name__ == "__main__":
    sys.exit(main())
