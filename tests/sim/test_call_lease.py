"""The simulator's calls live the production call's life: leased, retried, recorded.

A simulated call longer than the ticket TTL keeps its ticket — and so its VRAM — for
as long as it computes, because the runtime's call service renews the lease on the
virtual clock; before the call service, the simulator took no lease and such a ticket
lapsed at the TTL, leaving a busy copy that looked idle to every planner.
"""

from __future__ import annotations

import asyncio
import random

from kubemoot.runtime.placement import CandidateModel
from kubemoot.settings import RuntimeSettings
from kubemoot.sim.gpu import EmulatedGpu
from kubemoot.sim.metrics import FINISHED
from kubemoot.sim.policies import SimContext
from kubemoot.sim.runtime_policy import KubemootPolicy
from kubemoot.sim.vloop import run_virtual
from kubemoot.sim.workload import CallSpec, Trace

TTL = 60.0
LONG = CallSpec(call_id=1, discussion_id=1, agent="crew/a", phase="mulling",
                candidates=(CandidateModel("m:7b", 50.0),), duration=10 * TTL, prompt_tokens=100)


def test_a_virtual_call_past_the_ttl_keeps_its_ticket_and_its_vram() -> None:
    async def main() -> tuple[list[float], str, int]:
        gpu = EmulatedGpu("gpu-a", vram_mib=16384, sizes_mib={"m:7b": 4096},
                          context_length=4096)
        ctx = SimContext(gpus={"gpu-a": gpu}, sizes={"m:7b": 4096},
                         trace=Trace(discussions=(), call_count=0), rng=random.Random(1))
        policy = KubemootPolicy(RuntimeSettings().with_values({"ticket_ttl_seconds": TTL}))
        await policy.start(ctx)
        runtime = policy.runtime
        assert runtime is not None
        records = []
        runtime.calls.on_record(records.append)
        try:
            call = asyncio.ensure_future(policy.run_call(LONG, ctx))
            held: list[float] = []
            for _ in range(5):  # at 2, 4, ... 10 TTLs into the call
                await asyncio.sleep(2 * TTL - (1.0 if not held else 0.0))
                if call.done():
                    break
                live = [t for t in await runtime.tickets.active("gpu-a")
                        if t.expires_at > runtime.clock.now()]
                held.append(sum(t.model_footprint_mib for t in live))
            outcome = await call
            return held, outcome.status, len(records)
        finally:
            await policy.stop()

    held, status, recorded = run_virtual(main())
    assert status == FINISHED
    assert len(held) >= 4 and all(mib > 0 for mib in held), held  # never lapsed
    assert recorded == 1  # the call service recorded it, as it does for every caller
