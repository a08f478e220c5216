"""The notes a job's ranks leave in its directory, read back through savelayout (``rank_notes``), and a damaged
checkpoint set aside under savelayout's name (``damaged_dir``): the names are written and read in one place."""

from __future__ import annotations

import os

from octo_dist import savelayout
from octo_dist.engine import checkpoint
from octo_dist.jobs.supervisor import ranks


def _note(job_dir: str, failed: bool, rank: str, text: str) -> str:
    path = savelayout.rank_note(job_dir, failed, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def test_the_ranks_notes_are_read_by_rank_including_one_whose_launcher_named_none(tmp_path):
    job_dir = savelayout.make_job_dir(str(tmp_path), "12345.pbs1")
    _note(job_dir, False, "0", "rank 0 on g0001")
    _note(job_dir, True, "unknown", "rank unknown on g0002 exited with status 127")
    # Not a note: a name the rank guard never writes.
    open(os.path.join(savelayout.rank_notes_dir(job_dir, False), "README"), "w").close()

    assert savelayout.rank_notes(job_dir, False) == {"0": savelayout.rank_note(job_dir, False, "0")}
    assert list(savelayout.rank_notes(job_dir, True)) == ["unknown"]
    assert savelayout.rank_notes(str(tmp_path / "no-job"), True) == {}
    # What the supervisor makes of them: rank 1 of 2 left no note of finishing; the failure is the unknown rank's.
    assert ranks.missing_ranks(job_dir, 2) == [1]
    assert ranks.first_failure(job_dir) == "rank unknown on g0002 exited with status 127"


def test_a_damaged_step_is_set_aside_under_savelayouts_names(tmp_path):
    first = tmp_path / "10"
    first.mkdir()
    assert (
        str(checkpoint.set_aside(first)) == savelayout.damaged_dir(str(first)) == f"{first}.damaged"
    )
    again = tmp_path / "10"
    again.mkdir()
    assert (
        str(checkpoint.set_aside(again))
        == savelayout.damaged_dir(str(again), 2)
        == f"{again}.damaged.2"
    )
    assert sorted(os.listdir(tmp_path)) == ["10.damaged", "10.damaged.2"]
