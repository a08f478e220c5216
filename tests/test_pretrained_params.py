"""The pretrained weights as the fine-tune reads them (``weights.pretrained_params``): the arrays of an orbax
checkpoint in Octo's ``save_pretrained`` layout, the newest step or the one asked for, without tracing the model.
``tests/test_finetune.py`` compares them with ``OctoModel.load_pretrained`` where Octo imports."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import HANG_S

pytest.importorskip("orbax.checkpoint")


SAVE = """
import sys
import jax.numpy as jnp
import os

import numpy as np
import orbax.checkpoint as ocp

# without OCDBT, as octo-dist writes its own (this orbax's OCDBT writer needs a newer tensorstore)
manager = ocp.CheckpointManager(sys.argv[1], ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)))
for step in map(int, sys.argv[2:]):
    manager.save(step, {
        "octo_transformer": {"kernel": jnp.full((3, 4), step, jnp.float32)},
        "heads_action": {"bias": jnp.arange(5, dtype=jnp.float32) + step},
    })
"""


def _save(directory, steps):
    """Octo's save_pretrained writes ``<dir>/<step>/default`` with orbax's PyTreeCheckpointer: the same here, a
    small nested parameter tree per step (its values say the step), written by a process of its own as a training
    run writes it (in one process, this orbax left the second manager's arrays unwritten)."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-c", SAVE, str(directory), *map(str, steps)],
        check=True,
        timeout=HANG_S,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    return {
        step: {
            "octo_transformer": {"kernel": np.full((3, 4), step, np.float32)},
            "heads_action": {"bias": np.arange(5, dtype=np.float32) + step},
        }
        for step in steps
    }


def test_the_newest_step_is_read_as_saved(tmp_path):
    from octo_dist.apps.finetune import weights

    trees = _save(tmp_path / "model", [1, 3])
    got = weights.pretrained_params(str(tmp_path / "model"))
    assert sorted(got) == ["heads_action", "octo_transformer"]
    np.testing.assert_array_equal(
        got["octo_transformer"]["kernel"], trees[3]["octo_transformer"]["kernel"]
    )
    np.testing.assert_array_equal(got["heads_action"]["bias"], trees[3]["heads_action"]["bias"])
    assert got["heads_action"]["bias"].dtype == np.float32


def test_a_named_step_is_read(tmp_path):
    from octo_dist.apps.finetune import weights

    _save(tmp_path / "model", [1, 3])
    got = weights.pretrained_params(str(tmp_path / "model"), 1)
    assert got["octo_transformer"]["kernel"][0, 0] == 1.0


def test_a_missing_step_names_the_steps_found_and_the_fix(tmp_path):
    from octo_dist.apps.finetune import weights

    _save(tmp_path / "model", [1, 3])
    with pytest.raises(weights.WeightsError) as e:
        weights.pretrained_params(str(tmp_path / "model"), 2)
    assert "no checkpoint step 2 (steps found: 1, 3)" in str(e.value)
    assert "Fix: --config.pretrained_step=3" in str(e.value)


def test_a_directory_without_steps_is_refused(tmp_path):
    from octo_dist.apps.finetune import weights

    (tmp_path / "empty").mkdir()
    with pytest.raises(weights.WeightsError) as e:
        weights.pretrained_params(str(tmp_path / "empty"))
    assert "no checkpoint step (steps found: none)" in str(e.value)
    assert "Fix: another --config.pretrained_path" in str(e.value)
