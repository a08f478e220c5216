"""What every launcher reports."""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional


class LauncherError(ValueError):
    """The launcher's variables are missing or contradict each other."""


@dataclasses.dataclass(frozen=True)
class Launch:
    launcher: str
    world_size: int
    rank: int
    local_rank: int
    local_size: int
    job_id: Optional[str] = None

    def __post_init__(self):
        if not (0 <= self.rank < self.world_size) or not (0 <= self.local_rank < max(self.local_size, 1)):
            raise LauncherError(
                f"{self.launcher}: rank {self.rank}/{self.world_size}, local rank {self.local_rank}/{self.local_size} "
                f"are inconsistent; expected 0 <= rank < world size and 0 <= local rank < local size"
            )


def int_var(environ: Mapping[str, str], name: str, launcher: str) -> int:
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise LauncherError(f"{launcher}: {name}={raw!r} is not an integer") from None


def first(environ: Mapping[str, str], *names: str) -> Optional[str]:
    for n in names:
        if environ.get(n):
            return n
    return None
