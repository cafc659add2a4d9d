"""Every numeric field of the custom resources has a bound; input files have a size limit.

Each row sets one field of a small bundle to a value just inside its bound (``schedule``
exits 0) and just outside (exit 2, the field named). Files past the size limit, endless
special files and YAML alias bombs are refused before they cost time or memory.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.api import bounds, loader
from kubemoot.api.bounds import (
    MAX_CONTEXT_TOKENS,
    MAX_COUNT,
    MAX_DOCUMENT_VALUES,
    MAX_INPUT_BYTES,
    MAX_ITEMS,
    MAX_MIB,
    MAX_PARALLEL,
    MAX_SCORE,
    MAX_SECONDS,
    MAX_SEED,
    MAX_WEIGHT,
)
from kubemoot.api.errors import InputError
from kubemoot.api.loader import iter_documents, load_bundle

from .cli_run import assert_refused, run_cli, with_value

KUBEMOOT = Path(sys.executable).with_name("kubemoot")
NOW = "2026-05-15T12:00:00Z"

MODEL: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1", "kind": "Model",
    "metadata": {"name": "qwen3-8b", "generation": 1, "labels": {"capability/chat": "true"}},
    "spec": {"model": "qwen3:8b", "providerRef": "gpu", "vramMib": 6144},
    "status": {"ready": True, "footprintMiB": 6144},
}
PROVIDER: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1", "kind": "ModelProvider",
    "metadata": {"name": "gpu"},
    "spec": {"endpoint": "http://127.0.0.1:11434", "reserveMiB": 1024, "numParallel": 2,
             "contextLength": 8192, "scheduling": {"weight": 100}},
    "status": {"ready": True, "capacity": {
        "vramTotalMiB": 24576, "vramUsedMiB": 0, "maxParallel": 2, "agentCount": 0,
        "contextLength": 8192,
        "loadedModels": [{"name": "qwen3:8b", "sizeMiB": 6144, "contextLength": 8192}],
        "loadedModelFootprints": {"qwen3:8b": 6144},
    }},
}
AGENT: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1", "kind": "Agent",
    "metadata": {"name": "a", "namespace": "crew", "labels": {"kubemoot.ai/crew": "c"}},
    "spec": {"capabilities": ["chat"]},
    "status": {"scheduling": {"phases": {"mulling": {
        "model": "qwen3-8b", "score": 50, "candidates": [{"model": "qwen3:8b", "score": 50}],
    }}}},
}
POLICY: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1", "kind": "CrewSchedulingPolicy",
    "metadata": {"name": "p", "namespace": "crew"},
    "spec": {"crewRef": "c", "freshness": {"maxAgeSeconds": 120}, "rules": [
        {"phase": "mulling", "prefer": [
            {"weight": 10, "selector": {"matchLabels": {"capability/chat": "true"}}}]}]},
}
CONFIG: dict[str, Any] = {
    "apiVersion": "kubemoot.ai/v1alpha1", "kind": "KubemootConfig",
    "metadata": {"name": "default"},
    "spec": {"scheduler": {"imageLocalityBonus": 20, "concurrencyFactor": 4}},
}
BUNDLE = {"Model": MODEL, "ModelProvider": PROVIDER, "Agent": AGENT,
          "CrewSchedulingPolicy": POLICY, "KubemootConfig": CONFIG}

BIG = MAX_SCORE
# (kind, field path, a value just inside, a value just outside)
FIELDS: list[tuple[str, str, Any, Any]] = [
    ("Model", "spec.vramMib", MAX_MIB, MAX_MIB + 1),
    ("Model", "spec.vramMib", 0, -1),
    ("Model", "status.footprintMiB", MAX_MIB, MAX_MIB + 1),
    ("Model", "metadata.generation", MAX_SEED, MAX_SEED + 1),
    ("ModelProvider", "spec.reserveMiB", MAX_MIB, MAX_MIB + 1),
    ("ModelProvider", "spec.numParallel", MAX_PARALLEL, MAX_PARALLEL + 1),
    ("ModelProvider", "spec.numParallel", 1, 0),
    ("ModelProvider", "spec.contextLength", MAX_CONTEXT_TOKENS, MAX_CONTEXT_TOKENS + 1),
    ("ModelProvider", "spec.scheduling.weight", MAX_WEIGHT, MAX_WEIGHT + 1),
    ("ModelProvider", "spec.scheduling.weight", -MAX_WEIGHT, -MAX_WEIGHT - 1),
    ("ModelProvider", "status.capacity.vramTotalMiB", MAX_MIB, MAX_MIB + 1),
    ("ModelProvider", "status.capacity.vramUsedMiB", MAX_MIB, MAX_MIB + 1),
    ("ModelProvider", "status.capacity.maxParallel", MAX_PARALLEL, MAX_PARALLEL + 1),
    ("ModelProvider", "status.capacity.agentCount", MAX_COUNT, MAX_COUNT + 1),
    ("ModelProvider", "status.capacity.contextLength", MAX_CONTEXT_TOKENS,
     MAX_CONTEXT_TOKENS + 1),
    ("ModelProvider", "status.capacity.loadedModels[0].sizeMiB", MAX_MIB, MAX_MIB + 1),
    ("ModelProvider", "status.capacity.loadedModels[0].contextLength", MAX_CONTEXT_TOKENS,
     MAX_CONTEXT_TOKENS + 1),
    ("ModelProvider", "status.capacity.loadedModelFootprints[qwen3:8b]", MAX_MIB, MAX_MIB + 1),
    ("Agent", "status.scheduling.phases.mulling.score", BIG, BIG * 1.01),
    ("Agent", "status.scheduling.phases.mulling.candidates[0].score", -BIG, -BIG * 1.01),
    ("CrewSchedulingPolicy", "spec.freshness.maxAgeSeconds", int(MAX_SECONDS),
     int(MAX_SECONDS) + 1),
    ("CrewSchedulingPolicy", "spec.rules[0].prefer[0].weight", 100, 101),
    ("KubemootConfig", "spec.scheduler.imageLocalityBonus", MAX_WEIGHT, MAX_WEIGHT + 1),
    ("KubemootConfig", "spec.scheduler.concurrencyFactor", MAX_PARALLEL, MAX_PARALLEL + 1),
]
FLOAT_FIELDS = [
    ("Agent", "status.scheduling.phases.mulling.score"),
    ("Agent", "status.scheduling.phases.mulling.candidates[0].score"),
]


def _write(tmp_path: Path, kind: str, path: str, value: Any) -> Path:
    docs = [with_value(doc, path.replace("[qwen3:8b]", ".qwen3:8b"), value)
            if name == kind else doc for name, doc in BUNDLE.items()]
    file = tmp_path / "bundle.yaml"
    file.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return file


def _schedule(file: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    return run_cli(["schedule", "-f", str(file), "--now", NOW, "-o", "json"], capsys)


def test_the_base_bundle_schedules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = _schedule(_write(tmp_path, "Model", "spec.vramMib", 6144), capsys)
    assert done.code == 0, done.stderr


@pytest.mark.parametrize(("kind", "path", "inside", "outside"), FIELDS,
                         ids=[f"{k}.{p}={o}" for k, p, _, o in FIELDS])
def test_each_resource_number_has_a_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, path: str, inside: Any,
    outside: Any,
) -> None:
    done = _schedule(_write(tmp_path, kind, path, inside), capsys)
    assert done.code == 0, done.stderr
    done = _schedule(_write(tmp_path, kind, path, outside), capsys)
    assert_refused(done, "bundle.yaml", f"{kind}/", f"field {path}")


@pytest.mark.parametrize(("kind", "path"), FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_infinity_and_nan_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, path: str, value: float
) -> None:
    done = _schedule(_write(tmp_path, kind, path, value), capsys)
    assert_refused(done, f"field {path}", "finite number")


def test_a_string_that_reads_as_infinity_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # YAML leaves 1e400 a string (no dot); pydantic would read it as a float: infinity.
    file = _write(tmp_path, "Agent", "status.scheduling.phases.mulling.score", "1e400")
    assert_refused(_schedule(file, capsys), "finite number")


def test_a_list_longer_than_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    many = [f"sha256:{i}" for i in range(MAX_ITEMS + 1)]
    done = _schedule(_write(tmp_path, "ModelProvider", "spec.quarantinedDigests", many), capsys)
    assert_refused(done, "field spec.quarantinedDigests", f"at most {MAX_ITEMS} items")


# ---------------------------------------------------------------------------- file size


def test_a_file_at_the_limit_is_read_and_one_byte_more_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "MAX_INPUT_BYTES", 64)
    text = "a: 1\n# " + "x" * 56 + "\n"
    assert len(text.encode()) == 64
    (tmp_path / "ok.yaml").write_text(text)
    assert [doc.data for doc in iter_documents([tmp_path / "ok.yaml"])] == [{"a": 1}]
    (tmp_path / "big.yaml").write_text(text + "\n")
    with pytest.raises(InputError) as caught:
        list(iter_documents([tmp_path / "big.yaml"]))
    assert caught.value.file == str(tmp_path / "big.yaml")
    assert "larger than 64 bytes" in caught.value.message


def test_the_size_limit_is_documented_in_mib() -> None:
    assert bounds.describe_size(MAX_INPUT_BYTES) == "2 MiB"
    assert bounds.describe_size(1536) == "1536 bytes"
    assert bounds.describe_size(3072) == "3 KiB"


def _kubemoot(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(KUBEMOOT), *args], input=stdin, capture_output=True,
                          timeout=120, check=False)


@pytest.mark.parametrize("command", [["schedule", "-f"], ["decide", "-f"],
                                     ["place", "--model", "m", "-f"], ["simulate", "-f"]])
def test_dev_zero_is_refused_with_exit_2(command: list[str]) -> None:
    done = _kubemoot(*command, "/dev/zero")
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert "/dev/zero: input is larger than 2 MiB" in " ".join(err.split())
    assert "Traceback" not in err and "MemoryError" not in err


def test_a_huge_file_and_a_huge_stdin_are_refused(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"# padding\n" * (MAX_INPUT_BYTES // 10 + 1))
    done = _kubemoot("schedule", "-f", str(huge))
    assert done.returncode == 2
    assert "huge.yaml: input is larger than 2 MiB" in " ".join(done.stderr.decode().split())
    done = _kubemoot("decide", "-f", "-", stdin=huge.read_bytes())
    assert done.returncode == 2
    assert "-: input is larger than 2 MiB" in " ".join(done.stderr.decode().split())


# ---------------------------------------------------------------------------- aliases


def _laughs(levels: int) -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"l{level}: &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "laughs.yaml"
    file.write_text(_laughs(7))  # 10**7 values from 700 bytes
    with pytest.raises(InputError) as caught:
        list(iter_documents([file]))
    assert (caught.value.file, caught.value.document) == (str(file), 0)
    assert f"more than {MAX_DOCUMENT_VALUES:,} values" in caught.value.message


def test_aliases_within_the_limit_are_fine(tmp_path: Path) -> None:
    file = tmp_path / "shared.yaml"
    file.write_text(_laughs(5))  # 10**5 values
    (doc,) = iter_documents([file])
    assert len(doc.data["l4"]) == 10


def test_an_alias_inside_itself_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "loop.yaml"
    file.write_text("a: &a [1, *a]\n")
    with pytest.raises(InputError, match="alias refers to a node that contains it"):
        list(iter_documents([file]))


# ---------------------------------------------------------------------------- property


@settings(max_examples=60, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                       st.integers(min_value=-(2**70), max_value=2**70)))
def test_any_number_in_any_bounded_field_loads_within_bounds_or_names_the_field(
    tmp_path_factory: pytest.TempPathFactory, value: float
) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    for kind, path, _, _ in FIELDS[::3]:
        file = _write(tmp, kind, path, value)
        try:
            load_bundle([file])
        except InputError as error:
            assert error.field is not None and error.field.startswith(path.split("[")[0])
            assert error.file == str(file)
        else:
            assert math.isfinite(value) and abs(value) <= max(MAX_SEED, MAX_SCORE)
