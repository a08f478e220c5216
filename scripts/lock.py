#!/usr/bin/env python3
"""`make lock`: regenerate env/locks/ from env/stack.toml (needs PyPI and uv)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from octo_dist.stack.lockgen import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
