"""The Agents of a snapshot, grouped by what decides their binding, in pass order.

A pass binds Agents in (namespace, name) order, and within one pass an Agent's phases
depend on nothing of its own but its namespace, its crew label (which policy governs
it) and its capabilities (its effective bias under that policy); see
:mod:`kubemoot.scheduling.group`. The roster files each Agent under its namespace and
name with its crew label; a namespace's :class:`Segment` says which crews it holds and,
when a pass needs them, its Agents in name order and their capabilities. A pass then
groups a namespace's Agents by what they bind with and walks the groups and counts
instead of the Agents (:meth:`SchedulingPass.schedule_all`); a namespace whose Agents
all bind alike is not even sorted.

The roster is built once from a bundle (``kubemoot schedule``), or kept by whoever
holds Agents between passes and told of each change (:meth:`AgentRoster.put`,
:meth:`AgentRoster.discard`): a change re-files only its own namespace, and only when
the namespace is next read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from operator import attrgetter, methodcaller

from kubemoot.api import CREW_LABEL, DEFAULT_NAMESPACE, Agent

__all__ = ["AgentRoster", "Segment"]

_LABELS = attrgetter("metadata.labels")
_CREW = methodcaller("get", CREW_LABEL)
_CAPABILITIES = attrgetter("spec.capabilities")


def _crews(agents: Iterable[Agent]) -> Iterator[str | None]:
    """Each Agent's crew label, read by ``map`` rather than a loop of our own."""
    return map(_CREW, map(_LABELS, agents))


class Segment:
    """One namespace's Agents, as of when the segment was made.

    What a pass asks of it is worked out on first use and kept: the distinct crew
    labels (always), the Agents in name order with each one's crew label (when the
    namespace's Agents do not all bind alike, or when results are read), and each
    one's capabilities (only under a policy with a qualityBias).
    """

    __slots__ = ("_agents", "_by_name", "_capabilities", "_crew_at", "_crews", "_size",
                 "_twins", "namespace")

    def __init__(
        self, namespace: str, by_name: dict[str, Agent], twins: dict[str, list[Agent]]
    ) -> None:
        self.namespace = namespace
        # Copies: a pass's results still read this segment after the roster changes.
        self._by_name = dict(by_name)
        self._twins = {name: list(more) for name, more in twins.items()}
        self._size = len(by_name) + sum(map(len, twins.values()))
        self._crews: dict[str | None, Agent] | None = None
        self._agents: tuple[Agent, ...] | None = None
        self._crew_at: list[str | None] | None = None
        self._capabilities: list[tuple[str, ...]] | None = None

    def __len__(self) -> int:
        return self._size

    @property
    def crews(self) -> dict[str | None, Agent]:
        """Each distinct crew label (None: no label) with one Agent that carries it."""
        if self._crews is None:
            agents = list(self._by_name.values())
            for more in self._twins.values():
                agents.extend(more)
            labels = set(_crews(agents))
            if len(labels) == 1:  # the usual namespace: any Agent stands for the crew
                self._crews = {labels.pop(): agents[0]}
            else:
                self._crews = {}
                for agent, crew in zip(agents, _crews(agents), strict=True):
                    if crew not in self._crews:
                        self._crews[crew] = agent
                        if len(self._crews) == len(labels):
                            break
        return self._crews

    def _order(self) -> None:
        by_name = self._by_name
        # Plain strings sort several times faster than (namespace, name) pairs.
        names = sorted(by_name)
        agents = list(map(by_name.__getitem__, names))
        if self._twins:
            # Agents that share a name follow the first, in the order they came.
            for index in range(len(names) - 1, -1, -1):
                more = self._twins.get(names[index])
                if more:
                    agents[index + 1 : index + 1] = more
        self._agents = tuple(agents)

    @property
    def agents(self) -> tuple[Agent, ...]:
        """The Agents in pass order (name order)."""
        if self._agents is None:
            self._order()
        assert self._agents is not None
        return self._agents

    @property
    def crew_at(self) -> list[str | None]:
        """Each Agent's crew label, by position in pass order."""
        if self._crew_at is None:
            self._crew_at = list(_crews(self.agents))
        return self._crew_at

    @property
    def capabilities(self) -> list[tuple[str, ...]]:
        """Each Agent's capabilities, by position in pass order."""
        if self._capabilities is None:
            self._capabilities = list(map(tuple, map(_CAPABILITIES, self.agents)))
        return self._capabilities


class AgentRoster:
    """Agents filed by namespace and name, read as :class:`Segment` s in pass order."""

    __slots__ = ("_count", "_named", "_segments", "_twins")

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._named: dict[str, dict[str, Agent]] = {}
        #: Further Agents with a namespace and name already filed (a bundle may hold
        #: them), by namespace and name, in the order they came.
        self._twins: dict[str, dict[str, list[Agent]]] = {}
        self._segments: dict[str, Segment] = {}  # namespaces filed since their last change
        named, twins = self._named, 0
        for agent in agents:
            # The loop reads only what files the Agent; labels and capabilities are read
            # per namespace, by map, when a pass asks for them.
            metadata = agent.metadata
            namespace = metadata.namespace or DEFAULT_NAMESPACE
            by_name = named.get(namespace)
            if by_name is None:
                by_name = named[namespace] = {}
            size = len(by_name)
            if by_name.setdefault(metadata.name, agent) is not agent or len(by_name) == size:
                self._twins.setdefault(namespace, {}).setdefault(metadata.name, []).append(agent)
                twins += 1
        self._count = sum(map(len, named.values())) + twins

    def put(self, agent: Agent) -> None:
        """Add an Agent, or replace the one with its namespace and name (an edit)."""
        metadata = agent.metadata
        namespace = metadata.namespace or DEFAULT_NAMESPACE
        self.discard(namespace, metadata.name)
        self._named.setdefault(namespace, {})[metadata.name] = agent
        self._count += 1
        self._segments.pop(namespace, None)

    def discard(self, namespace: str, name: str) -> None:
        """Forget the Agent(s) with this namespace and name, if any."""
        by_name = self._named.get(namespace)
        if by_name is None or name not in by_name:
            return
        del by_name[name]
        twins = self._twins.get(namespace, {})
        self._count -= 1 + len(twins.pop(name, ()))
        if not by_name:
            del self._named[namespace]
            self._twins.pop(namespace, None)
        self._segments.pop(namespace, None)

    def segments(self) -> Iterator[Segment]:
        """Every namespace's segment, namespaces in order; unchanged ones are reused."""
        for namespace in sorted(self._named):
            found = self._segments.get(namespace)
            if found is None:
                found = self._segments[namespace] = Segment(
                    namespace, self._named[namespace], self._twins.get(namespace, {})
                )
            yield found

    def agents(self) -> Iterator[Agent]:
        """Every Agent, in pass order."""
        for segment in self.segments():
            yield from segment.agents

    def __len__(self) -> int:
        return self._count
