"""Checkpoints you can trust: real orbax checkpoints written through octo_dist.engine.checkpoint (JAX on the CPU, one
process), damaged the ways a file system, a full disk or a killed job damages them, then reopened.

Each damage must be reported (a warning naming the step and what is wrong), the damaged step must never be used,
and the restore must give exactly the previous verified step's arrays (bit-identical)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import COMPILE_FAST, clean_env

jax = pytest.importorskip("jax")

from octo_dist.engine import checkpoint as ck  # noqa: E402
from octo_dist.engine import checksums  # noqa: E402
from octo_dist.engine.checkpoint import CheckpointError, Checkpoints  # noqa: E402


def state_at(step: int) -> dict:
    """A small train-state-like tree whose every value depends on ``step``."""
    rng = np.random.default_rng(step)
    return {
        "params": {
            "patch": {
                "kernel": jax.numpy.asarray(rng.standard_normal((2, 3, 4, 5), dtype=np.float32)),
                "bias": jax.numpy.asarray(rng.standard_normal(5, dtype=np.float32)),
            }
        },
        "step": jax.numpy.asarray(np.int32(step)),
    }


def abstract(tree):
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
    )


def host(tree) -> list:
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def assert_bit_identical(a, b):
    for x, y in zip(host(a), host(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def save_steps(directory: Path, steps, max_to_keep: int = 3) -> None:
    c = Checkpoints(str(directory), max_to_keep)
    for s in steps:
        c.save(s, state_at(s), {"data_position": s})
    c.close()


def chunk(step_dir: Path) -> Path:
    """The one data chunk of the 4-D kernel, as in ``rm D/10/state/params.patch.kernel/0.0.0.0``."""
    return step_dir / "state" / "params.patch.kernel" / "0.0.0.0"


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def remove(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


# damage name -> (what to do to step 10's directory, a phrase the warning must contain)
DAMAGE = {
    "missing array chunk": (lambda d: remove(chunk(d)), "params.patch.kernel/0.0.0.0 is missing"),
    "flipped byte in a chunk": (
        lambda d: flip_byte(chunk(d)),
        "params.patch.kernel/0.0.0.0 does not match its checksum",
    ),
    "truncated chunk": (lambda d: truncate(chunk(d)), "params.patch.kernel/0.0.0.0 is "),
    "missing array metadata": (
        lambda d: remove(d / "state" / "params.patch.kernel" / ".zarray"),
        ".zarray is missing",
    ),
    "missing sharding metadata": (
        lambda d: remove(d / "state" / "_sharding"),
        "state/_sharding is missing",
    ),
    "missing tree metadata": (
        lambda d: remove(d / "state" / "_METADATA"),
        "state/_METADATA is missing",
    ),
    "flipped byte in meta": (
        lambda d: flip_byte(d / "meta" / "metadata"),
        "meta/metadata does not match",
    ),
    "missing meta": (lambda d: remove(d / "meta"), "meta/metadata is missing"),
    "missing state": (lambda d: remove(d / "state"), "state/"),
    "an added file": (
        lambda d: (d / "state" / "params.patch.kernel" / "0.0.0.1").write_bytes(b"x"),
        "was not part of",
    ),
    "no checksum record (torn save)": (
        lambda d: remove(d / checksums.MANIFEST),
        f"no {checksums.MANIFEST}",
    ),
    "unreadable checksum record": (lambda d: truncate(d / checksums.MANIFEST), "cannot be read"),
}


def test_the_layout_the_damage_cases_aim_at(tmp_path):
    save_steps(tmp_path, [10])
    d = tmp_path / "10"
    assert (
        chunk(d).is_file()
        and (d / "state" / "_METADATA").is_file()
        and (d / "meta" / "metadata").is_file()
    )
    record = json.loads((d / checksums.MANIFEST).read_text())
    assert record["step"] == 10 and "state/params.patch.kernel/0.0.0.0" in record["files"]
    assert checksums.verify(d, 10) is None


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_step_is_reported_set_aside_and_the_previous_verified_one_restored(
    tmp_path, caplog, damage
):
    save_steps(tmp_path, [5, 10])
    do, phrase = DAMAGE[damage]
    do(tmp_path / "10")

    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        c = Checkpoints(str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert (
        "checkpoint step 10" in warnings[0]
        and phrase in warnings[0]
        and "resuming from step 5" in warnings[0]
    )
    assert c.latest_step() == 5
    restored, meta = c.restore(5, abstract(state_at(0)))
    assert_bit_identical(restored, state_at(5))
    assert meta == {"data_position": 5}
    # The damaged step is kept for inspection, out of orbax's sight; the run can save step 10 afresh.
    assert (tmp_path / "10.damaged").is_dir() and not (tmp_path / "10").exists()
    c.save(10, state_at(10), {"data_position": 10})
    c.close()
    again = Checkpoints(str(tmp_path))
    assert again.latest_step() == 10
    assert_bit_identical(again.restore(10, abstract(state_at(0)))[0], state_at(10))
    again.close()


def test_every_step_damaged_leaves_nothing_to_resume_from(tmp_path, caplog):
    save_steps(tmp_path, [5, 10])
    remove(chunk(tmp_path / "10"))
    flip_byte(tmp_path / "5" / "meta" / "metadata")
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        c = Checkpoints(str(tmp_path))
    assert c.latest_step() is None
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert (
        "checkpoint step 10" in text
        and "checkpoint step 5" in text
        and "no verified checkpoint left" in text
    )
    c.close()


def test_restoring_a_step_damaged_after_opening_is_refused(tmp_path):
    save_steps(tmp_path, [5, 10])
    c = Checkpoints(str(tmp_path))
    assert c.latest_step() == 10
    flip_byte(chunk(tmp_path / "5"))
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint step 5 .* is damaged: .*0\.0\.0\.0 does not match.*Fix: ",
    ):
        c.restore(5, abstract(state_at(0)))
    c.close()


def test_pruning_never_removes_the_newest_verified_step(tmp_path):
    # The reported failure: step 10 damaged, a resume saved 15 and 20 and pruned step 5, the last good one.
    save_steps(tmp_path, [5, 10])
    remove(chunk(tmp_path / "10"))
    c = Checkpoints(str(tmp_path), max_to_keep=3)
    assert c.latest_step() == 5
    for s in (10, 15, 20):
        c.save(s, state_at(s), {"data_position": s})
        steps = sorted(ck.step_dirs(tmp_path))
        assert s in steps and all(checksums.verify(tmp_path / str(k), k) is None for k in steps), (
            steps
        )
    assert sorted(ck.step_dirs(tmp_path)) == [10, 15, 20]
    c.close()


# --- whether to resume, decided once (checkpoint.decide) before start-up ---------------------------------------


def test_a_fresh_run_decides_step_0_and_refuses_a_directory_that_holds_checkpoints(tmp_path):
    assert ck.decide(None, False) == ck.Decision()
    fresh = ck.decide(tmp_path / "new", False)
    assert fresh.start == 0 and fresh.step is None and fresh.directory == str(tmp_path / "new")
    assert ck.decide(tmp_path / "new", True).start == 0  # --resume with nothing saved yet: step 0
    save_steps(tmp_path / "run", [5])
    with pytest.raises(
        CheckpointError,
        match=r"already holds checkpoints \(latest: step 5\) and --resume was not given; expected an empty",
    ):
        ck.decide(tmp_path / "run", False)


def test_resume_decides_the_newest_verified_step_and_opening_restores_it(tmp_path):
    save_steps(tmp_path, [5, 10])
    decision = ck.decide(tmp_path, True)
    assert (decision.step, decision.start, decision.set_aside, decision.recorded) == (
        10,
        10,
        (),
        (5, 10),
    )
    c = Checkpoints(str(tmp_path), decision=decision)
    assert c.latest_step() == 10
    assert_bit_identical(c.restore(10, abstract(state_at(0)))[0], state_at(10))
    c.close()


def test_an_unverified_newest_step_is_decided_against_then_set_aside_when_opened(tmp_path, caplog):
    save_steps(tmp_path, [5, 10])
    remove(tmp_path / "10" / checksums.MANIFEST)  # a torn save: renamed by orbax, never recorded
    decision = ck.decide(tmp_path, True)
    assert decision.step == 5 and [s for s, _ in decision.set_aside] == [10]
    assert (
        tmp_path / "10"
    ).is_dir()  # deciding reads only: moving is the opening's (process 0's) job
    with caplog.at_level(logging.WARNING, logger=ck.__name__):
        c = Checkpoints(str(tmp_path), decision=decision)
    assert c.latest_step() == 5 and (tmp_path / "10.damaged").is_dir()
    assert any(f"no {checksums.MANIFEST}" in r.getMessage() for r in caplog.records)
    assert_bit_identical(c.restore(5, abstract(state_at(0)))[0], state_at(5))
    c.close()


def test_a_requested_step_must_be_there_and_verified(tmp_path):
    save_steps(tmp_path, [5, 10])
    with pytest.raises(
        CheckpointError, match=r"checkpoint step 7 is not in .* \(steps there: \[5, 10\]\)"
    ):
        ck.decide(tmp_path, 7)
    flip_byte(chunk(tmp_path / "5"))
    with pytest.raises(
        CheckpointError, match=r"checkpoint step 5 in .* is damaged: .*does not match"
    ):
        ck.decide(tmp_path, 5)
    # An older verified step, asked for by number: the newer ones are set aside, not overwritten later.
    save_steps(tmp_path / "b", [5, 10])
    decision = ck.decide(tmp_path / "b", 5)
    assert decision.step == 5 and decision.set_aside == (
        (10, "it is newer than the requested step 5"),
    )


def test_prune_plan_keeps_the_newest_trusted_steps_and_anything_newer():
    assert ck.to_prune([5, 10, 15, 20], trusted=[5, 10, 15, 20], max_to_keep=3) == [5]
    assert ck.to_prune([5, 10, 15], trusted=[5], max_to_keep=1) == []  # 10, 15 unverified: 5 stays
    assert ck.to_prune([1, 3, 5, 10], trusted=[3, 5, 10], max_to_keep=2) == [1, 3]
    assert ck.to_prune([5, 10], trusted=[], max_to_keep=1) == []
    assert ck.to_prune([5, 10], trusted=[5, 10], max_to_keep=None) == []


# --- the whole job: 2 ranks under the venv's mpirun ----------------------------------------------------------

# Every step saved: the newest, step 4, damaged; the resume starts at step 2 and saves step 4 again. Both runs are
# compiled alike, fast (helpers.COMPILE_FAST): what is tested is which checkpoint is used, not XLA's optimiser.
SMOKE = ["-m", "octo_dist", "smoke", "--model", "tiny", "--save-every", "2", "--steps", "4"]


@pytest.mark.mpi
@pytest.mark.slow
def test_resume_after_a_damaged_newest_step_ends_bit_identical_to_the_uninterrupted_run(
    mpirun, tmp_path
):
    """The reported failure, end to end: the newest step's (4's) kernel chunk deleted, then ``--resume``. It used
    to resume from the damaged newest step (the kernel read as zeros) and exit 0 with other parameters. Now step 4
    is set aside, the run resumes from step 2 and ends with the uninterrupted run's parameters and losses (two runs:
    the uninterrupted one is also where the checkpoints come from)."""
    env = clean_env(XLA_FLAGS=COMPILE_FAST)
    damaged = tmp_path / "damaged"
    first = mpirun(
        2, *SMOKE, "--save-dir", str(damaged), "--record", str(tmp_path / "ref.json"), env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    ref = json.loads((tmp_path / "ref.json").read_text())
    assert sorted(ck.step_dirs(damaged)) == [2, 4]
    remove(chunk(damaged / "4"))

    p = mpirun(
        2,
        *SMOKE,
        "--save-dir",
        str(damaged),
        "--resume",
        "--record",
        str(tmp_path / "damaged.json"),
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec, rank0_err = json.loads((tmp_path / "damaged.json").read_text()), p.ranks[0][1]
    assert rec["start_step"] == 2 and rec["end_step"] == 4
    assert rec["digests"] == ref["digests"] and len(set(rec["digests"])) == 1
    assert rec["losses"] == {k: v for k, v in ref["losses"].items() if int(k) >= 2}
    warnings = [ln for ln in rank0_err.splitlines() if "is damaged" in ln]
    assert (
        len(warnings) == 1
        and "checkpoint step 4" in warnings[0]
        and "0.0.0.0 is missing" in warnings[0]
    )
    assert (damaged / "4.damaged").is_dir()
    assert sorted(ck.step_dirs(damaged)) == [2, 4]
    assert all(checksums.verify(damaged / str(s), s) is None for s in (2, 4))


def test_only_ascii_digit_directories_are_steps(tmp_path):
    """ "²".isdigit() is True (int() of it raised ValueError and ended the listing) and int("٣") is 3 (a directory
    someone named so was restored as step 3)."""
    # A half-written step (orbax's tmp name) and a damaged one set aside are no steps either.
    for name in ("5", "²", "٣", "10.orbax-checkpoint-tmp-1700000000000000", "10.damaged", "notes"):
        (tmp_path / name).mkdir()
    assert sorted(ck.step_dirs(tmp_path)) == [5]


def test_a_pretrained_checkpoint_with_only_non_ascii_digit_directories_has_no_step(tmp_path):
    from octo_dist.apps.finetune import checks

    for f in checks.CHECKPOINT_FILES:
        (tmp_path / f).write_text("{}")
    (tmp_path / "٣").mkdir()
    assert any("step" in p for p in checks.checkpoint_problems(tmp_path))
