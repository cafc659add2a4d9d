"""Runtime requirements (``Model.spec.runtime``) and engine versions.

A requirement names an engine and version constraints, comma-separated:
``ollama>=0.6``, ``ollama>=0.6,<0.8``, ``ollama==0.6.2`` or just ``ollama`` (any
version). Versions compare as dotted whole numbers; a suffix after them (``-rc1``,
``+build``) is ignored, and missing parts count as 0 (``0.6`` = ``0.6.0``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["RuntimeRequirement", "parse_runtime", "parse_version"]

_ENGINE = re.compile(r"^\s*([a-z][a-z0-9_-]*)\s*(.*)$")
_CONSTRAINT = re.compile(r"^\s*(>=|<=|==|!=|>|<|=)\s*(\d+(?:\.\d+)*)\s*$")
_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")

Version = tuple[int, ...]


def parse_version(text: str) -> Version | None:
    """``"0.6.2"`` → ``(0, 6, 2)``; None when the text does not start with a version."""
    found = _VERSION.match(text)
    if found is None:
        return None
    return tuple(int(part) for part in found.group(1).split("."))


def _compare(left: Version, right: Version) -> int:
    width = max(len(left), len(right))
    a = left + (0,) * (width - len(left))
    b = right + (0,) * (width - len(right))
    return (a > b) - (a < b)


_OPS = {
    ">=": lambda c: c >= 0,
    "<=": lambda c: c <= 0,
    ">": lambda c: c > 0,
    "<": lambda c: c < 0,
    "==": lambda c: c == 0,
    "=": lambda c: c == 0,
    "!=": lambda c: c != 0,
}


@dataclass(frozen=True, slots=True)
class RuntimeRequirement:
    """An engine name and the version constraints it must meet."""

    engine: str
    constraints: tuple[tuple[str, Version], ...]
    text: str

    def admits(self, version: Version) -> bool:
        """Whether ``version`` meets every constraint."""
        return all(_OPS[op](_compare(version, bound)) for op, bound in self.constraints)


def parse_runtime(text: str) -> RuntimeRequirement:
    """Parse ``engine[op version[,op version]…]``; ``ValueError`` says what is wrong."""
    head = _ENGINE.match(text)
    if head is None:
        raise ValueError(f'"{text}" does not start with an engine name, e.g. ollama>=0.6')
    engine, rest = head.group(1), head.group(2).strip()
    constraints: list[tuple[str, Version]] = []
    if rest:
        for part in rest.split(","):
            found = _CONSTRAINT.match(part)
            if found is None:
                raise ValueError(
                    f'"{part.strip()}" in "{text}" is not a version constraint '
                    "(>=, >, <=, <, ==, != and a dotted version, e.g. >=0.6)"
                )
            constraints.append((found.group(1), parse_version(found.group(2)) or (0,)))
    return RuntimeRequirement(engine, tuple(constraints), text.strip())
