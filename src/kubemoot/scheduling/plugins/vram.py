"""VRAM: the Model's footprint plus the provider's reserve must fit the provider's card."""

from __future__ import annotations

from datetime import datetime
from typing import Self

from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement, footprint, stale_age
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["VramGate"]


class VramGate:
    """``footprint + reserveMiB ≤ vramTotalMiB``; an unknown footprint or total is UNKNOWN.

    An unknown total never proves a model too large (DESIGN §4), so it can defer a
    phase but never make it UNSCHEDULABLE.
    """

    name = "VRAM"

    def __init__(self, *, now: datetime, max_age_seconds: int) -> None:
        self._now = now
        self._max_age = max_age_seconds

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(now=args.now, max_age_seconds=args.max_age_seconds)

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        provider = candidate.provider
        if provider is None:
            return Verdict.UNKNOWN
        need = footprint(candidate)[0]
        capacity = provider.capacity
        total = None if capacity is None else capacity.vram_total_mib
        if need is None or total is None:
            return Verdict.UNKNOWN
        if need + provider.spec.reserve_mib <= total:
            return Verdict.PASS
        if stale_age(provider, self._now, self._max_age) is not None:
            return Verdict.STALE
        return Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no VRAM total")
        need, source = footprint(candidate)
        if need is None:
            return GateResult.unknown(
                self.name,
                f"footprint of {candidate.model_id} is unknown (not observed, no vramMib)",
                field="spec.vramMib",
            )
        capacity = provider.capacity
        total = None if capacity is None else capacity.vram_total_mib
        if total is None:
            return GateResult.unknown(
                self.name,
                f"provider {provider.metadata.name} has not reported vramTotalMiB",
                field="status.capacity.vramTotalMiB",
            )
        reserve = provider.spec.reserve_mib
        evidence = {
            "footprintMiB": need,
            "footprintSource": source,
            "reserveMiB": reserve,
            "vramTotalMiB": total,
        }
        if need + reserve <= total:
            return GateResult(
                self.name, Verdict.PASS, f"{need} + {reserve} reserve ≤ {total} MiB", evidence
            )
        reason = f"{need} + {reserve} reserve > {total} MiB"
        if stale_age(provider, self._now, self._max_age) is not None:
            return GateResult(self.name, Verdict.STALE, reason + " by a stale status", evidence)
        return GateResult(self.name, Verdict.FAIL, reason, evidence)
