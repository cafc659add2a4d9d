"""KeptRoster: the operator's roster follows its view between batches of every Agent."""

from __future__ import annotations

from kubemoot.api import Agent
from kubemoot.operator.batch import KeptRoster
from kubemoot.operator.view import agent_key
from kubemoot.scheduling.roster import AgentRoster
from kubemoot.testing import builders as b


def by_key(*agents: Agent) -> dict[str, Agent]:
    return {agent_key(agent): agent for agent in agents}


def filed(roster: AgentRoster) -> list[tuple[str, str, tuple[str, ...]]]:
    """(namespace, name, capabilities) of every Agent, in pass order."""
    return [(segment.namespace, agent.metadata.name, tuple(agent.spec.capabilities))
            for segment in roster.segments() for agent in segment.agents]


def test_a_batch_of_every_agent_reuses_the_kept_roster_and_follows_the_view() -> None:
    kept = KeptRoster()
    x, y = b.agent("x", "crew-a"), b.agent("x", "crew-a-b")
    view = by_key(x, y)
    roster = kept.file(view, view)
    assert roster is kept.roster
    assert filed(roster) == [("crew-a", "x", ()), ("crew-a-b", "x", ())]

    # An edit (a new object under the same key), a new Agent and a deleted one.
    edited = b.agent("x", "crew-a", capabilities=["tool-calling"])
    z = b.agent("z", "crew-a-b")
    view = by_key(edited, z)
    assert kept.file(view, view) is roster
    assert filed(roster) == [("crew-a", "x", ("tool-calling",)), ("crew-a-b", "z", ())]
    assert len(roster) == 2


def test_an_unchanged_agent_is_not_filed_again() -> None:
    kept = KeptRoster()
    view = by_key(b.agent("x", "crew-a"), b.agent("y", "crew-b"))
    kept.file(view, view)
    segments = {segment.namespace: segment for segment in kept.roster.segments()}
    view["crew-b/y"] = b.agent("y", "crew-b")  # only crew-b changed
    kept.file(view, view)
    again = {segment.namespace: segment for segment in kept.roster.segments()}
    assert again["crew-a"] is segments["crew-a"]
    assert again["crew-b"] is not segments["crew-b"]


def test_a_smaller_batch_is_filed_afresh_and_leaves_the_kept_roster_alone() -> None:
    kept = KeptRoster()
    x, y = b.agent("x", "crew-a"), b.agent("y", "crew-a")
    view = by_key(x, y)
    kept.file(view, view)
    fresh = kept.file({**view, "crew-a/z": b.agent("z", "crew-a")}, by_key(y))
    assert fresh is not kept.roster
    assert filed(fresh) == [("crew-a", "y", ())]
    assert filed(kept.roster) == [("crew-a", "x", ()), ("crew-a", "y", ())]
