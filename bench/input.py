#!/usr/bin/env python3
"""Samples/s per core of the fine-tune's input pipeline, ours and the fork's side by side, the split of ours and a
verdict per node: the same as ``octo-dist bench-input`` (:mod:`octo_dist.apps.benchinput`). Prints; asserts nothing.

usage: bench/input.py DATA_DIR [--config=finetune_config.py:full,image_conditioned] [--set FIELD=VALUE ...]
(``make bench-input`` writes a dataset at the model's sizes and runs it on the window-2 + wrist config.)
"""

import sys

from octo_dist.apps.benchinput import cli

if __name__ == "__main__":
    sys.exit(cli.main_argv())
