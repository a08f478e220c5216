"""The other ranks wait for rank 0's dataset (its statistics pass) on the coordination service, not in a collective:
as long as it takes, saying what they wait for, and ending with rank 0's error when it fails. Real mpirun, 2 ranks,
``OctoData`` as ``octo-dist finetune`` builds it (tests/programs/rank_zero_first.py), rank 0's build fabricated."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import helpers
from helpers import HANG_S, JAX_PYTHONS, PROGRAMS, REPO, clean_env, tail

from octo_dist.runtime import rankwait

PROGRAM = str(PROGRAMS / "rank_zero_first.py")


def rank_json(out: str) -> dict:
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


@pytest.fixture(scope="module")
def each_rank_slow(tmp_path_factory) -> dict:
    """Both waits, each over 30 s of waiting by nature, in two runs side by side (mostly asleep: the wall time of
    one wait, the start-up of two): in ``"slow"`` rank 0's build ends 40 s after rank 1 began waiting for it, in
    ``"slow1"`` rank 1's ends 40 s after rank 0's. Mode -> the finished run."""
    exe = Path(sys.executable).parent / "mpirun"
    if not exe.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")

    def run(mode: str):
        work = tmp_path_factory.mktemp(mode)
        return helpers.run_mpirun(
            exe, 2, [PROGRAM, mode, str(work)], out_dir=work / "ranks", timeout=HANG_S
        )

    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(MODES, pool.map(run, MODES)))
    for proc in runs.values():
        (out0, err0), (out1, err1) = proc.ranks
        assert proc.returncode == 0, tail(err0, 3000) + tail(err1, 3000)
    return runs


MODES = ("slow", "slow1")


@pytest.mark.mpi
@pytest.mark.slow
def test_rank_1_outwaits_a_rank_0_slower_than_a_collectives_set_up_and_says_what_it_waits_for(
    each_rank_slow,
):
    """Before: rank 1 waited in ``sync_global_devices``, whose gloo set-up gives up after 30 s ("GetKeyValue() timed
    out"): rank 0's statistics pass of minutes ended the job. Rank 0 here finishes 40 s after rank 1 began waiting."""
    (out0, _), (out1, err1) = each_rank_slow["slow"].ranks
    ranks = [rank_json(out0), rank_json(out1)]
    assert [r["builds"] for r in ranks] == [1, 1]
    # The collective after the wait ran: both ranks hold both first batches.
    assert ranks[0]["first_batches"] == ranks[1]["first_batches"]
    waits = re.findall(r"rank 1: waiting for rank 0 to build the dataset.*: (\d+) s so far", err1)
    assert waits, err1
    assert "statistics" in err1
    assert int(waits[-1]) >= 30  # it said so while waiting past where the collective gave up


@pytest.mark.mpi
@pytest.mark.slow
def test_rank_0_waits_for_rank_1_to_build_before_its_next_collective(each_rank_slow):
    """Rank 1 builds after rank 0 (from the statistics rank 0 cached); before, rank 0 went straight on to its next
    collective and gave up there after 30 s when rank 1's build took longer. Here it ends 40 s after rank 0's."""
    (out0, err0), (out1, _) = each_rank_slow["slow1"].ranks
    assert rank_json(out0)["first_batches"] == rank_json(out1)["first_batches"]
    waits = re.findall(r"rank 0: waiting for rank 1 to build the dataset.*: (\d+) s so far", err0)
    assert waits and int(waits[-1]) >= 30, err0


@pytest.mark.mpi
def test_rank_1_failing_its_build_ends_rank_0_with_rank_1s_error(mpirun, tmp_path):
    proc = mpirun(2, PROGRAM, "fails1", str(tmp_path), env=clean_env())
    (_, err0), (_, err1) = proc.ranks
    assert proc.returncode == 1, tail(err0, 3000) + tail(err1, 3000)
    assert re.search(
        r"rank 1 failed to build the dataset.*, so rank 0 stops: ValueError: fabricated read", err0
    ), err0


@pytest.mark.mpi
def test_rank_0_failing_its_build_ends_rank_1_with_rank_0s_error(mpirun, tmp_path):
    """Before: rank 1 was in a collective when rank 0's error aborted the job: its log said nothing of why."""
    proc = mpirun(2, PROGRAM, "fails", str(tmp_path), env=clean_env())
    (_, err0), (_, err1) = proc.ranks
    assert proc.returncode == 1, tail(err0, 3000) + tail(err1, 3000)
    assert "rank 0 failed to build the dataset" in err1, err1
    assert "ValueError: fabricated statistics failure: bridge/1.0.0 shard 3 is truncated" in err1, (
        err1
    )
    assert (
        "in build" in err1
    )  # rank 0's traceback: where it failed, whichever rank's log survives the abort


@pytest.mark.mpi
def test_a_refusal_on_rank_0_ends_both_ranks_alike_with_its_exit_status(mpirun, tmp_path):
    """A refusal is the same on every rank: rank 0 prints it, both stop cleanly with exit 2, no abort."""
    proc = mpirun(2, PROGRAM, "refused", str(tmp_path), env=clean_env())
    (_, err0), (_, err1) = proc.ranks
    assert proc.returncode == 2, tail(err0, 3000) + tail(err1, 3000)
    assert "octo-dist finetune: error: --config.dataset_kwargs.name='nope'" in err0, err0
    assert re.search(r"rank 0 failed to build the dataset.*, so rank 1 stops: --config", err1), err1
    assert "MPI_ABORT" not in proc.stderr and "Traceback" not in err1, tail(proc.stderr, 3000)


class SilentStore:
    """A coordination service where rank 0 never sets the key: each read times out, as the real one's
    ``DEADLINE_EXCEEDED`` does, after its timeout on the fabricated clock."""

    def __init__(self):
        self.now = 0.0
        self.reads = []

    def clock(self) -> float:
        return self.now

    def set(self, key, value):
        raise AssertionError("only rank 0 sets the key")

    def get(self, key, timeout_s):
        self.reads.append(timeout_s)
        self.now += timeout_s
        return None


def test_a_rank_0_that_never_finishes_ends_the_wait_at_the_limit_with_the_setting_to_raise(caplog):
    store = SilentStore()
    env = {rankwait.TIMEOUT_ENV: "100"}
    with pytest.raises(rankwait.WaitTimedOut) as caught:
        rankwait.rank_zero_first(
            lambda: None, "the dataset", 1, 2, environ=env, store=store, clock=store.clock
        )
    assert store.now == 100
    said = str(caught.value)
    assert "rank 1 waited 100 s for rank 0 to build the dataset" in said
    assert f"{rankwait.TIMEOUT_ENV}=200" in said
    waited = [r.getMessage() for r in caught_warnings(caplog)]
    assert [re.search(r": (\d+) s so far", m).group(1) for m in waited] == ["10", "30", "60"]


def caught_warnings(caplog):
    return [r for r in caplog.records if r.name == rankwait.__name__ and r.levelname == "WARNING"]


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "2h"])
def test_the_wait_limit_is_refused_unless_a_positive_number_of_seconds(raw):
    with pytest.raises(rankwait.Refusal, match=rf"{rankwait.TIMEOUT_ENV}='{re.escape(raw)}'"):
        rankwait.wait_timeout({rankwait.TIMEOUT_ENV: raw})
    assert rankwait.wait_timeout({}) == rankwait.DEFAULT_TIMEOUT_S


