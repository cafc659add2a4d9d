"""The one way a runtime site goes on past a shared-state fault: a log line and a count.

Some store errors must not stop a call (a demand-board write only informs other
planners; a watch that fails to close is being dropped anyway), but none may pass in
silence: every one is logged and counted in ``kubemoot_state_errors`` by site and kind,
so an operator sees a store that keeps failing instead of a runtime that quietly
plans on less than it should.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from kubemoot import metrics
from kubemoot.store.protocol import StoreError

__all__ = ["noted", "tolerated"]

log = logging.getLogger("kubemoot.runtime")

UNREADABLE = "unreadable"  # a document that does not parse
STORE = "store"  # the store did not do what was asked
CLEANUP = "cleanup"  # closing a watch or a task failed
BUG = "bug"  # our own code failed; the runtime went on without that step


def noted(site: str, kind: str, what: str, error: BaseException) -> None:
    """Log and count one fault the caller goes on past."""
    metrics.STATE_ERRORS.labels(site=site, kind=kind).inc()
    log.warning("%s: %s (%s)", what, error, type(error).__name__)


@contextlib.contextmanager
def tolerated(site: str, what: str) -> Iterator[None]:
    """Go on past a :class:`StoreError` in the block, with a log line and a count."""
    try:
        yield
    except StoreError as error:
        noted(site, STORE, what, error)
