"""One check's verdict."""

from __future__ import annotations

import dataclasses

from octo_dist.problems import Problem

# SKIP: a check that cannot run here (no GPU, no cuobjdump); its ``found`` says why. It never fails a report.
OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclasses.dataclass(frozen=True)
class Check:
    """``Check("cudnn.version", FAIL, "9.1.1.17", "8.x with minor >= 6", "pip install ...")``."""

    id: str
    status: str
    found: str
    expected: str
    remedy: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_problem(cls, id: str, problem: Problem, status: str = FAIL) -> "Check":
        """A check that met ``problem`` (an error raised while checking): its found / expected / fix, unchanged."""
        return cls(id, status, problem.found, problem.expected, problem.fix)

    def problem(self) -> Problem:
        """This verdict as a :class:`Problem` (exit 1: the environment fails the check), for a caller that stops."""
        return Problem(f"{self.id}: {self.found}", self.expected, self.remedy)