STORE_PROGRAM = """
import json
import jax
from octo_dist.launchers.coordinator import free_port

# a free port for a one-process coordination service, below the ephemeral range (none of the suite's connections
# can take it before the service listens)
jax.distributed.initialize(f"localhost:{free_port()}", 1, 0)
from octo_dist.runtime import rankwait

store = rankwait.CoordinationStore()
store.set("k", json.dumps({"ok": False, "error": "x\\ny"}))
print(json.dumps({"set": json.loads(store.get("k", 5)), "unset": store.get("never", 0.2)}))
"""


@pytest.mark.parametrize("version", sorted(JAX_PYTHONS))
def test_the_coordination_store_reads_set_keys_and_times_out_on_both_pinned_jax_versions(version):
    """The client's key_value_set / blocking_key_value_get exist alike in jax 0.4.20 (production) and 0.4.22: a
    read past its timeout is None (``DEADLINE_EXCEEDED``), not an error."""
    python = JAX_PYTHONS[version]
    if not python.exists():
        pytest.skip(f"needs {python.parent.parent} (make jax020-env)")
    proc = helpers.run(
        [str(python), "-c", STORE_PROGRAM],
        env=clean_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, tail(proc.stderr, 3000)
    assert rank_json(proc.stdout) == {"set": {"ok": False, "error": "x\ny"}, "unset": None}
