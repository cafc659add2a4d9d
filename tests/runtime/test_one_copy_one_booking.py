"""Calls priced on one state that all cold-load one model on one card book it once.

Calls placed in the same instant price on the same fleet state (the state cache, or a
burst issued at once), so each sees the card without a copy of the model and prices a
cold load there. The engine loads one copy; each granted claim would book the model's
whole footprint again until it is resident, and the card would look full to every
other model meanwhile (homelab cut: three `qwen3:8b` calls at 0 s booked 18 GiB of the
24 GiB card for one 6 GiB copy, so the `qwen3:14b` its band needed could not load
beside it). A cold load's claim is refused where the model already has a copy, and the
call, priced again, joins the copy that is coming.
"""

from __future__ import annotations

from kubemoot.runtime.placement import Action
from kubemoot.testing.state import GIB, gpu


async def test_a_second_cold_load_of_a_coming_copy_joins_it_and_books_nothing(make) -> None:
    first = await make([gpu("a", 48, slots=4)], declared={"m": 10})
    second = await make([gpu("a", 48, slots=4)], declared={"m": 10}, kv=first.kv, clock=first.clock)
    await second.view.snapshot()  # read before the first claim: priced on that state
    one = await first.place("m", holder="first")
    assert (one.action, one.provider) == (Action.COLD_LOAD, "a")
    two = await second.place("m", holder="second")
    assert (two.action, two.provider) == (Action.LOADING, "a"), two.reason
    booked = sum(t.model_footprint_mib for t in await first.active("a"))
    assert booked == 10 * GIB  # MiB: the footprint of the one copy
