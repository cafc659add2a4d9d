"""The call log's writer: one entry per finished call, each decision read once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from kubemoot.clock import ManualClock
from kubemoot.dashboard.calllog import CALL_LOG_BUCKET, CallEntry, CallLogWriter
from kubemoot.store.memory import MemoryKV


@dataclass
class _Record:
    """A call record whose decision counts its reads (the runtime's builds its summary
    on every read)."""

    agent: str = "gateway"
    thread_id: str = "t-1"
    phase: str = "chat"
    model: str | None = "qwen3:8b"
    provider: str | None = "gpu"
    action: str = "warm"
    waited_seconds: float = 0.25
    placement_seconds: float = 0.125
    evicted: tuple[str, ...] = ()
    started_at: float = 1000.0
    seconds: float = 1.5
    ok: bool = True
    failure_type: str | None = None
    reads: int = 0
    summary: dict[str, Any] = field(default_factory=lambda: {"action": "warm"})

    @property
    def decision(self) -> dict[str, Any]:
        self.reads += 1
        return self.summary


async def test_each_call_is_written_once_with_its_decision_read_once() -> None:
    kv = MemoryKV(ManualClock())
    writer = await CallLogWriter.open(kv)
    records = [_Record(thread_id=f"t-{n}") for n in range(3)]
    for record in records:
        writer.record(record)
    await writer.flush()
    assert [r.reads for r in records] == [1, 1, 1]
    bucket = await kv.bucket(CALL_LOG_BUCKET)
    entries = [CallEntry.from_json((await bucket.get(key)).value)  # type: ignore[union-attr]
               for key in sorted(await bucket.keys())]
    assert [e.thread_id for e in entries] == ["t-0", "t-1", "t-2"]
    assert all(e.decision == {"action": "warm"} for e in entries)
    assert entries[0].waited_seconds == 0.25 and entries[0].placement_seconds == 0.125
    await kv.close()


def _slow_entry(record: _Record) -> CallEntry:
    """The entry as the writer built it before it wrote documents directly."""
    return CallEntry(
        agent=record.agent, thread_id=record.thread_id, phase=record.phase,
        model=record.model, provider=record.provider, action=record.action,
        waited_seconds=record.waited_seconds, placement_seconds=record.placement_seconds,
        evicted=list(record.evicted), started_at=record.started_at, seconds=record.seconds,
        ok=record.ok, failure_type=record.failure_type, decision=record.summary)


async def _written(records: list[_Record]) -> list[bytes]:
    kv = MemoryKV(ManualClock())
    writer = await CallLogWriter.open(kv)
    for record in records:
        writer.record(record)
    await writer.flush()
    bucket = await kv.bucket(CALL_LOG_BUCKET)
    values = [(await bucket.get(key)).value  # type: ignore[union-attr]
              for key in sorted(await bucket.keys())]
    await kv.close()
    return values


async def test_an_entry_is_written_as_call_entry_writes_it_without_building_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    summary = {"action": "cold-load", "chosen": "gpu/qwen3:8b", "outcome": "placed",
               "reason": "cheapest", "victims": ["small:1b"],
               "options": [{"provider": "gpu", "model": "qwen3:8b", "kind": "cold-load",
                            "seconds": 2.0000001, "notes": [1e-7, 123456789.125]}],
               "failedGates": [{"candidate": "cpu/qwen3:8b", "gate": "memory",
                                "reason": "needs 5,120 MiB, 4,096 MiB free — ünïcode"}],
               "leftOut": {"options": 3}, "schedulerVersion": "kubemoot-runtime/0.1"}
    records = [
        _Record(thread_id="t-0", summary=summary, evicted=("small:1b",), ok=False,
                failure_type="timeout", waited_seconds=1e-6, started_at=1733342400.123456),
        _Record(thread_id="t-1", agent="ägent/with spaces", model=None, provider=None,
                seconds=float("inf")),
    ]
    expected = [_slow_entry(r).to_json() for r in records]
    built: list[object] = []
    original = CallEntry.__init__

    def counting(self: CallEntry, **fields: Any) -> None:
        built.append(fields)
        original(self, **fields)

    monkeypatch.setattr(CallEntry, "__init__", counting)
    assert sorted(await _written(records)) == sorted(expected)  # byte for byte
    assert built == []  # the runtime's typed fields need no model to be written


async def test_an_entry_the_fast_path_cannot_write_goes_through_call_entry() -> None:
    odd = _Record(thread_id="t-0", waited_seconds=1)  # an int where a float is typed
    bad = _Record(thread_id="t-1", action=None)  # type: ignore[arg-type]
    after = _Record(thread_id="t-2")
    values = await _written([odd, bad, after])
    assert values == [_slow_entry(odd).to_json(), _slow_entry(after).to_json()]
