"""The call log's writer: one entry per finished call, each decision read once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
