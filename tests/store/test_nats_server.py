"""The test server helper must not call a stolen port "up"."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from kubemoot.testing import nats_server
from kubemoot.testing.nats_server import NatsServer, NatsServerError

pytestmark = pytest.mark.nats  # every test here starts a real nats-server


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        yield int(squatter.getsockname()[1])


async def test_a_picked_port_that_was_taken_moves_to_a_fresh_one(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_port = nats_server.free_port
    picks = iter([taken_port])
    monkeypatch.setattr(nats_server, "free_port", lambda: next(picks, None) or real_free_port())
    server = NatsServer()
    assert server.port == taken_port
    try:
        await server.start()
        assert server.running
        assert server.port != taken_port
        await server.restart()  # a restart keeps the port it came up on
        assert server.running
    finally:
        await server.close()


async def test_a_requested_port_that_is_taken_fails_instead_of_moving(taken_port: int) -> None:
    server = NatsServer(port=taken_port)
    try:
        with pytest.raises(NatsServerError, match="exited at start"):
            await server.start()
        assert server.port == taken_port
        assert not server.running
    finally:
        await server.close()
