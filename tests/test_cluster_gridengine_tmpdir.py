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

# A task on the other node that ends, then: is the master node's TMPDIR still there once the other node's execd has
# cleaned up after it? The master is whichever node the scheduler picked (node001 or node002: CI saw both). The wait
# is on the event (the other node's TMPDIR removed), bounded only for a machine that never gets there. The job's
# script is given TMP and no TMPDIR here (Grid Engine 8.1.9); Open MPI's mpirun takes TMP when TMPDIR is unset.
JOB = """#!/bin/bash
#$ -pe mpi 4
#$ -N tmpdir
#$ -j y
#$ -cwd
me=$(hostname)
other=node002
[ "$me" = node002 ] && other=node001
here=${TMPDIR:-$TMP}
remote=$("$SGE_ROOT/bin/lx-amd64/qrsh" -inherit "$other" printenv TMP | tr -d '\\r')
echo "master $me TMPDIR=$here"
echo "other $other TMPDIR=$remote"
for _ in $(seq 300); do [ -d "$remote" ] || break; sleep 1; done
[ -d "$here" ] && echo "master TMPDIR kept" || echo "master TMPDIR removed"
"""


def test_a_task_ending_on_the_other_node_leaves_the_masters_tmpdir(ge, tmp_path):  # noqa: F811
    work = workdir(tmp_path)
    (work / "job.sh").write_text(JOB)
    job = ge.run(["qsub", "-terse", "job.sh"], cwd=work).stdout.strip()
    record = ended(ge, work, job)
    out = work / f"tmpdir.o{job}"
    text = out.read_text() if out.exists() else f"(no {out.name})"
    assert record.get("exit_status") == "0", (record, text)
    found = {
        line.split()[0]: line.split("=", 1)[1] for line in text.splitlines() if " TMPDIR=" in line
    }
    assert found.get("master") and found.get("other"), text
    assert found["master"] != found["other"], text
    # Not where another instance's cluster runs its own job 1.
    assert not found["master"].startswith("/tmp/"), text
    assert "master TMPDIR kept" in text, text
