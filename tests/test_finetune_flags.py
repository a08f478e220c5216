"""`octo-dist finetune`'s bad flags and config values: one line each, naming what was found and the fix.

Runs without Octo: flags and the config file are parsed (absl, ml_collections) before anything imports JAX or
Octo, so every case below is the real command line refused by the real parser.
"""

import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env
from octo_dist.apps.finetune import app, arguments, flagerrors

FINETUNE = [sys.executable, "-m", "octo_dist", "finetune"]
FIX = "Fix: octo-dist finetune --help lists the flags and config fields"


@pytest.mark.parametrize(
    "flag, line",
    [
        (
            "--config.batch_sise=3",
            f"unknown config field batch_sise, did you mean --config.batch_size? {FIX}",
        ),
        (
            "--config.num-steps=5",
            "--config.num-steps=5: config fields are spelled with underscores, did you mean "
            f"--config.num_steps=5? {FIX}",
        ),
        ("--steps=5", f"unknown flag --steps, did you mean --config.num_steps? {FIX}"),
        ("--nam=x", f"unknown flag --nam, did you mean --name? {FIX}"),
        ("--zzz", f"unknown flag --zzz. {FIX}"),
        (
            "--config=finetune_config.py:bogus",
            "--config=finetune_config.py:bogus: config string 'bogus'; expected '<mode>,<modality>'",
        ),
        ("--config.num_steps=many", "--config.num_steps=many: invalid literal for int()"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_2(flag, line):
    proc = subprocess.run(
        [*FINETUNE, flag], capture_output=True, text=True, timeout=HANG_S, env=clean_env(), cwd=REPO
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr  # no traceback, no TensorFlow start-up lines
    assert proc.stderr.startswith(f"octo-dist finetune: error: {line}"), proc.stderr
    assert "object at 0x" not in proc.stderr and "\\n" not in proc.stderr
    assert proc.stdout == ""


def test_the_hyphenated_spelling_of_octo_dist_flags_is_accepted():
    # smoke spells them --step-fn / --compile-cache, the fork's style --step_fn: either works in finetune.
    flags = arguments.parse_flags(
        ["octo-dist finetune", "--config=finetune_smoke_config.py", "--step-fn=jit"]
    )
    assert flags.step_fn == "jit"
    flags = arguments.parse_flags(
        ["octo-dist finetune", "--compile-cache", "/tmp/cache", "--debug"]
    )
    assert flags.compile_cache == "/tmp/cache" and flags.debug


def test_a_field_word_is_suggested_from_the_least_nested_field():
    error = ValueError("Unknown command line flag 'steps'. Did you mean: step_fn ?")
    fields = [
        "optimizer.learning_rate.decay_steps",
        "num_steps",
        "optimizer.grad_accumulation_steps",
    ]
    assert flagerrors.one_line(error, ["prog"], fields) == (
        "unknown flag --steps, did you mean --config.num_steps?"
    )
    # A node above the fields is suggested too: the user then finds its fields in --help.
    error = ValueError("Unknown command line flag 'learnin_rate'.")
    assert flagerrors.one_line(error, ["prog"], ["optimizer.learning_rate.peak_value"]) == (
        "unknown flag --learnin_rate, did you mean --config.optimizer.learning_rate?"
    )


def test_finetune_takes_smokes_start_up_flags_from_the_same_definitions():
    # --devices-per-process and the rest are runtime.argv_options's, as in smoke: read before absl sees argv.
    flags, startup = arguments.parse_command_line(
        [
            "octo-dist finetune",
            "--config=finetune_smoke_config.py",
            "--devices-per-process=all",
            "--init-timeout",
            "90",
            "--launcher=openmpi",
            "--config.seed=3",
        ]
    )
    assert startup == {
        "launcher": "openmpi",
        "coordinator": None,
        "timeout_s": 90.0,
        "devices": "all",
    }
    assert flags.config.seed == 3
    # The fork's underscore spelling is accepted too; nothing given: smoke's defaults.
    _, startup = arguments.parse_command_line(["octo-dist finetune", "--devices_per_process=all"])
    assert startup["devices"] == "all"
    assert arguments.parse_command_line(["octo-dist finetune"])[1]["devices"] == "one"


def test_a_bad_start_up_flag_is_one_line_and_listed_in_help(capsys):
    assert app.main(["octo-dist finetune", "--devices-per-process=two"], environ={}) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "octo-dist finetune: error: argument --devices-per-process: one, all or a whole number of GPUs per "
        "process (2), not 'two'"
    ), err
    from octo_dist.apps.finetune import commandline

    text = " ".join(commandline.help_text(["octo-dist finetune"]).split())
    assert "--devices-per-process=one|all|N" in text and "(default: one)" in text


FORK_STYLE_CONFIG = """from ml_collections import ConfigDict


def get_config(config_string=None):
    # a config file written for the fork: none of octo-dist's own fields
    return ConfigDict({"seed": 42, "num_steps": 10, "batch_size": 8})
"""


@pytest.mark.parametrize("spelling", ["--config.augment_on=host", "--config.augment_on host"])
def test_octo_dists_own_fields_are_taken_with_a_config_file_that_lacks_them(tmp_path, spelling):
    """The fork's finetune_config.py has no augment_on or resize_method: overriding them failed with "'augment_on'"
    (ml_collections refuses a field the file lacks), so a fork config could not choose host augmentation."""
    pytest.importorskip("ml_collections")
    config = tmp_path / "fork_config.py"
    config.write_text(FORK_STYLE_CONFIG)
    argv = ["prog", f"--config={config}", *spelling.split(" "), "--config.resize_method=bilinear"]
    fv, _ = arguments.parse_command_line(argv)
    assert (fv.config.augment_on, fv.config.resize_method, fv.config.seed) == (
        "host",
        "bilinear",
        42,
    )
    # the packaged config has the fields: the same override, through the same path
    fv, _ = arguments.parse_command_line(["prog", "--config.augment_on=host"])
    assert fv.config.augment_on == "host"
