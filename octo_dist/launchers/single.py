"""Nothing detected: one process (an interactive run)."""

from __future__ import annotations

from typing import Mapping

from octo_dist.launchers.base import Launch


def detect(environ: Mapping[str, str]) -> Launch:
    return Launch(launcher="single", world_size=1, rank=0, local_rank=0, local_size=1)
