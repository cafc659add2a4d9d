"""The direct probe handing over to the operator (issue 23 item 7 follow-up).

An agent that started before the operator's first probe publishes the cards its binding
names as ``direct:<host:port>`` providers. Once the operator's state is there those
documents are withdrawn; the agent must then close every client it held for them and
never publish them again, not even when a call it placed there ends and asks for the
after-load re-probe. Real emulated GPU, real Ollama adapter, the embedded store.
"""

from __future__ import annotations

from collections.abc import Callable

from kubemoot.agent.direct import DirectProbe, direct_name
from kubemoot.agent.process import AfterCall, ProviderDirectory
from kubemoot.clock import SystemClock
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.store.documents import PROVIDER_STATE_BUCKET, ProviderState
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV

from .conftest import OllamaEmulator, publish_providers


class RecordedClient(OllamaProvider):
    """The real adapter; it remembers whether the agent closed it."""

    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


async def test_withdrawn_direct_providers_are_closed_and_never_republished(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpu = make_emulator()
    made: list[RecordedClient] = []

    def make(state: ProviderState) -> RecordedClient:
        client = RecordedClient(state.provider, state.endpoint)
        made.append(client)
        return client

    kv = MemoryKV(SystemClock())
    try:
        states = await kv.bucket(PROVIDER_STATE_BUCKET)
        directory = ProviderDirectory(states, make)
        prober = Prober([], clock=SystemClock(), publish=publish_to_kv(states))
        direct = DirectProbe([gpu.url], states=states, prober=prober, make_client=make)
        after_call = AfterCall(directory, direct, prober)
        name = direct_name(gpu.url)

        async def follow() -> None:
            """What the agent's discovery tick does with the shared state."""
            await directory.refresh()
            if await direct.step(directory.states):
                await directory.refresh()

        await follow()  # no operator yet: the agent probes the card itself
        assert set(directory) == {name} and direct.active
        held = [c for c in made if c.name == name]
        assert len(held) == 2  # the probe's own client and the directory's

        await publish_providers(kv, {"gpu-a": gpu})  # the operator's first probe
        await follow()
        assert set(directory) == {"gpu-a"} and not direct.active
        assert await states.get(encode_token(name)) is None
        assert all(c.closed for c in held), [(c.name, c.closed) for c in held]

        # A call placed on the direct provider before the hand-over ends now: its
        # after-load re-probe must not bring the withdrawn document back ...
        await after_call(name)
        await follow()  # ... nor the next discovery tick (the second time)
        assert await states.get(encode_token(name)) is None
        assert set(directory) == {"gpu-a"}

        # The hook still works for the operator's providers: it re-probes them.
        before = ProviderState.from_json((await states.get(encode_token("gpu-a"))).value)
        await after_call("gpu-a")
        after = ProviderState.from_json((await states.get(encode_token("gpu-a"))).value)
        assert (after.last_probed_at or 0) > (before.last_probed_at or 0)
    finally:
        await directory.close()
        await kv.close()
