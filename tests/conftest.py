"""Markers that follow from what a test uses (pyproject declares them).

A test that takes one of the real-nats-server fixtures, or runs the store contract on
its ``nats`` side, needs a real nats-server: it is marked ``nats`` here, so a new test
is marked by the fixture it asks for and ``-m "not nats"`` leaves out all of them. A
test that takes the ``browser`` fixture is marked ``browser`` the same way.
tests/test_markers.py checks that no fixture or test starting either escapes this.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kubemoot.testing.nats_server import NatsServer

#: Fixtures that start or connect to a real nats-server.
NATS_FIXTURES = frozenset({"nats_url", "nats_kv", "own_server", "guarded_url", "nats",
                           "nats_server"})
#: Fixtures that start Chromium.
BROWSER_FIXTURES = frozenset({"browser"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        on_nats_store = callspec is not None and callspec.params.get("store") == "nats"
        if names & NATS_FIXTURES or on_nats_store:
            item.add_marker(pytest.mark.nats)
        if names & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)


@pytest.fixture
async def nats() -> AsyncIterator[NatsServer]:
    """A nats-server of the test's own on a free loopback port (a test may stop it)."""
    server = NatsServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()
