"""The data-parallel train step: replicated state, batch-sharded global inputs, replicated metrics.

    mesh = parallel.make_mesh()                                 # every device of every process, axis "batch"
    eng = parallel.Engine(mesh, policy.loss, optax.adam(1e-3))  # step_fn="auto" (default), "jit" or "shard_map"
    state = eng.init_state(policy, eng.global_batch(local), seed=0)
    state, metrics = eng.step(state, eng.global_batch(local))   # local: this process's slice, numpy
    eng = parallel.Engine(mesh, loss, tx, augment=augment.batch_augmenter(kwargs))  # images augmented on the device
    state, metrics = eng.step(state, eng.prepare(batch, rng, step), prepared=True)  # augmented ahead (train.fit)

Inputs are *global* arrays assembled from each process's slice with
``multihost_utils.host_local_array_to_global_array`` (``make_array_from_process_local_data`` arrived in 0.4.29).
Numpy passed to a sharded ``jit`` fails on several processes with "Passing non-trivial shardings for numpy inputs
is not allowed"; ``global_batch`` is the one way in.

The state is replicated by construction: built by one ``jit`` whose ``out_shardings`` are replicated (never a full
init on the host only to read its shapes: a checkpoint's template comes from ``jax.eval_shape``), and checked with
:func:`assert_replicated`; :func:`to_host` refuses a sharded array instead of returning one shard of it.

``step_fn="shard_map"`` is the variant with per-device code and an explicit ``pmean``. jax 0.4.20 has no
replication rule for ``erf_inv`` (used by Octo's diffusion head's initialisers and noise), so ``check_rep`` is off
there; 0.4.22 has one and keeps the check.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, Optional, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import multihost_utils
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

# parallel.resolve_step_fn and the lists stay reachable here, where the engine's callers look for them
from octo_dist.engine.stepfns import AUTO_STEP_FNS, STEP_FNS, resolve_step_fn  # noqa: F401
from octo_dist.problems import Problem

BATCH_AXIS = "batch"
STOP = "stop_signal"  # the metric holding the largest pending signal number over every process
MAX_SIGNAL = 65  # signal numbers are below this on Linux (SIGRTMAX = 64)
LossFn = Callable[[Any, Mapping[str, Any], Any, bool], Tuple[Any, Mapping[str, Any]]]
# (batch, key) -> batch, traced inside the step before the loss: the device's image augmentation (augment.py)
BatchFn = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
# The augmentation's key is fold_in(<the step's key>, AUGMENT_STREAM): a stream of its own, so the dropout masks
# drawn from the step's key stay what they were without augmentation.
AUGMENT_STREAM = 0x61756700  # "aug"


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: steps taken
    params: Any
    opt_state: Any
    rng: (
        jax.Array
    )  # base key; step k uses fold_in(rng, k), so a resumed run draws the same dropout masks


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh over every device of every process (``jax.devices()`` is ordered by process)."""
    return Mesh(np.asarray(devices if devices is not None else jax.devices()), (BATCH_AXIS,))


def version_tuple(version: str) -> tuple:
    """``"0.4.20"`` -> (0, 4, 20); a local tag (``"0.4.20+cuda11.cudnn86"``) is ignored."""
    return tuple(int(p) for p in version.split("+")[0].split(".")[:3])


def default_check_rep(jax_version: str) -> bool:
    """shard_map's replication check: off before 0.4.22 (no rule for erf_inv: "No replication rule for erf_inv")."""
    return version_tuple(jax_version) >= (0, 4, 22)


def tree_digest(tree) -> str:
    """sha256 over every leaf's bytes in tree order (this process's copy of replicated arrays): equal across ranks
    exactly when their parameters are bit-identical."""
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(to_host(tree)):
        h.update(np.ascontiguousarray(leaf).tobytes())
    return h.hexdigest()[:16]


class NotReplicatedError(Problem, ValueError):
    """A value the engine keeps identical on every device is sharded."""


