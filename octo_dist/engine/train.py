"""The training loop every job shares (the smoke job, Octo fine-tuning): resume, steps, stop signals, checkpoints.

    layout = savelayout.RunLayout("/groups/gxx00000/runs/x")  # the run's files: checkpoints in layout.train_state
    result = train.fit(policy, optimizer, data, train.TrainConfig(steps=100, layout=layout), tracker=tracker)

Runs on every process after ``runtime.initialize``; the model only supplies ``init``/``loss`` (``policy.py``) and the
data only this process's slice (``data.py``). Checkpoints hold the state (params, optimizer state, base RNG, step)
and the data position, so a resumed run draws the same batches and dropout masks as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Optional

from octo_dist import savelayout
from octo_dist.engine import checkpoint
from octo_dist.runtime import ranklog
from octo_dist.runtime import startclock
from octo_dist.engine.checkpoint import CheckpointError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The engine's one input for a run, built the same way by both jobs before start-up (smoke's
    ``apps/smoke/app.train_config`` from its flags, finetune's ``apps/finetune/config.train_config`` from its
    config) and handed through the harness to :func:`fit` and the run summary."""

    steps: int
    seed: int = 0
    step_fn: str = "auto"  # shard_map over CPU devices, else jit (parallel.resolve_step_fn)
    # The run's files (savelayout's tree): checkpoints and the run's lock in layout.train_state. None: no
    # checkpoints (smoke without --save-dir, a fine-tune without a save_dir or with a URL's).
    layout: Optional[savelayout.RunLayout] = None
    save_every: int = 0  # steps between checkpoints; 0 = only at the end and on a stop signal
    # Where the run starts: checkpoint.decide(layout.train_state, --resume), made once before start-up; None: a
    # new run (decided in fit, refused when the layout's train_state already holds checkpoints).
    resume: Optional[checkpoint.Decision] = None
    max_to_keep: int = 3
    log_every: int = 1

    @property
    def train_state(self) -> Optional[str]:
        """Where the checkpoints and the lock go (``layout.train_state``), None without a layout."""
        return self.layout.train_state if self.layout else None


@dataclasses.dataclass
class FitResult:
    start_step: int
    end_step: int
    losses: dict  # step -> loss of the batch at that step (on every rank)
    stopped_by: Optional[str]  # "SIGTERM", "SIGUSR1", ... when a stop signal ended the run early
    params_digest: str  # parallel.tree_digest of this rank's parameters
    state: Any = None
    # step -> seconds the host spent making the next global batch while that step ran (reading, stacking,
    # starting the transfer): when it nears the step time, the device waits for input (data-bound).
    input_s: dict = dataclasses.field(default_factory=dict)


def check_resumable(meta: Mapping[str, Any], fingerprint: Mapping[str, Any], directory) -> None:
    """Refuse to continue a checkpoint made with another global batch, seed, model...: the losses would not match."""
    saved = meta.get("fingerprint", {})
    differ = {k: (saved.get(k), v) for k, v in fingerprint.items() if k in saved and saved[k] != v}
    if differ:
        found = ", ".join(f"{k}={old!r} (now {new!r})" for k, (old, new) in sorted(differ.items()))
        raise CheckpointError(
            f"{directory} was written with {found}; expected the same settings to resume. "
            f"Fix: rerun with those settings, or start anew in another save directory"
        )


def planned_saves(start: int, cfg: TrainConfig) -> int:
    """How many checkpoints a run from ``start`` writes: one every ``save_every`` steps before the end, and the last.

    ``planned_saves(0, TrainConfig(steps=10, save_every=3))`` -> 4 (steps 3, 6, 9 and 10)."""
    if start >= cfg.steps:
        return 0
    every = (
        [s for s in range(start + 1, cfg.steps) if s % cfg.save_every == 0]
        if cfg.save_every
        else []
    )
    return len(every) + 1


