"""How a runtime site goes on past a shared-state fault: a log line and a count.

Some store errors must not stop a call (a demand-board write only informs other
planners; a watch that fails to close is being dropped anyway), but none may pass in
silence: every one goes through :func:`kubemoot.metrics.survived`, the one helper behind
``kubemoot_errors_survived`` (component ``runtime``, the site as operation), so an
operator sees a store that keeps failing instead of a runtime that quietly plans on
less than it should.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from kubemoot import metrics
from kubemoot.store.protocol import StoreError

__all__ = ["noted", "tolerated"]

log = logging.getLogger("kubemoot.runtime")

UNREADABLE = metrics.UNREADABLE
STORE = metrics.STORE
CLEANUP = metrics.CLEANUP
BUG = metrics.BUG


def noted(site: str, kind: str, what: str, error: BaseException) -> None:
    """Log and count one fault a runtime site goes on past (component ``runtime``)."""
    metrics.survived("runtime", site, kind, what, error, logger=log)


@contextlib.contextmanager
def tolerated(site: str, what: str) -> Iterator[None]:
    """Go on past a :class:`StoreError` in the block, with a log line and a count."""
    try:
        yield
    except StoreError as error:
        noted(site, STORE, what, error)
