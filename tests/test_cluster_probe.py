"""``octo-dist probe`` end to end under the PBS imitation (tests/cluster/pbs.py): submitted on node001 by the jobs'
user as a user does it, the probe job runs its commands on a CPU node, and its report says what the node has
(the queue's kill_delay, the job's place and exec_vnode, how mpirun starts remote ranks) and reports as absent
what a CPU node cannot have (GPUs, /dev/infiniband, singularity, show_quota), never invented; ``octo-dist jobs``
knows the job; ``launch`` then warns from the report."""

from __future__ import annotations

import json

import pytest

from helpers import wait_until
from test_cluster_pbs import GROUP, VENV, pbs, workdir  # noqa: F401  (pbs: a pytest fixture, used by name)

pytestmark = [pytest.mark.cluster]


def on_the_site(*command: str) -> list[str]:
    """``octo-dist COMMAND`` with the imitation's group, the venv the jobs run from and no module to load."""
    return [
        str(VENV / "bin" / "octo-dist"),
        *command,
        "--group",
        GROUP,
        "--venv",
        str(VENV),
        "--module",
        "",
    ]


def probe(pbs, work, *flags: str) -> str:  # noqa: F811
    """Submits ``octo-dist probe`` from ``work`` as the jobs' user (``flags`` added) and waits for its job to end,
    while it writes under ``work`` (its log, its report: check-env --deep, a JAX import, takes minutes on a loaded
    2-core machine); the job's id, once it has ended with exit 0."""
    argv = [*on_the_site("probe"), *flags, "--connect", "127.0.0.1:9"]
    proc = pbs.run(argv, user=True, cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.split()[3].rstrip(":")

    def ended():
        record = pbs.job(job_id)
        return record if record.get("job_state") == "F" else None

    record = wait_until(
        ended, watch=[work], what=f"probe job {job_id} to end", tail=pbs.logs, poll_s=2
    )
    assert record.get("Exit_status") == 0, (record, pbs.logs())
    return job_id


KILL_DELAY_S = 7  # set on the queue: the report must read the queue's own, not PBS's default


def test_the_probe_job_reports_a_cpu_node_and_launch_warns_from_it(pbs):  # noqa: F811
    work = workdir(pbs, "probe")
    pbs.qmgr(f"set queue rt_HG kill_delay = {KILL_DELAY_S}")
    try:
        job_id = probe(pbs, work)
    finally:
        pbs.qmgr("unset queue rt_HG kill_delay")
    save = work / "runs" / "probe"
    rep = json.loads((save / "probe.json").read_text())
    facts = rep["facts"]
    assert rep["job_id"] == job_id and rep["queue"] == "rt_HG" and rep["nodes"] == 1
    assert facts["kill_delay"]["seconds"] == KILL_DELAY_S, facts["kill_delay"]
    assert facts["placement"]["hosts"] == ["node001"], facts["placement"]
    assert "plm" in facts["launcher"] and facts["launcher"]["under_pbs"] is True, facts["launcher"]
    for name in (
        "gpus",
        "isolation",
        "infiniband_host",
        "infiniband_image",
        "singularity_login",
        "singularity_compute",
        "quota",
    ):
        assert "absent" in facts[name], (name, facts[name])
    assert facts["check_env"]["exit"] == 0, facts["check_env"]
    assert facts["outbound"] == {
        "target": "127.0.0.1:9",
        "reached": False,
        "error": facts["outbound"]["error"],
    }
    diffs = {d["fact"]: d for d in rep["differences"]}
    assert set(diffs) == {"kill_delay", "outbound"}, rep["differences"]
    assert "Fix: " in (save / "probe.txt").read_text()
    jobs = pbs.run(
        [str(VENV / "bin" / "octo-dist"), "jobs", "--save-dir", "runs/probe"],
        user=True,
        cwd=work,
        check=False,
    )
    assert jobs.returncode == 0 and job_id in jobs.stdout, jobs.stdout + jobs.stderr
    launch = [*on_the_site("launch", "pbs"), "--nodes", "1", "--dry-run"]
    rendered = pbs.run(launch, user=True, cwd=work, check=False)
    assert rendered.returncode == 0, rendered.stderr
    assert f"warning: kill_delay: the probe job {job_id}" in rendered.stderr, rendered.stderr


def test_a_probe_pair_runs_validate_across_the_nodes(pbs):  # noqa: F811
    """--nodes 2: an rt_HF pair on two hosts (place=scatter), octo-dist validate under mpirun across them (node002's
    rank a task of the job, through the site's rsh agent), its result in the report."""
    work = workdir(pbs, "probe-pair")
    probe(pbs, work, "--nodes", "2")
    rep = json.loads((work / "runs" / "probe" / "probe.json").read_text())
    facts = rep["facts"]
    assert rep["queue"] == "rt_HF" and rep["nodes"] == 2
    assert facts["placement"]["hosts"] == ["node001", "node002"], facts["placement"]
    assert facts["validate"]["exit"] == 0, facts["validate"]["tail"]
    assert "placement" not in {d["fact"] for d in rep["differences"]}, rep["differences"]
