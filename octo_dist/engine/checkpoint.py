"""Checkpoints with orbax that are verified before they are trusted, safe on several hosts.

Every process calls ``save``; orbax lets process 0 alone create and finalise directories, each process writes only
the shards it owns (replicated arrays: process 0), and a save is atomic: written under
``<step>.orbax-checkpoint-tmp-<n>`` and renamed when complete (half-written ones are removed on restart).

Orbax keeps no checksum of its own here, so once a step is complete on every process, process 0 hashes every file
of it into ``<step>/checksums.json`` (:mod:`octo_dist.engine.checksums`: the record, and what ``verify`` finds wrong).
A step without that record (the job was killed between orbax's rename and the record, e.g. SIGTERM to a bare
``mpirun``), or whose files differ from it (missing, truncated, changed, added), is *damaged*. Whether to resume is
decided once, before start-up, by :func:`decide` (read only): it verifies the steps newest first and picks the
newest verified one (or the one asked for). The :class:`Decision` is passed down; when the directory is opened,
process 0 moves each damaged newer step aside to ``<step>.damaged`` (kept for inspection; orbax ignores the name)
with one warning naming the step and what is wrong, and every process restores the decided step. Pruning
(``max_to_keep``) is done here, not by orbax, so that it runs only after the new step's record is written and never
removes the newest verified step.

``NoCheckpoints`` is the stand-in when no save directory is configured.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from octo_dist import savelayout
from octo_dist.engine import room
from octo_dist.engine.checksums import MANIFEST, manifest_of, recorded_bytes, verify, write_manifest
from octo_dist.problems import Refusal

log = logging.getLogger(__name__)

STATE, META = "state", "meta"
DAMAGED_SUFFIX = savelayout.DAMAGED  # "10.damaged": a step set aside


class CheckpointError(Refusal, RuntimeError):
    """A checkpoint directory that cannot be resumed from as asked (exit 2, the same on every rank)."""


class CheckpointWriteError(CheckpointError):
    """A save that failed because the file system is full: one line with the room the run needs. Unlike other
    checkpoint errors it may be seen by one process alone (the one whose write failed)."""

    same_on_every_rank = False


_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is a full file system or quota: an ``OSError`` with ENOSPC/EDQUOT, or
    tensorstore's ``ValueError("... No space left on device ...")``."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _FULL:
            return True
        if any(os.strerror(code) in str(error) for code in _FULL):
            return True
        error = error.__cause__ or error.__context__
    return False


def _reason(error: BaseException) -> str:
    for code in _FULL:
        if os.strerror(code) in str(error) or getattr(error, "errno", None) == code:
            return os.strerror(code)
    return type(error).__name__


# --- which steps a directory holds ---------------------------------------------------------------------------


def step_path(directory: Path, step: int) -> Path:
    """``(D, 10)`` -> ``D/10``: step 10's checkpoint in ``directory``, as savelayout names it (``checkpoint_dir``)."""
    return Path(savelayout.checkpoint_dir(str(directory), step))


def step_dirs(directory: Path) -> Dict[int, Path]:
    """Finalised orbax step directories: ``{5: D/5, 10: D/10}`` (``10.orbax-checkpoint-tmp-…`` and
    ``10.damaged`` are not steps)."""
    if not directory.is_dir():
        return {}
    # ASCII digits only: "²".isdigit() is True (int() then raises) and int("٣") is 3.
    return {
        int(p.name): p
        for p in directory.iterdir()
        if p.name.isascii() and p.name.isdigit() and p.is_dir()
    }


def set_aside(step_dir: Path) -> Path:
    """Rename a damaged step out of orbax's sight (``10`` -> ``10.damaged``, ``10.damaged.2``...) and return where."""
    n = 1
    target = Path(savelayout.damaged_dir(str(step_dir), n))
    while target.exists():
        n += 1
        target = Path(savelayout.damaged_dir(str(step_dir), n))
    step_dir.rename(target)
    return target


