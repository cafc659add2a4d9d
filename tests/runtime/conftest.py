from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from tests.runtime.builders import Harness, harness


@pytest.fixture
async def make() -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    """Build harnesses and close them after the test."""
    made: list[Harness] = []

    async def build(*args: Any, **kwargs: Any) -> Harness:
        h = await harness(*args, **kwargs)
        made.append(h)
        return h

    yield build
    for h in made:
        await h.close()
