"""``octo-dist jobs`` never wrong about a job: a scheduler that cannot be asked, the exit lines the job runtime
writes, and what the user's record says, each read from fabricated inputs (fake ``qstat``/``squeue`` on PATH
printing what the real ones print, exit files and records written by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from octo_dist import cli
from octo_dist.jobs import jobrecord, status
from helpers import HANG_S


def fake_command(tools, name: str, stdout: str = "", stderr: str = "", code: int = 0) -> None:
    """A ``name`` on PATH that prints what it is given and exits ``code``; its argv is appended to calls.log."""
    log = tools / "calls.log"
    (tools / name).write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(repr(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write({stdout!r}); sys.stderr.write({stderr!r}); sys.exit({code})\n"
    )
    (tools / name).chmod(0o755)


def fake_by_id(tools, name: str, answers: dict) -> None:
    """A ``name`` on PATH answering for the job id that is its last argument: ``{"555.pbs1": (stdout, code)}``;
    its argv is appended to calls.log."""
    log = tools / "calls.log"
    (tools / name).write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(repr(sys.argv[1:]) + '\\n')\n"
        f"out, code = {answers!r}.get(sys.argv[-1], ('', 0))\n"
        "sys.stdout.write(out); sys.exit(code)\n"
    )
    (tools / name).chmod(0o755)


def calls(tools) -> list:
    log = tools / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def tools(tmp_path, monkeypatch):
    tools = tmp_path / "tools"
    tools.mkdir()
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tools


def write_record(tmp_path, scheduler: str, ids, **extra) -> None:
    save = tmp_path / "runs" / "ft"
    save.mkdir(parents=True, exist_ok=True)
    entry = {
        "scheduler": scheduler,
        "script": str(tmp_path / "job.sh"),
        "submit_dir": str(tmp_path),
        "save_dir": "runs/ft",
        "submitted": "2026-12-06T04:20:00Z",
        "jobs": [{"id": i, "log": str(tmp_path / f"octo-dist-{i}.out")} for i in ids],
        **extra,
    }
    (save / jobrecord.RECORD).write_text(json.dumps([entry]))


def jobs(capsys, *argv) -> tuple:
    code = cli.main(["jobs", "--save-dir", "runs/ft", *argv])
    out, err = capsys.readouterr()
    return code, out, err


CANNOT_CONNECT = "Connection refused\nqstat: cannot connect to server pbs1 (errno=15010)\n"


@pytest.mark.parametrize(
    "scheduler, command, ids, said",
    [
        ("pbs", "qstat", ["555.pbs1", "556.pbs1"], CANNOT_CONNECT),
        (
            "slurm",
            "squeue",
            ["100", "101"],
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
        ),
        (
            "sge",
            "qstat",
            ["77", "78"],
            "error: commlib error: got select error (Connection refused)\n",
        ),
    ],
)
def test_a_scheduler_that_cannot_be_asked_leaves_the_jobs_unknown_not_ended(
    tools, tmp_path, capsys, scheduler, command, ids, said
):
    write_record(tmp_path, scheduler, ids)
    fake_command(tools, command, stderr=said, code=1)
    code, out, err = jobs(capsys)
    assert code == 1, (out, err)
    rows = out.splitlines()[1:3]
    assert [r.split()[:2] for r in rows] == [[i, "unknown"] for i in ids], out
    assert "ended" not in out and "no exit status" not in out
    first_line = said.strip().splitlines()[0]
    assert first_line in out and first_line in err and err.count("\n") == 1, err
    # cancel does not act on a guess either
    fake_command(tools, "qdel")
    fake_command(tools, "scancel")
    assert jobs(capsys, "cancel")[0] == 1
    assert not [c for c in calls(tools) if "qdel" in c or "scancel" in c]


def test_a_job_the_scheduler_no_longer_knows_is_read_from_its_exit_file(tools, tmp_path, capsys):
    write_record(tmp_path, "pbs", ["555.pbs1"])
    fake_command(tools, "qstat", stderr="qstat: Unknown Job Id 555.pbs1\n", code=153)
    (tmp_path / "runs" / "ft" / ".octo-dist-exit-555.pbs1").write_text("0\n")
    code, out, err = jobs(capsys)
    assert code == 0, err
    assert out.splitlines()[1].split()[:2] == ["555.pbs1", "done"]


def _runtime_lines():
    """Every line the job runtime writes to an exit file (``Supervisor.exit_text``, ``request_stop``), with how
    ``octo-dist jobs`` must show it and whether the next job of a chain trains after it."""
    from octo_dist.jobs.supervisor import exitfile

    stopped = "stopped by SIGTERM, but the training exited with 143 before every rank said it saved"
    return [
        ("0", "done", "exit 0", True),
        (exitfile.stopping("TERM", 21), "stopped", "ended during a stop", True),
        (exitfile.stopping("USR1", 0), "stopped", "ended during a stop", True),
        (exitfile.resumable(143, stopped), "stopped", "exit 143, resumable", True),
        (
            exitfile.resumable(137, "the launcher was killed by SIGKILL after 40s"),
            "stopped",
            "exit 137, resumable",
            True,
        ),
        ("2", "failed", "exit 2", False),
        ("1", "failed", "exit 1", False),
        ("134", "failed", "exit 134", False),
        ("", "failed", "empty exit status", None),
    ]


@pytest.mark.parametrize("line, state, detail, trains", _runtime_lines())
def test_every_exit_line_the_runtime_writes_reads_the_same_for_jobs_and_the_chain(
    tools, tmp_path, capsys, line, state, detail, trains
):
    from octo_dist.jobs.supervisor import exitfile

    write_record(tmp_path, "slurm", ["100"])
    fake_command(tools, "squeue")  # the job has left the queue
    exit_path = tmp_path / "runs" / "ft" / ".octo-dist-exit-100"
    # Written as the runtime writes it (exitfile.write: the line and a newline; an empty file on a full disk).
    if line:
        assert exitfile.write(str(exit_path), line) is None
    else:
        exit_path.write_text("")
    assert exitfile.read(str(exit_path))[0] is trains
    code, out, err = jobs(capsys)
    assert code == 0, err
    row = out.splitlines()[1]
    assert row.split()[:2] == ["100", state] and detail in row, row
    (tmp_path / "octo-dist-100.out").write_text("the job's last words\n")
    code, out, err = jobs(capsys, "log")
    assert code == 0 and "the job's last words" in out, err


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_previous_exit_file_that_is_no_file_is_named_not_read_as_missing(tmp_path, kind):
    """Before: a directory or a FIFO at the previous job's exit file read as "left no exit status" and the chain
    resumed; now it is named (without opening the FIFO for a writer that never comes) and the job does not train."""
    from octo_dist.jobs.supervisor import prepare

    path = tmp_path / ".octo-dist-exit-9.pbs1"
    os.mkdir(path) if kind == "directory" else os.mkfifo(path)
    notes = []
    with pytest.raises(prepare.JobFailed) as e:
        prepare.previous_job(str(tmp_path), "9.pbs1", notes.append)
    said = "a directory, not a file" if kind == "directory" else "a FIFO, not a file"
    assert said in str(e.value) and not notes, (str(e.value), notes)


def _qstat_json(job_id: str, owner: str, name: str, state: str = "R") -> str:
    """What PBS's ``qstat -x -f -F json ID`` prints of a job (the fields read; the real one has ~60)."""
    job = {"Job_Name": name, "Job_Owner": f"{owner}@login1", "job_state": state, "queue": "rt_HF"}
    return json.dumps({"timestamp": 1765000000, "pbs_version": "2022.1.1", "Jobs": {job_id: job}})


