"""Octo fine-tuning: `octo-dist finetune`'s flags, help and packaged configs, config checks and their messages
everywhere; the real Octo path where the fork is installed (``octo`` marker), under a real mpirun (``mpi``)."""

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import HANG_S, REPO, clean_env
from octo_dist.apps.finetune import app as finetune
from octo_dist.apps.finetune import checks, commandline, configfile, model, modelconfig, pipeline
from octo_dist.apps.finetune import config as fc
from octo_dist.policies import octo_spec
from octo_dist.apps.finetune import weights
from octo_dist.engine import train

FINETUNE = str(REPO / "scripts" / "finetune.py")
OCTO_DIST = [sys.executable, "-m", "octo_dist"]
SMOKE_CONFIG = str(
    REPO / "octo_dist" / "apps" / "finetune" / "configs" / "finetune_smoke_config.py"
)
UNREACHABLE = lambda repo: "ConnectionError: name resolution failed"  # noqa: E731
REACHABLE = lambda repo: None  # noqa: E731


def parse(*args):
    return commandline.parse_flags(["finetune.py", *args])


def smoke_cfg(data_dir, **over) -> dict:
    cfg = parse(f"--config={SMOKE_CONFIG}").config.to_dict()
    cfg["dataset_kwargs"]["data_dir"] = str(data_dir)
    cfg.update(over)
    return cfg


def fake_dataset(root: Path, name="bridge_dataset", version="1.0.0") -> Path:
    d = root / name / version
    d.mkdir(parents=True)
    (d / "dataset_info.json").write_text("{}")
    return root


def fake_checkpoint(root: Path, config: dict, files=checks.CHECKPOINT_FILES, step="5000") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for f in files:
        (root / f).write_text(json.dumps(config) if f == "config.json" else "{}")
    if step:
        (root / step / "default").mkdir(parents=True)
    return root


OCTO_SMALL_LIKE = {
    "model": {
        "task_tokenizers": {
            "language": octo_spec.module_spec(
                "octo.model.components.tokenizers:LanguageTokenizer",
                encoder="t5-base",
                finetune_encoder=False,
            )
        }
    },
    "text_processor": octo_spec.module_spec(
        "octo.data.utils.text_processing:HFTokenizer", tokenizer_name="t5-base"
    ),
    "optimizer": {"frozen_keys": ["*hf_model*"]},
}


# --- the fork's flags -----------------------------------------------------------------------------------------


def test_the_forks_flags_override_the_default_config():
    fv = parse(
        "--config.pretrained_path=hf://rail-berkeley/octo-small",
        "--config.batch_size=128",
        "--config.num_steps=10",
        "--config.save_dir=/tmp/ckpt",
        "--config.wandb.group=g7",
        "--config.dataset_kwargs.data_dir=/data/bridge",
        "--name=ft_{batch_size}",
        "--debug",
    )
    c = fv.config
    assert (c.pretrained_path, c.batch_size, c.num_steps, c.save_dir, c.wandb.group) == (
        "hf://rail-berkeley/octo-small",
        128,
        10,
        "/tmp/ckpt",
        "g7",
    )
    assert c.dataset_kwargs.data_dir == "/data/bridge" and fv.name == "ft_{batch_size}" and fv.debug
    # The fork's FieldReference: the schedule's decay follows --config.num_steps.
    assert c.optimizer.learning_rate.decay_steps == 10
    assert not fv.resume and fv.step_fn == "auto"


def test_defaults_match_the_forks_default_config():
    c = parse().config
    assert (c.finetuning_mode, c.modality, c.batch_size, c.num_steps, c.seed) == (
        "full",
        "multimodal",
        256,
        50000,
        42,
    )
    assert c.optimizer.frozen_keys is None and c.wandb.project == "octo_finetune"
    assert c.dataset_kwargs.standardize_fn.to_dict() == {
        "module": "octo.data.oxe.oxe_standardization_transforms",
        "name": "bridge_dataset_transform",
        "args": (),
        "kwargs": {},
    }


@pytest.mark.parametrize(
    "string, frozen",
    [
        ("full,image_conditioned", None),
        ("head_only,multimodal", ("octo_transformer.*",)),
        (
            "head_mlp_only,language_conditioned",
            (
                "octo_transformer.*",
                "heads_*.map_head.probe",
                "heads_*.map_head.MultiHeadDotProductAttention_0.*",
            ),
        ),
    ],
)
def test_the_config_string_picks_the_finetuning_mode(string, frozen):
    c = parse(f"--config={configfile.DEFAULT_CONFIG}:{string}").config
    assert c.finetuning_mode == string.split(",")[0] and c.modality == string.split(",")[1]
    assert (tuple(c.optimizer.frozen_keys) if c.optimizer.frozen_keys else None) == frozen


