"""A flag of `octo-dist smoke` given twice with two values is refused (exit 2), as launch refuses its own, where
argparse kept the last without a word; under `launch ... -- smoke` the render refuses it before anything queues."""

import subprocess
import sys

import pytest

from helpers import REPO, clean_env
from octo_dist import cli
from octo_dist.apps.smoke import app


@pytest.mark.parametrize(
    "argv",
    [
        ["--steps", "3", "--steps", "5"],
        ["--steps=3", "--steps=5"],
        ["--save-dir", "runs/a", "--save-dir", "runs/b"],
        ["--step-fn", "jit", "--step-fn", "shard_map"],
    ],
)
def test_a_second_value_of_a_smoke_flag_is_refused(argv):
    with pytest.raises(ValueError, match="set the same flag twice; expected one value"):
        app.check_command(argv)


def test_the_same_value_twice_is_one_value():
    app.check_command(["--steps", "3", "--steps=3"])


def test_launch_refuses_a_smoke_flag_given_twice(tmp_path, capsys):
    out = tmp_path / "job.sh"
    head = ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "-o", str(out)]
    assert cli.main([*head, "--", "smoke", "--steps", "3", "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert "-- smoke: --steps 3 and --steps 5 set the same flag twice" in err, err
    assert not out.exists()


def test_smoke_itself_refuses_before_starting():
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "smoke", "--steps", "3", "--steps", "5"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "error: --steps 3 and --steps 5 set the same flag twice" in proc.stderr
