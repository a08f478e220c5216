"""What the README says a command prints is what it prints: check-env's table shows each problem over three lines
(found / expected / fix) and ends with the counts, not "one line per problem"."""

import re

from helpers import REPO
from octo_dist.envcheck.report import as_table
from octo_dist.envcheck.result import FAIL, OK, Check


def _readme_comment(command: str) -> str:
    """The ``# ...`` comment beside ``command`` in the README's section (a)."""
    section = REPO.joinpath("README.md").read_text().split("## (a)", 1)[1].split("\n## ", 1)[0]
    line = next(ln for ln in section.splitlines() if ln.startswith(command))
    return line.partition("#")[2]


def test_the_readme_says_what_check_env_prints():
    table = as_table(
        [
            Check("jax.version", FAIL, "0.4.30", "0.4.22", "make env PROFILE=cpu"),
            Check("python", OK, "3.11", "3.10 or 3.11"),
        ],
        "cpu",
    )
    lines = table.splitlines()
    assert [re.sub(r"\s+", " ", ln).split(":")[0].strip() for ln in lines[1:4]] == [
        "FAIL jax.version found",
        "expected",
        "fix",
    ]
    assert lines[-1] == "1 ok, 0 warning(s), 1 failure(s)"
    said = _readme_comment("octo-dist check-env --profile cpu")
    assert "one line per problem" not in said
    assert "found/expected/fix" in said and "counts" in said, said
