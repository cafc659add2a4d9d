"""occupancy(M): the VRAM a model takes once loaded, KV slab included.

Ollama reserves a model's whole context cache when it loads it, so one number per
model covers weights and cache, and a call adds nothing on top. Sources, best first:

1. the footprint a provider observed when the model was loaded (the first observation
   is kept — later sightings of the same model do not move it);
2. the footprint a ticket claimed for a copy it is loading (the first one seen): the
   claimer sized that load, possibly from an observation this process has not made,
   so it beats a declaration; it is not the engine's own report, so any real
   observation beats it;
3. the size the Model resource declares (``spec.vramMib``);
4. the on-disk size plus an estimate of the cache slab
   (num_ctx × num_parallel × bytes per token).

``None`` means no source knows the model; such a model can only be used warm.
"""

from __future__ import annotations

from collections.abc import Mapping

from kubemoot.runtime.snapshot import FleetSnapshot
from kubemoot.settings import RuntimeSettings

_MIB = 1024 * 1024


class OccupancyBook:
    """Resolves occupancy(M) and remembers the first observed footprint of each model."""

    def __init__(
        self,
        *,
        settings: RuntimeSettings | None = None,
        declared: Mapping[str, int] | None = None,
    ) -> None:
        self._settings = settings or RuntimeSettings()
        self._declared = dict(declared or {})
        self._observed: dict[str, int] = {}
        self._claimed: dict[str, int] = {}  # footprints of loading tickets
        self._last_generation = 0  # the fleet index observed last

    def declare(self, model: str, vram_mib: int) -> None:
        """Record a Model's declared ``vramMib`` (used until the model is observed)."""
        self._declared[model] = vram_mib

    def observe(self, fleet: FleetSnapshot) -> None:
        """Keep the first footprint any provider reports for each model."""
        index = fleet.index
        if index.generation == self._last_generation:
            return  # one placement asks many times about one snapshot
        # An index derived from the one seen last only adds its changed providers.
        fresh = index.changed if index.parent == self._last_generation else index.providers
        self._last_generation = index.generation
        for provider in fresh:
            state = provider.state
            for model, mib in state.loaded_model_footprints.items():
                if mib > 0:
                    self._observed.setdefault(model, mib)
            for loaded in state.loaded_models:
                if loaded.size_mib > 0:
                    self._observed.setdefault(loaded.name, loaded.size_mib)
            for model in provider.copies:
                claimed = provider.load_mib(model)
                if claimed is not None:
                    self._claimed.setdefault(model, claimed)

    def occupancy(self, model: str, fleet: FleetSnapshot) -> int | None:
        """occupancy(M) in MiB, or ``None`` when nothing at all is known about M."""
        self.observe(fleet)
        observed = self._observed.get(model)
        if observed is not None:
            return observed
        claimed = self._claimed.get(model)
        if claimed is not None:
            return claimed
        declared = self._declared.get(model)
        if declared is not None:
            return declared
        return self._estimate(model, fleet)

    def known(self) -> dict[str, int]:
        """Every model a source other than the estimate sizes, with its occupancy(M)."""
        sized = dict(self._declared)
        sized.update(self._claimed)
        sized.update(self._observed)
        return sized

    def source(self, model: str) -> str:
        """Which source gave the last answer for M: observed, claimed, declared, estimated."""
        if model in self._observed:
            return "observed"
        if model in self._claimed:
            return "claimed"
        if model in self._declared:
            return "declared"
        return "estimated"

    def _estimate(self, model: str, fleet: FleetSnapshot) -> int | None:
        for provider in fleet.providers:
            disk = provider.state.disk_sizes_mib.get(model)
            if disk is None:
                continue
            num_ctx = provider.state.context_length or self._settings.estimate_num_ctx
            parallel = provider.state.max_parallel or self._settings.estimate_num_parallel
            slab_bytes = num_ctx * parallel * self._settings.kv_bytes_per_token
            return disk + -(-slab_bytes // _MIB)  # round the slab up to whole MiB
        return None
