"""Pure-runtime rules that a mutation run found unguarded, one table row or case each.

Each case below fails when its rule is broken one way (a comparison flipped, a term
dropped): the remaining load of a copy whose loader claimed no size, a queue that
costs nothing yet has no free slot, residents another ticket already plans to unload,
the ceiling a plan's victims raise, memory a resident model's calls do not load twice,
and held plans, which are no calls in flight.
"""

from __future__ import annotations

import pytest

from kubemoot.runtime import options
from kubemoot.runtime.cost import CostModel, OptionKind
from kubemoot.runtime.eviction import idle_residents
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.store.documents import TicketState
from kubemoot.testing.state import GIB, NOW, gpu, ticket


def _cost(p: ProviderSnapshot, declared: dict[str, int] | None = None) -> CostModel:
    return CostModel(FleetSnapshot.of(NOW, [p]), settings=RuntimeSettings(),
                     occupancy=OccupancyBook(declared=declared), demand=DemandSnapshot())


def test_a_loader_without_a_size_counts_the_models_known_load_time() -> None:
    # y (declared 12 GiB: a 12 s load) has been loading for 2 s by a ticket that
    # claimed no footprint: 10 s of load are left, not 0
    p = ProviderSnapshot(
        state=gpu("a", 24),
        tickets=(ticket("y", age=2, state=TicketState.LOADING, footprint_gib=0),),
    )
    cost = _cost(p, declared={"y": 12 * GIB})
    assert cost.remaining(p, "y") == pytest.approx(10.0)
    # joining it: the load's 10 s, then the loader's own call (the default 30 s) on the
    # one slot
    assert cost.copy_option(p, "y").seconds == pytest.approx(10.0 + 30.0)


def test_a_copy_with_every_slot_taken_is_a_queue_even_when_it_costs_nothing() -> None:
    # the one call in flight is overdue (30 s into a 20 s latency): it frees the slot
    # "now", so the queue costs 0 s; the slot is still taken, so it is a queue
    p = ProviderSnapshot(state=gpu("a", 24, residents={"m": 12}, slots=1),
                         tickets=(ticket("m", age=30),), latency_seconds=20)
    option = _cost(p).copy_option(p, "m")
    assert (option.kind, option.seconds) == (OptionKind.QUEUE, 0.0)


def test_a_resident_another_ticket_plans_to_unload_is_no_victim_twice() -> None:
    p = ProviderSnapshot(
        state=gpu("a", 32, residents={"x": 8, "z": 8, "busy": 4}),
        tickets=(ticket("busy", age=1),
                 ticket("y", state=TicketState.HELD, footprint_gib=8, evicts={"x": 8})),
    )
    assert idle_residents(p) == {"z": 8 * GIB}
    assert idle_residents(p, exclude="z") == {}


def test_the_ceiling_counts_the_victims_of_the_plan() -> None:
    # usable 31 GiB, 20 resident: 11 GiB were every ticket gone, 19 once x (8) leaves
    p = ProviderSnapshot(state=gpu("a", 32, residents={"x": 8, "z": 12}),
                         tickets=(ticket("q", footprint_gib=5, state=TicketState.LOADING),))
    assert p.ceiling_mib() == 11 * GIB
    assert p.ceiling_mib(["x"]) == 19 * GIB
    assert p.ceiling_mib(["x", "gone"]) == 19 * GIB  # only residents free memory


def test_calls_on_a_resident_model_load_nothing() -> None:
    # m is resident (12 GiB): its running call's footprint is the copy already counted
    p = ProviderSnapshot(state=gpu("a", 32, residents={"m": 12}),
                         tickets=(ticket("m", age=1, footprint_gib=12),))
    assert (p.loading_mib, p.free_mib) == (0, 19 * GIB)


async def test_a_held_plan_is_no_call_in_flight_for_the_estimate(make) -> None:
    # the only ticket on the card is a plan held for later: no call will end and free
    # anything, so nothing says when this call could start
    h = await make([gpu("a", 24, residents={"x": 20})], declared={"y": 12},
                   tickets={"a": [ticket("z", state=TicketState.HELD, footprint_gib=2)]},
                   latency={"a": 5})
    rnd = await h.planner.new_round(None)
    assert options.start_estimate(rnd, ["y"]) is None


def test_headroom_counts_a_victim_another_ticket_plans_once() -> None:
    # usable 20 GiB; x (10) resident; a ticket loads y (15) by unloading x. Until x
    # leaves, free is -5 GiB; x's 10 GiB are coming back, once, for everyone
    p = ProviderSnapshot(
        state=gpu("a", 21, residents={"x": 10}),
        tickets=(ticket("y", state=TicketState.LOADING, footprint_gib=15, evicts={"x": 10}),),
    )
    assert p.free_mib == -5 * GIB
    assert p.headroom_mib() == 5 * GIB
    assert p.headroom_mib(["x"]) == 5 * GIB  # planning the same victim adds nothing
