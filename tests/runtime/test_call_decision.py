"""The decision summary a call record carries: bounded, cheapest options first, with
the gates that ruled copies out."""

from __future__ import annotations

from kubemoot.gates import GateResult, Outcome
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.placement import Action, CallPlacement
from kubemoot.runtime.record import (
    CALL_DECISION_FAILURES,
    CALL_DECISION_OPTIONS,
    build_record,
    call_decision,
    option_id,
)
from kubemoot.runtime.refusals import GpuBusy
from kubemoot.testing.state import GIB, provider_state
from tests.runtime.builders import harness


def _placement(options: int, failed: int) -> CallPlacement:
    priced = [Option(OptionKind.COLD_LOAD, f"gpu-{i:02d}", "qwen3:8b", float(options - i))
              for i in range(options)]
    chosen = priced[-1]  # the cheapest
    gates = {option_id(o): [GateResult.pass_("vram", "fits")] for o in priced}
    for i in range(failed):
        gates[f"full-{i:02d}/qwen3:8b"] = [GateResult.pass_("ready", "up"), GateResult.fail(
            "fit", "not enough free VRAM beside the residents", residentMiB=7000)]
    record = build_record(subject="call", gates=gates, options=priced, chosen=chosen,
                          outcome=Outcome.PLACE, reason="cheapest")
    return CallPlacement(Action.UNLOAD, provider=chosen.provider, model=chosen.model,
                         evicted=("phi3:mini",), options=tuple(priced), explanation=record)


def test_a_small_decision_is_kept_whole() -> None:
    summary = call_decision(_placement(options=3, failed=1))

    assert summary["action"] == "unload" and summary["victims"] == ["phi3:mini"]
    assert summary["chosen"] == "gpu-02/qwen3:8b" and summary["outcome"] == "PLACE"
    assert [o["seconds"] for o in summary["options"]] == [1.0, 2.0, 3.0]
    assert summary["failedGates"] == [{"candidate": "full-00/qwen3:8b", "gate": "fit",
                                       "reason": "not enough free VRAM beside the residents"}]
    assert "leftOut" not in summary


def test_a_large_decision_keeps_the_cheapest_options_and_counts_what_it_cut() -> None:
    summary = call_decision(_placement(options=20, failed=11))

    assert len(summary["options"]) == CALL_DECISION_OPTIONS
    assert [o["seconds"] for o in summary["options"]] == [float(s) for s in range(1, 9)]
    assert len(summary["failedGates"]) == CALL_DECISION_FAILURES
    assert summary["leftOut"] == {"options": 20 - CALL_DECISION_OPTIONS,
                                  "failedGates": 11 - CALL_DECISION_FAILURES}


def test_a_placement_without_a_record_still_says_what_it_did() -> None:
    # a call that cannot wait took the static endpoint because every GPU was busy
    summary = call_decision(CallPlacement(Action.STATIC, provider="gpu-a", model="qwen3:8b",
                                          refusal=GpuBusy(waited=0.0, start_estimate=None)))

    assert summary["action"] == "static" and summary["chosen"] is None
    assert summary["options"] == [] and summary["failedGates"] == []
    assert summary["reason"] == "gpu-busy"


async def test_a_record_read_later_is_the_record_read_at_once() -> None:
    """A placed call's record is built on first read: read after the fleet moved on
    (more placements, a release), it says what it would have said at once."""
    fleet = [provider_state("gpu-a", usable_mib=20 * GIB, loaded={"m": 8 * GIB}),
             provider_state("gpu-b", usable_mib=20 * GIB)]
    at_once, later = await harness(fleet), await harness(fleet)
    first = await at_once.place("m", "n", holder="one")
    read_at_once = first.decision
    deferred = await later.place("m", "n", holder="one")
    second = await later.place("n", holder="two")  # the next call's round
    assert deferred.ticket is not None
    await later.tickets.release(deferred.provider or "", deferred.ticket.ticket_id)
    assert second.decision is not None
    assert read_at_once is not None and deferred.decision is not None
    assert deferred.decision.to_dict() == read_at_once.to_dict()
    assert deferred.decision is deferred.decision  # built once
    assert deferred.decision.outcome is Outcome.PLACE and deferred.decision.candidates
    assert call_decision(deferred) == call_decision(first)
    await at_once.close()
    await later.close()
