"""``octo-dist validate``: the NCCL log parser on recorded lines, the verdicts over fabricated records, and the
command for real on the CPU (one process, and a 2-rank mpirun reporting through rank 0's file)."""

import json
import subprocess
import sys

import pytest

import helpers
from helpers import COMPILE_FAST, HANG_S, REPO, clean_env
from octo_dist.apps.validate import allreduce, app, nccl_log, scaling
from octo_dist.apps.validate.report import FAIL, OK, SKIP

# Recorded NCCL 2.19 INFO lines (host names and addresses changed): 2 H nodes x 8 GPUs over InfiniBand. A backslash
# at the end of a line continues it: the string holds each recorded line whole.
NCCL_IB = """\
NCCL version 2.19.3+cuda11.8
hnode001:81234:81234 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.1<0>
hnode001:81234:81234 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so), using internal implementation
hnode001:81234:81301 [0] NCCL INFO NET/IB : Using [0]mlx5_ibn1:1/IB [1]mlx5_ibn2:1/IB [2]mlx5_ibn3:1/IB \
[3]mlx5_ibn4:1/IB ; OOB ib0:10.1.0.1<0>
hnode001:81234:81301 [0] NCCL INFO Using network IB
hnode001:81234:81301 [0] NCCL INFO comm 0x55d0c8f0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 \
commId 0x9f3a - Init START
hnode001:81234:81301 [0] NCCL INFO Channel 00/0 : 15[7] -> 0[0] [receive] via NET/IB/0/GDRDMA
hnode001:81234:81301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read
hnode001:81234:81301 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1/GDRDMA
hnode001:81234:81301 [0] NCCL INFO Connected all rings
hnode001:81234:81301 [0] NCCL INFO comm 0x55d0c8f0 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 \
commId 0x9f3a - Init COMPLETE
"""
# The same job from an image without libibverbs: NCCL falls back to TCP sockets.
NCCL_SOCKET = """\
NCCL version 2.19.3+cuda11.8
hnode002:1111:1111 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.2<0>
hnode002:1111:1180 [0] NCCL INFO Failed to open libibverbs.so[.1]
hnode002:1111:1180 [0] NCCL INFO NET/Socket : Using [0]ib0:10.1.0.2<0> [1]eth0:172.16.0.2<0>
hnode002:1111:1180 [0] NCCL INFO Using network Socket
hnode002:1111:1180 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0
hnode002:1111:1180 [0] NCCL INFO Channel 00/0 : 8[0] -> 9[1] via P2P/IPC
hnode002:1111:1180 [0] NCCL INFO comm 0x7f00 rank 8 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 \
commId 0x9f3a - Init COMPLETE
"""
NCCL_DISABLED = """\
hnode003:2222:2222 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
hnode003:2222:2290 [0] NCCL INFO NET/Socket : Using [0]ib0:10.1.0.3<0>
hnode003:2222:2290 [0] NCCL INFO Using network Socket
"""
# One node, 8 GPUs: no network channel at all.
NCCL_ONE_NODE = """\
hnode001:5555:5600 [3] NCCL INFO Using network IB
hnode001:5555:5600 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[4] via P2P/IPC/read
hnode001:5555:5600 [3] NCCL INFO Channel 01/0 : 3[3] -> 4[4] via SHM/direct/direct
"""


def test_parser_reads_infiniband_from_recorded_lines():
    s = nccl_log.parse(NCCL_IB.splitlines())
    assert s["version"] == "2.19.3+cuda11.8" and s["network"] == "IB" and s["nranks"] == 16
    assert s["ib_devices"] == ["mlx5_ibn1", "mlx5_ibn2", "mlx5_ibn3", "mlx5_ibn4"]
    assert s["transports"] == ["NET/IB", "P2P/IPC"] and s["gdrdma"] and not s["ib_missing"]
    assert nccl_log.inter_node(s) == "IB"


def test_parser_reads_the_socket_fallback_and_why():
    s = nccl_log.parse(NCCL_SOCKET.splitlines())
    assert (
        s["network"] == "Socket"
        and s["ib_missing"]
        and s["transports"] == ["NET/Socket", "P2P/IPC"]
    )
    assert nccl_log.inter_node(s) == "Socket"
    d = nccl_log.parse(NCCL_DISABLED.splitlines())
    assert d["ib_disabled"] and nccl_log.inter_node(d) == "Socket"
    assert nccl_log.parse([])["lines"] == 0 and nccl_log.inter_node(nccl_log.parse([])) is None


def test_channel_lines_win_over_the_using_network_line():
    mixed = NCCL_IB.replace("via NET/IB/1/GDRDMA", "via NET/Socket/1")
    assert nccl_log.inter_node(nccl_log.parse(mixed.splitlines())) == "Socket"


