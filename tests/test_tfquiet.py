"""The fine-tune's log without TensorFlow's AutoGraph fallback warning (``octo_dist.apps.finetune.tfquiet``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from helpers import HANG_S, PROGRAMS, REPO, clean_env, tail
from octo_dist.apps.finetune import tfquiet


def test_the_fallback_warning_is_dropped_and_the_pipeline_is_unchanged(tmp_path):
    pytest.importorskip("tensorflow")
    env = {**clean_env(), "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop(tfquiet.VERBOSITY_ENV, None)
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "autograph_fallback.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, tail(proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The input really meets the fallback: TensorFlow warns before the filter ...
    assert any(r.startswith(tfquiet.AUTOGRAPH_FALLBACK) for r in out["before"]["records"]), out
    # ... and not after it, while the function still runs as it is (the same values).
    assert out["installed"] is True
    assert not any(r.startswith(tfquiet.AUTOGRAPH_FALLBACK) for r in out["after"]["records"]), out
    assert out["before"]["values"] == out["after"]["values"] == [1, 2, 3]
    # What a user reads: the first map's warning on stderr, none for the second.
    assert proc.stderr.count(tfquiet.AUTOGRAPH_FALLBACK) == 1, tail(proc.stderr)


def test_other_tensorflow_records_pass_and_autograph_verbosity_keeps_the_warning():
    keep = tfquiet.DropAutographFallback()
    record = logging.LogRecord("tensorflow", logging.WARNING, __file__, 1, "%s", ("x",), None)
    assert keep.filter(record)
    record.msg = "AutoGraph could not transform %s and will run it as-is.\n"
    assert not keep.filter(record)
    logger = logging.getLogger("tensorflow")
    before = list(logger.filters)
    try:
        assert tfquiet.quiet_autograph({tfquiet.VERBOSITY_ENV: "3"}) is False
        assert logger.filters == before
    finally:
        logger.filters[:] = before
