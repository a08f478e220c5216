"""The coordinator check before ``jax.distributed.initialize``: a real process holding the port, a host that does not
resolve, IPv6, and a derived address that is not rank 0's; and the check wired into start-up (rank 0 refuses in one
line where jaxlib would segfault)."""

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, REPO, clean_env, run_mpirun, tail

from octo_dist.launchers import coordcheck, coordinator
from octo_dist.launchers.coordinator import PORT_BASE, PORT_SPAN, Coordinator, CoordinatorError

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
        proc.wait(timeout=HANG_S)


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


def test_a_free_port_is_below_the_ephemeral_range_and_a_held_one_is_passed_over():
    # The kernel gives outgoing connections their ports from the ephemeral range (32768-60999 by default): rank 0's
    # broadcast port from there can be taken before the coordination service listens on it.
    picked = [coordinator.free_port() for _ in range(32)]
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN <= 32768 for p in picked), picked
    with socket.socket() as held:
        for port in picked:  # the first still free (another test's job may have taken one since)
            try:
                held.bind(("", port))
                break
            except OSError:
                continue
        held.listen(1)
        other = coordinator.free_port()
        assert other != port
        assert coordinator.free_port(iter([port, other]).__next__) == other
        # Every pick held: the kernel's free port, never the held one.
        assert coordinator.free_port(lambda: port) not in (port, 0)


def test_a_free_port_passes_and_ipv6_loopback_resolves():
    port = coordinator.free_port()
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


def test_an_address_that_is_not_rank_0s_is_refused_derived_or_explicit():
    """jax 0.4.20/0.4.22 listen on exactly the coordinator's address: one not of this host segfaults rank 0 there,
    even one the user set (a NAT address cannot work). Rank 0 tries to listen on it first (192.0.2.77 is TEST-NET-1:
    never this machine's, and only bound here, never sent to)."""
    other = "192.0.2.77:23456"
    derived = "none of them this host's.*placed rank 0 on another node.*expected the coordinator host to be rank 0's"
    with pytest.raises(CoordinatorError, match=derived):
        coordcheck.check(
            Coordinator(other, "first host of PBS_NODEFILE, port from the job id"), rank=0
        )
    here = socket.gethostname()
    for source, fix in [
        ("--coordinator", f"Fix: pass --coordinator {here}:23456$"),
        ("COORDINATOR_ADDRESS", f"Fix: export COORDINATOR_ADDRESS={here}:23456 for every rank"),
    ]:
        with pytest.raises(CoordinatorError) as e:
            coordcheck.check(Coordinator(other, source), 0)
        message = str(e.value)
        assert message.startswith(
            f"coordinator {other} ({source}) resolves to 192.0.2.77, none of them this host's ({here}: "
        ), message
        assert "listens on exactly that address" in message and "\n" not in message
        assert re.search(fix, message), message
    for source in ("first host of PBS_NODEFILE, port from the job id", "COORDINATOR_ADDRESS"):
        assert coordcheck.check(Coordinator(other, source), rank=1) is None


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
        timeout=HANG_S,
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


# --- end to end: a real mpirun of 2 ranks, in a network namespace of its own ---------------------------------------

OTHER_HOST = "192.0.2.1:23456"  # TEST-NET-1: rank 0 only tries to listen on it; rank 1's connects stay in the netns
NETNS_MPIRUN = """#!/bin/sh
# mpirun in a new network namespace with only loopback up: nothing the ranks send can leave this machine.
exec unshare --net -- sh -c 'ip link set lo up || exit 97; exec "$@"' sh {mpirun} "$@"
"""


@pytest.fixture
def netns_mpirun(tmp_path):
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    if subprocess.run(["unshare", "--net", "--", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here (needs root or user namespaces)")
    exe = tmp_path / "netns-mpirun"
    exe.write_text(NETNS_MPIRUN.format(mpirun=mpirun))
    exe.chmod(0o755)
    return exe


OCTO_DIST = ["-m", "octo_dist"]


@pytest.mark.mpi
@pytest.mark.parametrize(
    "argv, env, fix",
    [
        (
            ["smoke", "--model", "tiny", "--steps", "3", "--coordinator", OTHER_HOST],
            {},
            "Fix: pass --coordinator ",
        ),
        (
            ["smoke", "--model", "tiny", "--steps", "3"],
            {"COORDINATOR_ADDRESS": OTHER_HOST},
            "Fix: export COORDINATOR_ADDRESS=",
        ),
        (
            ["check-env", "--launch", "--no-gpu", "--coordinator", OTHER_HOST],
            {},
            "Fix: pass --coordinator ",
        ),
    ],
    ids=["smoke-flag", "smoke-variable", "check-env-launch"],
)
def test_a_coordinator_that_is_not_rank_0s_host_is_refused_in_one_line_not_a_segfault(
    netns_mpirun, tmp_path, argv, env, fix
):
    """Before: rank 0 warned "continuing since it was set explicitly", gRPC logged "No address added out of total 1
    resolved" and rank 0 died on signal 11 (exit 139). Now rank 0 listens there first and refuses: exit 2."""
    proc = run_mpirun(
        netns_mpirun,
        2,
        [*OCTO_DIST, *argv, "--init-timeout", "60"],
        out_dir=tmp_path / "ranks",
        env=clean_env(**env),
    )
    out0, err0 = proc.ranks[0]
    assert proc.returncode == 2, (proc.returncode, tail(err0), tail(proc.stderr))
    lines = [ln for ln in err0.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err0, err0
    assert f"coordinator {OTHER_HOST} (" in lines[0] and "none of them this host's" in lines[0]
    assert "expected the coordinator host to be rank 0's" in lines[0] and fix in lines[0], lines[0]
