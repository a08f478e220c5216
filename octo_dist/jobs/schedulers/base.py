"""What every scheduler answers: the ``Scheduler`` base class.

Two sides: the login node's (``header``, ``submit_command``, ``parse_job_id``, ``log_path``: used by ``render`` and
``submit``) and the job's first node's (``node_checks``, ``launcher``, ``node_probe``: used by the supervisor). The
job side reads a ``Mapping`` of the job's environment, and ``launcher`` the job's ``JobSettings`` and a frozen
``JobContext`` of what the runtime learned, so tests pass dicts and dataclasses, never a supervisor.

A subclass that sets ``name`` registers itself (``SCHEDULERS``) when its class is defined.
"""

from __future__ import annotations

import dataclasses
import os
import re
import unicodedata
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from octo_dist import savelayout

AFTER_ENV = "OCTO_DIST_AFTER"  # a chained job's predecessor: "12345.pbs1"

# A value that goes into a directive as one word: the scheduler reads it, never bash, but a space would split it.
WORD = re.compile(r"[A-Za-z0-9_.,:/=+@%-]+")
WORD_CHARS = "letters, digits and _.,:/=+@%-"


@dataclasses.dataclass(frozen=True)
class ResourceType:
    """What a job gets on one node when it asks for a site's resource type (ABCI 3.0's ``rt_HF``)."""

    gpus: int
    sockets: int  # CPU sockets of the node, for one block of ranks per socket
    cores: int  # CPU cores the job gets on one node
    about: str
    environment: Tuple[
        Tuple[str, str, str], ...
    ] = ()  # (name, value, why) exported, user's value wins
    # The site's own limits for one job of this type, refused at render in the site's words (0: none known).
    max_nodes: int = 0  # ABCI 3.0's rt_HF: 128 nodes a job; rt_HG: 1
    max_walltime_s: int = 0  # ABCI 3.0's Spot service: 168:00:00
    limits_source: str = (
        ""  # where the limits are written: "ABCI 3.0's job-execution page (Spot service)"
    )
    multi_node_fix: str = ""  # what to ask for instead above max_nodes: "--resource-type rt_HF"


@dataclasses.dataclass(frozen=True)
class Option:
    """A ``launch`` option only this scheduler has: ``--partition`` (SLURM), ``--pe`` (Grid Engine).

    ``name`` is its key in the job's site values and in the defaults files (``partition = gpu``); the value must
    fully match ``pattern`` (one word of a directive, ``pattern_says`` in words); ``repeat``: given once per value
    (``--resource A --resource B``), a tuple.
    """

    name: str
    help: str
    default: Any = None
    group: str = "site"
    flag: str = ""  # "--resource"; default "--" + name with "-" for "_"
    metavar: Optional[str] = None
    repeat: bool = False
    pattern: "re.Pattern[str]" = WORD
    pattern_says: str = f"one word of {WORD_CHARS} (it goes into a scheduler directive)"

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")


