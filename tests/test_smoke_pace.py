"""``smoke --step-time``: a rehearsal at a long job's pace. Each step lasts at least that long, the parameters are the
ones a full-speed run ends with, and a stop signal is still seen between steps."""

import json
from concurrent.futures import ThreadPoolExecutor

import helpers
from helpers import HANG_S

from octo_dist.apps.smoke.app import Pace


class Clock:
    """A clock the test moves by hand; ``sleep`` moves it too and records what was slept."""

    def __init__(self):
        self.now, self.slept = 100.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(round(seconds, 6))
        self.now += seconds


def test_pace_sleeps_what_each_step_left_of_the_step_time():
    clock = Clock()
    pace = Pace(0.5, clock=clock, sleep=clock.sleep)
    pace(0, {})  # the first read: nothing to measure from
    clock.now += 0.2  # a 0.2 s step: 0.3 s left
    pace(1, {})
    clock.now += 0.7  # a step longer than the pace: no sleep
    pace(2, {})
    clock.now += 0.5  # exactly the pace: no sleep
    pace(3, {})
    assert clock.slept == [0.3]


def smoke(tmp_path, name, *flags):
    # 4 steps: the summary's median step is over the intervals from the third step on, two here (paced: 3 s slept)
    record = tmp_path / f"{name}.json"
    proc = helpers.run_smoke(
        "--steps", "4", "--record", str(record), *flags, cwd=tmp_path, timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(record.read_text())


def test_a_paced_run_ends_with_the_full_speed_runs_parameters(tmp_path):
    # Side by side: each run is one process, mostly JAX's start-up and compilation (one core each).
    with ThreadPoolExecutor(2) as pool:
        runs = [("fast",), ("paced", "--step-time", "1")]
        fast, paced = pool.map(lambda run: smoke(tmp_path, *run), runs)
    assert paced["digests"] == fast["digests"] and paced["losses"] == fast["losses"]
    # What the sleep guarantees, not a speed: the summary times a step from one metrics read to the next, and the
    # pace from just after the read, so an interval is 1 s plus the difference of two reads' own times (a tiny
    # model's: milliseconds); 0.8 leaves that room.
    assert paced["step_time_median_s"] >= 0.8, paced["step_time_median_s"]
