"""Typed, versioned JSON documents of the three shared-state buckets (DESIGN §6).

Field names on the wire are camelCase like the CRDs; Python attributes are snake_case.
Every document carries ``version`` so a reader can refuse a format it does not know.
Times are seconds since the Unix epoch (floats), read from the injected clock.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kubemoot.settings import DEFAULT_RESERVE_MIB

PROVIDER_STATE_BUCKET = "kubemoot_provider_state"
PROVIDER_TICKETS_BUCKET = "kubemoot_provider_tickets"
#: Claims and releases that lost a race, announced for any writer of the ticket
#: document to apply (one key per request, so announcing needs no compare-and-set).
TICKET_REQUESTS_BUCKET = "kubemoot_ticket_requests"
#: Its max age: removes the key of an announcer that died before deleting it (nobody
#: applies a request after its ``expiresAt`` in any case, a fraction of a second).
TICKET_REQUESTS_MAX_AGE_SECONDS = 60.0
MODEL_DEMAND_BUCKET = "kubemoot_model_demand"
#: The demand bucket's max age (DESIGN §6): whatever its writers forget is gone by then.
MODEL_DEMAND_MAX_AGE_SECONDS = 6 * 3600.0

DOCUMENT_VERSION = 1


def wire_name(attribute: str) -> str:
    """snake_case → the wire's camelCase, spelling mebibytes ``MiB`` as DESIGN §6 does."""
    return re.sub(r"Mib(?=[A-Z]|$)", "MiB", to_camel(attribute))


class _Doc(BaseModel):
    model_config = ConfigDict(
        alias_generator=wire_name, populate_by_name=True, extra="ignore", frozen=False
    )

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode("utf-8")


class ResidentModel(_Doc):
    """A model resident on a provider, as its engine reports it."""

    name: str
    size_mib: int = Field(ge=0)
    context_length: int | None = None
    digest: str | None = None
    expires_at: float | None = None


class ProviderState(_Doc):
    """``kubemoot_provider_state/<provider>``: what a probe saw."""

    version: int = DOCUMENT_VERSION
    provider: str
    endpoint: str
    ready: bool
    reason: str | None = None  # why not ready, for people
    last_probed_at: float | None = None
    # How often its publisher probes (seconds): readers judge ``lastProbedAt`` by it.
    # None (written by hand, by a publisher that writes on every change, or by an older
    # one): the state makes no promise of freshness and is taken as is.
    probe_interval_seconds: float | None = None
    total_vram_mib: int | None = None  # None: unknown, which never proves "too large"
    used_vram_mib: int | None = None
    reserve_mib: int = DEFAULT_RESERVE_MIB
    max_parallel: int = 1
    context_length: int | None = None  # configured per-slot context; None: unknown
    runtime_version: str | None = None  # the engine's own version (/api/version); None: unknown
    loaded_models: list[ResidentModel] = Field(default_factory=list)
    # first observed KV-inclusive footprint per model, kept across unloads
    loaded_model_footprints: dict[str, int] = Field(default_factory=dict)
    # on-disk sizes from /api/tags, for the occupancy estimate of never-loaded models
    disk_sizes_mib: dict[str, int] = Field(default_factory=dict)
    # models kept resident here (Model.spec.pinned): never chosen as eviction victims
    pinned: list[str] = Field(default_factory=list)
    # Written by an agent's direct probe while the operator has published nothing (the
    # spec's fallback): what it lacks, such as the VRAM total, is not known *yet*, so a
    # call that would need it waits for the operator's state instead of being refused.
    provisional: bool = False

    @classmethod
    def from_json(cls, data: bytes) -> ProviderState:
        return cls.model_validate_json(data)


class TicketState(StrEnum):
    """What a ticket's memory is doing."""

    LOADING = "loading"  # the model is being loaded for this call
    RUNNING = "running"  # the call runs on a resident copy
    HELD = "held"  # a plan made at selection, not yet used by a call


class Ticket(_Doc):
    """One claim on a provider's VRAM budget."""

    ticket_id: str
    model: str
    model_footprint_mib: int = Field(ge=0)  # new VRAM this ticket spends (0 on a warm copy)
    holder_id: str
    state: TicketState
    started_at: float
    expires_at: float
    evicts: dict[str, int] = Field(default_factory=dict)  # planned victims: model → MiB
    # The planned victims no earlier live ticket planned when this one was granted, set
    # by whichever writer granted it: its holder reports their eviction (once, DESIGN §9).
    # Absent (None) on tickets that plan no victims: the wire stays DESIGN §6's there.
    evicts_first: list[str] | None = None


