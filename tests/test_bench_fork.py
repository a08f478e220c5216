"""bench/startup_fork.py and its stamping wrapper, without the fork: the skip lines and the loop stamps."""

import importlib.util
import json
import subprocess
import sys

from helpers import REPO, clean_env

BENCH = REPO / "bench"


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        cwd=cwd,
    )


def test_without_the_forks_tree_the_benchmark_says_why_and_exits_0(tmp_path):
    given = run(BENCH / "startup_fork.py", "--fork", tmp_path, cwd=tmp_path)
    assert given.returncode == 0, given.stderr
    assert given.stdout.startswith(
        f"bench-startup-fork: skipped: no scripts/finetune.py under {tmp_path}; pass --fork"
    )
    if importlib.util.find_spec("octo") is None:  # CI: octo cannot be installed there
        found = run(BENCH / "startup_fork.py", cwd=tmp_path)
        assert found.returncode == 0, found.stderr
        assert found.stdout == (
            "bench-startup-fork: skipped: octo is not importable; make git-deps, or pass --fork "
            "<the fork's source tree>\n"
        )


def test_the_fork_runs_unchanged_and_each_iteration_of_its_training_loop_is_stamped(tmp_path):
    script = tmp_path / "scripts" / "finetune.py"
    script.parent.mkdir()
    # The shape of the fork's loop; a second bar over a list (not a range) is not the training loop.
    script.write_text(
        "import sys, time, tqdm\n"
        "for _ in tqdm.tqdm(['a', 'b']):\n"
        "    pass\n"
        "for i in tqdm.tqdm(range(0, 3), total=3):\n"
        "    time.sleep(0.05)\n"
        "print('argv', sys.argv[1:])\n"
    )
    out = tmp_path / "stamps.json"
    proc = run(BENCH / "fork_timing.py", out, script, "--config.num_steps=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "argv ['--config.num_steps=3']" in proc.stdout
    got = json.loads(out.read_text())
    stamps = got["iteration_starts"]
    assert len(stamps) == 4  # three iterations started, then the loop's end
    assert got["process_started"] < stamps[0]
    assert all(b - a >= 0.04 for a, b in zip(stamps[1:], stamps[2:]))
