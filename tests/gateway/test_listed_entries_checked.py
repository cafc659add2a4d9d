"""The fleet listings show only entries the prober would accept.

``GET /api/ps`` and ``GET /api/tags`` merge every engine's answer. An engine entry the
prober refuses (a name carrying terminal escapes, a size or a context that is not one)
is left out, with a warning naming the engine and the field; the same engine's other
entries and the other engines' lists are still shown. Through the official ``ollama``
client against real emulators: passed on, a mistyped entry failed the client's whole
``ps()``, and an escaped name reached the client as a model.
"""

from __future__ import annotations

import logging

import httpx
import ollama
import pytest

from kubemoot.providers.ollama import ps_entry_problem, tags_entry_problem
from tests.gateway.conftest import Fleet

HELLO = [{"role": "user", "content": "hi"}]


async def _loaded_on_both(fleet: Fleet) -> str:
    """``small:1b`` loaded through the gateway on one engine, ``medium:7b`` on the other;
    → the first engine."""
    async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as http:
        first = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO,
                                                   "stream": False})
    assert first.status_code == 200, first.text
    where = first.headers["x-kubemoot-provider"]
    other = next(name for name in fleet.emulators if name != where)
    await ollama.AsyncClient(host=fleet.emulators[other].url).generate(model="medium:7b")
    return where


async def _ps_after(fleet: Fleet, caplog: pytest.LogCaptureFixture,
                    fault: str) -> tuple[str, ollama.ProcessResponse]:
    """The gateway's /api/ps, read with the official client, after one engine (its
    name returned) answers its next /api/ps with ``fault``; warnings captured."""
    where = await _loaded_on_both(fleet)
    fleet.emulators[where].hostile_next(fault, path="/api/ps")
    with caplog.at_level(logging.WARNING, logger="kubemoot.gateway"):
        return where, await ollama.AsyncClient(host=fleet.url).ps()


async def test_ps_leaves_out_an_entry_with_an_escaped_name(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    where, listed = await _ps_after(fleet, caplog, "escaped-name")
    # the bad entry's neighbour in the same answer stays, as does the other engine's list
    assert sorted(m.name or "" for m in listed.models) == ["medium:7b", "plain:1b"]
    assert all("\x1b" not in (m.model or "") for m in listed.models)
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and where in warned[0] and "/api/ps name" in warned[0]
    assert "\x1b" not in warned[0]  # the log shows the escapes, it does not play them


async def test_ps_leaves_out_a_mistyped_entry_and_the_client_reads_the_rest(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    where, listed = await _ps_after(fleet, caplog, "hostile-values")
    assert [m.name for m in listed.models] == ["medium:7b"]
    warned = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(warned) == 1 and where in warned[0]


async def test_a_listing_whose_models_are_no_list_is_left_out_with_a_warning(
        fleet: Fleet, caplog: pytest.LogCaptureFixture) -> None:
    where, listed = await _ps_after(fleet, caplog, "wrong-shape")
    assert [m.name for m in listed.models] == ["medium:7b"]
    assert any(where in r.getMessage() and "not a list" in r.getMessage()
               for r in caplog.records)


async def test_tags_and_v1_models_leave_out_an_escaped_name(fleet: Fleet) -> None:
    where = next(iter(fleet.emulators))
    fleet.emulators[where].hostile_next("escaped-name", path="/api/tags")
    names = [m.model or "" for m in (await ollama.AsyncClient(host=fleet.url).list()).models]
    assert "plain:1b" in names and "small:1b" in names
    assert not any("evil" in name for name in names)
    fleet.emulators[where].hostile_next("escaped-name", path="/api/tags")
    async with httpx.AsyncClient(base_url=fleet.url) as http:
        ids = [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
    assert "plain:1b" in ids and not any("evil" in i for i in ids)


@pytest.mark.parametrize(("entry", "field"), [
    ({"name": "\x1b[31mx\x1b[0m", "size_vram": 1}, "/api/ps name"),
    ({"name": "ok:1b", "model": "two\nlines", "size_vram": 1}, "/api/ps model"),
    ({"model": "ok:1b"}, None),
    ({"size_vram": 1}, "without a name"),
    ({"name": "ok:1b", "size_vram": 2**60}, "size_vram"),
    ({"name": "ok:1b", "context_length": -1}, "context_length"),
    ({"name": "ok:1b", "context_length": "lots"}, "/api/ps context_length"),
    ({"name": "ok:1b", "expires_at": "yesterday"}, "/api/ps expires_at"),
    ("ok:1b", "type str"),
])
def test_each_ps_check_names_its_field(entry: object, field: str | None) -> None:
    problem = ps_entry_problem(entry)
    assert problem is None if field is None else field in (problem or "")


def test_a_tags_entry_is_checked_on_the_name_the_listing_shows() -> None:
    # the client's /api/tags type keeps only ``model``; the merged list keys on ``name``
    assert "/api/tags name" in (tags_entry_problem({"name": "a b", "model": "a:1"}) or "")
    assert "/api/tags size" in (tags_entry_problem({"name": "a:1", "size": "big"}) or "")
    assert tags_entry_problem({"name": "a:1", "model": "a:1", "size": 1}) is None
