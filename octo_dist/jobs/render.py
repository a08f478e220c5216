"""``render(job) -> str``: a job script a reader audits in a minute.

The scheduler's header (its class in ``schedulers/``), a comment saying what runs, ``module load``, and one line
handing over to the job runtime (``supervisor/``, Python) with the job's settings as JSON. Everything that reacts to
signals, failures and time limits lives there, tested. The header's ``@{name}`` values are restricted to
``[A-Za-z0-9_.-]`` by ``spec.build``; every other value reaches bash only inside one single-quoted word
(``shlex.quote``).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import List

from octo_dist.jobs import imagefit, schedulers, sitedirectives
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.spec import Job
from octo_dist.jobs.walltime import format_walltime

PLACEHOLDER = re.compile(r"@\{(\w+)\}")
RUNTIME_ENV = "OCTO_DIST_RUNTIME"  # a zipapp from `octo-dist job-runtime -o FILE`: used instead of the image's
RUNTIME_FILE = (
    ".octo-dist-runtime.pyz"  # where an image job writes the image's runtime: the submit directory
)

# python3 -c: exit 0 only for a whole zip file (its central directory, written last, is there).
ZIP_CHECK = "python3 -c 'import sys, zipfile; sys.exit(not zipfile.is_zipfile(sys.argv[1]))' \"$RUNTIME\" 2>/dev/null"

BODY = """\
# shellcheck disable=SC2016,SC1003  # values below are single-quoted data: a '$' or '\\' in them stays as it is
# octo-dist job for @{title}: @{nodes} node(s) x @{ranks_per_node} rank(s), @{gpus_per_rank} GPU(s) per rank.
#   submit:    @{submit}
#   rendered:  @{command_line}
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
# After `module load`, octo-dist's job runtime (Python) checks the job, runs `octo-dist check-env --launch`, then
# "train" on every rank under @{launcher}. Any stop signal makes every rank checkpoint and stop@{timer}.
# A rank that fails or never finishes fails the job. Its settings are the JSON below.
set -eo pipefail
cd -- @{workdir}
# `module` is the site profile's shell function; none (a laptop, CI): the launcher on PATH is used.
# shellcheck source=/dev/null
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then . /etc/profile.d/modules.sh; fi
@{modules}@{handover}
"""


def train_argv(job: Job) -> List[str]:
    """The training command every rank runs: the program (from the venv's bin/ or the image's PATH), its flags, and
    the job's paths as ``@{save_dir}``, which the runtime makes absolute on the node."""
    return list(job.settings.commands.train)


def train_lines(job: Job) -> List[str]:
    """The training command as shell words, for reading (tests, messages)."""
    return [shlex.join(train_argv(job))]


def settings(job: Job, script_name: str) -> job_settings.JobSettings:
    """What the job runtime needs: the job's settings (``jobs/settings.py``), under the name the script is written
    as."""
    return dataclasses.replace(job.settings, script_name=script_name)


