"""Total and used VRAM from an NVIDIA DCGM exporter.

Ollama reports what each model occupies but not how large the card is. The DCGM
exporter publishes framebuffer gauges in MiB per GPU (``DCGM_FI_DEV_FB_USED``,
``DCGM_FI_DEV_FB_FREE``, on newer exporters ``DCGM_FI_DEV_FB_RESERVED`` and sometimes
``DCGM_FI_DEV_FB_TOTAL``). One provider usually sits on one host, so by default the
readings of every GPU on the page are summed; a ``gpu`` selector (index or UUID) picks
one card when a host runs one engine per GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kubemoot.providers.protocol import (
    ProviderBadResponse,
    ProviderTimeout,
    ProviderUnavailable,
)

__all__ = ["VramReading", "fetch_dcgm_vram", "parse_dcgm_metrics"]

FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"
_WANTED = (FB_USED, FB_FREE, FB_RESERVED, FB_TOTAL)

# An exporter page is a few hundred KiB at most; anything far larger is not one.
MAX_METRICS_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class VramReading:
    """Framebuffer memory of one host (or one selected GPU), in MiB."""

    total_mib: int
    used_mib: int
    gpus: int = 1


def _gpu_matches(labels: dict[str, str], gpu: str | None) -> bool:
    if gpu is None:
        return True
    return gpu in (labels.get("gpu"), labels.get("UUID"), labels.get("uuid"))


def parse_dcgm_metrics(text: str, *, gpu: str | None = None,
                       source: str | None = None) -> VramReading:
    """Read framebuffer totals from DCGM exporter text.

    ``gpu`` selects one card by its ``gpu`` index label or its ``UUID``; without it the
    GPUs are summed. Total is ``FB_TOTAL`` when exported, else used + free (+ reserved).
    Raises :class:`ProviderBadResponse` on text that is not Prometheus exposition, on a
    page without framebuffer gauges, or on negative or non-finite values.
    """
    per_gpu: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name not in _WANTED or not _gpu_matches(sample.labels, gpu):
                    continue
                value = float(sample.value)
                if not math.isfinite(value) or value < 0:
                    raise ProviderBadResponse(
                        f"DCGM metric {sample.name} has an impossible value {value}",
                        endpoint=source,
                    )
                card = sample.labels.get("UUID") or sample.labels.get("gpu") or "?"
                per_gpu.setdefault(card, {})[sample.name] = value
    except ProviderBadResponse:
        raise
    except (ValueError, TypeError, IndexError, KeyError) as error:
        raise ProviderBadResponse(
            f"DCGM metrics are not valid Prometheus text: {error}", endpoint=source
        ) from None

    total = used = 0.0
    counted = 0
    for card, values in per_gpu.items():
        if FB_USED not in values or (FB_FREE not in values and FB_TOTAL not in values):
            raise ProviderBadResponse(
                f"DCGM metrics for GPU {card} lack {FB_USED} with {FB_FREE} or {FB_TOTAL}",
                endpoint=source,
            )
        used += values[FB_USED]
        if FB_TOTAL in values:
            total += values[FB_TOTAL]
        else:
            total += values[FB_USED] + values[FB_FREE] + values.get(FB_RESERVED, 0.0)
        counted += 1
    if counted == 0:
        which = f" for GPU {gpu}" if gpu is not None else ""
        raise ProviderBadResponse(
            f"DCGM metrics hold no framebuffer gauges{which}", endpoint=source
        )
    return VramReading(total_mib=int(total), used_mib=round(used), gpus=counted)


async def fetch_dcgm_vram(url: str, *, gpu: str | None = None, timeout: float = 10.0,
                          client: httpx.AsyncClient | None = None) -> VramReading:
    """GET a DCGM exporter's ``/metrics`` page and parse it; errors mapped to ours."""
    own = client is None
    http = client if client is not None else httpx.AsyncClient(timeout=timeout)
    try:
        try:
            async with http.stream("GET", url) as response:
                if response.status_code >= 400:
                    raise ProviderBadResponse(
                        f"DCGM exporter answered HTTP {response.status_code}",
                        endpoint=url, status=response.status_code,
                    )
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body.extend(chunk)
                    if len(body) > MAX_METRICS_BYTES:
                        raise ProviderBadResponse(
                            "DCGM exporter page exceeds the size limit", endpoint=url
                        )
        except httpx.TimeoutException:
            raise ProviderTimeout("DCGM exporter timed out", endpoint=url) from None
        except (httpx.ConnectError, httpx.ReadError, httpx.WriteError) as error:
            raise ProviderUnavailable(f"DCGM exporter unreachable: {error}",
                                      endpoint=url) from None
        except httpx.HTTPError as error:
            raise ProviderBadResponse(f"DCGM exporter: {error}", endpoint=url) from None
        text = body.decode("utf-8", errors="replace")
        return parse_dcgm_metrics(text, gpu=gpu, source=url)
    finally:
        if own:
            await http.aclose()
