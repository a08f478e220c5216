"""One check's verdict."""

from __future__ import annotations

import dataclasses

OK, WARN, FAIL = "ok", "warn", "fail"


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
