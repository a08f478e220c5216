"""The coordinator check before ``jax.distributed.initialize``: a real process holding the port, a host that does not
resolve, IPv6, and a derived address that is not rank 0's; and the check wired into start-up (rank 0 refuses in one
line where jaxlib would segfault)."""

import socket
import subprocess
import sys

import pytest

from helpers import REPO, clean_env

from octo_dist.launchers import coordcheck
from octo_dist.launchers.coordinator import Coordinator, CoordinatorError

HOLDER = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.fixture
def held_port():
    """A port another process listens on (127.0.0.1), for as long as the test runs."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_a_port_held_by_another_process_is_refused_on_rank_0(held_port):
    c = Coordinator(f"127.0.0.1:{held_port}", "all ranks on this node, port from the job id")
    with pytest.raises(CoordinatorError) as e:
        coordcheck.check(c, rank=0)
    message = str(e.value)
    assert (
        f"port {held_port} cannot be listened on" in message and "Address already in use" in message
    )
    assert "; expected a free port. Fix: pick another port" in message and "\n" not in message
    assert coordcheck.check(c, rank=1) is None  # only rank 0 listens


def test_a_free_port_passes_and_ipv6_loopback_resolves():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert coordcheck.check(Coordinator(f"127.0.0.1:{port}", "COORDINATOR_ADDRESS"), rank=0) is None
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    v6 = Coordinator(f"[::1]:{port}", "COORDINATOR_ADDRESS")
    assert coordcheck.addresses(v6) == ["::1"] and coordcheck.check(v6, rank=0) is None


def test_a_host_that_does_not_resolve_is_refused_on_every_rank():
    for rank in (0, 1):
        with pytest.raises(
            CoordinatorError,
            match=r"host 'no-such-node\.invalid' does not resolve here.*Fix: export",
        ):
            coordcheck.check(
                Coordinator("no-such-node.invalid:23456", "COORDINATOR_ADDRESS"), rank=rank
            )


def test_a_derived_host_that_is_not_rank_0s_is_refused_an_explicit_one_warns():
    other = "192.0.2.77:23456"  # TEST-NET-1: never an address of this machine
    refused = "none of them this host's.*placed rank 0 on another node.*expected the coordinator host to be rank 0's"
    with pytest.raises(CoordinatorError, match=refused):
        coordcheck.check(
            Coordinator(other, "first host of PBS_NODEFILE, port from the job id"), rank=0
        )
    assert "continuing since it was set explicitly" in coordcheck.check(
        Coordinator(other, "COORDINATOR_ADDRESS"), 0
    )
    assert (
        coordcheck.check(
            Coordinator(other, "first host of PBS_NODEFILE, port from the job id"), rank=1
        )
        is None
    )


START = (
    "from octo_dist.runtime import runtime\n"
    "from octo_dist.launchers.coordinator import CoordinatorError\n"
    "try:\n"
    "    runtime.initialize(use_mpi=False, timeout_s=60)\n"
    "except CoordinatorError as e:\n"
    "    print('refused:', e, flush=True)\n"
    "    raise SystemExit(3)\n"
)


def start(rank: int, address: str) -> subprocess.CompletedProcess:
    """One rank of a fabricated 2-rank Open MPI launch, starting the real runtime (jax imported, no mpirun)."""
    env = clean_env(
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
        COORDINATOR_ADDRESS=address,
        OCTO_DIST_NO_MPI4PY="1",
    )
    return subprocess.run(
        [sys.executable, "-c", START],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.slow
def test_start_up_refuses_a_port_in_use_before_jax_instead_of_segfaulting(held_port):
    proc = start(0, f"127.0.0.1:{held_port}")
    assert proc.returncode == 3, (
        proc.returncode,
        proc.stderr[-2000:],
    )  # not 139 (SIGSEGV in xla_extension.so)
    assert f"port {held_port} cannot be listened on" in proc.stdout


@pytest.mark.slow
def test_start_up_refuses_a_coordinator_that_does_not_resolve():
    proc = start(1, "no-such-node.invalid:23456")
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert "does not resolve here" in proc.stdout
