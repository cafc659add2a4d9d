"""Which requests the adapter repeats on the same endpoint after a refused connection.

Only the probe's reads are: they change nothing, and a refusal during an engine restart
should not mark the provider down. An inference call is not: its refusal goes up with
``sent`` false, so the runtime can place the call once more elsewhere (DESIGN §5).
"""

from __future__ import annotations

import pytest

from kubemoot.clock import SystemClock
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderUnavailable


class CountingClock(SystemClock):
    """Counts the pauses the adapter takes between a refusal and its repeat."""

    def __init__(self) -> None:
        self.pauses = 0

    async def sleep(self, seconds: float) -> None:
        self.pauses += 1


async def test_a_refused_chat_is_not_repeated_on_the_same_endpoint(closed_port: int) -> None:
    clock = CountingClock()
    async with OllamaProvider("gpu", f"http://127.0.0.1:{closed_port}", timeout=1.0,
                              max_retries=1, clock=clock) as client:
        with pytest.raises(ProviderUnavailable) as caught:
            await client.chat("m", [{"role": "user", "content": "hi"}])
    assert caught.value.sent is False
    assert clock.pauses == 0


async def test_a_refused_probe_read_is_repeated_once(closed_port: int) -> None:
    clock = CountingClock()
    async with OllamaProvider("gpu", f"http://127.0.0.1:{closed_port}", timeout=1.0,
                              max_retries=1, clock=clock) as client:
        with pytest.raises(ProviderUnavailable):
            await client.probe()
    assert clock.pauses == 1  # /api/ps once more, then the refusal is final
