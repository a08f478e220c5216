"""``octo-dist launch --submit`` / ``--chain N`` against fake ``qsub``/``sbatch`` executables that record their
arguments and answer with job ids as the real ones print them."""

import json
import os
import re
import sys

import pytest

from helpers import HANG_S, with_growing_budget

from octo_dist import cli
from octo_dist.jobs.commands import FORWARD_NAMES, FORWARD_PREFIXES
from octo_dist.jobs import schedulers, submit

FAKE_SCHEDULER = f"""#!{sys.executable}
# Records its argv; answers like PBS qsub ("12.pbs1"), Grid Engine qsub -terse ("12") or sbatch --parsable ("12").
import json, os, sys
log = os.environ["FAKE_SUBMIT_LOG"]
calls = open(log).read().splitlines() if os.path.exists(log) else []
if os.environ.get("FAKE_REFUSE_AT") == str(len(calls) + 1):
    print("qsub: Unknown queue", file=sys.stderr)
    sys.exit(1)
with open(log, "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
n = 100 + len(calls)
print({{"pbs": f"{{n}}.pbs1", "sge": f"{{n}}", "slurm": f"{{n}};cluster1"}}[os.environ["FAKE_SCHEDULER"]])
"""

HEADS = {
    "pbs": ["pbs", "--nodes", "2", "--group", "gxx00000"],
    "sge": ["sge", "--nodes", "2", "--gpus-per-node", "4", "--group", "gxx00000"],
    "slurm": ["slurm", "--nodes", "2", "--gpus-per-node", "8"],
}


@pytest.fixture
def fake_scheduler(tmp_path, monkeypatch):
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("qsub", "sbatch"):
        (tools / name).write_text(FAKE_SCHEDULER)
        (tools / name).chmod(0o755)
    log = tmp_path / "submitted.log"
    for name in list(
        os.environ
    ):  # PBS's submission names the shell's forwarded variables: none here
        if name.startswith(FORWARD_PREFIXES) or name in FORWARD_NAMES:
            monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SUBMIT_LOG", str(log))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def calls():
        return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []

    return calls


EXPECTED = {  # scheduler -> (argv of the 2nd and 3rd submission, ids printed, log of the first job)
    "pbs": (
        [
            ["qsub", "-W", "depend=afterany:100.pbs1", "-v", "OCTO_DIST_AFTER=100.pbs1", "job.sh"],
            ["qsub", "-W", "depend=afterany:101.pbs1", "-v", "OCTO_DIST_AFTER=101.pbs1", "job.sh"],
        ],
        ["100.pbs1", "101.pbs1", "102.pbs1"],
        "home/octo-dist.o100",
    ),
    "sge": (
        [
            [
                "qsub",
                "-terse",
                "-hold_jid",
                "100",
                "-v",
                "OCTO_DIST_AFTER=100",
                "job.sh",
            ],
            [
                "qsub",
                "-terse",
                "-hold_jid",
                "101",
                "-v",
                "OCTO_DIST_AFTER=101",
                "job.sh",
            ],
        ],
        ["100", "101", "102"],
        "octo-dist.o100",
    ),
    "slurm": (
        [
            [
                "sbatch",
                "--parsable",
                "--dependency=afterany:100",
                "--export=ALL,OCTO_DIST_AFTER=100",
                "job.sh",
            ],
            [
                "sbatch",
                "--parsable",
                "--dependency=afterany:101",
                "--export=ALL,OCTO_DIST_AFTER=101",
                "job.sh",
            ],
        ],
        ["100", "101", "102"],
        "octo-dist-100.out",
    ),
}


@pytest.mark.parametrize("scheduler", sorted(HEADS))
def test_chain_submits_each_job_after_the_previous_one(
    fake_scheduler, tmp_path, monkeypatch, capsys, scheduler
):
    monkeypatch.setenv("FAKE_SCHEDULER", scheduler)
    assert (
        cli.main(["launch", *HEADS[scheduler], "-o", "job.sh", "--submit", "--chain", "3"]) == 0
    ), capsys.readouterr().err
    out = capsys.readouterr().out
    later, ids, first_log = EXPECTED[scheduler]
    calls = fake_scheduler()
    assert len(calls) == 3 and calls[1:] == later, calls
    assert (
        "depend" not in " ".join(calls[0])
        and "hold_jid" not in calls[0]
        and "OCTO_DIST_AFTER" not in str(calls[0])
    )
    for n, job in enumerate(ids):
        assert f"submitted job {job}" in out, out
    # The wall time and its cost in the "wrote" line, and the whole chain's before anything is queued.
    wrote, summary = out.splitlines()[:2]
    assert re.search(r", wall time \d\d:\d\d:\d\d, at most [\d,.]+ node-hours?$", wrote), wrote
    assert re.fullmatch(
        r"submitting 3 jobs x 2 nodes x \d\d:\d\d:\d\d = at most [\d,.]+ node-hours?", summary
    ), out
    assert (
        f"log {tmp_path / first_log}" in out and f"submitted job {ids[1]}, after {ids[0]}" in out
    ), out


