"""Bearer tokens: ``--api-keys FILE`` with one ``name: key`` a line.

The key's *name* is the caller's identity in the call log; the key itself is never
printed, logged or echoed in an error.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from kubemoot.api.errors import InputError
from kubemoot.gateway.errors import GatewayError

__all__ = ["ANONYMOUS", "ApiKeys", "load_api_keys"]

ANONYMOUS = "anonymous"


class ApiKeys:
    """The known keys; :meth:`caller` turns an ``Authorization`` header into a name."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._keys = [(name, key.encode("utf-8")) for name, key in keys.items()]

    def __len__(self) -> int:
        return len(self._keys)

    def caller(self, authorization: str | None) -> str:
        """The name of the key presented, or a 401 :class:`GatewayError`."""
        if not authorization:
            raise _unauthorized("this gateway needs an API key: send "
                                "'Authorization: Bearer <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized("the Authorization header must be 'Bearer <key>'")
        presented = token.strip().encode("utf-8")
        found: str | None = None
        for name, key in self._keys:  # compare with every key: no timing hint
            if hmac.compare_digest(presented, key):
                found = name
        if found is None:
            raise _unauthorized("the API key is not valid")
        return found


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"})


def load_api_keys(path: str | Path) -> ApiKeys:
    """Read ``name: key`` lines (``#`` comments and blank lines skipped).

    A malformed line is an :class:`InputError` naming the file and line, never the key.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read the API keys: {error}", file=where,
                         field="--api-keys") from None
    keys: dict[str, str] = {}
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, key = line.partition(":")
        name, key = name.strip(), key.strip()
        if not sep or not name or not key:
            raise InputError(f"line {number} is not 'name: key'", file=where,
                             field="--api-keys")
        if name in keys:
            raise InputError(f"line {number}: the name {name!r} appears twice", file=where,
                             field="--api-keys")
        if key in seen:
            raise InputError(f"line {number}: the key of {name!r} is also another "
                             "name's key", file=where, field="--api-keys")
        keys[name] = key
        seen.add(key)
    if not keys:
        raise InputError("the file holds no key", file=where, field="--api-keys")
    return ApiKeys(keys)
