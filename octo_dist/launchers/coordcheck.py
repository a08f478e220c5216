"""Is the coordinator address usable? Checked on every rank before ``jax.distributed.initialize``.

jaxlib 0.4.20/0.4.22 ends rank 0 with a segfault inside ``xla_extension.so`` (exit 139, no message) when the
coordination service cannot bind its port (already in use) or the coordinator host does not resolve. So, first:

* every rank: the host resolves (``[::1]`` and other IPv6 literals included);
* rank 0, which runs the service: it listens on exactly the coordinator's address, as jax 0.4.20/0.4.22 do
  (``get_distributed_runtime_service(coordinator_address)``: gRPC logs "No address added out of total 1 resolved"
  and the process dies on signal 11 when none of the host's addresses is this machine's). So an address that is not
  rank 0's is refused, whether derived (a node list's first host that is not rank 0's) or set by the user (a NAT or
  port-forward address cannot work with these versions). The port must also be free on the wildcard address
  (``[::]:port``), which later jax versions bind.

No JAX, no MPI: sockets only, so the check is cheap and testable with a real process holding the port, and with an
address of another host (TEST-NET ``192.0.2.1``: only ever bound, never sent to).
"""

from __future__ import annotations

import errno
import socket
from typing import Callable, List, Optional, Tuple

from octo_dist.launchers.coordinator import SET_IT, Coordinator, CoordinatorError

Resolver = Callable[..., list]


def addresses(c: Coordinator, resolver: Resolver = socket.getaddrinfo) -> List[str]:
    """The IP addresses the coordinator host resolves to, or a CoordinatorError (found/expected/fix)."""
    try:
        infos = resolver(c.host, c.port, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise CoordinatorError(
            f"coordinator {c.address} ({c.source}): host {c.host!r} does not resolve here ({e}); "
            f"expected a name in DNS or /etc/hosts, or an IP address. Fix: {SET_IT}"
        ) from None
    return [info[4][0] for info in infos]


def listen_problem(ips: List[str], port: int) -> Optional[Tuple[int, str]]:
    """Try to listen on ``port`` at each of ``ips``, as the coordination service will: None when one of them works,
    else ``(errno, strerror)`` of the failure (EADDRNOTAVAIL: not this machine's; EADDRINUSE: the port is taken)."""
    failures = []
    for ip in ips:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
                s.listen(1)
                return None
            except OSError as e:
                failures.append((e.errno, e.strerror or str(e)))
    taken = [f for f in failures if f[0] in (errno.EADDRINUSE, errno.EACCES)]
    return (taken or failures or [(errno.EADDRNOTAVAIL, "no address")])[0]


def port_in_use(port: int) -> Optional[str]:
    """Why ``port`` cannot be listened on by the coordination service (``[::]:port``), or None when it is free."""
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        where = ("::", port)
    except OSError:  # no IPv6 on this machine: the service binds 0.0.0.0
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        where = ("0.0.0.0", port)
    with s:
        # SO_REUSEADDR lets a port whose last user is in TIME_WAIT count as free, as it is for the service;
        # a listening socket still refuses the bind.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(where)
            s.listen(1)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return e.strerror or str(e)
            raise
    return None


def check(c: Coordinator, rank: int, resolver: Resolver = socket.getaddrinfo) -> None:
    """Refuse an unusable coordinator before JAX sees it.

    Args:
      c: the agreed coordinator.
      rank: this process's rank; rank 0 also checks the host is its own and the port is free.
      resolver: ``socket.getaddrinfo`` (tests may pass another).

    Raises:
      CoordinatorError: the host does not resolve; on rank 0, an address that is not this host's (derived or
        explicit), or a port in use.
    """
    ips = addresses(c, resolver)
    if rank != 0:
        return None
    here = socket.gethostname()
    problem = listen_problem(ips, c.port)
    if problem is not None and problem[0] not in (errno.EADDRINUSE, errno.EACCES):
        if c.explicit:
            why = ", which listens on exactly that address (a NAT or port-forward address cannot work)"
            fix = (
                f"pass --coordinator {here}:{c.port}"
                if c.source == "--coordinator"
                else f"export {c.source}={here}:{c.port} for every rank (mpirun -x {c.source})"
            )
        else:
            why = ": " + (
                "this host's name resolves to an address that is not its own (check /etc/hosts)"
                if c.source.startswith("mpi4py")
                else "the launcher placed rank 0 on another node than the list's first"
            )
            fix = f"{SET_IT}, e.g. COORDINATOR_ADDRESS={here}:{c.port}"
        raise CoordinatorError(
            f"coordinator {c.address} ({c.source}) resolves to {', '.join(sorted(set(ips)))}, none of them this "
            f"host's ({here}: {problem[1]}), but rank 0 runs the coordination service{why}; expected the "
            f"coordinator host to be rank 0's. Fix: {fix}"
        )
    why = problem[1] if problem is not None else port_in_use(c.port)
    if why:
        raise CoordinatorError(
            f"coordinator {c.address} ({c.source}): port {c.port} cannot be listened on on {here} ({why}): another "
            f"job or a leftover process holds it; expected a free port. Fix: pick another port "
            f"(export COORDINATOR_ADDRESS={c.host if ':' not in c.host else '[' + c.host + ']'}:<free port>), or end "
            f"the process holding it (ss -ltnp 'sport = :{c.port}')"
        )
    return None
