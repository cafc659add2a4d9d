"""``kubemoot_model_sizes``: what the operator publishes of the Models' declared sizes."""

from __future__ import annotations

from kubemoot.clock import ManualClock
from kubemoot.store.declared import (
    MODEL_SIZES_BUCKET,
    declared_sizes,
    publish_declared_sizes,
    read_declared_sizes,
)
from kubemoot.store.keys import encode_token
from kubemoot.store.memory import MemoryKV
from kubemoot.testing.builders import model


async def test_the_bucket_follows_the_models_and_a_steady_cluster_writes_nothing() -> None:
    kv = MemoryKV(ManualClock(1000.0))
    bucket = await kv.bucket(MODEL_SIZES_BUCKET)
    models = [model("qwen3-8b-a", model_id="qwen3:8b", provider="a", vram_mib=5120),
              model("qwen3-8b-b", model_id="qwen3:8b", provider="b", vram_mib=5632),
              model("phi3-mini", provider="a", vram_mib=2048),
              model("bare", model_id="llama3:8b", provider="a")]  # declares nothing
    wanted = declared_sizes(models)
    assert await publish_declared_sizes(bucket, wanted, now=1000.0) == 2
    assert await read_declared_sizes(bucket) == {"qwen3:8b": 5632, "phi3:mini": 2048}
    entry = await bucket.get(encode_token("qwen3:8b"))
    assert entry is not None
    assert b'"declaredBy":["qwen3-8b-a","qwen3-8b-b"]' in entry.value

    # The second time: nothing changed, nothing is written.
    assert await publish_declared_sizes(bucket, declared_sizes(models), now=2000.0) == 0
    # A Model gone: its identifier's key goes with it.
    assert await publish_declared_sizes(bucket, declared_sizes(models[:2]), now=3000.0) == 1
    assert await read_declared_sizes(bucket) == {"qwen3:8b": 5632}
    # An unreadable key is skipped by readers, and replaced by the next publication.
    await bucket.put(encode_token("qwen3:8b"), b"not json")
    assert await read_declared_sizes(bucket) == {}
    assert await publish_declared_sizes(bucket, declared_sizes(models[:2]), now=4000.0) == 1
    assert await read_declared_sizes(bucket) == {"qwen3:8b": 5632}
    await kv.close()