def _one_host_copy(path, x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if not x.is_fully_replicated:
        raise NotReplicatedError(
            f"{jax.tree_util.keystr(path) or 'value'} is sharded ({x.sharding}); expected a "
            f"replicated array, whose local copy is the whole value"
        )
    return np.asarray(x.addressable_data(0))


def to_host(tree):
    """Replicated (or fully addressable) arrays -> numpy, from this process's copy; a sharded array is refused."""
    return jax.tree_util.tree_map_with_path(_one_host_copy, tree)


def assert_replicated(tree) -> None:
    """Every jax.Array leaf holds the whole value on every device (raises NotReplicatedError naming the first that
    does not)."""
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(x, jax.Array) and not x.is_fully_replicated:
            raise NotReplicatedError(
                f"{jax.tree_util.keystr(path)} is sharded ({x.sharding}); expected replicated"
            )


def init_keys(seed: int) -> Tuple[jax.Array, jax.Array]:
    """(the parameters' init key, the base key of every step's dropout): both from ``seed``."""
    init_rng, base_rng = jax.random.split(jax.random.PRNGKey(seed))
    return init_rng, base_rng


class Engine:
    def __init__(
        self,
        mesh: Mesh,
        loss_fn: LossFn,
        optimizer: optax.GradientTransformation,
        *,
        step_fn: str = "auto",
        check_rep: Optional[bool] = None,
        augment: Optional[BatchFn] = None,
    ):
        self.mesh = mesh
        self.augment = augment  # None: the batch reaches the loss as it came (augmented on the host, or not at all)
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        # the one that runs: never "auto"
        self.step_fn = resolve_step_fn(step_fn, mesh.devices.flat[0].platform, mesh.devices.size)
        self.check_rep = default_check_rep(jax.__version__) if check_rep is None else check_rep
        self.replicated = NamedSharding(mesh, P())
        self.sharded = NamedSharding(mesh, P(BATCH_AXIS))
        self._step = self._build()
        self._compiled = None  # compile()'s executable; step() calls it once made
        # The augmentation, a program of its own: (batch, base key, step) -> the batch that step's loss sees.
        # Run ahead of the step (prepare): on a CPU, whose dispatch returns only when the work is done (jax <
        # 0.4.31), the next batch is augmented on another core while the step runs, as tf.data's threads augment
        # the fork's; on GPUs it is queued behind the step. Fused into the step it cost the fork's debug config
        # 55 of a 185 ms step on the CPU (tf.data keeps those off the fork's step).
        self._augment_step = (
            jax.jit(
                self._augment_at,
                in_shardings=(self.sharded, self.replicated, self.replicated),
                out_shardings=self.sharded,
            )
            if augment is not None
            else None
        )
        self._augment_compiled = None

    # --- inputs -----------------------------------------------------------------------------------------

    def global_batch(self, local: Mapping[str, Any]):
        """This process's numpy slice -> global arrays sharded along the batch axis (its rows on its devices)."""
        return multihost_utils.host_local_array_to_global_array(local, self.mesh, P(BATCH_AXIS))

    def replicate(self, tree):
        """Identical values on every process -> replicated global arrays on this mesh.

        Host values (numpy, or arrays this process holds whole) are placed on every device; arrays spread over
        several processes are resharded to replicated by ``jit`` (an all-gather: the whole value, never one shard).
        """

        def one(x):
            if isinstance(x, jax.Array) and not x.is_fully_addressable:
                if x.sharding.is_equivalent_to(self.replicated, x.ndim):
                    return x
                return jax.jit(lambda a: a, out_shardings=self.replicated)(x)
            return multihost_utils.host_local_array_to_global_array(np.asarray(x), self.mesh, P())

        out = jax.tree_util.tree_map(one, tree)
        assert_replicated(out)
        return out

    def _state(self, params, base_rng) -> TrainState:
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=self.optimizer.init(params),
            rng=base_rng,
        )

    def init_state(self, policy, example_batch, seed: int = 0, params=None) -> TrainState:
        """Parameters from ``policy.init`` (or given, e.g. pretrained), optimizer state, base RNG.

        One ``jit`` with replicated ``out_shardings`` builds it all, so the state is replicated by construction
        (checked with :func:`assert_replicated`). ``policy.init`` is traced; ``example_batch`` is the global batch.
        """
        init_rng, base_rng = init_keys(seed)
        if params is None:
            build = jax.jit(
                lambda r, b: self._state(policy.init(r, b), base_rng), out_shardings=self.replicated
            )
            state = build(init_rng, example_batch)
        else:
            state = jax.jit(lambda p: self._state(p, base_rng), out_shardings=self.replicated)(
                self.replicate(params)
            )
        assert_replicated(state)
        return state

    def abstract_state(self, policy, example_batch, seed: int = 0, params=None):
        """What :meth:`init_state` would return, as shapes, dtypes and replicated shardings: a checkpoint's
        template. ``jax.eval_shape``: nothing is initialised or computed."""
        init_rng, base_rng = init_keys(seed)
        if params is None:
            shapes = jax.eval_shape(
                lambda r, b: self._state(policy.init(r, b), base_rng), init_rng, example_batch
            )
        else:
            shapes = jax.eval_shape(lambda p: self._state(p, base_rng), params)
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.replicated), shapes
        )

    # --- the step ---------------------------------------------------------------------------------------

    def _update(self, state: TrainState, batch, rng):
        (loss, metrics), grads = jax.value_and_grad(self.loss_fn, has_aux=True)(
            state.params, batch, rng, True
        )
        return loss, metrics, grads

    def _apply(self, state: TrainState, grads):
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state)

    def _augment_at(self, batch, rng, step):
        """``batch`` as the loss of step ``step`` sees it: augmented with that step's own key (``rng``: the state's
        base key). Its own program, run ahead of the step (:meth:`prepare`), never fused into it.

        Runs under ``jit`` on the global batch (never inside ``shard_map``): the per-sample keys follow the global
        sample index, so the images do not depend on the device count; the augmentation is elementwise per sample,
        so XLA keeps it on each device's rows with no communication (checked in tests/test_augment.py)."""
        key = jax.random.fold_in(jax.random.fold_in(rng, step), AUGMENT_STREAM)
        return jax.lax.with_sharding_constraint(self.augment(batch, key), self.sharded)

    def _augmented(self, state: TrainState, batch):
        """The batch the loss of ``state``'s next step sees (the batch itself where the engine has no ``augment``)."""
        if self.augment is None:
            return batch
        return self._augment_at(batch, state.rng, state.step)

    def _build(self):
        step = self._global_step() if self.step_fn == "jit" else self._per_device_step()
        return jax.jit(
            step,
            in_shardings=(self.replicated, self.sharded, self.sharded),
            out_shardings=(self.replicated, self.replicated),
            donate_argnums=0,
        )

    def _global_step(self):
        """The step on global arrays: XLA places the gradient all-reduce."""

        def step(state, batch, stop):
            loss, metrics, grads = self._update(
                state, batch, jax.random.fold_in(state.rng, state.step)
            )
            return self._apply(state, grads), _outputs(loss, metrics, grads, jnp.max(stop))

        return step

    def _per_device_step(self):
        """The step on each device's shard (``shard_map``), with one explicit all-reduce."""
        from jax.experimental.shard_map import shard_map

        single = self.mesh.devices.size == 1

        def per_device(state, batch, stop):
            # Each device draws its own dropout masks; the device index makes them differ.
            rng = jax.random.fold_in(
                jax.random.fold_in(state.rng, state.step), jax.lax.axis_index(BATCH_AXIS)
            )
            loss, metrics, grads = self._update(state, batch, rng)
            if single:
                # One device: nothing to reduce. Flattening every gradient into one vector (below) would copy
                # them twice a step for nothing (one CPU device, the fork's debug config: 155 -> 148 ms a step).
                return self._apply(state, grads), _outputs(loss, metrics, grads, jnp.max(stop))
            # One all-reduce for everything: per-leaf all-reduces cost a collective launch each (39 for the tiny
            # policy, hundreds for Octo). Measured on gloo, 2 processes: 119 -> 44 ms a step.
            # The stop signal rides along as a one-hot over signal numbers (pmax has no replication rule): after
            # the mean, every signal some rank received is non-zero, and the largest is taken as in jit mode.
            seen = jax.nn.one_hot(jnp.max(stop), MAX_SIGNAL)
            flat, unravel = ravel_pytree((grads, loss, metrics, seen))
            grads, loss, metrics, seen = unravel(jax.lax.pmean(flat, BATCH_AXIS))
            stop = jnp.max(jnp.where(seen > 0, jnp.arange(MAX_SIGNAL), 0))
            return self._apply(state, grads), _outputs(loss, metrics, grads, stop)

        return shard_map(
            per_device,
            mesh=self.mesh,
            in_specs=(P(), P(BATCH_AXIS), P(BATCH_AXIS)),
            out_specs=(P(), P()),
            check_rep=self.check_rep
            and not single,  # one device: replicated without a pmean the check sees
        )

    def compile(self, state, batch) -> None:
        """Compile the step ahead of the first call, for ``state``'s and ``batch``'s shapes and shardings: arrays, or
        ``jax.ShapeDtypeStruct`` with shardings (:meth:`abstract_state`), so that it can run in a thread beside the
        parameters' initialisation. :meth:`step` then calls that executable: the step is compiled once (and the
        augmentation, where the engine has one).
        (Weak types are not kept by ShapeDtypeStruct; a call's argument check ignores them, as a restored state's
        arrays already are strongly typed.)"""
        stop = jax.ShapeDtypeStruct((self.mesh.devices.size,), jnp.int32, sharding=self.sharded)
        if self._augment_step is not None:
            augment = self._augment_step.lower(batch, state.rng, state.step)
            self._augment_compiled = augment.compile()
            # the step takes what the augmentation makes: other shapes where it resizes (64x64 frames -> 256x256)
            batch = jax.eval_shape(self._augment_step, batch, state.rng, state.step)
        self._compiled = self._step.lower(state, batch, stop).compile()

    @property
    def compiled(self) -> bool:
        """Whether :meth:`compile` made the step's executable already."""
        return self._compiled is not None

    def prepare(self, batch, rng, step):
        """The global ``batch`` as the loss of step ``step`` sees it: augmented with that step's key where the engine
        has ``augment`` (``rng``: the state's base key, replicated; ``step``: a replicated int32 scalar), else
        ``batch`` itself. Pass the result to :meth:`step` with ``prepared=True``: the same images as an unprepared
        batch gets inside :meth:`step`, made ahead of it (``train.fit`` does it while the previous step runs)."""
        if self._augment_step is None:
            return batch
        run = self._augment_compiled if self._augment_compiled is not None else self._augment_step
        return run(batch, rng, step)

    def step(
        self, state: TrainState, batch, stop_signal: int = 0, prepared: bool = False
    ) -> Tuple[TrainState, dict]:
        """One optimizer step on a global batch; metrics are replicated jax scalars (``to_host`` reads them).

        ``stop_signal``: this process's pending signal number (0: none). ``metrics["stop_signal"]`` is the largest
        over every process, computed inside the step: agreeing to stop costs no collective of its own (a separate
        all-gather every step cost 4-7 ms on gloo). ``prepared``: ``batch`` came from :meth:`prepare` for this
        step (else it is prepared here first)."""
        if not prepared:
            batch = self.prepare(batch, state.rng, state.step)
        step = self._compiled if self._compiled is not None else self._step
        return step(state, batch, self._stop_array(stop_signal))

    def compiled_text(self, state: TrainState, batch) -> str:
        """The compiled step's HLO text, for counting what it communicates (``hlo.all_reduces``). Compiles anew."""
        return self._step.lower(state, batch, self._stop_array(0)).compile().as_text()

    def _stop_array(self, stop_signal: int):
        # One int per device, put explicitly (host_local_array_to_global_array's transfer counts as implicit and
        # would trip jax.transfer_guard("disallow") around the step).
        shards = [
            jax.device_put(np.full((1,), stop_signal, np.int32), d) for d in self.mesh.local_devices
        ]
        return jax.make_array_from_single_device_arrays(
            (self.mesh.devices.size,), self.sharded, shards
        )


def _outputs(loss, metrics, grads, stop) -> dict:
    """What a step reports: the loss, the policy's metrics, the gradient norm and the stop signal received."""
    return {"loss": loss, **metrics, "grad_norm": optax.global_norm(grads), STOP: stop}
