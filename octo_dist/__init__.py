"""octo-dist: data-parallel multi-node fine-tuning of Octo on a pinned, checked JAX stack."""

__version__ = "0.1.0"
