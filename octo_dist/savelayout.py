"""What lies in a save directory, and under which names: the one place that knows (``RunLayout``).

A job's ``--save-dir`` (``runs/ft``), as the job runtime, the ranks and the training program leave it. ``<run>`` is
the run's directory under it, ``RunLayout.run_path``: smoke's is the save directory itself (``""``), finetune's
``<wandb.project>/[<wandb.group>/]<name>`` (``octo_finetune/ft_256``). ``<state>`` holds the engine's checkpoints and
the run's lock, ``RunLayout.train_state``: smoke's is ``<run>`` itself, finetune's ``<run>/train_state``::

    runs/ft/                                RunLayout.save_dir
      .octo-dist-jobs.json                  jobs_record(save_dir): what octo-dist launch --submit submitted here
      .octo-dist-exit-12345.pbs1            exit_file(save_dir, job): job 12345.pbs1's exit status for the next job
                                            of a chain (jobs/supervisor/exitfile.py): "0", a status ("3": it does
                                            not train), "stopping SIGTERM: ..." (a stop cut short) or "143
                                            resumable: ..."
      .octo-dist-exit-12345.pbs1.<pid>.tmp  for a moment: the exit file being written
      .octo-dist-job-12345.pbs1/            job_dir(save_dir, job): while job 12345.pbs1 runs, removed at its end
        .octo-dist-job                      JOB_MARK: "12345.pbs1\\n", made by this job, checked before removal
        nodes                               NODE_LIST, node_list(job_dir_path): the scheduler's node list, where
                                            every node and the image see it (the mpirun schedulers)
        octo-dist-runtime.pyz               RUNTIME_COPY, runtime_copy(job_dir_path): the job runtime the other
                                            nodes' ranks start from (an image job's zipapp, copied)
        done/rank-<n>                       rank_note(job_dir_path, False, n): rank n exited 0
                                            ("rank 3 on g0002")
        failed/rank-<n>                     rank_note(job_dir_path, True, n): rank n failed
                                            ("rank 1 on g0001 exited ...")
        stopped                             stop_note(job_dir_path): rank 0 stopped for a signal, saved step
                                            1200 ("1200\\n")
      <run>/                                .run_dir
        finetune_config.json                .run_config: finetune's config as it ran (finetune only)
        wandb_run_id                        .run_id_file: the wandb run a resumed run continues (finetune only)
        summary.json                        .summary: the run's figures and its loss history across resumed jobs
        .summary.json.*.tmp                 for a moment: the summary being written (replaced whole)
        loss.png                            .loss_plot: the run's loss curve (where matplotlib is installed)
        <step>/                             Octo's save_pretrained (finetune only: with config.json and more)
        <state>/                            .train_state
          .octo-dist.lock                   lock_file(train_state): the run that uses it now (engine/savedir.py):
                                            host, pid, job id
          .octo-dist.lock.<host>.*.tmp      for a moment: the lock being taken (a random name: mkstemp's)
          .octo-dist.lock.stale.<h>.<pid>   stale_lock(train_state, host, pid), for a moment: a dead run's lock
                                            being taken over (engine/savedir.py)
          .octo-dist-probe.<host>.<pid>     write_probe(train_state, host, pid), for a moment at start: a rank's
                                            write probe (engine/savedir.py)
          <step>/                           .checkpoint(step), checkpoint_dir(train_state, step): an orbax
                                            checkpoint and its manifest (engine/checkpoint.py)
            checksums.json                  CHECKSUMS, checksums_file(step_dir), written last: .saved_steps()
                                            counts the step from then
          <step>.damaged/                   damaged_dir(step_dir): a checkpoint that failed verification, set aside
          <step>.orbax-checkpoint-tmp-*/    one being written (removed on restart when half-written)

Standard library only: the job runtime's zipapp carries it, and a login node's bare Python reads it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from typing import Iterable, Mapping, Optional

from octo_dist.problems import Refusal

LOCK = ".octo-dist.lock"
# In a checkpoint's directory: written last, once the step is complete; a resuming job verifies the step against
# it (engine/checkpoint.py's MANIFEST).
CHECKSUMS = "checksums.json"
# Entries read from one directory while looking for runs: a save directory holds a few runs, not millions.
SCAN_LIMIT = 4096
TRAIN_STATE = "train_state"  # finetune's <run>/train_state: the engine's checkpoints and the lock
RUN_CONFIG = "finetune_config.json"
RUN_ID = "wandb_run_id"
SUMMARY = "summary.json"  # apps/summary.py writes it, and LOSS_PLOT, into the run's directory
LOSS_PLOT = "loss.png"
JOBS_RECORD = ".octo-dist-jobs.json"  # what launch --submit submitted (jobs/jobrecord.py), read by the jobs too
JOB_DIR_PREFIX = ".octo-dist-job-"
EXIT_FILE_PREFIX = ".octo-dist-exit-"
NODE_LIST = "nodes"
RUNTIME_COPY = "octo-dist-runtime.pyz"
DONE = "done"
FAILED = "failed"
STOPPED = "stopped"
# A rank's note in done/ or failed/: "rank-3"; "rank-unknown" from a rank whose launcher named none.
RANK_NOTE = re.compile(r"rank-(.+)")
WRITE_PROBE = ".octo-dist-probe"  # + ".<host>.<pid>": a rank's write probe, for a moment at start
DAMAGED = (
    ".damaged"  # "10.damaged", "10.damaged.2": a checkpoint that failed verification, set aside
)
# The job's directory, absolute, as the rank guard passes it to the training program
# ("/groups/gxx00000/runs/a/.octo-dist-job-12345.pbs1"); unset outside a job, where nothing is noted.
JOB_DIR_ENV = "OCTO_DIST_JOB_DIR"


JOB_MARK = ".octo-dist-job"  # in a job's directory: the job id that made it ("12345.pbs1\n")

# A job id becomes part of a file name (the job's directory, its exit file): only the characters schedulers use.
# PBS "12345.pbs1" and array "123[4].pbs1", Grid Engine "9876543", SLURM "123456" and array "123_4", LSF "4242" and
# "4242[3]". Never "/", "..", NUL, a leading "." or "-" ("1/../.." would name the save directory's parent).
JOB_ID = re.compile(r"[A-Za-z0-9_\[\]][A-Za-z0-9_.\[\]-]*")
JOB_ID_MAX = 128  # PBS's longest is a few dozen characters; a file name may have 255 bytes
JOB_ID_SAYS = (
    f"a scheduler's job id: letters, digits and _.[]- (not first: . or -), no '..', at most {JOB_ID_MAX} "
    "characters, e.g. 12345.pbs1, 123[4].pbs1, 123456, 123_4"
)


# The job's id as the job runtime read it from its scheduler and checked, exported to every rank: "12345.pbs1". Every
# module but the scheduler's own reads this one (``job_id``).
JOB_ID_ENV = "OCTO_DIST_JOB_ID"
# Outside the job runtime (a user's own mpirun in a job script) no one exported it: the schedulers' own variables,
# first set wins, and what their jobs are called. The one list of them, for every layer (the launchers, envcheck and
# the engine may not import jobs/): each jobs/schedulers class names its own ``job_id_var``, and
# tests/test_job_identity.py keeps every scheduler shipped in this list.
SCHEDULER_JOB_ID_VARS = {
    "PBS_JOBID": "PBS",  # "12345.pbs1" (PBS Professional, ABCI 3.0)
    "SLURM_JOB_ID": "Slurm",  # "123456"
    "JOB_ID": "Grid Engine",  # "9876543" (a common name, so after Slurm's and only beside GRID_ENGINE_MARKERS)
    "LSB_JOBID": "LSF",  # "4242" (IBM LSF)
}
# Grid Engine's JOB_ID is a common name (a build script's JOB_ID='build 7'): it names a job only with Grid Engine's
# own variables beside it.
GRID_ENGINE_MARKERS = ("SGE_ROOT", "PE_HOSTFILE", "SGE_JOB_HOSTLIST", "SGE_TASK_ID", "NSLOTS")


class JobIdError(Refusal):
    """A job id that cannot be part of a file name: one line naming the variable and its value, exit 2."""


def checked_job_id(var: str, value: str) -> str:
    """``value`` of the variable ``var`` (``"PBS_JOBID"``, ``"12345.pbs1"``) when it is a job id that is safe as
    part of a file name, else ``JobIdError``. Every scheduler's job id goes through here before it names a path."""
    if not JOB_ID.fullmatch(value) or ".." in value or len(value) > JOB_ID_MAX:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise JobIdError(
            f"{var}={shown!r} is not a job id octo-dist can use in a file name",
            JOB_ID_SAYS,
            f"run the job script under its scheduler (qsub/sbatch), or unset {var} when running it by hand",
        )
    return value


