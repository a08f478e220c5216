"""The train loop augments each batch ahead of its step (on a worker thread, while the previous step runs): the
same images, so the same losses, as augmenting inside the step with the step's own key.

One step function (jit): the augmentation is a program of its own, run before the step whichever step function
takes it (parallel.Engine.prepare), so the property does not depend on it."""

import subprocess
import sys

from helpers import HANG_S, PROGRAMS, REPO, clean_env, json_lines
from helpers import COMPILE_FAST


def test_batches_augmented_ahead_give_the_losses_of_batches_augmented_in_the_step():
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "fit_ahead.py")],
        capture_output=True,
        text=True,
        # fit and the steps by hand compiled alike, fast (helpers.COMPILE_FAST)
        env=clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=2 " + COMPILE_FAST),
        timeout=HANG_S,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json_lines(proc.stdout)[-1]
    assert out["devices"] == 2
    # two steps: the second batch is the first one augmented ahead, while step 0 ran
    assert sorted(out["fit"]) == ["0", "1"]
    # bit for bit: the same program on the same images, whichever thread ran it
    assert out["fit"] == out["by_hand"], out
    # and the augmentation reaches the loss at every step (else the comparison above proves nothing)
    assert all(out["plain"][k] != out["fit"][k] for k in out["fit"]), out