def test_cancel_ends_only_the_callers_jobs_of_the_recorded_name(tools, tmp_path, capsys):
    """Before: qdel ran on every id the record named, never comparing whose job it was: a record naming 555.pbs1
    deleted another user's job that was not octo-dist's."""
    me = status.caller()
    write_record(tmp_path, "pbs", ["555.pbs1", "556.pbs1", "557.pbs1"], name="ft-run")
    answers = {
        "555.pbs1": (_qstat_json("555.pbs1", "mallory", "build"), 0),  # another user's job
        "556.pbs1": (_qstat_json("556.pbs1", me, "ft-run"), 0),  # this chain's
        "557.pbs1": (
            _qstat_json("557.pbs1", me, "eval", "Q"),
            0,
        ),  # the caller's, another job's name
    }
    fake_by_id(tools, "qstat", answers)
    fake_command(tools, "qdel")
    code, out, err = jobs(capsys, "cancel")
    deletes = [c for c in calls(tools) if "-x" not in c]
    assert deletes == ["['556.pbs1']"], calls(tools)
    assert out == "cancelled 556.pbs1 (qdel 556.pbs1)\n"
    assert code == 1, "a job left alone is said, and the exit is not 0"
    said = err.splitlines()
    assert len(said) == 2, err
    assert "not cancelling 555.pbs1: it is mallory's job, not yours" in said[0]
    assert "not cancelling 557.pbs1: its name is 'eval', not the recorded 'ft-run'" in said[1]


