"""The MootArchetypes that ship with Kubemoot, and policy phase validation.

``consent-3`` (sociocracy 3.0 consent) is the one built-in archetype. Our reading of the
spec's discussion: the coordinator *selects* agents for a thread; each selected agent
runs a quick *triage* call (take part or stand aside, on a light model); the agents that
take part *mull* the question, running the tool loop on their preferred model; each
answers with a consent signal (agree, concern, stand_aside or failure); the coordinator
*synthesises* the answer (on its own mulling binding). Only triage and mulling bind a
model per agent, so they are the archetype's scheduling phases; selection, the consent
round and synthesis are process steps without a binding of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from kubemoot.api import (
    ArchetypePhase,
    ArchetypeSpec,
    CrewSchedulingPolicy,
    MootArchetype,
    ObjectMeta,
    Phase,
)

__all__ = [
    "CONSENT_3",
    "DEFAULT_ARCHETYPE",
    "PROCESS_STEPS",
    "builtin_archetypes",
    "scheduling_order",
    "unknown_phases",
]

DEFAULT_ARCHETYPE = "consent-3"

#: The consent-3 discussion, in order; the ones marked True bind a model per agent.
PROCESS_STEPS: tuple[tuple[str, bool], ...] = (
    (Phase.SELECTION, False),
    (Phase.TRIAGE, True),
    (Phase.MULLING, True),
    (Phase.CONSENT, False),
    (Phase.SYNTHESIS, False),
)

CONSENT_3 = MootArchetype(
    metadata=ObjectMeta(name=DEFAULT_ARCHETYPE, labels={"kubemoot.ai/builtin": "true"}),
    spec=ArchetypeSpec(
        description=(
            "Sociocracy 3.0 consent: the coordinator selects agents, each triages and "
            "mulls, answers agree / concern / stand_aside, and the coordinator synthesises."
        ),
        phases=[
            ArchetypePhase(
                name=Phase.MULLING,
                description=(
                    "An agent deliberates with its tools on its preferred model; the "
                    "coordinator's synthesis runs on this binding too."
                ),
            ),
            ArchetypePhase(
                name=Phase.TRIAGE,
                description="A short call deciding whether the agent takes part.",
            ),
        ],
        roles=["coordinator", "tooler", "analyst"],
    ),
)


def builtin_archetypes() -> dict[str, MootArchetype]:
    """The archetypes the operator installs, by name."""
    return {DEFAULT_ARCHETYPE: CONSENT_3}


def unknown_phases(policy: CrewSchedulingPolicy, archetype: MootArchetype) -> list[str]:
    """Rule phases the archetype does not declare, in rule order, without repeats."""
    known = set(archetype.phase_names)
    seen: list[str] = []
    for rule in policy.spec.rules:
        if rule.phase not in known and rule.phase not in seen:
            seen.append(rule.phase)
    return seen


def scheduling_order(archetype: MootArchetype, phase_keys: Iterable[str]) -> list[str]:
    """The archetype's phases with the spread's ``phaseKeys`` first, in their order."""
    phases = archetype.phase_names
    ordered: list[str] = []
    for phase in phase_keys:
        if phase in phases and phase not in ordered:
            ordered.append(phase)
    ordered.extend(phase for phase in phases if phase not in ordered)
    return ordered
