"""The allgather fix (octo_dist.policies.gather) without Octo: raw ``process_allgather`` vs the helper, on the pinned
JAX versions. jax 0.4.20 (production pin) in one process with forced CPU devices; jax 0.4.22 under a real mpirun."""

import subprocess

import numpy as np
import pytest

from helpers import HANG_S, PROGRAMS, REPO, clean_env, json_lines
from octo_dist.policies import gather

GATHER = str(PROGRAMS / "gather.py")
JAX020_PYTHON = REPO / ".venv-jax020" / "bin" / "python"


# --- leaf checks: pure ----------------------------------------------------------------------------------


def test_local_batch_size_is_the_common_leading_size():
    batch = {
        "observation": {"image_primary": np.zeros((3, 2, 8, 8, 3), np.uint8)},
        "action": np.zeros((3, 2, 4, 7)),
    }
    assert gather.check_leaves(batch) == 3


def test_strings_left_in_the_batch_are_named_with_the_fix():
    batch = {
        "observation": {"image_primary": np.zeros((2, 1, 8, 8, 3), np.uint8)},
        "dataset_name": np.array([b"bridge", b"bridge"]),
    }
    with pytest.raises(
        gather.GatherError, match=r"\['dataset_name'\] has dtype \|S6.*del batch\['dataset_name'\]"
    ):
        gather.check_leaves(batch)


def test_disagreeing_batch_sizes_and_scalars_are_refused():
    with pytest.raises(gather.GatherError, match="disagree on the batch size"):
        gather.check_leaves({"a": np.zeros((2, 3)), "b": np.zeros((3, 3))})
    with pytest.raises(gather.GatherError, match=r"\['step'\] is a scalar"):
        gather.check_leaves({"a": np.zeros((2, 3)), "step": np.int32(4)})


# --- jax 0.4.20, one process, 4 forced CPU devices -------------------------------------------------------


def gather_on_jax020(global_batch: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(JAX020_PYTHON), GATHER, "--global-batch", str(global_batch)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=4"),
        cwd=REPO,
    )


@pytest.mark.skipif(not JAX020_PYTHON.exists(), reason="needs .venv-jax020 (make jax020-env)")
def test_one_process_on_jax_0_4_20_gives_the_batch_unchanged_both_ways():
    proc = gather_on_jax020(8)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out,) = json_lines(proc.stdout)
    assert out["jax"] == "0.4.20" and out["devices"] == 4 and out["world"] == 1
    # One process: raw process_allgather returns its input; the global array (fully addressable here) too.
    assert out["raw_shape"] == out["fixed_shape"] == [8, 2, 8, 8, 3]
    assert out["fixed_order"] == out["fixed_action_order"] == list(range(8))
    assert out["from_config_keeps"] == [1, 2, 8, 8, 3]


@pytest.mark.skipif(not JAX020_PYTHON.exists(), reason="needs .venv-jax020 (make jax020-env)")
def test_a_batch_that_does_not_divide_by_the_local_devices_is_refused_on_jax_0_4_20():
    proc = gather_on_jax020(6)
    assert proc.returncode != 0
    assert "local example batch of 6 does not divide by this process's 4 device(s)" in proc.stderr


# --- jax 0.4.22, two real processes ----------------------------------------------------------------------


@pytest.mark.mpi
def test_two_processes_stack_raw_but_the_helper_gives_the_global_batch_on_both_ranks(mpirun):
    proc = mpirun(2, GATHER, "--global-batch", "6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = sorted(json_lines(proc.stdout), key=lambda o: o["rank"])
    assert [o["rank"] for o in outs] == [0, 1] and all(o["world"] == 2 for o in outs)
    for o in outs:
        # The crash multi-node fine-tuning hit: a new leading process axis, so from_config's x[:1] keeps a whole
        # slice (1, 3, 2, ...).
        assert o["raw_shape"] == [2, 3, 2, 8, 8, 3]
        assert o["fixed_shape"] == [6, 2, 8, 8, 3]
        assert o["fixed_shapes"] == {
            "observation/image_primary": [6, 2, 8, 8, 3],
            "observation/timestep_pad_mask": [6, 2],
            "observation/pad_mask_dict/image_primary": [6, 2],
            "observation/timestep": [6, 2],
            "task/image_primary": [6, 8, 8, 3],
            "action": [6, 2, 4, 7],
        }
        # Rank 0's examples first, then rank 1's: the global batch the engine trains on.
        assert o["fixed_order"] == o["fixed_action_order"] == [0, 1, 2, 3, 4, 5]
        assert o["from_config_keeps"] == [1, 2, 8, 8, 3]
    assert outs[0]["fixed_shapes"] == outs[1]["fixed_shapes"]
