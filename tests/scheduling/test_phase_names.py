"""The discussion's phase names come from one enum (`kubemoot.api.Phase`)."""

from __future__ import annotations

from kubemoot.api import Phase
from kubemoot.scheduling.archetypes import CONSENT_3, PROCESS_STEPS
from kubemoot.scheduling.bind import ENV_CANDIDATES
from kubemoot.scheduling.plugins.provider_weight import PHASE_SIGN


def test_the_process_steps_are_the_enum_in_order() -> None:
    assert [step for step, _ in PROCESS_STEPS] == list(Phase)
    bound = {step for step, binds in PROCESS_STEPS if binds}
    assert bound == {Phase.TRIAGE, Phase.MULLING}


def test_the_model_bound_phases_are_the_archetypes_and_have_env_and_sign() -> None:
    assert {p.name for p in CONSENT_3.spec.phases} == {Phase.MULLING, Phase.TRIAGE}
    assert set(ENV_CANDIDATES) == set(PHASE_SIGN) == {Phase.MULLING, Phase.TRIAGE}
    # A name read from a resource is a plain string: it finds the same entries.
    assert ENV_CANDIDATES["mulling"] == ENV_CANDIDATES[Phase.MULLING]
    assert PHASE_SIGN["triage"] == -1.0
