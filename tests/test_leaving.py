"""A job's end: rank 0 stops the coordination service once every rank reached shutdown's barrier, and a slower
rank's last reply can find it gone. That error on a rank other than 0 says only that rank 0 left first (it failed a
finished 2-rank job under mpirun in CI); on rank 0, or any other error, it is still raised."""

from __future__ import annotations

import pytest

from octo_dist.runtime import leaving

# What jax 0.4.22's client.shutdown raised on rank 1 in CI, rank 0 having stopped its service (first line, then the
# gRPC detail JAX appends).
SOCKET_CLOSED = (
    "UNAVAILABLE: Socket closed\nAdditional GRPC error information from remote target "
    "unknown_target_for_coordination_leader while calling /tensorflow.CoordinationService/ShutdownTask:"
)


class XlaRuntimeError(RuntimeError):
    """jaxlib.xla_extension.XlaRuntimeError's shape: a RuntimeError whose text starts with the gRPC status."""


@pytest.mark.parametrize(
    "text, rank, gone",
    [
        (SOCKET_CLOSED, 1, True),
        (SOCKET_CLOSED, 3, True),
        (SOCKET_CLOSED, 0, False),  # rank 0 hosts the service: its own failure is a failure
        (
            "DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: Shutdown",
            1,
            False,
        ),  # a rank never arrived
        ("INTERNAL: something else", 1, False),
    ],
)
def test_only_a_gone_leader_seen_from_another_rank_is_let_pass(text, rank, gone):
    assert leaving.leader_gone(XlaRuntimeError(text), rank) is gone


def test_shutdown_lets_rank_1_leave_when_the_service_is_gone_and_says_so(monkeypatch, capsys):
    jax = pytest.importorskip("jax")
    from jax._src import distributed

    def gone():
        raise XlaRuntimeError(SOCKET_CLOSED)

    monkeypatch.setattr(jax.distributed, "shutdown", gone)
    monkeypatch.setattr(
        distributed.global_state, "client", object()
    )  # a client the exit handler would try again
    leaving.shutdown(1)
    assert distributed.global_state.client is None
    assert "rank 1: rank 0 had stopped the distributed runtime" in capsys.readouterr().err
    with pytest.raises(XlaRuntimeError, match="Socket closed"):
        leaving.shutdown(0)
