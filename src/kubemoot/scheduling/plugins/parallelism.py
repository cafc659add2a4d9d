"""Parallelism: one more agent must fit ``maxParallel × concurrencyFactor``.

Agents bound earlier in the same scheduling pass count toward the provider's
agentCount, as kube-scheduler's assumed pods count toward a node before the API
server has seen them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Self

from kubemoot.api import ModelProvider
from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement, stale_age
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["ParallelismGate", "agent_limit"]


def agent_limit(provider: ModelProvider, concurrency_factor: int) -> int | None:
    """How many agents the provider takes: maxParallel (else spec.numParallel) × factor."""
    capacity = provider.capacity
    slots = None if capacity is None else capacity.max_parallel
    if slots is None:
        slots = provider.spec.num_parallel
    return None if slots is None else slots * concurrency_factor


class ParallelismGate:
    """``agentCount + assumed + 1 ≤ limit``; an unknown maxParallel is UNKNOWN.

    A missing agentCount counts as 0: the operator keeps that count itself from its
    bindings, so its absence means no agents yet, not missing evidence.
    """

    name = "Parallelism"

    def __init__(
        self,
        *,
        now: datetime,
        max_age_seconds: int,
        concurrency_factor: int,
        assumed: Mapping[str, int],
    ) -> None:
        self._now = now
        self._max_age = max_age_seconds
        self._factor = concurrency_factor
        self._assumed = assumed

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls(
            now=args.now,
            max_age_seconds=args.max_age_seconds,
            concurrency_factor=args.settings.concurrency_factor,
            assumed=args.assumed,
        )

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        provider = candidate.provider
        limit = None if provider is None else agent_limit(provider, self._factor)
        if provider is None or limit is None:
            return Verdict.UNKNOWN
        capacity = provider.capacity
        reported = (None if capacity is None else capacity.agent_count) or 0
        if reported + self._assumed.get(provider.metadata.name, 0) + 1 <= limit:
            return Verdict.PASS
        if stale_age(provider, self._now, self._max_age) is not None:
            return Verdict.STALE
        return Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no parallelism")
        limit = agent_limit(provider, self._factor)
        if limit is None:
            return GateResult.unknown(
                self.name,
                f"provider {provider.metadata.name} reports no maxParallel",
                field="status.capacity.maxParallel",
            )
        capacity = provider.capacity
        reported = (None if capacity is None else capacity.agent_count) or 0
        assumed = self._assumed.get(provider.metadata.name, 0)
        evidence = {
            "agentCount": reported,
            "assumedInPass": assumed,
            "limit": limit,
            "concurrencyFactor": self._factor,
        }
        count = reported + assumed
        if count + 1 <= limit:
            return GateResult(self.name, Verdict.PASS, f"{count} + 1 ≤ {limit} agents", evidence)
        if stale_age(provider, self._now, self._max_age) is not None:
            # No counts in the text: the reason of a DEFER names this result and must not
            # change while the pass assumes bindings elsewhere.
            return GateResult(
                self.name, Verdict.STALE, "agent limit reached by a stale status", evidence
            )
        return GateResult(self.name, Verdict.FAIL, f"{count} + 1 > {limit} agents", evidence)