def test_submit_once_and_a_refusal_is_reported(fake_scheduler, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_SCHEDULER", "pbs")
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit"]) == 0
    assert "submitted job 100.pbs1: log " in capsys.readouterr().out and len(fake_scheduler()) == 1
    monkeypatch.setenv("FAKE_REFUSE_AT", "3")  # the second job of this chain: 1 call logged already
    argv = ["launch", *HEADS["pbs"], "-o", "job.sh", "--submit", "--chain", "2", "--beside-running"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "failed (exit 1): qsub: Unknown queue; submitted before it: 101.pbs1" in err, err


def test_chain_and_dry_run_are_refused_together_and_chain_must_be_positive(fake_scheduler, capsys):
    assert cli.main(["launch", *HEADS["pbs"], "--dry-run", "--submit"]) == 2
    assert "--dry-run with --submit" in capsys.readouterr().err
    assert cli.main(["launch", *HEADS["pbs"], "--chain", "0"]) == 2
    assert (
        f"--chain 0; expected 1 to {submit.MAX_CHAIN} jobs in one chain" in capsys.readouterr().err
    )
    assert fake_scheduler() == []


@pytest.mark.parametrize(
    "scheduler, answer, job",
    [
        ("pbs", "12345.pbs1\n", "12345.pbs1"),
        ("sge", "678\n", "678"),
        ("sge", "678.1-10:1\n", "678"),
        ("slurm", "91;c1\n", "91"),
        ("slurm", "91\n", "91"),
    ],
)
def test_job_ids_as_the_schedulers_print_them(scheduler, answer, job):
    assert submit.job_id(scheduler, answer) == job


def test_an_answer_without_a_job_id_is_an_error():
    with pytest.raises(submit.SubmitError, match="cannot read a job id"):
        submit.job_id("slurm", "sbatch: error: Batch job submission failed\n")


def test_without_the_scheduler_here_the_script_is_still_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no qsub
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit"]) == 1
    err = capsys.readouterr().err
    assert (
        "no qsub here; expected to run on the cluster's login node" in err
        and (tmp_path / "job.sh").exists()
    )


# --- a scheduler that hangs, answers in bytes that are not UTF-8, or colours its error -----------------------------

ODD_SCHEDULER = f"""#!{sys.executable}
# The first call answers like PBS qsub; the call FAKE_ODD_AT behaves as FAKE_ODD says. `qsub --version` (asked after
# a failure, to tell PBS's qsub from Grid Engine's) answers as PBS's and is not a submission.
import os, sys, time
if sys.argv[1:] == ["--version"]:
    print("pbs_version = 22.05.11")
    sys.exit(0)
log = os.environ["FAKE_SUBMIT_LOG"]
n = len(open(log).read().splitlines()) if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write("call\\n")
if os.environ.get("FAKE_ODD_AT") == str(n + 1):
    odd = os.environ["FAKE_ODD"]
    if odd == "hang":
        time.sleep(600)
    if odd == "bytes":
        sys.stdout.buffer.write(b"\\xff\\xfe job \\x80 accepted\\n")
        sys.exit(0)
    if odd == "colour":
        sys.stderr.buffer.write(b"\\x1b[31mqsub: \\x1b]0;owned\\x07Unknown queue \\xc3\\n")
        sys.exit(1)
print(f"{{100 + n}}.pbs1")
"""


@pytest.fixture
def odd_scheduler(tmp_path, monkeypatch):
    for name in list(
        os.environ
    ):  # PBS's submission names the shell's forwarded variables: none here
        if name.startswith(FORWARD_PREFIXES) or name in FORWARD_NAMES:
            monkeypatch.delenv(name)
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "qsub").write_text(ODD_SCHEDULER)
    (tools / "qsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SUBMIT_LOG", str(tmp_path / "calls.log"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    # As in a checkout: no warning of a missing --venv.
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    return tmp_path / "calls.log"


def test_a_scheduler_answering_bytes_that_are_not_utf8_mid_chain_reports_the_job_submitted(
    odd_scheduler, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_ODD_AT", "2")
    monkeypatch.setenv("FAKE_ODD", "bytes")
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit", "--chain", "3"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("octo-dist launch: error: "), err
    assert (
        "cannot read a job id from the scheduler's answer '\\xff\\xfe job \\x80 accepted'" in err
    ), err
    assert err.rstrip().endswith("submitted before it: 100.pbs1"), err
    assert len(odd_scheduler.read_text().splitlines()) == 2  # the chain stopped there


def test_a_failing_schedulers_terminal_sequences_are_shown_escaped(
    odd_scheduler, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_ODD_AT", "1")
    monkeypatch.setenv("FAKE_ODD", "colour")
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit"]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 1, repr(err)
    assert "failed (exit 1): \\x1b[31mqsub: \\x1b]0;owned\\x07Unknown queue \\xc3" in err, err


def test_a_scheduler_that_hangs_mid_chain_is_stopped_after_the_timeout(odd_scheduler, monkeypatch):
    monkeypatch.setenv("FAKE_ODD_AT", "2")
    monkeypatch.setenv("FAKE_ODD", "hang")

    def run(budget):
        odd_scheduler.unlink(missing_ok=True)  # the calls are counted from there
        with pytest.raises(submit.SubmitError) as e:
            submit.submit("pbs", "job.sh", name="octo-dist", group=None, chain=3, timeout_s=budget)
        return str(e.value)

    # The first qsub (a Python program) must answer within the budget: it grows on a machine too busy for that.
    budget, message = with_growing_budget(run, lambda m: "depend=afterany:100.pbs1" in m)
    assert (
        "qsub -W depend=afterany:100.pbs1" in message
        and f"did not answer within {budget} s" in message
    )
    assert message.endswith("submitted before it: 100.pbs1") and "\n" not in message


def test_launch_submit_with_a_hanging_scheduler_returns_with_one_line(
    odd_scheduler, monkeypatch, capsys
):
    """Through the command line, with the built-in timeout (SUBMIT_TIMEOUT_S) made short for the test."""
    monkeypatch.setenv("FAKE_ODD_AT", "1")
    monkeypatch.setenv("FAKE_ODD", "hang")
    monkeypatch.setattr(submit, "SUBMIT_TIMEOUT_S", 3)
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit"]) == 1
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "qsub job.sh did not answer within 3 s and was stopped" in err
    ), err


def test_a_chain_longer_than_the_maximum_is_refused_before_anything_is_written(
    odd_scheduler, capsys
):
    assert cli.main(["launch", *HEADS["pbs"], "-o", "job.sh", "--submit", "--chain", "100000"]) == 2
    err = capsys.readouterr().err
    assert f"--chain 100000; expected 1 to {submit.MAX_CHAIN} jobs in one chain" in err, err
    assert not odd_scheduler.exists() and not (odd_scheduler.parent / "job.sh").exists()
    with pytest.raises(submit.SubmitError, match="a chain of 100000 jobs; expected 1 to"):
        submit.submit("pbs", "job.sh", name="x", group=None, chain=100000)
    assert not odd_scheduler.exists()


def test_the_chains_maximum_is_in_launchs_help():
    import subprocess

    from helpers import REPO

    help_text = subprocess.run(
        [sys.executable, "-m", "octo_dist", "launch", "pbs", "--help"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=REPO,
    ).stdout
    assert f"at most {submit.MAX_CHAIN}" in " ".join(help_text.split())


def test_pbs_submits_the_shells_forwarded_variables_and_keeps_the_scripts_list(tmp_path):
    """qsub passes nothing of the submitting shell unless told, and a command line's -v replaces the script's
    "#PBS -v": the one -v holds both, the script's value winning, then the chain's predecessor."""
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n#PBS -N x\n#PBS -v MARK=script,B\n#PBS -vC=3\necho hi\n#PBS -v LATE=1\n"
    )
    environ = {
        "NCCL_DEBUG": "INFO",
        "MARK": "x",
        "OCTO_DIST_MARK": "shell",
        "PATH": "/bin",
        "HOME": "/h",
    }
    pbs = schedulers.get("pbs")
    assert pbs.submit_command(str(script), None, environ) == [
        "qsub", "-v", "MARK=script,B,C=3,NCCL_DEBUG,OCTO_DIST_MARK", str(script)
    ]  # fmt: skip
    assert pbs.submit_command(str(script), "7.pbs", {**environ, "OCTO_DIST_AFTER": "6.pbs"}) == [
        "qsub", "-W", "depend=afterany:7.pbs", "-v",
        "MARK=script,B,C=3,NCCL_DEBUG,OCTO_DIST_MARK,OCTO_DIST_AFTER=7.pbs", str(script),
    ]  # fmt: skip
    script.write_text("#!/bin/bash\n#PBS -v OCTO_DIST_MARK=script\n")
    assert pbs.submit_command(str(script), None, environ) == [
        "qsub", "-v", "OCTO_DIST_MARK=script,NCCL_DEBUG", str(script)
    ]  # fmt: skip
    assert pbs.submit_command(str(tmp_path / "none.sh"), None, {}) == [
        "qsub",
        str(tmp_path / "none.sh"),
    ]


def test_a_refusal_over_several_lines_is_quoted_on_one_line_without_escapes(
    tmp_path, monkeypatch, capsys
):
    """Before: Grid Engine's two-line refusal was quoted as 'Unable to run job: ...\\nExiting.' (a literal \\n)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "qsub").write_text(
        f"#!{sys.executable}\nimport sys\n"
        "sys.stderr.write('Unable to run job: error: no suitable queues.\\nExiting.\\n'); sys.exit(1)\n"
    )
    (tools / "qsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    assert cli.main(["launch", *HEADS["sge"], "-o", "job.sh", "--submit"]) == 1
    err = capsys.readouterr().err
    assert "failed (exit 1): Unable to run job: error: no suitable queues.; Exiting." in err, err
    assert "\\n" not in err
