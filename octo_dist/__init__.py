"""octo-dist: data-parallel multi-node fine-tuning of Octo on a pinned, checked JAX stack."""

__version__ = "0.1.0"

# Exit codes shared by every command (and the job scripts that read them).
EXIT_OK = 0  # done, or stopped cleanly on a signal with a checkpoint saved
EXIT_FAILED = 1  # a check failed, or the run failed after it started
EXIT_USAGE = 2  # the input was refused before anything ran (bad flag, bad config, bad manifest)
