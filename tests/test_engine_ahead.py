"""The train loop augments each batch ahead of its step (on a worker thread, while the previous step runs): the
same images, so the same losses, as augmenting inside the step with the step's own key."""

import subprocess
import sys

import pytest

from helpers import PROGRAMS, REPO, clean_env, json_lines


@pytest.mark.parametrize("step_fn", ["jit", "shard_map"])
def test_batches_augmented_ahead_give_the_losses_of_batches_augmented_in_the_step(
    tmp_path, step_fn
):
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "fit_ahead.py"), step_fn, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        env=clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=2"),
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json_lines(proc.stdout)[-1]
    assert out["devices"] == 2
    assert sorted(out["fit"]) == ["0", "1", "2", "3"]
    # bit for bit: the same program on the same images, whichever thread ran it
    assert out["fit"] == out["by_hand"], out
    # and the augmentation reaches the loss at every step (else the comparison above proves nothing)
    assert all(out["plain"][k] != out["fit"][k] for k in out["fit"]), out
