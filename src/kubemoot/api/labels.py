"""Kubernetes validation of label keys, label values and object names.

The rules are Kubernetes' own (``k8s.io/apimachinery/pkg/util/validation``): a label key
is a *qualified name* (an optional DNS-subdomain prefix and ``/``, then a name of at most
63 characters), a label value is empty or a name-shaped string of at most 63 characters.
Each check returns the problems it found as short sentences, so callers decide whether
to raise and can name the offending field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "dns_label_problems",
    "dns_subdomain_problems",
    "label_value_problems",
    "qualified_name_problems",
    "validate_label_mapping",
]

_NAME_MAX = 63
_PREFIX_MAX = 253
_NAME_RE = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_LABEL_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
)

_NAME_SHAPE = (
    "must consist of alphanumeric characters, '-', '_' or '.', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_SHAPE = (
    "must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_DNS_LABEL_SHAPE = (
    "must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)


def qualified_name_problems(key: str) -> list[str]:
    """Problems with ``key`` as a label key (``[prefix/]name``); empty when valid."""
    prefix, slash, name = key.rpartition("/")
    problems: list[str] = []
    if slash:
        if "/" in prefix:
            return ["a qualified name may contain at most one '/'"]
        if not prefix:
            problems.append("prefix part must be non-empty")
        elif len(prefix) > _PREFIX_MAX:
            problems.append(f"prefix part must be no more than {_PREFIX_MAX} characters")
        elif not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
            problems.append(f"prefix part {_SUBDOMAIN_SHAPE}")
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > _NAME_MAX:
        problems.append(f"name part must be no more than {_NAME_MAX} characters")
    elif not _NAME_RE.fullmatch(name):
        problems.append(f"name part {_NAME_SHAPE}")
    return problems


def label_value_problems(value: str) -> list[str]:
    """Problems with ``value`` as a label value (empty is allowed)."""
    if value == "":
        return []
    if len(value) > _NAME_MAX:
        return [f"must be no more than {_NAME_MAX} characters"]
    if not _NAME_RE.fullmatch(value):
        return [f"a label value {_NAME_SHAPE}"]
    return []


def dns_subdomain_problems(name: str) -> list[str]:
    """Problems with ``name`` as an object name (a DNS-1123 subdomain)."""
    if not name:
        return ["must be non-empty"]
    if len(name) > _PREFIX_MAX:
        return [f"must be no more than {_PREFIX_MAX} characters"]
    if not _DNS_SUBDOMAIN_RE.fullmatch(name):
        return [f"a resource name {_SUBDOMAIN_SHAPE}"]
    return []


def dns_label_problems(name: str) -> list[str]:
    """Problems with ``name`` as a namespace (a DNS-1123 label)."""
    if not name:
        return ["must be non-empty"]
    if len(name) > _NAME_MAX:
        return [f"must be no more than {_NAME_MAX} characters"]
    if not _DNS_LABEL_RE.fullmatch(name):
        return [f"a namespace {_DNS_LABEL_SHAPE}"]
    return []


def validate_label_mapping(labels: Any) -> dict[str, str]:
    """Check a whole ``labels``/``matchLabels`` mapping; raise ``ValueError`` on the first problem.

    Values must be strings: YAML reads ``true`` or ``32768`` unquoted as a boolean or a
    number, which Kubernetes rejects, so we say so and suggest quoting instead of guessing
    how the user meant it to be spelled.
    """
    if not isinstance(labels, Mapping):
        raise ValueError(f"must be a mapping of label keys to values, got {_type_name(labels)}")
    checked: dict[str, str] = {}
    for key, value in labels.items():
        if not isinstance(key, str):
            raise ValueError(f"label key {key!r} must be a string")
        problems = qualified_name_problems(key)
        if problems:
            raise ValueError(f'invalid label key "{key}": {"; ".join(problems)}')
        if not isinstance(value, str):
            hint = _quote_hint(value)
            raise ValueError(
                f'label "{key}" must have a string value, got {_type_name(value)}{hint}'
            )
        problems = label_value_problems(value)
        if problems:
            raise ValueError(f'invalid value "{value}" for label "{key}": {"; ".join(problems)}')
        checked[key] = value
    return checked


def _quote_hint(value: Any) -> str:
    if isinstance(value, bool):
        return f'; quote it: "{str(value).lower()}"'
    if isinstance(value, int | float):
        return f'; quote it: "{value}"'
    return ""


def _type_name(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
