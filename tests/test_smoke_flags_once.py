"""A flag of smoke's own (flags.py: --steps, --save-dir, --step-fn) given twice with two values is refused by the
check launch runs on ``-- smoke ...`` before it renders, where argparse kept the last without a word. The refusal
through ``launch`` and by the command itself is tested with the start-up flags (test_startup_flags_once.py), the
same values twice there too; the parser of every subcommand in test_flags_given_once.py."""

import pytest

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
