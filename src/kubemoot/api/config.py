"""``KubemootConfig``: cluster-wide scheduler settings, each with its default here."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kubemoot.api.bounds import MAX_PARALLEL, MAX_WEIGHT
from kubemoot.api.meta import Condition, ObjectMeta, Resource, Strict

__all__ = [
    "DEFAULT_CONCURRENCY_FACTOR",
    "DEFAULT_IMAGE_LOCALITY_BONUS",
    "ConfigSpec",
    "ConfigStatus",
    "KubemootConfig",
    "SchedulerSettings",
]

DEFAULT_IMAGE_LOCALITY_BONUS = 20
DEFAULT_CONCURRENCY_FACTOR = 4


class SchedulerSettings(Strict):
    """``spec.scheduler``: how the operator-side scorer and filter behave."""

    strategy: Literal["spread", "binpack"] = "spread"
    image_locality_bonus: int = Field(
        default=DEFAULT_IMAGE_LOCALITY_BONUS, ge=0, le=MAX_WEIGHT, alias="imageLocalityBonus"
    )
    concurrency_factor: int = Field(
        default=DEFAULT_CONCURRENCY_FACTOR, ge=1, le=MAX_PARALLEL, alias="concurrencyFactor"
    )


class ConfigSpec(Strict):
    """``KubemootConfig.spec``."""

    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)


class ConfigStatus(Strict):
    """``KubemootConfig.status``."""

    observed_generation: int | None = Field(
        default=None, alias="observedGeneration",
        description="The metadata.generation this status was computed from.",
    )
    conditions: list[Condition] = Field(default_factory=list)


class KubemootConfig(Resource):
    """Cluster-scoped scheduler configuration; absent means every default."""

    KIND = "KubemootConfig"
    PLURAL = "kubemootconfigs"
    SHORT_NAMES = ("kmc",)
    NAMESPACED = False

    kind: Literal["KubemootConfig"] = "KubemootConfig"
    spec: ConfigSpec = Field(default_factory=ConfigSpec)
    status: ConfigStatus | None = None

    @classmethod
    def defaults(cls, name: str = "default") -> KubemootConfig:
        """A config with every default, for when a bundle or cluster declares none."""
        return cls(metadata=ObjectMeta(name=name))
