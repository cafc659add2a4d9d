"""Declared sizes left in the shared state when no Model exists at all (issue 23).

The operator publishes the Models' ``vramMib`` to ``kubemoot_model_sizes`` on Model
events. A cluster with no Model sends none, so keys an earlier run left behind (or a
Model deleted while no operator ran) must be cleaned by the probe round instead.
"""

from __future__ import annotations

from typing import Any

import httpx

from kubemoot.store.keys import decode_token
from kubemoot.testing import builders as b

from .conftest import (
    TEST_CLIENT,
    Cluster,
    OperatorThread,
    _watches_open,
    assert_rbac_allows_every_request,
    declare_resources,
    eventually,
    settle,
)


async def published(operator: OperatorThread) -> set[str]:
    """The model identifiers the sizes bucket holds, read in the operator's loop."""
    sizes = operator.sizes
    assert sizes is not None

    async def read() -> set[str]:
        return {decode_token(key) for key in await sizes.keys()}

    found: set[str] = await operator.call(read)
    return found


async def test_sizes_left_behind_are_removed_when_no_model_exists(kmock: Any) -> None:
    declare_resources(kmock)
    url = str(kmock.url).rstrip("/")
    operator = OperatorThread(url, left_sizes={"qwen3:8b": 5120, "llama3.1:70b": 43000})
    operator.start()
    try:
        await _watches_open(kmock)
        # the bucket held them when the operator started; the first probe round finds
        # no Model in the cluster and removes them
        async def cleaned() -> bool:
            return await published(operator) == set()

        await eventually(cleaned, what="the sizes left behind removed")

        # The second time: a Model comes and goes, and the bucket follows it.
        assert operator.reconciler is not None and operator.bucket is not None
        async with httpx.AsyncClient(base_url=url, headers={"User-Agent": TEST_CLIENT}) as http:
            cluster = Cluster(kmock, http, operator.reconciler, operator.bucket, operator)
            await cluster.apply(b.model("phi3-mini", model_id="phi3:mini", provider="gpu-a",
                                        vram_mib=2048))
            await settle(cluster)
            assert await published(operator) == {"phi3:mini"}
            await cluster.delete("Model", "phi3-mini")
            await settle(cluster)
            assert await published(operator) == set()
            # a later round with no Model writes nothing and finds nothing to remove
            await operator.call(operator.reconciler.clear_sizes_without_models)
            assert await published(operator) == set()
    finally:
        await operator.stop()
    assert_rbac_allows_every_request(kmock)


async def test_a_round_with_models_in_the_cluster_keeps_their_sizes(
    cluster: Cluster,
) -> None:
    await cluster.apply(b.model("qwen3-8b", model_id="qwen3:8b", provider="gpu-a",
                                vram_mib=5120))
    await settle(cluster)
    assert await published(cluster.operator) == {"qwen3:8b"}
    await cluster.operator.call(cluster.reconciler.clear_sizes_without_models)
    assert await published(cluster.operator) == {"qwen3:8b"}
