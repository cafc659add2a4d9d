"""Fuzzing the emulator's request bodies: whatever arrives, the answer is a JSON error
or a proper reply, never a 500 with a traceback, and ``/api/ps`` keeps working."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubemoot.emulation.server import OllamaEmulator
from tests.providers.conftest import SMALL

FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

PATHS = ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/show",
         "/v1/chat/completions", "/v1/embeddings"]
FIELDS = ["model", "messages", "tools", "options", "keep_alive", "truncate", "prompt",
          "input", "dimensions", "system", "stream_options", "max_tokens",
          "encoding_format", "content", "role", "function", "parameters", "num_ctx",
          "num_predict", "required", "properties", "name", "type", "text"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True), st.text(max_size=12),
    st.sampled_from([SMALL.name, "user", "tool", "function", "5m", "-1", "nan", "text",
                     "base64", "get_weather"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(FIELDS), inner, max_size=4),
    max_leaves=16,
)
bodies = st.fixed_dictionaries(
    {"model": st.one_of(st.just(SMALL.name), values), "stream": st.just(False)},
    optional={name: values for name in FIELDS if name != "model"},
)


@FUZZ
@given(path=st.sampled_from(PATHS), body=bodies)
def test_any_body_gets_an_answer_not_a_crash(emulator: OllamaEmulator, path: str,
                                             body: dict[str, Any]) -> None:
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        # json.dumps writes NaN and Infinity, which Python's parser on the other side
        # accepts; httpx's own encoder would refuse them
        response = http.post(path, content=json.dumps(body),
                             headers={"content-type": "application/json"})
        # the one 500 Ollama gives on purpose: a model larger than the card
        assert response.status_code < 500 or (
            response.status_code == 500
            and re.match(r"model .* needs \d+ MiB", response.json()["error"])
        ), (response.status_code, response.text[:300])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error if isinstance(error, str) else error["message"]
        assert http.get("/api/ps").status_code == 200
