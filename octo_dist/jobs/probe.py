"""``octo-dist probe``: a <= 10-minute PBS job that settles what no document says about the site.

One ``rt_HG`` node (with ``--nodes 2``, an ``rt_HF`` pair that also runs ``octo-dist validate`` across the nodes)
runs one command per fact of the first-job checklist, each writing its output and exit status under
``SAVE_DIR/raw.XXXXXX`` (a new one per job); then, inside the image, ``python -m octo_dist.apps.probe.write``
turns them into ``SAVE_DIR/probe.json`` and ``probe.txt``, naming each fact that contradicts what ``launch``
assumes with its fix. ``launch`` reads that report later (``probesite``). Standard library only: this runs on
the login node.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import NamedTuple, Optional, Tuple

from octo_dist import EXIT_USAGE
from octo_dist.jobs import jobrecord, probesite
from octo_dist.jobs.cli import write_script
from octo_dist.jobs import submit as submit_mod
from octo_dist.jobs.schedulers import pbs
from octo_dist.launchers import outside
from octo_dist.problems import Refusal

NAME = "octo-dist-probe"
WALLTIME = "00:10:00"
SCRIPT = "probe.sh"
DEFAULT_IMAGE = "octo-dist-cuda12.sif"  # make sif's file for the H200 nodes
QUEUES = {1: "rt_HG", 2: "rt_HF"}  # one shared node is the cheapest; a pair needs whole nodes
VERSION_TIMEOUT_S = 30  # singularity --version answers at once
# The directory holding this octo_dist package (the checkout on ABCI, PYTHONPATH=$PWD): the report's writer needs
# only the standard library, so the node's Python runs it from here where the image cannot.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ProbeSettings(NamedTuple):
    group: str
    nodes: int
    save_dir: str  # absolute: the job starts in $HOME, not where it was submitted
    image: Optional[str]  # absolute; None with a venv
    venv: Optional[str]
    modules: tuple
    connect: str


def _run_in(s: ProbeSettings) -> str:
    """The words that run a command in the image (or the venv): the job's octo-dist, as launch's jobs run it."""
    if s.image:
        # bash before 4.4 calls an empty array unbound under set -u: ${BIND[@]+...}
        return f'singularity exec --nv ${{BIND[@]+"${{BIND[@]}}"}} {shlex.quote(s.image)}'
    return f'env PATH={shlex.quote(os.path.join(s.venv or "", "bin"))}:"$PATH"'


def render(s: ProbeSettings, login: Tuple[str, int]) -> str:
    """The probe's job script: a PBS header, then one ``fact FILE COMMAND...`` line per fact. ``login``: what
    ``singularity --version`` said on this (login) node and its exit status, written into the script."""
    q = shlex.quote
    queue = QUEUES[s.nodes]
    run = _run_in(s)
    place = "#PBS -l place=scatter\n" if s.nodes > 1 else ""
    modules = "".join(f"fact module-{i}.txt module load {q(m)}\n" for i, m in enumerate(s.modules))
    validate = (
        f'fact validate.txt mpirun -np {s.nodes} -hostfile "$PBS_NODEFILE" --map-by ppr:1:node {run} '
        "octo-dist validate\n"
        if s.nodes > 1
        else ""
    )
    return f"""#!/bin/bash
#PBS -P {s.group}
#PBS -q {queue}
#PBS -l select={s.nodes}:mpiprocs=1
{place}#PBS -l walltime={WALLTIME}
#PBS -N {NAME}
#PBS -j oe
#PBS -k oe
# octo-dist job for PBS: the site probe (octo-dist probe --nodes {s.nodes}); report: {s.save_dir}/{probesite.TEXT}
set -u
mkdir -p {q(s.save_dir)} && RAW=$(mktemp -d {q(os.path.join(s.save_dir, "raw.XXXXXX"))}) && cd "$RAW" || exit 1
# each fact: the command's output in FILE, its exit status in FILE.rc; a missing command is a fact too
fact() {{ local file=$1; shift; "$@" > "$file" 2>&1; echo $? > "$file.rc"; }}
# `module` is the site profile's shell function, as in launch's jobs
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then . /etc/profile.d/modules.sh; fi
# singularity --version on the login node, at submit
printf '%s\\n' {q(login[0].strip())} > singularity-login.txt; echo {int(login[1])} > singularity-login.txt.rc
{modules}env | grep -E '^(CUDA_VISIBLE_DEVICES|PBS_[A-Z_]+|OMPI_MCA_[a-z_]+)=' > env.txt
fact nvidia-smi.csv nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader
fact nvidia-smi.txt nvidia-smi
fact cgroup.txt cat /proc/self/cgroup
fact host-infiniband.txt ls -l /dev/infiniband
# PBS's own qstat (pbs.conf's PBS_EXEC), else the first on PATH
QSTAT=$( (. "${{PBS_CONF_FILE:-/etc/pbs.conf}}" 2>/dev/null; [ -x "${{PBS_EXEC:-/nowhere}}/bin/qstat" ] &&
  echo "$PBS_EXEC/bin/qstat") || command -v qstat || echo qstat)
