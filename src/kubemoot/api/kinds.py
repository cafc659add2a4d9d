"""The registry of custom resource kinds, in the order CRDs are printed."""

from __future__ import annotations

from kubemoot.api.agent import Agent
from kubemoot.api.archetype import MootArchetype
from kubemoot.api.config import KubemootConfig
from kubemoot.api.meta import Resource
from kubemoot.api.model import Model
from kubemoot.api.modelclass import ModelClass
from kubemoot.api.policy import CrewSchedulingPolicy
from kubemoot.api.provider import ModelProvider

__all__ = ["RESOURCE_TYPES", "AnyResource"]

AnyResource = (
    Model | ModelProvider | Agent | CrewSchedulingPolicy | MootArchetype | KubemootConfig
    | ModelClass
)

RESOURCE_TYPES: dict[str, type[Resource]] = {
    cls.KIND: cls
    for cls in (Model, ModelProvider, Agent, CrewSchedulingPolicy, MootArchetype, KubemootConfig,
                ModelClass)
}