def scheduler_job_var(
    environ: Mapping[str, str], among: Iterable[str] = tuple(SCHEDULER_JOB_ID_VARS)
) -> Optional[str]:
    """The first variable of ``among`` (the schedulers' own, in SCHEDULER_JOB_ID_VARS's order) that names a job in
    ``environ``: ``{"PBS_JOBID": "12345.pbs1"}`` -> ``"PBS_JOBID"``; ``{"JOB_ID": "7"}`` -> None (no Grid Engine
    variable beside it); None outside a job. Its value is not checked here (``checked_job_id`` does)."""
    for var in among:
        if environ.get(var) and (var != "JOB_ID" or any(m in environ for m in GRID_ENGINE_MARKERS)):
            return var
    return None


def hand_run_id(host: str, pid: int) -> str:
    """The id of a job script run by hand, outside any scheduler's job: ``("g0001.abci.local", 4242)`` ->
    ``"by-hand-g0001-4242"``. Its own for each run (a shared "0" let one hand-run job take and remove another's job
    directory in the same save directory), and a job id by ``JOB_ID``'s rule."""
    label = re.sub(r"[^A-Za-z0-9_-]", "_", host.split(".")[0])[:40] or "host"
    return f"by-hand-{label}-{int(pid)}"


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The job's id, checked (``checked_job_id``): ``OCTO_DIST_JOB_ID`` (the job runtime's), else the first of the
    schedulers' own variables that is set (``LSB_JOBID=4242`` -> ``"4242"``; ``JOB_ID`` only beside one of
    ``GRID_ENGINE_MARKERS``); None outside a job."""

    if environ.get(JOB_ID_ENV):
        return checked_job_id(JOB_ID_ENV, environ[JOB_ID_ENV])
    var = scheduler_job_var(environ)
    return checked_job_id(var, environ[var]) if var else None


def job_dir(save_dir: str, job: str) -> str:
    """``("runs/x", "12345.pbs1")`` -> ``"runs/x/.octo-dist-job-12345.pbs1"``: one job's notes and copies."""
    return os.path.join(save_dir, f"{JOB_DIR_PREFIX}{checked_job_id('the job id', job)}")