# --- whether to resume, and from which step: decided once ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    """Where a run starts, decided once from the verified steps (:func:`decide`), before start-up, and passed down.

    ``Decision("/runs/x/train_state", step=5, set_aside=((10, "state/... is missing"),), recorded=(5,))``: restore
    the verified step 5; step 10 failed verification and is moved to ``10.damaged`` when the directory is opened.

    Attributes:
      directory: the save directory (absolute), or None: no checkpoints.
      step: the verified step to restore, or None: start at step 0.
      set_aside: ``(step, why)`` for the steps newer than ``step`` (damaged ones, or newer than a requested one)
        that process 0 moves out of orbax's sight when the directory is opened.
      recorded: the steps up to ``step`` that have a checksum record (pruning counts them as kept).
    """

    directory: Optional[str] = None
    step: Optional[int] = None
    set_aside: Tuple[Tuple[int, str], ...] = ()
    recorded: Tuple[int, ...] = ()

    @property
    def start(self) -> int:
        """The first step training runs: the restored step, else 0."""
        return self.step or 0

    def as_json(self) -> dict:
        return {"step": self.step, "set_aside": [list(x) for x in self.set_aside]}


def decide(directory, requested, elsewhere: str = "choose another save directory") -> Decision:
    """Whether a run resumes, and from which step, from the checksums of the steps in ``directory``; read only
    (nothing is moved: process 0 sets the damaged steps aside when the directory is opened).

    Args:
      directory: the save directory, or None/"" (no checkpoints: a fresh run).
      requested: False/None for a new run (refused when the directory already holds steps: nothing is overwritten);
        True for the newest verified step (a fresh start when there is none; newer damaged steps are set aside);
        a step number for exactly that step (refused when it is missing or fails verification).
      elsewhere: how this command picks another directory, for the refusal of a new run over old checkpoints
        (finetune: "pick another --name or --config.save_dir").

    Raises:
      CheckpointError: a new run over old checkpoints, or a requested step that is missing or damaged.
    """
    if not directory:
        return Decision()
    d = Path(directory).absolute()
    steps = step_dirs(d)
    if requested is None or requested is False:
        if steps:
            raise CheckpointError(
                f"{d} already holds checkpoints (latest: step {max(steps)}) and --resume was not given",
                "an empty or new directory",
                f"add --resume to continue that run, or {elsewhere} (nothing was overwritten)",
            )
        return Decision(str(d))
    step, damaged = _resume_step(d, steps, requested)
    newer = (
        [
            (s, f"it is newer than the requested step {step}")
            for s in sorted(steps, reverse=True)
            if s > step
        ]
        if step is not None and requested is not True
        else []
    )
    recorded = tuple(
        sorted(
            s for s in steps if step is not None and s <= step and manifest_of(steps[s]).is_file()
        )
    )
    return Decision(str(d), step, tuple(damaged + newer), recorded)


def _resume_step(d: Path, steps: dict, requested):
    """The step to resume from (None: none verifies) and the damaged steps set aside before it, each with why:
    every step newest first for ``--resume`` (True), else the one asked for (refused when missing or damaged)."""
    newest_first = sorted(steps, reverse=True) if requested is True else [int(requested)]
    if newest_first and newest_first[0] not in steps:
        raise CheckpointError(
            f"checkpoint step {newest_first[0]} is not in {d} (steps there: {sorted(steps) or 'none'})",
            "a step the directory holds",
            "--resume alone for the newest verified step, or the save directory that holds it",
        )
    damaged = []
    for step in newest_first:
        problem = verify(steps[step], step)
        if problem is None:
            return step, damaged
        if requested is not True:
            raise CheckpointError(
                f"checkpoint step {step} in {d} is damaged: {problem}",
                f"files matching its {MANIFEST}",
                "--resume alone resumes from the newest verified step (damaged ones are set aside)",
            )
        damaged.append((step, f"it is damaged: {problem}"))
    return None, damaged  # no verified step: a fresh start, every damaged one set aside


def set_steps_aside(directory: Path, decision: Decision) -> list:
    """On process 0, when the directory is opened: move the decision's ``set_aside`` steps out of orbax's sight.

    Returns ``[[step, why, moved_to], ...]``."""
    moved = []
    for step, why in decision.set_aside:
        step_dir = step_path(directory, step)
        if not step_dir.is_dir():
            continue  # another rank's opening (or a rerun) moved it already
        try:
            moved.append([step, why, str(set_aside(step_dir))])
        except OSError as e:
            raise CheckpointError(
                f"checkpoint step {step} in {directory} must be set aside ({why}) but cannot be moved ({e})",
                "a writable save directory",
                f"move {step_dir} out of {directory} and rerun",
            ) from None
    return moved


def keep_window(trusted: List[int], max_to_keep: Optional[int]) -> List[int]:
    """The steps pruning keeps: the newest ``max_to_keep`` of the trusted (recorded or saved) ones, always
    including the newest. ``None``/0: all."""
    trusted = sorted(set(trusted))
    return trusted if not max_to_keep else trusted[-max_to_keep:]


def to_prune(steps: List[int], trusted: List[int], max_to_keep: Optional[int]) -> List[int]:
    """Steps older than every kept one (damaged or not): never the newest trusted step, never a newer one."""
    window = keep_window(trusted, max_to_keep)
    return [s for s in sorted(steps) if window and s < window[0]]


# --- the checkpointers ---------------------------------------------------------------------------------------


class NoCheckpoints:
    directory = None

    def kept_steps(self) -> List[int]:
        return []

    def latest_step(self) -> Optional[int]:
        return None

    def save(self, step: int, state, meta: Mapping[str, Any]) -> None:
        pass

    def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
        raise CheckpointError(
            "no checkpoint directory configured; nothing to restore (pass --save-dir)"
        )

    def close(self) -> None:
        pass


class Checkpoints:
    """``<directory>/<step>/{state,meta,checksums.json}``: the train state (sharded arrays), JSON metadata (data
    position...) and the checksums of both. Opening it is collective (every process, the same directory)."""

    def __init__(self, directory: str, max_to_keep: int = 3, decision: Optional[Decision] = None):
        """``decision``: where the run starts (:func:`decide`, made before start-up); without one, the directory
        is opened to continue from its newest verified step (``decide(directory, True)``, on process 0)."""
        import jax
        import orbax.checkpoint as ocp

        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self._ocp = ocp
        self._main = jax.process_index() == 0
        if decision is not None and Path(decision.directory or "") != self.directory:
            raise ValueError(f"a decision for {decision.directory} given to open {self.directory}")
        # Process 0's decision and the steps it moved aside, on every process; a process that decided otherwise (it
        # saw other files: a directory that is not one shared file system) is refused rather than restored.
        found = self._agree(lambda: self._open(decision or decide(self.directory, True)))
        if decision is None:
            decision = Decision(
                str(self.directory),
                found["decision"]["step"],
                tuple(map(tuple, found["decision"]["set_aside"])),
                tuple(found["recorded"]),
            )
        elif found["decision"] != decision.as_json():
            raise CheckpointError(
                f"this process decided {decision.as_json()} from {self.directory}, process 0 "
                f"{found['decision']}: the processes see different files",
                "one save directory on a file system every node shares",
                "pass a --save-dir on a shared file system",
            )
        for step, why, moved in found["moved"]:
            if self._main:
                log.warning(
                    "checkpoint step %d in %s: %s; moved it to %s, resuming from %s",
                    step,
                    self.directory,
                    why,
                    moved,
                    f"step {decision.step}, the newest verified one"
                    if decision.step is not None
                    else "nothing (no verified checkpoint left)",
                )
        self.decision = decision
        self._latest: Optional[int] = decision.step
        self._verified = {decision.step} if decision.step is not None else set()
        self._trusted = set(decision.recorded) | self._verified
        self._manager = ocp.CheckpointManager(
            self.directory,
            # use_ocdbt=False: orbax 0.4.4 merges OCDBT per-process files with a tensorstore call
            # (KvStore.experimental_copy_range_to) that the tensorstore the stack allows (0.1.45, held by
            # ml-dtypes 0.2.0) lacks; the plain per-array layout needs no merge.
            {
                STATE: ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)),
                META: ocp.Checkpointer(ocp.JsonCheckpointHandler()),
            },
            # max_to_keep=None: orbax would prune right after its rename, before the new step's checksums exist.
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None, create=True, cleanup_tmp_directories=True
            ),
        )

    def _open(self, decision: Decision) -> dict:
        """On process 0: set the decision's steps aside; what every process then learns."""
        moved = set_steps_aside(self.directory, decision)
        return {"decision": decision.as_json(), "moved": moved, "recorded": list(decision.recorded)}

    def _agree(self, on_main):
        """``on_main()`` run by process 0 alone, its JSON result on every process; an error there is raised on every
        process as a ``CheckpointError`` (one process failing alone would leave the others in a collective)."""
        import jax

        from octo_dist.runtime import collectives

        reply = None
        if self._main:
            try:
                reply = {"ok": on_main()}
            except CheckpointError as e:
                reply = {"error": str(e)}
            except Exception as e:  # noqa: BLE001 -- reported on every process, with what failed
                reply = {
                    "error": f"checkpoint directory {self.directory}: {type(e).__name__}: {e}; expected a "
                    f"writable, readable save directory. Fix: check the file system and its free space, "
                    f"then rerun with --resume"
                }
        if jax.process_count() > 1:
            reply = json.loads(
                collectives.broadcast_str(
                    json.dumps(reply) if self._main else None, max_bytes=1 << 16
                )
            )
        if "error" in reply:
            raise CheckpointError(reply["error"])
        return reply["ok"]

    def latest_step(self) -> Optional[int]:
        """The newest verified step (damaged newer ones were set aside when the directory was opened)."""
        return self._latest

    def kept_steps(self) -> List[int]:
        """The verified or recorded steps on disk that pruning keeps counting (a resumed run's room is theirs too)."""
        return sorted(self._trusted)

    def save(self, step: int, state, meta: Mapping[str, Any]) -> None:
        """Collective: every process calls it at the same step.

        Raises:
          CheckpointWriteError: the file system filled up (ENOSPC, EDQUOT) during the save; the partial step was
            removed and the newest verified one kept; the message says how much room the run needs.
        """
        step_dir = step_path(self.directory, step)
        try:
            self._manager.save(step, {STATE: state, META: dict(meta)}, force=True)
            self._manager.wait_until_finished()  # ends in orbax's barrier: every process's files are in place
        except Exception as e:  # orbax raises OSError; tensorstore a ValueError naming the errno
            if not disk_full(e):
                raise
            raise self._full(step, state, e) from None

        def record() -> str:
            try:
                return str(write_manifest(step_dir, step))
            except OSError as e:
                if not disk_full(e):
                    raise
                raise self._full(step, state, e) from None

        # Shared, so that a failure here (a full disk) stops every process instead of leaving them in the next save.
        self._agree(record)
        self._latest = step
        self._verified.add(step)
        self._trusted.add(step)
        # Decided from what every process knows alike (no file system reads), so all of them prune the same steps.
        for old in to_prune(self._manager.all_steps(), sorted(self._trusted), self.max_to_keep):
            self._manager.delete(old)  # collective; process 0 removes the directory
            self._trusted.discard(old)
        log.info("checkpoint saved: %s", step_dir)

    def _full(self, step: int, state, error: BaseException) -> "CheckpointWriteError":
        """On process 0: remove what the failed save of ``step`` left, and say how much room the run needs."""
        removed = []
        if self._main:
            for partial in sorted(self.directory.glob(f"{step}.orbax-checkpoint-tmp-*")) + [
                step_path(self.directory, step)
            ]:
                if partial.is_dir() and not manifest_of(partial).is_file():
                    shutil.rmtree(partial, ignore_errors=True)
                    removed.append(partial.name)
        newest = self._latest
        # One checkpoint's size: the newest verified step's files as recorded, else the bound for this state.
        one = recorded_bytes(step_path(self.directory, newest)) if newest is not None else None
        one = one or room.checkpoint_nbytes(room.state_nbytes(state))
        # The run at its fullest: the checkpoints it keeps (all so far when max_to_keep is None) plus this one.
        copies = (self.max_to_keep or len(self._trusted)) + 1
        free = room.free_bytes(self.directory)
        kept = (
            f"kept the newest verified checkpoint, step {newest}"
            if newest is not None
            else "no verified checkpoint was written before it"
        )
        return CheckpointWriteError(
            f"checkpoint step {step} could not be written to {self.directory}: the file system is full "
            f"({_reason(error)}); {kept}, and removed the partial step{' ' + str(step) if removed else ''}; "
            f"expected room for {room.room_phrase(copies, one)} ({room.size_text(copies * one)} in all, "
            f"{room.size_text(free)} free now). Fix: free space there, or pass a --save-dir on a larger file "
            f"system; then rerun with --resume"
        )

    def restore(self, step: int, abstract_state) -> Tuple[Any, dict]:
        """The state at ``step`` laid out like ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves with shardings),
        after its checksums are verified (once per step and process lifetime)."""
        import jax

        if step not in self._verified:
            problem = self._agree(lambda: verify(step_path(self.directory, step), step))
            if problem is not None:
                raise CheckpointError(
                    f"checkpoint step {step} in {self.directory} is damaged: {problem}; expected files matching its "
                    f"{MANIFEST}. Fix: move {step_path(self.directory, step)} aside and rerun with --resume "
                    f"(the newest verified step is used)"
                )
            self._verified.add(step)
        restore_args = self._ocp.checkpoint_utils.construct_restore_args(
            abstract_state, jax.tree_util.tree_map(lambda x: x.sharding, abstract_state)
        )
        restored = self._manager.restore(
            step,
            items={STATE: abstract_state, META: None},
            restore_kwargs={STATE: {"restore_args": restore_args}},
        )
        return restored[STATE], dict(restored[META] or {})

    def close(self) -> None:
        self._manager.close()


def open_checkpoints(decision: Decision, max_to_keep: int = 3):
    """The checkpointer for ``decision``'s directory (collective), or :class:`NoCheckpoints` without one."""
    return (
        Checkpoints(decision.directory, max_to_keep, decision)
        if decision.directory
        else NoCheckpoints()
    )
