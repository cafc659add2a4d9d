"""Fuzzing the loader: whatever the input, only InputError may escape."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubemoot.api import InputError, load_bundle, parse_manifest

FIXTURES = Path(__file__).parent / "fixtures"
VALID_TEXT = (FIXTURES / "spec-examples.yaml").read_text() + "---\n" + (
    FIXTURES / "prod-bundle.yaml"
).read_text().replace("qwen3-32b", "qwen3-32b-prod")
VALID_DOCS = [doc for doc in yaml.safe_load_all(VALID_TEXT) if doc]

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.sampled_from(["In", "in", "Model", "kubemoot.ai/v1alpha1", "2026-05-15T12:00:00Z", "-"]),
)
structures = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.one_of(st.text(max_size=12), st.integers()), inner, max_size=4),
    max_leaves=20,
)


def load_text(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_bundle([path])
    except InputError as error:
        assert error.describe()  # the message renders


def test_the_valid_text_loads() -> None:
    assert len(list(load_bundle_from_text(VALID_TEXT).resources())) == 8


def load_bundle_from_text(text: str) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "valid.yaml"
        path.write_text(text)
        return load_bundle([path])


@FUZZ
@given(data=st.binary(max_size=300))
def test_random_bytes(tmp_path: Path, data: bytes) -> None:
    load_text(tmp_path, data)


@FUZZ
@given(documents=st.lists(structures, max_size=3))
def test_random_yaml_structures(tmp_path: Path, documents: list[Any]) -> None:
    load_text(tmp_path, yaml.safe_dump_all(documents))


@FUZZ
@given(data=structures, kind=st.sampled_from(["Model", "ModelProvider", "Agent",
                                              "CrewSchedulingPolicy", "MootArchetype",
                                              "KubemootConfig"]))
def test_random_objects_of_each_kind(data: Any, kind: str) -> None:
    manifest = {"apiVersion": "kubemoot.ai/v1alpha1", "kind": kind, "metadata": {"name": "x"},
                "spec": data, "status": data}
    for candidate in (data, manifest):
        with contextlib.suppress(InputError):
            parse_manifest(candidate, file="f", document=0)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found.extend(_paths(value, (*prefix, index)))
    return found


@FUZZ
@given(data=st.data())
def test_broken_variants_of_valid_documents(tmp_path: Path, data: st.DataObject) -> None:
    docs = copy.deepcopy(VALID_DOCS)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        doc = data.draw(st.sampled_from(docs))
        path = data.draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        action = data.draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = data.draw(structures)
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=10))] = data.draw(structures)
    load_text(tmp_path, yaml.safe_dump_all(docs))


@FUZZ
@given(data=st.data())
def test_text_mutations_of_valid_yaml(tmp_path: Path, data: st.DataObject) -> None:
    text = VALID_TEXT
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        at = data.draw(st.integers(min_value=0, max_value=len(text)))
        width = data.draw(st.integers(min_value=0, max_value=8))
        insert = data.draw(st.sampled_from(["", ":", "-", "[", "{", "'", '"', "\t", "&a", "*a",
                                            "!!python/object", "---\n", "\n  ", "%", "0x", "?"]))
        text = text[:at] + insert + text[at + width:]
    load_text(tmp_path, text)
