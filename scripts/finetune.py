#!/usr/bin/env python3
"""`octo-dist finetune` under the fork's script name, for commands written for the fork:

    mpirun -npernode $NUM_GPUS -hostfile $SGE_JOB_HOSTLIST python scripts/finetune.py \
        --config=finetune_config.py:head_only,multimodal --config.pretrained_path=weights/octo-small

It runs the installed octo-dist (make env installs the checkout in editable mode), never a checkout beside it.
"""

import sys

from octo_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["finetune", *sys.argv[1:]]))
