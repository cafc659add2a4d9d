"""Server URLs as messages show them: the userinfo's secret replaced by ``***``.

A NATS URL may carry a password (``nats://user:password@host``) or a token in the user's
place (``nats://token@host``). Every message that names a server formats it through
:func:`mask_servers`, so the secret is hidden where the URL is written, not searched
for in the finished text afterwards (a search misses a secret written differently, and
blanks every other word that happens to equal it). Standard library only: the CLI
imports this without loading the NATS client.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["mask_servers", "mask_url"]

MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with its password (or a token in the user's place) shown as ``***``.

    Works on the text itself, so a URL too broken to parse (which an error message
    may well be about) is masked all the same.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # Everything up to the last @ is userinfo: a server URL has no path that could hold
    # one, and a password typed with an unescaped / ? # @ must not end it early.
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user, colon, _secret = userinfo.partition(":")
    # nats://TOKEN@host carries a token where a user name would be: hide it whole.
    shown = f"{user}:{MASK}" if colon else MASK
    return f"{scheme}{sep}{shown}@{host}"


def mask_servers(servers: Sequence[str]) -> str:
    """The server list for a message, comma-separated, each secret masked."""
    return ", ".join(mask_url(server) for server in servers)
