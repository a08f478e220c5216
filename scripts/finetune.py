#!/usr/bin/env python3
"""Octo fine-tuning on octo-dist, with the fork's command line; the work is in octo_dist.apps.finetune.app.

    mpirun -npernode $NUM_GPUS -hostfile $SGE_JOB_HOSTLIST python scripts/finetune.py \
        --config.pretrained_path=weights/octo-small [--config=octo_dist/apps/finetune/configs/finetune_config.py:head_only,multimodal]
        [--config.batch_size=256 --config.num_steps=50000 --config.save_dir=runs --name=NAME --debug --resume]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # runs from a checkout without installing octo-dist

from octo_dist.apps.finetune import app as finetune  # noqa: E402

if __name__ == "__main__":
    sys.exit(finetune.main(sys.argv))
