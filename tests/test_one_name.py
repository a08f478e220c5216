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
        "octo-dist validate: note: --per-device-batch is now --per-gpu-batch (as in octo-dist launch); the old "
        "name still works\n"
    )
    assert parsed().per_device_batch == 8
    assert (
        "--per-gpu-batch"
        in validate.add_parser(argparse.ArgumentParser().add_subparsers()).format_help()
    )
