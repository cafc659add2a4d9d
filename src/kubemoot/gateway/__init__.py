"""The gateway: an Ollama- and OpenAI-compatible HTTP front door (DESIGN §9).

An adapter over the per-call runtime. Each inference request is one call placed by the
production :class:`~kubemoot.runtime.planner.CallPlanner` (through the capacity waiter,
with the same tickets and refusals as the agent runtime), forwarded to the chosen
provider, streamed back, and released when the reply ends or the client goes away.
Nothing inward imports this package.
"""

from __future__ import annotations

from kubemoot.gateway.server import GatewayServer, ProviderSource

__all__ = ["GatewayServer", "ProviderSource"]
