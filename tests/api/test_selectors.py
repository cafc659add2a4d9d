"""Label selectors: Kubernetes matching semantics and validation messages."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pydantic import ValidationError

from kubemoot.api import LabelSelector, selector_matches
from kubemoot.api.labels import label_value_problems, qualified_name_problems

LABELS = {"family": "qwen3", "params": "32B", "capability/tool-calling": "true", "size": "32"}


def sel(**data: Any) -> LabelSelector:
    return LabelSelector.model_validate(data)


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def only(key: str, operator: str, *values: str) -> dict[str, Any]:
    """A selector with one expression."""
    return {"matchExpressions": [expr(key, operator, *values)]}


@pytest.mark.parametrize(
    ("name", "selector", "labels", "want"),
    [
        ("empty matches everything", {}, LABELS, True),
        ("empty matches no labels", {}, {}, True),
        ("matchLabels equal", {"matchLabels": {"family": "qwen3"}}, LABELS, True),
        ("matchLabels differ", {"matchLabels": {"family": "llama"}}, LABELS, False),
        ("matchLabels absent key", {"matchLabels": {"gpu": "x"}}, LABELS, False),
        ("matchLabels empty value vs absent", {"matchLabels": {"gpu": ""}}, LABELS, False),
        ("matchLabels empty value present", {"matchLabels": {"gpu": ""}}, {"gpu": ""}, True),
        ("all pairs hold", {"matchLabels": {"family": "qwen3", "params": "14B"}}, LABELS, False),
        ("In hit", only("params", "In", "14B", "32B"), LABELS, True),
        ("In miss", only("params", "In", "8B"), LABELS, False),
        ("In absent key", only("gpu", "In", "a"), LABELS, False),
        ("NotIn hit", only("params", "NotIn", "32B"), LABELS, False),
        ("NotIn miss", only("params", "NotIn", "8B"), LABELS, True),
        ("NotIn absent key matches", only("gpu", "NotIn", "a"), LABELS, True),
        ("Exists present", only("family", "Exists"), LABELS, True),
        ("Exists absent", only("gpu", "Exists"), LABELS, False),
        ("Exists empty value", only("gpu", "Exists"), {"gpu": ""}, True),
        ("DoesNotExist absent", only("gpu", "DoesNotExist"), LABELS, True),
        ("DoesNotExist present", only("family", "DoesNotExist"), LABELS, False),
        ("Gt greater", only("size", "Gt", "14"), LABELS, True),
        ("Gt equal", only("size", "Gt", "32"), LABELS, False),
        ("Lt less", only("size", "Lt", "33"), LABELS, True),
        ("Lt equal", only("size", "Lt", "32"), LABELS, False),
        ("Gt non-integer label", only("params", "Gt", "1"), LABELS, False),
        ("Lt non-integer label", only("params", "Lt", "100"), LABELS, False),
        ("Gt absent key", only("gpu", "Gt", "1"), LABELS, False),
        ("Gt negative bound", only("size", "Gt", "-5"), LABELS, True),
        ("Lt label with underscore", only("n", "Lt", "9"), {"n": "1_0"}, False),
        (
            "labels and expressions together",
            {"matchLabels": {"family": "qwen3"}, "matchExpressions": [expr("params", "In", "32B")]},
            LABELS,
            True,
        ),
        (
            "one failing expression fails all",
            {"matchExpressions": [expr("params", "In", "32B"), expr("family", "DoesNotExist")]},
            LABELS,
            False,
        ),
        ("null lists are empty", {"matchLabels": None, "matchExpressions": None}, LABELS, True),
    ],
)
def test_matches(name: str, selector: dict[str, Any], labels: dict[str, str], want: bool) -> None:
    assert sel(**selector).matches(labels) is want, name
    assert selector_matches(sel(**selector), labels) is want, name


def test_null_selector_matches_nothing() -> None:
    assert selector_matches(None, LABELS) is False
    assert selector_matches(None, {}) is False


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (
            {"matchExpressions": [expr("a", "Exists"), {"key": "p", "operator": "in"}]},
            'unknown operator "in"; use In, NotIn, Exists, DoesNotExist, Gt or Lt',
        ),
        (only("params", "In"), "operator In needs at least one value"),
        (only("params", "NotIn"), "operator NotIn needs at least one value"),
        (only("gpu", "Exists", "x"), "operator Exists takes no values"),
        (only("gpu", "DoesNotExist", "x"), "operator DoesNotExist takes"),
        (only("size", "Gt"), "operator Gt needs exactly one value"),
        (only("size", "Lt", "1", "2"), "operator Lt needs exactly one"),
        (only("size", "Gt", "ten"), 'needs an integer value, got "ten"'),
        (only("size", "Lt", "1.5"), "needs an integer value"),
        # Python refuses int() on 4,300+ digits; the message said so instead of ours.
        (only("size", "Gt", "9" * 5000), 'needs an integer value, got "' + "9" * 37 + '..."'),
        (only("-bad", "Exists"), 'invalid label key "-bad"'),
        (only("p", "In", "bad value"), 'invalid value "bad value"'),
        ({"matchLabels": {"Example.com/x": "y"}}, "prefix part must consist of lower case"),
        ({"matchLabels": {"/x": "y"}}, "prefix part must be non-empty"),
        ({"matchLabels": {"a/b/c": "y"}}, "at most one '/'"),
        ({"matchLabels": {"x" * 64: "y"}}, "name part must be no more than 63 characters"),
        ({"matchLabels": {"k": "v" * 64}}, "must be no more than 63 characters"),
        ({"matchLabels": {"k": "_v"}}, "must start and end with an alphanumeric character"),
        ({"matchLabels": {"k": True}}, 'got a boolean; quote it: "true"'),
        ({"matchLabels": {"k": 32}}, 'got an integer; quote it: "32"'),
        ({"matchLabels": ["k"]}, "must be a mapping"),
        ({"matchLabel": {"k": "v"}}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_selectors_name_the_problem(selector: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        sel(**selector)
    assert message in str(caught.value)


def test_operator_error_names_the_field_path() -> None:
    with pytest.raises(ValidationError) as caught:
        sel(matchExpressions=[expr("a", "Exists"), {"key": "p", "operator": "in"}])
    assert caught.value.errors()[0]["loc"] == ("matchExpressions", 1, "operator")


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("family", True),
        ("capability/tool-calling", True),
        ("kubemoot.ai/crew", True),
        ("a.b-c_d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        (("a" * 63 + ".") * 3 + "a" * 61 + "/k", True),  # a prefix of exactly 253 characters
        (("a" * 63 + ".") * 3 + "a" * 62 + "/k", False),
        ("", False),
        ("a/", False),
        ("UPPER.io/k", False),
        ("k.", False),
        ("with space", False),
    ],
)
def test_qualified_names(key: str, valid: bool) -> None:
    assert (qualified_name_problems(key) == []) is valid


@pytest.mark.parametrize(
    ("value", "valid"),
    [("", True), ("32B", True), ("a-b_c.d", True), ("x" * 63, True), ("x" * 64, False),
     ("-a", False), ("a-", False), ("a b", False), ("a/b", False)],
)
def test_label_values(value: str, valid: bool) -> None:
    assert (label_value_problems(value) == []) is valid


@pytest.mark.parametrize(
    ("selector", "text"),
    [
        (
            {
                "matchLabels": {"capability/tool-calling": "true"},
                "matchExpressions": [expr("params", "In", "14B", "32B")],
            },
            "{capability/tool-calling: true, params: 14B|32B}",
        ),
        ({}, "{}"),
        (
            {
                "matchExpressions": [
                    expr("a", "NotIn", "x"),
                    expr("b", "Exists"),
                    expr("c", "DoesNotExist"),
                    expr("d", "Gt", "1"),
                    expr("e", "Lt", "2"),
                ]
            },
            "{a not in x, b, !c, d > 1, e < 2}",
        ),
    ],
)
def test_describe(selector: dict[str, Any], text: str) -> None:
    assert sel(**selector).describe() == text


def test_selector_is_frozen_and_round_trips() -> None:
    original = {
        "matchLabels": {"family": "qwen3"},
        "matchExpressions": [expr("params", "In", "14B", "32B")],
    }
    selector = sel(**original)
    assert selector.model_dump(by_alias=True) == original
    with pytest.raises(ValidationError):
        selector.match_labels = {}  # type: ignore[misc]
    assert LabelSelector.model_validate(selector.model_dump(by_alias=True)) == selector


def test_selector_survives_pickling_after_use() -> None:
    selector = sel(matchLabels={"family": "qwen3"}, **only("params", "In", "32B"))
    assert selector.matches(LABELS)
    copied = pickle.loads(pickle.dumps(selector))
    assert copied == selector
    assert copied.matches(LABELS) and not copied.matches({"family": "qwen3"})
