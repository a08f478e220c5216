"""The validation report: one line per step, then the verdict (text for people, JSON for programs)."""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping, Optional, Sequence

from octo_dist.problems import Problem

OK, FAIL, SKIP = "ok", "fail", "skip"
_MARK = {OK: "ok  ", FAIL: "FAIL", SKIP: "skip"}


@dataclasses.dataclass(frozen=True)
class Step:
    """``Step("scaling", OK, "1 GPU 12.1 ms/step, 8 GPUs 13.0 ms/step: efficiency 0.93", ">= 0.60")``."""

    name: str
    status: str
    found: str
    expected: str = ""
    fix: str = ""
    data: Mapping = dataclasses.field(default_factory=dict)

    @classmethod
    def from_problem(cls, name: str, problem: Problem, status: str = FAIL) -> "Step":
        """A step that met ``problem`` (an error raised while validating): its found / expected / fix, unchanged."""
        return cls(name, status, problem.found, problem.expected, problem.fix)

    def problem(self) -> Problem:
        """This step's verdict as a :class:`Problem` (exit 1: the node fails validation)."""
        return Problem(f"{self.name}: {self.found}", self.expected, self.fix)


def exit_code(steps: Sequence[Step]) -> int:
    failed = [s for s in steps if s.status == FAIL]
    return failed[0].problem().exit_status if failed else 0


def as_text(header: str, steps: Sequence[Step]) -> str:
    width = max((len(s.name) for s in steps), default=0)
    lines = [header]
    for s in steps:
        lines.append(f"  {_MARK[s.status]}  {s.name:<{width}}  {s.found}")
        if s.status == FAIL:
            if s.expected:
                lines.append(f"        {'':<{width}}  expected: {s.expected}")
            if s.fix:
                lines.append(f"        {'':<{width}}  fix: {s.fix}")
    failed = [s.name for s in steps if s.status == FAIL]
    skipped = [s.name for s in steps if s.status == SKIP]
    verdict = f"FAILED: {', '.join(failed)}" if failed else "OK"
    lines.append(
        f"octo-dist validate: {verdict}"
        + (f" ({len(skipped)} skipped: {', '.join(skipped)})" if skipped else "")
    )
    return "\n".join(lines)


def as_dict(context: Mapping, steps: Sequence[Step]) -> dict:
    return {**context, "ok": exit_code(steps) == 0, "steps": [dataclasses.asdict(s) for s in steps]}


def write(path: Optional[str], context: Mapping, steps: Sequence[Step]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(as_dict(context, steps), f, indent=1)
