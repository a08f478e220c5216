"""Give Octo's ``OctoModel.from_config`` an example batch it gathers correctly on any number of processes.

What fails on more than one process without it::

    File ".../octo/model/octo_module.py", line 125, in __call__
        assert horizon <= self.max_horizon, "horizon must be <= max_horizon"

``from_config`` (TMats/octo@b14ec77, ``octo/model/octo_model.py``) does::

    example_batch = multihost_utils.process_allgather(example_batch)
    example_batch = jax.tree_map(lambda x: x[:1], example_batch)

and jax 0.4.20's (and 0.4.22's, unchanged) ``process_allgather`` has two branches
(``jax/experimental/multihost_utils.py``, ``_handle_array_process_allgather``):

* a numpy array or a *fully addressable* jax.Array (host-local data): on one process it comes back unchanged, on
  ``P`` processes it is stacked on a new leading axis, ``(B/P, T, H, W, 3) -> (P, B/P, T, H, W, 3)``. ``x[:1]``
  then keeps a whole process's slice, the batch axis becomes the window axis, and the window check fails;
* a jax.Array that is *not* fully addressable (a global array spread over several processes): ``pjit`` of the
  identity to a replicated sharding, i.e. the global value ``(B, T, H, W, 3)`` on every process.

So no patch to Octo is needed (such as editing it to ``tiled=True``): hand ``from_config`` *global* arrays, built
from each process's slice with ``host_local_array_to_global_array`` (``make_array_from_process_local_data`` is
0.4.29+). They take the second branch on several processes and the unchanged path on one; the result is
``(B, ...)``, identical on every rank, in both cases. That is :func:`for_from_config`. The engine's
``Engine.global_batch`` builds the same arrays, so a policy that receives the engine's global batch needs nothing
more; this module is for code that starts from a local numpy batch (``octo_dist.apps.finetune.app``) and for the
tests that pin the behaviour on the JAX versions we run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from octo_dist.engine.parallel import BATCH_AXIS
from octo_dist.problems import Refusal


class GatherError(Refusal, ValueError):
    """A leaf of the example batch cannot become a global array (a string, a scalar, a ragged batch)."""


def _path(keypath) -> str:
    import jax

    return jax.tree_util.keystr(keypath) or "<root>"


def check_leaves(local_batch: Any) -> int:
    """The local batch size, after refusing leaves that cannot be sharded along axis 0.

    Octo's dataset yields ``task.language_instruction`` as byte strings and ``dataset_name`` as strings; the fork's
    ``process_batch`` encodes the first (or drops it without a text processor) and deletes the second before
    ``from_config``. Anything left that is not a numeric/bool array with the same leading size would otherwise fail
    deep inside ``host_local_array_to_global_array`` with a message that names no key.
    """
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(local_batch)[0]
    if not leaves:
        raise GatherError(
            "example batch has no arrays; expected Octo's "
            "{'observation': ..., 'task': ..., 'action': ...}"
        )
    sizes = {}
    for keypath, leaf in leaves:
        arr = leaf if isinstance(leaf, jax.Array) else np.asarray(leaf)
        where = _path(keypath)
        if arr.dtype.kind not in "biuf":
            raise GatherError(
                f"example batch leaf {where} has dtype {arr.dtype}; expected numbers or bools. "
                f"Strings must be encoded (octo.utils.train_utils.process_text) or removed "
                f"(del batch['dataset_name']) before from_config"
            )
        if arr.ndim == 0:
            raise GatherError(
                f"example batch leaf {where} is a scalar; every leaf needs a leading batch axis"
            )
        sizes[where] = arr.shape[0]
    if len(set(sizes.values())) != 1:
        raise GatherError(f"example batch leaves disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def for_from_config(local_batch: Any, mesh, axis: str = BATCH_AXIS) -> Any:
    """This process's numpy slice -> global arrays that ``OctoModel.from_config`` gathers to ``(B, ...)``.

    Args:
      local_batch: a pytree of numpy arrays, ``B / process_count`` examples on every process (the same size on all).
      mesh: a mesh over every device of every process, ordered by process (``engine.make_mesh()``), whose ``axis``
        is the data-parallel axis. The global batch is the processes' slices concatenated in process order.
      axis: the mesh axis the batch is sharded along.

    Returns:
      The same pytree as global ``jax.Array``s of leading size ``B``, sharded along ``axis``.
    """
    from jax.experimental import multihost_utils
    from jax.sharding import PartitionSpec as P

    local = check_leaves(local_batch)
    devices_here = mesh.local_mesh.devices.size
    if local % devices_here:
        raise GatherError(
            f"local example batch of {local} does not divide by this process's {devices_here} "
            f"device(s); expected a multiple of {devices_here}. Fix: a global batch that divides by the "
            f"device count"
        )
    return multihost_utils.host_local_array_to_global_array(local_batch, mesh, P(axis))


def gathered(local_batch: Any, mesh, axis: str = BATCH_AXIS) -> Any:
    """What ``from_config`` sees after its ``process_allgather``: the global batch as numpy, the same on every rank.

    ``process_allgather(for_from_config(local))``: the effect of a ``tiled=True`` edit to Octo, without the edit.
    """
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(for_from_config(local_batch, mesh, axis))
