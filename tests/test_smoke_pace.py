"""``smoke --step-time``: a rehearsal at a long job's pace. Each step lasts at least that long (``Pace``, on a clock
moved by hand, here). That a paced job's parameters are the ones a full-speed run ends with, that its median step
lasts the pace, and that a stop signal is still seen between steps are checked on test_smoke.py's 2-rank jobs:
its stopped runs are paced, and its last run, paced too, ends with the full-speed run's bits (no job of its own
here: each is a JAX start-up and compilation)."""

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
