"""What an Agent's Deployment env says, read by ``kubemoot agent``."""

from __future__ import annotations

import pytest

from kubemoot.agent.process import AgentIdentity, profile_from_env, sizes_from_env
from kubemoot.agent.remote import CrewRef
from kubemoot.api.errors import InputError
from kubemoot.runtime.placement import CandidateModel
from kubemoot.testing.state import provider_state

ME = AgentIdentity("kubectl-agent", "crew-a", CrewRef("crew-a", "pilot"), "tooler")
LIST = '[{"model":"qwen3:14b","score":70},{"model":"qwen3:8b","score":60}]'


def test_the_bound_model_leads_and_the_bound_endpoints_become_static_targets() -> None:
    env = {
        "KUBEMOOT_MODEL_MODEL": "qwen3:8b",
        "KUBEMOOT_MODEL_ENDPOINT": "http://gpu-b:11434/",
        "KUBEMOOT_MODEL_CANDIDATES_MULLING": LIST,
        "KUBEMOOT_TRIAGE_MODEL_MODEL_ID": "phi3:mini",
        "KUBEMOOT_TRIAGE_MODEL_ENDPOINT": "http://nowhere:11434",
    }
    states = {"gpu-b": provider_state("gpu-b", context=8192)}
    profile = profile_from_env(env, ME, providers=states)
    assert profile.id == "crew-a/kubectl-agent" and profile.role == "tooler"
    assert profile.mulling == (CandidateModel("qwen3:8b", 60.0), CandidateModel("qwen3:14b", 70.0))
    assert profile.triage == (CandidateModel("phi3:mini"),)
    assert profile.mulling_static is not None
    assert (profile.mulling_static.provider, profile.mulling_static.model,
            profile.mulling_static.context_length) == ("gpu-b", "qwen3:8b", 8192)
    assert profile.triage_static is None  # no provider serves that endpoint


def test_an_unbound_agent_tries_the_lists_first_entries() -> None:
    env = {"KUBEMOOT_MODEL_CANDIDATES_MULLING": LIST,
           "KUBEMOOT_MODEL_CANDIDATES_TRIAGE": '[{"model":"phi3:mini","score":100}]'}
    profile = profile_from_env(env, ME)
    assert [c.model for c in profile.mulling] == ["qwen3:14b", "qwen3:8b"]
    assert profile.triage == (CandidateModel("phi3:mini"),)
    assert profile_from_env({}, ME).mulling == ()  # not bound yet: never selected


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ("[{", "KUBEMOOT_MODEL_CANDIDATES_MULLING", "is not JSON"),
        ('{"model":"a"}', "KUBEMOOT_MODEL_CANDIDATES_MULLING", "must be a JSON list"),
        ("[1]", "KUBEMOOT_MODEL_CANDIDATES_MULLING[0]", "must be an object"),
        ('[{"score":1}]', "KUBEMOOT_MODEL_CANDIDATES_MULLING[0].model", "needs a model"),
        ('[{"model":"a","score":"high"}]', "KUBEMOOT_MODEL_CANDIDATES_MULLING[0].score",
         "finite number"),
        ('[{"model":"a","score":NaN}]', "KUBEMOOT_MODEL_CANDIDATES_MULLING[0].score",
         "finite number"),
        ("[" + ",".join(['{"model":"a"}'] * 300) + "]", "KUBEMOOT_MODEL_CANDIDATES_MULLING",
         "at most"),
    ],
)
def test_a_malformed_candidate_list_names_the_variable(value: str, field: str,
                                                       says: str) -> None:
    with pytest.raises(InputError) as caught:
        profile_from_env({"KUBEMOOT_MODEL_CANDIDATES_MULLING": value}, ME)
    assert caught.value.field == field
    assert says in caught.value.describe()


def test_declared_sizes_are_read_per_model_and_absent_means_none() -> None:
    env = {"KUBEMOOT_MODEL_SIZES_MIB": ' {"qwen3:14b":9216, "qwen3:8b":5120} '}
    assert sizes_from_env(env) == {"qwen3:14b": 9216, "qwen3:8b": 5120}
    assert sizes_from_env({}) == {}
    assert sizes_from_env({"KUBEMOOT_MODEL_SIZES_MIB": "{}"}) == {}


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ("qwen3:8b=5120", "KUBEMOOT_MODEL_SIZES_MIB", "is not JSON"),
        ('[{"model":"a"}]', "KUBEMOOT_MODEL_SIZES_MIB", "must be a JSON object"),
        ('{" ":1}', "KUBEMOOT_MODEL_SIZES_MIB", "empty name"),
        ('{"a":"5120"}', "KUBEMOOT_MODEL_SIZES_MIB['a']", "whole MiB"),
        ('{"a":51.5}', "KUBEMOOT_MODEL_SIZES_MIB['a']", "whole MiB"),
        ('{"a":-1}', "KUBEMOOT_MODEL_SIZES_MIB['a']", "whole MiB"),
        ('{"a":true}', "KUBEMOOT_MODEL_SIZES_MIB['a']", "whole MiB"),
        ('{"a":99999999999}', "KUBEMOOT_MODEL_SIZES_MIB['a']", "whole MiB"),
        ("{" + ",".join(f'"m{i}":1' for i in range(300)) + "}", "KUBEMOOT_MODEL_SIZES_MIB",
         "at most"),
    ],
)
def test_malformed_sizes_name_the_variable(value: str, field: str, says: str) -> None:
    with pytest.raises(InputError) as caught:
        sizes_from_env({"KUBEMOOT_MODEL_SIZES_MIB": value})
    assert caught.value.field == field
    assert says in caught.value.describe()


@pytest.mark.parametrize("text", ["crew", "/crew", "ns/", "a/b/c", ""])
def test_a_crew_is_namespace_slash_name(text: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/CREW"):
        CrewRef.parse(text)


def test_crew_subjects_are_single_tokens_per_name() -> None:
    crew = CrewRef("crew-a", "pilot.v2")
    assert crew.ask_subject() == "kubemoot.crew.crew-a.pilot=2Ev2.ask"
    assert crew.select_subject("crew-a/x.y") == "kubemoot.crew.crew-a.pilot=2Ev2.agent." \
        "crew-a=2Fx=2Ey.select"
