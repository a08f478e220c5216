"""Run under mpirun by tests/test_savedir.py: start through octo_dist, check the save directory on every rank, and
write this rank's outcome to ``<out>/<rank>.json`` (never to a shared stdout).

usage: savedir_check.py SAVE_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

from octo_dist import savelayout
from octo_dist.runtime import runtime
from octo_dist.engine import savedir

save_dir, out_dir = sys.argv[1], Path(sys.argv[2])
with runtime.distributed(timeout_s=120) as rt:
    try:
        claim = savedir.prepare(savelayout.RunLayout(save_dir), state_bytes=1 << 20)
    except savedir.SaveDirError as e:
        outcome = {"rank": rt.process_index, "error": str(e)}
    else:
        outcome = {
            "rank": rt.process_index,
            "error": None,
            "locked": isinstance(claim, savedir.RunLock),
        }
        claim.release()
    (out_dir / f"{rt.process_index}.json").write_text(json.dumps(outcome))
