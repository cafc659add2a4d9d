"""The waiter's copy of a placement with its wait: the same as ``dataclasses.replace``."""

from __future__ import annotations

import dataclasses

from kubemoot.gates.record import DecisionRecord
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.placement import Action, CallPlacement
from kubemoot.runtime.refusals import GpuBusy
from kubemoot.runtime.waiting import _waited
from kubemoot.testing.state import ticket


def test_the_copy_with_its_wait_keeps_every_field_but_the_wait() -> None:
    def explanation() -> DecisionRecord:
        raise AssertionError("not read here")

    option = Option(OptionKind.WARM, "gpu-a", "qwen3:8b", 0.5)
    placed = CallPlacement(
        Action.UNLOAD, provider="gpu-a", endpoint="http://a", model="qwen3:8b",
        ticket=ticket("qwen3:8b", footprint_mib=5000), evicted=("old:1b",),
        refusal=GpuBusy(waited=1.0),
        options=(option,), explanation=explanation, waited_seconds=0.0, context_length=8192,
    )
    # a default anywhere would hide a field the copy forgot
    defaults = {f.name for f in dataclasses.fields(CallPlacement)
                if f.init and getattr(placed, f.name) == f.default}
    assert defaults == {"waited_seconds"}
    copied, expected = _waited(placed, 2.5), dataclasses.replace(placed, waited_seconds=2.5)
    for f in dataclasses.fields(CallPlacement):
        assert getattr(copied, f.name) is getattr(expected, f.name) or (
            getattr(copied, f.name) == getattr(expected, f.name)), f.name
    assert copied.waited_seconds == 2.5