def test_a_bad_config_string_exits_2_naming_the_choices(capsys):
    assert (
        finetune.main(
            ["finetune.py", f"--config={configfile.DEFAULT_CONFIG}:everything,multimodal"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "expected '<mode>,<modality>' with mode one of ('full', 'head_only', 'head_mlp_only')"
        in err
    )


def test_frozen_keys_come_from_the_optimizer_then_the_mode_then_the_pretrained_model():
    explicit = {"optimizer": {"frozen_keys": ["a.*"]}, "finetuning_mode": "head_only"}
    assert modelconfig.resolve_frozen_keys(explicit, {}) == ("a.*",)
    assert modelconfig.resolve_frozen_keys(
        {"optimizer": {}, "finetuning_mode": "head_only"}, {}
    ) == ("octo_transformer.*",)
    assert modelconfig.resolve_frozen_keys(
        {"optimizer": {}, "finetuning_mode": "full"}, OCTO_SMALL_LIKE
    ) == ("*hf_model*",)
    assert modelconfig.resolve_frozen_keys({"optimizer": {}, "finetuning_mode": "full"}, {}) == ()


def test_config_delete_keys_removes_by_prefix_then_update_config_merges():
    base = {
        "model": {
            "heads": {"action": {"kwargs": {"action_dim": 7}}, "action_extra": 1},
            "readouts": {"action": 1},
        },
        "text_processor": {"name": "HFTokenizer"},
        "empty": {},
    }
    got = modelconfig.edit_model_config(
        base,
        delete={"model": {"heads": {"action": None}}, "text_processor": None},
        update={
            "model": {"heads": {"action": {"kwargs": {"action_dim": 14}}}},
            "text_processor": None,
        },
    )
    # "action" is a prefix of "action_extra" too: the fork deletes by dotted-path prefix.
    assert got == {
        "model": {"heads": {"action": {"kwargs": {"action_dim": 14}}}, "readouts": {"action": 1}},
        "text_processor": None,
        "empty": {},
    }
    assert (
        base["model"]["heads"]["action"]["kwargs"]["action_dim"] == 7
    )  # the pretrained config is not modified


def test_run_dir_is_stable_across_launches_and_names_format_from_the_config(tmp_path, monkeypatch):
    cfg = {
        "save_dir": "/ckpt",
        "batch_size": 256,
        "wandb": {"project": "p", "group": "g"},
        "dataset_kwargs": {"name": "bridge_dataset"},
    }
    assert (
        fc.run_dir(cfg, "ft_{batch_size}_{dataset_kwargs_name}")
        == "/ckpt/p/g/ft_256_bridge_dataset"
    )
    assert fc.run_dir({**cfg, "wandb": {"project": "p"}}, "x") == "/ckpt/p/x"
    assert fc.run_dir({**cfg, "save_dir": None}, "x") is None
    # Absolute (orbax refuses relative paths), URLs left alone.
    monkeypatch.chdir(tmp_path)
    assert fc.run_dir({**cfg, "save_dir": "runs"}, "x") == str(tmp_path / "runs" / "p" / "g" / "x")
    assert fc.run_dir({**cfg, "save_dir": "gs://bucket/runs"}, "x") == "gs://bucket/runs/p/g/x"
    with pytest.raises(
        fc.ConfigError, match=r"--name='ft_\{lr\}' names 'lr' which is not a config field"
    ):
        fc.run_dir(cfg, "ft_{lr}")


def test_a_url_save_dir_gets_the_saved_model_alone():
    """gs://: Octo's save_pretrained writes the model there; the checkpoints, the lock and the summary need a file
    system, so the engine and the summary get no layout (before, summary.json went to a local "gs:" directory)."""
    job = fc.FinetuneJob(config={}, name="x", layout=fc.layout({"save_dir": "gs://b/runs"}, "x"))
    assert job.run_dir == "gs://b/runs/octo_finetune/x" and job.local_layout is None
    local = fc.FinetuneJob(config={}, name="x", layout=fc.layout({"save_dir": "/r"}, "x"))
    assert (
        local.local_layout is local.layout
        and local.layout.train_state == "/r/octo_finetune/x/train_state"
    )


def test_existing_checkpoints_without_resume_are_refused_up_front(tmp_path, monkeypatch):
    from octo_dist.engine.checkpoint import CheckpointError

    monkeypatch.chdir(tmp_path)
    raw = smoke_cfg(fake_dataset(tmp_path, "octo_dist_synthetic"), save_dir="runs")
    state = Path(fc.parse(raw, REACHABLE).local_layout.train_state)
    (state / "3").mkdir(parents=True)
    (state / "6.orbax-checkpoint-tmp-17").mkdir()  # half-written: not a step
    with pytest.raises(
        CheckpointError,
        match=r"already holds checkpoints \(latest: step 3\) and --resume was not given.*Fix: add --resume "
        r"to continue that run, or pick another --name or --config.save_dir",
    ):
        fc.parse(raw, REACHABLE)


def test_the_config_is_read_directly_and_frozen_once_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = smoke_cfg(fake_dataset(tmp_path, "octo_dist_synthetic"), save_dir="runs")
    job = fc.parse(raw, REACHABLE, name="ft_{batch_size}", resume=True, step_fn="shard_map")
    c = (
        job.config
    )  # the ConfigDict itself, as the fork reads FLAGS.config: no copied fields beside it
    assert (c.seed, c.batch_size, c.num_steps, c.shuffle_buffer_size, c.save_interval) == (
        42,
        8,
        6,
        64,
        3,
    )
    assert job.plain_config() == raw
    assert job.name == "ft_8" and job.run_dir == str(
        tmp_path / "runs" / "octo_finetune_smoke" / "ft_8"
    )
    assert job.local_layout.train_state == job.run_dir + "/train_state"
    resume = job.training.resume
    assert (
        resume.start == 0 and resume.directory == job.local_layout.train_state
    )  # nothing saved yet
    # The engine's input, the dataclass smoke builds too: the config's save_interval is the engine's save_every.
    assert job.training == train.TrainConfig(
        steps=6,
        seed=42,
        step_fn="shard_map",
        layout=job.local_layout,
        save_every=3,
        resume=resume,
        log_every=1,  # the config's log_interval
    )
    assert job.fingerprint() == {
        "batch_size": 8,
        "seed": 42,
        "step_fn": "shard_map",
        "pretrained_path": "None",
        "dataset": "octo_dist_synthetic",
        "finetuning_mode": "full",
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.config = None
    with pytest.raises(AttributeError):
        c.seed = 1  # checked once: nothing later changes it
    with pytest.raises(fc.ConfigError, match="seed '42'; expected an integer"):
        fc.parse({**raw, "seed": "42"}, REACHABLE)


def test_each_process_and_each_resume_point_gets_its_own_data_seed():
    seeds = {pipeline.data_seed(42, p, s) for p in range(4) for s in (0, 3000)}
    assert len(seeds) == 8 and all(0 <= s < 2**31 for s in seeds)
    assert pipeline.data_seed(42, 1, 0) == pipeline.data_seed(42, 1, 0)


def counted_frames(tf, trajectories=12, length=5):
    """A dataset shaped as make_single_dataset's: one element per trajectory, statistics attached."""

    def build():
        ds = tf.data.Dataset.range(trajectories * length).batch(length).map(lambda x: {"action": x})
        ds.dataset_statistics = {"action": {"mean": [1.0]}}
        return ds

    return build


def test_the_dataset_is_built_once_and_its_first_batch_is_both_the_example_and_the_first_training_batch(
    tmp_path, monkeypatch
):
    tf = pytest.importorskip("tensorflow")
    monkeypatch.chdir(tmp_path)
    # augment_on "auto" resolved as a rank resolves it on the CPU
    job = fc.for_platform(
        fc.parse(smoke_cfg(fake_dataset(tmp_path, "octo_dist_synthetic")), REACHABLE), "cpu"
    )

    def source(start=0, rank=0):
        return pipeline.OctoData(
            job,
            None,
            4,
            rank,
            1,
            start_step=start,
            build=counted_frames(tf),
            process=lambda b: b,
            transform=lambda frames: frames,
        )

    def take(src, start, n=6):
        it = src.batches(start)
        return [next(it)["action"].tolist() for _ in range(n)]

    src = source()
    assert src.builds == 1 and src.dataset_statistics == {"action": {"mean": [1.0]}}
    first = src.example["action"].tolist()
    got = take(src, 0)
    assert src.builds == 1, "statistics, the example batch and training must share one pipeline"
    assert got[0] == first and all(len(b) == 4 for b in got)
    assert len({x for b in got for x in b}) > 4  # a shuffled stream, not one batch repeated
    with pytest.raises(RuntimeError, match="called twice"):
        next(src.batches(0))

    # The same seeds give the same stream; another rank or another resume point draws its own.
    assert take(source(), 0) == got
    assert take(source(rank=1), 0) != got
    resumed = take(source(start=3), 3)
    assert resumed != got

    # Training and the pipeline read one resume decision: asking for another step is a bug, not a rebuild.
    with pytest.raises(RuntimeError, match="built for step 6"):
        next(source(start=6).batches(3))


def test_the_batch_spec_is_known_before_the_first_batch_and_matches_it(tmp_path, monkeypatch):
    """The step is compiled from the batch's shapes while the shuffle buffer fills: tf.data's spec where it knows
    every dimension, one example read ahead where it does not (decoded images' channels); strings are encoded or
    dropped by ``process`` first, as for real batches."""
    tf = pytest.importorskip("tensorflow")
    monkeypatch.chdir(tmp_path)
    job = fc.parse(smoke_cfg(fake_dataset(tmp_path, "octo_dist_synthetic")), REACHABLE)

    def build():
        def trajectories():
            for t in range(12):
                yield {
                    "action": np.arange(5 * t, 5 * t + 5),
                    "image": np.full((5, 2, 3), t, np.uint8),
                    "name": np.array([b"bridge"] * 5),
                }

        ds = tf.data.Dataset.from_generator(
            trajectories,
            output_signature={
                "action": tf.TensorSpec((5,), tf.int64),
                "image": tf.TensorSpec((5, None, 3), tf.uint8),  # a dimension tf.data does not know
                "name": tf.TensorSpec((5,), tf.string),
            },
        )
        ds.dataset_statistics = {"action": {"mean": [1.0]}}
        return ds

    def without_name(batch):
        return {k: v for k, v in batch.items() if k != "name"}

    src = pipeline.OctoData(
        job, None, 4, 0, 1, build=build, process=without_name, transform=lambda frames: frames
    )
    spec = src.batch_spec()
    assert {k: (v.shape, np.dtype(v.dtype)) for k, v in spec.items()} == {
        "action": ((4,), np.dtype("int64")),
        "image": ((4, 2, 3), np.dtype("uint8")),
    }
    assert model.shape_differences(spec, src.example) == ""
    other = {**src.example, "image": np.zeros((4, 9, 3), np.uint8)}
    assert model.shape_differences(spec, other) == "['image']: (4, 2, 3) uint8 vs (4, 9, 3) uint8"
    assert src.builds == 1  # the look ahead reads the built pipeline, it does not build another

    known = pipeline.OctoData(
        job, None, 4, 0, 1, build=counted_frames(tf), process=lambda b: b, transform=lambda f: f
    )
    assert {k: v.shape for k, v in known.batch_spec().items()} == {"action": (4,)}


# --- octo-dist finetune: the installed command, its packaged configs, its help -------------------------------------


def test_help_lists_every_flag_with_its_default_and_the_config_fields(tmp_path):
    # From a directory that is not the checkout: the packaged config is found, nothing else is needed.
    proc = subprocess.run(
        [*OCTO_DIST, "finetune", "--help"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert out.startswith("usage: octo-dist finetune [--config=FILE[:ARGS]]")
    for flag, default in (
        ("--name=NAME", "(default: experiment)"),
        ("--debug", "(default: off)"),
        ("--resume", "(default: off)"),
        ("--step-fn=auto|jit|shard_map", "(default: auto)"),
        ("--compile-cache=DIR", "(--compile_cache works too)"),
        ("--config=FILE[:ARGS]", "(default:"),
    ):
        line = out[out.index(f"  {flag} ") :].split("\n  --")[0]
        assert default in line, (flag, line)
    assert "config fields of finetune_config.py" in out
    # One name per setting, as smoke and launch spell it; the fork's underscore spelling works too.
    assert "(--step_fn works too)" in out and "(--compile_cache works too)" in out
    assert (
        "  --config.batch_size=256\n" in out
        and "  --config.dataset_kwargs.data_dir='data'\n" in out
    )
    assert "``" not in out and "Unknown command line flag" not in proc.stderr
    smoke = subprocess.run(
        [*OCTO_DIST, "finetune", "--config=finetune_smoke_config.py", "-h"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert (
        "config fields of finetune_smoke_config.py" in smoke.stdout
        and "--config.batch_size=8\n" in smoke.stdout
    )
    # octo-dist's own --help lists the subcommand.
    top = subprocess.run(
        [*OCTO_DIST, "--help"], capture_output=True, text=True, timeout=HANG_S, env=clean_env()
    )
    assert "finetune" in top.stdout


def test_packaged_config_names_resolve_from_any_directory_and_own_files_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = parse("--config=finetune_config.py:head_only,image_conditioned").config
    assert (c.finetuning_mode, c.modality) == ("head_only", "image_conditioned")
    assert parse("--config", "finetune_smoke_config.py").config.batch_size == 8
    own = tmp_path / "mine.py"
    own.write_text(
        "from ml_collections import ConfigDict\n\ndef get_config(arg='x'):\n"
        "    return ConfigDict({'batch_size': 3, 'arg': arg})\n"
    )
    assert parse(f"--config={own}:y", "--config.batch_size=5").config.to_dict() == {
        "batch_size": 5,
        "arg": "y",
    }
    assert parse("--config=mine.py").config.arg == "x"  # a relative path to your own file
    with pytest.raises(
        fc.ConfigError,
        match=r"no config file 'configs/nope.py'.*finetune_config.py, "
        r"finetune_smoke_config.py",
    ):
        parse("--config=configs/nope.py")


def test_a_config_name_that_does_not_exist_exits_2_naming_the_choices(tmp_path):
    proc = subprocess.run(
        [*OCTO_DIST, "finetune", "--config=finetune_cfg.py:full,multimodal"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith(
            "octo-dist finetune: error: --config=finetune_cfg.py:full,multimodal: no config "
            "file 'finetune_cfg.py'"
        )
        and "Traceback" not in proc.stderr
    )
    assert "finetune_config.py, finetune_smoke_config.py" in proc.stderr


# --- config checks: clear errors before anything starts ----------------------------------------------------------


def test_an_unreachable_hf_path_names_make_weights(tmp_path):
    cfg = parse(
        "--config.pretrained_path=hf://rail-berkeley/octo-small",
        f"--config.dataset_kwargs.data_dir={fake_dataset(tmp_path)}",
    ).config.to_dict()
    (problem,) = checks.problems(cfg, UNREACHABLE)
    assert problem.startswith(
        "pretrained_path hf://rail-berkeley/octo-small: not in the local Hugging Face cache"
    )
    assert "(ConnectionError: name resolution failed)" in problem
    assert "make weights" in problem and "--config.pretrained_path=weights/octo-small" in problem
    assert checks.problems(cfg, REACHABLE) == []


def test_a_missing_or_incomplete_local_checkpoint_says_what_is_missing(tmp_path):
    data = fake_dataset(tmp_path / "data")
    cfg = parse(
        f"--config.pretrained_path={tmp_path / 'nowhere'}",
        f"--config.dataset_kwargs.data_dir={data}",
    ).config
    (problem,) = checks.problems(cfg.to_dict(), REACHABLE)
    assert (
        f"pretrained checkpoint '{tmp_path / 'nowhere'}' is not a directory" in problem
        and "make weights" in problem
    )

    partial = fake_checkpoint(tmp_path / "partial", {}, files=("config.json",), step=None)
    got = checks.problems({**cfg.to_dict(), "pretrained_path": str(partial)}, REACHABLE)
    assert got[0].endswith("lacks example_batch.msgpack, dataset_statistics.json")
    assert "has no <step>/ directory of parameters" in got[1]


def test_a_local_checkpoint_whose_tokenizer_cannot_be_loaded_is_refused(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "octo-small", OCTO_SMALL_LIKE)
    cfg = {
        **parse(
            f"--config.dataset_kwargs.data_dir={fake_dataset(tmp_path / 'data')}"
        ).config.to_dict(),
        "pretrained_path": str(ckpt),
    }
    asked = []
    (problem,) = checks.problems(cfg, lambda repo: asked.append(repo) or "HF_HUB_OFFLINE is set")
    assert asked == ["t5-base"]
    assert (
        "loads 't5-base' from Hugging Face at start-up" in problem
        and "export HF_HUB_OFFLINE=1" in problem
    )
    assert checks.problems(cfg, REACHABLE) == []
    # config_delete_keys / update_config can drop the language tokenizer and text processor: nothing is needed then.
    cfg["config_delete_keys"] = {"model": {"task_tokenizers": None}}
    cfg["update_config"] = {"text_processor": None}
    assert checks.problems(cfg, UNREACHABLE) == []


def test_a_missing_dataset_names_the_directory_and_the_fix(tmp_path):
    cfg = parse(
        "--config.pretrained_path=hf://rail-berkeley/octo-small",
        f"--config.dataset_kwargs.data_dir={tmp_path / 'nodata'}",
    ).config.to_dict()
    (problem,) = checks.problems(cfg, REACHABLE)
    assert (
        f"dataset 'bridge_dataset': data_dir '{tmp_path / 'nodata'}'" in problem
        and "does not exist" in problem
    )
    assert (
        "--config.dataset_kwargs.data_dir=<the directory that holds bridge_dataset/<version>/>"
        in problem
    )

    (tmp_path / "empty").mkdir()
    (problem,) = checks.problems(smoke_cfg(tmp_path / "empty"), REACHABLE)
    assert (
        "has no octo_dist_synthetic/<version>/dataset_info.json" in problem
        and "make synthetic-data" in problem
    )


def test_batch_size_and_steps_must_be_positive_integers(tmp_path):
    cfg = smoke_cfg(fake_dataset(tmp_path, "octo_dist_synthetic"), batch_size=0, num_steps=2.5)
    got = checks.problems(cfg, REACHABLE)
    assert got == [
        "batch_size 0; expected a positive integer (--config.batch_size=...)",
        "num_steps 2.5; expected a positive integer (--config.num_steps=...)",
    ]


def test_a_cosine_schedule_shorter_than_its_warmup_is_refused(tmp_path):
    cfg = parse(f"--config={SMOKE_CONFIG}", "--config.num_steps=1").config.to_dict()
    cfg["dataset_kwargs"]["data_dir"] = str(fake_dataset(tmp_path, "octo_dist_synthetic"))
    (problem,) = checks.problems(cfg, REACHABLE)
    assert problem.startswith(
        "optimizer.learning_rate: a cosine schedule needs decay_steps (1) > warmup_steps (1)"
    )
    assert (
        checks.problems(
            parse(
                f"--config={SMOKE_CONFIG}",
                "--config.num_steps=2",
                f"--config.dataset_kwargs.data_dir={tmp_path}",
            ).config.to_dict(),
            REACHABLE,
        )
        == []
    )


def test_the_script_refuses_an_unreachable_hf_path_before_any_rank_starts(tmp_path):
    # HF_HUB_OFFLINE: no network attempt, the same outcome as a compute node without a route out.
    env = clean_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            FINETUNE,
            "--config.pretrained_path=hf://rail-berkeley/octo-small",
            f"--config.dataset_kwargs.data_dir={tmp_path / 'nodata'}",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "octo-dist finetune: error: the fine-tune configuration cannot run:" in proc.stderr
    assert (
        "hf://rail-berkeley/octo-small: not in the local Hugging Face cache and the Hub is unreachable "
        "(HF_HUB_OFFLINE is set)" in proc.stderr
    )
    assert "dataset 'bridge_dataset'" in proc.stderr
    # Refused before the runtime: no JAX, no Octo, no TensorFlow was started.
    assert "rank 0/" not in proc.stderr and "tensorflow" not in proc.stderr.lower()
    assert time.monotonic() - started < 60


@pytest.mark.mpi
def test_every_rank_stops_with_the_message_under_mpirun(mpirun, tmp_path):
    env = clean_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = mpirun(
        2,
        "-m",
        "octo_dist",
        "finetune",
        "--config=finetune_smoke_config.py",
        f"--config.dataset_kwargs.data_dir={tmp_path / 'none'}",
        env=env,
        timeout=HANG_S,
    )
    assert proc.returncode != 0
    assert (
        proc.stderr.count("dataset 'octo_dist_synthetic'") >= 1
        and "make synthetic-data" in proc.stderr
    )
    assert "jax.distributed" not in proc.stderr


# --- make weights -----------------------------------------------------------------------------------------------


def test_weights_download_failure_says_to_run_it_on_a_login_node(tmp_path):
    def offline(repo, **kw):
        raise OSError("[Errno -2] Name or service not known")

    with pytest.raises(weights.WeightsError) as e:
        weights.download("hf://rail-berkeley/octo-small", tmp_path / "w", snapshot=offline)
    assert "could not download hf://rail-berkeley/octo-small" in str(e.value)
    assert "run `octo-dist weights` (or make weights) on a login node" in str(e.value)
    with pytest.raises(weights.WeightsError, match="expected hf://<owner>/<name>"):
        weights.download("rail-berkeley/octo-small", tmp_path / "w", snapshot=offline)


def test_weights_download_also_caches_the_tokenizer_the_model_loads(tmp_path):
    calls = []

    def snapshot(repo, local_dir=None, allow_patterns=None):
        calls.append((repo, local_dir, allow_patterns))
        if local_dir:
            fake_checkpoint(Path(local_dir), OCTO_SMALL_LIKE)

    out = weights.download(
        "hf://rail-berkeley/octo-small", tmp_path / "octo-small", snapshot=snapshot
    )
    assert out == tmp_path / "octo-small"
    assert calls == [
        ("rail-berkeley/octo-small", str(tmp_path / "octo-small"), None),
        ("t5-base", None, weights.DEPENDENCY_FILES),
    ]


def test_make_weights_command_fails_clearly_without_the_hub(tmp_path):
    env = clean_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist",
            "weights",
            "hf://rail-berkeley/octo-small",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        "octo-dist weights: error: could not download hf://rail-berkeley/octo-small into "
    )
    assert "run `octo-dist weights` (or make weights) on a login node" in proc.stderr


# --- the synthetic RLDS dataset (tensorflow_datasets, no Octo) ---------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from octo_dist.apps.finetune import synthetic_rlds

    root = tmp_path_factory.mktemp("rlds")
    synthetic_rlds.write(
        root, synthetic_rlds.Layout(train_episodes=6, val_episodes=2, steps=6, image_size=32)
    )
    return root


def test_synthetic_dataset_is_rlds_in_tfrecord_files(synthetic):
    import tensorflow_datasets as tfds

    from octo_dist.apps.finetune import synthetic_rlds

    version_dir = synthetic / synthetic_rlds.NAME / synthetic_rlds.DATASET_VERSION
    assert sorted(p.name for p in version_dir.glob("*.tfrecord*")) == [
        "octo_dist_synthetic-train.tfrecord-00000-of-00001",
        "octo_dist_synthetic-val.tfrecord-00000-of-00001",
    ]
    builder = tfds.builder_from_directory(str(version_dir))
    assert {k: v.num_examples for k, v in builder.info.splits.items()} == {"train": 6, "val": 2}
    episode = next(iter(tfds.as_numpy(builder.as_dataset(split="train").take(1))))
    steps = list(episode["steps"])
    assert (
        len(steps) == 6
        and steps[0]["is_first"]
        and steps[-1]["is_last"]
        and not steps[-1]["is_first"]
    )
    image = steps[0]["observation"]["image_0"]
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    assert steps[0]["observation"]["state"].shape == (7,) and steps[0]["action"].shape == (7,)
    assert set(float(s["action"][-1]) for s in steps) <= {0.0, 1.0}  # a binary gripper, as Bridge's
    assert steps[0]["language_instruction"] in [s.encode() for s in synthetic_rlds.INSTRUCTIONS]


def test_the_smoke_config_finds_the_synthetic_dataset(synthetic):
    assert checks.problems(smoke_cfg(synthetic), UNREACHABLE) == []


# --- with Octo ---------------------------------------------------------------------------------------------------


@pytest.mark.octo
def test_make_single_dataset_reads_the_synthetic_data_in_the_smoke_configs_shapes(synthetic):
    pytest.importorskip("octo")
    from octo_dist.policies import octo

    cfg = fc.for_platform(fc.parse(smoke_cfg(synthetic, seed=0), REACHABLE), "cpu")
    source = pipeline.OctoData(cfg, None, local_batch_size=3, process_index=0, process_count=1)
    batch = next(source.batches(0))
    spec = octo.SMOKE_SPEC
    assert batch["observation"]["image_primary"].shape == (
        3,
        spec.horizon,
        spec.image_size,
        spec.image_size,
        3,
    )
    assert batch["task"]["image_primary"].shape == (3, spec.image_size, spec.image_size, 3)
    assert batch["action"].shape == (3, spec.horizon, spec.action_horizon, spec.action_dim)
    assert batch["action_pad_mask"].shape == batch["action"].shape
    assert (
        "dataset_name" not in batch and "language_instruction" not in batch["task"]
    )  # no text processor
    assert source.dataset_statistics["action"]["mean"].shape == (7,)


@pytest.mark.octo
@pytest.mark.slow
def test_two_identical_runs_draw_the_same_batches(synthetic, tmp_path):
    """dlimp makes its datasets non-deterministic (parallel reads and maps in any order); the job asks for
    deterministic order, so the same seeds give the same batches and losses."""
    pytest.importorskip("octo")
    losses = []
    for name in ("a", "b"):
        proc = subprocess.run(
            [
                sys.executable,
                FINETUNE,
                f"--config={SMOKE_CONFIG}",
                "--debug",
                f"--name={name}",
                f"--config.dataset_kwargs.data_dir={synthetic}",
                f"--config.save_dir={tmp_path}",
                "--config.num_steps=3",
            ],
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env=clean_env(),
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        losses.append(
            json.loads((tmp_path / "octo_finetune_smoke" / name / "summary.json").read_text())[
                "losses"
            ]
        )
    assert losses[0] == losses[1] and len(losses[0]) == 3, losses


@pytest.mark.octo
@pytest.mark.mpi
@pytest.mark.slow
def test_two_rank_finetune_logs_from_rank_0_checkpoints_and_resumes(mpirun, synthetic, tmp_path):
    pytest.importorskip("octo")
    args = [
        FINETUNE,
        f"--config={SMOKE_CONFIG}",
        "--debug",
        f"--config.dataset_kwargs.data_dir={synthetic}",
        f"--config.save_dir={tmp_path}",
        "--name=smoke_{batch_size}",
    ]
    run_dir = tmp_path / "octo_finetune_smoke" / "smoke_8"

    first = mpirun(2, *args, "--config.num_steps=2", timeout=HANG_S)
    assert first.returncode == 0, first.stderr[-4000:]
    assert (
        first.stdout.count(
            "octo-dist finetune: 2 process(es), 2 device(s), global batch 8 (4 per process); "
            "steps 0 -> 2 of 2"
        )
        == 1
    )
    assert "[rank 1/2" not in first.stderr.replace(
        "[rank 1/2 vm] WARNING", ""
    )  # INFO from rank 0 only
    assert (run_dir / "train_state" / "2" / "state").is_dir() and (
        run_dir / "2" / "default"
    ).is_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    digests = summary["params_digests"]
    assert len(digests) == 2 and len(set(digests)) == 1, digests
    # The start-up profile: the fine-tune's phases in order, together the time to the first step (within 10%);
    # the first batch was made in a thread, the init compiled beside the step.
    assert list(summary["startup"]) == [
        "imports",
        "checks",
        "distributed",
        "model_load",
        "dataset",
        "setup",
        "parameters",
        "compile",
        "first_step",
    ]
    assert sum(summary["startup"].values()) == pytest.approx(
        summary["time_to_first_step_s"], rel=0.1
    )
    assert set(summary["startup_beside"]) == {"first_batch", "init_compile"}
    assert f"parameters identical on every rank: {digests[0]}, {digests[1]}" in first.stdout

    again = mpirun(2, *args, "--config.num_steps=2", timeout=HANG_S)
    assert again.returncode == 2
    assert "already holds checkpoints (latest: step 2) and --resume was not given" in again.stderr
    assert "rank 0/" not in again.stderr  # refused before start-up: nothing loaded or compiled

    resumed = mpirun(2, *args, "--config.num_steps=4", "--resume", timeout=HANG_S)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr and "steps 2 -> 4 of 4" in resumed.stdout
    assert (run_dir / "train_state" / "4").is_dir() and (run_dir / "4" / "default").is_dir()

    # The run directory is also an Octo checkpoint: load_pretrained reads the fine-tuned model...
    import jax
    from octo.model.octo_model import OctoModel

    model = OctoModel.load_pretrained(str(run_dir))
    assert model.config["window_size"] == 2 and model.dataset_statistics["action"][
        "mean"
    ].shape == (7,)
    # What the fork's finetune.py reads from a pretrained model in full mode (a KeyError without it).
    assert model.config["optimizer"]["frozen_keys"] == []
    # The fine-tune reads the same arrays without load_pretrained's trace of the model's init.
    from octo_dist.apps.finetune import weights

    raw = weights.pretrained_params(str(run_dir))
    assert jax.tree_util.tree_structure(raw) == jax.tree_util.tree_structure(model.params)
    assert all(jax.tree_util.tree_leaves(jax.tree_util.tree_map(np.array_equal, raw, model.params)))

    # ...and a new fine-tune starts from it (one process): head_only leaves the transformer as it was loaded.
    # Relative paths on purpose: orbax refuses them ("Checkpoint path should be absolute") unless made absolute.
    head = subprocess.run(
        [
            sys.executable,
            FINETUNE,
            f"--config={SMOKE_CONFIG}",
            "--debug",
            f"--config.pretrained_path={run_dir.relative_to(tmp_path)}",
            "--config.finetuning_mode=head_only",
            f"--config.dataset_kwargs.data_dir={synthetic}",
            "--config.save_dir=head",
            "--config.num_steps=3",
        ],  # the learning rate is 0 at step 0
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert head.returncode == 0, head.stderr[-4000:]
    tuned = OctoModel.load_pretrained(str(tmp_path / "head" / "octo_finetune_smoke" / "experiment"))
    same = jax.tree_util.tree_map(np.array_equal, model.params, tuned.params)
    assert all(jax.tree_util.tree_leaves(same["octo_transformer"]))
    assert not all(jax.tree_util.tree_leaves(same["heads_action"]))
