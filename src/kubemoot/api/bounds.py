"""The sane range of every number a user can write, and the size of an input file.

These are limits of the input *format*, not settings to tune: each one sits far above
any fleet or workload we know of and far below what would make a command run for hours
or fill memory (a loop over ``intents: 10**12`` waiters, a simulation of 10**30 agents).
A value outside its range is bad input (exit 2, the field named), never a slow run.
Every document kind takes its numeric types from here, so one limit has one home and the
docs ("Limits" in docs/scheduling.md, docs/simulator.md, docs/runtime.md) describe these.

Infinity and NaN are refused everywhere (``allow_inf_nan=False`` in each document's base
model): YAML spells them ``.inf`` and ``.nan``, and a string such as ``"1e400"`` becomes
infinity when read as a float.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

__all__ = [
    "MAX_AGENTS",
    "MAX_CONTEXT_TOKENS",
    "MAX_COUNT",
    "MAX_DOCUMENT_VALUES",
    "MAX_GIB",
    "MAX_INPUT_BYTES",
    "MAX_ITEMS",
    "MAX_MIB",
    "MAX_PARALLEL",
    "MAX_RATE",
    "MAX_SCORE",
    "MAX_SECONDS",
    "MAX_SEED",
    "MAX_WEIGHT",
    "ContextTokens",
    "Count",
    "Gib",
    "Int64",
    "Mib",
    "Parallel",
    "Rate",
    "Score",
    "Seconds",
    "Seed",
    "Weight",
    "describe_size",
]

# Kubernetes caps one stored object near 1.5 MiB; 2 MiB holds any bundle we have seen
# many times over, and PyYAML parses it in seconds (16 MiB took over a minute).
MAX_INPUT_BYTES: Final = 2 * 1024 * 1024
# Values one document may expand to once YAML aliases are followed (a "billion laughs"
# file is small on disk and enormous in memory).
MAX_DOCUMENT_VALUES: Final = 1_000_000
# Memory: 16 TiB in MiB, 16 TiB in GiB; no accelerator comes near either.
MAX_MIB: Final = 16 * 1024 * 1024
MAX_GIB: Final = 16 * 1024
# Durations, ages and latencies: one year in seconds.
MAX_SECONDS: Final = 365 * 24 * 3600.0
# Context windows and prompts: 16 Mi tokens, over ten times the largest model's window.
MAX_CONTEXT_TOKENS: Final = 16 * 1024 * 1024
# Parallel slots of one engine (Ollama's OLLAMA_NUM_PARALLEL is a handful).
MAX_PARALLEL: Final = 4096
# Counters of things (agents bound to a provider, waiters, intents, group sizes, steps).
MAX_COUNT: Final = 100_000
# Agents of one crew.
MAX_AGENTS: Final = 10_000
# Entries of one list in a document (providers, nodes, models, tickets …).
MAX_ITEMS: Final = 10_000
# Events per hour, and use counts of a model.
MAX_RATE: Final = 1_000_000.0
# Weights and bonuses a user sets (a provider's weight, the image-locality bonus);
# scorers work on 0–100, so ten thousand already outweighs everything else.
MAX_WEIGHT: Final = 10_000
# Scores: quality plus every matching prefer weight plus the weights above; the largest
# policy the limits admit scores about a million, far inside this.
MAX_SCORE: Final = 1e9
# A random seed, and counters the API server keeps: what a signed 64-bit integer holds.
MAX_SEED: Final = 2**63 - 1

Mib = Annotated[int, Field(ge=0, le=MAX_MIB)]
Gib = Annotated[float, Field(ge=0, le=MAX_GIB)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS)]
ContextTokens = Annotated[int, Field(ge=1, le=MAX_CONTEXT_TOKENS)]
Parallel = Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Rate = Annotated[float, Field(ge=0, le=MAX_RATE)]
Score = Annotated[float, Field(ge=-MAX_SCORE, le=MAX_SCORE)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Int64 = Annotated[int, Field(ge=0, le=MAX_SEED)]
Weight = Annotated[int, Field(ge=-MAX_WEIGHT, le=MAX_WEIGHT)]


def describe_size(size: int) -> str:
    """A byte count for a message: ``2 MiB``, ``512 KiB``, ``17 bytes``."""
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"
