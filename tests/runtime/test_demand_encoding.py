"""The demand board writes its entries as pydantic would, without pydantic's serializer."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kubemoot.clock import ManualClock
from kubemoot.runtime.demand import DemandBoard, _demand_json, _models_json, _selection_json
from kubemoot.store.documents import DemandEntry, SelectionEntry
from kubemoot.store.memory import MemoryKV

#: every float, the exponent forms and the non-finite ones included
_FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [1e-05, 1.5e-7, 1e16, 1.2345678901234568e17, 5e-324, -0.0, 0.1 + 0.2, 1733350000.125])
_NAMES = st.text(max_size=12) | st.sampled_from(["qwen3:8b", 'a"b', "c\\d", "\x01\x7f\u2028é😀"])


@given(expires=_FLOATS, count=_FLOATS, used=st.none() | _FLOATS)
def test_a_demand_entry_is_written_as_pydantic_writes_it(
    expires: float, count: float, used: float | None
) -> None:
    entry = DemandEntry(expires_at=expires, count=count, last_used_at=used)
    assert _demand_json(entry) == entry.to_json()


@given(expires=_FLOATS, frequency=_FLOATS, models=st.lists(_NAMES, max_size=4))
def test_a_selection_entry_is_written_as_pydantic_writes_it(
    expires: float, frequency: float, models: list[str]
) -> None:
    entry = SelectionEntry(expires_at=expires, models=models, frequency=frequency)
    assert _selection_json(entry, _models_json(entry.models)) == entry.to_json()


def test_every_field_is_written() -> None:
    # A field added to either document shows here: the hand-made text would lack it.
    assert _demand_json(DemandEntry(expires_at=1.0)) == DemandEntry(expires_at=1.0).to_json()
    assert set(DemandEntry.model_fields) == {"version", "expires_at", "count", "last_used_at"}
    assert set(SelectionEntry.model_fields) == {"version", "expires_at", "models", "frequency"}


async def test_the_board_writes_what_pydantic_would() -> None:
    clock = ManualClock(1733350000.25)
    bucket = await MemoryKV(clock=clock).bucket("demand")
    board = DemandBoard(bucket, clock=clock)
    await board.add_waiter("qwen3:8b", "crew/critic")
    await board.add_intent("qwen3:32b", "crew/critic")
    await board.record_use("qwen3:8b")
    clock.advance(7.5)
    await board.record_use("qwen3:8b")
    await board.record_selection("crew/critic", ["qwen3:8b", "qwen3:32b"], 0.25)
    # the same agent's models again (their JSON is kept), then others
    await board.record_selection("crew/critic", ["qwen3:8b", "qwen3:32b"], 0.5)
    await board.record_selection("crew/critic", ["qwen3:8b"], 0.5)
    keys = await bucket.keys()
    assert len(keys) == 4
    for key in keys:
        entry = await bucket.get(key)
        assert entry is not None
        kind = SelectionEntry if key.startswith("sel.") else DemandEntry
        assert kind.model_validate_json(entry.value).to_json() == entry.value
    written = await bucket.get(next(k for k in keys if k.startswith("sel.")))
    assert written is not None
    assert SelectionEntry.from_json(written.value).models == ["qwen3:8b"]
