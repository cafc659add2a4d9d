"""DCGM exporter text → total and used VRAM."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from kubemoot.emulation.server import OllamaEmulator
from kubemoot.providers.dcgm import VramReading, fetch_dcgm_vram, parse_dcgm_metrics
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.protocol import ProviderBadResponse, ProviderUnavailable
from tests.providers.conftest import serve_app

HELP = (
    "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n"
    "# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
    "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n"
    "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
)


def gpu(index: int, used: float, free: float, *, reserved: float | None = None,
        total: float | None = None) -> str:
    labels = f'gpu="{index}",UUID="GPU-{index:04d}",Hostname="node-a"'
    lines = [f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}",
             f"DCGM_FI_DEV_FB_FREE{{{labels}}} {free}"]
    if reserved is not None:
        lines.append(f"DCGM_FI_DEV_FB_RESERVED{{{labels}}} {reserved}")
    if total is not None:
        lines.append(f"DCGM_FI_DEV_FB_TOTAL{{{labels}}} {total}")
    return "\n".join(lines) + "\n"


OTHER = 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0000"} 87\n'


@pytest.mark.parametrize(
    ("text", "selector", "expected"),
    [
        pytest.param(HELP + gpu(0, 1000, 23000), None, VramReading(24000, 1000, 1), id="one"),
        pytest.param(HELP + gpu(0, 1000, 23000) + gpu(1, 500, 7500), None,
                     VramReading(32000, 1500, 2), id="summed"),
        pytest.param(gpu(0, 1000, 23000) + gpu(1, 500, 7500), "1",
                     VramReading(8000, 500, 1), id="by-index"),
        pytest.param(gpu(0, 1000, 23000) + gpu(1, 500, 7500), "GPU-0000",
                     VramReading(24000, 1000, 1), id="by-uuid"),
        pytest.param(gpu(0, 1000, 22500, reserved=500), None, VramReading(24000, 1000, 1),
                     id="reserved-counts"),
        pytest.param(gpu(0, 1000, 20000, total=24576), None, VramReading(24576, 1000, 1),
                     id="total-wins"),
        pytest.param(OTHER + gpu(0, 0, 81920), None, VramReading(81920, 0, 1),
                     id="other-metrics-ignored"),
    ],
)
def test_parse(text: str, selector: str | None, expected: VramReading) -> None:
    assert parse_dcgm_metrics(text, gpu=selector) == expected


@pytest.mark.parametrize(
    ("text", "selector"),
    [
        pytest.param("<html>502 Bad Gateway</html>", None, id="html"),
        pytest.param("DCGM_FI_DEV_FB_USED{gpu=\"0\" 12", None, id="broken-labels"),
        pytest.param("DCGM_FI_DEV_FB_USED{gpu=\"0\"} lots", None, id="not-a-number"),
        pytest.param("", None, id="empty"),
        pytest.param(OTHER, None, id="no-framebuffer"),
        pytest.param('DCGM_FI_DEV_FB_USED{gpu="0"} 12\n', None, id="used-only"),
        pytest.param(gpu(0, -5, 100), None, id="negative"),
        pytest.param(gpu(0, float("nan"), 100), None, id="nan"),
        pytest.param(gpu(0, 1, 100), "7", id="selector-matches-nothing"),
    ],
)
def test_malformed_text_is_a_bad_response(text: str, selector: str | None) -> None:
    with pytest.raises(ProviderBadResponse):
        parse_dcgm_metrics(text, gpu=selector)


def _exporter(body: str, status: int = 200) -> Starlette:
    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse(body, status_code=status)

    return Starlette(routes=[Route("/metrics", metrics)])


async def test_fetch_over_http() -> None:
    with serve_app(_exporter(HELP + gpu(0, 2048, 22528))) as url:
        assert await fetch_dcgm_vram(f"{url}/metrics") == VramReading(24576, 2048, 1)


async def test_fetch_errors_are_mapped(closed_port: int) -> None:
    with serve_app(_exporter("oops", status=503)) as url, \
            pytest.raises(ProviderBadResponse, match="503"):
        await fetch_dcgm_vram(f"{url}/metrics")
    with pytest.raises(ProviderUnavailable):
        await fetch_dcgm_vram(f"http://127.0.0.1:{closed_port}/metrics")


async def test_probe_takes_vram_from_dcgm(emulator: OllamaEmulator, closed_port: int) -> None:
    with serve_app(_exporter(gpu(0, 3000, 21576))) as url:
        async with OllamaProvider("gpu", emulator.url, total_vram_mib=8192,
                                  dcgm_url=f"{url}/metrics") as client:
            state = await client.probe()
    assert (state.total_vram_mib, state.used_vram_mib) == (24576, 3000)
    # a dead exporter leaves the provider ready, with the configured total
    async with OllamaProvider("gpu", emulator.url, total_vram_mib=8192,
                              dcgm_url=f"http://127.0.0.1:{closed_port}/m") as client:
        state = await client.probe()
        assert state.ready and state.total_vram_mib == 8192
        assert isinstance(client.last_dcgm_error, ProviderUnavailable)