def test_judge_infiniband_ok_sockets_fail_with_the_reason():
    ib = nccl_log.parse(NCCL_IB.splitlines())
    ok, found, _ = nccl_log.judge({0: ib, 8: ib}, hosts=2)
    assert ok and "network IB" in found
    ok, found, fix = nccl_log.judge({0: ib, 8: nccl_log.parse(NCCL_SOCKET.splitlines())}, hosts=2)
    assert not ok and "rank(s) [8] all-reduce over TCP sockets between 2 hosts" in found
    assert "libibverbs missing" in found and "libibverbs1" in fix
    ok, found, _ = nccl_log.judge({0: nccl_log.parse(NCCL_DISABLED.splitlines())}, hosts=2)
    assert not ok and "NCCL_IB_DISABLE=1 is set" in found
    ok, found, _ = nccl_log.judge({0: nccl_log.parse(NCCL_ONE_NODE.splitlines())}, hosts=1)
    assert ok and "one host" in found and "P2P/IPC" in found and "SHM/direct" in found
    ok, found, _ = nccl_log.judge({0: ib, 1: nccl_log.parse([])}, hosts=2)
    assert not ok and "no NCCL INFO line from rank(s) [1]" in found


def test_scaling_efficiency_and_verdict():
    one = {"step_time_median_s": 0.010, "devices": 1, "global_batch": 8, "platform": "gpu"}
    good = {"step_time_median_s": 0.0125, "devices": 8, "global_batch": 64, "platform": "gpu"}
    bad = {"step_time_median_s": 0.040, "devices": 8, "global_batch": 64, "platform": "gpu"}
    assert scaling.efficiency(one, good) == pytest.approx(0.8)
    assert scaling.judge(one, good, 0.6, judged=True).status == OK
    step = scaling.judge(one, bad, 0.6, judged=True)
    assert (
        step.status == FAIL
        and "efficiency 0.25" in step.found
        and step.expected == "efficiency >= 0.60"
    )
    assert scaling.judge(one, bad, 0.6, judged=False).status == OK  # CPU devices: shown, not judged
    assert scaling.judge(one, {"devices": 8}, 0.6, judged=True).status == FAIL


def test_bus_bandwidth_factor_follows_nccl_tests():
    assert (
        allreduce.bus_factor(2) == 1.0
        and allreduce.bus_factor(8) == 1.75
        and allreduce.bus_factor(1) == 0.0
    )


def record(rank, host, platform="gpu", nccl=NCCL_IB, failures=(), total=None):
    bench = {
        "devices": 16,
        "bytes": 64 * 2**20,
        "iterations": 20,
        "median_s": 0.002,
        "algbw_gbs": 33.5,
        "busbw_gbs": 62.9,
        "sum": 16.0 if total is None else total,
        "sum_expected": 16.0,
    }
    return {
        "rank": rank,
        "host": host,
        "platform": platform,
        "env_failures": list(failures),
        "allreduce": bench,
        "nccl": nccl_log.parse(nccl.splitlines()) if platform == "gpu" else None,
    }


def by_name(steps):
    return {s.name: s for s in steps}


def test_across_nodes_verdicts_from_fabricated_records():
    good = by_name(app.across_steps([record(0, "h1"), record(8, "h2")], gpu_profile=True))
    assert [good[n].status for n in ("environment", "allreduce", "transport", "scaling")] == [
        OK,
        OK,
        OK,
        SKIP,
    ]
    assert "busbw 62.90 GB/s" in good["allreduce"].found
    sockets = by_name(
        app.across_steps([record(0, "h1"), record(8, "h2", nccl=NCCL_SOCKET)], gpu_profile=True)
    )
    assert sockets["transport"].status == FAIL and "TCP sockets" in sockets["transport"].found
    cpu = by_name(
        app.across_steps([record(0, "h1", "cpu"), record(1, "h2", "cpu")], gpu_profile=True)
    )
    assert (
        cpu["environment"].status == FAIL
        and "GPU profile on the CPU backend" in cpu["environment"].found
    )
    assert cpu["transport"].status == SKIP and "gloo" in cpu["transport"].found
    env = by_name(
        app.across_steps(
            [record(0, "h1", failures=["pin.scipy"]), record(1, "h1")], gpu_profile=True
        )
    )
    assert env["environment"].status == FAIL and "rank(s) 0: pin.scipy" in env["environment"].found
    wrong = by_name(
        app.across_steps([record(0, "h1"), record(1, "h1", total=15.0)], gpu_profile=True)
    )
    assert (
        wrong["allreduce"].status == FAIL and "wrong sum on rank(s) [1]" in wrong["allreduce"].found
    )


