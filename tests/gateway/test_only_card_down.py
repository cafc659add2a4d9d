"""A model whose only big-enough card is down is refused at once, not waited for.

``big`` (8 GiB) is the one card that can hold medium:7b; ``small`` (4 GiB) lists the
model on its disk too, as an Ollama server does for everything it has pulled, but its
usable memory is smaller than the model. With ``big`` down, no card that answers could
ever run the call, so waiting for memory cannot help: the call gets the
``provider_unavailable`` 503 naming ``big``, at once (docs/gateway.md, Answers), not the
busy 503 after its whole wait budget (90 s by default) with a message that calls a
stopped card busy. A model ``small`` can hold still runs there, and the gateway's
probe keeps ``small`` ready.
"""

from __future__ import annotations

from collections.abc import Callable

import ollama
import openai
import pytest

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.gateway import GatewayServer, ProviderSource
from kubemoot.settings import GatewaySettings
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.waiting import wait_until
from tests.gateway.conftest import live_tickets

HELLO = [{"role": "user", "content": "hello"}]


async def test_the_only_card_that_fits_being_down_is_a_503_at_once(
        make_emulator: Callable[..., OllamaEmulator]) -> None:
    big = make_emulator()
    small = make_emulator(vram_mib=4096)
    providers = [
        ProviderSource("big", big.url, context_length=1024, num_parallel=2, reserve_mib=512,
                       total_vram_mib=8192),
        ProviderSource("small", small.url, context_length=1024, num_parallel=2,
                       reserve_mib=512, total_vram_mib=4096),
    ]
    # A busy answer would take the whole budget; the right one takes none of it.
    gateway = GatewayServer(MemoryKV(SystemClock()), providers=providers, port=0,
                            settings=GatewaySettings(wait_limit_seconds=10.0,
                                                     provider_probe_seconds=0.2))
    await gateway.start()
    try:
        client = ollama.AsyncClient(host=gateway.url)
        first = await client.chat(model="medium:7b", messages=HELLO)
        assert first.done
        big.stop()
        view = gateway.stack.view if gateway.stack is not None else None
        assert view is not None

        async def big_down() -> bool:
            view.invalidate("big")
            fleet = await view.snapshot()
            return any(p.name == "big" and not p.state.ready for p in fleet.providers)

        await wait_until(big_down, timeout=30, what="the probe finding big down")

        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model="medium:7b", messages=HELLO)
        assert refused.value.status_code == 503
        assert "big" in refused.value.error and "do not answer" in refused.value.error

        oai = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as again:
            await oai.chat.completions.create(model="medium:7b", messages=HELLO)  # type: ignore[arg-type]
        assert again.value.status_code == 503
        assert again.value.response.json()["error"]["code"] == "provider_unavailable"
        assert "Retry-After" in again.value.response.headers

        # the card that answers still serves what it can hold, and nothing is left held
        served = await client.chat(model="small:1b", messages=HELLO)
        assert served.done
        assert await live_tickets(gateway) == []
    finally:
        await gateway.stop()
