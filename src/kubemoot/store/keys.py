"""KV-safe key tokens.

NATS KV keys allow only a small alphabet, and ``.`` separates key segments. Every
character outside ``[A-Za-z0-9_-]`` becomes ``=XX`` (its UTF-8 bytes in upper-case
hex), so ``qwen3:32b`` → ``qwen3=3A32b`` and ``crew-a/kubectl-agent`` →
``crew-a=2Fkubectl-agent``. ``=`` itself is escaped, which makes the mapping reversible.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SAFE = re.compile(r"[A-Za-z0-9_-]")
_ESCAPE = re.compile(r"=([0-9A-F]{2})")


# Keys repeat endlessly (a few models and agents): both directions are cached.
@lru_cache(maxsize=65536)
def encode_token(text: str) -> str:
    """Encode any string as one KV-safe key segment (never empty: ``""`` → ``=``)."""
    if text == "":
        return "="
    out: list[str] = []
    for char in text:
        if _SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"={byte:02X}" for byte in char.encode("utf-8"))
    return "".join(out)


@lru_cache(maxsize=65536)
def decode_token(token: str) -> str:
    """Invert :func:`encode_token`; raises ``ValueError`` on a malformed token."""
    if token == "=":
        return ""
    raw = bytearray()
    i = 0
    while i < len(token):
        char = token[i]
        if char == "=":
            match = _ESCAPE.match(token, i)
            if match is None:
                raise ValueError(f"malformed escape at position {i} in key token {token!r}")
            raw.append(int(match.group(1), 16))
            i += 3
        elif _SAFE.fullmatch(char):
            raw.extend(char.encode("ascii"))
            i += 1
        else:
            raise ValueError(f"character {char!r} is not allowed in key token {token!r}")
    return raw.decode("utf-8")


def join_key(*segments: str) -> str:
    """A dotted key from raw segments, each encoded: ``wait.<model>.<agent>``."""
    return ".".join(encode_token(s) for s in segments)
