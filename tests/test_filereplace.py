"""A file octo-dist writes is replaced whole (``octo_dist/jobs/filereplace.py``): the job script, the job runtime's
zipapp and a save directory's record of its jobs all go through ``replacing``."""

from __future__ import annotations

import os
import stat

import pytest

from octo_dist.jobs.filereplace import existing_kind, replacing


def test_the_new_file_takes_the_name_with_its_mode(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("old\n")
    with replacing(str(path), 0o755) as f:
        f.write("#!/bin/bash\n")
    assert path.read_text() == "#!/bin/bash\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert sorted(os.listdir(tmp_path)) == ["job.sh"]  # no temporary file left beside it


def test_a_link_at_the_name_is_replaced_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    link = tmp_path / ".octo-dist-jobs.json"
    link.symlink_to(victim)
    with replacing(str(link), 0o644) as f:
        f.write("[]\n")
    assert victim.read_text() == "keep\n"
    assert not link.is_symlink() and link.read_text() == "[]\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("old\n")
    with pytest.raises(ZeroDivisionError):
        with replacing(str(path), 0o644) as f:
            f.write("half")
            1 / 0
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["record.json"]


def test_a_relative_name_is_written_in_its_own_directory(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    with replacing(os.path.join("sub", "runtime.pyz"), 0o755, binary=True) as f:
        f.write(b"#!/usr/bin/env python3\n")
    assert (tmp_path / "sub" / "runtime.pyz").read_bytes() == b"#!/usr/bin/env python3\n"


def test_what_lies_at_a_path_is_named(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    found = {name: existing_kind(str(tmp_path / name)) for name in ("none", "file", "fifo", "link")}
    assert found == {"none": "", "file": "file", "fifo": "FIFO", "link": "symbolic link"}
    assert existing_kind(str(tmp_path)) == "directory"
    assert existing_kind("/dev/null") == "character device"
