"""One name per setting: `octo-dist validate` takes launch's --per-gpu-batch; its old --per-device-batch still
works, with a note."""

from __future__ import annotations

import argparse

from octo_dist.apps.validate import app as validate


def parsed(*argv):
    parser = argparse.ArgumentParser(prog="octo-dist")
    validate.add_parser(parser.add_subparsers())
    return parser.parse_args(["validate", *argv])


def test_validate_takes_launchs_name_and_notes_the_old_one(capsys):
    assert parsed("--per-gpu-batch", "4").per_device_batch == 4
    assert capsys.readouterr().err == ""
    assert parsed("--per-device-batch", "6").per_device_batch == 6
    assert capsys.readouterr().err == (
        "octo-dist validate: note: --per-device-batch is now --per-gpu-batch; the old name still works\n"
    )
    assert parsed().per_device_batch == 8
    assert (
        "--per-gpu-batch"
        in validate.add_parser(argparse.ArgumentParser().add_subparsers()).format_help()
    )


def test_launch_takes_the_commands_devices_per_process_and_notes_the_old_name(capsys):
    """smoke, finetune and validate say --devices-per-process; launch said --devices-per-rank for the same setting."""
    from octo_dist.jobs.cli import parse

    head = ["slurm", "--nodes", "1", "--gpus-per-node", "8"]
    assert parse([*head, "--devices-per-process", "8"]).header.devices_per_rank == 8
    assert capsys.readouterr().err == ""
    assert parse([*head, "--devices-per-rank", "4"]).header.devices_per_rank == 4
    assert capsys.readouterr().err == (
        "octo-dist launch slurm: note: --devices-per-rank is now --devices-per-process; the old name still works\n"
    )
