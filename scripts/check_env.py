#!/usr/bin/env python3
"""Same as `octo-dist check-env`; runs from a checkout without installing octo-dist.

It checks the Python that runs it (a hand-built conda env, the venv): that Python needs `packaging`, which every
environment pip made has, to compare versions; a bare interpreter without it gets one line, not a traceback.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octo_dist.envcheck.cli import main  # noqa: E402


def run() -> int:
    try:
        return main()
    except ModuleNotFoundError as e:
        if e.name != "packaging":
            raise
        print(
            f"check_env.py: error: {sys.executable} (Python {sys.version.split()[0]}) has no 'packaging' "
            f"module; expected the Python of the environment to check (a venv or conda env holds it). Fix: run "
            f"it with that environment's python (.venv/bin/python scripts/check_env.py), or: {sys.executable} "
            f"-m pip install packaging",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(run())
