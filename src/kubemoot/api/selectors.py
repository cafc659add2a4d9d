"""Kubernetes label selectors: ``matchLabels`` plus ``matchExpressions``.

Semantics follow Kubernetes exactly: every ``matchLabels`` pair and every expression must
hold (AND); an empty selector matches everything; a missing (``None``) selector matches
nothing; ``NotIn`` and ``DoesNotExist`` match a label that is absent. ``Gt`` and ``Lt``
work as in node affinity: they compare integer label values, and a label that is absent
or not an integer does not match.

A selector is a value: it is frozen, and its match function is compiled once, on first
use, because the scheduler evaluates selectors for every (rule, model) pair on every
pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kubemoot.api.labels import (
    label_value_problems,
    qualified_name_problems,
    validate_label_mapping,
)

__all__ = [
    "OPERATORS",
    "LabelSelector",
    "LabelSelectorRequirement",
    "SelectorOperator",
    "selector_matches",
]

SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
OPERATORS: tuple[str, ...] = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

# Go's strconv.ParseInt accepts an optional sign and decimal digits, nothing else;
# Python's int() would also take spaces and underscores, which Kubernetes does not.
_INTEGER_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

Labels = Mapping[str, str]
_Check = Callable[[Labels], bool]


def _parse_int(text: str) -> int | None:
    # An int64 has at most 19 digits; the length check also spares int() a string so long
    # that Python refuses to convert it.
    if len(text) > 20 or not _INTEGER_RE.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None


class LabelSelectorRequirement(BaseModel):
    """One ``matchExpressions`` entry: ``key``, ``operator`` and ``values``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    key: str
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list, description="Operands of the operator.")

    @field_validator("key")
    @classmethod
    def _key_is_qualified_name(cls, key: str) -> str:
        problems = qualified_name_problems(key)
        if problems:
            raise ValueError(f'invalid label key "{key}": {"; ".join(problems)}')
        return key

    @field_validator("operator", mode="before")
    @classmethod
    def _known_operator(cls, operator: Any) -> Any:
        if operator not in OPERATORS:
            shown = f'"{operator}"' if isinstance(operator, str) else repr(operator)
            raise ValueError(
                f"unknown operator {shown}; use In, NotIn, Exists, DoesNotExist, Gt or Lt"
            )
        return operator

    @field_validator("values", mode="before")
    @classmethod
    def _values_are_label_values(cls, values: Any) -> Any:
        if values is None:
            return []
        if not isinstance(values, list | tuple):
            raise ValueError("values must be a list of strings")
        for value in values:
            if not isinstance(value, str):
                raise ValueError(f"every value must be a string, got {value!r}; quote it")
        return list(values)

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        op, values = self.operator, self.values
        if op in ("In", "NotIn"):
            if not values:
                raise ValueError(f"operator {op} needs at least one value")
            # Compared with label values, so each must be one (Gt/Lt take any integer).
            for value in values:
                problems = label_value_problems(value)
                if problems:
                    raise ValueError(f'invalid value "{value}": {"; ".join(problems)}')
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"operator {op} takes no values")
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise ValueError(f"operator {op} needs exactly one value")
            if _parse_int(values[0]) is None:
                shown = values[0] if len(values[0]) <= 40 else values[0][:37] + "..."
                raise ValueError(
                    f'operator {op} needs an integer value, got "{shown}"'
                )
        return self

    def compile(self) -> _Check:
        """A function of the labels that says whether this requirement holds."""
        key, op = self.key, self.operator
        if op == "In":
            allowed = frozenset(self.values)
            return lambda labels: labels.get(key) in allowed
        if op == "NotIn":
            denied = frozenset(self.values)
            return lambda labels: labels.get(key) not in denied
        if op == "Exists":
            return lambda labels: key in labels
        if op == "DoesNotExist":
            return lambda labels: key not in labels
        bound = int(self.values[0])
        greater = op == "Gt"

        def compare(labels: Labels) -> bool:
            text = labels.get(key)
            number = None if text is None else _parse_int(text)
            if number is None:
                return False
            return number > bound if greater else number < bound

        return compare

    def describe(self) -> str:
        """Short human form: ``params: 14B|32B``, ``!gpu``, ``size > 8``."""
        joined = "|".join(self.values)
        forms = {
            "In": f"{self.key}: {joined}",
            "NotIn": f"{self.key} not in {joined}",
            "Exists": self.key,
            "DoesNotExist": f"!{self.key}",
            "Gt": f"{self.key} > {joined}",
            "Lt": f"{self.key} < {joined}",
        }
        return forms[self.operator]


class LabelSelector(BaseModel):
    """A Kubernetes label selector; :meth:`matches` is compiled when the selector is built."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, alias="matchExpressions"
    )

    @field_validator("match_labels", mode="before")
    @classmethod
    def _valid_labels(cls, labels: Any) -> Any:
        return {} if labels is None else validate_label_mapping(labels)

    @field_validator("match_expressions", mode="before")
    @classmethod
    def _expressions_list(cls, expressions: Any) -> Any:
        return [] if expressions is None else expressions

    @cached_property
    def matcher(self) -> _Check:
        """The compiled match function (built once; the instance's ``__dict__`` holds it, so
        calling it costs no pydantic attribute machinery)."""
        pairs = tuple(self.match_labels.items())
        checks = tuple(expression.compile() for expression in self.match_expressions)

        def match(labels: Labels) -> bool:
            get = labels.get
            for key, value in pairs:
                if get(key) != value:
                    return False
            for check in checks:  # noqa: SIM110 - a plain loop beats all() over a generator
                if not check(labels):
                    return False
            return True

        return match

    def __eq__(self, other: object) -> bool:
        # Compare the declared selector only; the compiled checks are closures that differ
        # between equal selectors.
        if not isinstance(other, LabelSelector):
            return NotImplemented
        return (self.match_labels, self.match_expressions) == (
            other.match_labels,
            other.match_expressions,
        )

    def __hash__(self) -> int:
        return hash(self.describe())

    def __getstate__(self) -> dict[Any, Any]:
        # The compiled closure cannot be pickled; it is rebuilt on first use.
        state = super().__getstate__()
        fields = dict(state["__dict__"])
        fields.pop("matcher", None)
        state["__dict__"] = fields
        return state

    @property
    def is_empty(self) -> bool:
        """An empty selector matches every set of labels."""
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Labels) -> bool:
        """Whether every matchLabels pair and every expression hold for ``labels``."""
        return self.matcher(labels)

    def describe(self) -> str:
        """Short human form for messages: ``{capability/tool-calling: true, params: 14B|32B}``."""
        parts = [f"{key}: {value}" for key, value in self.match_labels.items()]
        parts.extend(expression.describe() for expression in self.match_expressions)
        return "{" + ", ".join(parts) + "}"


def selector_matches(selector: LabelSelector | None, labels: Labels) -> bool:
    """Kubernetes semantics for an optional selector: ``None`` matches nothing."""
    return selector is not None and selector.matches(labels)
