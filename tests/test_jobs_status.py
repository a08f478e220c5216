"""``octo-dist jobs``: what ``launch --submit``/``--chain`` started, recorded in the save directory at submission,
read back with the scheduler's answers (fake ``sbatch``/``squeue``/``scancel`` and ``qsub``/``qstat``/``qdel`` on
PATH that answer as the real ones print), the exit files the job runtime leaves and the checkpoints on disk."""

from __future__ import annotations

import json
import os
import sys

import pytest

from helpers import pbs_launch
from octo_dist import cli
from octo_dist.jobs import jobrecord

# Submits like sbatch --parsable / PBS qsub; squeue and qstat answer from FAKE_QUEUE ({"101": "RUNNING", ...});
# scancel/qdel record what they were asked to end.
FAKE = f"""#!{sys.executable}
import json, os, pwd, sys
user = pwd.getpwuid(os.getuid()).pw_name
prog = os.path.basename(sys.argv[0])
state = os.environ["FAKE_STATE"]
data = json.load(open(state)) if os.path.exists(state) else {{"n": 100, "queue": {{}}, "calls": []}}
data["calls"].append([prog] + sys.argv[1:])
queue = data["queue"]
if prog in ("sbatch", "qsub") and sys.argv[1:] != ["--version"]:
    job = str(data["n"]) + (".pbs1" if prog == "qsub" else "")
    data["n"] += 1
    queue[job] = "PENDING" if prog == "sbatch" else "Q"
    print(job if prog == "qsub" else job + ";cluster1")
elif prog == "squeue":
    ids = sys.argv[sys.argv.index("-j") + 1].split(",")
    for job in ids:
        if job in queue:
            reason = "Dependency" if queue[job] == "PENDING" and job != min(queue) else "None"
            print(f"{{job}}|{{queue[job]}}|{{reason}}|{{user}}|octo-dist")
elif prog == "qstat":
    job = sys.argv[-1]
    if job not in queue:
        print(f"qstat: Unknown Job Id {{job}}", file=sys.stderr)
        sys.exit(153)
    record = {{"job_state": queue[job], "Job_Owner": user + "@login1", "Job_Name": "octo-dist"}}
    if queue[job] == "F":
        record["Exit_status"] = 0
    print(json.dumps({{"Jobs": {{job: record}}}}))
elif prog in ("scancel", "qdel"):
    for job in sys.argv[1:]:
        queue.pop(job, None)
json.dump(data, open(state, "w"))
"""


@pytest.fixture
def scheduler(tmp_path, monkeypatch):
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("sbatch", "squeue", "scancel", "qsub", "qstat", "qdel"):
        (tools / name).write_text(FAKE)
        (tools / name).chmod(0o755)
    state = tmp_path / "state.json"
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_STATE", str(state))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)

    class Fake:
        def read(self):
            return json.loads(state.read_text())

        def set(self, **queue):
            data = self.read()
            data["queue"] = {k.lstrip("_"): v for k, v in queue.items()}
            state.write_text(json.dumps(data))

    return Fake()


SLURM = [
    "launch",
    "slurm",
    "--nodes",
    "2",
    "--gpus-per-node",
    "8",
    "--save-dir",
    "runs/ft",
    "-o",
    "job.sh",
]