def make_job_dir(save_dir: str, job: str) -> str:
    """Makes the job's directory in ``save_dir`` and marks it as this job's (``JOB_MARK`` holds the id); returns
    its path. A directory of that name with this job's mark is taken again (a job the scheduler started again keeps
    its id); one without it is refused (``OSError``): it is not this job's to fill and remove."""
    path = job_dir(save_dir, job)
    mark = os.path.join(path, JOB_MARK)
    try:
        os.mkdir(path)
    except FileExistsError:
        if _mark_of(path) != job:
            raise FileExistsError(17, f"{path} exists and was not made by job {job}") from None
        return path
    try:
        with open(mark, "w") as f:
            f.write(f"{job}\n")
    except OSError:
        # A full disk: the directory just made, empty, goes again rather than stay unmarked.
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def _mark_of(path: str) -> Optional[str]:
    """The job id in ``path``'s mark, None when it has none (or ``path`` is a link, not a directory)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, JOB_MARK), "rb") as f:
            return f.read(JOB_ID_MAX + 2).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def remove_job_dir(save_dir: str, path: str, job: str) -> Optional[str]:
    """Removes the job's directory ``path`` when it is what ``make_job_dir(save_dir, job)`` made: the real path a
    direct child of ``save_dir``'s, named for ``job``, a directory (not a link) holding ``job``'s mark. None when
    removed (or never made), else why it was left alone: nothing outside a directory the job made is removed."""
    if not path or not os.path.lexists(path):
        return None
    real_save = os.path.realpath(save_dir)
    if (
        os.path.dirname(os.path.realpath(path)) != real_save
        or os.path.basename(path) != f"{JOB_DIR_PREFIX}{job}"
        or _mark_of(path) != job
    ):
        return (
            f"left {path} in place: it is not the directory job {job} made in {real_save} "
            f"(expected a directory {JOB_DIR_PREFIX}{job} there holding the mark {JOB_MARK})"
        )
    shutil.rmtree(path, ignore_errors=True)
    return None


def exit_file(save_dir: str, job: str) -> str:
    """``("runs/x", "12345.pbs1")`` -> ``"runs/x/.octo-dist-exit-12345.pbs1"``: that job's exit status."""
    return os.path.join(save_dir, f"{EXIT_FILE_PREFIX}{job}")


def jobs_record(save_dir: str) -> str:
    """``"runs/ft"`` -> ``"runs/ft/.octo-dist-jobs.json"``: what launch --submit submitted for this save directory."""
    return os.path.join(save_dir, JOBS_RECORD)


def submitted_save_dir(submit_dir: str, save_dir: str) -> str:
    """The save directory a job was submitted with, as the job sees it (it starts where qsub/sbatch ran):
    ``("/home/u/proj", "runs/ft")`` -> ``"/home/u/proj/runs/ft"``; an absolute ``save_dir`` is itself."""
    return os.path.join(submit_dir, save_dir)