# -F json where this PBS has it, else its text (the report reads both)
fact qstat-queue.json sh -c '"$0" -Qf -F json "$1" || "$0" -Qf "$1"' "$QSTAT" "$PBS_QUEUE"
fact qstat-job.json sh -c '"$0" -f -F json "$1" || "$0" -f "$1"' "$QSTAT" "$PBS_JOBID"
fact ompi-info.txt ompi_info --parsable --all
fact singularity-compute.txt singularity --version
fact quota.txt show_quota -b G  # in GiB: its default, whole TiB, reads a 500 GiB quota as 0
BIND=(--bind {q(s.save_dir)})  # the report's directory, wherever it is (/groups is not bound by default)
[ -d {pbs.IB_DEVICES} ] && BIND+=(--bind {pbs.IB_DEVICES})  # as launch's jobs bind it
fact image-infiniband.txt {run} ls -l /dev/infiniband
fact check-env.json {run} octo-dist check-env --deep --json
WRITE=(-m octo_dist.apps.probe.write {q(s.save_dir)} --raw "$RAW" --nodes {s.nodes} --connect {q(s.connect)})
# the report, from the image; where it does not start, from this checkout on the node's own Python (3.9 will do)
{validate}{run} python "${{WRITE[@]}}" || PYTHONPATH={q(CHECKOUT)} python3 "${{WRITE[@]}}"
"""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "probe",
        help="submit a 10-minute PBS job that reports what the site is (before the first real job)",
        description="Render and submit a <= 10-minute PBS job (rt_HG; --nodes 2: an rt_HF pair running "
        "octo-dist validate across them) that writes SAVE_DIR/probe.txt and probe.json: driver and CUDA, the "
        "GPUs the job sees and how they are isolated, /dev/infiniband inside the image, the queue's kill_delay, "
        "the job's place and exec_vnode, how mpirun starts remote ranks, SingularityCE on the login and compute "
        "nodes, check-env --deep in the image, the group quota and outbound 443. Each fact that contradicts "
        "what launch assumes is named with its fix; launch then warns where the site differs.",
    )
    p.add_argument("--group", "-P", required=True, help="ABCI group, qsub -P (required)")
    p.add_argument(
        "--nodes",
        type=int,
        choices=sorted(QUEUES),
        default=1,
        help="1: one GPU of a shared rt_HG node; 2: two rt_HF nodes and validate across them "
        "(default: 1)",
    )
    p.add_argument(
        "--image", help=f"the image to probe (default: {DEFAULT_IMAGE} here, as make sif wrote it)"
    )
    p.add_argument("--venv", help="probe a venv instead of an image (where the site runs one)")
    p.add_argument(
        "--module",
        action="append",
        dest="modules",
        help="module loaded first, repeatable (default: hpcx/2.20; '' for none)",
    )
    p.add_argument(
        "--save-dir",
        default=probesite.DEFAULT_SAVE_DIR,
        help="where the report is written (default: %(default)s; launch reads it there)",
    )
    p.add_argument(
        "--connect",
        default="huggingface.co:443",
        metavar="HOST:PORT",
        help="outbound TCP connection tried from the node, reported (default: %(default)s)",
    )
    p.add_argument(
        "-o", "--output", default=SCRIPT, help="the job script written (default: %(default)s)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")
    p.set_defaults(func=run)
    return p


class ProbeError(Refusal, ValueError):
    """A probe that cannot be rendered or submitted as asked."""


def settings(args: argparse.Namespace, cwd: str) -> ProbeSettings:
    if args.image and args.venv:
        raise ProbeError(
            "--image with --venv", "one of them", "drop --venv (ABCI's jobs run from the image)"
        )
    host, _, port = args.connect.rpartition(":")
    if not host or not port.isdigit():
        raise ProbeError(f"--connect {args.connect!r}", "HOST:PORT", "--connect huggingface.co:443")
    image = None if args.venv else os.path.join(cwd, args.image or DEFAULT_IMAGE)
    if image and not os.path.isfile(image) and not args.dry_run:  # --dry-run only shows the script
        raise ProbeError(
            f"no image {image}",
            "the image the jobs will run from",
            "make sif (in an rt_HC job, see README), or --image FILE.sif",
        )
    modules = tuple(
        m for m in (args.modules if args.modules is not None else pbs.Pbs.default_modules) if m
    )
    return ProbeSettings(
        args.group,
        args.nodes,
        os.path.join(cwd, args.save_dir),
        image,
        os.path.join(cwd, args.venv) if args.venv else None,
        modules,
        args.connect,
    )


def login_singularity(run=outside.run_command) -> Tuple[str, int]:
    """What ``singularity --version`` says on this (login) node, and its exit status."""
    try:
        done = run(["singularity", "--version"], VERSION_TIMEOUT_S)
        text, rc = done.stdout + done.stderr, done.returncode
    except FileNotFoundError:
        text, rc = "singularity: command not found", 127
    except outside.CommandTimeout:
        text, rc = f"no answer in {VERSION_TIMEOUT_S} s", 124
    return text, rc


def run(args: argparse.Namespace) -> int:
    cwd = os.getcwd()
    try:
        s = settings(args, cwd)
    except ProbeError as e:
        print(f"octo-dist probe: error: {e}", file=sys.stderr)
        return e.exit_status
    text = render(s, login_singularity())
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    try:
        write_script(
            args.output, text
        )  # a new file takes the name: a link there is never written through
    except OSError as e:
        print(
            f"octo-dist probe: error: cannot write {args.output!r} ({e.strerror}); expected a file you can write. "
            "Fix: -o a path in a directory you own",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        jobs = submit_mod.submit("pbs", args.output, name=NAME, group=s.group)
    except submit_mod.SubmitError as e:
        print(f"octo-dist probe: error: {e}", file=sys.stderr)
        return e.exit_status
    # The probe's script carries no job settings for submit to find its save directory in: recorded here, so that
    # `octo-dist jobs --save-dir` knows the job.
    jobrecord.record("pbs", args.output, args.save_dir, cwd, [(j.job_id, j.log) for j in jobs])
    report = os.path.join(args.save_dir, probesite.TEXT)
    print(
        f"submitted probe job {jobs[0].job_id}: log {jobs[0].log}; report {report} "
        f"when it ends (octo-dist jobs --save-dir {args.save_dir})"
    )
    return 0