def test_the_nccl_log_goes_to_one_file_per_rank(tmp_path):
    env = app.nccl_environment(str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == f"{tmp_path}/nccl.%h.%p.log"
    (tmp_path / "nccl.hnode001.81234.log").write_text(NCCL_IB)
    assert nccl_log.parse(app.read_nccl_logs(str(tmp_path)))["network"] == "IB"


def test_visible_gpus():
    listed = ["GPU 0: NVIDIA H200", "GPU 1: NVIDIA H200"]
    assert app.visible_gpus({}, listed) == ["0", "1"]
    assert app.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,5"}, listed) == ["3", "5"]
    assert app.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, listed) == []


def validate(*argv, env=None, timeout=HANG_S):
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", "validate", *argv],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        cwd=REPO,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--steps", "2"], "--steps 2: expected >= 5"),
        (["--min-efficiency", "1.5"], "expected a number in (0, 1]"),
        (["--cpu-devices", "1"], "expected 0 (skip) or >= 2"),
        (["--allreduce-mib", "0"], "--allreduce-mib 0"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(argv, message):
    proc = validate(*argv, timeout=HANG_S)
    assert (
        proc.returncode == 2
        and message in proc.stderr
        and len(proc.stderr.strip().splitlines()) == 1
    )


def test_on_the_cpu_it_reports_the_cpu_backend_and_skips_what_needs_a_gpu(tmp_path):
    # Waits for check-env --deep (imports jax in a subprocess) on a loaded 2-core machine: generous timeout.
    proc = validate("--json", "--report", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert rep == json.loads((tmp_path / "r.json").read_text())
    steps = {s["name"]: s for s in rep["steps"]}
    assert rep["backend"] == "cpu" and rep["profile"] == "cpu" and rep["ok"]
    assert steps["environment"]["status"] == OK and "cpu backend" in steps["environment"]["found"]
    assert steps["scaling"]["status"] == SKIP and "needs GPUs" in steps["scaling"]["found"]
    assert steps["transport"]["status"] == SKIP and "mpirun" in steps["transport"]["found"]


def test_a_gpu_profile_on_this_cpu_machine_fails_the_environment():
    proc = validate("--profile", "cuda11")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "FAIL  environment" in proc.stdout
        and "fix: octo-dist check-env --deep --profile cuda11" in proc.stdout
    )
    assert "octo-dist validate: FAILED: environment" in proc.stdout


@pytest.mark.slow
def test_scaling_runs_the_smoke_job_twice_on_forced_cpu_devices(tmp_path):
    # The fewest steps validate takes (5); both runs compiled alike, fast (helpers.COMPILE_FAST: validate adds its
    # forced device count to the caller's XLA_FLAGS): what is tested is the two runs and their report.
    proc = validate(
        "--cpu-devices",
        "2",
        "--steps",
        "5",
        "--report",
        str(tmp_path / "r.json"),
        env=clean_env(XLA_FLAGS=COMPILE_FAST),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    step = {s["name"]: s for s in json.loads((tmp_path / "r.json").read_text())["steps"]}["scaling"]
    assert step["status"] == OK and "shown, not judged" in step["found"]
    assert step["data"]["one"]["devices"] == 1 and step["data"]["all"]["devices"] == 2
    assert step["data"]["all"]["global_batch"] == 2 * step["data"]["one"]["global_batch"]
    assert step["data"]["efficiency"] > 0


@pytest.mark.mpi
def test_under_a_real_2_rank_mpirun_rank_0_reports_allreduce_and_skips_nccl(mpirun, tmp_path):
    report = tmp_path / "r.json"
    proc = mpirun(
        2,
        "-m",
        "octo_dist",
        "validate",
        "--allreduce-mib",
        "1",
        "--iterations",
        "3",
        "--report",
        str(report),
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(report.read_text())  # written by rank 0 alone; stdout is not parsed
    steps = {s["name"]: s for s in rep["steps"]}
    assert rep["mode"] == "across" and rep["processes"] == 2 and rep["backend"] == "cpu"
    assert (
        steps["environment"]["status"] == OK
        and "2 ranks on 1 host(s)" in steps["environment"]["found"]
    )
    assert steps["allreduce"]["status"] == OK and steps["allreduce"]["data"]["rank0"]["sum"] == 2.0
    assert steps["allreduce"]["data"]["rank0"]["bytes"] == 2**20
    assert steps["transport"]["status"] == SKIP and "gloo" in steps["transport"]["found"]


@pytest.mark.slow
def test_make_validate_gpu_runs_here_on_the_cpu():
    env = clean_env()
    env.pop("MAKEFLAGS", None)
    proc = helpers.run(
        [
            "make",
            "-s",
            "validate-gpu",
            f"VALIDATE_CMD={sys.executable} -m octo_dist",
            "VALIDATE_ARGS=--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["backend"] == "cpu" and rep["ok"]
