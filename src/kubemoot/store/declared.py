"""Declared model sizes in the shared state: ``kubemoot_model_sizes/<model>``.

The operator is the only writer. It publishes, for every model identifier some Model
declares a ``vramMib`` for, the size a runtime should assume before any provider has
reported the model loaded (DESIGN §5's occupancy: observed, else declared, else
estimated). Agents and gateways outside the cluster have no Model resources; this
bucket is how the declaration reaches them.

Where Models on several providers share an identifier and declare different sizes the
largest is published: a cold load claimed too small is the costlier mistake (the
engine then evicts or refuses on its own), one claimed too large only waits longer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pydantic import Field

from kubemoot.api import Model
from kubemoot.store.documents import DOCUMENT_VERSION, _Doc
from kubemoot.store.keys import decode_token, encode_token
from kubemoot.store.protocol import Bucket, StoreError

__all__ = [
    "MODEL_SIZES_BUCKET",
    "DeclaredSize",
    "declared_sizes",
    "publish_declared_sizes",
    "read_declared_sizes",
]

log = logging.getLogger(__name__)

MODEL_SIZES_BUCKET = "kubemoot_model_sizes"


class DeclaredSize(_Doc):
    """``kubemoot_model_sizes/<model>``: one identifier's declared footprint."""

    version: int = DOCUMENT_VERSION
    model: str  # the identifier on the provider, e.g. qwen3:8b
    vram_mib: int = Field(ge=1)
    declared_by: list[str] = Field(default_factory=list)  # Model names, sorted
    updated_at: float | None = None

    @classmethod
    def from_json(cls, data: bytes) -> DeclaredSize:
        return cls.model_validate_json(data)


def declared_sizes(models: Iterable[Model]) -> dict[str, DeclaredSize]:
    """The document per identifier that ``models`` declare a size for (largest wins)."""
    found: dict[str, DeclaredSize] = {}
    for model in sorted(models, key=lambda m: m.metadata.name):
        size = model.spec.vram_mib
        if size is None:
            continue
        ident = model.spec.model
        doc = found.get(ident)
        if doc is None:
            found[ident] = DeclaredSize(model=ident, vram_mib=size,
                                        declared_by=[model.metadata.name])
        else:
            doc.vram_mib = max(doc.vram_mib, size)
            doc.declared_by.append(model.metadata.name)
    return found


async def publish_declared_sizes(
    bucket: Bucket, wanted: Mapping[str, DeclaredSize], *, now: float
) -> int:
    """Make the bucket hold exactly ``wanted``; returns how many keys were written or removed.

    A key is rewritten only when its size or declarers changed, so a steady cluster
    writes nothing. Store errors are logged and left to the next call.
    """
    changes = 0
    try:
        present = set(await bucket.keys())
        for ident, doc in sorted(wanted.items()):
            key = encode_token(ident)
            entry = await bucket.get(key) if key in present else None
            if entry is not None:
                try:
                    old = DeclaredSize.from_json(entry.value)
                except ValueError:
                    old = None
                if old is not None and (old.vram_mib, old.declared_by) == (
                    doc.vram_mib, doc.declared_by
                ):
                    continue
            stamped = doc.model_copy(update={"updated_at": now})
            await bucket.put(key, stamped.to_json())
            changes += 1
        for key in sorted(present - {encode_token(i) for i in wanted}):
            await bucket.delete(key)
            changes += 1
    except StoreError as error:
        log.warning("publishing declared model sizes failed: %s", error)
    return changes


async def read_declared_sizes(bucket: Bucket) -> dict[str, int]:
    """Every published declaration as ``{identifier: vramMiB}`` (unreadable keys skipped)."""
    sizes: dict[str, int] = {}
    for key in await bucket.keys():
        entry = await bucket.get(key)
        if entry is None:
            continue
        try:
            doc = DeclaredSize.from_json(entry.value)
        except ValueError:
            log.warning("skipping unreadable declared size %s", decode_token(key))
            continue
        sizes[doc.model] = doc.vram_mib
    return sizes
