"""The VRAM gate sizes a model by its footprint observed on *any* provider (DESIGN §4).

Regressions from the schedule review: a footprint seen only on another provider was
ignored (VRAM UNKNOWN instead of PASS, declared instead of observed). Also the
freshness text for a probe time later than ``now``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.api import Model, ModelProvider
from kubemoot.gates import Verdict
from kubemoot.scheduling import ClusterSnapshot
from kubemoot.scheduling.candidate import Placement, fleet_footprints, footprint
from kubemoot.scheduling.plugins import FreshnessGate, VramGate
from kubemoot.testing.builders import agent, model, policy, rule

from .conftest import NOW, run

TOOLS = {"capability/tool-calling": "true"}


def card(
    name: str,
    total: int,
    *,
    loaded: dict[str, int] | None = None,
    footprints: dict[str, int] | None = None,
    max_parallel: int = 2,
    agent_count: int = 0,
) -> ModelProvider:
    """A provider reporting ``loaded`` in loadedModels and ``footprints`` on their own."""
    capacity: dict[str, Any] = {
        "vramTotalMiB": total,
        "maxParallel": max_parallel,
        "agentCount": agent_count,
        "loadedModels": [{"name": m, "sizeMiB": s} for m, s in (loaded or {}).items()],
        "loadedModelFootprints": dict(footprints or {}),
    }
    return ModelProvider.model_validate({
        "metadata": {"name": name},
        "spec": {"endpoint": f"http://{name}:11434"},
        "status": {"ready": True, "capacity": capacity},
    })


def _mulling(providers: list[ModelProvider], vram_mib: int | None = None) -> Any:
    """Schedule one tooler over the identifier ``m:1`` offered on providers pa and pb."""
    result = run(
        models=[
            model("m-on-a", model_id="m:1", provider="pa", vram_mib=vram_mib, labels=TOOLS),
            model("m-on-b", model_id="m:1", provider="pb", vram_mib=vram_mib, labels=TOOLS),
        ],
        providers=providers,
        agents=[agent("x", crew="a", capabilities=["tool-calling"])],
        policies=[policy("pol", crew_ref="a", rules=[rule("mulling", require=TOOLS)])],
    )
    return result.agents[0].phases["mulling"]


@pytest.mark.parametrize(
    ("name", "pa", "vram_mib", "outcome", "b_verdict", "b_footprint"),
    [
        # s37: pa is full of agents, pb has room; m:1 was seen at 4000 MiB only on pa.
        ("seen in loadedModels elsewhere", card("pa", 24576, loaded={"m:1": 4000},
         max_parallel=1, agent_count=4), None, "PLACE", Verdict.PASS, 4000),
        # s37b: the same sighting, from loadedModelFootprints alone.
        ("seen in loadedModelFootprints elsewhere", card("pa", 24576,
         footprints={"m:1": 4000}, max_parallel=1, agent_count=4), None, "PLACE",
         Verdict.PASS, 4000),
        # s38: observed 30000 on pa beats the declared 20000 on the 24 GiB pb.
        ("observed elsewhere beats declared", card("pa", 49152, loaded={"m:1": 30000},
         max_parallel=1, agent_count=4), 20000, "UNSCHEDULABLE", Verdict.FAIL, 30000),
        # Control: nothing observed anywhere and nothing declared stays UNKNOWN.
        ("never observed", card("pa", 24576, max_parallel=1, agent_count=4), None, "DEFER",
         Verdict.UNKNOWN, None),
    ],
)
def test_footprint_seen_on_another_provider_decides_vram(
    name: str, pa: ModelProvider, vram_mib: int | None, outcome: str,
    b_verdict: Verdict, b_footprint: int | None,
) -> None:
    phase = _mulling([pa, card("pb", 24576)], vram_mib)
    assert phase.outcome.value == outcome, name
    vram = phase.decision.to_dict()["gates"]["m-on-b"]["VRAM"]
    assert vram["result"] == b_verdict.value, name
    assert vram["evidence"].get("footprintMiB") == b_footprint, name
    if b_footprint is not None:
        assert vram["evidence"]["footprintSource"].startswith("ModelProvider pa "), name
    if outcome == "PLACE":
        assert phase.model == "m-on-b", name


def test_own_provider_observation_comes_before_the_fleet() -> None:
    pa = card("pa", 49152, loaded={"m:1": 9000})
    pb = card("pb", 24576, loaded={"m:1": 5000})
    snapshot = ClusterSnapshot.build(
        models=[model("m-on-b", model_id="m:1", provider="pb")], providers=[pa, pb]
    )
    (on_b,) = snapshot.placements
    assert footprint(on_b) == (5000, "status.capacity.loadedModels")
    # Without its own sighting it takes the fleet's (the larger of pa's and pb's).
    assert footprint(Placement(on_b.model, card("pb", 24576), on_b.seen_in_fleet))[0] == 9000


def test_disagreeing_sightings_take_the_largest() -> None:
    sightings = fleet_footprints([
        card("pa", 24576, loaded={"m:1": 4000}),
        card("pb", 24576, footprints={"m:1": 6000}),
        card("pc", 24576, loaded={"m:1": 5000}),
    ])
    assert sightings["m:1"].mib == 6000
    assert sightings["m:1"].source == "ModelProvider pb status.capacity.loadedModelFootprints"


def test_model_status_footprint_is_a_sighting_for_siblings() -> None:
    with_status = Model.model_validate({
        "metadata": {"name": "m-on-a"},
        "spec": {"model": "m:1", "providerRef": "pa"},
        "status": {"footprintMiB": 7000},
    })
    sightings = fleet_footprints([], [with_status])
    assert sightings["m:1"].mib == 7000
    assert sightings["m:1"].source == "Model m-on-a status.footprintMiB"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:1", "b:1"]), st.integers(1, 100_000)),
                min_size=1, max_size=8))
def test_fleet_footprint_is_the_largest_sighting(seen: list[tuple[str, int]]) -> None:
    providers = [card(f"p{i}", 200_000, loaded={m: mib}) for i, (m, mib) in enumerate(seen)]
    sightings = fleet_footprints(providers)
    for identifier in {m for m, _ in seen}:
        assert sightings[identifier].mib == max(mib for m, mib in seen if m == identifier)


def test_vram_gate_reads_the_sighting_from_the_placement() -> None:
    placement = ClusterSnapshot.build(
        models=[model("m-on-b", model_id="m:1", provider="pb")],
        providers=[card("pa", 24576, loaded={"m:1": 24000}), card("pb", 24576)],
    ).placements[0]
    result = VramGate(now=NOW, max_age_seconds=120).check(placement)
    assert result.result is Verdict.FAIL  # 24000 + 1024 > 24576


@pytest.mark.parametrize(
    ("probed_after_now", "reason", "age"),
    [
        (300, "probe time is 300s in the future relative to now", -300.0),
        (0, "probed 0s ago", 0.0),
        (-30, "probed 30s ago", 30.0),
    ],
)
def test_freshness_text_agrees_with_evidence(probed_after_now: int, reason: str,
                                             age: float) -> None:
    provider = ModelProvider.model_validate({
        "metadata": {"name": "pa"},
        "spec": {"endpoint": "http://pa:11434"},
        "status": {"ready": True,
                   "lastProbedAt": NOW + timedelta(seconds=probed_after_now)},
    })
    result = FreshnessGate(now=NOW, max_age_seconds=120).check(
        Placement(model("m-on-a", model_id="m:1", provider="pa"), provider)
    )
    assert result.result is Verdict.PASS
    assert result.reason.startswith(reason)
    assert result.evidence["ageSeconds"] == age
