"""Kubemoot's custom resources (group ``kubemoot.ai``, version ``v1alpha1``).

Typed models of the seven kinds, Kubernetes label selectors, the YAML loader and the CRD
manifests generated from the models. This package imports nothing else of ours, so every
other layer can depend on it. Bad input surfaces as :class:`InputError` only.
"""

from __future__ import annotations

from kubemoot.api.agent import (
    CREW_LABEL,
    Agent,
    AgentScheduling,
    AgentSpec,
    AgentStatus,
    DecisionSummary,
    GateFailure,
    LastUnschedulable,
    PhaseBinding,
    PhaseCandidate,
)
from kubemoot.api.archetype import (
    ArchetypePhase,
    ArchetypeSpec,
    ArchetypeStatus,
    MootArchetype,
    Phase,
)
from kubemoot.api.config import (
    DEFAULT_CONCURRENCY_FACTOR,
    DEFAULT_IMAGE_LOCALITY_BONUS,
    ConfigSpec,
    ConfigStatus,
    KubemootConfig,
    SchedulerSettings,
)
from kubemoot.api.crds import crd_for, crd_manifests, validate_against_crd
from kubemoot.api.errors import InputError
from kubemoot.api.kinds import RESOURCE_TYPES, AnyResource
from kubemoot.api.loader import (
    Bundle,
    SourceDocument,
    input_error_from_validation,
    iter_documents,
    load_bundle,
    load_single,
    parse_manifest,
    parse_resource,
)
from kubemoot.api.meta import (
    API_VERSION,
    DEFAULT_NAMESPACE,
    GROUP,
    VERSION,
    Condition,
    ObjectMeta,
    Resource,
)
from kubemoot.api.model import License, Model, ModelSpec, ModelStatus
from kubemoot.api.modelclass import ModelClass, ModelClassSpec, ModelClassStatus
from kubemoot.api.policy import (
    DEFAULT_MAX_AGE_SECONDS,
    CrewSchedulingPolicy,
    Freshness,
    PolicySpec,
    PolicyStatus,
    PreferTerm,
    SchedulingRule,
    TopologySpread,
)
from kubemoot.api.provider import (
    DEFAULT_PROVIDER_WEIGHT,
    LoadedModel,
    ModelProvider,
    ProviderCapacity,
    ProviderPolicy,
    ProviderScheduling,
    ProviderSpec,
    ProviderStatus,
)
from kubemoot.api.selectors import (
    OPERATORS,
    LabelSelector,
    LabelSelectorRequirement,
    SelectorOperator,
    selector_matches,
)

__all__ = [
    "API_VERSION",
    "CREW_LABEL",
    "DEFAULT_CONCURRENCY_FACTOR",
    "DEFAULT_IMAGE_LOCALITY_BONUS",
    "DEFAULT_MAX_AGE_SECONDS",
    "DEFAULT_NAMESPACE",
    "DEFAULT_PROVIDER_WEIGHT",
    "GROUP",
    "OPERATORS",
    "RESOURCE_TYPES",
    "VERSION",
    "Agent",
    "AgentScheduling",
    "AgentSpec",
    "AgentStatus",
    "AnyResource",
    "ArchetypePhase",
    "ArchetypeSpec",
    "ArchetypeStatus",
    "Bundle",
    "Condition",
    "ConfigSpec",
    "ConfigStatus",
    "CrewSchedulingPolicy",
    "DecisionSummary",
    "Freshness",
    "GateFailure",
    "InputError",
    "KubemootConfig",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LastUnschedulable",
    "License",
    "LoadedModel",
    "Model",
    "ModelClass",
    "ModelClassSpec",
    "ModelClassStatus",
    "ModelProvider",
    "ModelSpec",
    "ModelStatus",
    "MootArchetype",
    "ObjectMeta",
    "Phase",
    "PhaseBinding",
    "PhaseCandidate",
    "PolicySpec",
    "PolicyStatus",
    "PreferTerm",
    "ProviderCapacity",
    "ProviderPolicy",
    "ProviderScheduling",
    "ProviderSpec",
    "ProviderStatus",
    "Resource",
    "SchedulerSettings",
    "SchedulingRule",
    "SelectorOperator",
    "SourceDocument",
    "TopologySpread",
    "crd_for",
    "crd_manifests",
    "input_error_from_validation",
    "iter_documents",
    "load_bundle",
    "load_single",
    "parse_manifest",
    "parse_resource",
    "selector_matches",
    "validate_against_crd",
]
