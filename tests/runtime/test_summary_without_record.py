"""A placed call's summary (what the call log keeps of its decision) is read without
building the decision record, and says what the built record says.

The call log summarises every call it keeps; the record lists every option's id, score
and standing, which the summary does not read. So the planner hands the summary the
chosen option, the reason and the failed gates directly, and builds the record only
when something reads it whole (the dashboard, ``kubemoot ask -o json``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubemoot.gates.record import DecisionRecord
from kubemoot.gates.results import GateResult
from kubemoot.runtime import filters, planner
from kubemoot.runtime.placement import CallPlacement, CandidateModel
from kubemoot.runtime.record import call_decision
from kubemoot.runtime.snapshot import ProviderSnapshot
from kubemoot.testing.state import gpu
from tests.runtime.builders import Harness, harness


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[DecisionRecord]:
    built: list[DecisionRecord] = []
    build = planner.build_record

    def counted(**kwargs: object) -> DecisionRecord:
        built.append(build(**kwargs))  # type: ignore[arg-type]
        return built[-1]

    monkeypatch.setattr(planner, "build_record", counted)
    return built


async def _explained(h: Harness, model: str) -> CallPlacement:
    """A placement that judged every option (``kubemoot place`` asks for this)."""
    return await h.planner.place([CandidateModel(model)], holder_id="me",
                                 prompt_tokens=None, explain=True)


def _as_read_from_the_record(placement: CallPlacement) -> dict[str, object]:
    """The summary of the same placement with its record built first and handed over."""
    return call_decision(replace(placement, explanation=placement.decision))


async def test_a_cold_placements_summary_builds_no_record_and_matches_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _count_builds(monkeypatch)
    # "small" cannot hold m: its fit gate fails, and the summary lists that failure
    h = await harness([gpu("a", 24), gpu("small", 4), gpu("b", 24, residents={"n": 20})],
                      declared={"m": 8, "n": 20})
    placement = await _explained(h, "m")
    assert placement.provider == "a"

    summary = call_decision(placement)
    assert built == []  # the summary alone built no record
    assert summary["chosen"] == "a/m" and summary["outcome"] == "PLACE"
    assert any(f["candidate"] == "small/m" for f in summary["failedGates"])  # type: ignore[attr-defined]

    assert summary == _as_read_from_the_record(placement)
    assert len(built) == 1  # read whole, it is built (once)
    await h.close()


async def test_a_warm_placements_summary_works_out_its_gates_as_the_record_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built = _count_builds(monkeypatch)
    asked: list[str] = []
    warm_gates = filters.warm_gates

    def counted(p: ProviderSnapshot, model: str, prompt: int | None) -> list[GateResult]:
        asked.append(p.name)
        return warm_gates(p, model, prompt)

    monkeypatch.setattr(filters, "warm_gates", counted)
    # warm copies whose gates are kept as questions until read (one copy's slot is
    # taken), and one on a provider that is not ready: its gates are judged at once
    h = await harness([*(gpu(n, 24, residents={"m": 8}, slots=1) for n in ("a", "b", "c")),
                       gpu("down", 24, residents={"m": 8}, ready=False)])
    await h.place("m", holder="earlier")
    asked.clear()
    placement = await h.place("m", prompt=1000)
    assert asked == ["down"]
    read_first = call_decision(placement)
    assert built == [] and asked == ["down"]  # no record, no deferred gate worked out
    assert [(f["candidate"], f["gate"]) for f in read_first["failedGates"]] == [  # type: ignore[attr-defined]
        ("down/m", "ready")]
    record = placement.decision
    assert record is not None and len(built) == 1
    assert read_first == call_decision(placement) == _as_read_from_the_record(placement)
    assert read_first["chosen"] == record.chosen and read_first["reason"] == record.reason
    assert read_first["schedulerVersion"] == record.scheduler_version
    await h.close()


async def test_a_placement_that_waited_keeps_its_summary_and_its_record() -> None:
    h = await harness([gpu("a", 24), gpu("small", 4)], declared={"m": 8})
    placement = await h.place("m")
    waited = replace(placement, waited_seconds=1.5)
    assert call_decision(waited) == call_decision(placement)
    assert waited.decision is not None and placement.decision is not None
    assert waited.decision.to_dict() == placement.decision.to_dict()
    await h.close()