def fit(
    policy,
    optimizer,
    data,
    cfg: TrainConfig,
    *,
    tracker=None,
    params=None,
    fingerprint: Optional[Mapping[str, Any]] = None,
    on_step: Optional[Callable[[int, dict], None]] = None,
    stop=None,
    engine=None,
) -> FitResult:
    """Train ``cfg.steps`` steps in total (a resumed run does the remainder). Call on every process.

    ``stop``: a ``stopping.StopSignal`` the caller installed before start-up, so that a wall-time signal during
    start-up or compilation is honoured too (default: one installed here). ``engine``: a ``parallel.Engine`` for
    ``optimizer``, its step perhaps compiled already (a job that compiled it while its data loaded); default: one
    made here, its step compiled while the parameters are initialised or restored."""
    import jax

    from octo_dist.runtime import stopping
    from octo_dist.engine import parallel

    fingerprint = dict(fingerprint or {})
    decision, claim, ckpt = _open_save_dir(cfg)
    owned = stop is None
    stop = stop or stopping.StopSignal()
    try:
        start = decision.start
        eng = engine or parallel.Engine(
            parallel.make_mesh(), policy.loss, optimizer, step_fn=cfg.step_fn
        )
        state, first, batches = _ready(eng, policy, data, cfg, params, ckpt, decision, fingerprint)
        bar = ranklog.progress(
            range(start, cfg.steps),
            jax.process_index(),
            initial=start,
            total=cfg.steps,
            desc="train",
        )
        reader = _MetricsReader(cfg, bar, tracker, on_step)
        run = _Run(eng, ckpt, cfg, stop, reader, fingerprint)
        state, done, stopped_by = _train_steps(
            run, state, first, batches, bar, start, decision.step
        )
        return FitResult(
            start_step=start,
            end_step=done,
            losses=reader.losses,
            stopped_by=stopped_by,
            params_digest=parallel.tree_digest(state.params),
            state=state,
            input_s=reader.input_s,
        )
    finally:
        if owned:
            stop.close()
        ckpt.close()
        claim.release()


def _open_save_dir(cfg: TrainConfig):
    """Where the run starts, the claim on its save directory, and its checkpoints: ``(decision, claim, ckpt)``."""
    from octo_dist.engine import savedir

    # Before orbax touches the directory (it removes *-tmp-* directories when it opens one): every rank can write
    # there, and no other run holds it. Found now, not at the first save after hours of training.
    decision = cfg.resume if cfg.resume is not None else checkpoint.decide(cfg.train_state, False)
    claim = savedir.prepare(cfg.layout)
    try:
        ckpt = checkpoint.open_checkpoints(decision, cfg.max_to_keep)
    except BaseException:
        claim.release()
        raise
    if decision.directory and decision.step is None:
        log.info("no checkpoint in %s yet; starting at step 0", decision.directory)
    return decision, claim, ckpt


def _ready(eng, policy, data, cfg: TrainConfig, params, ckpt, decision, fingerprint):
    """Start-up's last parts, each timed: the dataset's first global batch, the parameters (fresh or restored,
    the disk's room checked for them), the step compiled. ``(state, first batch, the batches after it)``."""
    batches = data.batches(decision.start)
    # The first training batch is also the example the state is built (or the checkpoint template shaped) from.
    first = eng.global_batch(next(batches))
    startclock.done("dataset")
    state = _first_state(eng, policy, first, cfg, params, ckpt, decision.step, fingerprint)
    _check_room(cfg, ckpt, state, decision.start)
    startclock.done("parameters")
    if not eng.compiled:
        # Compiled here, on this thread, for the state and batch in hand (a job that knew the shapes earlier,
        # the fine-tune, compiled it beside its data loading). A compiler thread beside the parameters'
        # initialisation saved a smoke run nothing measurable (16.5 vs 16.4 CPU-s, the same wall time): the
        # tracing on both threads shares one Python lock. Kept simple here.
        eng.compile(state, first)
        startclock.done("compile")
    return state, first, batches


