"""``launch pbs --reservation ID``: a job in an ABCI reservation (the Reserved service).

ABCI 3.0 user guide, job-execution: "In Reserved service, you first make a reservation in advance to obtain a
reservation ID (Resv ID), and then use this reservation ID to execute interactive jobs and batch jobs"; a job in
a reservation is submitted to the reservation's queue (``-q R...``) and names its resource type with
``-v RTYPE=<resource type>``, which ABCI calls mandatory. A command line's ``-v`` replaces the script's
``#PBS -v``, so ``--submit``/``--chain`` must keep RTYPE in theirs.
"""

import json
import sys

from octo_dist import cli
from octo_dist.jobs.commands import FORWARD_NAMES, FORWARD_PREFIXES

HEAD = ["launch", "pbs", "--nodes", "2", "--group", "gxx00000"]

# Records its argv, answers as PBS's qsub does ("100.pbs1", then "101.pbs1" ...).
FAKE_QSUB = f"""#!{sys.executable}
import json, os, sys
log = os.environ["FAKE_SUBMIT_LOG"]
calls = open(log).read().splitlines() if os.path.exists(log) else []
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
print(f"{{100 + len(calls)}}.pbs1")
"""


def test_a_reservation_renders_its_queue_and_the_resource_type_as_rtype(capsys):
    assert cli.main([*HEAD, "--reservation", "R1234567", "--dry-run"]) == 0
    out = capsys.readouterr().out
    header = [ln for ln in out.splitlines() if ln.startswith("#PBS")]
    assert "#PBS -q R1234567" in header and "#PBS -v RTYPE=rt_HF" in header, header
    assert "#PBS -q rt_HF" not in header, header
    assert "--reservation R1234567" in out  # the launch line in the script's comment


def test_rt_hg_in_a_reservation_says_rt_hg(capsys):
    argv = ["launch", "pbs", "--nodes", "1", "--resource-type", "rt_HG", "--group", "g"]
    assert cli.main([*argv, "--reservation", "R7", "--dry-run"]) == 0
    assert "#PBS -v RTYPE=rt_HG\n" in capsys.readouterr().out


def test_without_a_reservation_there_is_no_rtype(capsys):
    assert cli.main([*HEAD, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "#PBS -q rt_HF\n" in out and "RTYPE" not in out


def test_a_reservation_id_of_another_shape_is_refused_with_the_queue_name(capsys):
    for given in ("1234567", "R1234567.pbs1", "rt_HF"):
        assert cli.main([*HEAD, "--reservation", given, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert f"--reservation {given!r}; expected the reservation's ID as ABCI lists it" in err, (
            err
        )
    assert "Fix: --reservation R1234567" in err or "Fix: --reservation R" in err


def test_a_reservation_lifts_the_spot_services_168_hours(capsys):
    # ABCI: "since you can reserve more days than the elapsed time limit of the Spot Service, it is possible to
    # execute jobs for a longer time"
    argv = [*HEAD, "--walltime", "200:00:00", "--dry-run"]
    assert cli.main(argv) == 2
    capsys.readouterr()
    assert cli.main([*argv, "--reservation", "R1234567"]) == 0
    assert "#PBS -l walltime=200:00:00" in capsys.readouterr().out


def test_submit_and_chain_keep_rtype_in_qsubs_v(tmp_path, monkeypatch, capsys):
    (tmp_path / "qsub").write_text(FAKE_QSUB)
    (tmp_path / "qsub").chmod(0o755)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    log = tmp_path / "submitted.log"
    for name in list(__import__("os").environ):
        if name.startswith(FORWARD_PREFIXES) or name in FORWARD_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SUBMIT_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    argv = [*HEAD, "--reservation", "R1234567", "-o", "job.sh", "--submit", "--chain", "2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert calls == [
        ["-v", "RTYPE=rt_HF", "job.sh"],
        ["-W", "depend=afterany:100.pbs1", "-v", "RTYPE=rt_HF,OCTO_DIST_AFTER=100.pbs1", "job.sh"],
    ], calls


def test_the_rendered_pbs_job_binds_dev_infiniband_where_the_node_has_it(capsys):
    """NCCL opens the HCAs through /dev/infiniband/uverbs*: the job binds the host's /dev/infiniband into the image
    (the job runtime binds a directory only where the node has it), beside the group area."""
    assert cli.main([*HEAD, "--dry-run"]) == 0
    assert '"binds": ["/groups/gxx00000", "/dev/infiniband"]' in capsys.readouterr().out
