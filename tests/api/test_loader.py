"""The YAML loader: files, folders, stdin, and errors that name file/document/kind/field."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from kubemoot.api import InputError, iter_documents, load_bundle, load_single

FIXTURES = Path(__file__).parent / "fixtures"
HEAD = "apiVersion: kubemoot.ai/v1alpha1\n"
MODEL = HEAD + "kind: Model\nmetadata: {name: m}\nspec: {model: a, providerRef: p}\n"


def write(tmp_path: Path, text: str, name: str = "bundle.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_spec_bundle_loads_every_kind() -> None:
    bundle = load_bundle([FIXTURES / "prod-bundle.yaml", FIXTURES / "quality-bias.yaml"])
    assert [m.name for m in bundle.models] == ["qwen3-32b", "qwen3-14b"]
    assert bundle.archetype("consent-3") is not None
    assert bundle.config.spec.scheduler.strategy == "binpack"
    assert bundle.policy("quality-bias", "crew-a") is not None
    assert bundle.policy("quality-bias", "other") is None
    model = bundle.model("qwen3-14b")
    assert model is not None and bundle.origin(model) == (str(FIXTURES / "prod-bundle.yaml"), 1)
    spec = load_bundle([FIXTURES / "spec-examples.yaml"])
    assert spec.provider("ollama-a") is not None
    assert spec.agent("kubectl-agent") is not None
    assert [p.name for p in spec.policies_in("crew-homelab-pilot")] == ["homelab-pilot-default"]
    assert spec.config.spec.scheduler.concurrency_factor == 4  # none declared: defaults


def test_folders_recurse_in_sorted_order_and_skip_other_files(tmp_path: Path) -> None:
    write(tmp_path, MODEL.replace("name: m", "name: b"), "z/b.yml")
    write(tmp_path, MODEL.replace("name: m", "name: a"), "a.yaml")
    write(tmp_path, "not: yaml: at all: [", "notes.txt")
    write(tmp_path, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "c.yaml")
    assert [m.name for m in load_bundle([tmp_path]).models] == ["a", "b"]


def test_empty_documents_are_skipped_but_counted(tmp_path: Path) -> None:
    path = write(tmp_path, "---\n---\n" + MODEL)
    docs = list(iter_documents([path]))
    assert [(d.index, d.data["kind"]) for d in docs] == [(1, "Model")]


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(MODEL))
    bundle = load_bundle(["-"])
    assert bundle.models[0].name == "m"
    assert bundle.origin(bundle.models[0]) == ("-", 0)


def test_skip_kinds(tmp_path: Path) -> None:
    path = write(tmp_path, MODEL + "---\n" + HEAD + "kind: PlacementRequest\nspec: {}\n")
    with pytest.raises(InputError, match="unknown kind"):
        load_bundle([path])
    assert len(load_bundle([path], skip_kinds={"PlacementRequest"}).models) == 1


@pytest.mark.parametrize(
    ("text", "document", "kind", "name", "field", "message"),
    [
        ("a: [\n", 0, None, None, None, "YAML syntax error at line 2"),
        (MODEL + "---\nb: {\n", 1, None, None, None, "YAML syntax error"),
        (MODEL + "---\nwhen: 2026-13-45\n", 1, None, None, None, "YAML error"),
        ("- a\n- b\n", 0, None, None, None, "must be a mapping, got list"),
        ("just text\n", 0, None, None, None, "must be a mapping, got str"),
        (HEAD + "metadata: {name: x}\n", 0, None, "x", "kind", "missing kind"),
        (HEAD + "kind: Modle\nmetadata: {name: x}\n", 0, "Modle", "x", "kind",
         'unknown kind "Modle"'),
        ("kind: Model\nmetadata: {name: x}\n", 0, "Model", "x", "apiVersion",
         "apiVersion is missing"),
        ("apiVersion: kubemoot.ai/v1\nkind: Model\nmetadata: {name: x}\n", 0, "Model", "x",
         "apiVersion", 'apiVersion is "kubemoot.ai/v1"'),
        (HEAD + "kind: Model\nspec: {model: a, providerRef: p}\n", 0, "Model", None,
         "metadata", "required field is missing"),
        (MODEL.replace("providerRef", "providerref"), 0, "Model", "m", "spec.providerref",
         "unknown field"),
        (MODEL.replace("name: m", "name: m, labels: {ready: yes}"), 0, "Model", "m",
         "metadata.labels", 'quote it: "true"'),
        (
            MODEL + "---\n" + HEAD + "kind: CrewSchedulingPolicy\nmetadata: {name: c}\n"
            "spec:\n  rules:\n  - phase: a\n  - phase: b\n    require:\n"
            "      matchExpressions: [{key: a, operator: Exists}, {key: p, operator: in}]\n",
            1, "CrewSchedulingPolicy", "c", "spec.rules[1].require.matchExpressions[1].operator",
            'unknown operator "in"; use In, NotIn, Exists, DoesNotExist, Gt or Lt',
        ),
        (MODEL + "---\n" + MODEL, 1, "Model", "m", "metadata.name", "duplicate Model name"),
        (HEAD + "kind: KubemootConfig\nmetadata: {name: a}\n---\n" + HEAD
         + "kind: KubemootConfig\nmetadata: {name: b}\n", 1, "KubemootConfig", "b", None,
         "only one KubemootConfig"),
        (MODEL.replace("spec: {", "spec: {vramMib: lots, "), 0, "Model", "m", "spec.vramMib",
         "valid integer"),
        (HEAD + "kind: Model\nmetadata: {name: m, labels: {a.b/c: x}}\nspec: {model: 1}\n", 0,
         "Model", "m", "spec.model", "valid string"),
    ],
)
def test_errors_name_file_document_kind_and_field(
    tmp_path: Path,
    text: str,
    document: int,
    kind: str | None,
    name: str | None,
    field: str | None,
    message: str,
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as caught:
        load_bundle([path])
    error = caught.value
    assert (error.file, error.document, error.kind, error.name, error.field) == (
        str(path),
        document,
        kind,
        name,
        field,
    )
    assert message in error.message
    assert f"document {document} (0-based)" in error.describe()


def test_same_name_in_other_namespace_is_no_duplicate(tmp_path: Path) -> None:
    agent = HEAD + "kind: Agent\nmetadata: {name: a, namespace: NS}\n"
    path = write(tmp_path, agent.replace("NS", "one") + "---\n" + agent.replace("NS", "two"))
    assert len(load_bundle([path]).agents) == 2


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: None, "no such file or folder"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00bad"), "not UTF-8"),
        # a folder with no YAML in it was an empty bundle: "no Agents", exit status 0
        (lambda p: (p.mkdir(), (p / "notes.txt").write_text("x")), "holds no .yaml"),
    ],
)
def test_unreadable_inputs(tmp_path: Path, setup: object, message: str) -> None:
    path = tmp_path / "in.yaml"
    setup(path)  # type: ignore[operator]
    with pytest.raises(InputError, match=message):
        load_bundle([path])


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    apiVersion: str
    kind: str
    spec: dict[str, int]


def test_load_single_refuses_a_folder(tmp_path: Path) -> None:
    write(tmp_path, HEAD + "kind: Request\nspec: {a: 1}\n")
    with pytest.raises(InputError, match="is a folder; give one Request file"):
        load_single(tmp_path, "Request", Request)


def test_load_single(tmp_path: Path) -> None:
    request = HEAD + "kind: Request\nspec: {a: 1}\n"
    path = write(tmp_path, MODEL + "---\n" + request)
    assert load_single(path, "Request", Request).spec == {"a": 1}
    with pytest.raises(InputError, match="no Request document found"):
        load_single(write(tmp_path, MODEL, "other.yaml"), "Request", Request)
    with pytest.raises(InputError, match="expected one Request document, found 2"):
        load_single(write(tmp_path, request + "---\n" + request, "two.yaml"), "Request", Request)
    bad = write(tmp_path, MODEL + "---\n" + request.replace("a: 1", "a: x"), "bad.yaml")
    with pytest.raises(InputError) as caught:
        load_single(bad, "Request", Request)
    error = caught.value
    assert (error.document, error.kind, error.field) == (1, "Request", "spec.a")
