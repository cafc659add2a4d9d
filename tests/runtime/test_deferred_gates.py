"""A warm placement's record keeps the gates of the copies it listed, worked out when read.

Most placements' records are never read, so the warm gates of the few copies a warm
call lists are kept as questions and answered when the record is built; the record
then says what working them out at once would have said.
"""

from __future__ import annotations

import pytest

from kubemoot.runtime import filters, options
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.testing.state import NOW, gpu
from tests.runtime.builders import harness


async def test_a_warm_records_gates_are_worked_out_when_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[tuple[str, str]] = []
    warm_gates = filters.warm_gates

    def counted(p: ProviderSnapshot, model: str, prompt: int | None) -> list[object]:
        asked.append((p.name, model))
        return warm_gates(p, model, prompt)  # type: ignore[return-value]

    monkeypatch.setattr(filters, "warm_gates", counted)
    # three warm copies with a slot each, and one full (its slot taken by another call)
    h = await harness([gpu(n, 24, residents={"m": 8}, slots=1) for n in ("a", "b", "c", "d")])
    busy = await h.place("m", holder="earlier")
    placement = await h.place("m", prompt=1000)
    assert placement.provider is not None and placement.provider != busy.provider
    assert asked == []  # nothing worked out yet
    record = placement.decision
    assert record is not None
    listed = [f"{p}/m" for p in ("a", "b", "c", "d") if p != busy.provider]
    assert sorted(asked) == [(cid.split("/")[0], "m") for cid in listed]
    assert set(record.candidates) == set(listed) and record.feasible == tuple(listed)
    fleet = await h.view.snapshot()  # the gates ask nothing a claim changes
    for cid, candidate in record.candidates.items():
        p = fleet.provider(cid.split("/")[0])
        assert p is not None and candidate.gates == tuple(warm_gates(p, "m", 1000))
    await h.close()


def test_the_gates_of_a_round_are_worked_out_once_read_and_keep_their_order() -> None:
    fleet = FleetSnapshot.of(NOW, [ProviderSnapshot(state=gpu(n, 24, residents={"m": 8}))
                                   for n in ("x", "y")])
    rnd = options.Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                           occupancy=OccupancyBook(), prompt_tokens=None)
    x, y = fleet.provider("x"), fleet.provider("y")
    assert x is not None and y is not None
    rnd.record_warm(y, "m")
    rnd.record("x", "m", [])
    rnd.record_warm(x, "n")
    assert list(rnd.gates) == ["y/m", "x/m", "x/n"]
    assert rnd.gates["y/m"] == filters.warm_gates(y, "m", None)
    assert rnd.gates["x/n"] == filters.warm_gates(x, "n", None)
