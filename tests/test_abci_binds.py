"""The rendered PBS job binds the node's ``/dev/infiniband`` into the image where the node has it, and only there.

ABCI 3.0 user guide (containers): a container sees the host's paths only where they are bound (``singularity exec
--bind``); NCCL opens the HCAs through ``/dev/infiniband/uverbs*``, so without the bind it falls back to TCP between
nodes. The render lists the directory with the group area and the checkpoint; the job runtime binds each one the
node has and says which it skipped (a bind of a missing path would fail ``singularity exec`` on every rank).
"""

import os

from octo_dist.jobs.cli import parse
from octo_dist.jobs.supervisor import prepare


def test_each_listed_directory_is_bound_where_the_node_has_it_and_the_rest_are_named(tmp_path):
    image, weights = tmp_path / "octo-dist-cuda12.sif", tmp_path / "weights" / "octo-small"
    image.write_text("a .sif\n")
    weights.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "singularity").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "singularity").chmod(0o755)
    job = parse(
        ["pbs", "--nodes", "2", "--group", "gxx00000", "--image", str(image), "--skip-image-check"]
        + ["--", "finetune", f"--config.pretrained_path={weights}"]
    )
    listed = job.settings.software.binds
    assert listed == ("/groups/gxx00000", "/dev/infiniband", str(weights)), listed
    notes = []
    run, _ = prepare.rank_runner(
        job.settings, {"PATH": str(bin_dir)}, [str(tmp_path / "runs")], notes.append
    )
    binds = [run[i + 1] for i, word in enumerate(run) if word == "--bind"]
    present = [d for d in listed if os.path.isdir(d)]
    assert binds == [str(tmp_path / "runs"), *present], run
    assert str(weights) in binds and run[-1] == str(image)
    assert [n for n in notes if n.startswith("not binding")] == [
        f"not binding {d}: no such directory on this node" for d in listed if d not in present
    ]
    assert ("/dev/infiniband" in binds) == os.path.isdir("/dev/infiniband")
