"""The Agents of a snapshot, grouped by what decides their binding, in pass order.

A pass binds Agents in (namespace, name) order, and within one pass an Agent's phases
depend on nothing of its own but its namespace, its crew label (which policy governs
it) and its capabilities (its effective bias under that policy); see
:mod:`kubemoot.scheduling.group`. The roster files each Agent under its namespace and
name with the number of its *class*, the (crew label, capabilities) pair; a
namespace's :class:`Segment` says which classes it holds and, when a pass needs them,
its Agents in name order with their classes. A pass groups a namespace's classes by
what they bind with and walks the groups and counts instead of the Agents
(:meth:`SchedulingPass.schedule_all`); a namespace whose Agents all bind alike is not
even sorted.

The roster is built once from a bundle (``kubemoot schedule``), or kept by whoever
holds Agents between passes and told of each change (:meth:`AgentRoster.put`,
:meth:`AgentRoster.discard`): a change re-files only its own namespace, and only when
the namespace is next read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from operator import itemgetter, le
from typing import TypeVar

from kubemoot.api import CREW_LABEL, DEFAULT_NAMESPACE, Agent

__all__ = ["AgentClass", "AgentRoster", "Segment"]

#: What decides an Agent's binding besides its namespace: its crew label and its
#: capabilities as listed.
AgentClass = tuple[str | None, tuple[str, ...]]
#: An Agent as filed: the Agent and its class's number in the roster.
_Entry = tuple[Agent, int]
_AGENT, _NUMBER = itemgetter(0), itemgetter(1)
#: A namespace's Agents as filed in one go: the Agents in the order they came, and
#: each one's class number and name.
_Came = tuple[list[Agent], list[int], list[str]]
_T = TypeVar("_T")
_Add = Callable[[_T], None]


class Segment:
    """One namespace's Agents, as of when the segment was made.

    Everything is read from what the roster filed (each Agent with its class number),
    never from the Agents again, except their names when they are put in name order:
    a namespace's Agents lie scattered in memory among the others', so reading their
    fields here would cost a cache miss each. What a pass asks is worked out on first
    use and kept: the classes present (always), and the Agents in name order with their
    classes (only when they do not all bind alike, or when results are read).

    The Agents come either as the roster filed them in one go (lists in the order they
    came: Agents, class numbers, names; shared with the roster, which never changes
    them), or by name (copied: a pass's results still read this segment after the
    roster changes).
    """

    __slots__ = ("_agents", "_by_name", "_came", "_class_at", "_classes", "_held", "_names",
                 "_numbers", "_size", "_twins", "namespace")

    def __init__(
        self,
        namespace: str,
        by_name: dict[str, _Entry],
        twins: dict[str, list[_Entry]],
        classes: list[AgentClass],
        held: dict[int, Agent] | None = None,
        came: _Came | None = None,
    ) -> None:
        self.namespace = namespace
        self._classes = classes  # the roster's, by number; numbers are never reused
        self._held = None if held is None else dict(held)
        if came is None:
            self._by_name = dict(by_name)
            self._twins = {name: list(more) for name, more in twins.items()}
            self._came: list[Agent] | None = None
            self._numbers: list[int] = []
            self._names: list[str] = []
            self._size = len(by_name) + sum(map(len, twins.values()))
        else:
            self._by_name, self._twins = {}, {}
            self._came, self._numbers, self._names = came
            self._size = len(self._came)
        self._agents: tuple[Agent, ...] | None = None
        self._class_at: list[int] | None = None

    def __len__(self) -> int:
        return self._size

    def _entries(self) -> list[_Entry]:
        entries = list(self._by_name.values())
        for more in self._twins.values():
            entries.extend(more)
        return entries

    @property
    def held(self) -> dict[int, Agent]:
        """The class numbers present, each with one Agent of that class."""
        if self._held is None:
            if self._came is not None:
                # Whole-list operations instead of a loop per Agent: the last write for
                # a class, walking backwards, is its first Agent; classes in the order
                # they first came.
                numbers = self._numbers
                first = dict(zip(reversed(numbers), reversed(self._came), strict=True))
                self._held = {number: first[number] for number in dict.fromkeys(numbers)}
                return self._held
            entries = self._entries()
            numbers_present = set(map(_NUMBER, entries))
            held: dict[int, Agent] = {}
            for agent, number in entries:
                if number not in held:
                    held[number] = agent
                    if len(held) == len(numbers_present):
                        break
            self._held = held
        return self._held

    def agent_class(self, number: int) -> AgentClass:
        """The (crew label, capabilities) of a class number."""
        return self._classes[number]

    def _order(self) -> None:
        came = self._came
        if came is not None:
            names = self._names
            if all(map(le, names, islice(names, 1, None))):
                # Already in name order, as a Kubernetes list returns a namespace's
                # objects: nothing to move (the pass only reads the class numbers).
                self._agents, self._class_at = tuple(came), self._numbers
                return
            # A stable sort by name: Agents that share a name keep the order they came.
            order = sorted(range(len(names)), key=names.__getitem__)
            self._agents = tuple(map(came.__getitem__, order))
            self._class_at = list(map(self._numbers.__getitem__, order))
            return
        by_name = self._by_name
        # Plain strings sort several times faster than (namespace, name) pairs.
        names = sorted(by_name)
        entries = list(map(by_name.__getitem__, names))
        if self._twins:
            # Agents that share a name follow the first, in the order they came.
            for index in range(len(names) - 1, -1, -1):
                more = self._twins.get(names[index])
                if more:
                    entries[index + 1 : index + 1] = more
        self._agents = tuple(map(_AGENT, entries))
        self._class_at = list(map(_NUMBER, entries))

    @property
    def agents(self) -> tuple[Agent, ...]:
        """The Agents in pass order (name order)."""
        if self._agents is None:
            self._order()
        assert self._agents is not None
        return self._agents

    @property
    def class_at(self) -> list[int]:
        """Each Agent's class number, by position in pass order."""
        if self._class_at is None:
            self._order()
        assert self._class_at is not None
        return self._class_at


