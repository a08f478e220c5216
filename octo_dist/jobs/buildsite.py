"""Where ``make sif`` may build: a compute node, not a login node of a batch cluster.

An image build unpacks and compiles for many minutes on every core it finds. ABCI 3.0's system-overview: "if you
run a high-load task on the interactive node, the system will forcibly terminate it"; its containers page builds
images inside an interactive job (``qsub -I -P GROUP -q rt_HC -l select=1 ...``). So ``make sif`` on a host that
has a PBS client (``/etc/pbs.conf``, or ``qsub`` on PATH) but is in no PBS job (no ``PBS_JOBID``) refuses, with the
command that gets a compute node. A laptop or a CI runner, with no PBS client, builds as before.

Pure over a Mapping of the environment and the host facts; ``python3 -m octo_dist.jobs.buildsite`` is the one
line the Makefile's sif recipe runs (standard library only: the login node's Python 3.9 runs it).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from typing import Mapping, Optional

from octo_dist.jobs.schedulers.pbs import Pbs
from octo_dist.problems import Refusal

# Set in every PBS job ("12345.pbs1"): a shell inside one is on a compute node. The PBS scheduler's own name for it.
JOB_VAR = Pbs.job_id_var
# Builds here anyway, where a site allows heavy work on its login nodes.
OVERRIDE_VAR = "OCTO_DIST_SIF_ON_LOGIN_NODE"
PBS_CONF = "/etc/pbs.conf"
# ABCI 3.0's resource type for CPU work such as an image build (its containers page builds in one).
BUILD_RESOURCE_TYPE = "rt_HC"


def build_command(group: str, profile: str, checkout: str) -> str:
    """The interactive job that builds the image on a compute node, as ABCI's containers page does it."""
    return (
        f"qsub -I -P {group} -q {BUILD_RESOURCE_TYPE} -l select=1 -l walltime=2:00:00, then in that shell: "
        f"cd {checkout} && make sif PROFILE={profile}"
    )


def login_node_refusal(
    env: Mapping[str, str], pbs_client: bool, hostname: str, profile: str, checkout: str
) -> Optional[Refusal]:
    """A Refusal (exit 2) when ``make sif`` runs on a batch cluster's login node: a PBS client here
    (``pbs_client``) and no PBS job (``env`` without PBS_JOBID); None in a job, without PBS, or with
    OCTO_DIST_SIF_ON_LOGIN_NODE=1.

    ``{"USER": "u"}``, True, "login1" -> Problem("make sif on login1, a login node (a PBS client here, no
    PBS job: PBS_JOBID is unset)", ...)."""
    if env.get(JOB_VAR) or not pbs_client or env.get(OVERRIDE_VAR) == "1":
        return None
    group = env.get("OCTO_DIST_GROUP") or "GROUP"
    return Refusal(
        f"make sif on {hostname or 'this host'}, a login node (a PBS client here, and no PBS job: "
        f"{JOB_VAR} is unset)",
        "a compute node: an image build is a high-load task, and ABCI's system-overview says the system "
        '"will forcibly terminate" one on the interactive node',
        f"{build_command(group, profile, checkout)} (GROUP: your ABCI group, e.g. gxx00000); or "
        f"{OVERRIDE_VAR}=1 make sif where your site allows builds on its login nodes",
    )


# The profiles make sif builds (singularity.def: cuda11; singularity-cuda12.def: cuda12).
SIF_PROFILES = ("cuda12", "cuda11")


def profile_refusal(given: str, origin: str) -> Optional[Refusal]:
    """``make sif PROFILE=cpu`` (or a typo, ``PROFILE=cuda13``) built the cuda12 image without a word: a PROFILE
    given on the command line or in the environment (make's ``$(origin PROFILE)``) must be a sif profile. The
    Makefile's own default (``cpu``, for the venv) means the default image, cuda12."""
    if origin == "file" or origin == "undefined" or given in SIF_PROFILES:
        return None
    return Refusal(
        f"make sif PROFILE={given}",
        f"a profile make sif builds an image of: {', '.join(SIF_PROFILES)} (the cpu profile is the venv's and "
        "Docker's, not a Singularity image's)",
        "make sif PROFILE=cuda12 (H200, ABCI 3.0), or make sif PROFILE=cuda11",
    )


def main(argv=None) -> int:
    """``python3 -m octo_dist.jobs.buildsite SIF_PROFILE [PROFILE ORIGIN]``: exit 2 with one line for a PROFILE that
    is no sif profile or on a login node, else 0."""
    argv = sys.argv[1:] if argv is None else argv
    profile = argv[0] if argv else "cuda12"
    wrong = profile_refusal(argv[1], argv[2]) if len(argv) >= 3 else None
    if wrong is not None:
        print(f"make sif: error: {wrong}", file=sys.stderr)
        return wrong.exit_status
    env = os.environ
    pbs_client = os.path.exists(PBS_CONF) or bool(shutil.which("qsub", path=env.get("PATH", "")))
    problem = login_node_refusal(env, pbs_client, socket.gethostname(), profile, os.getcwd())
    if problem is None:
        return 0
    print(f"make sif: error: {problem}", file=sys.stderr)
    return problem.exit_status


if __name__ == "__main__":
    sys.exit(main())
