"""The Agents of a snapshot, grouped by what decides their binding, in pass order.

A pass binds Agents in (namespace, name) order, and within one pass an Agent's phases
depend on nothing of its own but its namespace, its crew label (which policy governs
it) and its capabilities (its effective bias under that policy); see
:mod:`kubemoot.scheduling.group`. The roster files each Agent under its namespace with
the number of its *class*, the (crew label, capabilities) pair; a namespace's
:class:`Segment` says which classes it holds and, when a pass needs them, its Agents in
name order with their classes. A pass groups a namespace's classes by what they bind
with and walks the groups and counts instead of the Agents
(:meth:`SchedulingPass.schedule_all`); a namespace whose Agents all bind alike is not
even put in order.

The roster is built once from a bundle (``kubemoot schedule``), or kept by whoever
holds Agents between passes and told of each change (:meth:`AgentRoster.put`,
:meth:`AgentRoster.discard`): a change re-files only its own namespace, and only when
the namespace is next read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter, itemgetter

from kubemoot.api import CREW_LABEL, DEFAULT_NAMESPACE, Agent

__all__ = ["AgentClass", "AgentRoster", "Segment"]

#: What decides an Agent's binding besides its namespace: its crew label and its
#: capabilities as listed (None: not read, as they cannot change the binding; see
#: :class:`AgentRoster`).
AgentClass = tuple[str | None, tuple[str, ...] | None]
#: An Agent filed by name: the Agent and its class's number in the roster.
_Entry = tuple[Agent, int]
#: A namespace's Agents as the roster was given them: the Agents in the order they came,
#: each one's class number, and whether they came in name order.
_Came = tuple[list[Agent], list[int], bool]
_AGENT, _NUMBER = itemgetter(0), itemgetter(1)
_NAME = attrgetter("metadata.name")


class Segment:
    """One namespace's Agents, as of when the segment was made.

    Everything is read from what the roster filed (each Agent with its class number),
    never from the Agents again, except their names when they came out of name order:
    a namespace's Agents lie scattered in memory among the others', so reading their
    fields here would cost a cache miss each. What a pass asks is worked out on first
    use and kept: the classes present (always), and the Agents in name order with their
    classes (only when they do not all bind alike, or when results are read).

    The Agents come either as the roster was given them (lists in the order they came,
    shared with the roster, which never changes them), or filed by name (copied: a
    pass's results still read this segment after the roster changes).
    """

    __slots__ = ("_agents", "_by_name", "_came", "_class_at", "_numbers", "_present", "_size",
                 "_twins", "classes", "namespace")

    def __init__(
        self,
        namespace: str,
        classes: list[AgentClass],
        *,
        came: _Came | None = None,
        by_name: dict[str, _Entry] | None = None,
        twins: dict[str, list[_Entry]] | None = None,
        present: dict[int, None] | None = None,
    ) -> None:
        self.namespace = namespace
        #: The roster's classes, by number; numbers are never reused.
        self.classes = classes
        self._present = None if present is None else list(present)
        self._by_name = {} if by_name is None else dict(by_name)
        self._twins = {} if twins is None else {name: list(more) for name, more in twins.items()}
        self._came = came
        self._size = (
            len(came[0]) if came is not None
            else len(self._by_name) + sum(map(len, self._twins.values()))
        )
        self._agents: Sequence[Agent] | None = None
        self._class_at: list[int] | None = None

    def __len__(self) -> int:
        return self._size

    def _entries(self) -> list[_Entry]:
        entries = list(self._by_name.values())
        for more in self._twins.values():
            entries.extend(more)
        return entries

    @property
    def present(self) -> list[int]:
        """The numbers of the classes present, each once, in the order they first came."""
        if self._present is None:
            numbers = self._came[1] if self._came is not None else map(_NUMBER, self._entries())
            self._present = list(dict.fromkeys(numbers))
        return self._present

    def agent_class(self, number: int) -> AgentClass:
        """The (crew label, capabilities) of a class number."""
        return self.classes[number]

    def _order(self) -> None:
        if self._came is not None:
            came, numbers, in_order = self._came
            if in_order:
                # As a Kubernetes list returns a namespace's objects: nothing to move,
                # and nothing copied (the pass only reads these lists).
                self._agents, self._class_at = came, numbers
                return
            # A stable sort by name: Agents that share a name keep the order they came.
            names = list(map(_NAME, came))
            order = sorted(range(len(names)), key=names.__getitem__)
            self._agents = list(map(came.__getitem__, order))
            self._class_at = list(map(numbers.__getitem__, order))
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
        self._agents = list(map(_AGENT, entries))
        self._class_at = list(map(_NUMBER, entries))

    @property
    def agents(self) -> Sequence[Agent]:
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


#: A namespace's lists while a roster is filed: its Agents and their class numbers in the
#: order they came, a one-item list holding the name of the Agent filed last, and per
#: crew label (the one class number of its Agents, their class numbers by capabilities):
#: the number is -1 where capabilities matter, and the dict unused where they do not.
#: Plain lists in a tuple: ``list.append`` called on a list is a specialised
#: instruction, where a bound append kept on an object is a call.
_Filing = tuple[
    list[Agent], list[int], list[str],
    dict[str | None, tuple[int, dict[tuple[str, ...] | None, int]]],
]


class AgentRoster:
    """Agents filed by namespace and class, read as :class:`Segment` s in pass order.

    ``capabilities_matter(namespace, crew)``, when given, says whether an Agent's
    capabilities can change its binding in that namespace under that crew label (they
    do only under a policy with a qualityBias). Where they cannot, the roster does not
    read them: every Agent of that crew label there files under one class with no
    capabilities (``None``). Only a roster made for one snapshot's policies may be told
    this (:attr:`ClusterSnapshot.roster`); a roster kept across policy changes is not.
    """

    __slots__ = ("_came", "_class_of", "_classes", "_count", "_named", "_present",
                 "_segments", "_twins")

    def __init__(
        self,
        agents: Iterable[Agent] = (),
        *,
        capabilities_matter: Callable[[str, str | None], bool] | None = None,
    ) -> None:
        #: The Agents given here, per namespace, as they came (see ``_Came``): never
        #: changed. A namespace is filed by name (the dicts below) only when an Agent of
        #: it is put or discarded.
        self._came: dict[str, _Came] = {}
        self._named: dict[str, dict[str, _Entry]] = {}
        #: Further Agents with a namespace and name already filed by name, by namespace
        #: and name, in the order they came.
        self._twins: dict[str, dict[str, list[_Entry]]] = {}
        self._segments: dict[str, Segment] = {}  # namespaces filed since their last change
        #: Class numbers by crew label and capabilities (None: not read), and the classes
        #: by number.
        self._class_of: dict[str | None, dict[tuple[str, ...] | None, int]] = {}
        self._classes: list[AgentClass] = []
        #: Per namespace filed by name, the class numbers present, kept while Agents are
        #: put; a namespace that loses an Agent has them worked out again when read.
        self._present: dict[str, dict[int, None]] = {}
        class_of, classes = self._class_of, self._classes
        spaces: dict[str, _Filing] = {}
        unsorted: set[str] = set()
        # Bound once: at 5,000 Agents filing is a sizeable share of the whole pass, and
        # each name looked up per Agent (a method, a global) is paid 5,000 times.
        spaces_get = spaces.get
        crew_label, default_namespace = CREW_LABEL, DEFAULT_NAMESPACE
        for agent in agents:
            # Every field a pass needs is read here, once, in the order the Agents came
            # (which is how they lie in memory: reading them later, namespace by
            # namespace, would jump from one to the next).
            metadata = agent.metadata
            namespace = metadata.namespace or default_namespace
            space = spaces_get(namespace)
            if space is None:
                space = spaces[namespace] = ([], [], [""], {})
            came, numbers, last, crews = space
            crew = metadata.labels.get(crew_label)
            entry = crews.get(crew)
            if entry is None:
                # A crew label's first sight in this namespace: do its Agents'
                # capabilities matter? Under no qualityBias (half the bench's
                # namespaces) they all bind alike, and their specs are never read.
                entry = crews[crew] = (
                    (self._number(crew, None), {})
                    if capabilities_matter is not None and not capabilities_matter(namespace, crew)
                    else (-1, class_of.setdefault(crew, {}))
                )
            number, by_capabilities = entry
            if number < 0:
                capabilities = tuple(agent.spec.capabilities)
                found = by_capabilities.get(capabilities)
                if found is None:
                    # A class's first sight, inline: with up to one class per two Agents
                    # (the bench's default), a call here would be paid thousands of times.
                    found = by_capabilities[capabilities] = len(classes)
                    classes.append((crew, capabilities))
                number = found
            # Appended in the order they came: a pair per Agent filed in a dict by name
            # cost about twice as much.
            came.append(agent)
            numbers.append(number)
            # The name is compared with the one before while the Agent is at hand, and
            # not kept: a namespace that came in name order (as a Kubernetes list
            # returns it) is then never sorted, and the names of the others are read
            # only when they are.
            name = metadata.name
            if name < last[0]:
                unsorted.add(namespace)
            last[0] = name
        for namespace, (came, numbers, _, _) in spaces.items():
            self._came[namespace] = (came, numbers, namespace not in unsorted)
        self._count = sum(len(filed[0]) for filed in self._came.values())

    def _number(self, crew: str | None, capabilities: tuple[str, ...] | None) -> int:
        """The number of the class (crew, capabilities), given on first sight."""
        by_capabilities = self._class_of.get(crew)
        if by_capabilities is None:
            by_capabilities = self._class_of[crew] = {}
        number = by_capabilities.get(capabilities)
        if number is None:
            number = by_capabilities[capabilities] = len(self._classes)
            self._classes.append((crew, capabilities))
        return number

    def _file_by_name(self, namespace: str) -> None:
        """File by name a namespace the roster was given in one go (before it changes)."""
        filed = self._came.pop(namespace, None)
        if filed is None:
            return
        by_name: dict[str, _Entry] = {}
        self._named[namespace] = by_name
        came, numbers, _ = filed
        for agent, number in zip(came, numbers, strict=True):
            name = agent.metadata.name
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
            self._present[namespace] = {}
        self._named.setdefault(namespace, {})[metadata.name] = (agent, number)
        present = self._present.get(namespace)
        if present is not None:
            present.setdefault(number)
        self._count += 1
        self._segments.pop(namespace, None)

    def discard(self, namespace: str, name: str) -> None:
        """Forget the Agent(s) with this namespace and name, if any."""
        self._file_by_name(namespace)
        by_name = self._named.get(namespace)
        if by_name is None or name not in by_name:
            return
        del by_name[name]
        self._present.pop(namespace, None)  # its class may have gone with it
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
                    found = Segment(namespace, self._classes, came=came)
                else:
                    found = Segment(
                        namespace,
                        self._classes,
                        by_name=self._named[namespace],
                        twins=self._twins.get(namespace, {}),
                        present=self._present.get(namespace),
                    )
                self._segments[namespace] = found
            yield found

    def agents(self) -> Iterator[Agent]:
        """Every Agent, in pass order."""
        for segment in self.segments():
            yield from segment.agents

    def __len__(self) -> int:
        return self._count