def _first_state(eng, policy, first, cfg: TrainConfig, params, ckpt, resume_from, fingerprint):
    """The state training starts from: fresh (``params`` carried in) or restored from step ``resume_from``."""
    from octo_dist.engine import parallel

    if resume_from is None:
        return eng.init_state(policy, first, cfg.seed, params)
    # The template (shapes, dtypes, replicated shardings) the checkpoint is read into, by shape only.
    template = eng.abstract_state(policy, first, cfg.seed, params)
    state, meta = ckpt.restore(resume_from, template)
    parallel.assert_replicated(state)
    check_resumable(meta, fingerprint, ckpt.directory)
    log.info(
        "resumed from %s: step %d of %d",
        checkpoint.step_path(ckpt.directory, resume_from),
        resume_from,
        cfg.steps,
    )
    return state


def _check_room(cfg: TrainConfig, ckpt, state, start: int) -> None:
    """Room for the checkpoints this run keeps plus the one being written, known now that the state's size is
    (before the step compiles); a resumed run's kept checkpoints are on disk already."""
    from octo_dist.engine import room, savedir

    kept_now = len(ckpt.kept_steps())
    savedir.check_space(
        cfg.train_state,
        room.state_nbytes(state),
        room.copies_needed(cfg.max_to_keep, planned_saves(start, cfg), kept_now),
        kept_now,
    )


class _MetricsReader:
    """Reads a dispatched step's metrics on the host (waiting for that step), logs them to the progress bar, the
    tracker and ``on_step``, and keeps the losses and the host's input times for the :class:`FitResult`."""

    def __init__(self, cfg: TrainConfig, bar, tracker, on_step):
        self.cfg, self.bar, self.tracker, self.on_step = cfg, bar, tracker, on_step
        self.losses: dict = {}
        self.input_s: dict = {}  # step -> the host's time making the next batch during that step
        self._tick = time.perf_counter()

    def __call__(self, step: int, metrics) -> int:
        """Fetch one step's metrics, log them; returns the agreed stop signal (0: none)."""
        from octo_dist.engine import parallel

        values = {k: float(v) for k, v in parallel.to_host(metrics).items()}
        agreed_signal = int(values.pop(parallel.STOP))
        self.losses[step] = values["loss"]
        now, self._tick = self._tick, time.perf_counter()
        # rank 0's tqdm bar or StepLines (the bare range elsewhere)
        if hasattr(self.bar, "set_postfix_str"):
            # The loss read lags the bar by a step (the host reads step k-1 after dispatching step k): say so.
            self.bar.set_postfix_str(f"loss {values['loss']:.4f} at step {step}", refresh=False)
        cfg = self.cfg
        if self.tracker is not None and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            # The fork's wandb layout ("training/loss", "timer/step_s"), so dashboards built for it line up;
            # "timer/input_s": the host's time making the next batch during this step.
            timers = {"timer/step_s": self._tick - now}
            if step in self.input_s:
                timers["timer/input_s"] = self.input_s[step]
            self.tracker.log({**{f"training/{k}": v for k, v in values.items()}, **timers}, step)
        if self.on_step is not None:
            self.on_step(step, values)
        return agreed_signal