class LineEntry(_Doc):
    """A claimer the budget refused and that will come back: its place in the line."""

    holder_id: str
    footprint_mib: int = Field(ge=0)
    since: float
    expires_at: float


class ProviderTickets(_Doc):
    """``kubemoot_provider_tickets/<provider>``: every live ticket on one provider.

    One document per provider so a single compare-and-set covers its whole budget.
    ``line`` lists, first come first, the claimers refused for memory that are still
    trying; memory freed on the provider goes to them in that order. ``served`` maps
    the ticket id of every announced claim already granted to the time its
    announcement lapses: a writer that still sees the announcement must not grant it
    a second time after its holder released it. Documents written before either field
    existed read as an empty line and nothing served.
    """

    version: int = DOCUMENT_VERSION
    provider: str
    tickets: list[Ticket] = Field(default_factory=list)
    line: list[LineEntry] = Field(default_factory=list)
    served: dict[str, float] = Field(default_factory=dict)

    @classmethod
    def from_json(cls, data: bytes) -> ProviderTickets:
        return cls.model_validate_json(data)

    def to_json(self) -> bytes:
        # No field of the document or its tickets is None but a ticket's evictsFirst
        # when it plans no victims, which is then left off the wire.
        return self.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8")

    def active(self, now: float) -> list[Ticket]:
        """Tickets not yet expired; readers ignore the rest."""
        return [t for t in self.tickets if t.expires_at > now]


class RequestKind(StrEnum):
    """What an announced ticket request asks of the ticket document."""

    CLAIM = "claim"
    RELEASE = "release"


class ClaimCondition(_Doc):
    """What a claim asks of its provider besides memory, as data any writer can judge.

    The claimer priced an option on its view of the provider; the condition says what
    must still hold in the documents being written for the option to be what it
    priced, so a writer in another process can grant an announced claim exactly when
    its claimer would have. It concerns the ticket's model.
    """

    # The provider must be ready (always asked for today; kept so a later claim may not).
    ready: bool = True
    # The model's context on the provider must hold this many tokens (None: no prompt).
    prompt_tokens: int | None = None
    # A copy of the model must be resident or loading, and not planned for unload.
    warm: bool = False
    # A call slot on that copy must be free once this many earlier calls took theirs
    # (None: the call queues and needs no free slot).
    free_slot_ahead: int | None = None
    # Every one of these must still be resident and without a ticket of its own.
    idle_victims: list[str] = Field(default_factory=list)


class TicketRequest(_Doc):
    """One announced operation: a claim (with the ticket to grant) or a release.

    Past ``expiresAt`` nobody applies it. A claim carries its condition as data (a
    check in code, which another process cannot run, is never announced).
    """

    provider: str
    kind: RequestKind
    ticket_id: str
    ticket: Ticket | None = None  # CLAIM: the ticket to grant
    condition: ClaimCondition | None = None  # CLAIM: None asks only for the memory
    expires_at: float

    @property
    def identity(self) -> tuple[str, RequestKind, str]:
        """Which operation this is, whoever announced or applied it."""
        return self.provider, self.kind, self.ticket_id


class AnnouncedRequests(_Doc):
    """``kubemoot_ticket_requests/<provider>.<announcementId>``: requests that lost a race.

    A process whose compare-and-set on the ticket document lost writes what that write
    carried here, under a key of its own (one key for all of its operations on the
    provider, as its write would have batched them), and keeps trying; whichever process
    writes the document next applies every announced request it knows of, in the order
    they were announced (the bucket's revisions), in the same write.
    """

    version: int = DOCUMENT_VERSION
    provider: str
    requests: list[TicketRequest] = Field(default_factory=list)

    @classmethod
    def from_json(cls, data: bytes) -> AnnouncedRequests:
        return cls.model_validate_json(data)


class DemandEntry(_Doc):
    """``wait.<model>.<agent>``, ``intent.<model>.<agent>``, ``use.<model>``."""

    version: int = DOCUMENT_VERSION
    expires_at: float
    count: float = 1.0  # for use.<model>: recent calls; otherwise 1
    last_used_at: float | None = None

    @classmethod
    def from_json(cls, data: bytes) -> DemandEntry:
        return cls.model_validate_json(data)


class SelectionEntry(_Doc):
    """``sel.<agent>``: the models an agent names and how often it is selected."""

    version: int = DOCUMENT_VERSION
    expires_at: float
    models: list[str] = Field(default_factory=list)
    frequency: float = 0.0

    @classmethod
    def from_json(cls, data: bytes) -> SelectionEntry:
        return cls.model_validate_json(data)
