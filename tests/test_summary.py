"""The run summary: figures from timestamps (pure), and what `octo-dist smoke --save-dir D` leaves in D.

A real job chain's history in summary.json (a stopped job, a resumed and stopped one, one resumed to the end) is
checked on test_smoke.py's chain (test_the_resume_of_a_resume_reproduces_the_uninterrupted_run_...), which runs it
anyway."""

import json
import re
import struct

import pytest

import helpers
from helpers import COMPILE_FAST, SMOKE, clean_env
from octo_dist import savelayout
from octo_dist.apps import summary


def figures(**given):
    """``summary.summarize`` of a small 2-process run (0 -> 3, steps ending at 6, 7, 8 s), ``given`` overriding."""
    plain = dict(
        command="smoke",
        processes=2,
        devices=2,
        global_batch=8,
        start_step=0,
        end_step=3,
        losses={0: 1.0},
        process_started=0.0,
        fit_started=1.0,
        step_ends=[6.0, 7.0, 8.0],
        ended=9.0,
    )
    return summary.summarize(**{**plain, **given})


# Steps 0 -> 5: the process started at 100.0, training at 103.0; steps ended at 110 (compile), 110.5 (the first
# metrics read), then every 0.25 s; the process ended at 112.0.
FIVE_STEPS = dict(
    end_step=5,
    process_started=100.0,
    fit_started=103.0,
    step_ends=[110.0, 110.5, 110.75, 111.0, 111.25],
    ended=112.0,
)


def test_figures_come_from_the_timestamps():
    given = dict(FIVE_STEPS, losses={0: 0.9, 1: 0.8, 4: 0.5, 2: 0.7, 3: 0.6})
    s = figures(**given)
    assert (s.wall_s, s.time_to_first_step_s, s.fit_to_first_step_s) == (12.0, 10.0, 7.0)
    assert s.compile_s is None  # no start-up profile: no compile phase to report
    assert (
        s.median_step_s == 0.25 and s.examples_per_s == 32.0
    )  # the first two steps (compiling) are left out
    assert (s.loss_first, s.loss_last) == (0.9, 0.5)
    text = summary.lines(s)
    assert text.startswith(
        "octo-dist smoke: run summary: wall 12.0 s, first step after 10.0 s (training start to first step 7.0 s), "
        "median step 250.0 ms,"
    )
    # With the start-up profile, its compile phase is the one compile time shown (not 7.0 s beside it).
    phases = {"parameters": 2.0, "compile": 4.5, "first_step": 0.5}
    with_profile = figures(**given, startup=phases)
    # one definition: the line, the dataclass and summary.json say the same compile time
    assert with_profile.compile_s == 4.5 and with_profile.as_json()["compile_s"] == 4.5
    profiled = summary.lines(with_profile)
    assert "first step after 10.0 s (compile 4.5 s)," in profiled and "7.0" not in profiled
    assert "32 examples/s (global batch 8), loss 0.9000 -> 0.5000 over steps 0 -> 5" in text


def test_the_input_share_of_a_step_says_data_or_compute_bound():
    # Steps 10 -> 15 ending as FIVE_STEPS do: the median step is 0.25 s from the third step on.
    common = dict(FIVE_STEPS, start_step=10, end_step=15)
    # Steps 10 and 11 (compiling) are left out, as for the step time: 0.05 s of 0.25 s is input.
    fast = figures(**common, input_s={10: 9.0, 11: 3.0, 12: 0.05, 13: 0.05, 14: 0.04})
    assert fast.median_input_s == 0.05 and fast.input_share == pytest.approx(0.2)
    assert fast.bound == "compute-bound" and fast.as_json()["bound"] == "compute-bound"
    assert "\n  input 50.0 ms of each step (20%): compute-bound" in summary.lines(fast)
    slow = figures(**common, input_s={12: 0.24, 13: 0.23, 14: 0.25})
    assert slow.bound == "data-bound" and "octo-dist launch --cpus-per-rank" in summary.lines(slow)
    unknown = figures(**common)
    assert unknown.bound is None and "input" not in summary.lines(unknown)


