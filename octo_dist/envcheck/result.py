"""One check's verdict."""

from __future__ import annotations

import dataclasses

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
