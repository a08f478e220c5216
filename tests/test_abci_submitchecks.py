"""Nothing that fails after the queue wait, when ``--submit`` is given: ``launch --submit`` refuses (exit 2,
nothing submitted, the fix named) what a fine-tune would die of at its start; the render alone may only warn.

ABCI 3.0 user guide, system-overview: the group area (/groups) starts at 0 TB and is raised in the user portal, so
a save directory there can be full before the first checkpoint.
"""

import json
import sys
from collections import namedtuple

import pytest

from helpers import pbs_launch
from octo_dist import cli
from octo_dist.jobs import finetunevalues, footprint, submitchecks

FAKE_QSUB = f"""#!{sys.executable}
import os, sys
open(os.environ["FAKE_SUBMIT_LOG"], "a").write(" ".join(sys.argv[1:]) + "\\n")
print("100.pbs1")
"""


def octo_checkpoint(path, width=384):
    (path / "300000").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model": {"token_embedding_size": width}}))
    (path / "dataset_statistics.json").write_text("{}")
    return path


def rlds(root):
    version = root / "bridge_dataset" / "1.0.0"
    version.mkdir(parents=True)
    (version / "dataset_info.json").write_text("{}")
    return root


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A submit directory with a venv, weights, a dataset, a wandb key and a fake qsub that records its calls."""
    (tmp_path / "qsub").write_text(FAKE_QSUB)
    (tmp_path / "qsub").chmod(0o755)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    octo_checkpoint(tmp_path / "weights" / "octo-small")
    rlds(tmp_path / "data")
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_SUBMIT_LOG", str(tmp_path / "submitted.log"))
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def submit(*flags, train=("--config.pretrained_path=weights/octo-small",)):
    argv = ["launch", "pbs", "--nodes", "1", "--group", "g", "-o", "job.sh", "--submit", *flags]
    return cli.main([*argv, "--", "finetune", *train])


def refused(site, capsys, *flags, **kw):
    assert submit(*flags, **kw) == 2
    err = capsys.readouterr().err
    assert err.startswith("octo-dist launch: error: ") and err.count("\n") == 1, err
    assert not (site / "submitted.log").exists() and not (site / "job.sh").exists()
    return err


def test_a_sound_finetune_is_submitted(site, capsys):
    assert submit("--data-dir", "data") == 0, capsys.readouterr().err
    assert (site / "submitted.log").read_text().split()[-1] == "job.sh"


def test_a_missing_data_dir_is_refused(site, capsys):
    err = refused(site, capsys)
    assert "-- finetune without --data-dir; expected the RLDS dataset directory" in err, err
    err = refused(site, capsys, "--data-dir", "nowhere")
    assert "--data-dir nowhere: no such directory" in err, err


def test_a_data_dir_one_level_too_deep_says_so(site, capsys):
    err = refused(site, capsys, "--data-dir", "data/bridge_dataset")
    assert "--data-dir data/bridge_dataset: one level too deep" in err, err
    assert f"Fix: --data-dir {site / 'data'}" in err, err
    err = refused(site, capsys, "--data-dir", "data/bridge_dataset/1.0.0")
    assert "two levels too deep" in err and f"Fix: --data-dir {site / 'data'}" in err, err


def test_wandb_online_without_a_key_is_refused(site, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY")
    err = refused(site, capsys, "--data-dir", "data", "--wandb-mode", "online")
    assert "--wandb-mode online with no wandb key here" in err and "--wandb-mode offline" in err, (
        err
    )


def test_a_pretrained_path_missing_or_not_octo_is_refused(site, capsys):
    err = refused(site, capsys, "--data-dir", "data", train=())
    assert "-- finetune without --config.pretrained_path" in err, err
    err = refused(
        site, capsys, "--data-dir", "data", train=("--config.pretrained_path=weights/none",)
    )
    assert "--config.pretrained_path=weights/none: no such directory" in err, err
    (site / "weights" / "empty").mkdir()
    err = refused(
        site, capsys, "--data-dir", "data", train=("--config.pretrained_path=weights/empty",)
    )
    assert "not an Octo checkpoint (no config.json and no <step>/ directory" in err, err


@pytest.mark.parametrize(
    "flag",
    ["--config.augment_on=gpu", "--config.resize_method=nearest", "--step_fn=pmap"],
)
def test_bad_values_of_the_fine_tunes_choices_are_refused(site, capsys, flag):
    err = refused(
        site,
        capsys,
        "--data-dir",
        "data",
        train=("--config.pretrained_path=weights/octo-small", flag),
    )
    # the fine-tune's own parser refuses --step_fn where absl is installed; on a login node's Python these do
    assert flag in err and "expected" in err and "one of" in err, err


def test_the_values_are_checked_without_the_fine_tunes_parser():
    assert finetunevalues.value_problem(["--step_fn", "pmap"]) == (
        "--step_fn=pmap",
        "one of auto, jit, shard_map",
        "--step_fn=auto",
    )
    assert finetunevalues.value_problem(["--config.augment_on=device", "--step-fn=jit"]) is None


def test_the_render_alone_still_writes_the_script(site, capsys):
    argv = ["launch", "pbs", "--nodes", "1", "--group", "g", "-o", "job.sh", "--", "finetune"]
    assert cli.main(argv) == 0 and (site / "job.sh").exists()


def test_the_pretrained_checkpoint_is_bound_into_the_image(site, capsys):
    argv = pbs_launch("--image", "/g/o.sif", "--skip-image-check", group="g")
    assert (
        cli.main([*argv, "--dry-run", "--", "finetune", "--config.pretrained_path=/w/octo-small"])
        == 0
    )
    assert '"binds": ["/groups/g", "/dev/infiniband", "/w/octo-small"]' in capsys.readouterr().out


def test_a_clear_shortfall_of_room_is_refused_under_submit(site):
    """A save directory that cannot hold the run's checkpoints: 4 x Octo-Small's train state (27M parameters x 3
    arrays x 4 bytes) and the image still to build."""
    fp = footprint.estimate(str(site / "weights" / "octo-small"), "/nowhere/octo-dist-cuda12.sif")
    assert fp.need == 4 * 27_000_000 * 3 * 4 + footprint.IMAGE_BYTES
    assert (
        "4 checkpoints of Octo-Small's train state" in fp.said
        and "the image still to build" in fp.said
    )
    Job = namedtuple("Job", "header settings")
    job = Job(
        namedtuple("H", "training")(
            namedtuple("T", "command lead_args user_args")(
                "finetune", (), ("--config.pretrained_path=weights/octo-small",)
            )
        ),
        namedtuple("S", "storage software")(
            namedtuple("St", "wandb_mode data_dir save_dir")("disabled", "data", "runs/x"),
            namedtuple("Sw", "image")("/nowhere/octo-dist-cuda12.sif"),
        ),
    )
    found = submitchecks.refusal(job, {}, free_of=lambda d: 1 << 30)
    assert found[0] == "--save-dir runs/x: 1.0 GiB free on its file system", found
    assert "show_quota" in found[2]
    assert submitchecks.refusal(job, {}, free_of=lambda d: 1 << 40) is None
    assert submitchecks.refusal(job, {}, free_of=lambda d: None) is None  # unreadable: not judged


def test_the_model_size_comes_from_the_checkpoints_config(tmp_path):
    assert footprint.model_params(str(octo_checkpoint(tmp_path / "a", 768))) == (
        "Octo-Base",
        93_000_000,
    )
    assert footprint.model_params("hf://rail-berkeley/octo-small") == ("Octo-Small", 27_000_000)
    assert footprint.model_params(str(tmp_path / "mine")) is None


def test_the_jobs_layers_value_lists_match_the_fine_tunes():
    pytest.importorskip("jax")
    from octo_dist.apps.finetune.frames import RESIZE_METHODS
    from octo_dist.engine import stepfns

    assert finetunevalues.RESIZE_METHODS == RESIZE_METHODS
    assert finetunevalues.AUGMENT_ON == stepfns.AUGMENT_ON
    assert finetunevalues.STEP_FNS == stepfns.STEP_FNS


def test_the_render_warns_of_a_shortfall_of_room(site):
    from octo_dist.jobs import jobwarnings
    from octo_dist.jobs.cli import parse

    job = parse(
        [
            "pbs",
            "--nodes",
            "1",
            "--group",
            "g",
            "--",
            "finetune",
            "--config.pretrained_path=weights/octo-small",
        ]
    )
    (warning,) = jobwarnings.footprint_warnings(job, free_of=lambda d: 100 << 20)
    assert warning.startswith(
        "--save-dir runs/octo-dist: 100.0 MiB free on its file system; expected at least "
    )
    assert jobwarnings.footprint_warnings(job, free_of=lambda d: 1 << 40) == []


def test_a_checkpoint_whose_only_step_directory_is_not_ascii_digits_is_refused(tmp_path):
    """ "٣".isdigit() is True: a directory so named read as a step, and the job died at its start."""
    path = tmp_path / "weights"
    (path / "٣").mkdir(parents=True)
    (path / "config.json").write_text("{}")
    found, _, _ = submitchecks.pretrained_problem(str(path))
    assert found.endswith(
        "not an Octo checkpoint (no <step>/ directory (ASCII digits: 300000/) in it)"
    ), found
