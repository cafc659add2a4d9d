"""Load custom resources from files and folders of multi-document YAML.

Whatever the input, the only exception that leaves this module is :class:`InputError`,
naming the file, the document (counted from 0), the kind/name and the field path. Documents
of other API groups (a Deployment beside the Agents) are skipped, as ``kubectl`` users
expect from a folder of mixed manifests.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from kubemoot.api.agent import Agent
from kubemoot.api.archetype import MootArchetype
from kubemoot.api.bounds import MAX_DOCUMENT_VALUES, MAX_INPUT_BYTES, describe_size
from kubemoot.api.config import KubemootConfig
from kubemoot.api.errors import InputError
from kubemoot.api.kinds import RESOURCE_TYPES
from kubemoot.api.meta import API_VERSION, GROUP, Resource
from kubemoot.api.model import Model
from kubemoot.api.modelclass import ModelClass
from kubemoot.api.policy import CrewSchedulingPolicy
from kubemoot.api.provider import ModelProvider

__all__ = [
    "STDIN",
    "Bundle",
    "SourceDocument",
    "format_loc",
    "input_error_from_validation",
    "iter_documents",
    "load_bundle",
    "load_single",
    "parse_manifest",
    "parse_resource",
    "validate_document",
]

STDIN = "-"
_YAML_SUFFIXES = (".yaml", ".yml")
T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class SourceDocument:
    """One YAML document: where it came from (``index`` counts from 0) and its data."""

    file: str
    index: int
    data: Any


# ---------------------------------------------------------------------------- reading


def _expand(paths: Iterable[str | Path]) -> Iterator[str]:
    for raw in paths:
        text = str(raw)
        if text == STDIN:
            yield STDIN
            continue
        path = Path(text)
        if path.is_dir():
            found = sorted(
                item
                for item in path.rglob("*")
                if item.suffix in _YAML_SUFFIXES and item.is_file()
            )
            if not found:
                # most likely a wrong path: say so rather than schedule an empty bundle
                raise InputError("the folder holds no .yaml or .yml file", file=text)
            yield from (str(item) for item in found)
        elif path.exists():
            yield text
        else:
            raise InputError("no such file or folder", file=text)


def _read(file: str) -> str:
    try:
        if file == STDIN:
            data = _read_stream(sys.stdin)
        else:
            with open(file, "rb") as stream:
                data = stream.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            # Reading one byte past the limit is enough to know, and /dev/zero or an
            # endless pipe cost no more than that.
            raise InputError(
                f"input is larger than {describe_size(MAX_INPUT_BYTES)}, the limit for "
                "one file; split it into several files",
                file=file,
            )
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(
            f"not UTF-8 text ({error.reason} at byte {error.start})", file=file
        ) from None
    except OSError as error:
        raise InputError(f"cannot read: {error.strerror or error}", file=file) from None
    except MemoryError:
        raise InputError("too large to read into memory", file=file) from None


def _read_stream(stream: Any) -> bytes:
    """At most the limit plus one byte of a text stream, as bytes."""
    raw = getattr(stream, "buffer", None)
    if raw is not None:
        data: bytes = raw.read(MAX_INPUT_BYTES + 1)
        return data
    # A text-only stream (a test harness's): characters are at least one byte each.
    text: str = stream.read(MAX_INPUT_BYTES + 1)
    return text.encode("utf-8")


def _expanded_values(data: Any, *, file: str, document: int) -> None:
    """Refuse a document whose YAML aliases expand beyond :data:`MAX_DOCUMENT_VALUES`.

    PyYAML shares an aliased node instead of copying it, so a few hundred bytes can stand
    for billions of values; validation walks every one of them. This walk counts each
    shared node once (memoised by identity) and finds aliases that contain themselves.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, finished = stack.pop()
        if not isinstance(node, dict | list):
            continue
        key = id(node)
        children = list(node.values()) if isinstance(node, dict) else node
        if finished:
            total = 1 + sum(sizes.get(id(child), 1) for child in children)
            sizes[key] = min(total, MAX_DOCUMENT_VALUES + 1)
            on_path.discard(key)
            if total > MAX_DOCUMENT_VALUES:
                raise InputError(
                    f"expands to more than {MAX_DOCUMENT_VALUES:,} values once YAML aliases "
                    "are followed",
                    file=file,
                    document=document,
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise InputError(
                "a YAML alias refers to a node that contains it", file=file, document=document
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend(
            (child, False) for child in children
            if isinstance(child, dict | list) and id(child) not in sizes
        )


def _yaml_problem(error: Exception) -> str:
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = error.problem or error.context or "invalid YAML"
        return f"YAML syntax error{where}: {problem}"
    if isinstance(error, RecursionError):
        return "YAML nests too deeply"
    # PyYAML raises ValueError and friends for scalars it cannot build (2026-13-45).
    return f"YAML error: {error}"


def _list_items(data: Any, *, file: str, document: int) -> list[Any]:
    """The objects of a ``kind: List`` (what ``kubectl get … -o yaml`` prints), else the
    document itself; a List's objects keep the List's document index."""
    if not (isinstance(data, Mapping) and data.get("kind") == "List"
            and data.get("apiVersion") in (None, "v1")):
        return [data]
    items = data.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise InputError(f"a List's items must be a list, got {type(items).__name__}",
                         file=file, document=document, field="items")
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InputError(f"must be a mapping, got {type(item).__name__}",
                             file=file, document=document, field=f"items[{position}]")
    return items


def iter_documents(paths: Iterable[str | Path]) -> Iterator[SourceDocument]:
    """Every non-empty YAML document of ``paths`` (files, folders recursively, ``-`` = stdin).

    Folders contribute their ``*.yaml``/``*.yml`` files in sorted order. Empty documents
    (a stray ``---``) are skipped but still counted, so indices match what an editor shows.
    A ``kind: List`` contributes each of its items, under the List's index.
    """
    for file in _expand(paths):
        text = _read(file)
        # Each step of the generator composes the next document, so the number of
        # documents finished so far is the index of the one that failed.
        finished = 0
        try:
            for data in yaml.safe_load_all(text):
                if data is not None:
                    _expanded_values(data, file=file, document=finished)
                    for item in _list_items(data, file=file, document=finished):
                        yield SourceDocument(file=file, index=finished, data=item)
                finished += 1
        except InputError:
            raise
        except Exception as error:  # PyYAML's errors are not all YAMLError; none may escape
            raise InputError(_yaml_problem(error), file=file, document=finished) from None


# ---------------------------------------------------------------------------- parsing


def format_loc(loc: Iterable[int | str]) -> str:
    """A pydantic error location as a field path: ``spec.rules[0].require``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.replace("_", "").replace("-", "").isalnum():
            path += f".{part}" if path else part
        else:
            path += f"[{part}]"  # a map key such as a label key with '/' or '.'
    return path


def _describe_error(error: Mapping[str, Any], suggestion: str | None = None) -> str:
    kind = error.get("type", "")
    message = str(error.get("msg", "invalid value"))
    if kind == "extra_forbidden":
        if suggestion is not None:
            return f'unknown field; did you mean "{suggestion}"?'
        return "unknown field (check the spelling)"
    if kind == "missing":
        return "required field is missing"
    if kind in ("value_error", "assertion_error"):
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return message
    shown = repr(error.get("input"))
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{message} (got {shown})"


# Problems named one by one in a message; beyond this the rest are counted. A document
# with hundreds of problems is usually one mistake repeated.
_LISTED_PROBLEMS = 20


def _suggestions(problems: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """For each unknown key, the missing required key beside it that it most resembles."""
    missing: dict[tuple[Any, ...], list[str]] = {}
    for problem in problems:
        loc = tuple(problem.get("loc", ()))
        if problem.get("type") == "missing" and loc and isinstance(loc[-1], str):
            missing.setdefault(loc[:-1], []).append(loc[-1])
    found: dict[int, str] = {}
    for index, problem in enumerate(problems):
        loc = tuple(problem.get("loc", ()))
        if problem.get("type") != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
            continue
        close = difflib.get_close_matches(loc[-1], missing.get(loc[:-1], []), n=1, cutoff=0.6)
        if close:
            found[index] = close[0]
    return found


def input_error_from_validation(
    error: ValidationError,
    *,
    file: str | None = None,
    document: int | None = None,
    kind: str | None = None,
    name: str | None = None,
    prefix: str = "",
) -> InputError:
    """Turn a pydantic ``ValidationError`` into an :class:`InputError` naming the field.

    The first problem gives the error its field; every other one is named after it with
    its own field path, so a person can fix them all in one go.
    """
    problems = error.errors(include_url=False)
    # A misspelt field also shows up as "required field missing" under its right name;
    # the unknown spelling is the one that tells the user what to fix, so it comes first.
    problems.sort(key=lambda problem: problem.get("type") != "extra_forbidden")
    suggestions = _suggestions(problems)

    def field_of(problem: Mapping[str, Any]) -> str:
        path = format_loc(problem.get("loc", ()))
        if prefix:
            path = f"{prefix}.{path}" if path else prefix
        return path

    message = _describe_error(problems[0], suggestions.get(0))
    others = [
        f"{field_of(problem) or '<document>'}: {_describe_error(problem, suggestions.get(i))}"
        for i, problem in enumerate(problems[1:], start=1)
    ]
    if others:
        listed = others[:_LISTED_PROBLEMS]
        message += "; also " + "; ".join(listed)
        if len(others) > len(listed):
            message += f"; and {len(others) - len(listed)} more problems"
    field_path = field_of(problems[0])
    return InputError(
        message, file=file, document=document, kind=kind, name=name, field=field_path or None
    )


def _name_of(data: Mapping[str, Any]) -> str | None:
    metadata = data.get("metadata")
    if isinstance(metadata, Mapping):
        name = metadata.get("name")
        if isinstance(name, str):
            return name
    return None


def _is_ours(api_version: Any) -> bool:
    return isinstance(api_version, str) and api_version.split("/", 1)[0] == GROUP


def parse_manifest(
    data: Any, *, file: str | None = None, document: int | None = None
) -> Resource:
    """Validate one ``kubemoot.ai`` object (a dict from YAML or from the API server)."""
    if not isinstance(data, Mapping):
        raise InputError(
            f"a resource must be a mapping, got {type(data).__name__}",
            file=file,
            document=document,
        )
    kind, name = data.get("kind"), _name_of(data)
    shown_kind = kind if isinstance(kind, str) else None
    if not isinstance(kind, str) or not kind:
        raise InputError("missing kind", file=file, document=document, name=name, field="kind")
    cls = RESOURCE_TYPES.get(kind)
    if cls is None:
        known = ", ".join(RESOURCE_TYPES)
        raise InputError(
            f'unknown kind "{kind}" in {GROUP}; known kinds: {known}',
            file=file,
            document=document,
            kind=kind,
            name=name,
            field="kind",
        )
    api_version = data.get("apiVersion")
    if api_version != API_VERSION:
        shown = f'"{api_version}"' if isinstance(api_version, str) else "missing"
        raise InputError(
            f"apiVersion is {shown}; this version of kubemoot reads {API_VERSION}",
            file=file,
            document=document,
            kind=shown_kind,
            name=name,
            field="apiVersion",
        )
    return validate_document(
        cls, data, file=file, document=document, kind=shown_kind, name=name
    )


def validate_document(
    model_cls: type[T],
    data: Any,
    *,
    file: str | None,
    document: int | None,
    kind: str | None,
    name: str | None,
) -> T:
    """Validate one document's data as ``model_cls``; every failure is an InputError
    naming the file, the document, kind/name and the field."""
    try:
        return model_cls.model_validate(data)
    except ValidationError as error:
        raise input_error_from_validation(
            error, file=file, document=document, kind=kind, name=name
        ) from None
    except RecursionError:
        raise InputError("document nests too deeply", file=file, document=document) from None


def parse_resource(doc: SourceDocument) -> Resource:
    """Validate one document as a ``kubemoot.ai`` resource (see :func:`parse_manifest`)."""
    return parse_manifest(doc.data, file=doc.file, document=doc.index)


def _is_resource_document(doc: SourceDocument, skip_kinds: Collection[str]) -> bool:
    data = doc.data
    if not isinstance(data, Mapping):
        raise InputError(
            f"a document must be a mapping, got {type(data).__name__}",
            file=doc.file,
            document=doc.index,
        )
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if "kind" not in data:
        raise InputError(
            "missing kind", file=doc.file, document=doc.index, name=_name_of(data), field="kind"
        )
    if not isinstance(kind, str):
        return _is_ours(api_version)  # a bad kind of ours is reported by parse_resource
    if api_version is None and kind in RESOURCE_TYPES:
        return True  # ours, only missing its apiVersion: parse_resource says so
    if api_version is not None and not isinstance(api_version, str):
        raise InputError(
            "apiVersion must be a string", file=doc.file, document=doc.index, field="apiVersion"
        )
    return _is_ours(api_version) and kind not in skip_kinds


# ---------------------------------------------------------------------------- bundles


@dataclass
class Bundle:
    """The resources of a set of files, by kind, with where each came from."""

    models: list[Model] = field(default_factory=list)
    providers: list[ModelProvider] = field(default_factory=list)
    agents: list[Agent] = field(default_factory=list)
    policies: list[CrewSchedulingPolicy] = field(default_factory=list)
    archetypes: list[MootArchetype] = field(default_factory=list)
    configs: list[KubemootConfig] = field(default_factory=list)
    model_classes: list[ModelClass] = field(default_factory=list)
    origins: dict[str, tuple[str, int]] = field(default_factory=dict)

    def add(self, resource: Resource) -> None:
        """File a resource under its kind."""
        lists: dict[type[Resource], list[Any]] = {
            Model: self.models,
            ModelProvider: self.providers,
            Agent: self.agents,
            CrewSchedulingPolicy: self.policies,
            MootArchetype: self.archetypes,
            KubemootConfig: self.configs,
            ModelClass: self.model_classes,
        }
        lists[type(resource)].append(resource)

    def resources(self) -> Iterator[Resource]:
        """Every resource, kind by kind."""
        yield from self.models
        yield from self.providers
        yield from self.agents
        yield from self.policies
        yield from self.archetypes
        yield from self.configs
        yield from self.model_classes

    def origin(self, resource: Resource) -> tuple[str, int] | None:
        """(file, document index) a resource was read from, if it came from a file."""
        return self.origins.get(resource.key)

    def model(self, name: str) -> Model | None:
        """The Model called ``name``."""
        return next((item for item in self.models if item.name == name), None)

    def provider(self, name: str) -> ModelProvider | None:
        """The ModelProvider called ``name``."""
        return next((item for item in self.providers if item.name == name), None)

    def archetype(self, name: str) -> MootArchetype | None:
        """The MootArchetype called ``name``."""
        return next((item for item in self.archetypes if item.name == name), None)

    def model_class(self, name: str) -> ModelClass | None:
        """The ModelClass called ``name``."""
        return next((item for item in self.model_classes if item.name == name), None)

    def agent(self, name: str, namespace: str | None = None) -> Agent | None:
        """The Agent called ``name`` (in ``namespace`` when given)."""
        return next(
            (
                item
                for item in self.agents
                if item.name == name and namespace in (None, item.namespace)
            ),
            None,
        )

    def policy(self, name: str, namespace: str | None = None) -> CrewSchedulingPolicy | None:
        """The CrewSchedulingPolicy called ``name`` (in ``namespace`` when given)."""
        return next(
            (
                item
                for item in self.policies
                if item.name == name and namespace in (None, item.namespace)
            ),
            None,
        )

    def policies_in(self, namespace: str) -> list[CrewSchedulingPolicy]:
        """The policies of one namespace."""
        return [item for item in self.policies if item.namespace == namespace]

    @property
    def config(self) -> KubemootConfig:
        """The bundle's KubemootConfig, or one with every default when it declares none."""
        return self.configs[0] if self.configs else KubemootConfig.defaults()


def load_bundle(
    paths: Iterable[str | Path], *, skip_kinds: Collection[str] = ()
) -> Bundle:
    """Read and validate every ``kubemoot.ai`` resource under ``paths``.

    ``skip_kinds`` names other documents of our group that may sit beside the resources
    (``PlacementRequest``) and are not resources. Two objects of one kind with the same
    name (and namespace) are an error, as is more than one KubemootConfig.
    """
    bundle = Bundle()
    for doc in iter_documents(paths):
        if not _is_resource_document(doc, skip_kinds):
            continue
        resource = parse_resource(doc)
        earlier = bundle.origins.get(resource.key)
        if earlier is not None:
            raise InputError(
                f"duplicate {resource.KIND} name; first defined in {earlier[0]}, "
                f"document {earlier[1]}",
                file=doc.file,
                document=doc.index,
                kind=resource.KIND,
                name=resource.name,
                field="metadata.name",
            )
        if isinstance(resource, KubemootConfig) and bundle.configs:
            raise InputError(
                f"only one KubemootConfig may be given; {bundle.configs[0].name} came first",
                file=doc.file,
                document=doc.index,
                kind=resource.KIND,
                name=resource.name,
            )
        bundle.origins[resource.key] = (doc.file, doc.index)
        bundle.add(resource)
    return bundle


def load_single(path: str | Path, kind: str, model_cls: type[T]) -> T:
    """Read the one document of ``kind`` in ``path`` and validate it as ``model_cls``.

    For documents that are not custom resources (``PlacementRequest``, ``PlacementState``);
    errors name file, document, kind/name and field like the resource loader's.
    """
    if str(path) != STDIN and Path(path).is_dir():
        # read as a bundle, the message blamed the folder's second file for being one
        raise InputError(f"is a folder; give one {kind} file", file=str(path))
    found: list[SourceDocument] = []
    for doc in iter_documents([path]):
        if not isinstance(doc.data, Mapping):
            raise InputError(
                f"a document must be a mapping, got {type(doc.data).__name__}",
                file=doc.file,
                document=doc.index,
            )
        if doc.data.get("kind") == kind:
            found.append(doc)
    if not found:
        raise InputError(f"no {kind} document found", file=str(path), kind=kind)
    if len(found) > 1:
        raise InputError(
            f"expected one {kind} document, found {len(found)}",
            file=found[1].file,
            document=found[1].index,
            kind=kind,
        )
    doc = found[0]
    return validate_document(
        model_cls, doc.data, file=doc.file, document=doc.index, kind=kind,
        name=_name_of(doc.data),
    )