def verdict_run(input_s: float) -> summary.RunSummary:
    """One process over FIVE_STEPS whose last three steps each spent ``input_s`` seconds making the next batch."""
    return figures(
        **FIVE_STEPS, processes=1, input_s={0: 9.0, 1: 3.0, 2: input_s, 3: input_s, 4: input_s}
    )


def input_line(s: summary.RunSummary) -> str:
    (line,) = [ln for ln in summary.lines(s).splitlines() if ln.startswith("  input ")]
    return line


def test_input_at_43_percent_of_each_step_is_not_called_compute_bound():
    """A 1-process CPU smoke run whose batches took 43% of each step was called compute-bound: the input line
    calls a run compute-bound only where input is a small part of each step."""
    s = verdict_run(0.1075)  # 107.5 ms of a 250 ms step
    assert s.input_share == pytest.approx(0.43)
    assert s.bound == "input-heavy" and s.as_json()["bound"] == "input-heavy"
    line = input_line(s)
    assert "compute-bound" not in line
    assert line.startswith("  input 107.5 ms of each step (43%): input-heavy: ")
    assert "making the next batch takes 43% of each step; at 80% they would wait for it" in line
    assert "octo-dist launch --cpus-per-rank" in line


@pytest.mark.parametrize(
    "input_s, bound",
    [
        (0.01, "compute-bound"),  # 4%
        (0.06, "compute-bound"),  # 24%
        (0.0625, "input-heavy"),  # 25%: input could no longer triple before the devices wait
        (0.1975, "input-heavy"),  # 79%
        (0.2, "data-bound"),  # 80%
        (0.25, "data-bound"),
    ],
)
def test_the_verdict_follows_the_share_of_each_step(input_s, bound):
    s = verdict_run(input_s)
    assert s.bound == bound
    assert f"): {bound}" in input_line(s)


