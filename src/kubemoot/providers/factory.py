"""One way a process makes its provider clients.

A process reads the deployment's settings once, where it is assembled (its entry point),
and builds one :class:`ProviderClients` from them. Every Ollama client it needs — the
prober's, the planner's for loads and unloads, the chat pool's, a probe command's — comes
from that factory, so all of them honour the same read timeout, call deadline and clock.
The adapter itself (:class:`~kubemoot.providers.ollama.OllamaProvider`) takes those as
plain values and never reads the environment (DESIGN §10).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubemoot.clock import Clock
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderState
from kubemoot.settings import DEFAULT_RESERVE_MIB, DEFAULTS, RuntimeSettings

__all__ = ["ProviderClients"]


@dataclass(frozen=True, slots=True)
class ProviderClients:
    """Builds a process's provider clients with the deployment's timeouts and clock.

    ``kind`` is the client class: the demo counts unloads and times replies with
    subclasses of the Ollama adapter, and gets them from here like everyone else.
    """

    #: How long one read of a provider's answer may take.
    read_timeout: float = DEFAULTS.provider_read_timeout_seconds
    #: How long one whole provider call may take, every read and retry included.
    call_deadline: float = DEFAULTS.provider_call_deadline_seconds
    clock: Clock | None = None
    kind: type[OllamaProvider] = OllamaProvider

    @classmethod
    def of(cls, settings: RuntimeSettings, *, clock: Clock | None = None,
           kind: type[OllamaProvider] = OllamaProvider) -> ProviderClients:
        """The factory of a process whose entry point read ``settings``."""
        return cls(read_timeout=settings.provider_read_timeout_seconds,
                   call_deadline=settings.provider_call_deadline_seconds,
                   clock=clock, kind=kind)

    def client(
        self,
        name: str,
        endpoint: str,
        *,
        context_length: int | None = None,
        num_parallel: int = 1,
        reserve_mib: int = DEFAULT_RESERVE_MIB,
        total_vram_mib: int | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        max_retries: int = 1,
        dcgm_url: str | None = None,
        dcgm_gpu: str | None = None,
    ) -> OllamaProvider:
        """A client of the provider ``name`` at ``endpoint``.

        ``timeout`` and ``deadline`` override the deployment's for this client (a probe
        bounds the whole call by its own timeout; the chat pool may ask for its own read
        timeout); None keeps the deployment's.
        """
        return self.kind(
            name, endpoint, context_length=context_length, num_parallel=num_parallel,
            reserve_mib=reserve_mib, total_vram_mib=total_vram_mib,
            timeout=self.read_timeout if timeout is None else timeout,
            deadline=self.call_deadline if deadline is None else deadline,
            max_retries=max_retries, clock=self.clock, dcgm_url=dcgm_url, dcgm_gpu=dcgm_gpu)

    def for_state(self, state: ProviderState) -> OllamaProvider:
        """A client of a provider as its published state describes it (an agent learns
        its providers from the shared state)."""
        return self.client(state.provider, state.endpoint, context_length=state.context_length,
                           num_parallel=state.max_parallel, reserve_mib=state.reserve_mib,
                           total_vram_mib=state.total_vram_mib)