def substitute(template: str, values: dict) -> str:
    """``@{name}`` -> values[name]; a placeholder without a value is a bug here, not the user's."""
    missing = sorted(set(PLACEHOLDER.findall(template)) - set(values))
    if missing:
        raise KeyError(f"template placeholders without a value: {missing}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def _say(before: str, value: str, after: str = "") -> str:
    """A one-line message to stderr with ``value`` as data: single-quoted between the double-quoted text (inside
    double quotes a ``$(...)`` or backtick in it would run), printed by printf (echo may read its backslashes)."""
    quoted = "'" + value.replace("'", "'\"'\"'") + "'"  # always quoted: "A"'B'"C", never "A"B"C"
    return f"printf '%s\\n' \"{before}\"{quoted}" + (f'"{after}"' if after else "") + " >&2"


def _modules(job: Job) -> str:
    modules = job.settings.software.modules
    if not modules:
        return "# no modules to load (--module ''): the launcher and python3 on PATH are used\n"
    names = " ".join(map(shlex.quote, modules))
    said = _say("octo-dist job: no 'module' command here: not loading ", " ".join(modules))
    return f"if command -v module >/dev/null 2>&1; then module load {names}; else {said}; fi\n"


def _handover(job: Job, script_name: str) -> str:
    # Checked when the job was built (spec.build), by the code the runtime reads it back with.
    args = "supervise " + shlex.quote(settings(job, script_name).to_json())
    software = job.settings.software
    if not software.image:
        python = software.venv + "/bin/python"
        profile = imagefit.needed_profile(job.header.resource_type)
        said = _say(
            "octo-dist job: error: no ",
            python,
            # The profile these nodes' GPUs need: rt_HF's H200 (sm_90) -> cuda12, rt_F's V100 -> cuda11.
            f"; expected the octo-dist environment (make env PROFILE={profile}). "
            "Fix: build it, or re-render with --venv PATH or --image FILE.sif",
        )
        python = shlex.quote(python)
        return (
            f"[ -x {python} ] || {{ {said}; exit 2; }}\n"
            f"exec {python} -m octo_dist.jobs.supervisor {args}"
        )
    said = _say(
        "octo-dist job: error: image ",
        software.image,
        " not found from $PWD; expected the .sif this job was rendered for. Fix: copy it there, or re-render "
        "with --image PATH",
    )
    image = shlex.quote(software.image)
    # The runtime is the image's own, written beside the job (the submit directory, which singularity binds).
    return (
        f"[ -f {image} ] || {{ {said}; exit 2; }}\n"
        f"RUNTIME=${{{RUNTIME_ENV}:-$PWD/{RUNTIME_FILE}}}"
        "  # the job runtime: the image's (octo-dist job-runtime -o FILE)\n"
        f'[ -n "${{{RUNTIME_ENV}:-}}" ] || singularity exec {image} octo-dist job-runtime -o "$RUNTIME" >/dev/null\n'
        # An empty or cut-short file would run as nothing, and the job would "succeed" without training.
        f"{ZIP_CHECK} || {{ printf '%s\\n' \"octo-dist job: error: the job runtime $RUNTIME is not a complete "
        "zipapp (empty, or cut short); expected the file octo-dist job-runtime writes. Fix: unset "
        f'{RUNTIME_ENV}, or write it again (singularity exec IMAGE octo-dist job-runtime -o FILE)" >&2; exit 2; }}\n'
        f'exec python3 "$RUNTIME" {args}'
    )


def render(job: Job, script_name: str = "job.sh") -> str:
    """The job script for ``job``; ``script_name`` only appears in the submit hints."""
    header, alloc, timing = job.header, job.settings.allocation, job.settings.timing
    s = schedulers.get(alloc.scheduler)
    q = shlex.quote
    values = {
        "title": s.title,
        "group": header.group or "",
        "resource_type": header.resource_type or "",
        "nodes": alloc.nodes,
        "ranks_per_node": alloc.ranks_per_node,
        "gpus_per_node": header.gpus_per_node,
        "gpus_per_rank": header.devices_per_rank,
        "walltime": format_walltime(timing.walltime_s),
        "name": header.name,
        "slots": job.settings.ranks,
        "stop_margin_s": timing.stop_margin_s,
        "submit": s.submit_hint(q(script_name), header.group),
        "command_line": shlex.join(header.command_line) or "octo-dist launch",
        "launcher": s.launcher_program,
        "timer": f" (so does its timer,\n# {timing.stop_margin_s} s before the wall time)"
        if s.stop_timer
        else "",
        "workdir": s.workdir,
        "modules": _modules(job),
        "handover": _handover(job, script_name),
        **s.header_values(header, job.settings),
    }
    # The site's lines (--partition, --resource, --directive...) after the scheduler's own directives.
    header = sitedirectives.insert(
        substitute(s.header, values), s.site_lines(header, job.settings), s.directive_prefix
    )
    return header + substitute(BODY, values)
