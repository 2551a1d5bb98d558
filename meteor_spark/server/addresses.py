"""The address a member advertises to clients (they learn members' addresses from the member list)."""

from __future__ import annotations

import socket


def advertised_host(bind_host: str) -> str:
    """The address clients should use to reach a member bound to ``bind_host``.

    A wildcard bind (0.0.0.0, ::) is advertised as this machine's primary address, found by asking the kernel which
    source address it would use for an outside destination (no packet is sent).
    """
    if bind_host not in ("", "0.0.0.0", "::"):
        return bind_host
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
