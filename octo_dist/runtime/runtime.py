"""Start-up and shutdown of the JAX distributed runtime, from what the launcher says.

    with runtime.distributed() as rt:       # under mpirun, srun, a PBS/SGE job, or plain python
        ...                                 # rt.process_index, rt.process_count, rt.is_main

Only public JAX is called (``jax.distributed.initialize(coordinator, num_processes, process_id,
local_device_ids)``). What goes wrong on a cluster is checked here, before or right after start-up:

* a backend touched before start-up makes 0.4.20 run N independent single-process jobs: refused;
* CPU jax needs gloo collectives for more than one process, and jax <0.4.22 has none: refused by name;
* ``jax.process_count()`` must equal the launcher's world size: otherwise an error naming the likely cause;
* an unreachable coordinator ends with an error naming the address and timeout, not a 5-minute abort
  whose message blames "missing heartbeats";
* a watchdog is armed before anything that can block (mpi4py's MPI_Init and broadcast included): ranks that
  disagree at start-up end within ``--init-timeout``, each with its own error, instead of waiting forever;
* a rank that raises ends the whole job at once (MPI_Abort or exit 1) instead of waiting in shutdown's barrier.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import socket
import sys
import time
import traceback
from typing import Iterator, Mapping, Optional

from octo_dist import EXIT_FAILED, EXIT_USAGE, launchers
from octo_dist.stack import builds, cudaplugin
from octo_dist.launchers import coordcheck, coordinator, onevalue
from octo_dist.launchers.base import Launch
from octo_dist.runtime import mpi
from octo_dist.runtime.leaving import shutdown as shutdown
from octo_dist.runtime.startguard import EXIT_STARTUP as EXIT_STARTUP
from octo_dist.runtime.startguard import WATCHDOG_MARGIN_S, startup_guard
from octo_dist.problems import Problem

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300  # jax's own default for initialization_timeout
INIT_TIMEOUT_ENV = "OCTO_DIST_INIT_TIMEOUT"  # "600"
# jax aborts the process at its timeout; ours fires first, with a useful message
JAX_TIMEOUT_GRACE_S = 15
# One GPU per process (mpirun -npernode NUM_GPUS), all GPUs of a node per process, or N consecutive GPUs per
# process ("2": 4 ranks on an 8-GPU node, rank with local rank 1 binding GPUs 2 and 3).
DEVICE_MODES = ("one", "all", "N")


def devices_per_process(text: str) -> str:
    """``"one"``, ``"all"`` or a whole number of GPUs per process (``"2"``; ``"1"`` is ``"one"``), as given.

    Raises:
      SettingError: anything else (``"two"``, ``"0"``).
    """
    value = str(text).strip()
    if value in ("one", "all") or (value.isascii() and value.isdigit() and int(value) >= 1):
        return "one" if value == "1" else value
    raise SettingError(
        f"--devices-per-process {text!r}",
        "one, all or a whole number of GPUs per process (2)",
        "--devices-per-process=2 with 4 ranks on an 8-GPU node (ranks per node x GPUs per rank = GPUs per node)",
    )


class StartupError(Problem, RuntimeError):
    """The distributed runtime could not start as the launcher describes (exit 1: the job failed, not the input)."""


class SettingError(StartupError):
    """A start-up setting is malformed (``--init-timeout``, ``OCTO_DIST_INIT_TIMEOUT``, ``--devices-per-process``):
    refused before anything starts (exit 2, the same on every rank)."""

    exit_status = EXIT_USAGE
    same_on_every_rank = True


@dataclasses.dataclass(frozen=True)
class Runtime:
    launch: Launch
    coordinator: Optional[coordinator.Coordinator]
    host: str
    platform: str  # "gpu" / "cpu", from the devices JAX ended up with
    process_index: int
    process_count: int
    local_device_count: int
    device_count: int

    @property
    def is_main(self) -> bool:
        return self.process_index == 0

    def describe(self) -> str:
        where = (
            f", coordinator {self.coordinator.address} ({self.coordinator.source})"
            if self.coordinator
            else ""
        )
        return (
            f"{self.launch.launcher}: process {self.process_index}/{self.process_count} on {self.host}, "
            f"{self.local_device_count} of {self.device_count} {self.platform} device(s){where}"
        )


def expects_gpu(
    jaxlib_version: str, environ: Mapping[str, str], plugin: Optional[str] = None
) -> bool:
    """Whether JAX will pick a GPU backend: ``JAX_PLATFORMS="cpu"`` says no; else a CUDA jaxlib
    (``"0.4.20+cuda11.cudnn86"``) or PyPI's jaxlib with a CUDA plugin (``plugin="jax-cuda12-plugin 0.4.23"``) says
    yes. Decided before the backend exists, which must not be touched yet."""
    platforms = (environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME") or "").lower()
    if platforms:
        return platforms.split(",")[0].strip() in ("cuda", "gpu", "rocm")
    return builds.is_gpu_jaxlib(jaxlib_version) or plugin is not None


def local_device_ids(launch: Launch, mode: str, environ: Mapping[str, str]) -> Optional[list[int]]:
    """GPU ids this process binds: ``[local_rank]`` for one GPU per process; None (all) for one process per node.

    A launcher that already narrowed ``CUDA_VISIBLE_DEVICES`` to one GPU per rank ("3") leaves that GPU as id 0.
    """
    mode = devices_per_process(mode)
    if mode == "all":
        return None
    n = 1 if mode == "one" else int(mode)
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) == n:
        return list(range(n))
    first = launch.local_rank * n
    if visible and first + n > len(visible):
        raise StartupError(
            f"local rank {launch.local_rank} with {n} GPU(s) per process but "
            f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r} shows {len(visible)} GPU(s): more ranks x "
            f"GPUs per rank on this node than GPUs. Fix: mpirun -npernode {max(len(visible) // n, 1)}"
        )
    return list(range(first, first + n))


def _backends_initialized() -> bool:
    # No public API says whether a backend exists. jax 0.4.22 has this function (its initialize() refuses too);
    # 0.4.20 has only the dict, and there a touched backend silently gives N single-process runs.
    from jax._src import xla_bridge

    fn = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(fn()) if fn else bool(getattr(xla_bridge, "_backends", {}))


def _check_own_hostname_resolves(host: str) -> None:
    """gloo (CPU collectives) binds to this host's name; an unresolvable one (a container named after its id)
    crashes a rank without a word, so say it first."""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise StartupError(
            f"this host's name {host!r} does not resolve ({e}); CPU collectives (gloo) bind to it. "
            f"Expected a name in DNS or /etc/hosts. Fix: add it to /etc/hosts, or start the container "
            f"with --hostname localhost"
        ) from None


def _enable_cpu_collectives(jax_version: str) -> None:
    import jax

    try:
        jax.config.update("jax_cpu_enable_gloo_collectives", True)
    except (AttributeError, KeyError):
        raise StartupError(
            f"jax {jax_version} on the CPU cannot run one computation across processes (no gloo collectives before "
            f"0.4.22: 0.4.20 silently reports process_count()==1 in every rank). "
            f"Expected the cpu profile's jax 0.4.22. Fix: make env PROFILE=cpu, or run on GPUs with the cuda11 profile"
        ) from None


def wait_for_coordinator(
    c: coordinator.Coordinator, timeout_s: float, rank: int, deadline: Optional[float] = None
) -> None:
    """Rank > 0: until the coordinator accepts TCP connections, at most ``timeout_s`` (or until ``deadline``,
    ``time.monotonic()``: start-up's whole budget, which the imports before this wait have used part of); else a
    StartupError naming ``timeout_s``. One attempt is made however late it is."""
    deadline = time.monotonic() + timeout_s if deadline is None else deadline
    last: Exception | None = None
    while True:
        try:
            with socket.create_connection((c.host, c.port), timeout=min(2.0, max(timeout_s, 0.1))):
                return
        except socket.gaierror as e:
            raise StartupError(
                f"rank {rank}: coordinator host {c.host!r} ({c.source}) does not resolve: {e}. "
                f"Fix: export COORDINATOR_ADDRESS=<rank 0's hostname or IP>:<port>"
            ) from None
        except OSError as e:
            last = e
            if time.monotonic() + 0.25 >= deadline:
                break
            time.sleep(0.25)
    raise StartupError(
        f"rank {rank}: coordinator {c.address} ({c.source}) did not accept connections within {timeout_s:g} s "
        f"(last error: {last}). Likely: rank 0 failed before starting it (see its log), the address is not rank 0's "
        f"node, or a firewall blocks port {c.port}. Fix: export COORDINATOR_ADDRESS=<rank 0 host>:<open port>, "
        f"or raise the timeout (--init-timeout / OCTO_DIST_INIT_TIMEOUT)"
    )


def startup_timeout(timeout_s: Optional[float], environ: Mapping[str, str]) -> float:
    """``timeout_s``, else ``$OCTO_DIST_INIT_TIMEOUT`` ("600"), else 300 s; refused unless a positive number."""
    raw = timeout_s if timeout_s is not None else environ.get(INIT_TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        where = "--init-timeout" if timeout_s is not None else INIT_TIMEOUT_ENV
        raise SettingError(
            f"{where}={raw!r}; expected a positive number of seconds (default {DEFAULT_TIMEOUT_S})"
        )
    return value


def initialize(
    *,
    launcher: str = "auto",
    coordinator=None,
    timeout_s: Optional[float] = None,
    devices: str = "one",
    use_mpi: bool = True,
    environ: Optional[Mapping[str, str]] = None,
) -> Runtime:
    """Start JAX's distributed runtime as the launcher describes (a no-op start for a single process).

    Args:
      launcher: "auto" or a name from ``octo_dist.launchers.ORDER``.
      coordinator: "host:port" (or a ``Coordinator``) overriding every other source.
      timeout_s: how long start-up may take (default ``$OCTO_DIST_INIT_TIMEOUT`` or 300 s). The watchdog is armed
        before the first call that can block, mpi4py included: a rank stuck past it exits with an error.
      devices: "one" GPU per process (``local_device_ids=[local_rank]``), "all" GPUs of the node per process, or
        "N" consecutive GPUs per process (local rank r binds r*N .. r*N+N-1).
      use_mpi: let mpi4py broadcast rank 0's address when launched through MPI; ``OCTO_DIST_NO_MPI4PY=1`` in
        ``environ`` turns it off too (a container without an MPI library: mpi4py is then never imported).
      environ: the environment to read (default ``os.environ``).

    Raises:
      StartupError: (single process, or before anything could block) the runtime cannot start as described.
        Once several ranks may be waiting on this one, a failure ends the whole job instead (MPI_Abort, or exit 1
        for mpirun to notice) with this rank's error, so no rank waits for it.
    """
    environ = os.environ if environ is None else environ
    timeout_s = startup_timeout(timeout_s, environ)
    use_mpi = use_mpi and mpi.allowed(environ)
    launch = launchers.detect(environ, launcher)
    with startup_guard(launch, timeout_s) as dog:
        return _start(launch, environ, coordinator, timeout_s, devices, use_mpi, dog)


def _start(
    launch: Launch,
    environ: Mapping[str, str],
    explicit,
    timeout_s: float,
    devices: str,
    use_mpi: bool,
    dog,
) -> Runtime:
    """Start-up in its order: refuse a touched backend, pick the platform, agree the coordinator, join the other
    ranks, then check that JAX sees the job the launcher started."""
    import jax
    import jaxlib

    _refuse_a_touched_backend()
    plugin, gpu_files = _choose_platform(jax, launch, environ)
    gpu = expects_gpu(jaxlib.__version__, environ, plugin)
    dog.stage(
        "the coordinator agreement through mpi4py (MPI_Init, broadcast)"
        if use_mpi
        else "the coordinator agreement"
    )
    c = coordinator.resolve(
        environ, launch, explicit=explicit, broadcast=mpi.broadcaster(launch) if use_mpi else None
    )
    if launch.world_size > 1:
        assert c is not None
        _join(jax, launch, c, gpu, devices, environ, timeout_s, dog)
    count = _first_backend_touch(jax, plugin, gpu_files)
    _check_jax_sees_the_launch(jax, launch, count, gpu)
    devices_seen = jax.local_devices()
    rt = Runtime(
        launch=launch,
        coordinator=c,
        host=socket.gethostname(),
        platform=devices_seen[0].platform,
        process_index=jax.process_index(),
        process_count=count,
        local_device_count=len(devices_seen),
        device_count=jax.device_count(),
    )
    if gpu and rt.platform == "cpu":
        log.warning(
            "%s is a CUDA build but JAX is on the CPU: see `octo-dist check-env --deep`",
            plugin or f"jaxlib {jaxlib.__version__}",
        )
    return rt


def _refuse_a_touched_backend() -> None:
    if _backends_initialized():
        raise StartupError(
            "a JAX backend was initialised before octo_dist started the distributed runtime (something called "
            "jax.devices() or ran a computation at import time, or initialize() was called twice); jax 0.4.20 then "
            "runs every rank as an independent single-process job. Fix: call octo_dist.runtime.runtime.initialize() "
            "once, before any JAX computation"
        )


def _choose_platform(jax, launch: Launch, environ: Mapping[str, str]) -> tuple[Optional[str], list]:
    """The CUDA plugin JAX will load (``"jax-cuda12-plugin 0.4.23"``, None when the CPU is chosen here) and the
    GPU device files found (``["/dev/nvidia0"]``). jax[cuda12] raises at the first jax.devices() where no GPU
    exists: say it once and run on the CPU instead."""
    plugin, gpu_files = cudaplugin.installed_plugin(), cudaplugin.gpu_devices()
    fallback = cudaplugin.cpu_fallback(environ, plugin, gpu_files)
    if fallback:
        jax.config.update("jax_platforms", "cpu")
        if launch.rank == 0:  # one line for the job, not one per rank
            log.warning("octo-dist: %s", fallback)
        plugin = None
    return plugin, gpu_files


def _join(
    jax,
    launch: Launch,
    c: coordinator.Coordinator,
    gpu: bool,
    devices: str,
    environ: Mapping[str, str],
    timeout_s: float,
    dog,
) -> None:
    """``jax.distributed.initialize`` for one of several ranks, within ``timeout_s`` from now."""
    started = time.monotonic()
    # Resolves; rank 0 listens on exactly that address and port first (else XLA segfaults, exit 139).
    coordcheck.check(c, launch.rank)
    if not gpu:
        _check_own_hostname_resolves(socket.gethostname())
        _enable_cpu_collectives(jax.__version__)
    ids = local_device_ids(launch, devices, environ) if gpu else None
    log.info(
        "starting %d processes: coordinator %s (%s), timeout %g s",
        launch.world_size,
        c.address,
        c.source,
        timeout_s,
    )
    if launch.rank != 0:
        dog.stage(f"the wait for the coordinator {c.address} ({c.source})")
        # Ends before the watchdog (armed before `import jax`, timeout + WATCHDOG_MARGIN_S): its message names
        # the coordinator, the watchdog's only the stage. A loaded node can take seconds to import jax.
        until = dog.deadline - WATCHDOG_MARGIN_S if dog.deadline is not None else None
        wait_for_coordinator(c, timeout_s, launch.rank, deadline=until)
    remaining = max(timeout_s - (time.monotonic() - started), 1.0)
    dog.stage("jax.distributed.initialize")
    try:
        jax.distributed.initialize(
            c.address,
            launch.world_size,
            launch.rank,
            local_device_ids=ids,
            initialization_timeout=int(remaining + JAX_TIMEOUT_GRACE_S),
        )
    except Exception as e:
        raise StartupError(
            f"rank {launch.rank}: jax.distributed.initialize({c.address!r}, {launch.world_size}, "
            f"{launch.rank}) failed: {e}"
        ) from e


def _first_backend_touch(jax, plugin: Optional[str], gpu_files) -> int:
    """``jax.process_count()``: the CUDA plugin starts here, and its failure is worded by ``cudaplugin``."""
    try:
        return jax.process_count()
    except RuntimeError as e:
        msg = cudaplugin.backend_error(e, plugin, gpu_files)
        if msg is None:
            raise
        raise StartupError(msg) from e


def _check_jax_sees_the_launch(jax, launch: Launch, count: int, gpu: bool) -> None:
    if count != launch.world_size or jax.process_index() != launch.rank:
        cause = (
            "CPU jax before 0.4.22 runs each process alone"
            if not gpu
            else "the distributed runtime did not start (jax.distributed.initialize not reached?)"
        )
        raise StartupError(
            f"{launch.launcher} started {launch.world_size} ranks (this is rank {launch.rank}), but JAX reports "
            f"process {jax.process_index()} of {count}. Likely cause: {cause}. Fix: octo-dist check-env --launch"
        )


def end_job(code: int) -> None:
    """End every rank now without a traceback (the caller printed its one line): MPI_Abort when MPI is up, else exit
    this process, which mpirun notices and ends the others for."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi.abort(code)
    os._exit(code)


def abort(exc: BaseException, rank: int, world: int) -> None:
    """End this job now: a rank that raised must not wait in shutdown's barrier while the others wait for it."""
    sys.stderr.write(f"octo-dist: rank {rank}/{world} failed; aborting the job\n")
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    mpi.abort(EXIT_FAILED)
    os._exit(EXIT_FAILED)


@contextlib.contextmanager
def distributed(**kwargs) -> Iterator[Runtime]:
    """``initialize(**kwargs)``, then :func:`running`."""
    with running(initialize(**kwargs)) as rt:
        yield rt


@contextlib.contextmanager
def running(rt: Runtime) -> Iterator[Runtime]:
    """Always leave cleanly: shutdown on success, abort the whole job when this rank raised."""
    try:
        yield rt
    except SystemExit as e:
        if e.code not in (0, None) and rt.process_count > 1:
            abort(e, rt.process_index, rt.process_count)
        shutdown(rt.process_index)
        raise
    except BaseException as e:
        if rt.process_count > 1:
            abort(e, rt.process_index, rt.process_count)
        shutdown(rt.process_index)
        raise
    else:
        shutdown(rt.process_index)


def argv_options(parser) -> None:
    """The start-up flags every multi-process subcommand shares, each given once (``onevalue.OneValue``)."""
    parser.add_argument(
        "--launcher",
        default="auto",
        choices=["auto", *launchers.ORDER],
        help="who started the ranks (default: detect; order: %s)" % ", ".join(launchers.ORDER),
        action=onevalue.OneValue,
    )
    parser.add_argument(
        "--coordinator",
        help="HOST:PORT of rank 0's coordination service (default: agreed automatically)",
        action=onevalue.OneValue,
    )
    parser.add_argument(
        "--init-timeout",
        type=float,
        default=None,
        help=f"seconds start-up may take (default: $OCTO_DIST_INIT_TIMEOUT or {DEFAULT_TIMEOUT_S})",
        action=onevalue.OneValue,
    )
    parser.add_argument(
        "--devices-per-process",
        type=_devices_argument,
        default="one",
        metavar="one|all|N",
        help="one GPU per rank (mpirun -npernode NUM_GPUS), all GPUs of a node per rank, or N GPUs per rank "
        "(default: %(default)s)",
        action=onevalue.OneValue,
    )


def _devices_argument(text: str) -> str:
    # argparse words a type error as "argument --devices-per-process: invalid value" with our message after.
    try:
        return devices_per_process(text)
    except SettingError as e:
        raise argparse.ArgumentTypeError(f"{e.expected}, not {text!r}") from None


def from_args(args) -> dict:
    return dict(
        launcher=args.launcher,
        coordinator=args.coordinator,
        timeout_s=args.init_timeout,
        devices=args.devices_per_process,
    )
