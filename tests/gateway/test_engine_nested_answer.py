"""An engine answer nested too deeply is a broken answer, never a 500 with a traceback.

200,000 ``[`` make the standard library's decoder raise ``RecursionError`` rather than a
``ValueError``, which every place that handles an engine's bad answer catches. Through
the gateway, ``GET /api/ps`` must then list the other engines' copies (one engine's bad
list is left out, as when it does not answer), a whole ``/api/chat`` answer must be the
502 of a broken answer, and the next calls must run with no ticket left behind.
"""

from __future__ import annotations

import httpx
import ollama
import pytest

from tests.gateway.conftest import Fleet

HELLO = [{"role": "user", "content": "hi"}]


async def test_a_deeply_nested_engine_answer_is_left_out_or_a_502(fleet: Fleet) -> None:
    client = ollama.AsyncClient(host=fleet.url)
    async with httpx.AsyncClient(base_url=fleet.url, timeout=30) as http:
        first = await http.post("/api/chat", json={"model": "small:1b", "messages": HELLO,
                                                   "stream": False})
        assert first.status_code == 200
        where = first.headers["x-kubemoot-provider"]
        other = next(name for name in fleet.emulators if name != where)
        await ollama.AsyncClient(host=fleet.emulators[other].url).generate(model="medium:7b")

        fleet.emulators[where].hostile_next("nested", path="/api/ps")
        listed = await http.get("/api/ps")
        assert listed.status_code == 200, listed.text
        assert [(m["name"], m["provider"]) for m in listed.json()["models"]] == [
            ("medium:7b", other)]
        # and the second time, with nothing armed, both lists are back
        again = await http.get("/api/ps")
        assert sorted(m["provider"] for m in again.json()["models"]) == sorted([where, other])

    fleet.emulators[where].hostile_next("nested", path="/api/chat")
    with pytest.raises(ollama.ResponseError) as broken:
        await client.chat(model="small:1b", messages=HELLO)
    assert broken.value.status_code == 502, broken.value.error
    assert "broken answer" in broken.value.error
    for _ in range(2):
        assert (await client.chat(model="small:1b", messages=HELLO)).done
    await fleet.finished.until(4)
    assert await fleet.tickets_left() == []
