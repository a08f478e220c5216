"""octo-dist job-runtime -o FILE: the job runtime (the supervisor a job script hands over to: this package's job
side and its schedulers) as one zipapp file, for a host that has only the image.

    octo-dist job-runtime -o octo-dist-runtime.pyz
    python3 octo-dist-runtime.pyz supervise SETTINGS      # runs a job rendered by octo-dist launch; nothing else needed

The rendered script of an image job writes it from the image by itself (singularity exec IMAGE octo-dist job-runtime
-o FILE), so the supervisor is always the image's own version; OCTO_DIST_RUNTIME=FILE makes it use this one.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from octo_dist import subcommand
from octo_dist.jobs.filereplace import existing_kind, replacing

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding octo_dist/
# What the runtime imports, and nothing else (each is standard library only).
MODULES = (
    "octo_dist/__init__.py",
    "octo_dist/problems.py",
    "octo_dist/savelayout.py",
    "octo_dist/jobs/__init__.py",
    "octo_dist/jobs/settings.py",
    "octo_dist/jobs/settingsread.py",
)
PACKAGES = ("octo_dist/jobs/supervisor", "octo_dist/jobs/schedulers")
HELP = "write the job runtime (the supervisor a job script hands over to) as one zipapp file"
# Written so that any Python 3 parses it: an older one gets one line, not a SyntaxError from the modules it imports.
MAIN = """import sys
if sys.version_info < (3, 9):
    sys.stderr.write("octo-dist job runtime: error: Python %d.%d (%s); expected Python 3.9 or newer. Fix: put a "
                     "newer python3 on PATH before the job runs it (ABCI: module load python/3.12)\\n"
                     % (sys.version_info[0], sys.version_info[1], sys.executable))
    sys.exit(2)
from octo_dist.jobs.supervisor.__main__ import main
sys.exit(main())
"""


def files() -> list:
    """The zipapp's members as paths relative to ``PACKAGE_ROOT``, sorted."""
    out = list(MODULES)
    for package in PACKAGES:
        out += sorted(
            str(p.relative_to(PACKAGE_ROOT)) for p in (PACKAGE_ROOT / package).glob("*.py")
        )
    return out


class NotAFile(Exception):
    """``-o`` names something that is not a regular file (``/dev/null``, a FIFO, a directory, a link)."""


def build(path: str) -> str:
    """Writes the zipapp to ``path`` (atomically: jobs of a chain may write it at once); returns ``path``.

    Only a regular file is replaced: the rename would put a file in place of ``/dev/null`` or a FIFO."""
    kind = existing_kind(path)
    if kind not in ("", "file"):
        raise NotAFile(kind)
    with replacing(path, 0o755, binary=True) as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            for name in files():
                z.write(PACKAGE_ROOT / name, name)
            z.writestr("__main__.py", MAIN)
    return path


def add_parser(subparsers) -> None:
    p = subcommand.parser(subparsers, "job-runtime", HELP, __doc__, _run)
    p.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the file to write (required)"
    )


def _run(args) -> int:
    replaced = existing_kind(args.output) == "file"
    try:
        build(args.output)
    except NotAFile as e:
        print(
            f"octo-dist job-runtime: error: {args.output!r} is a {e}, not a file; expected a new file name or a "
            f"regular file to replace. Fix: -o a file name, e.g. -o octo-dist-runtime.pyz",
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        print(
            f"octo-dist job-runtime: error: cannot write {args.output!r} ({e.strerror}); expected a file you can "
            "write. Fix: -o a path in a directory you own",
            file=sys.stderr,
        )
        return 2
    said = "replaced the existing file" if replaced else "wrote"
    print(f"{said} {args.output}: run by a job script as python3 {args.output} supervise SETTINGS")
    return 0
