"""The run summary's input line calls a run compute-bound only where input is a small part of each step: a
1-process CPU smoke run whose batches took 43% of each step was called compute-bound."""

import pytest

from octo_dist.apps import summary

# Steps end every 0.25 s from the third on (the first two compile the step and read the metrics; left out).
STEP_ENDS = [110.0, 110.5, 110.75, 111.0, 111.25]


def figures(input_s: float) -> summary.RunSummary:
    """A 5-step run whose last three steps each spent ``input_s`` seconds making the next batch."""
    return summary.summarize(
        command="smoke",
        processes=1,
        devices=2,
        global_batch=8,
        start_step=0,
        end_step=5,
        losses={0: 1.0, 4: 0.5},
        process_started=100.0,
        fit_started=103.0,
        step_ends=STEP_ENDS,
        ended=112.0,
        input_s={0: 9.0, 1: 3.0, 2: input_s, 3: input_s, 4: input_s},
    )


def input_line(s: summary.RunSummary) -> str:
    (line,) = [ln for ln in summary.lines(s).splitlines() if ln.startswith("  input ")]
    return line


def test_input_at_43_percent_of_each_step_is_not_called_compute_bound():
    s = figures(0.1075)  # 107.5 ms of a 250 ms step
    assert s.input_share == pytest.approx(0.43)
    assert s.bound == "input-heavy" and s.as_json()["bound"] == "input-heavy"
    line = input_line(s)
    assert "compute-bound" not in line
    assert line.startswith("  input 107.5 ms of each step (43%): input-heavy: ")
    assert "making the next batch takes 43% of each step; at 80% they would wait for it" in line
    assert "octo-dist launch --cpus-per-rank" in line


@pytest.mark.parametrize(
    "input_s, bound",
    [
        (0.01, "compute-bound"),  # 4%
        (0.06, "compute-bound"),  # 24%
        (0.0625, "input-heavy"),  # 25%: input could no longer triple before the devices wait
        (0.1975, "input-heavy"),  # 79%
        (0.2, "data-bound"),  # 80%
        (0.25, "data-bound"),
    ],
)
def test_the_verdict_follows_the_share_of_each_step(input_s, bound):
    s = figures(input_s)
    assert s.bound == bound
    assert f"): {bound}" in input_line(s)
