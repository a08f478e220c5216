"""The namespace cluster's Grid Engine gives each node its own TMPDIR, as nodes with a disk each have.

The nodes share this machine's /tmp. There node002's execd, once a job's last task on node002 ended (the preflight's
ranks, started through ``qrsh -inherit``), removed the job's ``/tmp/1.1.all.q``: the very directory the job's
script and its next mpirun were using on node001 (Open MPI's session directory: "PMIX ERROR ... can not create
session directory /tmp/1.1.all.q/ompi.node001.0/..."; the CI run that printed it then lost node002's daemon
mid-stop). A cluster of another instance numbers its jobs from 1 as well, in the same /tmp.
"""

from __future__ import annotations

import pytest

from test_cluster_gridengine import ended, ge, workdir  # noqa: F401  (ge: a pytest fixture, used by name)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# A task on node002 that ends, then: is node001's TMPDIR still there once node002's execd has cleaned up after it?
# The wait is on the event (node002's TMPDIR removed), bounded only for a machine that never gets there. The job's
# script is given TMP and no TMPDIR here (Grid Engine 8.1.9); Open MPI's mpirun takes TMP when TMPDIR is unset.
JOB = """#!/bin/bash
#$ -pe mpi 4
#$ -N tmpdir
#$ -j y
#$ -cwd
here=${TMPDIR:-$TMP}
remote=$("$SGE_ROOT/bin/lx-amd64/qrsh" -inherit node002 printenv TMP | tr -d '\\r')
echo "node001 TMPDIR=$here"
echo "node002 TMPDIR=$remote"
for _ in $(seq 300); do [ -d "$remote" ] || break; sleep 1; done
[ -d "$here" ] && echo "node001 TMPDIR kept" || echo "node001 TMPDIR removed"
"""


def test_a_task_ending_on_node002_leaves_node001s_tmpdir(ge, tmp_path):  # noqa: F811
    work = workdir(tmp_path)
    (work / "job.sh").write_text(JOB)
    job = ge.run(["qsub", "-terse", "job.sh"], cwd=work).stdout.strip()
    record = ended(ge, work, job)
    out = work / f"tmpdir.o{job}"
    text = out.read_text() if out.exists() else f"(no {out.name})"
    assert record.get("exit_status") == "0", (record, text)
    found = dict(line.split("=", 1) for line in text.splitlines() if " TMPDIR=" in line)
    assert found.get("node002 TMPDIR") and found.get("node001 TMPDIR"), text
    assert found["node001 TMPDIR"] != found["node002 TMPDIR"], text
    # Not where another instance's cluster runs its own job 1.
    assert not found["node001 TMPDIR"].startswith("/tmp/"), text
    assert "node001 TMPDIR kept" in text, text