class _Ahead:
    """Makes the global batch of a step on one worker thread, ready for the step: ``next(batches)``, its transfer,
    :meth:`parallel.Engine.prepare` (its augmentation, with the step's key). The batches are read in order, one
    at a time, each once the previous is in hand: the data position stays the steps dispatched."""

    def __init__(self, eng, state, batches, input_s: dict):
        import concurrent.futures

        from octo_dist.engine import parallel

        self.eng, self.batches, self.input_s = eng, batches, input_s
        # A copy of the base key: the state's own is donated to every step.
        self.rng = eng.replicate(parallel.to_host(state.rng))
        self.pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="octo-dist-next-batch"
        )

    def _make(self, step: int, batch=None):
        import numpy as np

        made = time.perf_counter()
        read = batch is None
        batch = self.eng.global_batch(next(self.batches)) if read else batch
        batch = self.eng.prepare(batch, self.rng, self.eng.replicate(np.int32(step)))
        if read:
            # step -> the host's time making the batch of the next step (keyed by the step it ran beside)
            self.input_s[step - 1] = time.perf_counter() - made
        return batch

    def submit(self, step: int, batch=None):
        """Batch ``step`` (``next(batches)``, or ``batch``: a global batch in hand), prepared: a future."""
        return self.pool.submit(self._make, step, batch)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@dataclasses.dataclass(frozen=True)
class _Run:
    """What every step of a run uses besides the state: its engine, checkpoints, settings, stop signal, metrics
    reader, and the fingerprint each checkpoint carries."""

    eng: Any
    ckpt: Any
    cfg: TrainConfig
    stop: Any
    read: _MetricsReader
    fingerprint: dict

    def save(self, step: int, state) -> None:
        self.ckpt.save(step, state, {"data_position": step, "fingerprint": self.fingerprint})


def _train_steps(run: _Run, state, first, batches, bar, start: int, last_saved: Optional[int]):
    """The steps from ``start``, checkpointed every ``cfg.save_every`` and at the end (or on an agreed stop
    signal): ``(state, the step reached, the stop signal's name or None)``."""
    # The device never waits for the host: step k is dispatched, and while it runs a worker thread makes global
    # batch k+1 (reading, stacking, starting its transfer, augmenting it on the device); only then are step
    # k-1's metrics read, whose values are long computed. The arithmetic is the same as reading every step at once; a
    # stop signal agreed in step k-1 ends the run after step k (every rank dispatched it), checkpointed there.
    cfg, stopped_by, done = run.cfg, None, start
    ahead = _Ahead(run.eng, state, batches, run.read.input_s)
    # on the worker too: the main thread's programs are the steps alone (bench/step_profile.py counts on it)
    upcoming = ahead.submit(start, first).result()
    unread = None  # (step, metrics) dispatched but not read yet
    try:
        for step in bar:
            # Batch step+1 is made (read, stacked, transferred, augmented) on a worker thread while step runs: on
            # a CPU the step's call returns only when it is computed (jax < 0.4.31), so made after it, the batch's
            # host work and augmentation would add to every step.
            coming = ahead.submit(step + 1) if step + 1 < cfg.steps else None
            state, metrics = run.eng.step(state, upcoming, run.stop.pending, prepared=True)
            done = step + 1
            upcoming = coming.result() if coming is not None else None
            agreed_signal = run.read(*unread) if unread is not None else 0
            unread = (step, metrics)
            if upcoming is None:
                # The last step: read now, inside the bar's last iteration, so the bar ends on the run's last loss.
                agreed_signal = run.read(*unread) or agreed_signal
                unread = None
            if agreed_signal:
                stopped_by = run.stop.name(agreed_signal)
                break
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                run.save(done, state)
                last_saved = done
    finally:
        ahead.close()
    stopped_by = _finish(run, state, done, unread, stopped_by, last_saved)
    return state, done, stopped_by


def _finish(
    run: _Run, state, done: int, unread, stopped_by: Optional[str], last_saved
) -> Optional[str]:
    """The run's end: the last dispatched step's metrics read (a stop signal agreed there counts), the last
    checkpoint written unless step ``done`` has one; the stop signal's name or None."""
    if unread is not None:
        agreed_signal = run.read(*unread)
        if agreed_signal and stopped_by is None:
            stopped_by = run.stop.name(agreed_signal)
    if stopped_by is not None:
        log.warning(
            "stopping after step %d on %s: saving a checkpoint, then exiting 0",
            done,
            stopped_by,
        )
    if run.cfg.layout and last_saved != done:
        run.save(done, state)
    return stopped_by