def test_a_run_that_did_no_step_says_so():
    # A fine-tune resumed at step 7, stopped before its first step.
    s = figures(
        command="finetune", start_step=7, end_step=7, losses={}, step_ends=[], stopped_by="SIGTERM"
    )
    assert s.time_to_first_step_s is None and s.median_step_s is None and s.examples_per_s is None
    assert "no steps run over steps 7 -> 7, stopped by SIGTERM" in summary.lines(s)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def first_job(tmp_path_factory):
    """(save directory, record, stdout, stderr) of one ``smoke --steps 6 --save-dir D --save-every 3`` run for the
    file, its stderr a pipe as in a batch job: what it leaves and says is checked below."""
    work = tmp_path_factory.mktemp("first-job")
    save, record = work / "run", work / "record.json"
    flags = ("--steps", "6", "--save-dir", str(save), "--save-every", "3", "--record", str(record))
    proc = smoke(*flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save, json.loads(record.read_text()), proc.stdout, proc.stderr


def smoke(*flags: str):
    """One smoke process, compiled fast (helpers.COMPILE_FAST): this file checks what the runs write, not their
    code's speed."""
    return helpers.run_captured([*SMOKE, *flags], env=clean_env(XLA_FLAGS=COMPILE_FAST))


@pytest.mark.slow
def test_smoke_with_a_save_dir_leaves_summary_json_and_loss_png(first_job):
    save, record, stdout, _ = first_job
    got = json.loads((save / "summary.json").read_text())
    assert got["schema"] == summary.SCHEMA and got["command"] == "smoke"
    assert (got["processes"], got["devices"], got["global_batch"]) == (1, record["devices"], 8)
    assert (got["start_step"], got["end_step"]) == (0, 6)
    assert got["losses"] == record["losses"] and got["params_digests"] == record["digests"]
    assert [(j["start_step"], j["end_step"]) for j in got["jobs"]] == [(0, 6)]
    assert got["loss_first"] == record["losses"]["0"] and got["loss_last"] == record["losses"]["5"]
    assert got["median_step_s"] == record["step_time_median_s"] > 0
    assert (
        got["bound"] in ("data-bound", "input-heavy", "compute-bound")
        and 0 < got["median_input_s"] < 1
    )
    assert f"input {got['median_input_s'] * 1000:.1f} ms of each step" in stdout
    # The start-up profile: the smoke job's phases in order (no pretrained model to load), together the time to
    # the first step (within 10%); nothing ran beside them (the fine-tune's first batch and compilation do).
    smoke_phases = ["imports", "checks", "distributed", "dataset", "setup", "parameters", "compile"]
    assert list(got["startup"]) == [*smoke_phases, "first_step"]
    assert all(v >= 0 for v in got["startup"].values()) and got["startup"]["imports"] > 0
    assert sum(got["startup"].values()) == pytest.approx(got["time_to_first_step_s"], rel=0.1)
    assert got["slowest_rank"] == 0 and got["slowest_startup"] == got["startup"]
    assert got["startup_beside"] is None and "; beside: " not in stdout
    assert "\n  start-up: imports " in stdout and ", first step " in stdout
    assert got["examples_per_s"] == pytest.approx(8 / got["median_step_s"])
    assert 0 < got["fit_to_first_step_s"] <= got["time_to_first_step_s"] <= got["wall_s"]
    # one compile time: summary.json's is the start-up profile's phase, the one the log line prints
    assert got["schema"] == 3 and got["compile_s"] == got["startup"]["compile"]
    assert f"(compile {got['compile_s']:.1f} s)" in stdout
    assert png_size(save / "loss.png") == summary.PLOT_SIZE_PX
    assert (
        "octo-dist smoke: run summary: wall " in stdout and "examples/s (global batch 8)" in stdout
    )


def one_job(start, end, losses, command="smoke"):
    return figures(
        command=command,
        start_step=start,
        end_step=end,
        losses=losses,
        step_ends=[2.0 + i for i in range(end - start)],
        ended=3.0 + end - start,
    )


def test_a_resumed_job_continues_the_run_history():
    first = one_job(0, 6, {k: 1.0 - k / 10 for k in range(6)})
    jobs, losses = summary.history(None, first, {k: 1.0 - k / 10 for k in range(6)})
    previous = {**first.as_json(), "losses": {str(k): v for k, v in losses.items()}, "jobs": jobs}
    # The second job resumed from the checkpoint at step 4: steps 4 and 5 are redone, its losses win.
    second = one_job(4, 9, {k: 0.5 for k in range(4, 9)})
    jobs, losses = summary.history(previous, second, {k: 0.5 for k in range(4, 9)})
    assert [(j["start_step"], j["end_step"]) for j in jobs] == [(0, 6), (4, 9)]
    assert sorted(losses) == list(range(9))
    assert [losses[k] for k in range(4)] == [1.0, 0.9, 0.8, 0.7] and losses[4] == losses[5] == 0.5


def test_a_job_that_left_no_summary_is_a_marked_gap_in_the_history(tmp_path):
    first = one_job(0, 6, {k: 1.0 for k in range(6)})
    jobs, losses = summary.history(None, first, {k: 1.0 for k in range(6)})
    previous = {**first.as_json(), "losses": {str(k): v for k, v in losses.items()}, "jobs": jobs}
    # A second job trained 6 -> 12, checkpointed at 10 and was killed: no summary. The third resumes at 10.
    third = one_job(10, 14, {k: 0.5 for k in range(10, 14)})
    jobs, losses = summary.history(previous, third, {k: 0.5 for k in range(10, 14)})
    assert [(j["start_step"], j["end_step"]) for j in jobs] == [(0, 6), (6, 10), (10, 14)]
    assert "not recorded" in jobs[1]["unrecorded"] and "unrecorded" not in jobs[2]
    assert sorted(losses) == [*range(6), *range(10, 14)]
    save = tmp_path / "run"
    (save).mkdir()
    (save / "summary.json").write_text(json.dumps(previous))
    summary.write(savelayout.RunLayout(str(save)), third, {k: 0.5 for k in range(10, 14)})
    written = json.loads((save / "summary.json").read_text())
    assert [j.get("unrecorded", "") != "" for j in written["jobs"]] == [False, True, False]


def test_a_new_run_or_another_command_starts_a_new_history():
    old = {**one_job(0, 6, {0: 1.0}).as_json(), "losses": {"0": 1.0}, "jobs": [{"start_step": 0}]}
    jobs, losses = summary.history(old, one_job(0, 3, {0: 2.0}), {0: 2.0})
    assert len(jobs) == 1 and losses == {0: 2.0}
    finetune = one_job(6, 8, {6: 0.3}, command="finetune")
    jobs, losses = summary.history(old, finetune, {6: 0.3})
    assert len(jobs) == 1 and losses == {6: 0.3}


def test_a_schema_1_summary_becomes_the_first_job():
    # What octo-dist wrote before the history existed: one job, no "jobs" key.
    old = {**one_job(0, 6, {}).as_json(), "schema": 1, "losses": {str(k): 1.0 for k in range(6)}}
    jobs, losses = summary.history(old, one_job(6, 8, {}), {6: 0.2, 7: 0.1})
    assert [(j["start_step"], j["end_step"]) for j in jobs] == [(0, 6), (6, 8)]
    assert sorted(losses) == list(range(8))


def test_a_long_run_plot_is_smoothed_log_scaled_and_marks_each_job(tmp_path):
    import matplotlib

    matplotlib.use("Agg", force=True)
    losses = {k: 10.0 * 0.995**k for k in range(3000)}  # 10 -> 3e-6: more than two decades
    path = tmp_path / "loss.png"
    summary.plot(losses, path, "title", job_starts=[1000, 2000])
    assert png_size(path) == summary.PLOT_SIZE_PX
    # The same curve drawn again, without smoothing or jobs, is another picture.
    plain = tmp_path / "plain.png"
    summary.plot({k: losses[k] for k in range(100)}, plain, "title")
    assert path.read_bytes() != plain.read_bytes()
    assert summary.smoothed([1.0, 3.0, 3.0], span=1) == [1.0, 3.0, 3.0]
    assert summary.smoothed([0.0, 3.0], span=2) == [0.0, 2.0]


@pytest.mark.slow
def test_a_runs_last_line_says_its_last_loss(first_job):
    """Training's progress in a batch job's log (ranklog.StepLines, test_step_lines.py): no carriage return, and the
    final line's loss is the recorded loss of the last step (the bar used to end a step behind the summary)."""
    _, record, _, stderr = first_job
    assert "\r" not in stderr
    last = [ln for ln in stderr.splitlines() if re.search(r"train: step \d+/6", ln)][-1]
    assert f"train: step 6/6, loss {record['losses']['5']:.4f} at step 5 " in last, last


def test_startup_phases_partition_the_time_to_the_first_step():
    marks = [
        ("imports", 102.0),
        ("checks", 102.5),
        ("distributed", 103.0),
        ("model_load", 103.5),
        ("dataset", 104.0),  # the graph built; the first batch fills in a thread
        ("model_load", 106.0),  # the weights read meanwhile
        ("compile", 112.0),
        ("dataset", 115.0),  # the wait for the first batch
        ("parameters", 116.0),
        ("setup", 116.5),
    ]
    phases = summary.startup_phases(100.0, marks, 117.0)
    assert phases == {
        "imports": 2.0,
        "checks": 0.5,
        "distributed": 0.5,
        "model_load": 2.5,
        "dataset": 3.5,
        "setup": 0.5,
        "parameters": 1.0,
        "compile": 6.0,
        "first_step": 0.5,
    }
    assert list(phases) == [name for name, _ in summary.STARTUP_PHASES]
    assert sum(phases.values()) == 17.0
    # Marks out of order (a thread's) are taken by time; a mark after the first step is not start-up; an unknown
    # phase goes last; no first step: the marks alone.
    shuffled = summary.startup_phases(
        100.0, [("checks", 103.0), ("imports", 101.0), ("late", 130.0)], 110.0
    )
    assert shuffled == {"imports": 1.0, "checks": 2.0, "first_step": 7.0}
    assert list(summary.startup_phases(100.0, [("mine", 101.0), ("imports", 102.0)], None)) == [
        "imports",
        "mine",
    ]


def test_the_slowest_ranks_start_up_is_named():
    fast = {"imports": 1.0, "compile": 5.0}
    slow = {"imports": 4.0, "compile": 5.0}
    s = figures(processes=3, devices=3, startup=fast, startup_by_rank=[fast, slow, fast])
    assert (s.slowest_rank, s.slowest_startup) == (1, slow)
    assert "start-up: imports 1.0 s, compile 5.0 s (slowest: rank 1, first step after 9.0 s)" in (
        summary.lines(s)
    )
    beside = figures(startup=fast, startup_beside={"first_batch": 41.0, "compile": 14.2})
    assert "start-up: imports 1.0 s, compile 5.0 s; beside: first batch 41.0 s, compile 14.2 s" in (
        summary.lines(beside)
    )


def test_the_summary_and_plot_replace_links_planted_in_the_run_directory_and_never_write_through_them(
    tmp_path,
):
    """Before: summary.json was written through a link at summary.json.tmp (a fixed name) and loss.png through a
    link at loss.png, into whatever file they named."""
    import os

    save, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    save.mkdir()
    elsewhere.mkdir()
    victims = {name: elsewhere / name for name in ("summary", "tmp", "plot")}
    for victim in victims.values():
        victim.write_text("someone else's file\n")
    (save / "summary.json").symlink_to(victims["summary"])
    (save / "summary.json.tmp").symlink_to(victims["tmp"])
    (save / "loss.png").symlink_to(victims["plot"])
    json_path, png_path = summary.write(
        savelayout.RunLayout(str(save)), one_job(0, 3, {0: 1.0, 1: 0.9, 2: 0.8}), {0: 1.0}
    )
    assert {n: v.read_bytes() for n, v in victims.items()} == dict.fromkeys(
        victims, b"someone else's file\n"
    )
    for path in (json_path, png_path):
        assert not path.is_symlink() and path.is_file()
    assert json.loads(json_path.read_text())["command"] == "smoke"
    assert png_size(png_path) == summary.PLOT_SIZE_PX
    # Nothing left beside them but the planted link at the old fixed name (not ours to remove).
    assert sorted(os.listdir(save)) == ["loss.png", "summary.json", "summary.json.tmp"]
    assert oct(json_path.stat().st_mode & 0o777) == oct(0o666 & ~summary._umask())


@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "huge"])
def test_a_previous_summary_that_is_a_fifo_or_endless_is_not_read_and_a_new_history_begins(
    tmp_path, planted, monkeypatch
):
    """Before: a FIFO at summary.json blocked the summary's open forever, a link to /dev/zero was read without end."""
    import os

    save = tmp_path / "run"
    save.mkdir()
    previous = save / "summary.json"
    if planted == "fifo":
        os.mkfifo(previous)
    elif planted == "dev-zero":
        previous.symlink_to("/dev/zero")
    else:
        monkeypatch.setattr(summary, "SUMMARY_MAX_BYTES", 10)
        previous.write_text(json.dumps({"command": "smoke", "jobs": [], "losses": {}}))
    assert summary.read_previous(previous) is None
    # A job that resumed at 4 still writes its own history, over whatever was planted.
    json_path, _ = summary.write(
        savelayout.RunLayout(str(save)), one_job(4, 6, {4: 0.5, 5: 0.4}), {4: 0.5, 5: 0.4}
    )
    assert [
        (j["start_step"], j["end_step"]) for j in json.loads(json_path.read_text())["jobs"]
    ] == [(4, 6)]
