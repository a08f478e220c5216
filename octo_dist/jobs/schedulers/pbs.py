"""PBS Professional, as on ABCI 3.0: ``select=N:mpiprocs=R``, the node list in ``PBS_NODEFILE``, ``mpirun``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import List, Mapping, Optional, Sequence, Tuple

from octo_dist.jobs.schedulers.base import AFTER_ENV, Option, ResourceType, _resource_keys
from octo_dist.jobs.schedulers.mpirun import MpirunScheduler

# ABCI 3.0's H nodes: 8 NDR InfiniBand HCAs for compute (mlx5_ibn1..8) and one HDR HCA for storage. NCCL picks every
# HCA it finds unless told; the storage HCA is slower and shared with the file system.
ABCI3_NCCL = (
    (
        "NCCL_IB_HCA",
        ",".join(f"mlx5_ibn{i}" for i in range(1, 9)),
        "NCCL's all-reduce over the 8 compute HCAs, not the storage one",
    ),
)
# ABCI 3.0's resource types, with the limits its user guide gives for one Spot (batch) job of each
# (docs.abci.ai/v3/en/job-execution, "Job Execution Resource"): rt_HF 1 to 128 nodes, rt_HG one node (a share of
# a node: multi-node jobs need rt_HF), elapsed time at most 168:00:00. One table: a job asks for N nodes of one of
# these (#PBS -q rt_HF), and launch refuses what qsub would.
ABCI3_LIMITS = "ABCI 3.0's limits for a Spot (batch) job (docs.abci.ai/v3/en/job-execution)"
ABCI3_MAX_WALLTIME_S = 168 * 3600
RESOURCE_TYPES = {
    "rt_HF": ResourceType(
        8,
        2,
        96,
        "ABCI 3.0 full node, 8x H200, 96 cores",
        ABCI3_NCCL,
        max_nodes=128,
        max_walltime_s=ABCI3_MAX_WALLTIME_S,
        limits_source=ABCI3_LIMITS,
    ),
    "rt_HG": ResourceType(
        1,
        1,
        8,
        "ABCI 3.0 one H200 and 8 cores of a shared node, for a cheap test",
        ABCI3_NCCL,
        max_nodes=1,
        max_walltime_s=ABCI3_MAX_WALLTIME_S,
        limits_source=ABCI3_LIMITS,
        multi_node_fix="--resource-type rt_HF (whole nodes, 8 H200 each)",
    ),
}
# A qdel sends SIGTERM to every process of the job, then SIGKILL the queue's kill_delay later (PBS's default, when the
# queue sets none): the time a stop has to write its checkpoint.
DEFAULT_KILL_DELAY_S = 10
# Open MPI 4's mpirun, sent SIGTERM, kills its ranks this many seconds later (its default: 1): told the kill delay,
# the ranks keep the whole of it for their checkpoint. Open MPI 5 has no such setting (and ignores this one).
SIGKILL_TIMEOUT_MCA = "OMPI_MCA_odls_base_sigkill_timeout"
# An ABCI reservation's queue, as qrstat and the user portal list it: "R1234567" (PBS names a reservation's queue
# after its ID, without the server: "R1234567.pbs1" -> queue "R1234567").
RESERVATION = re.compile(r"R[0-9]{1,12}")
# ABCI: a job in a reservation queue names its resource type with -v RTYPE=rt_HF ("mandatory").
RTYPE_VAR = "RTYPE"
# The host's verbs device files (/dev/infiniband/uverbs0 ...), bound into the image for NCCL's InfiniBand.
IB_DEVICES = "/dev/infiniband"
# "mem=400gb", "ngpus=8": one PBS resource, KEY=VALUE.
RESOURCE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9_.,:/+@%-]+)")


class Pbs(MpirunScheduler):
    name = "pbs"
    title = "PBS Professional (as on ABCI 3.0)"
    help = "PBS Professional, as on ABCI 3.0 (rt_HF: 8x H200 per node)"
    description = (
        "Render a job script for PBS Professional, as on ABCI 3.0: #PBS -P GROUP -q rt_HF -l "
        "select=N:mpiprocs=R, live output (-k oe), mpirun from the hpcx module with one rank per GPU and its "
        "own CPU cores, NCCL on the compute InfiniBand HCAs, the node list from PBS_NODEFILE. Resource types: "
        "rt_HF (8x H200) and rt_HG (1x H200, for a cheap test). --resource KEY=VALUE adds a #PBS -l, "
        "--directive any other #PBS line."
    )
    options = (
        Option(
            "resources",
            "an extra PBS resource, #PBS -l KEY=VALUE, repeatable (default: none)",
            flag="--resource",
            metavar="KEY=VALUE",
            repeat=True,
            pattern=RESOURCE,
            pattern_says="KEY=VALUE, one PBS resource (e.g. mem=400gb)",
        ),
        Option(
            "reservation",
            "an ABCI reservation (Reserved service): the job goes to its queue, #PBS -q ID, with "
            "#PBS -v RTYPE=<resource type>; the 168-hour limit of a Spot job does not apply (default: none)",
            metavar="ID",
            pattern=RESERVATION,
            pattern_says="the reservation's ID as ABCI lists it, R and digits (e.g. R1234567)",
        ),
    )
    resource_types = RESOURCE_TYPES
    default_resource_type = "rt_HF"
    # Why a job here runs from the image (runfrom.default_image): no Python on ABCI builds the stack's venv
    runs_from_image = (
        "ABCI 3.0 has Python 3.9 (system), 3.12 and 3.13 (modules), none the stack's 3.10 or 3.11"
    )
    default_modules = ("hpcx/2.20",)  # the mpirun built for ABCI's InfiniBand
    group_help = "ABCI group, qsub -P (required)"
    group_required = "your ABCI group (qsub -P): ABCI 3.0 refuses a job without one"
    depend_help = "qsub -W depend=afterany:ID"
    rendered_keys = {
        "-l select": "--nodes/--ranks-per-node",
        "-l place": "--nodes (one chunk per node: place=scatter)",
        "-l walltime": "--walltime",
        "-q": "--resource-type, or --reservation",
        "-P": "--group",
        "-N": "--name",
        "-j": "nothing (octo-dist keeps one log)",
        "-k": "nothing (octo-dist keeps one log)",
        "-o": "nothing (octo-dist keeps one log)",
        "-e": "nothing (octo-dist keeps one log)",
    }
    refused_keys = {
        "-J": "an array job runs the script once per index, every one training into the same save directory",
        "-S": "the job script is bash; another shell cannot run it",
    }
    # -j oe -k oe: one output file, written while the job runs (in your home directory) rather than copied at its end.
    header = """\
