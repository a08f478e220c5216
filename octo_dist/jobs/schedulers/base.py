"""What every scheduler answers: the ``Scheduler`` base class.

Two sides: the login node's (``header``, ``submit_command``, ``parse_job_id``, ``log_path``: used by ``render`` and
``submit``) and the job's first node's (``node_checks``, ``launcher``, ``node_probe``: used by the supervisor). The
job side reads only a ``Mapping`` of the job's environment, so tests pass dicts.
"""

from __future__ import annotations

import os
import re
from typing import List, Mapping, Optional, Sequence, Tuple

AFTER_ENV = "OCTO_DIST_AFTER"  # a chained job's predecessor: "12345.pbs1"


class Scheduler:
    """One scheduler. Subclasses set the class attributes and override what differs."""

    name = ""  # "pbs": the `octo-dist launch NAME` word
    title = ""  # "PBS Professional": for the script's comment
    header = ""  # the script's first lines, with @{placeholders} filled by render
    job_id_var = ""  # "PBS_JOBID": set in every job
    workdir = '"$PWD"'  # a bash expression: where the job's relative paths start (qsub's directory)
    launcher_program = "mpirun"  # checked on PATH after the modules are loaded
    stop_timer = True  # False where the scheduler itself signals the script ahead of the limit (SLURM's --signal)
    submit_program = "qsub"
    job_id_re = re.compile(
        r"(\d+)"
    )  # what the submit command prints, as a full match of its last line
    job_id_example = "12345"
    directive_prefix = (
        ""  # "#PBS": how a header line speaks to this scheduler (site lines go after the last one)
    )

    # ---- login node: rendering and submitting -------------------------------------------------------------------
    def header_values(self, spec) -> dict:
        """Extra ``@{name}`` values this scheduler's header uses (site lines, accounts), from a ``JobSpec``."""
        return {}

    def site_lines(self, spec) -> List[str]:
        """The site's header lines (``--partition``, ``--resource``...; checked by ``sitedirectives.refusal``),
        then the ``--directive`` lines as given."""
        return list(spec.directives)

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
    def job_id(self, env: Mapping[str, str]) -> str:
        """``env[job_id_var]``, or "0" outside a job (the checks then refuse)."""
        return env.get(self.job_id_var) or "0"

    def node_checks(
        self, env: Mapping[str, str], nodes: int, ranks_per_node: int, script_name: str
    ) -> Tuple[Optional[str], List[str]]:
        """(error or None, warnings) about the job's allocation, before anything starts."""
        return None, []

    def launcher(self, job) -> Tuple[List[str], dict]:
        """(argv before the rank's command, variables to export for it). ``job``: the supervisor's ``Job``."""
        raise NotImplementedError

    def node_probe(self, nodes: int) -> Optional[Sequence[str]]:
        """A command that fails naming a node the scheduler cannot reach, run now and then; None: no probe."""
        return None

    def lost_node(self, said: str) -> Optional[str]:
        """The node a failed probe names, from what it said; None when it names none."""
        return None