def node_list(job_dir_path: str) -> str:
    """``".../.octo-dist-job-12345.pbs1"`` -> ``".../nodes"``: the scheduler's node list, where every node sees it."""
    return os.path.join(job_dir_path, NODE_LIST)


def runtime_copy(job_dir_path: str) -> str:
    """``".../.octo-dist-job-12345.pbs1/octo-dist-runtime.pyz"``: the job runtime the other nodes' ranks start from."""
    return os.path.join(job_dir_path, RUNTIME_COPY)


def rank_notes_dir(job_dir_path: str, failed: bool) -> str:
    """Where the ranks leave their notes in a job's directory: ``.../failed`` or ``.../done``."""
    return os.path.join(job_dir_path, FAILED if failed else DONE)


def rank_note(job_dir_path: str, failed: bool, rank: str) -> str:
    """Where rank ``rank`` leaves its note in a job's directory: ``.../failed/rank-1`` or ``.../done/rank-1``."""
    return os.path.join(rank_notes_dir(job_dir_path, failed), f"rank-{rank}")


def rank_notes(job_dir_path: str, failed: bool) -> dict:
    """The notes the ranks left in ``done/`` (or ``failed/``), by rank as the note names it: ``{"0":
    ".../done/rank-0", "unknown": ".../done/rank-unknown"}``; {} when there are none (or the directory cannot be
    read). Other names there are not notes."""
    found = (RANK_NOTE.fullmatch(name) for name in _names(rank_notes_dir(job_dir_path, failed)))
    return {m.group(1): rank_note(job_dir_path, failed, m.group(1)) for m in found if m}


def stop_note(job_dir_path: str) -> str:
    """Where rank 0 says which step it saved when a stop signal ended the training: ``.../stopped``."""
    return os.path.join(job_dir_path, STOPPED)


def stopped_step(job_dir_path: str) -> Optional[int]:
    """The step rank 0 saved when it stopped for a signal (``stopped`` holds "1200\\n" -> 1200); None when no rank
    stopped for one, or the note is not a step."""
    try:
        with open(stop_note(job_dir_path)) as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return (
        int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None
    )  # not "²", which isdigit() passes


def _names(directory: str, dirs_only: bool = False) -> list:
    """Names in ``directory`` (directories only, not links, when ``dirs_only``), at most ``SCAN_LIMIT``; [] when
    it cannot be read."""
    out = []
    try:
        with os.scandir(directory) as entries:
            for n, e in enumerate(entries):
                if n >= SCAN_LIMIT:
                    break
                if not dirs_only or e.is_dir(follow_symlinks=False):
                    out.append(e.name)
    except OSError:
        pass
    return out


def size_text(n: float) -> str:
    """``1181116006`` -> ``"1.1 GiB"``, bytes below 1 KiB as ``"512 B"``: how a save directory's room is spoken,
    before the job queues (``jobs/footprint.py``) and in the run (``engine/room.py``), so both say it alike."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def stale_lock(train_state: str, host: str, pid: int) -> str:
    """``(".../train_state", "g0001", 4242)`` -> ``".../train_state/.octo-dist.lock.stale.g0001.4242"``: where a run
    moves a dead run's lock while it checks that it is still the one it judged stale."""
    return os.path.join(train_state, f"{LOCK}.stale.{host}.{pid}")


def write_probe(directory: str, host: str, pid: int) -> str:
    """``("/runs/x", "g0001", 4242)`` -> ``"/runs/x/.octo-dist-probe.g0001.4242"``: the file a rank writes and
    removes at start to learn that it can write there (engine/savedir.py)."""
    return os.path.join(directory, f"{WRITE_PROBE}.{host}.{pid}")


def checkpoint_dir(train_state: str, step: int) -> str:
    """``("/runs/ft/.../train_state", 5)`` -> ``".../train_state/5"``: the orbax checkpoint of step 5."""
    return os.path.join(train_state, str(int(step)))


def checksums_file(step_dir: str) -> str:
    """``".../train_state/5"`` -> ``".../train_state/5/checksums.json"``: written last, once the step is whole."""
    return os.path.join(step_dir, CHECKSUMS)


def damaged_dir(step_dir: str, n: int = 1) -> str:
    """Where a checkpoint that failed verification is set aside: ``(".../5", 1)`` -> ``".../5.damaged"``, the
    ``n``-th of that step ``".../5.damaged.2"`` (out of orbax's sight: not a step's name)."""
    return f"{step_dir}{DAMAGED}" + (f".{n}" if n > 1 else "")


