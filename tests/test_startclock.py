"""The start-up clock (``runtime.startclock``) and the process start it is measured from (``harness``)."""

import subprocess
import sys
import threading
import time

import pytest

from helpers import HANG_S, clean_env
from octo_dist.apps import harness
from octo_dist.runtime import startclock


@pytest.fixture(autouse=True)
def fresh_clock():
    startclock.clear()
    yield
    startclock.clear()


def test_marks_are_kept_in_order_and_a_background_task_is_timed_beside_them():
    started = threading.Event()
    release = threading.Event()

    def slow(x):
        started.set()
        release.wait(30)
        return x * 2

    first = startclock.done("imports")
    task = startclock.Background("compile", slow, 21)
    assert started.wait(30)
    startclock.done("parameters")  # the main thread goes on while the task runs
    assert startclock.besides() == {}  # recorded when it ends, not before
    time.sleep(0.05)
    release.set()
    assert task.result() == 42
    startclock.done("compile", at=first + 100.0)
    assert [name for name, _ in startclock.marks()] == ["imports", "parameters", "compile"]
    assert startclock.marks()[0][1] == first and startclock.marks()[-1][1] == first + 100.0
    assert startclock.besides()["compile"] >= 0.05


def test_a_background_tasks_error_is_raised_where_its_result_is_asked_for():
    def broken():
        raise ValueError("shapes differ: (8, 3) vs (8, 4)")

    task = startclock.Background("first_batch", broken)
    with pytest.raises(ValueError, match=r"shapes differ: \(8, 3\) vs \(8, 4\)"):
        task.result()
    assert "first_batch" in startclock.besides()  # its time is still accounted for


def test_a_phase_beside_the_main_thread_adds_up():
    startclock.beside("compile", 1.5)
    startclock.beside("compile", 2.0)
    assert startclock.besides() == {"compile": 3.5}


def fake_proc(tmp_path, uptime: str, stat: str):
    (tmp_path / "self").mkdir()
    (tmp_path / "uptime").write_text(uptime)
    (tmp_path / "self" / "stat").write_text(stat)
    return str(tmp_path)


def test_the_process_start_is_read_on_the_kernels_boot_clock(tmp_path):
    import os

    hz = os.sysconf("SC_CLK_TCK")
    # Started 300 ticks after boot, 1000.5 s of uptime now; a command with a space and ")" in its name.
    stat = f"4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 {300 * hz // 100} 1000 20"
    proc = fake_proc(tmp_path, "1000.50 1990.00\n", stat)
    before = time.time()
    got = harness.process_started(proc)
    assert before - (1000.5 - 3.0) - 0.5 <= got <= time.time() - (1000.5 - 3.0) + 0.5


# The kernel's boot clock and time.time() are two clocks: ticks of 10 ms, and whatever NTP slews between reads.
CLOCKS_AGREE_S = 0.5
WAIT_S = 1.0


def test_a_process_started_after_its_launch_and_before_its_imports_and_a_missing_proc_falls_back(
    tmp_path,
):
    # A process launched now that waits a second before importing harness: its start lies between its launch and
    # that import less the second (the interpreter's launch, not the import), however long either took.
    launched = time.time()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import time; time.sleep({WAIT_S}); from octo_dist.apps import harness; "
            "print(harness.process_started(), harness._IMPORTED)",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=HANG_S,
        check=True,
    )
    started, imported = map(float, child.stdout.split())
    assert launched - CLOCKS_AGREE_S <= started <= imported - WAIT_S + CLOCKS_AGREE_S, (
        launched,
        child.stdout,
    )
    # This process (pytest, however long it has run): before its import of harness, and before now.
    assert harness.process_started() <= min(harness._IMPORTED + CLOCKS_AGREE_S, time.time())
    assert harness.process_started(str(tmp_path / "nothing")) == harness._IMPORTED
    broken = fake_proc(tmp_path, "not-a-number\n", "4242 (python3) S")
    assert harness.process_started(broken) == harness._IMPORTED
