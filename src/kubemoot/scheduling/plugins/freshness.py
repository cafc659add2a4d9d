"""Freshness: a probed provider status older than the policy's limit is STALE."""

from __future__ import annotations

from datetime import datetime
from typing import Self

from kubemoot.api import ModelProvider
from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement, rfc3339
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["FreshnessGate"]


class FreshnessGate:
    """Judges ``status.lastProbedAt`` against ``now``; no timestamp = declared by hand, PASS."""

    name = "Freshness"

    def __init__(self, *, now: datetime, max_age_seconds: int) -> None:
        self._now = now
        self._max_age = max_age_seconds
        # The verdict depends on the provider alone; many Models share one provider.
        # Keyed by identity; the entry keeps the provider alive so the id stays its own.
        self._by_provider: dict[int, tuple[ModelProvider, GateResult]] = {}

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(now=args.now, max_age_seconds=args.max_age_seconds)

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        provider = candidate.provider
        if provider is None:
            return Verdict.UNKNOWN
        status = provider.status
        if status is None or status.last_probed_at is None:
            return Verdict.PASS
        age = (self._now - status.last_probed_at).total_seconds()
        return Verdict.STALE if age > self._max_age else Verdict.PASS

    def check(self, candidate: Placement, /) -> GateResult:
        provider = candidate.provider
        if provider is None:
            return self._judge(candidate)
        found = self._by_provider.get(id(provider))
        if found is None:
            found = self._by_provider[id(provider)] = (provider, self._judge(candidate))
        return found[1]

    def _judge(self, candidate: Placement) -> GateResult:
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no status to judge")
        status = provider.status
        if status is None or status.last_probed_at is None:
            return GateResult.pass_(
                self.name,
                "status has no lastProbedAt: declared by hand, taken as is",
                field="status.lastProbedAt",
            )
        probed = rfc3339(status.last_probed_at)
        age = (self._now - status.last_probed_at).total_seconds()
        if age > self._max_age:
            return GateResult.stale(
                self.name,
                f"provider {provider.metadata.name} was last probed {age:.0f}s ago "
                f"(max {self._max_age}s)",
                observed_at=probed,
                field="status.lastProbedAt",
                ageSeconds=round(age, 3),
                maxAgeSeconds=self._max_age,
            )
        if age < 0:
            # A probe "from the future" (clock skew, or --now set before it) is no older
            # than the limit, so it passes; the text says so instead of "0s ago".
            reason = (
                f"probe time is {-age:.0f}s in the future relative to now; taken as "
                f"fresh (max {self._max_age}s)"
            )
        else:
            reason = f"probed {age:.0f}s ago (max {self._max_age}s)"
        return GateResult.pass_(
            self.name,
            reason,
            observed_at=probed,
            field="status.lastProbedAt",
            ageSeconds=round(age, 3),
            maxAgeSeconds=self._max_age,
        )
