"""The train step functions a run can ask for, and which one "auto" means: one list for every command line.

Standard library only: ``octo-dist finetune`` and ``smoke`` declare their ``--step-fn`` choices from here when
``octo-dist launch`` checks a command line on a login node, where JAX is not installed.
"""

from __future__ import annotations

STEP_FNS = ("auto", "jit", "shard_map")
# What step_fn="auto" runs on each platform (resolve_step_fn); any platform not named here gets "jit".
AUTO_STEP_FNS = {"cpu": "shard_map"}


def resolve_step_fn(step_fn: str, platform: str) -> str:
    """The train step to build: ``step_fn`` itself, or for ``"auto"`` the one that runs best on ``platform``.

    ``"auto"`` on ``"cpu"`` -> ``"shard_map"``: the ranks of a CPU job talk through gloo, where every all-reduce is
    a TCP round trip, and XLA's CPU pipeline does not combine all-reduces: the compiled ``jit`` step holds one per
    parameter leaf (46 for the tiny policy, hundreds for Octo), the ``shard_map`` step one flat vector.
    ``"auto"`` elsewhere (``"gpu"``, ``"tpu"``) -> ``"jit"``: XLA's GPU pipeline combines the per-leaf all-reduces
    into buckets for NCCL (``--xla_gpu_all_reduce_combine_threshold_bytes``), and the loss stays a mean over the
    global batch.

    >>> resolve_step_fn("auto", "cpu"), resolve_step_fn("auto", "gpu"), resolve_step_fn("jit", "cpu")
    ('shard_map', 'jit', 'jit')
    """
    if step_fn not in STEP_FNS:
        raise ValueError(f"step_fn {step_fn!r}; expected one of {STEP_FNS}")
    return AUTO_STEP_FNS.get(platform, "jit") if step_fn == "auto" else step_fn