def jobs(capsys, *argv) -> tuple:
    code = cli.main(["jobs", "--save-dir", "runs/ft", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_chain_is_recorded_in_the_save_dir_and_its_states_read_back(scheduler, capsys, tmp_path):
    assert cli.main([*SLURM, "--submit", "--chain", "3"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    (record,) = json.loads((tmp_path / "runs" / "ft" / jobrecord.RECORD).read_text())
    assert record["scheduler"] == "slurm" and record["save_dir"] == "runs/ft"
    assert [j["id"] for j in record["jobs"]] == ["100", "101", "102"]
    assert record["jobs"][0]["log"] == str(tmp_path / "octo-dist-100.out")
    # The first job ran and ended well (its exit file), the second runs and saved step 150, the third waits.
    (tmp_path / "runs" / "ft" / ".octo-dist-exit-100").write_text("0\n")
    for step, whole in (
        (100, True),
        (150, True),
        (200, False),
    ):  # 200: being saved, no checksums yet
        (tmp_path / "runs" / "ft" / str(step)).mkdir()
        if whole:
            (tmp_path / "runs" / "ft" / str(step) / "checksums.json").write_text("{}")
    scheduler.set(_101="RUNNING", _102="PENDING")
    code, out, err = jobs(capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("chain of 3 (slurm, submitted ") and lines[0].endswith(", job.sh):")
    assert lines[1].split()[:4] == ["100", "done", "exit", "0"]
    assert lines[2].split()[:2] == ["101", "running"]
    assert lines[3].split()[:2] == ["102", "held"] and "waits for the job before it" in lines[3]
    assert lines[4] == f"newest checkpoint: step 150 ({tmp_path / 'runs' / 'ft' / '150'})"
    # The running job's log, as a terminal shows it (a progress bar's last drawing).
    (tmp_path / "octo-dist-101.out").write_text(
        "start\ntrain: 1%\rtrain: 50%\rtrain: 75% loss 0.1\n"
    )
    code, out, _ = jobs(capsys, "log", "--lines", "1")
    assert (
        code == 0
        and out == f"job 101 (running), {tmp_path / 'octo-dist-101.out'}:\ntrain: 75% loss 0.1\n"
    )
    # Cancel ends the rest of the chain, and only that.
    code, out, err = jobs(capsys, "cancel")
    assert code == 0, err
    assert out == "cancelled 101, 102 (scancel 101 102)\n"
    assert scheduler.read()["calls"][-1] == ["scancel", "101", "102"]
    code, out, _ = jobs(capsys)
    assert [ln.split()[1] for ln in out.splitlines()[1:4]] == ["done", "ended", "ended"]
    assert (
        jobs(capsys, "cancel")[1] == "nothing to cancel: no job of the chain is queued or running\n"
    )


def test_pbs_states_come_from_qstat_and_a_failed_job_from_its_exit_file(
    scheduler, capsys, tmp_path
):
    argv = pbs_launch("--save-dir", "runs/ft", "-o", "job.sh")
    assert cli.main([*argv, "--submit", "--chain", "2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    scheduler.set(**{"_100.pbs1": "F", "_101.pbs1": "H"})
    (tmp_path / "runs" / "ft" / ".octo-dist-exit-100.pbs1").write_text("1\n")
    code, out, _ = jobs(capsys)
    rows = out.splitlines()
    assert rows[1].split()[:4] == ["100.pbs1", "failed", "exit", "1"]
    assert rows[2].split()[:2] == ["101.pbs1", "held"] and rows[3] == "newest checkpoint: none yet"
    assert jobs(capsys, "cancel")[1] == "cancelled 101.pbs1 (qdel 101.pbs1)\n"


def test_no_record_is_one_line_with_the_fix(scheduler, capsys, tmp_path):
    code, out, err = jobs(capsys)
    assert code == 2 and out == ""
    index = tmp_path / "home" / ".octo-dist" / "jobs.json"
    assert err == (
        "octo-dist jobs: error: no jobs recorded for --save-dir runs/ft (no runs/ft/.octo-dist-jobs.json, and "
        f"none in {index}); expected the save directory of a launch --submit or --chain run. Fix: octo-dist jobs "
        "--save-dir DIR, with the --save-dir you gave launch\n"
    )


@pytest.mark.parametrize("content", [b"\xff\xfe", b"{"])
def test_a_damaged_record_is_one_line(scheduler, capsys, tmp_path, content):
    (tmp_path / "runs" / "ft").mkdir(parents=True)
    (tmp_path / "runs" / "ft" / jobrecord.RECORD).write_bytes(content)
    code, _, err = jobs(capsys)
    assert code == 2 and err.count("\n") == 1 and "Fix: remove" in err, err


def test_the_save_dir_is_read_from_the_rendered_script(tmp_path):
    from octo_dist.jobs import render
    from octo_dist.jobs.cli import parse

    job = parse(["slurm", "--nodes", "1", "--gpus-per-node", "2", "--save-dir", "runs/it's here"])
    assert jobrecord.save_dir_of_script(render.render(job, "job.sh")) == "runs/it's here"
    assert jobrecord.save_dir_of_script("#!/bin/bash\necho not ours\n") is None
    assert os.path.basename(jobrecord.record_path("runs/x", "/w")) == jobrecord.RECORD


def test_a_second_chain_into_a_busy_save_dir_is_refused_unless_asked_for(
    scheduler, capsys, tmp_path
):
    """Before: a second chain into the same save directory was submitted without a word, jobs showed only the
    newest chain, and cancel left the older jobs holding nodes."""
    assert cli.main([*SLURM, "--submit", "--chain", "2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    scheduler.set(_100="RUNNING", _101="PENDING")
    submitted = len(scheduler.read()["calls"])
    assert cli.main([*SLURM, "--submit"]) == 2
    err = capsys.readouterr().err
    assert (
        "jobs recorded for --save-dir runs/ft are still queued or running (100 running, 101 held)"
        in err
    )
    assert "nothing submitted" in err and "--beside-running" in err
    assert [c[0] for c in scheduler.read()["calls"][submitted:]] == [
        "squeue"
    ]  # asked, never sbatch
    # Asked for in so many words: submitted, and both chains are listed and cancelled.
    assert cli.main([*SLURM, "--submit", "--beside-running"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    code, out, err = jobs(capsys)
    assert code == 0, err
    heads = [ln for ln in out.splitlines() if not ln.startswith("  ")]
    assert heads[0].startswith("chain of 2 (slurm") and heads[1].startswith("one job (slurm")
    assert [ln.split()[:2] for ln in out.splitlines() if ln.startswith("  ")] == [
        ["100", "running"],
        ["101", "held"],
        ["102", "held"],
    ]
    code, out, err = jobs(capsys, "cancel")
    assert code == 0, err
    assert scheduler.read()["calls"][-2:] == [["scancel", "100", "101"], ["scancel", "102"]]
    # Once they have ended, a new chain goes in without the flag.
    (tmp_path / "runs" / "ft" / ".octo-dist-exit-100").write_text("0\n")
    assert cli.main([*SLURM, "--submit"]) == 0, capsys.readouterr().err


def test_jobs_works_from_any_directory(scheduler, capsys, tmp_path, monkeypatch):
    assert cli.main([*SLURM, "--submit"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    scheduler.set(_100="RUNNING")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for save_dir in ("runs/ft", str(tmp_path / "runs" / "ft")):
        code = cli.main(["jobs", "--save-dir", save_dir])
        out, err = capsys.readouterr()
        assert code == 0 and out.splitlines()[1].split()[:2] == ["100", "running"], (out, err)
    # A name that two save directories share is not guessed.
    monkeypatch.chdir(elsewhere)
    assert cli.main([*SLURM, "--submit"]) == 0, capsys.readouterr().err
    monkeypatch.chdir(tmp_path / "home")
    assert cli.main(["jobs", "--save-dir", "runs/ft"]) == 2
    err = capsys.readouterr().err
    assert (
        "names 2 save directories you submitted jobs for" in err
        and str(elsewhere / "runs" / "ft") in err
    )


def test_the_record_is_never_written_through_a_planted_link(
    scheduler, capsys, tmp_path, monkeypatch
):
    """Before: the record was written to ``.octo-dist-jobs.json.tmp-<pid>`` through whatever lay there: a link
    planted at that name (the pid is easy to guess) wrote the record into the file it points at."""
    save = tmp_path / "runs" / "ft"
    save.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        os.symlink(victim, save / f"{jobrecord.RECORD}.tmp-{pid}")
    assert cli.main([*SLURM, "--submit"]) == 0, capsys.readouterr().err
    assert victim.read_text() == "precious\n"
    (entry,) = json.loads((save / jobrecord.RECORD).read_text())
    assert [j["id"] for j in entry["jobs"]] == ["100"]
    assert not (save / jobrecord.RECORD).is_symlink()


def test_a_save_dir_that_is_a_file_submits_nothing(scheduler, capsys, tmp_path):
    """Before: the job was submitted (to fail at its start) and nothing recorded it."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "ft").write_text("not a directory\n")
    assert cli.main([*SLURM, "--submit"]) == 2
    err = capsys.readouterr().err
    assert "--save-dir runs/ft cannot be made in" in err and "nothing submitted" in err, err
    calls = scheduler.read()["calls"] if os.path.exists(os.environ["FAKE_STATE"]) else []
    assert not [c for c in calls if c[0] == "sbatch"], calls


def test_extend_adds_jobs_after_the_last_one_of_a_running_chain(scheduler, capsys, tmp_path):
    assert cli.main([*SLURM, "--submit", "--chain", "2"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    scheduler.set(_100="RUNNING", _101="PENDING")
    code, out, err = jobs(capsys, "extend", "--add", "2")
    assert code == 0, err
    assert out.splitlines() == [
        f"submitted job 102, after 101: log {tmp_path / 'octo-dist-102.out'}",
        f"submitted job 103, after 102: log {tmp_path / 'octo-dist-103.out'}",
    ]
    sbatch = [c for c in scheduler.read()["calls"] if c[0] == "sbatch"]
    assert any("afterany:101" in a for a in sbatch[2]) and any(
        "afterany:102" in a for a in sbatch[3]
    )
    records = json.loads((tmp_path / "runs" / "ft" / jobrecord.RECORD).read_text())
    assert records[1]["after"] == "101" and [j["id"] for j in records[1]["jobs"]] == ["102", "103"]
    # A chain whose jobs have all ended is not extended: nothing would wait for it.
    scheduler.set()
    code, out, err = jobs(capsys, "extend")
    assert code == 2 and "not queued or running" in err and "--chain N" in err, err


def test_jobs_estimates_the_jobs_still_needed_from_the_measured_step_time(
    scheduler, capsys, tmp_path
):
    argv = [
        *SLURM,
        "--walltime",
        "1:00:00",
        "--submit",
        "--chain",
        "2",
        "--",
        "smoke",
        "--steps",
        "10000",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    scheduler.set(_100="RUNNING", _101="PENDING")
    save = tmp_path / "runs" / "ft"
    (save / "200").mkdir()
    (save / "200" / "checksums.json").write_text("{}")
    # As the first job's summary says it (apps/summary.py): 1 s a step, 100 s to its first step.
    (save / "summary.json").write_text(
        json.dumps({"median_step_s": 1.0, "time_to_first_step_s": 100.0})
    )
    code, out, err = jobs(capsys)
    assert code == 0, err
    # 3600 s wall time - 300 s stop margin - 100 s start-up = 3200 steps a job; 9800 left: 4 jobs, 2 queued
    assert out.splitlines()[-1] == (
        "estimate: step 200 of 10000; 1 s a step (measured), 0:53 of training a job: about 4 more jobs, 2 "
        "queued or running; add 2: octo-dist jobs --save-dir runs/ft extend --add 2"
    )


def test_jobs_shows_a_probe_report_found_in_the_save_dir(scheduler, capsys, tmp_path):
    """A probe job's report beside the run: `jobs` names each way the site differs from what launch assumes."""
    assert cli.main([*SLURM, "--submit"]) == 0, capsys.readouterr().err
    scheduler.set(_100="RUNNING")
    capsys.readouterr()
    report = {
        "job_id": "7.pbs1",
        "nodes": 2,
        "facts": {"infiniband": {"devices": [], "absent": "no /dev/infiniband in the image"}},
    }
    (tmp_path / "runs" / "ft" / "probe.json").write_text(json.dumps(report))
    code, out, err = jobs(capsys)
    assert code == 0, err
    probe = [line for line in out.splitlines() if line.startswith("probe report ")]
    assert probe and "(job 7.pbs1)" in probe[0], out
