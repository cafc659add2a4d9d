"""A ready file for exec probes, for a process that serves no HTTP (``kubemoot agent``).

A Pod's readiness and liveness probes need something to ask. The agent talks only to
NATS, so it says "I have joined my crew" by writing ``KUBEMOOT_READY_FILE`` (a path on a
writable volume; unset: nothing is written) and removes it when it starts and stops.
The probe is ``test -f PATH``. Removing it at start matters: an ``emptyDir`` outlives a
container restart, and the file of the previous run must not vouch for this one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV_READY_FILE", "clear_ready", "mark_ready"]

ENV_READY_FILE = "KUBEMOOT_READY_FILE"


def _path(env: Mapping[str, str]) -> Path | None:
    text = env.get(ENV_READY_FILE, "").strip()
    return Path(text) if text else None


def mark_ready(env: Mapping[str, str] = os.environ) -> None:
    """Write the ready file (atomically: a probe never reads half of it)."""
    path = _path(env)
    if path is None:
        return
    partial = path.with_name(path.name + ".partial")
    partial.write_text("ready\n", encoding="utf-8")
    partial.replace(path)


def clear_ready(env: Mapping[str, str] = os.environ) -> None:
    """Remove the ready file, if there is one."""
    path = _path(env)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
