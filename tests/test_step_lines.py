"""Training's progress in a job's log: plain step lines, not tqdm's carriage-return redraws, and the last one says
the run's last loss (the bar used to end a step behind the summary). What a real run writes to a piped stderr is
checked on test_summary.py's smoke job (test_a_runs_last_line_says_its_last_loss): no JAX start-up of its own here."""

from __future__ import annotations

import io

from octo_dist.runtime import ranklog


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_step_lines_every_interval_and_at_the_end():
    clock, out = Clock(), io.StringIO()
    lines = ranklog.StepLines(range(10, 20), total=20, initial=10, every_s=30, out=out, clock=clock)
    for step in lines:
        lines.set_postfix_str(f"loss {step / 100:.4f} at step {step}")
        clock.now += 10  # 10 s a step: a line every third step, and the last
    said = out.getvalue().splitlines()
    assert said == [
        "train: step 13/20, loss 0.1200 at step 12 (0.10 steps/s)",
        "train: step 16/20, loss 0.1500 at step 15 (0.10 steps/s)",
        "train: step 19/20, loss 0.1800 at step 18 (0.10 steps/s)",
        "train: step 20/20, loss 0.1900 at step 19 (0.10 steps/s)",
    ], said
