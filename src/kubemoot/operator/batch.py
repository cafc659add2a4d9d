"""The operator's Agents filed for a pass, kept from one batch to the next.

A change that concerns every Agent (a KubemootConfig, a provider or Model that every
crew may use) schedules them all in one pass. Filing 50,000 Agents costs about as much
as the pass itself (docs/performance.md, "Binding at ten times the scale"), and between
two such batches most Agents have not changed. :class:`KeptRoster` keeps one
:class:`~kubemoot.scheduling.roster.AgentRoster` and brings it up to the operator's view
by identity: the kopf index holds one parsed object per version of an Agent, so an
Agent that is the same object as last time is filed as it was.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubemoot.api import DEFAULT_NAMESPACE, Agent
from kubemoot.scheduling.roster import AgentRoster

__all__ = ["KeptRoster"]


class KeptRoster:
    """An :class:`AgentRoster` of every Agent the view held at the last full batch."""

    __slots__ = ("_filed", "roster")

    def __init__(self) -> None:
        self.roster = AgentRoster()
        #: The Agent object filed under each ``namespace/name``.
        self._filed: dict[str, Agent] = {}

    def file(self, agents: Mapping[str, Agent], batch: Mapping[str, Agent]) -> AgentRoster:
        """``batch`` (a part of ``agents``, both by ``namespace/name``) filed for a pass.

        When the batch is every Agent, the kept roster is brought up to ``agents``
        (an object not filed under its key, being new, edited or only its status written
        back, is put; a key gone is discarded) and returned. A smaller batch is filed
        afresh: it is as large as what a change concerns, not the cluster.
        """
        if len(batch) != len(agents):
            return AgentRoster(batch.values())
        filed, roster = self._filed, self.roster
        for key in [key for key in filed if key not in agents]:
            gone = filed.pop(key)
            roster.discard(gone.metadata.namespace or DEFAULT_NAMESPACE, gone.metadata.name)
        for key, agent in agents.items():
            if filed.get(key) is not agent:
                filed[key] = agent
                roster.put(agent)
        return roster
