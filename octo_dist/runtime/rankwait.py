"""Rank 0 does something first (builds a dataset, writing the statistics cache the others then read); the other
ranks wait for it, as long as it takes, saying what they wait for, and stop with rank 0's error if it fails; then
every rank waits until all have done it.

    dataset = rankwait.rank_zero_first(build, "the dataset", process_index, process_count)

Not a device collective: ``multihost_utils.sync_global_devices`` is an all-reduce, and the first one sets up the
collectives' communicators with a time limit of their own (gloo's on the CPU: ``GetKeyValue() timed out ...
29.99s``; NCCL's set-up on GPUs), so a rank 0 that spends minutes on a dataset's statistics pass ended every other
rank. The wait is a key of JAX's coordination service (rank 0 hosts it; every rank is its client once
``jax.distributed.initialize`` ran): rank 0 sets it when it is done or failed, the others read it with a timeout of
a few seconds at a time, so they can say how long they have waited, and give up after the overall limit. Then the
ranks leave together, the same way (each rank's key read by rank 0, one key from rank 0 read by the others): rank 0,
gone on to its next collective while rank 1 still built from the cache, would otherwise wait there as rank 1 did.

The overall limit is ``OCTO_DIST_RANK0_WAIT_TIMEOUT`` seconds. In a job octo-dist launched, the job runtime sets it
from the job's settings: its wall time less the stop margin ("42900" for 12:00:00 and 300 s), as long as the job may
train (``octo_dist.jobs.settings.rank0_wait_s``). Run by hand (a bare ``mpirun``), it defaults to 7200 (2 hours): a
statistics pass reads every trajectory once, minutes on a large dataset, far short of that, and a hung rank 0 then
holds the nodes no longer. A rank 0 that dies takes the coordination service with it: the waiting ranks stop then,
saying so.

Only ``key_value_set`` and ``blocking_key_value_get(key, timeout_in_ms)`` of the coordination client are used: both
exist, alike, in jax 0.4.20 and 0.4.22 (``jax._src.distributed.global_state.client``; JAX has no public name for it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
import traceback
from typing import Callable, Mapping, Optional, Protocol, TypeVar

from octo_dist import EXIT_FAILED
from octo_dist.problems import Problem, Refusal

log = logging.getLogger(__name__)
T = TypeVar("T")

TIMEOUT_ENV = (
    "OCTO_DIST_RANK0_WAIT_TIMEOUT"  # "14400": seconds the other ranks wait for rank 0's part
)
DEFAULT_TIMEOUT_S = 7200.0
POLL_S = 5.0  # one read of the key: how soon a wait notices the overall limit
# When a waiting rank says it still waits (seconds since it began), then every LOG_EVERY_S[-1] s.
LOG_EVERY_S = (10, 30, 60, 120, 300)
TRACEBACK_MAX = (
    8000  # characters of rank 0's traceback the others repeat (the key holds the whole message)
)
_KEY_PREFIX = "octo_dist/rank_zero_first"
_waits = 0  # this process's waits so far: every rank makes them in the same order, so the n-th keys agree


class Store(Protocol):
    """The coordination service's key-value store, as far as the wait uses it."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str, timeout_s: float) -> Optional[str]:
        """The key's value, or None when it was not set within ``timeout_s``."""


class CoordinationStore:
    """JAX's coordination service client (``jax.distributed.initialize`` made it)."""

    def __init__(self, client=None):
        if client is None:
            from jax._src import distributed

            client = distributed.global_state.client
        if client is None:
            raise RuntimeError(
                "no JAX coordination service: rank_zero_first needs jax.distributed.initialize first"
            )
        self.client = client

    def set(self, key: str, value: str) -> None:
        self.client.key_value_set(key, value)

    def get(self, key: str, timeout_s: float) -> Optional[str]:
        try:
            return self.client.blocking_key_value_get(key, max(int(timeout_s * 1000), 1))
        except (
            Exception
        ) as e:  # jaxlib's XlaRuntimeError, "DEADLINE_EXCEEDED: GetKeyValue() timed out ..."
            if str(e).startswith("DEADLINE_EXCEEDED"):
                return None
            raise


class RankFailed(Problem):
    """Another rank failed at what this one waited for: this rank stops with its error (and its exit status)."""


class WaitTimedOut(Problem):
    """A rank did not finish within the wait's overall limit: this rank ends the job (exit 1)."""


class RankZeroLost(Problem):
    """The coordination service (on rank 0) stopped answering while this rank waited: rank 0 is gone."""


def wait_timeout(environ: Mapping[str, str]) -> float:
    """``$OCTO_DIST_RANK0_WAIT_TIMEOUT`` ("14400") or 7200 s; refused (exit 2, every rank alike) unless a positive,
    finite number of seconds."""
    raw = environ.get(TIMEOUT_ENV, "")
    if raw == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise Refusal(
            f"{TIMEOUT_ENV}={raw!r}",
            f"a positive number of seconds the other ranks wait for rank 0 (default {DEFAULT_TIMEOUT_S:g})",
            f"export {TIMEOUT_ENV}=14400",
        )
    return value


