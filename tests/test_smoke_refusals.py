"""The smoke job refuses what no run could use before any step: bad flags, and a save directory it cannot write."""

import pytest

from helpers import REPO, SMOKE, read_only_namespace_prefix, run_captured, run_smoke


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--steps", "-5"], "--steps -5; expected at least 1 step. Fix: --steps 20"),
        (["--steps", "0"], "--steps 0; expected at least 1 step"),
        (["--learning-rate", "nan"], "--learning-rate nan; expected a finite number above 0"),
        (["--learning-rate", "-1"], "--learning-rate -1.0; expected a finite number above 0"),
        (
            ["--save-every", "-1"],
            "--save-every -1; expected 0 (at the end and on a stop only) or a positive number",
        ),
        (["--global-batch", "100000000"], "--global-batch 100000000; expected 1 to 65536 examples"),
        (["--tolerance", "inf"], "--tolerance inf; expected a finite relative difference >= 0"),
        (["--step-time", "-1"], "--step-time -1.0; expected 0 (full speed) to 60 seconds"),
        (["--step-time", "nan"], "--step-time nan; expected 0 (full speed) to 60 seconds"),
        (["--step-time", "3600"], "--step-time 3600.0; expected 0 (full speed) to 60 seconds"),
    ],
)
def test_flags_no_run_could_use_are_one_line_and_exit_2(flags, needle):
    refused(flags, needle)


def refused(flags, needle):
    proc = run_smoke(*flags, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr == f"octo-dist smoke: error: {proc.stderr.split('error: ', 1)[1]}"
        and proc.stderr.count("\n") == 1
    )
    assert needle in proc.stderr
    assert proc.stdout == ""  # refused before start-up: no verdict, no steps


def test_paths_that_cannot_be_used_are_one_line_and_exit_2(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    refused(
        ["--record", str(tmp_path / "missing" / "r.json")], f"Fix: mkdir -p {tmp_path / 'missing'}"
    )
    refused(["--record", str(tmp_path)], f"Fix: --record {tmp_path / 'record.json'}")
    refused(
        ["--compile-cache", str(a_file)], f"compile cache {a_file} is a file; expected a directory"
    )
    refused(
        ["--compile-cache", str(a_file / "sub")],
        f"{a_file} is a file; expected directories up to it",
    )


def test_a_save_directory_that_is_a_file_is_refused_in_one_line(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    proc = run_smoke("--steps", "2", "--save-dir", str(a_file), cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        f"octo-dist smoke: error: save directory {a_file} is a file, not a directory" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and "steps 0 ->" not in proc.stdout


def test_a_read_only_save_directory_is_refused_before_the_first_step(tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    read_only = read_only_namespace_prefix(save)
    proc = run_captured([*read_only, *SMOKE, "--steps", "30", "--save-dir", str(save)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        f"save directory {save} is not writable" in proc.stderr
        and "Read-only file system" in proc.stderr
    ), proc.stderr[-3000:]
    assert (
        "steps 0 ->" not in proc.stdout and list(save.iterdir()) == []
    )  # no step ran, nothing was written


def test_the_jobs_offer_the_engines_step_functions_with_its_default():
    """One list of step functions (engine/stepfns.py, no JAX) for both command lines and the engine."""
    import argparse
    import inspect

    from octo_dist.apps.finetune import commandline, config
    from octo_dist.apps.smoke import app as smoke
    from octo_dist.engine import parallel, stepfns, train

    step_fn = next(
        a
        for a in smoke.add_parser(argparse.ArgumentParser().add_subparsers())._actions
        if a.dest == "step_fn"
    )
    assert step_fn.choices is commandline.STEP_FNS is parallel.STEP_FNS is stepfns.STEP_FNS
    assert (
        step_fn.default
        == inspect.signature(config.parse).parameters["step_fn"].default
        == train.TrainConfig.step_fn
        == "auto"
    )


def test_the_smoke_job_builds_the_engines_input_as_the_fine_tune_does():
    """One dataclass into the engine (train.TrainConfig; finetune's is config.FinetuneJob.training): --save-every
    is its save_every, 10 by default with a save directory, 0 (at the end only) without one."""
    import argparse

    from octo_dist import savelayout
    from octo_dist.apps.smoke import app as smoke
    from octo_dist.apps.smoke import flags
    from octo_dist.engine import checkpoint, train

    parser = argparse.ArgumentParser()
    subs = parser.add_subparsers()
    smoke.add_parser(subs)
    layout = savelayout.RunLayout("/runs/smoke")
    decided = checkpoint.Decision()
    args = parser.parse_args(["smoke", "--steps", "7", "--seed", "3", "--save-dir", "/runs/smoke"])
    assert smoke.train_config(args, layout, decided) == train.TrainConfig(
        steps=7, seed=3, layout=layout, save_every=flags.DEFAULT_SAVE_EVERY, resume=decided
    )
    given = parser.parse_args(["smoke", "--save-every", "2", "--save-dir", "/runs/smoke"])
    assert smoke.train_config(given, layout, decided).save_every == 2
    bare = smoke.train_config(parser.parse_args(["smoke"]), None, decided)
    assert (bare.save_every, bare.layout, bare.train_state) == (0, None, None)


def test_np_without_the_equivalence_check_is_refused():
    # `--np 2` alone used to run one process and report success: the launcher decides a plain job's size.
    refused(
        ["--np", "2"],
        "--np 2; expected --np only with --check-equivalence (the smoke job runs as many processes as "
        "its launcher starts). Fix: octo-dist smoke --check-equivalence --np 2, or mpirun -np 2 octo-dist smoke",
    )
