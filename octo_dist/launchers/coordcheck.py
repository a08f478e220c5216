"""Is the coordinator address usable? Checked on every rank before ``jax.distributed.initialize``.

jaxlib 0.4.20/0.4.22 ends rank 0 with a segfault inside ``xla_extension.so`` (exit 139, no message) when the
coordination service cannot bind its port (already in use) or the coordinator host does not resolve. So, first:

* every rank: the host resolves (``[::1]`` and other IPv6 literals included);
* rank 0, which runs the service: the host is one of this machine's addresses (an address derived from a node
  list or mpirun's URI is a guess: refused when wrong; an address the user set only warns, since NAT or a
  port-forward can make it right), and the port is free on the wildcard address the service binds
  (``[::]:port``, as XLA's coordination service does).

No JAX, no MPI: sockets only, so the check is cheap and testable with a real process holding the port.
"""

from __future__ import annotations

import errno
import socket
from typing import Callable, List, Optional

from octo_dist.launchers.coordinator import SET_IT, Coordinator, CoordinatorError

Resolver = Callable[..., list]


def addresses(c: Coordinator, resolver: Resolver = socket.getaddrinfo) -> List[str]:
    """The IP addresses the coordinator host resolves to, or a CoordinatorError (found/expected/fix)."""
    try:
        infos = resolver(c.host, c.port, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise CoordinatorError(
            f"coordinator {c.address} ({c.source}): host {c.host!r} does not resolve here ({e}); expected a name in DNS "
            f"or /etc/hosts, or an IP address. Fix: {SET_IT}"
        ) from None
    return [info[4][0] for info in infos]


def is_local(ips: List[str]) -> bool:
    """Whether any of ``ips`` belongs to this machine: only a local address can be bound."""
    for ip in ips:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((ip, 0))
            return True
        except OSError:
            continue
    return False


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


def check(c: Coordinator, rank: int, resolver: Resolver = socket.getaddrinfo) -> Optional[str]:
    """Refuse an unusable coordinator before JAX sees it.

    Args:
      c: the agreed coordinator.
      rank: this process's rank; rank 0 also checks the host is its own and the port is free.
      resolver: ``socket.getaddrinfo`` (tests may pass another).

    Returns:
      A warning to log (an explicit address naming another host), or None.

    Raises:
      CoordinatorError: the host does not resolve; on rank 0, a derived host that is not this one, or a port in use.
    """
    ips = addresses(c, resolver)
    if rank != 0:
        return None
    here = socket.gethostname()
    if not is_local(ips):
        message = (
            f"coordinator {c.address} ({c.source}) resolves to {', '.join(sorted(set(ips)))}, none of them this "
            f"host's ({here}), but rank 0 runs the coordination service"
        )
        if c.explicit:
            return message + "; continuing since it was set explicitly (NAT or a port-forward?)"
        why = (
            "this host's name resolves to an address that is not its own (check /etc/hosts)"
            if c.source.startswith("mpi4py")
            else "the launcher placed rank 0 on another node than the list's first"
        )
        raise CoordinatorError(
            f"{message}: {why}; expected the coordinator host to be rank 0's. "
            f"Fix: {SET_IT}, e.g. COORDINATOR_ADDRESS={here}:{c.port}"
        )
    why = port_in_use(c.port)
    if why:
        raise CoordinatorError(
            f"coordinator {c.address} ({c.source}): port {c.port} cannot be listened on on {here} ({why}): another "
            f"job or a leftover process holds it; expected a free port. Fix: pick another port "
            f"(export COORDINATOR_ADDRESS={c.host if ':' not in c.host else '[' + c.host + ']'}:<free port>), or end "
            f"the process holding it (ss -ltnp 'sport = :{c.port}')"
        )
    return None
