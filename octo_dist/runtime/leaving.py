"""Leaving the distributed runtime at a job's end: ``jax.distributed.shutdown`` on every rank.

Its barrier holds every rank until all have arrived; then rank 0, which hosts the coordination service, stops it.
A slower rank whose last reply was still on its way finds the service gone and raises, after its work was done
(CI, jax 0.4.22 on 2 ranks: ``XlaRuntimeError: UNAVAILABLE: Socket closed``, after "Failed to cancel preemption
barrier: UNAVAILABLE: Connection reset by peer"). That rank then ended with a traceback and a failed status, and
mpirun failed a job that had finished. Such an error on a rank other than 0 says only that rank 0 left first; rank 0
itself, or any other error, still raises: if rank 0 failed, its own exit status fails the job.
"""

from __future__ import annotations

import sys


def leader_gone(error: BaseException, rank: int) -> bool:
    """Whether shutdown's ``error`` on ``rank`` only says the coordination service (rank 0's) is gone:
    ``("UNAVAILABLE: Socket closed", 1)`` -> True; rank 0, or ``"DEADLINE_EXCEEDED: Barrier timed out"``, -> False."""
    return rank > 0 and str(error).lstrip().startswith("UNAVAILABLE")


def shutdown(rank: int = 0) -> None:
    """Leave the distributed runtime (waits for every rank, as jax.distributed.shutdown does; a no-op for one)."""
    import jax

    try:
        jax.distributed.shutdown()
    except Exception as e:
        if not leader_gone(e, rank):
            raise
        _forget_client()
        print(
            f"octo-dist: rank {rank}: rank 0 had stopped the distributed runtime before this rank's last reply; "
            "this rank's work was done",
            file=sys.stderr,
            flush=True,
        )


def _forget_client() -> None:
    """Drop JAX's client after a failed shutdown, so that its exit handler does not try (and fail) again."""
    try:
        from jax._src import distributed
    except (
        ImportError
    ):  # another JAX layout: its exit handler may print the same error once more, nothing worse
        return
    distributed.global_state.client = None
    distributed.global_state.preemption_sync_manager = None