@pytest.mark.parametrize("job_id", ["-u", "--all", "1 2", "../x", "555.pbs1;rm", ""])
def test_a_recorded_id_that_is_no_job_id_never_becomes_an_argument(tools, tmp_path, capsys, job_id):
    write_record(tmp_path, "slurm", ["100", job_id], name="octo-dist")
    fake_command(tools, "squeue", stdout="")
    fake_command(tools, "scancel")
    for action in ("status", "cancel"):
        code, out, err = jobs(capsys, action)
        assert code == 2 and err.count("\n") == 1 and "is not a job id" in err, (out, err)
    assert calls(tools) == []


def _save_checkpoint(layout, step: int, whole: bool = True) -> None:
    """A checkpoint as the engine leaves it: the step's directory, its checksums record written last."""
    os.makedirs(layout.checkpoint(step))
    if whole:
        with open(os.path.join(layout.checkpoint(step), "checksums.json"), "w") as f:
            f.write("{}")


@pytest.mark.parametrize("group", ["", "ablation"])
def test_jobs_finds_a_finetunes_checkpoints_where_finetune_saves_them(
    tools, tmp_path, capsys, group
):
    """Before: the search stopped one level above ``<project>/<name>/train_state/<step>`` (only the smoke's
    layout was tested): "newest checkpoint: none yet" after hours of fine-tuning."""
    from octo_dist.apps.finetune import config
    from octo_dist.engine import checksums

    assert checksums.MANIFEST == "checksums.json"
    write_record(tmp_path, "slurm", ["100"])
    fake_command(tools, "squeue")
    wandb = {"project": "octo_finetune", "group": group}
    layout = config.layout({"save_dir": str(tmp_path / "runs" / "ft"), "wandb": wandb}, "ft_run")
    os.makedirs(
        os.path.join(layout.run_dir, "800")
    )  # Octo's save_pretrained beside train_state: not a checkpoint
    _save_checkpoint(layout, 600)
    _save_checkpoint(layout, 700)
    _save_checkpoint(layout, 900, whole=False)  # being written
    code, out, err = jobs(capsys)
    assert code == 0, err
    assert out.splitlines()[-1] == f"newest checkpoint: step 700 ({layout.checkpoint(700)})"


def test_the_smokes_layout_still_reads(tools, tmp_path, capsys):
    from octo_dist import savelayout

    write_record(tmp_path, "slurm", ["100"])
    fake_command(tools, "squeue")
    layout = savelayout.RunLayout(str(tmp_path / "runs" / "ft"))
    _save_checkpoint(layout, 5)
    _save_checkpoint(layout, 10)
    code, out, err = jobs(capsys)
    assert out.splitlines()[-1] == f"newest checkpoint: step 10 ({layout.checkpoint(10)})"


def _entry(**changes) -> dict:
    entry = {
        "scheduler": "slurm",
        "script": "/w/job.sh",
        "submit_dir": "/w",
        "save_dir": "runs/ft",
        "jobs": [{"id": "100", "log": "/w/octo-dist-100.out"}],
    }
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    "content",
    [
        json.dumps([_entry(scheduler=5)]),
        json.dumps([_entry(jobs=[])]),
        json.dumps([_entry(jobs="100")]),
        json.dumps([_entry(jobs=[["100", "log"]])]),
        json.dumps([_entry(jobs=[{"id": 100}])]),
        json.dumps([_entry(jobs=[{"id": "100\u0000"}])]),
        json.dumps([_entry(jobs=[{"id": "100", "log": "/w/a\u0000b"}])]),
        json.dumps([_entry(save_dir=["runs"])]),
        json.dumps([_entry(submit_dir=None)]),
        json.dumps([_entry(name={"x": 1})]),
        json.dumps([_entry(scheduler="lsf")]),
        json.dumps([_entry(), 7]),
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"jobs": []}),
    ],
)
def test_a_damaged_record_is_one_line_and_exit_2(tools, tmp_path, capsys, content):
    (tmp_path / "runs" / "ft").mkdir(parents=True)
    (tmp_path / "runs" / "ft" / jobrecord.RECORD).write_text(content)
    fake_command(tools, "squeue")
    for action in ("status", "log", "cancel"):
        code, out, err = jobs(capsys, action)
        assert code == 2 and err.count("\n") == 1 and "Fix: remove" in err, (action, err)


