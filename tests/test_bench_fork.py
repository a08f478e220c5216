"""bench/startup_fork.py and its stamping wrapper, without the fork: the skip lines and the loop stamps."""

import importlib.util
import json
import subprocess
import sys

from helpers import HANG_S, REPO, clean_env

BENCH = REPO / "bench"


def run(*args, cwd):
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=HANG_S,  # only ends a hang: two JAX start-ups took 40 s of 120 at a load of 12-22
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


LOOP = """
import sys
from concurrent.futures import ThreadPoolExecutor
import jax, jax.numpy as jnp, numpy as np

def train_step(w, batch):
    return w - 0.1 * jnp.mean(batch), jnp.mean(batch)

def ahead(batch):
    return batch * 2.0

batch = np.zeros((4, 8), np.float32)  # 128 bytes
if sys.argv[1] == "jit":  # the fork's way: numpy into a jitted train_step, its metrics fetched every step
    step = jax.jit(train_step)
    w = jnp.zeros(())
    for i in range(7):
        w, loss = step(w, batch + i)
        jax.device_get(loss)
else:  # octo-dist's: compiled steps, the next batch made on a worker thread beside each step
    step = jax.jit(train_step).lower(jnp.zeros(()), batch).compile()
    prepare = jax.jit(ahead).lower(batch).compile()
    pool = ThreadPoolExecutor(1)
    w, upcoming = jnp.zeros(()), pool.submit(lambda: prepare(jax.device_put(batch))).result()
    for i in range(7):
        coming = pool.submit(lambda i=i: prepare(jax.device_put(batch + i)))
        w, loss = step(w, upcoming)
        upcoming = coming.result()
        float(loss), float(loss)
"""


def test_the_step_profile_counts_each_steps_fetches_copies_and_work_beside_it(tmp_path):
    sys.path.insert(0, str(BENCH))
    from step_profile import breakdown

    (tmp_path / "loop.py").write_text(LOOP)
    # Both profiles side by side (each one process, mostly JAX's import: one core each), then read.
    ways = {"jit": "train_step", "compiled": "compiled"}
    procs = {
        way: subprocess.Popen(
            [sys.executable, BENCH / "step_profile.py", tmp_path / f"{way}.json", "--step", step]
            + [tmp_path / "loop.py", way],
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
            cwd=tmp_path,
        )
        for way, step in ways.items()
    }
    got = {}
    for way, proc in procs.items():
        _, err = proc.communicate(timeout=HANG_S)
        assert proc.returncode == 0, err[-3000:]
        got[way] = breakdown(json.loads((tmp_path / f"{way}.json").read_text()))
    fork, ours = got["jit"], got["compiled"]
    # 7 steps, the first two skipped: 4 intervals between the steps left
    assert (fork["steps"], ours["steps"]) == (4, 4)
    assert fork["devices"] >= 1 and fork["compile_n"] == ours["compile_n"] == 0
    # the fork's batch goes in with the step's call (implicit copy), one device_get a step
    assert (fork["step_h2d_bytes"], fork["h2d_n"], fork["fetch_n"]) == (128, 0, 1)
    # ours: two float() reads a step on the main thread; the batch's copy and its preparation on the worker
    assert (ours["step_h2d_bytes"], ours["h2d_n"], ours["fetch_n"]) == (0, 0, 2)
    assert ours["beside_h2d_bytes"] == 128 and ours["beside_s"] > 0
    assert ours["input_n"] == 1  # waiting for the worker's batch