def unprintable(text: str) -> bool:
    """A control, format, separator or surrogate character: ends a directive line or hides text from a reader."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs") for c in text)


@dataclasses.dataclass(frozen=True)
class JobContext:
    """What the job runtime learned on the job's first node, handed to the scheduler's ``launcher`` beside the job's
    ``JobSettings``: facts of this run, never a copy of a setting."""

    env: Mapping[
        str, str
    ]  # the job's environment as exported so far: {"PBS_NODEFILE": "/var/spool/pbs/aux/1.pbs1"}
    job_id: str  # "12345.pbs1": read by the scheduler's module and checked (``Scheduler.job_id``)
    job_dir: str  # "/groups/gxx00000/runs/a/.octo-dist-job-12345.pbs1": the job's directory, every node sees it
    cores: int  # CPUs this node gives the job (the supervisor's affinity): 96
    note: Callable[[str], None]  # one line to the job's log ("octo-dist job: ...")


# Every scheduler defined, by name ("pbs"): each subclass that sets its own ``name`` registers itself when its class
# is defined, as JAX's ClusterEnv subclasses do; the package imports every module beside this one.
SCHEDULERS: Dict[str, "Scheduler"] = {}


class Scheduler:
    """One scheduler. Subclasses set the class attributes and override what differs; one that sets ``name`` is
    registered under it when it is defined (a shared base such as ``MpirunScheduler`` sets none)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            SCHEDULERS[cls.name] = cls()

    name = ""  # "pbs": the `octo-dist launch NAME` word
    title = ""  # "PBS Professional": for the script's comment
    help = ""  # one line for `octo-dist launch --help`
    description = ""  # the first paragraph of `octo-dist launch NAME --help`
    options: Tuple[Option, ...] = ()  # the launch options only this scheduler has
    # Resource types a job asks N nodes of (ABCI 3.0's rt_HF); none: --gpus-per-node is required.
    resource_types: Mapping[str, ResourceType] = {}
    default_resource_type: Optional[str] = None
    default_modules: Tuple[str, ...] = ()  # loaded unless --module says otherwise (ABCI: hpcx/2.20)
    # Why the site's jobs run from the image, not a venv ("" where a venv may be built): launch then takes the image
    # make sif wrote where it renders when neither --image nor --venv is given (jobs/runfrom.py).
    runs_from_image = ""
    image_modules: Tuple[str, ...] = ()  # and these with --image
    group_help = (
        "group to charge (default: the site's)"  # --group's help line in this scheduler's words
    )
    group_flags: Tuple[str, ...] = ()  # its own spelling of --group too: ("--account",)
    group_required = ""  # what a job without --group is refused for ("" when it may go without)
    depend_help = ""  # "qsub -W depend=afterany:ID": how a chained job waits, for --chain's help
    # The directives the rendered header always sets, by key (see ``directive_keys``) -> the option that sets it.
    rendered_keys: Mapping[str, str] = {}
    # Keys of ``rendered_keys`` in the header only when an option is given: key -> that option's name.
    conditional_keys: Mapping[str, str] = {}
    # Directives no job of octo-dist's may have, whoever renders the header: key -> why.
    refused_keys: Mapping[str, str] = {}
    header = ""  # the script's first lines, with @{placeholders} filled by render
    job_id_var = ""  # "PBS_JOBID": set in every job
    workdir = '"$PWD"'  # a bash expression: where the job's relative paths start (qsub's directory)
    launcher_program = "mpirun"  # checked on PATH after the modules are loaded
    stop_timer = True  # False where the scheduler itself signals the script ahead of the limit (SLURM's --signal)
    # True where the scheduler's stop (qdel, the wall time) sends SIGTERM to every process of the job at once, the
    # launcher included: the launcher then starts with SIGTERM blocked, so that mpirun (prterun kills its ranks 0.5 s
    # after a SIGTERM) leaves the ranks to agree the stop and save. Grid Engine's qdel sends SIGKILL after -notify's
    # SIGUSR2, which mpirun forwards; SLURM signals through srun.
    stop_reaches_every_process = False
    submit_program = "qsub"
    job_id_re = re.compile(
        r"(\d+)"
    )  # what the submit command prints, as a full match of its last line
    job_id_example = "12345"
    directive_prefix = (
        ""  # "#PBS": how a header line speaks to this scheduler (site lines go after the last one)
    )

    # ---- login node: choosing -----------------------------------------------------------------------------------
    def default_binds(self, group: Optional[str]) -> Tuple[str, ...]:
        """Directories every job binds into the image when the node has them (ABCI: the group area)."""
        return ()

    def site_refusal(self, values: Mapping[str, Any]) -> Optional[Tuple[str, str, str]]:
        """``(found, expected, fix)`` for the first of this scheduler's option values that must not reach the
        header (``values``: option name -> value; None or () when not given), else None."""
        for opt in self.options:
            value = values.get(opt.name)
            for v in (value if opt.repeat else (value,)) if value is not None else ():
                if unprintable(v) or not opt.pattern.fullmatch(v):
                    clean = re.sub(r"[^A-Za-z0-9_.=-]", "-", v).strip("-") or "NAME"
                    return (f"{opt.option} {v!r}", opt.pattern_says, f"{opt.option} {clean}")
        return None

    def directive_keys(self, directive: str) -> List[str]:
        """What a directive line sets, as keys of ``rendered_keys``: ``"#PBS -l walltime=1:00:00"`` ->
        ``["-l walltime"]``. The base reads words, ``-l`` lists (``-l a=1,b=2``) and options with their value
        attached (``-lselect=3``); schedulers with another grammar override it."""
        words = []
        for word in directive.split()[1:]:
            if re.fullmatch(r"-[A-Za-z].+", word) and not word.startswith("--"):
                words += [word[:2], word[2:]]
            else:
                words.append(word)
        return _resource_keys(words)

    # ---- login node: rendering and submitting -------------------------------------------------------------------
    # The render-time hooks take the job's two parts, as launch decided them: ``header`` (``jobs/spec.py``'s
    # ``JobHeader``: ``header.site`` {"partition": "gpu"}, ``header.group`` "gxx00000", ``header.directives``
    # ("#SBATCH --mail-type=END",), ``header.name``) and ``settings`` (``jobs/settings.py``'s ``JobSettings``:
    # ``settings.timing.walltime_s`` 3600, ``settings.allocation.cpus_per_rank`` 12). The run-time hook is
    # ``launcher(settings, ctx)``.
    def header_values(self, header, settings) -> dict:
        """Extra ``@{name}`` values this scheduler's header template uses (``{"pe": "mpi"}``), from the job's
        ``header`` (``JobHeader``) and ``settings`` (``JobSettings``)."""
        return {}

    def site_lines(self, header, settings) -> List[str]:
        """The site's header lines (``--partition``, ``--resource``...; checked by ``sitedirectives.refusal``),
        then the ``--directive`` lines as given: ``["#SBATCH --partition=gpu", "#SBATCH --mail-type=END"]``."""
        return list(header.directives)

    def submit_hint(self, script: str, group: Optional[str]) -> str:
        """How a user submits the written script by hand: ``qsub job.sh``."""
        return f"{self.submit_program} {script}"

    def submit_command(self, script: str, after: Optional[str]) -> List[str]:
        """The submission argv; ``after``: the job this one waits for (any end), passed on as ``OCTO_DIST_AFTER``."""
        raise NotImplementedError

    def parse_job_id(self, stdout: str) -> Optional[str]:
        """The job id in what the submit command printed (its last non-empty line), or None."""
        lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
        m = self.job_id_re.fullmatch(lines[-1]) if lines else None
        return m.group(1) if m else None

    def log_path(self, name: str, job: str, submit_dir: str, home: str) -> str:
        """Where the job's output lands (the header decides it)."""
        return os.path.join(submit_dir, f"{name}.o{job}")

    # ---- the job's first node: the supervisor -------------------------------------------------------------------
    def job_id(self, env: Mapping[str, str], by_hand: str = "0") -> str:
        """``env[job_id_var]``, or ``by_hand`` outside a job (the script run by hand: ``savelayout.hand_run_id``, its
        own for each run). It names files in the save directory: one that is not a job id ("1/../..") is
        ``savelayout.JobIdError``, one line naming the variable."""
        value = env.get(self.job_id_var)
        return savelayout.checked_job_id(self.job_id_var, value) if value else by_hand

    def node_checks(
        self, env: Mapping[str, str], nodes: int, ranks_per_node: int, script_name: str
    ) -> Tuple[Optional[str], List[str]]:
        """(error or None, warnings) about the job's allocation, before anything starts."""
        return None, []

    def launcher(self, settings, ctx: JobContext) -> Tuple[List[str], dict]:
        """(argv before the rank's command, variables to export for it), from the job's ``JobSettings``
        (``jobs/settings.py``: the allocation, what is forwarded) and what the runtime learned (``ctx``)."""
        raise NotImplementedError

    def signalled_status(self, signal_name: str) -> str:
        """What the scheduler reports for a job it signalled (``signal_name``: "TERM") that then stopped cleanly and
        exited 0, when that is not 0 ("PBS reports Exit_status 271 ..."); "" when it reports the job's own."""
        return ""

    def node_probe(self, nodes: int) -> Optional[Sequence[str]]:
        """A command that fails naming a node the scheduler cannot reach, run now and then; None: no probe."""
        return None

    def lost_node(self, said: str) -> Optional[str]:
        """The node a failed probe names, from what it said; None when it names none."""
        return None


def _resource_keys(words: Sequence[str], lower: bool = False) -> List[str]:
    """Option words -> keys, ``-l`` followed by ``a=1,b=2`` giving ``-l a`` and ``-l b`` (lowercased when the
    scheduler ignores the case of resource names)."""
    out = []
    for i, word in enumerate(words):
        if not word.startswith("-"):
            continue
        if word == "-l" and i + 1 < len(words):
            for r in words[i + 1].split(","):
                name = r.split("=", 1)[0]
                if name:
                    out.append(f"-l {name.lower() if lower else name}")
        else:
            out.append(word)
    return out
