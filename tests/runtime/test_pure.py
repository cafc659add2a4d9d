"""Pure pieces: queue arithmetic, victims, occupancy, refusals, settings, circuit, latency."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.clock import ManualClock
from kubemoot.gates import Outcome, Standing
from kubemoot.runtime import filters
from kubemoot.runtime.circuit import CircuitBreakers, CircuitState
from kubemoot.runtime.cost import CostModel, Option, OptionKind
from kubemoot.runtime.eviction import EvictionPlanner
from kubemoot.runtime.latency import LatencyTracker
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.record import build_record
from kubemoot.runtime.refusals import (
    MemoryUnknown,
    ModelTooLarge,
    PromptTooLarge,
    ProviderDown,
    Reason,
    classify,
)
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ModelDemand, ProviderSnapshot
from kubemoot.settings import RuntimeSettings, SettingError, Settings
from kubemoot.store.documents import ProviderState, TicketState
from kubemoot.testing.state import NOW, gpu, ticket


def _cost(*providers: ProviderSnapshot, declared: dict[str, int] | None = None) -> CostModel:
    fleet = FleetSnapshot.of(NOW, list(providers))
    return CostModel(fleet, settings=RuntimeSettings(),
                     occupancy=OccupancyBook(declared=declared), demand=DemandSnapshot())


@pytest.mark.parametrize(
    ("ages", "slots", "latency", "expected"),
    [
        ([], 1, 20, 0.0),  # free slot
        ([5], 2, 20, 0.0),  # one of two slots busy
        ([5], 1, 20, 15.0),  # the spec's 15 s
        ([5, 0, 0, 0, 0], 1, 20, 95.0),  # the spec's 95 s
        ([30], 1, 20, 0.0),  # an overdue call frees "now"
        ([5, 10, 0], 2, 20, 10.0 + 1 * 20 / 2),  # soonest is 10 s, one call beyond 2 slots
    ],
)
def test_queue_seconds(ages: list[float], slots: int, latency: float, expected: float) -> None:
    p = ProviderSnapshot(
        state=gpu("p", 24, residents={"m": 12}, slots=slots),
        tickets=tuple(ticket("m", age=a, ident=f"t{i}") for i, a in enumerate(ages)),
        latency_seconds=latency,
    )
    assert _cost(p).queue(p, "m") == pytest.approx(expected, abs=1e-9)


def test_usable_resident_and_free_count_loading_tickets() -> None:
    p = ProviderSnapshot(
        state=gpu("p", 32, residents={"a": 10}),
        tickets=(ticket("b", footprint_gib=6, state=TicketState.LOADING),),
    )
    assert p.usable_mib == 31 * 1024
    assert p.resident_total + p.loading_mib == 16 * 1024
    assert p.free_mib == 15 * 1024


def test_unknown_total_has_no_usable() -> None:
    p = ProviderSnapshot(state=gpu("p", None))
    assert p.usable_mib is None


@pytest.mark.parametrize(
    ("needs", "expected"),
    [
        ({"x": ModelDemand(last_used_at=10.0), "y": ModelDemand(last_used_at=5.0)}, ("y",)),
        ({"x": ModelDemand(recent_use=1.0), "y": ModelDemand(prediction=2.0)}, ("x",)),
        ({"x": ModelDemand(intents=1), "y": ModelDemand(recent_use=9.0)}, ("y",)),
        ({"x": ModelDemand(waiters=1), "y": ModelDemand(intents=3)}, ("y",)),
        ({"x": ModelDemand(), "y": ModelDemand()}, ("x",)),  # full tie: by name
    ],
)
def test_least_needed_first(needs: dict[str, ModelDemand], expected: tuple[str, ...]) -> None:
    planner = EvictionPlanner(DemandSnapshot(needs))
    assert planner.choose_victims({"x": 8, "y": 8}, 8) == expected


def test_no_victims_make_room() -> None:
    assert EvictionPlanner(DemandSnapshot()).choose_victims({"x": 4, "y": 4}, 9) is None
    assert EvictionPlanner(DemandSnapshot()).choose_victims({}, 0) == ()


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 40), max_size=8),
    needed=st.integers(1, 120),
)
def test_victims_are_always_the_fewest_that_make_room(
    sizes: dict[str, int], needed: int
) -> None:
    chosen = EvictionPlanner(DemandSnapshot()).choose_victims(sizes, needed)
    ordered = sorted(sizes.values(), reverse=True)
    if sum(ordered) < needed:
        assert chosen is None
        return
    assert chosen is not None
    assert sum(sizes[m] for m in chosen) >= needed
    fewest = next(k for k in range(1, len(ordered) + 1) if sum(ordered[:k]) >= needed)
    assert len(chosen) == fewest


def test_occupancy_prefers_observed_then_declared_then_estimate() -> None:
    settings_ = RuntimeSettings(kv_bytes_per_token=1024 * 1024)  # 1 MiB per token: easy sums
    book = OccupancyBook(settings=settings_, declared={"d": 5000})
    state = gpu("p", 24, residents={"seen": 7}, context=100, slots=2)
    state.disk_sizes_mib = {"fresh": 3000, "d": 1}
    fleet = FleetSnapshot.of(NOW, [ProviderSnapshot(state=state)])
    assert book.occupancy("seen", fleet) == 7 * 1024
    assert book.occupancy("d", fleet) == 5000
    assert book.occupancy("fresh", fleet) == 3000 + 100 * 2
    assert book.occupancy("nobody-knows", fleet) is None
    # The first observation is kept when another provider later reports another size.
    later = gpu("q", 24, residents={"seen": 9})
    fleet2 = FleetSnapshot.of(NOW, [ProviderSnapshot(state=later)])
    assert book.occupancy("seen", fleet2) == 7 * 1024


def _fleet(*states: ProviderState) -> tuple[FleetSnapshot, CostModel]:
    providers = [ProviderSnapshot(state=s) for s in states]
    cost = _cost(*providers, declared={"m": 20 * 1024, "small": 4 * 1024})
    return cost.fleet, cost


@pytest.mark.parametrize(
    ("states", "prompt", "reason"),
    [
        ((gpu("a", 16), gpu("b", 12)), None, Reason.MODEL_TOO_LARGE),
        # an unknown total never proves a model too large; when such cards are the only
        # ones that might load it, its memory is unknown (not busy: waiting cannot help)
        ((gpu("a", 16), gpu("b", None)), None, Reason.MEMORY_UNKNOWN),
        ((gpu("a", None), gpu("b", None)), None, Reason.MEMORY_UNKNOWN),
        # a card of unknown memory that holds a copy can take the call: busy
        ((gpu("a", None, residents={"m": 20}),), None, Reason.GPU_BUSY),
        # a known card that could hold it: busy, whatever the unknown one
        ((gpu("a", 32, residents={"small": 20}), gpu("b", None)), None, Reason.GPU_BUSY),
        # the only provider does not answer: down, never unknown
        ((gpu("a", 32, ready=False),), None, Reason.PROVIDER_DOWN),
        # the one card big enough does not answer and the card that does is too small
        # for the model: down (waiting for memory cannot help), not busy
        ((gpu("a", 32, ready=False), gpu("b", 12)), None, Reason.PROVIDER_DOWN),
        # every card, the one down included, is too small: too large, not down
        ((gpu("a", 16, ready=False), gpu("b", 12)), None, Reason.MODEL_TOO_LARGE),
        # a ready card that could hold it: busy, whatever the one down
        ((gpu("a", 32, ready=False), gpu("b", 24)), None, Reason.GPU_BUSY),
        ((), None, Reason.GPU_BUSY),
        ((gpu("a", 32, context=4096),), 8000, Reason.PROMPT_TOO_LARGE),
        # an unknown context admits the prompt
        ((gpu("a", 32, context=4096), gpu("b", 32)), 8000, Reason.GPU_BUSY),
        ((gpu("a", 32, context=8192),), 8000, Reason.GPU_BUSY),
        # a card too small for the model does not count for the prompt question
        ((gpu("a", 32, context=4096), gpu("b", 8, context=65536)), 8000,
         Reason.PROMPT_TOO_LARGE),
    ],
)
def test_refusal_classes(
    states: tuple[ProviderState, ...], prompt: int | None, reason: Reason
) -> None:
    fleet, cost = _fleet(*states)
    refusal = classify(fleet, cost, preferred="m", acceptable=["m"], prompt_tokens=prompt)
    assert refusal.reason is reason


def test_a_directly_probed_card_of_unknown_memory_waits_for_the_operator() -> None:
    # The spec's fallback: an agent probes its endpoints itself while the operator has
    # published nothing; such a card's total is not known *yet*, so the call waits (the
    # operator's state wakes it) instead of being refused as memory-unknown.
    provisional = gpu("direct:b", None).model_copy(update={"provisional": True})
    fleet, cost = _fleet(gpu("a", 16), provisional)
    refusal = classify(fleet, cost, preferred="m", acceptable=["m"], prompt_tokens=None)
    assert refusal.reason is Reason.GPU_BUSY


def test_refusals_carry_the_facts_that_prove_them() -> None:
    fleet, cost = _fleet(gpu("a", 16), gpu("b", 12))
    too_large = classify(fleet, cost, preferred="m", acceptable=["m"], prompt_tokens=None)
    assert too_large == ModelTooLarge(need_mib=20 * 1024, largest_usable_mib=15 * 1024,
                                      largest_provider="a")  # 16 GiB less 1 GiB reserve
    fleet, cost = _fleet(gpu("a", 32, context=4096))
    assert classify(fleet, cost, preferred="m", acceptable=["m"],
                    prompt_tokens=8000) == PromptTooLarge(tokens=8000, largest_context=4096)
    fleet, cost = _fleet(gpu("a", 16), gpu("c", None), gpu("b", None))
    assert classify(fleet, cost, preferred="m", acceptable=["m"],
                    prompt_tokens=None) == MemoryUnknown(providers=("b", "c"))
    fleet, cost = _fleet(gpu("a", 32, ready=False), gpu("b", 32, ready=False))
    assert classify(fleet, cost, preferred="m", acceptable=["m"],
                    prompt_tokens=None) == ProviderDown(providers=("a", "b"))


def test_prompt_fits_an_acceptable_candidate_with_a_larger_context() -> None:
    state = gpu("a", 32, context=4096, residents={"small": 4}, resident_context={"small": 32768})
    fleet, cost = _fleet(state)
    got = classify(fleet, cost, preferred="m", acceptable=["m", "small"], prompt_tokens=8000)
    assert got.reason is Reason.GPU_BUSY


@pytest.mark.parametrize(
    ("env", "tolerance", "limit"),
    [
        ({}, 10.0, 90.0),
        ({"KUBEMOOT_MODEL_CANDIDATE_TOLERANCE": "0"}, 0.0, 90.0),
        ({"KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS": "40"}, 10.0, 40.0),
        ({"KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS": "40",
          "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "15"}, 10.0, 15.0),
    ],
)
def test_settings_from_env(env: dict[str, str], tolerance: float, limit: float) -> None:
    s = Settings.from_env(env).runtime
    assert (s.candidate_tolerance, s.gpu_wait_limit_seconds) == (tolerance, limit)
    assert (s.load_rate_mibps, s.unload_seconds, s.default_latency_seconds) == (1024, 1, 30)
    assert (s.reserve_mib, s.ticket_ttl_seconds, s.state_cache_seconds) == (1024, 180, 0.2)


@pytest.mark.parametrize("bad", ["ten", "-1"])
def test_bad_setting_is_a_setting_error(bad: str) -> None:
    with pytest.raises(SettingError, match="KUBEMOOT_MODEL_CANDIDATE_TOLERANCE"):
        Settings.from_env({"KUBEMOOT_MODEL_CANDIDATE_TOLERANCE": bad})


def test_circuit_opens_after_threshold_and_half_opens_after_cooldown() -> None:
    clock = ManualClock(0.0)
    breakers = CircuitBreakers(clock=clock, threshold=2, cooldown_seconds=30)
    breakers.record_failure("p")
    assert breakers.allows("p")
    breakers.record_failure("p")
    assert breakers.state("p") is CircuitState.OPEN and not breakers.allows("p")
    clock.advance(30)
    assert breakers.state("p") is CircuitState.HALF_OPEN and breakers.allows("p")
    breakers.record_failure("p")  # the trial failed: open again
    assert breakers.state("p") is CircuitState.OPEN
    clock.advance(30)
    breakers.record_success("p")
    assert breakers.state("p") is CircuitState.CLOSED


def test_latency_ema_starts_at_the_default() -> None:
    tracker = LatencyTracker(alpha=0.5, default_seconds=30)
    assert tracker.latency("e") == 30
    assert tracker.observe("e", 10) == 10
    assert tracker.observe("e", 20) == 15


@pytest.mark.parametrize(
    ("context", "where"),
    [
        pytest.param(None, Standing.FEASIBLE, id="unknown-context-admits"),
        pytest.param(8192, Standing.FEASIBLE, id="context-holds"),
        pytest.param(4096, Standing.HARD_FAILED, id="context-too-small"),
    ],
)
def test_the_record_takes_standing_from_the_gates_rule(
    context: int | None, where: Standing
) -> None:
    p = ProviderSnapshot(state=gpu("a", 32, residents={"m": 12}, context=context))
    gates = filters.warm_gates(p, "m", 8000)
    option = Option(OptionKind.WARM, "a", "m", 0.0)
    record = build_record(
        subject="call", gates={"a/m": gates}, options=[option], chosen=option,
        outcome=Outcome.PLACE, reason="test",
    )
    assert record.candidates["a/m"].standing is where
    assert filters.feasible(gates) is (where is Standing.FEASIBLE)
    context_result = record.candidates["a/m"].gate(filters.CONTEXT)
    assert context_result is not None
    assert context_result.admits_unknown is (context is None)


@pytest.mark.parametrize("module", ["options", "cost", "snapshot", "eviction", "filters"])
def test_pricing_modules_never_wait(module: str) -> None:
    # Pricing is one pure pass over values (the import contract keeps the store, the
    # tickets and the clock out); nothing in it may await, so it cannot do I/O either.
    import ast
    import importlib
    import inspect

    tree = ast.parse(inspect.getsource(importlib.import_module(f"kubemoot.runtime.{module}")))
    waiting = [type(node).__name__ for node in ast.walk(tree)
               if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith)]
    assert waiting == [], module