class AgentRoster:
    """Agents filed by namespace and name, read as :class:`Segment` s in pass order."""

    __slots__ = ("_came", "_class_of", "_classes", "_count", "_held", "_named", "_segments",
                 "_twins")

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        #: The Agents given here, per namespace, in the order they came, with their class
        #: numbers and names: lists that are never changed. A namespace is filed by name
        #: (the dicts below) only when an Agent of it is put or discarded.
        self._came: dict[str, _Came] = {}
        self._named: dict[str, dict[str, _Entry]] = {}
        #: Further Agents with a namespace and name already filed by name, by namespace
        #: and name, in the order they came.
        self._twins: dict[str, dict[str, list[_Entry]]] = {}
        self._segments: dict[str, Segment] = {}  # namespaces filed since their last change
        #: Class numbers by crew label and capabilities, and the classes by number.
        self._class_of: dict[str | None, dict[tuple[str, ...], int]] = {}
        self._classes: list[AgentClass] = []
        #: Per namespace filed by name, the class numbers present with one Agent of each;
        #: a namespace that loses an Agent has it worked out again when read.
        self._held: dict[str, dict[int, Agent]] = {}
        class_of, classes = self._class_of, self._classes
        # Per namespace: its lists' bound appends, from one lookup per Agent.
        spaces: dict[str, tuple[_Add[Agent], _Add[int], _Add[str]]] = {}
        # Bound once: at 5,000 Agents filing is a sizeable share of the whole pass, and
        # each name looked up per Agent (a method, a global) is paid 5,000 times.
        spaces_get, class_of_get = spaces.get, class_of.get
        crew_label, default_namespace = CREW_LABEL, DEFAULT_NAMESPACE
        for agent in agents:
            # Every field a pass needs is read here, once, in the order the Agents came
            # (which is how they lie in memory: reading them later, namespace by
            # namespace, would jump from one to the next).
            metadata = agent.metadata
            namespace = metadata.namespace or default_namespace
            space = spaces_get(namespace)
            if space is None:
                came, numbers, names = self._came[namespace] = ([], [], [])
                space = spaces[namespace] = (came.append, numbers.append, names.append)
            crew, capabilities = metadata.labels.get(crew_label), tuple(agent.spec.capabilities)
            by_capabilities = class_of_get(crew)
            if by_capabilities is None:
                by_capabilities = class_of[crew] = {}
            number = by_capabilities.get(capabilities)
            if number is None:
                # A class's first sight, inline: with up to one class per two Agents
                # (the bench's default), a call here would be paid thousands of times.
                number = by_capabilities[capabilities] = len(classes)
                classes.append((crew, capabilities))
            # Appends: a pair per Agent filed in a dict by name cost about twice as much.
            space[0](agent)
            space[1](number)
            space[2](metadata.name)
        self._count = sum(len(filed[0]) for filed in self._came.values())

    def _number(self, crew: str | None, capabilities: tuple[str, ...]) -> int:
        """The number of the class (crew, capabilities), given on first sight."""
        by_capabilities = self._class_of.get(crew)
        if by_capabilities is None:
            by_capabilities = self._class_of[crew] = {}
        number = by_capabilities.get(capabilities)
        if number is None:
            number = by_capabilities[capabilities] = len(self._classes)
            self._classes.append((crew, capabilities))
        return number

    def _by_name(self, namespace: str) -> None:
        """File a namespace filed in one go by name, before an Agent of it changes."""
        filed = self._came.pop(namespace, None)
        if filed is None:
            return
        by_name: dict[str, _Entry] = {}
        self._named[namespace] = by_name
        for agent, number, name in zip(*filed, strict=True):
            if name in by_name:
                self._twins.setdefault(namespace, {}).setdefault(name, []).append(
                    (agent, number)
                )
            else:
                by_name[name] = (agent, number)

    def put(self, agent: Agent) -> None:
        """Add an Agent, or replace the one with its namespace and name (an edit)."""
        metadata = agent.metadata
        namespace = metadata.namespace or DEFAULT_NAMESPACE
        self.discard(namespace, metadata.name)
        number = self._number(metadata.labels.get(CREW_LABEL), tuple(agent.spec.capabilities))
        if namespace not in self._named:
            self._held[namespace] = {}
        self._named.setdefault(namespace, {})[metadata.name] = (agent, number)
        held = self._held.get(namespace)
        if held is not None:
            held.setdefault(number, agent)
        self._count += 1
        self._segments.pop(namespace, None)

    def discard(self, namespace: str, name: str) -> None:
        """Forget the Agent(s) with this namespace and name, if any."""
        self._by_name(namespace)
        by_name = self._named.get(namespace)
        if by_name is None or name not in by_name:
            return
        del by_name[name]
        self._held.pop(namespace, None)  # its class may have gone with it
        twins = self._twins.get(namespace, {})
        self._count -= 1 + len(twins.pop(name, ()))
        if not by_name:
            del self._named[namespace]
            self._twins.pop(namespace, None)
        self._segments.pop(namespace, None)

    def segments(self) -> Iterator[Segment]:
        """Every namespace's segment, namespaces in order; unchanged ones are reused."""
        for namespace in sorted(self._named.keys() | self._came.keys()):
            found = self._segments.get(namespace)
            if found is None:
                came = self._came.get(namespace)
                if came is not None:
                    found = Segment(namespace, {}, {}, self._classes, came=came)
                else:
                    found = Segment(
                        namespace,
                        self._named[namespace],
                        self._twins.get(namespace, {}),
                        self._classes,
                        self._held.get(namespace),
                    )
                self._segments[namespace] = found
            yield found

    def agents(self) -> Iterator[Agent]:
        """Every Agent, in pass order."""
        for segment in self.segments():
            yield from segment.agents

    def __len__(self) -> int:
        return self._count
