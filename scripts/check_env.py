#!/usr/bin/env python3
"""Same as `octo-dist check-env`; runs from a checkout without installing octo-dist."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octo_dist.envcheck.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
