"""`-- finetune`'s values, checked before the queue wait: a ``--config.FIELD`` with no value before another flag is
refused (absl took that flag as the value: ``--config.augment_on --config.num_steps=3`` lost the step count), and
an ``augment_on``/``resize_method`` value the job would refuse at its start is warned of when launch renders
(``--submit`` refuses it), also on a login node's bare Python."""

import os

import pytest

from helpers import run_captured
from octo_dist import cli

pytest.importorskip("ml_collections")
from octo_dist.apps.finetune import arguments  # noqa: E402

PACKAGED = "--config=finetune_smoke_config.py"
LAUNCH = ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "--dry-run", "--"]
WEIGHTS = "--config.pretrained_path=weights/octo-small"


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["--config.augment_on", "--config.num_steps=3"],
            "--config.augment_on without a value (the next argument, --config.num_steps=3, is a flag",
        ),
        (["--config.resize_method", "--debug"], "--config.resize_method without a value"),
        (["--config.num_steps", "--debug"], "--config.num_steps without a value"),
        (["--config.augment_on"], "--config.augment_on without a value (nothing follows it)"),
    ],
)
def test_a_config_field_without_a_value_is_refused(argv, needle):
    with pytest.raises(ValueError) as refused:
        arguments.check_command([PACKAGED, *argv])
    assert needle in str(refused.value) and "give it as " in str(refused.value)


def test_a_value_as_the_next_word_still_works():
    flags = arguments.parse_flags(
        ["prog", PACKAGED, "--config.augment_on", "host", "--config.seed", "-1"]
    )
    assert (flags.config.augment_on, flags.config.seed) == ("host", -1)


def test_a_boolean_field_needs_no_value(tmp_path):
    config = tmp_path / "mine.py"
    config.write_text(
        "from ml_collections import ConfigDict\n\n\ndef get_config():\n"
        "    return ConfigDict({'use_x': False, 'seed': 1})\n"
    )
    flags = arguments.parse_flags(
        ["prog", f"--config={config}", "--config.use_x", "--config.seed=2"]
    )
    assert (flags.config.use_x, flags.config.seed) == (True, 2)


def test_launch_refuses_the_swallowed_flag(capsys):
    argv = [*LAUNCH, "finetune", PACKAGED, WEIGHTS, "--config.augment_on", "--config.num_steps=3"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "-- finetune: --config.augment_on without a value" in err, err


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("--config.augment_on=hots", "expected one of auto, device, host"),
        ("--config.resize_method=lanczos", "expected one of lanczos3, bilinear"),
    ],
)
def test_a_value_typo_is_warned_of_at_render(capsys, flag, expected):
    assert cli.main([*LAUNCH, "finetune", PACKAGED, WEIGHTS, flag]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "warning:" in ln]
    assert warned == [
        f"octo-dist launch: warning: {flag} after -- finetune: every rank stops at its start (after the "
        f"wait in the queue); {expected}. Fix: {flag.split('=')[0]}={expected.split()[3].rstrip(',')}"
    ]


BARE_39 = "/root/.pyenv/versions/3.9.18/bin/python"


@pytest.mark.skipif(not os.path.exists(BARE_39), reason=f"no CPython 3.9 at {BARE_39} (pyenv)")
def test_a_value_typo_is_warned_of_on_a_bare_login_python():
    proc = run_captured(
        [BARE_39, "-S", "-E", "-B", "-m", "octo_dist", *LAUNCH, "finetune", WEIGHTS]
        + ["--config.augment_on=hots"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: --config.augment_on=hots after -- finetune: every rank stops" in proc.stderr