def rank_zero_first(
    work: Callable[[], T],
    what: str,
    process_index: int,
    process_count: int,
    *,
    environ: Optional[Mapping[str, str]] = None,
    store: Optional[Store] = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``work()`` on rank 0, then on every other rank once rank 0's has returned; every rank returns its own result
    once every rank's ``work`` has returned.

    The ranks leave together: a rank that went on while another still worked would wait for it in the next
    collective, whose set-up gives up after 30 s (gloo), as rank 1 did for rank 0. Rank 0 waits for each other
    rank in turn and then tells them all (a key each rank reads: not N x N reads at a thousand ranks).

    Args:
      work: what every rank does; rank 0's first (it writes what the others then read).
      what: what it makes, for the log ("the dataset (rank 0 computes its statistics on a first run)").
      environ: where ``OCTO_DIST_RANK0_WAIT_TIMEOUT`` is read (default ``os.environ``).
      store: the coordination service (default JAX's; tests pass another).

    Raises:
      RankFailed: another rank's ``work`` raised: its error, its exit status.
      WaitTimedOut: the rank waited for said nothing within the overall limit.
      RankZeroLost: the coordination service stopped answering.
    """
    global _waits
    timeout_s = wait_timeout(
        os.environ if environ is None else environ
    )  # refused alike on every rank
    if process_count <= 1:
        return work()
    store = store or CoordinationStore()
    _waits += 1
    key = f"{_KEY_PREFIX}/{_waits}"
    wait = functools.partial(
        _wait, store, what=what, rank=process_index, timeout_s=timeout_s, clock=clock
    )
    if process_index != 0:
        _stop_if_failed(wait(f"{key}/first", "rank 0"), what, process_index)
        result = _published(store, f"{key}/built/{process_index}", work, process_index)
        _stop_if_failed(wait(f"{key}/all", "every rank"), what, process_index)
        return result
    result = _published(store, f"{key}/first", work, 0)
    for other in range(1, process_count):
        outcome = wait(f"{key}/built/{other}", f"rank {other}")
        if not outcome.get("ok"):
            store.set(f"{key}/all", json.dumps(outcome))  # the others stop with the same error
        _stop_if_failed(outcome, what, 0)
    store.set(f"{key}/all", json.dumps({"ok": True}))
    return result


def _published(store: Store, key: str, work: Callable[[], T], rank: int) -> T:
    """``work()``, its outcome set at ``key``: ok, or its failure for the ranks waiting on it."""
    try:
        result = work()
    except BaseException as e:
        store.set(key, json.dumps({**_failure(e), "rank": rank}))
        raise
    store.set(key, json.dumps({"ok": True}))
    return result


def _failure(e: BaseException) -> dict:
    """What the waiting ranks need to stop as the failed rank does: its one line, exit status, and (a bug) its
    traceback."""
    if isinstance(e, Problem):
        return {
            "ok": False,
            "error": str(e),
            "exit_status": e.exit_status,
            "same_on_every_rank": bool(e.same_on_every_rank),
        }
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {
        "ok": False,
        "error": f"{type(e).__name__}: {e}",
        "exit_status": EXIT_FAILED,
        "same_on_every_rank": False,
        "traceback": text[-TRACEBACK_MAX:],
    }


def _wait(
    store: Store, key: str, whom: str, *, what: str, rank: int, timeout_s: float, clock
) -> dict:
    """The outcome set at ``key`` (``{"ok": true}``, or a failure), read a few seconds at a time, saying now and
    then how long this rank has waited for ``whom`` ("rank 0", "every rank")."""
    started = clock()
    log.info("rank %d: waiting for %s to build %s (at most %g s)", rank, whom, what, timeout_s)
    said = 0
    while True:
        waited = clock() - started
        if waited >= timeout_s:
            raise WaitTimedOut(
                f"rank {rank} waited {waited:.0f} s for {whom} to build {what}; it has not finished",
                f"{whom} done within {TIMEOUT_ENV}={timeout_s:g} s",
                f"see the ranks' logs for where they stand; if they are only slow, export {TIMEOUT_ENV}="
                f"{timeout_s * 2:g}",
            )
        try:
            value = store.get(key, min(POLL_S, timeout_s - waited))
        except Exception as e:
            raise RankZeroLost(
                f"rank {rank} lost rank 0's coordination service after waiting {clock() - started:.0f} s for "
                f"{whom} to build {what}: {e}",
                "rank 0 alive until every rank has built it",
                "see rank 0's log for why it ended",
            ) from None
        if value is not None:
            break
        waited = clock() - started
        last = len(LOG_EVERY_S) - 1  # 10, 30, 60, 120, 300, then 600, 900, ...
        due = LOG_EVERY_S[min(said, last)] * max(1, said - last + 1)
        if waited >= due:
            said += 1
            log.warning(
                "rank %d: waiting for %s to build %s: %.0f s so far (at most %g s, %s)",
                rank,
                whom,
                what,
                waited,
                timeout_s,
                TIMEOUT_ENV,
            )
    outcome = json.loads(value)
    if outcome.get("ok"):
        log.info(
            "rank %d: %s built %s after %.0f s of waiting", rank, whom, what, clock() - started
        )
    return outcome


def _stop_if_failed(outcome: dict, what: str, rank: int) -> None:
    """Raise the failed rank's error here: the same line and exit status; a refusal alike on every rank stays one."""
    if outcome.get("ok"):
        return
    failed = outcome.get("rank", 0)
    if outcome.get("traceback"):
        log.error("rank %s failed to build %s:\n%s", failed, what, outcome["traceback"].rstrip())
    error = RankFailed(
        f"rank {failed} failed to build {what}, so rank {rank} stops: {outcome.get('error')}",
        exit_status=int(outcome.get("exit_status") or EXIT_FAILED),
    )
    error.same_on_every_rank = bool(outcome.get("same_on_every_rank"))
    if (
        error.same_on_every_rank
    ):  # rank 0 prints it for the job; this rank's log says why it stopped too
        log.error("%s", error)
    raise error