def lock_file(train_state: str) -> str:
    """``"/runs/ft/octo_finetune/ft_256/train_state"`` -> ``".../train_state/.octo-dist.lock"``: the run's lock,
    beside the checkpoints it guards (in ``RunLayout.train_state``; the engine's ``savedir.RunLock`` takes it there)."""
    return os.path.join(train_state, LOCK)


class _InRunDir:
    """A file of the run's directory, read as a layout's attribute: ``layout.summary`` ->
    ``"/groups/gxx00000/runs/ft/octo_finetune/ft_256/summary.json"`` (``os.path.join(layout.run_dir, SUMMARY)``)."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, layout, owner=None):
        return self if layout is None else os.path.join(layout.run_dir, self.name)


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """One run's files in its save directory (the module docstring's tree), built once by the training program
    (smoke, finetune) and handed to the engine, the summary and the jobs' readers::

        layout = RunLayout.finetune("/groups/gxx00000/runs/ft", "octo_finetune", None, "ft_256")
        layout.run_dir          # "/groups/gxx00000/runs/ft/octo_finetune/ft_256"
        layout.train_state      # "/groups/gxx00000/runs/ft/octo_finetune/ft_256/train_state"
        layout.summary          # ".../ft_256/summary.json"
        RunLayout("/groups/gxx00000/runs/smoke").train_state   # smoke: the save directory itself

    The job's own files (its directory, its exit status) are the save directory's, whatever run the training
    program makes under it: ``job_dir(save_dir, job)``, ``exit_file(save_dir, job)``.
    """

    # The job's --save-dir, absolute (or a URL): "/groups/gxx00000/runs/ft".
    save_dir: str
    # The run's directory under it: finetune "octo_finetune/ft_256"; smoke "" (the save directory itself).
    run_path: str = ""
    # The engine's checkpoints and the lock under the run's directory: finetune TRAIN_STATE; smoke "" (the run's).
    state_path: str = ""

    @property
    def run_dir(self) -> str:
        return os.path.join(self.save_dir, self.run_path) if self.run_path else self.save_dir

    @property
    def train_state(self) -> str:
        return os.path.join(self.run_dir, self.state_path) if self.state_path else self.run_dir

    # The run's own files, each one name in <run> (not fields: a class attribute without an annotation).
    run_config = _InRunDir(RUN_CONFIG)
    run_id_file = _InRunDir(RUN_ID)
    summary = _InRunDir(SUMMARY)
    loss_plot = _InRunDir(LOSS_PLOT)

    def checkpoint(self, step: int) -> str:
        """``5`` -> ``".../train_state/5"``: the orbax checkpoint of step 5."""
        return checkpoint_dir(self.train_state, step)

    def saved_steps(self) -> list:
        """The steps saved whole in ``train_state``, oldest first: directories named by ASCII digits ("1200", not
        "²" or "٣", which isdigit() passes) holding ``CHECKSUMS``; at most ``SCAN_LIMIT`` entries are read."""
        steps = []
        for name in _names(self.train_state):
            if re.fullmatch(r"[0-9]{1,18}", name) and os.path.isfile(
                checksums_file(os.path.join(self.train_state, name))
            ):
                steps.append(int(name))
        return sorted(steps)

    @classmethod
    def finetune(cls, save_dir: str, project: str, group: Optional[str], name: str) -> "RunLayout":
        """A fine-tune run's layout: ``<save_dir>/<project>/[<group>/]<name>``, its checkpoints in ``train_state``.
        ``("/runs/ft", "octo_finetune", None, "ft_256")`` -> run_dir ``"/runs/ft/octo_finetune/ft_256"``."""
        return cls(save_dir, os.path.join(project, *([group] if group else []), name), TRAIN_STATE)

    @classmethod
    def found_in(cls, save_dir: str) -> list:
        """The runs a training program left in ``save_dir``, as it laid them out: smoke's (the save directory
        itself, when it holds a step) and each finetune run, ``<project>/[<group>/]<name>/train_state``
        (``RunLayout.finetune``). Links are not followed; at most ``SCAN_LIMIT`` entries a directory."""
        found = [cls(save_dir)] if cls(save_dir).saved_steps() else []
        level = [""]
        for depth in (1, 2, 3):
            level = [
                os.path.join(parent, name)
                for parent in level
                for name in _names(os.path.join(save_dir, parent), dirs_only=True)
                if not name.startswith(".") and not name.isdigit()
            ]
            for run_path in level if depth >= 2 else ():
                if os.path.isdir(os.path.join(save_dir, run_path, TRAIN_STATE)):
                    found.append(cls(save_dir, run_path, TRAIN_STATE))
        return found
