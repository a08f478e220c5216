"""Checkpoints with orbax, safe on several hosts: every process calls ``save``; orbax lets process 0 alone create,
finalise and prune directories, each process writes only the shards it owns (replicated arrays: process 0), and a
save is atomic: written under ``<step>.orbax-checkpoint-tmp-<n>`` and renamed when complete, so a job killed
mid-write leaves the previous checkpoints intact and the half-written one is ignored (and removed on restart).

``NoCheckpoints`` is the stand-in when no save directory is configured.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

log = logging.getLogger(__name__)

STATE, META = "state", "meta"


class CheckpointError(RuntimeError):
    """A checkpoint directory that cannot be resumed from as asked."""


class NoCheckpoints:
    directory = None

    def latest_step(self) -> Optional[int]:
        return None

    def save(self, step: int, state, meta: Mapping[str, Any]) -> None:
        pass

    def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
        raise CheckpointError("no checkpoint directory configured; nothing to restore (pass --save-dir)")

    def close(self) -> None:
        pass


class Checkpoints:
    """``<directory>/<step>/{state,meta}``: the train state (sharded arrays) and JSON metadata (data position...)."""

    def __init__(self, directory: str, max_to_keep: int = 3):
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            # use_ocdbt=False: orbax 0.4.4 merges OCDBT per-process files with a tensorstore call
            # (KvStore.experimental_copy_range_to) that the tensorstore the stack allows (0.1.45, held by
            # ml-dtypes 0.2.0) lacks; the plain per-array layout needs no merge.
            {STATE: ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)), META: ocp.Checkpointer(ocp.JsonCheckpointHandler())},
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=True),
        )

    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def save(self, step: int, state, meta: Mapping[str, Any]) -> None:
        """Collective: every process calls it at the same step."""
        self._manager.save(step, {STATE: state, META: dict(meta)}, force=True)
        self._manager.wait_until_finished()
        log.info("checkpoint saved: %s", self.directory / str(step))

    def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
        """The state at ``step`` laid out like ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves with shardings)."""
        import jax

        restore_args = self._ocp.checkpoint_utils.construct_restore_args(
            abstract_state, jax.tree_util.tree_map(lambda x: x.sharding, abstract_state))
        restored = self._manager.restore(step, items={STATE: abstract_state, META: None},
                                         restore_kwargs={STATE: {"restore_args": restore_args}})
        return restored[STATE], dict(restored[META] or {})

    def close(self) -> None:
        self._manager.close()


def open_checkpoints(directory: Optional[str], max_to_keep: int = 3):
    return Checkpoints(directory, max_to_keep) if directory else NoCheckpoints()
