"""The prober: never raises, says why a provider is not ready, keeps first footprints."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kubemoot.clock import ManualClock
from kubemoot.emulation.server import HostileKind, OllamaEmulator
from kubemoot.providers.ollama import OllamaProvider
from kubemoot.providers.prober import Prober, publish_to_kv
from kubemoot.providers.protocol import ProviderState
from kubemoot.store.documents import PROVIDER_STATE_BUCKET
from kubemoot.store.memory import MemoryKV
from tests.providers.conftest import MEDIUM, SMALL, serve_app


def provider(url: str, *, name: str = "gpu-a", timeout: float = 5.0) -> OllamaProvider:
    return OllamaProvider(name, url, context_length=1024, num_parallel=2, reserve_mib=512,
                          total_vram_mib=8192, timeout=timeout, max_retries=0)


async def probe_once(client: OllamaProvider, clock: ManualClock | None = None) -> ProviderState:
    try:
        [state] = await Prober([client], clock=clock or ManualClock(50.0)).probe_all()
    finally:
        await client.close()
    return state


def assert_not_ready(state: ProviderState, *words: str) -> None:
    assert state.ready is False
    assert state.reason
    for word in words:
        assert word in state.reason
    assert "Traceback" not in state.reason
    # the spec values still describe the provider
    assert (state.max_parallel, state.context_length, state.reserve_mib) == (2, 1024, 512)
    assert state.loaded_models == []


async def test_refused_connection(closed_port: int) -> None:
    state = await probe_once(provider(f"http://127.0.0.1:{closed_port}"))
    assert_not_ready(state, "cannot connect", "refused")
    assert state.last_probed_at == 50.0


async def test_timeout(emulator: OllamaEmulator) -> None:
    # stalled far beyond the timeout: the probe's deadline ends it however loaded the
    # machine is (the emulator's shutdown cuts the stalled answer off)
    emulator.stall_next(60.0, path="/api/ps")
    state = await probe_once(provider(emulator.url, timeout=0.1))
    assert_not_ready(state, "no answer within 0.1 s")


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_error(emulator: OllamaEmulator, status: int) -> None:
    emulator.fail_next(status, path="/api/tags")
    assert_not_ready(await probe_once(provider(emulator.url)), f"HTTP {status}")


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("malformed", ["malformed body"]),
        ("not-json", ["malformed body"]),
        ("wrong-shape", ["malformed body"]),
        ("hostile-values", ["malformed body"]),
        ("escaped-name", ["name is not a model name"]),
        ("nested", ["malformed body"]),
        ("huge", ["exceeds"]),
        ("truncated", ["broken HTTP answer"]),
    ],
)
async def test_malformed_truncated_and_hostile_bodies(
    emulator: OllamaEmulator, kind: HostileKind, words: list[str],
) -> None:
    emulator.hostile_next(kind, path="/api/ps")
    state = await probe_once(provider(emulator.url))
    assert_not_ready(state, *words)
    assert len(state.reason or "") < 400 and "\x1b" not in (state.reason or "")


def _app(body: bytes, *, status: int = 200) -> Starlette:
    """A tiny server whose /api/ps answers one fixed body (and /api/tags an empty list)."""
    async def ps(request: Request) -> Response:
        return Response(body, status_code=status, media_type="application/json")

    async def tags(request: Request) -> Response:
        return Response(b'{"models": []}', media_type="application/json")

    return Starlette(routes=[Route("/api/ps", ps), Route("/api/tags", tags)])


@pytest.mark.parametrize(
    ("body", "words"),
    [
        pytest.param(b'{"models": [{"name": "m", "size_vram": -1}]}', ["malformed"],
                     id="negative-size"),
        pytest.param(b'{"models": [{"name": "m", "size_vram": 1152921504606846976}]}',
                     ["plausible"], id="exabyte-size"),
        pytest.param(b'{"models": [{"name": "m", "size_vram": 1e300}]}', ["malformed"],
                     id="absurd-size"),
        pytest.param(b'{"models": [{"size_vram": 5}]}', ["without a name"], id="nameless"),
        pytest.param(b'{"models": [{"name": "m", "context_length": -4}]}', ["negative"],
                     id="negative-context"),
        pytest.param(b'[1, 2, 3]', ["malformed"], id="a-list"),
        pytest.param(b'null', ["malformed"], id="null"),
        pytest.param(b'\xff\xfe\x00garbage', ["malformed"], id="binary"),
    ],
)
async def test_bodies_from_a_foreign_server(body: bytes, words: list[str]) -> None:
    with serve_app(_app(body)) as url:
        state = await probe_once(provider(url))
    assert_not_ready(state, *words)


class _BrokenClient:
    """An adapter with a bug: the prober must survive it, too."""

    name = "broken"
    endpoint = "http://broken.invalid"

    async def probe(self) -> ProviderState:
        raise RuntimeError("adapter bug")


async def test_an_adapter_bug_is_a_reason_not_a_crash(emulator: OllamaEmulator) -> None:
    healthy = provider(emulator.url)
    prober = Prober([_BrokenClient(), healthy], clock=ManualClock())  # type: ignore[list-item]
    broken, ok = await prober.probe_all()
    await healthy.close()
    assert not broken.ready and "adapter bug" in (broken.reason or "")
    assert broken.max_parallel == 1  # no spec values known: the defaults
    assert ok.ready


async def test_first_observed_footprint_is_kept_across_probes_and_unloads(
    emulator: OllamaEmulator,
) -> None:
    clock = ManualClock(10.0)
    client = provider(emulator.url)
    prober = Prober([client], clock=clock)
    await client.preload(SMALL.name, num_ctx=1024)  # 1008 MiB
    [first] = await prober.probe_all()
    assert first.loaded_model_footprints == {SMALL.name: 1008}
    await client.preload(SMALL.name, num_ctx=4096)  # reloaded: 1032 MiB now
    clock.advance(30)
    [second] = await prober.probe_all()
    assert second.loaded_models[0].size_mib == 1032  # what is resident now …
    assert second.loaded_model_footprints[SMALL.name] == 1008  # … and what was first seen
    await client.unload(SMALL.name)
    await client.preload(MEDIUM.name)
    [third] = await prober.probe_all()
    await client.close()
    assert [m.name for m in third.loaded_models] == [MEDIUM.name]
    assert third.loaded_model_footprints == {SMALL.name: 1008, MEDIUM.name: 3000}
    assert third.last_probed_at == 40.0


async def test_published_to_kv_and_kept_across_a_prober_restart(
    emulator: OllamaEmulator, closed_port: int,
) -> None:
    kv = MemoryKV()
    bucket = await kv.bucket(PROVIDER_STATE_BUCKET)
    client = provider(emulator.url, name="gpu/a:1")
    await client.preload(SMALL.name)
    await Prober([client], clock=ManualClock(), publish=publish_to_kv(bucket)).probe_all()
    await client.unload(SMALL.name)
    await client.preload(SMALL.name, num_ctx=4096)  # a different footprint now
    # a new prober (say, after a restart) reads the stored document first
    restarted = Prober([client], clock=ManualClock(5.0), publish=publish_to_kv(bucket))
    [state] = await restarted.probe_all()
    await client.close()
    assert state.loaded_model_footprints == {SMALL.name: 1008}
    assert await bucket.keys() == ["gpu=2Fa=3A1"]  # key = encode_token(provider)
    entry = await bucket.get("gpu=2Fa=3A1")
    assert entry is not None
    stored = ProviderState.from_json(entry.value)
    assert stored == state and stored.last_probed_at == 5.0
    # a down provider is published not ready, still carrying what was learned
    down = provider(f"http://127.0.0.1:{closed_port}", name="gpu/a:1")
    await Prober([down], clock=ManualClock(9.0), publish=publish_to_kv(bucket)).probe_all()
    await down.close()
    entry = await bucket.get("gpu=2Fa=3A1")
    assert entry is not None
    stored = ProviderState.from_json(entry.value)
    assert not stored.ready and stored.loaded_model_footprints == {SMALL.name: 1008}
    await kv.close()


async def test_run_probes_every_interval_of_the_clock(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    emulator = make_emulator()
    clock = ManualClock(0.0)
    seen: list[float] = []

    async def publish(state: ProviderState) -> None:
        assert state.last_probed_at is not None
        seen.append(state.last_probed_at)

    client = provider(emulator.url)
    await Prober([client], clock=clock, publish=publish).run(15.0, rounds=3)
    await client.close()
    assert seen == [0.0, 15.0, 30.0]


async def test_a_caller_that_just_probed_starts_the_loop_an_interval_on(
    make_emulator: Callable[..., OllamaEmulator],
) -> None:
    # the gateway probes every provider before it serves, then starts this loop: a
    # second probe at once could overwrite what its first calls are placed on
    emulator = make_emulator()
    clock = ManualClock(0.0)
    seen: list[float] = []

    async def publish(state: ProviderState) -> None:
        assert state.last_probed_at is not None
        seen.append(state.last_probed_at)

    client = provider(emulator.url)
    await Prober([client], clock=clock, publish=publish).run(15.0, rounds=2, probe_first=False)
    await client.close()
    assert seen == [15.0, 30.0]


async def test_each_state_says_how_often_its_provider_is_probed(
    emulator: OllamaEmulator,
) -> None:
    # readers judge a state's age by it (runtime/freshness.py)
    kv = MemoryKV()
    bucket = await kv.bucket(PROVIDER_STATE_BUCKET)
    client = provider(emulator.url)
    periodic = Prober([client], clock=ManualClock(), publish=publish_to_kv(bucket),
                      interval_seconds=5.0)
    [state] = await periodic.probe_all()
    assert state.probe_interval_seconds == 5.0
    # a prober that probes now and then (an agent's, after a load) keeps that promise
    [state] = await Prober([client], clock=ManualClock(1.0),
                           publish=publish_to_kv(bucket)).probe_all()
    assert state.probe_interval_seconds == 5.0
    # one that runs a loop promises its own interval
    seen: list[float | None] = []

    async def publish(state: ProviderState) -> None:
        seen.append(state.probe_interval_seconds)

    await Prober([client], clock=ManualClock(), publish=publish).run(7.0, rounds=1)
    await client.close()
    await kv.close()
    assert seen == [7.0]
