"""The engine on forced CPU devices in one process, on the production pin jax 0.4.20 and on 0.4.22; pure checks."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, JAX020_PYTHON, PROGRAMS, REPO, clean_env, json_lines
from helpers import COMPILE_FAST, fast_version_runs
from octo_dist.engine import data
from octo_dist.engine import parallel
from octo_dist.runtime import compile_cache

NDEV = 4


@pytest.fixture(scope="module")
def sharding_runs(tmp_path_factory):
    # every comparison is within one program, compiled alike: fast (helpers.COMPILE_FAST)
    runs = fast_version_runs("sharding.py", NDEV, tmp_path_factory.mktemp("sharding"))
    yield runs
    runs.close()


@pytest.fixture(scope="module", params=["0.4.20", "0.4.22"])
def observed(request, sharding_runs):
    return sharding_runs.result(request.param)


def close(a, b, rel=1e-5):
    return all(abs(x - y) <= rel * max(abs(x), abs(y)) for x, y in zip(a, b)) and len(a) == len(b)


def test_runs_on_the_pinned_version_with_forced_devices(observed):
    assert observed["devices"] == NDEV
    assert observed["jax"] in ("0.4.20", "0.4.22")


def test_one_device_and_all_devices_give_the_same_losses(observed):
    losses = observed["losses"]
    assert close(losses["jit_one"], losses["jit_many"]), losses
    assert close(losses["jit_one"], losses["shard_map_many"]), losses
    assert close(losses["jit_one"], losses["shard_map_one"]), losses
    assert losses["jit_one"][-1] < losses["jit_one"][0]  # it learns


def test_a_step_compiled_ahead_from_shapes_in_a_thread_gives_the_same_losses(observed):
    """train.fit and the fine-tune job compile the step from the state's and batch's shapes beside other work;
    the executable then runs the steps as the step compiled on first call does (bit for bit on 0.4.22; 0.4.20's
    forced host devices reduce in varying order: two plain runs differ in the 7th digit there too)."""
    losses = observed["losses"]
    assert observed["compiled_ahead"] == {"jit": True, "shard_map": True}
    assert close(losses["jit_ahead"], losses["jit_many"]), losses
    assert close(losses["shard_map_ahead"], losses["shard_map_many"]), losses
    if observed["jax"] == "0.4.22":
        assert losses["jit_ahead"] == losses["jit_many"]
        assert losses["shard_map_ahead"] == losses["shard_map_many"]
    assert observed["compile_beside_s"] > 0


def test_inputs_are_batch_sharded_global_arrays_and_state_stays_replicated(observed):
    assert observed["batch_sharding"] == {
        "jit": "PartitionSpec('batch',)",
        "shard_map": "PartitionSpec('batch',)",
    }
    assert observed["replicated"] == {"jit": True, "shard_map": True}
    # numpy handed to the sharded step is an implicit transfer: the class of error that fails on several processes,
    # caught by the guard.
    assert "Disallowed host-to-device transfer" in observed["numpy_input"]


def test_the_checkpoint_template_is_the_state_by_shape_and_sharded_values_are_refused(observed):
    assert observed["template_matches"] and observed["template_is_abstract"]
    assert (
        observed["sharded_batch"].startswith("['action'] is sharded")
        and "expected replicated" in observed["sharded_batch"]
    )


def test_batch_sizes_at_ndev_plus_minus_one(observed):
    sizes = observed["batch_sizes"]
    assert sizes[str(NDEV)] == "ok"
    assert f"global batch {NDEV - 1} does not divide by the {NDEV} devices" in sizes[str(NDEV - 1)]
    assert f"use a global batch of {NDEV} or {2 * NDEV}" in sizes[str(NDEV + 1)]


def test_shard_map_replication_check_follows_the_jax_version(observed):
    erf = observed["erf_inv"]
    assert erf["default"] == "ok"
    if observed["jax"] == "0.4.20":
        assert observed["check_rep_default"] is False
        assert (
            "No replication rule for erf_inv" in erf["forced"]
        )  # why check_rep is off before 0.4.22
    else:
        assert observed["check_rep_default"] is True and erf["forced"] == "ok"


# --- pure -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "batch,procs,devs,expected", [(8, 2, 2, 4), (8, 1, 4, 8), (16, 2, 8, 8), (8, 8, 8, 1)]
)
def test_local_batch_size(batch, procs, devs, expected):
    assert data.local_batch_size(batch, procs, devs) == expected


@pytest.mark.parametrize("batch,devs", [(7, 2), (6, 4), (0, 2), (2, 4)])
def test_batches_that_do_not_divide_are_refused(batch, devs):
    with pytest.raises(data.BatchSizeError, match=f"expected .*multiple of {devs}"):
        data.local_batch_size(batch, 2, devs)


def test_synthetic_examples_do_not_depend_on_the_process_split():
    whole = data.SyntheticData(data.Spec(), 8, 0, 1, 2).batch(3)
    halves = [data.SyntheticData(data.Spec(), 8, p, 2, 2) for p in range(2)]
    parts = [h.batch(3) for h in halves]
    for a, b in (
        (whole["action"][:4], parts[0]["action"]),
        (whole["action"][4:], parts[1]["action"]),
    ):
        assert (a == b).all()
    assert [h.reads for h in halves] == [4, 4]  # each process made only its own examples
    assert not (
        parts[0]["observation"]["image_primary"] == parts[1]["observation"]["image_primary"]
    ).all()


def test_version_and_check_rep_parsing():
    assert parallel.version_tuple("0.4.20+cuda11.cudnn86") == (0, 4, 20)
    assert (
        parallel.default_check_rep("0.4.20") is False
        and parallel.default_check_rep("0.4.22") is True
    )


@pytest.mark.parametrize("version", ["0.4.20", "0.4.22"])
def test_persistent_compilation_cache_is_written_once_and_hit_by_the_next_process(
    version, tmp_path
):
    python = JAX020_PYTHON if version == "0.4.20" else Path(sys.executable)
    if not python.exists():
        pytest.skip("needs .venv-jax020 (make jax020-env)")
    env = clean_env(XLA_FLAGS="--xla_cpu_use_xla_runtime=true")
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [str(python), str(PROGRAMS / "compile_cache.py"), str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            env=env,
            timeout=HANG_S,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json_lines(proc.stdout)[-1])
    assert [r["jax"] for r in runs] == [version, version]
    assert [r["hit"] for r in runs] == [
        False,
        True,
    ]  # 0.4.20 via initialize_cache, 0.4.22 via the config option
    # Compiled ahead from shapes (lower().compile(), as the engine compiles the step): a hit too.
    assert [r["ahead_hit"] for r in runs] == [False, True]
    assert runs[0]["value"] == runs[1]["value"]
    entries = [p.name for p in (tmp_path / "cache").iterdir()]
    assert entries and not any(n.startswith("_temp_") for n in entries)


def test_the_compile_cache_is_on_by_default_where_jax_can_cache():
    home = {"HOME": "/home/u"}
    assert compile_cache.default_directory("gpu", home) == "/home/u/.cache/octo-dist/compile-cache"
    assert (
        compile_cache.default_directory("gpu", {**home, "XDG_CACHE_HOME": "/scratch/u/cache"})
        == "/scratch/u/cache/octo-dist/compile-cache"
    )
    # On the CPU JAX caches only under XLA's other runtime.
    assert compile_cache.default_directory("cpu", home) is None
    runtime_flags = {
        **home,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2 " + compile_cache.CPU_RUNTIME_FLAG,
    }
    assert (
        compile_cache.default_directory("cpu", runtime_flags)
        == "/home/u/.cache/octo-dist/compile-cache"
    )
    assert compile_cache.default_directory("gpu", {}) is None  # no home to put it in
    # A directory given wins; "off" turns the default off too.
    assert compile_cache.resolve("/groups/g/cache", "gpu", home) == "/groups/g/cache"
    assert (
        compile_cache.resolve("off", "gpu", home) is None and compile_cache.problem("off") is None
    )
    assert compile_cache.resolve(None, "gpu", home) == "/home/u/.cache/octo-dist/compile-cache"


def test_a_cache_directory_that_cannot_be_made_leaves_the_job_compiling_without_it(
    tmp_path, caplog
):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level("WARNING"):
        assert compile_cache.enable(str(blocker / "cache")) is None
    assert f"compile cache {blocker / 'cache'} cannot be created" in caplog.text
    assert "compiling without it. Fix: --compile-cache <a writable directory>" in caplog.text


def test_the_next_batch_is_made_before_the_previous_steps_metrics_are_read(tmp_path):
    """The host prepares batch k+1 while step k runs and reads step k-1's metrics only then; a stop signal seen in
    step k's metrics ends the run after the step already dispatched, checkpointed, with the same losses."""
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "fit_order.py"), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=clean_env(XLA_FLAGS=COMPILE_FAST),
        timeout=HANG_S,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json_lines(proc.stdout)[-1]
    order = [tuple(e) for e in out["order"]]
    steps = 6
    assert [s for kind, s in order if kind == "make"] == list(
        range(steps)
    )  # no batch made beyond the last step
    assert [s for kind, s in order if kind == "read"] == list(range(steps))
    for k in range(steps - 2):
        # batch k+2 (for the step after next) is in hand before step k's metrics are read
        assert order.index(("make", k + 2)) < order.index(("read", k)), order
    # The host's time making batch k+1 while step k ran: every step but the last, at least the source's delay,
    # sent to the tracker beside the step time (the summary's data-bound / compute-bound figure).
    assert sorted(map(int, out["input_s"])) == list(range(steps - 1))
    assert all(v >= 0.05 for v in out["input_s"].values()), out["input_s"]
    assert [out["logged"][str(k)]["timer/input_s"] for k in range(steps - 1)] == [
        out["input_s"][str(k)] for k in range(steps - 1)
    ]
    assert "timer/input_s" not in out["logged"][str(steps - 1)]
    stopped = out["stopped"]
    # SIGUSR1 arrives while step 1 is read (step 2 already dispatched): step 3 carries it, it is read after step 4
    # was dispatched, so the run ends after step 4, reading every step it ran.
    assert stopped["stopped_by"] == "SIGUSR1" and stopped["end_step"] == 5, stopped
    assert sorted(map(int, stopped["losses"])) == list(range(5))
    assert all(stopped["losses"][k] == out["losses"][k] for k in stopped["losses"])
    assert (tmp_path / "ckpt" / "5").is_dir()