@pytest.mark.parametrize(
    "answer",
    [
        "[]",
        '"555.pbs1"',
        '{"Jobs": []}',
        '{"Jobs": {"555.pbs1": []}}',
        '{"Jobs": {"555.pbs1": "R"}}',
        '{"Jobs": {"555.pbs1": {"job_state": ["R"]}}}',
        '{"Jobs": {"555.pbs1": {"job_state": "R", "Job_Owner": 5, "Job_Name": null}}}',
        "not json",
    ],
)
def test_a_qstat_answer_of_another_shape_is_unknown_not_a_traceback(
    tools, tmp_path, capsys, answer
):
    write_record(tmp_path, "pbs", ["555.pbs1"], name="octo-dist")
    fake_command(tools, "qstat", stdout=answer)
    fake_command(tools, "qdel")
    code, out, err = jobs(capsys)
    assert code in (0, 1) and err.count("\n") <= 1 and "Traceback" not in err, err
    assert out.splitlines()[1].split()[1] in ("unknown", "running"), out
    code, out, err = jobs(capsys, "cancel")
    assert code == 1 and "Traceback" not in err and "qdel" not in "".join(calls(tools)), err


def test_step_names_that_isdigit_passes_are_no_step(tools, tmp_path, capsys):
    """``"²".isdigit()`` is True and ``int("²")`` a ValueError (a traceback); ``int("٣")`` is 3 (a step 3 that
    no checkpoint of step 3 is)."""
    write_record(tmp_path, "slurm", ["100"])
    fake_command(tools, "squeue")
    for name in ("²", "٣", "1²"):
        (tmp_path / "runs" / "ft" / name).mkdir()
        (tmp_path / "runs" / "ft" / name / "checksums.json").write_text("{}")
    code, out, err = jobs(capsys)
    assert code == 0 and out.splitlines()[-1] == "newest checkpoint: none yet", (out, err)


MAIN = "import sys; from octo_dist import cli; sys.exit(cli.main(sys.argv[1:]))"


def _jobs_in_a_process(tmp_path, *argv) -> "subprocess.CompletedProcess":
    """``octo-dist jobs`` in a process of its own: a hang fails the test (after a limit no read of a small file
    comes near) instead of hanging the suite."""

    return subprocess.run(
        [sys.executable, "-c", MAIN, "jobs", "--save-dir", "runs/ft", *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ},
    )


def test_a_fifo_exit_file_and_log_are_named_not_waited_on(tools, tmp_path):
    write_record(tmp_path, "slurm", ["100", "101"])
    fake_command(tools, "squeue", stdout="101|RUNNING|None|nobody|octo-dist\n")
    os.mkfifo(tmp_path / "runs" / "ft" / ".octo-dist-exit-100")
    os.mkfifo(tmp_path / "octo-dist-101.out")
    proc = _jobs_in_a_process(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "100  ended    exit file a FIFO, not a file" in proc.stdout, proc.stdout
    proc = _jobs_in_a_process(tmp_path, "log")
    assert (
        proc.returncode == 2
        and proc.stderr.count("\n") == 1
        and "is a FIFO, not a file" in proc.stderr
    )


def test_a_log_that_is_dev_zero_is_not_read_without_end(tools, tmp_path):
    write_record(tmp_path, "slurm", ["101"])
    record = json.loads((tmp_path / "runs" / "ft" / jobrecord.RECORD).read_text())
    record[0]["jobs"][0]["log"] = "/dev/zero"
    (tmp_path / "runs" / "ft" / jobrecord.RECORD).write_text(json.dumps(record))
    fake_command(tools, "squeue", stdout="101|RUNNING|None|nobody|octo-dist\n")
    proc = _jobs_in_a_process(tmp_path, "log")
    assert proc.returncode == 2 and "/dev/zero is a character device, not a file" in proc.stderr, (
        proc.stderr
    )
