import sys

from octo_dist.cli import main

sys.exit(main())
