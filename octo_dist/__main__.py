import sys

# Any Python 3 parses these lines: an older one gets one line, not a SyntaxError from the modules below.
if sys.version_info < (3, 9):
    sys.stderr.write(
        "octo-dist: error: Python %d.%d (%s); expected Python 3.9 or newer. Fix: run it with a newer python3 "
        "(ABCI login nodes: /usr/bin/python3 is 3.9, or module load python/3.12)\n"
        % (sys.version_info[0], sys.version_info[1], sys.executable)
    )
    sys.exit(2)

from octo_dist.cli import main  # noqa: E402

sys.exit(main())
