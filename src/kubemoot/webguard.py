"""Which browsers and host names may talk to one of our local web servers.

A web page the user opens can send requests to any address, loopback included; the
browser only keeps the page from *reading* the answer unless the server allows its
origin. Two tricks get around that: a "simple" request (a ``text/plain`` POST) is sent
without asking first (CSRF), and a page can point its own DNS name at 127.0.0.1 so the
browser thinks the server is the page's own origin (DNS rebinding). Ollama refuses both
with an origin allow list and a host check; so do the gateway and the dashboard:

* ``Host`` must be a loopback name, an IP address (nothing a page could rebind), the
  name the server was bound to, or a name the operator allowed;
* ``Origin``, when a browser sends one, must be a loopback origin or match a pattern
  the operator allowed (``*`` allows every origin).

Pure functions over header values; this module imports nothing else of ours.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_NAMES", "host_allowed", "host_name", "is_loopback", "origin_allowed"]

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


def host_name(header: str) -> str:
    """The host of a ``Host`` header, lower-case, without port or IPv6 brackets."""
    host = header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else ""
    name, _, _port = host.partition(":")
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(name: str) -> bool:
    """Whether ``name`` (a host name or address, no port) is this machine's loopback."""
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_allowed(header: str, *, allowed: Iterable[str] = ()) -> bool:
    """Whether a request's ``Host`` header names this server safely.

    ``allowed`` holds the extra names: the bound one and those the operator gave.
    """
    name = host_name(header)
    if not name:
        return False
    if is_loopback(name) or _is_address(name):
        return True  # an address, not a name: nothing a foreign page could rebind
    return name in {a.strip().lower().rstrip(".") for a in allowed}


def origin_allowed(origin: str, *, allowed: Iterable[str] = ()) -> bool:
    """Whether a browser request from ``origin`` may use this server.

    Loopback origins (any scheme, any port) always may; ``allowed`` holds patterns
    such as ``https://app.example.com`` or ``https://*.example.com`` (``*``: any).
    The opaque origin ``null`` (sandboxed frames, local files) is never loopback.
    """
    value = origin.strip().lower()
    for pattern in allowed:
        if fnmatch.fnmatchcase(value, pattern.strip().lower()):
            return True
    if value in ("", "null"):
        return False
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    return is_loopback(parts.hostname)
