"""The Agents of a snapshot, grouped by what decides their binding, in pass order.

A pass binds Agents in (namespace, name) order, and within one pass an Agent's phases
depend on nothing of its own but its namespace, its crew label (which policy governs
it) and its capabilities (its effective bias under that policy); see
:mod:`kubemoot.scheduling.group`. The roster files each Agent under its namespace and
under its *class*, the (crew, capability set) pair, and keeps each namespace's Agents
sorted by name with, for every class, the positions its Agents hold. A pass then walks
classes and counts instead of reading every Agent (:meth:`SchedulingPass.schedule_all`).

The roster is built once from a bundle (``kubemoot schedule``), or kept by whoever
holds Agents between passes and told of each change (:meth:`AgentRoster.put`,
:meth:`AgentRoster.discard`): a change re-files only its own namespace, and only when
the namespace is next read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter

from kubemoot.api import CREW_LABEL, DEFAULT_NAMESPACE, Agent

__all__ = ["AgentClass", "AgentRoster", "Segment"]

#: What decides an Agent's binding besides its namespace: its crew label and its
#: capabilities (as listed; Agents that list the same set in another order land in
#: classes with the same effective bias, so they still share decisions).
AgentClass = tuple[str | None, tuple[str, ...]]
#: An Agent as filed: the Agent and its class, both read once.
_Entry = tuple[Agent, AgentClass]


@dataclass(frozen=True, slots=True)
class Segment:
    """One namespace's Agents in name order, with each Agent's class."""

    namespace: str
    agents: tuple[Agent, ...]
    #: The distinct classes, in order of first appearance.
    classes: tuple[AgentClass, ...]
    #: For each class, the positions of its Agents, ascending.
    positions: tuple[tuple[int, ...], ...]
    _class_ids: list[int] | None = field(default=None, compare=False, repr=False)

    def first(self, class_id: int) -> Agent:
        """An Agent of the class (the first in name order)."""
        return self.agents[self.positions[class_id][0]]

    @classmethod
    def of(cls, namespace: str, entries: list[_Entry]) -> Segment:
        """A namespace's segment from its entries, already in pass order."""
        by_class: dict[AgentClass, list[int]] = {}
        for position, (_, key) in enumerate(entries):
            found = by_class.get(key)
            if found is None:
                by_class[key] = [position]
            else:
                found.append(position)
        return cls(
            namespace,
            tuple(map(itemgetter(0), entries)),
            tuple(by_class),
            tuple(map(tuple, by_class.values())),
        )

    @property
    def class_ids(self) -> list[int]:
        """The class (an index into ``classes``) of each Agent, by position; made when
        first read (a pass reads it only to write out results)."""
        found = self._class_ids
        if found is None:
            found = [0] * len(self.agents)
            for class_id, positions in enumerate(self.positions):
                for position in positions:
                    found[position] = class_id
            object.__setattr__(self, "_class_ids", found)
        return found


class AgentRoster:
    """Agents filed by namespace and name, read as :class:`Segment` s in pass order."""

    __slots__ = ("_count", "_named", "_segments", "_twins")

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._named: dict[str, dict[str, _Entry]] = {}
        #: Further Agents with a namespace and name already filed (a bundle may hold
        #: them), in the order they came; the pass binds them after the first.
        self._twins: dict[tuple[str, str], list[_Entry]] = {}
        self._segments: dict[str, Segment] = {}  # namespaces filed since their last change
        self._count = 0
        named = self._named
        for agent in agents:
            # Each Agent's fields are read once, here, for every later pass.
            metadata = agent.metadata
            namespace = metadata.namespace or DEFAULT_NAMESPACE
            entry = (agent, (metadata.labels.get(CREW_LABEL), tuple(agent.spec.capabilities)))
            by_name = named.get(namespace)
            if by_name is None:
                by_name = named[namespace] = {}
            if metadata.name in by_name:
                self._twins.setdefault((namespace, metadata.name), []).append(entry)
            else:
                by_name[metadata.name] = entry
            self._count += 1

    def put(self, agent: Agent) -> None:
        """Add an Agent, or replace the one with its namespace and name (an edit)."""
        metadata = agent.metadata
        namespace = metadata.namespace or DEFAULT_NAMESPACE
        self.discard(namespace, metadata.name)
        key = (metadata.labels.get(CREW_LABEL), tuple(agent.spec.capabilities))
        self._named.setdefault(namespace, {})[metadata.name] = (agent, key)
        self._count += 1
        self._segments.pop(namespace, None)

    def discard(self, namespace: str, name: str) -> None:
        """Forget the Agent(s) with this namespace and name, if any."""
        by_name = self._named.get(namespace)
        if by_name is None or name not in by_name:
            return
        del by_name[name]
        self._count -= 1 + len(self._twins.pop((namespace, name), ()))
        if not by_name:
            del self._named[namespace]
        self._segments.pop(namespace, None)

    def segments(self) -> Iterator[Segment]:
        """Every namespace's segment, namespaces in order; unchanged ones are reused."""
        for namespace in sorted(self._named):
            found = self._segments.get(namespace)
            if found is None:
                found = self._segments[namespace] = Segment.of(namespace, self._ordered(namespace))
            yield found

    def _ordered(self, namespace: str) -> list[_Entry]:
        by_name = self._named[namespace]
        # Plain strings sort several times faster than (namespace, name) pairs.
        names = sorted(by_name)
        entries = list(map(by_name.__getitem__, names))
        if self._twins:
            twins = self._twins
            for index in range(len(names) - 1, -1, -1):
                more = twins.get((namespace, names[index]))
                if more:
                    entries[index + 1 : index + 1] = more
        return entries

    def agents(self) -> Iterator[Agent]:
        """Every Agent, in pass order."""
        for segment in self.segments():
            yield from segment.agents

    def __len__(self) -> int:
        return self._count