#!/bin/bash
#PBS -P @{group}
#PBS -q @{queue}
#PBS -l select=@{nodes}:mpiprocs=@{ranks_per_node}
#PBS -l place=scatter
#PBS -l walltime=@{walltime}
#PBS -N @{name}
#PBS -j oe
#PBS -k oe
"""
    directive_prefix = "#PBS"
    job_id_var = "PBS_JOBID"
    stop_reaches_every_process = (
        True  # a job is its session: qdel SIGTERMs all of it, kill_delay, then SIGKILL
    )
    hostfile_var = "PBS_NODEFILE"
    workdir = (
        '"${PBS_O_WORKDIR:-$PWD}"'  # PBS starts the job in $HOME; PBS_O_WORKDIR is where qsub ran
    )
    # PBS signals every process of the job at the wall time, mpirun included (which then kills the ranks at once):
    # the supervisor asks for the stop itself, the stop margin before it.
    stop_timer = True
    job_id_re = re.compile(r"(\d+(?:\.[\w.-]+)?)")  # qsub prints "12345.pbs1"
    job_id_example = "12345.pbs1"

    def default_binds(self, group):
        # ABCI's group area, where shared weights, datasets and caches live: "/groups/gxx00000"; and the verbs
        # device files NCCL opens the HCAs through (bound where the node has them: without them NCCL uses TCP)
        return ((f"/groups/{group}",) if group else ()) + (IB_DEVICES,)

    def directive_keys(self, directive):
        # qsub reads a directive's words as its command line, with getopt: "-VJ 1-4" is -V then -J 1-4,
        # "-Vlselect=4" is -V then -l select=4. PBS resource names ignore case ("Walltime" is walltime).
        keys = []
        for letter, value in qsub_options(directive.split()[1:]):
            if letter == "l" and value is not None:
                keys += _resource_keys(["-l", value], lower=True)
            else:
                keys.append("-" + letter)
        return keys

    def site_refusal(self, values):
        reservation = values.get("reservation")
        if reservation is not None and not RESERVATION.fullmatch(reservation):
            # "1234567" or "R1234567.pbs1": the queue is R and the digits
            digits = re.sub(r"[^0-9]", "", reservation.split(".")[0])[:12] or "1234567"
            return (
                f"--reservation {reservation!r}",
                "the reservation's ID as ABCI lists it (qrstat): R and digits, the name of its queue",
                f"--reservation R{digits}",
            )
        found = super().site_refusal(values)
        if found:
            return found
        for resource in values.get("resources") or ():
            key = f"-l {RESOURCE.fullmatch(resource).group(1).lower()}"
            if key in self.rendered_keys:
                why = self.rendered_keys[key]
                return (
                    f"--resource {resource}",
                    f"a resource octo-dist does not set itself ({key[3:]} comes from {why})",
                    f"drop --resource {resource} and use {why}",
                )
        return None

    def header_values(self, header, settings):
        # A reservation's jobs go to its queue; the resource type travels as RTYPE (site_lines)
        return {"queue": header.site.get("reservation") or header.resource_type or ""}

    def site_lines(self, header, settings):
        # --reservation R1234567: "#PBS -v RTYPE=rt_HF" (read by qsub, and kept by --submit's -v); --resource
        # mem=400gb: "#PBS -l mem=400gb"
        rtype = (
            [f"#PBS -v {RTYPE_VAR}={header.resource_type}"]
            if header.site.get("reservation")
            else []
        )
        resources = [f"#PBS -l {r}" for r in header.site.get("resources") or ()]
        return rtype + resources + list(header.directives)

    def submit_command(self, script, after, environ=None):
        # PBS passes nothing of the submitting shell unless told (no -V: a login node's PATH and libraries would
        # follow), and a command line's -v replaces the script's "#PBS -v": one -v holds the script's list, the
        # forwarded variables the shell has (by name: qsub reads their values) and the chain's predecessor.
        from octo_dist.jobs.commands import FORWARD_NAMES, FORWARD_PREFIXES

        environ = os.environ if environ is None else environ
        listed = script_variables(script)
        named = {v.split("=", 1)[0] for v in listed} | {AFTER_ENV}
        shell = [
            n
            for n in sorted(environ)
            if (n.startswith(FORWARD_PREFIXES) or n in FORWARD_NAMES) and n not in named
        ]
        variables = listed + shell + ([f"{AFTER_ENV}={after}"] if after else [])
        extra = ["-W", f"depend=afterany:{after}"] if after else []
        return ["qsub", *extra, *(["-v", ",".join(variables)] if variables else []), script]

    def submit_hint(self, script, group):
        return f"qsub {script}"

    def launcher(self, settings, ctx):
        argv, exports = super().launcher(settings, ctx)
        delay, source = queue_kill_delay(ctx.env)
        exports[SIGKILL_TIMEOUT_MCA] = str(delay)
        ctx.note(
            f"a qdel gives this job {delay}s from SIGTERM to SIGKILL ({source}): a stop's checkpoint must be "
            "written within it; for longer steps or checkpoints, stop with the job's own timer (--stop-margin) "
            "or use a queue with a longer kill_delay"
        )
        return argv, exports

    def signalled_status(self, signal_name):
        if signal_name != "TERM":
            return ""
        # The job's login shell, the top of its session, dies of the qdel's SIGTERM: PBS records 256 + 15.
        return (
            "PBS will report Exit_status 271 for it (256 + SIGTERM: a qdel signals the job's login shell too), "
            "whatever the job did after the signal"
        )

    def log_path(self, name, job, submit_dir, home):
        # -k oe keeps it in your home as NAME.oNUMBER while the job runs
        return os.path.join(home, f"{name}.o{job.split('.')[0]}")


def script_variables(script: str) -> list:
    """The ``#PBS -v`` entries of a job script's header, as written: ``#PBS -v A=1,B`` -> ``["A=1", "B"]``; [] when
    it cannot be read (qsub then says so itself)."""
    out = []
    try:
        with open(script) as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return out
    for line in lines[1:]:
        if line and not line.startswith("#"):
            break  # qsub reads directives up to the first command
        words = line.split()
        if words[:1] == ["#PBS"]:
            for i, word in enumerate(words[1:], 1):
                if word == "-v" and i + 1 < len(words):
                    out += [v for v in words[i + 1].split(",") if v]
                elif word.startswith("-v") and len(word) > 2:
                    out += [v for v in word[2:].split(",") if v]
    return out


def kill_delay(qstat_json: str, queue: str) -> Tuple[int, str]:
    """(seconds from a qdel's SIGTERM to its SIGKILL, where that figure comes from), from ``qstat -Qf -F json
    QUEUE``'s output (``{"Queue": {"rt_HF": {"kill_delay": 60, ...}}}`` -> ``(60, "queue rt_HF's kill_delay")``).
    qstat lists kill_delay only where a queue sets it: otherwise PBS's default, 10 s."""
    try:
        attrs = json.loads(qstat_json)["Queue"][queue]
    except (ValueError, KeyError, TypeError):
        attrs = None
    if not isinstance(attrs, dict):
        return DEFAULT_KILL_DELAY_S, f"PBS's default: qstat did not describe queue {queue}"
    value = str(attrs.get("kill_delay", ""))
    # ASCII digits only: "²".isdigit() is True and int("²") raises
    if not re.fullmatch(r"[0-9]{1,9}", value):
        return DEFAULT_KILL_DELAY_S, f"PBS's default: queue {queue} sets no kill_delay"
    return int(value), f"queue {queue}'s kill_delay"


def pbs_exec(conf_text: str) -> str:
    """Where PBS is installed, from its ``pbs.conf`` ("PBS_EXEC=/opt/pbs" -> "/opt/pbs"); "" when not said."""
    for line in conf_text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "PBS_EXEC" and value.strip():
            return value.strip()
    return ""


def find_qstat(env: Mapping[str, str]) -> str:
    """PBS's own qstat: ``$PBS_EXEC/bin/qstat`` from the pbs.conf PBS reads (``PBS_CONF_FILE``, else
    /etc/pbs.conf), else the first on PATH; "" when none. A job's PATH may hold another scheduler's qstat first
    (Grid Engine's /usr/bin/qstat), or none."""
    try:
        with open(env.get("PBS_CONF_FILE") or "/etc/pbs.conf") as f:
            home = pbs_exec(f.read())
    except (OSError, UnicodeDecodeError):
        home = ""
    own = os.path.join(home, "bin", "qstat") if home else ""
    if own and os.access(own, os.X_OK):
        return own
    return shutil.which("qstat", path=env.get("PATH", "")) or ""


def queue_kill_delay(env: Mapping[str, str]) -> Tuple[int, str]:
    """``kill_delay`` for the job's queue (``PBS_QUEUE``: "rt_HF"), asking PBS's qstat; PBS's default, and why,
    when the queue or qstat cannot be had."""
    queue = env.get("PBS_QUEUE", "")
    qstat = find_qstat(env)
    if not queue or not qstat:
        missing = (
            "PBS_QUEUE is not set" if not queue else "no qstat found (pbs.conf's PBS_EXEC, PATH)"
        )
        return DEFAULT_KILL_DELAY_S, f"PBS's default: {missing}"
    try:
        done = subprocess.run(
            [qstat, "-Qf", "-F", "json", queue],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=dict(env),
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return DEFAULT_KILL_DELAY_S, f"PBS's default: {qstat} -Qf {queue} failed ({e})"
    if done.returncode != 0:
        said = " ".join(done.stderr.split())[:200] or f"exit {done.returncode}"
        return DEFAULT_KILL_DELAY_S, f"PBS's default: {qstat} -Qf {queue} failed ({said})"
    return kill_delay(done.stdout, queue)


# qsub's options without a value (PBS Professional 2022: -f -h -I -G -V -X -z); every other letter takes one,
# attached ("-Nname") or as the next word ("-N name").
QSUB_FLAGS = frozenset("fhIGVXz")


def qsub_options(words: Sequence[str]) -> List[Tuple[str, Optional[str]]]:
    """Options as qsub's getopt reads them: ``["-VJ", "1-4"]`` -> ``[("V", None), ("J", "1-4")]``,
    ``["-Vlselect=4:mpiprocs=1"]`` -> ``[("V", None), ("l", "select=4:mpiprocs=1")]``. A word that is not an
    option is passed over (a later option still counts); ``--`` ends the options; a letter whose value is missing
    at the end gets None."""
    out: List[Tuple[str, Optional[str]]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            continue
        for j, letter in enumerate(word[1:], 1):
            if letter in QSUB_FLAGS:
                out.append((letter, None))
                continue
            value: Optional[str] = word[j + 1 :]
            if not value:
                value = words[i] if i < len(words) else None
                i += 1
            out.append((letter, value))
            break
    return out
