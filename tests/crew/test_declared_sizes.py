"""An agent process sizes a cold load by the vramMib its Deployment's env declares.

The operator templates ``KUBEMOOT_MODEL_SIZES_MIB``; without it the process would size
a model no provider has loaded from its size on disk plus a cache estimate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable

from kubemoot.clock import SystemClock
from kubemoot.emulation.server import OllamaEmulator
from kubemoot.store.bus import MemoryBus
from kubemoot.store.documents import PROVIDER_TICKETS_BUCKET, ProviderTickets
from kubemoot.store.memory import MemoryKV
from kubemoot.store.protocol import Watch

from .conftest import binding, publish_providers, running_crew

QUESTION = "why does the ingress return 502 since the last deploy?"
#: Sizes neither the emulated engine reports (5120, 2048) nor the disk estimate gives.
DECLARED = {"qwen3:8b": 4999, "phi3:mini": 1999}


async def _loading_claims(watch: Watch, into: dict[str, set[int]]) -> None:
    """Every footprint a ticket claimed for a cold load (held, loading or running)."""
    async for change in watch:
        if change.value is None:
            continue
        for ticket in ProviderTickets.from_json(change.value).tickets:
            if ticket.model_footprint_mib > 0:  # 0: a call on a resident copy
                into.setdefault(ticket.model, set()).add(ticket.model_footprint_mib)


async def test_a_cold_load_is_claimed_at_the_declared_size(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    gpus = {"gpu-a": make_emulator()}
    kv, bus = MemoryKV(SystemClock()), MemoryBus()
    await publish_providers(kv, gpus)
    watch = (await kv.bucket(PROVIDER_TICKETS_BUCKET)).watch()
    claims: dict[str, set[int]] = {}
    collecting = asyncio.create_task(_loading_claims(watch, claims))
    env = {**binding(("qwen3:8b",), "phi3:mini"),
           "KUBEMOOT_MODEL_SIZES_MIB": json.dumps(DECLARED)}
    async with running_crew(kv, bus) as crew:
        await crew.start("coordinator", env, role="coordinator")
        await crew.start("kubectl-agent", env)
        reply = await crew.ask(QUESTION)
    await watch.aclose()
    with contextlib.suppress(asyncio.CancelledError):
        await collecting
    await bus.close()
    await kv.close()

    assert reply["answered"] is True, reply
    # Nothing was resident, so each model's first load was priced before the engine
    # could report a footprint: by the declaration, not the estimate.
    assert claims == {model: {mib} for model, mib in DECLARED.items()}, reply["calls"]
