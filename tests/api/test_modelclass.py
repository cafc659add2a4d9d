"""ModelClass: loaded from a bundle beside the other kinds, validated by its CRD, and
bad input reported with the file, document, name and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kubemoot.api import InputError, ModelClass, crd_for, load_bundle, validate_against_crd

HEAD = "apiVersion: kubemoot.ai/v1alpha1\n"
MODEL = HEAD + "kind: Model\nmetadata: {name: m}\nspec: {model: a, providerRef: p}\n"
CLASS = HEAD + """kind: ModelClass
metadata: {name: fast}
spec:
  require: {matchLabels: {capability/tool-calling: "true"}}
  prefer:
    - weight: 40
      selector: {matchExpressions: [{key: params, operator: In, values: [8B, 14B]}]}
  qualityBias: "0.3"
  tolerance: 15
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bundle.yaml"
    path.write_text(text)
    return path


def test_a_bundle_loads_model_classes(tmp_path: Path) -> None:
    bundle = load_bundle([write(tmp_path, MODEL + "---\n" + CLASS)])
    [loaded] = bundle.model_classes
    assert bundle.model_class("fast") is loaded and bundle.model_class("slow") is None
    assert bundle.origin(loaded) == (str(tmp_path / "bundle.yaml"), 1)
    spec = loaded.spec
    assert spec.require is not None and spec.require.matches({"capability/tool-calling": "true"})
    assert [term.weight for term in spec.prefer] == [40]
    assert (spec.quality_bias, spec.tolerance) == ("0.3", 15.0)
    assert loaded in list(bundle.resources())


def test_an_empty_spec_takes_every_default() -> None:
    empty = ModelClass.model_validate({"metadata": {"name": "any"}})
    spec = empty.spec
    assert (spec.require, spec.prefer, spec.quality_bias, spec.tolerance) == (None, [], None, None)
    numeric = ModelClass.model_validate({"metadata": {"name": "n"}, "spec": {"qualityBias": 1}})
    assert numeric.spec.quality_bias == "1"  # an unquoted YAML number means the same


def test_the_crd_is_cluster_scoped_and_accepts_the_example() -> None:
    crd = crd_for(ModelClass)
    assert crd["spec"]["scope"] == "Cluster"
    assert crd["spec"]["names"]["plural"] == "modelclasses"
    assert validate_against_crd(yaml.safe_load(CLASS)) == []


@pytest.mark.parametrize(
    ("old", "new", "field", "message"),
    [
        ('qualityBias: "0.3"', 'qualityBias: "1.5"', "spec.qualityBias", "[0, 1]"),
        ('qualityBias: "0.3"', 'qualityBias: "fast"', "spec.qualityBias", "[0, 1]"),
        ('qualityBias: "0.3"', 'qualityBias: "nan"', "spec.qualityBias", "[0, 1]"),
        ('qualityBias: "0.3"', "qualityBias: [0.3]", "spec.qualityBias", "valid string"),
        ("tolerance: 15", "tolerance: -1", "spec.tolerance", "greater than or equal to 0"),
        ("tolerance: 15", "tolerance: .inf", "spec.tolerance", "finite"),
        ("tolerance: 15", "tolerence: 15", "spec.tolerence", "unknown field"),
        ("weight: 40", "weight: 0", "spec.prefer[0].weight", "greater than or equal to 1"),
        ("operator: In", "operator: Near", "spec.prefer[0].selector.matchExpressions[0].operator",
         "Near"),
        ('capability/tool-calling: "true"', "bad key!: x", "spec.require.matchLabels", "bad key!"),
    ],
)
def test_bad_input_is_located(tmp_path: Path, old: str, new: str, field: str,
                              message: str) -> None:
    assert old in CLASS
    path = write(tmp_path, MODEL + "---\n" + CLASS.replace(old, new))
    with pytest.raises(InputError) as caught:
        load_bundle([path])
    error = caught.value
    assert (error.file, error.document, error.kind, error.name) == (
        str(path), 1, "ModelClass", "fast")
    assert error.field is not None and error.field.startswith(field), error.describe()
    assert message in error.message, error.describe()


def test_a_duplicate_name_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="duplicate ModelClass name"):
        load_bundle([write(tmp_path, CLASS + "---\n" + CLASS)])
