"""Runtime: the provider's engine and version must meet ``Model.spec.runtime``.

The version is what the engine reports (Ollama's ``/api/version``, published by the
probe as ``status.runtimeVersion``). A provider that has not reported one is UNKNOWN,
never FAIL: missing evidence makes an Agent wait, it does not rule the provider out.
"""

from __future__ import annotations

from typing import Self

from kubemoot.api.runtime import parse_runtime, parse_version
from kubemoot.gates import GateResult, Verdict
from kubemoot.scheduling.candidate import Placement
from kubemoot.scheduling.plugins._args import PluginArgs

__all__ = ["RuntimeGate"]

_NAME = "Runtime"
_NO_CONSTRAINT = GateResult.pass_(_NAME, "the Model names no runtime")
_FIELD = "status.runtimeVersion"


class RuntimeGate:
    """``spec.runtime`` (e.g. ``ollama>=0.6``) against the provider's type and version."""

    name = _NAME

    @classmethod
    def from_args(cls, args: PluginArgs) -> Self:
        return cls()

    def judge(self, candidate: Placement, /) -> Verdict:
        """The verdict of :meth:`check`, without its reason and evidence."""
        text = candidate.model.spec.runtime
        if text is None:
            return Verdict.PASS
        provider = candidate.provider
        if provider is None:
            return Verdict.UNKNOWN
        requirement = parse_runtime(text)
        if provider.spec.type != requirement.engine:
            return Verdict.FAIL
        reported = None if provider.status is None else provider.status.runtime_version
        version = None if reported is None else parse_version(reported)
        if version is None:
            return Verdict.UNKNOWN
        return Verdict.PASS if requirement.admits(version) else Verdict.FAIL

    def check(self, candidate: Placement, /) -> GateResult:
        text = candidate.model.spec.runtime
        if text is None:
            return _NO_CONSTRAINT
        requirement = parse_runtime(text)  # validated when the Model was parsed
        provider = candidate.provider
        if provider is None:
            return GateResult.unknown(self.name, "no provider, so no runtime version")
        name = provider.metadata.name
        if provider.spec.type != requirement.engine:
            return GateResult.fail(
                self.name,
                f"the Model needs {requirement.text}; provider {name} runs {provider.spec.type}",
                field="spec.type",
                value=provider.spec.type,
            )
        reported = None if provider.status is None else provider.status.runtime_version
        if reported is None:
            return GateResult.unknown(
                self.name,
                f"provider {name} has not reported its version; the Model needs "
                f"{requirement.text}",
                field=_FIELD,
            )
        version = parse_version(reported)
        if version is None:
            return GateResult.unknown(
                self.name,
                f'provider {name} reports version "{reported}", which is not a dotted version',
                field=_FIELD,
                value=reported,
            )
        if requirement.admits(version):
            return GateResult.pass_(
                self.name, f"{requirement.engine} {reported} meets {requirement.text}",
                field=_FIELD, value=reported,
            )
        return GateResult.fail(
            self.name,
            f"provider {name} runs {requirement.engine} {reported}; the Model needs "
            f"{requirement.text}",
            field=_FIELD,
            value=reported,
        )
