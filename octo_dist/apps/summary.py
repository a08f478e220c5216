"""What a training run ends with, on rank 0: the figures people look at, in the log, ``summary.json`` and
``loss.png`` (the whole run: every job of a resumed or chained run).

    octo-dist finetune: run summary: wall 46.5 s, first step after 37.1 s (compile 20.3 s), median step 155.7 ms,
      51 examples/s (global batch 8), loss 11.2438 -> 8.3107 over steps 0 -> 60
      start-up: imports 4.3 s, checks 0.1 s, distributed 0.5 s, model load 1.0 s, dataset 9.8 s, setup 0.0 s,
      parameters 0.6 s, compile 20.3 s, first step 0.5 s; beside: first batch 2.1 s, init compile 4.7 s
      input 6.3 ms of each step (4%): compute-bound

:func:`summarize` is pure over the timestamps the harness took (process start, training start, the end of every
step), so it is tested with numbers; :func:`write` puts the JSON and the plot where the run's layout
(``savelayout.RunLayout.summary``, ``.loss_plot``) names them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import statistics
import tempfile
from pathlib import Path
from typing import IO, Callable, Mapping, Optional, Sequence, Tuple, Union

from octo_dist import savelayout

# 2: `losses` is the whole run's (every job of a resumed or chained run), `jobs` lists each job's figures.
# 3: `compile_s` is the start-up profile's compile phase (the one compile time, as the log line says); the time
# from the start of training to the first step's end, which `compile_s` held before, is `fit_to_first_step_s`.
SCHEMA = 3
# loss.png: past this many steps the raw losses are drawn faint under a smoothed line (EMA); the y axis turns
# logarithmic when the losses span at least LOG_SCALE_SPAN (a factor: 100 = two decades).
SMOOTH_FROM_STEPS = 200
LOG_SCALE_SPAN = 100.0
# Making the next batch takes this share of a step or more: the host barely keeps up (it also dispatches the
# step and reads metrics), so the devices wait for input.
DATA_BOUND_SHARE = 0.8
# Below this share the input could grow more than threefold (heavier augmentation, a slower file system, fewer
# cores) before it reaches DATA_BOUND_SHARE: the devices set the pace, "compute-bound". Between the two, input is
# a large part of each step (a 1-process CPU smoke run: 43%) and neither word is honest: "input-heavy".
COMPUTE_BOUND_SHARE = 0.25
PLOT_SIZE_PX = (800, 480)  # loss.png, width x height
PLOT_DPI = 100
# summary.json read back at most this big: 100,000 steps' losses take about 3 MB.
SUMMARY_MAX_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class RunSummary:
    command: str  # "smoke", "finetune"
    processes: int
    devices: int
    global_batch: int
    start_step: int
    end_step: int
    wall_s: float  # process start -> end of training
    # process start -> first step finished (None: no step ran)
    time_to_first_step_s: Optional[float]
    # One compile time, the same in the log line, summary.json and the benchmarks: the main thread's wait for the
    # train step's compilation (the start-up profile's "compile" phase; compilation overlapped with other work
    # is under startup_beside). None when the run has no start-up profile.
    compile_s: Optional[float]
    # the steps after the first two (which compile the step, then the metric reads)
    median_step_s: Optional[float]
    examples_per_s: Optional[float]  # global batch / median step
    loss_first: Optional[float]
    loss_last: Optional[float]
    stopped_by: Optional[str]
    # every rank's parameter digest, in rank order (identical when sound)
    params_digests: Optional[list] = None
    # the host's time making the next batch while a step ran (median over the same steps as median_step_s),
    # and its share of the step: at DATA_BOUND_SHARE or more the devices wait for input, below
    # COMPUTE_BOUND_SHARE they set the pace
    median_input_s: Optional[float] = None
    input_share: Optional[float] = None
    # where the time to the first step went, in seconds by phase (STARTUP_PHASES, in order), this rank's; and the
    # rank whose first step came last, with its phases
    startup: Optional[dict] = None
    slowest_rank: Optional[int] = None
    slowest_startup: Optional[dict] = None
    # work background threads did during start-up, in seconds, beside the phases (not in their sum):
    # {"dataset": 41.0, "compile": 14.2} when the first batch and the step's compilation overlapped other work
    startup_beside: Optional[dict] = None
    # training start -> first step finished: parameters, the wait for the compiled step, the first step
    fit_to_first_step_s: Optional[float] = None

    @property
    def bound(self) -> Optional[str]:
        """ "data-bound", "input-heavy" or "compute-bound" (None: too few steps to tell)."""
        if self.input_share is None:
            return None
        if self.input_share >= DATA_BOUND_SHARE:
            return "data-bound"
        return "input-heavy" if self.input_share >= COMPUTE_BOUND_SHARE else "compute-bound"

    def as_json(self) -> dict:
        return {"schema": SCHEMA, **dataclasses.asdict(self), "bound": self.bound}


# The start-up profile's phases, in the order start-up passes them; together they are the time from process start
# to the first step's end (the main thread's; work overlapped beside it is reported apart, under "beside").
STARTUP_PHASES = (
    ("imports", "Python, JAX, TensorFlow and Octo imported"),
    ("checks", "flags parsed; configuration, data and weights checked"),
    ("distributed", "launcher detection, coordinator, jax.distributed"),
    (
        "model_load",
        "the pretrained model read (what was left once the dataset's first batch was there)",
    ),
    ("dataset", "the dataset: statistics, the tf.data graph, the first batch (the wait for it)"),
    ("setup", "the rest of the job's set-up: model definition, optimizer, run directory, tracker"),
    ("parameters", "parameters initialised or restored, pretrained ones carried over"),
    ("compile", "the train step compiled (the wait for it)"),
    ("first_step", "the first step run and its metrics read"),
)


def startup_phases(
    process_started: float,
    marks: Sequence[Tuple[str, float]],
    first_step_end: Optional[float],
) -> dict:
    """Seconds per phase from the start-up clock's marks (``time.time()``; ``startclock``): the time before a mark
    goes to its phase, a phase marked twice adds up, so the phases add up to the time to the first step.

    ``startup_phases(100.0, [("imports", 102.0), ("checks", 102.5)], 110.0)``
    -> ``{"imports": 2.0, "checks": 0.5, "first_step": 7.5}``."""
    points = sorted(marks, key=lambda m: m[1])
    if first_step_end is not None:
        points = [m for m in points if m[1] <= first_step_end] + [("first_step", first_step_end)]
    out: dict = {}
    last = process_started
    for name, at in points:
        out[name] = out.get(name, 0.0) + max(0.0, at - last)
        last = max(last, at)
    order = [name for name, _ in STARTUP_PHASES]
    rank = {name: i for i, name in enumerate(order)}
    return {name: out[name] for name in sorted(out, key=lambda n: rank.get(n, len(order)))}


def summarize(
    *,
    command: str,
    processes: int,
    devices: int,
    global_batch: int,
    start_step: int,
    end_step: int,
    losses: Mapping[int, float],
    process_started: float,
    fit_started: float,
    step_ends: Sequence[float],
    ended: float,
    stopped_by: Optional[str] = None,
    params_digests: Optional[Sequence[str]] = None,
    input_s: Optional[Mapping[int, float]] = None,
    startup: Optional[Mapping[str, float]] = None,
    startup_by_rank: Optional[Sequence[Mapping[str, float]]] = None,
    startup_beside: Optional[Mapping[str, float]] = None,
) -> RunSummary:
    """The figures from timestamps in seconds on one clock (``time.time()``), e.g. ``step_ends=[17.9, 17.93, ...]``."""
    ends = list(step_ends)
    steady = [b - a for a, b in zip(ends[1:], ends[2:])]  # from the third step on
    median = statistics.median(steady) if steady else None
    ordered = [losses[k] for k in sorted(losses)]
    # input_s by step, from the third step of this job on (the steps `steady` measures)
    inputs = [v for k, v in sorted((input_s or {}).items()) if k >= start_step + 2]
    median_input = statistics.median(inputs) if inputs and median else None
    totals = [sum(p.values()) for p in startup_by_rank or []]
    slowest = max(range(len(totals)), key=totals.__getitem__) if totals else None
    return RunSummary(
        command=command,
        processes=processes,
        devices=devices,
        global_batch=global_batch,
        start_step=start_step,
        end_step=end_step,
        wall_s=ended - process_started,
        time_to_first_step_s=ends[0] - process_started if ends else None,
        compile_s=startup.get("compile") if startup else None,
        median_step_s=median,
        examples_per_s=global_batch / median if median else None,
        loss_first=ordered[0] if ordered else None,
        loss_last=ordered[-1] if ordered else None,
        stopped_by=stopped_by,
        params_digests=list(params_digests) if params_digests is not None else None,
        median_input_s=median_input,
        input_share=median_input / median if median_input is not None else None,
        startup=dict(startup) if startup else None,
        slowest_rank=slowest,
        slowest_startup=dict(startup_by_rank[slowest]) if slowest is not None else None,
        startup_beside=dict(startup_beside) if startup_beside else None,
        fit_to_first_step_s=ends[0] - fit_started if ends else None,
    )


def _seconds(value: Optional[float], unit: str = "s") -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if unit == "ms" else f"{value:.1f} s"


def lines(s: RunSummary) -> str:
    """The lines for the log (see the module docstring): start-up and input lines where they were measured."""
    loss = (
        f"loss {s.loss_first:.4f} -> {s.loss_last:.4f}"
        if s.loss_first is not None
        else "no steps run"
    )
    rate = f"{s.examples_per_s:.0f} examples/s" if s.examples_per_s else "- examples/s"
    # One compile time (compile_s: the start-up profile's phase, the wait for the step's compilation); without a
    # profile, the time from the start of training to the first step's end, which also holds the parameters'
    # initialisation and the first step, and is named so.
    if s.compile_s is not None:
        compiled = f"compile {_seconds(s.compile_s)}"
    else:
        compiled = f"training start to first step {_seconds(s.fit_to_first_step_s)}"
    text = (
        f"octo-dist {s.command}: run summary: wall {_seconds(s.wall_s)}, first step after "
        f"{_seconds(s.time_to_first_step_s)} ({compiled}), median step "
        f"{_seconds(s.median_step_s, 'ms')},\n  {rate} (global batch {s.global_batch}), {loss} over steps "
        f"{s.start_step} -> {s.end_step}" + (f", stopped by {s.stopped_by}" if s.stopped_by else "")
    )
    if s.startup:
        text += "\n  start-up: " + ", ".join(
            f"{name.replace('_', ' ')} {_seconds(seconds)}" for name, seconds in s.startup.items()
        )
        if s.startup_beside:
            text += "; beside: " + ", ".join(
                f"{name.replace('_', ' ')} {_seconds(seconds)}"
                for name, seconds in s.startup_beside.items()
            )
        if s.slowest_rank not in (None, 0) and s.slowest_startup:
            text += f" (slowest: rank {s.slowest_rank}, first step after {_seconds(sum(s.slowest_startup.values()))})"
    if s.bound is not None:
        text += f"\n  input {_seconds(s.median_input_s, 'ms')} of each step ({s.input_share:.0%}): {s.bound}"
        if s.bound == "data-bound":
            text += (
                ": the host makes batches about as slowly as the devices use them; "
                "give each rank more CPU cores (octo-dist launch --cpus-per-rank)"
            )
        elif s.bound == "input-heavy":
            text += (
                f": the devices still set the pace, but making the next batch takes {s.input_share:.0%} of "
                f"each step; at {DATA_BOUND_SHARE:.0%} they would wait for it (more CPU cores per rank: "
                "octo-dist launch --cpus-per-rank)"
            )
    return text


def history(
    previous: Optional[Mapping], s: RunSummary, losses: Mapping[int, float]
) -> Tuple[list, dict]:
    """The run's jobs and losses after this job: ``previous`` is the summary.json an earlier job left (or None).

    A job that resumed (``start_step > 0``) continues the run: the earlier jobs' losses before its first step are
    kept, its own replace any from its first step on (a job that resumed from an older checkpoint redoes those
    steps). A job that starts at step 0, or a summary of another command, begins a new history.
    """
    this_job = {k: v for k, v in s.as_json().items() if k not in ("schema", "params_digests")}
    own = {int(k): v for k, v in losses.items()}
    if not previous or s.start_step == 0 or previous.get("command") != s.command:
        return [this_job], own
    jobs = previous.get("jobs")
    if not isinstance(jobs, list):  # a schema-1 summary: the one job it describes
        jobs = [{k: v for k, v in previous.items() if k in this_job}]
    kept = {int(k): v for k, v in (previous.get("losses") or {}).items() if int(k) < s.start_step}
    return [*jobs, *unrecorded(jobs, s.start_step), this_job], {**kept, **own}


def unrecorded(jobs: Sequence[Mapping], start_step: int) -> list:
    """A marked gap where a job between the last recorded one and this one trained and checkpointed but wrote no
    summary (killed by the scheduler, its node lost): last recorded end 100, this job's start 300 ->
    ``[{"start_step": 100, "end_step": 300, "unrecorded": "..."}]``; nothing when they meet."""
    last_end = jobs[-1].get("end_step") if jobs and isinstance(jobs[-1], Mapping) else None
    if not isinstance(last_end, int) or start_step <= last_end:
        return []
    return [
        {
            "start_step": last_end,
            "end_step": start_step,
            "unrecorded": "a job ended without its summary (killed, or its node lost): these steps were "
            "trained and checkpointed, their losses are not recorded",
        }
    ]


def read_previous(path: Path) -> Optional[dict]:
    """The summary.json an earlier job wrote, or None when there is none or it cannot be read (a new history).

    Only a regular file of at most SUMMARY_MAX_BYTES, not through a link: a FIFO planted at the name would block the
    open (so O_NONBLOCK), a link to ``/dev/zero`` would be read without end."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # none, a link (ELOOP), unreadable
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(SUMMARY_MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= SUMMARY_MAX_BYTES else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def replace_file(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> Path:
    """``path`` made whole by ``write(f)`` on a new file beside it, then renamed over it: a reader never sees half a
    file, and whatever was planted at the name (a link to someone's file, a link to ``/dev/zero``) is replaced,
    never written through. The new file is created with O_EXCL under a name no one could know in advance
    (``mkstemp``), so a link planted at a fixed temporary name is not followed either."""
    final = Path(path)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600; the run's other files follow the umask
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return final


def _umask(status: str = "/proc/self/status") -> int:
    """This process's umask, read where it does not change it ("Umask:\t0022"): ``os.umask`` sets it to read it,
    and another thread creating a file meanwhile would get that one; 0o022 where the kernel does not say."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write(
    layout: savelayout.RunLayout, s: RunSummary, losses: Mapping[int, float], with_plot: bool = True
) -> Tuple[Path, Path]:
    """The run's ``layout.summary`` and ``layout.loss_plot``: this job's figures, the run's history across resumed
    and chained jobs (``jobs``, and ``losses`` by step) and its whole loss curve; returns both paths. ``with_plot``
    False: summary.json only (a job stopped by a signal; the next job draws the whole curve).

    Each file is written beside its name and renamed over it (:func:`replace_file`): never through a link."""
    Path(layout.run_dir).mkdir(parents=True, exist_ok=True)
    jobs, run_losses = history(read_previous(Path(layout.summary)), s, losses)
    text = json.dumps(
        {
            **s.as_json(),
            "losses": {str(k): v for k, v in sorted(run_losses.items())},
            "jobs": jobs,
        },
        indent=1,
    )
    json_path = replace_file(layout.summary, lambda f: f.write(text.encode()))
    if not with_plot:
        return json_path, Path(layout.loss_plot)
    png_path = replace_file(
        layout.loss_plot,
        lambda f: plot(
            run_losses,
            f,
            f"octo-dist {s.command}: {s.processes} process(es), {s.devices} device(s), "
            f"global batch {s.global_batch}",
            job_starts=[j["start_step"] for j in jobs[1:] if "unrecorded" not in j],
            gaps=[(j["start_step"], j["end_step"]) for j in jobs if "unrecorded" in j],
        ),
    )
    return json_path, png_path


def smoothed(values: Sequence[float], span: int) -> list:
    """An exponential moving average over ``span`` points (alpha 2 / (span + 1)), started at the first value."""
    alpha, out = 2.0 / (span + 1), []
    for v in values:
        out.append(v if not out else out[-1] + alpha * (v - out[-1]))
    return out


def plot(
    losses: Mapping[int, float],
    path: Union[Path, IO[bytes]],
    title: str,
    job_starts: Sequence[int] = (),
    gaps: Sequence[Tuple[int, int]] = (),
) -> None:
    """The loss by step as a PNG of PLOT_SIZE_PX, drawn without a display (matplotlib's Agg backend).

    Each job after the first is marked where it started; over SMOOTH_FROM_STEPS steps the raw losses are faint and
    a smoothed line is drawn over them; losses spanning LOG_SCALE_SPAN or more get a logarithmic axis."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PLOT_SIZE_PX[0] / PLOT_DPI, PLOT_SIZE_PX[1] / PLOT_DPI), dpi=PLOT_DPI)
    ax = fig.add_subplot()
    steps = sorted(losses)
    values = [losses[k] for k in steps]
    if len(steps) >= SMOOTH_FROM_STEPS:
        ax.plot(steps, values, color="C0", alpha=0.25, linewidth=0.8, label="loss")
        span = max(10, len(steps) // 50)
        ax.plot(
            steps, smoothed(values, span), color="C0", label=f"smoothed (EMA over {span} steps)"
        )
        ax.legend(loc="lower left")
    else:
        ax.plot(steps, values, color="C0", marker="." if len(steps) < 50 else None)
    positive = [v for v in values if v > 0]
    if values and len(positive) == len(values) and max(values) >= LOG_SCALE_SPAN * min(values):
        ax.set_yscale("log")
    for i, start in enumerate(job_starts, 2):
        ax.axvline(start, color="0.5", linestyle="--", linewidth=0.8)
        ax.annotate(
            f"job {i}",
            (start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=8,
            color="0.35",
        )
    for start, end in gaps:  # a job that left no summary: steps trained, losses not recorded
        ax.axvspan(start, end, color="0.85", label="not recorded (a job ended without its summary)")
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=PLOT_DPI, format="png")
