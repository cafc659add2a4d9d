"""Structural OpenAPI v3 schemas from pydantic models, and a validator over them.

Kubernetes accepts only *structural* schemas in a CRD: every node has a type, no ``$ref``,
no ``anyOf`` with ``null`` (``nullable: true`` instead), no ``additionalProperties: false``
(the API server prunes unknown fields instead), and ``x-kubernetes-preserve-unknown-fields``
where free-form data is allowed. :func:`structural_schema` converts pydantic's JSON Schema
into that form; :func:`validate_value` checks a value against such a schema the way the
API server would (types, required fields, enums, bounds, unknown fields), so manifests can
be tested without a cluster.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from kubemoot.api.meta import other_mib_spelling

__all__ = ["PRESERVE", "structural_schema", "validate_value"]

PRESERVE = "x-kubernetes-preserve-unknown-fields"
_DROPPED = {"title", "$defs", "discriminator"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (wire names, inlined definitions)."""
    source = model.model_json_schema(by_alias=True, mode="validation")
    source.pop("description", None)
    return _convert(source, source.get("$defs", {}), depth=0)


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], *, depth: int) -> dict[str, Any]:
    if depth > 50:  # our models are not recursive; this guards against a future mistake
        raise ValueError("schema nests too deeply (a recursive model?)")
    node = _inline(node, defs)
    any_of = node.get("anyOf")
    if any_of is not None:
        return _convert_any_of(node, any_of, defs, depth=depth)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or key in ("$ref", "allOf"):
            continue
        if key == "description":
            out[key] = str(value).replace("``", "`")
        elif key == "default":
            if value is not None:
                out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020 gives the bound; OpenAPI v3.0 wants the bound plus a flag.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {
                name: _convert(sub, defs, depth=depth + 1) for name, sub in value.items()
            }
            out[key].update(_other_mib_spellings(out[key]))
        elif key == "items":
            out[key] = _convert(value, defs, depth=depth + 1)
        elif key == "additionalProperties":
            if value is True:
                out[PRESERVE] = True
            elif isinstance(value, Mapping):
                out[key] = _convert(value, defs, depth=depth + 1)
            # False: dropped; a structural schema prunes unknown fields instead.
        else:
            out[key] = copy.deepcopy(value)  # no shared lists, so YAML needs no anchors
    if "type" not in out and "enum" not in out:
        out[PRESERVE] = True  # free-form (Any): keep whatever the user wrote
    if out.get("type") == "object" and "properties" in out and PRESERVE in out:
        out.pop("additionalProperties", None)
    if "enum" in out and "type" not in out:
        out["type"] = _json_type(out["enum"][0])
    return out


def _other_mib_spellings(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The other spelling of each mebibyte field (``vramMiB`` beside ``vramMib``).

    The models read both (:meth:`~kubemoot.api.meta.Strict._either_mib_spelling`); the
    API server must keep both too, or it would prune the one the schema does not name.
    """
    extra: dict[str, Any] = {}
    for name, sub in properties.items():
        other = other_mib_spelling(name)
        if other is not None and other not in properties:
            extra[other] = {**copy.deepcopy(sub), "description": f"Same as {name}."}
    return extra


def _inline(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(node)
    ref = merged.pop("$ref", None)
    all_of = merged.pop("allOf", None)
    targets: list[Mapping[str, Any]] = []
    if isinstance(ref, str):
        targets.append(defs[ref.rsplit("/", 1)[-1]])
    if isinstance(all_of, list):
        targets.extend(_inline(item, defs) for item in all_of)
    for target in targets:
        for key, value in target.items():
            # A type's description is its Python docstring, written for programmers; only
            # a field's own description is meant for `kubectl explain`.
            if key != "description":
                merged.setdefault(key, value)
    return merged


def _convert_any_of(
    node: Mapping[str, Any], options: list[Any], defs: Mapping[str, Any], *, depth: int
) -> dict[str, Any]:
    non_null = [option for option in options if option.get("type") != "null"]
    if len(non_null) != 1:
        out: dict[str, Any] = {PRESERVE: True}  # a real union: let the model validate it
    else:
        out = _convert(non_null[0], defs, depth=depth + 1)
    if len(non_null) < len(options):
        out["nullable"] = True
    for key in ("description", "default"):
        if node.get(key) is not None:
            out[key] = str(node[key]).replace("``", "`") if key == "description" else node[key]
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


# ---------------------------------------------------------------------------- validation


def _type_ok(value: Any, expected: str) -> bool:
    if expected == "object":
        return isinstance(value, Mapping)
    if expected == "array":
        return isinstance(value, list | tuple)
    if expected == "string":
        return isinstance(value, str | dt.date)  # YAML reads timestamps as datetimes
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected == "boolean":
        return isinstance(value, bool)
    return True


def _date_time_ok(value: Any) -> bool:
    if isinstance(value, dt.datetime):
        return True
    if not isinstance(value, str):
        return False
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return False
    return "T" in value.upper()


def validate_value(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Problems of ``value`` against a structural ``schema``; empty when it conforms."""
    errors: list[str] = []
    _check(value, schema, path, errors)
    return errors


def _check(value: Any, schema: Mapping[str, Any], path: str, errors: list[str]) -> None:
    where = path or "<root>"
    if value is None:
        if not schema.get("nullable"):
            errors.append(f"{where}: must not be null")
        return
    expected = schema.get("type")
    if expected is None:
        return  # preserved, free-form
    if not _type_ok(value, expected):
        errors.append(f"{where}: expected {expected}, got {type(value).__name__}")
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(str(item) for item in schema["enum"])
        errors.append(f"{where}: unsupported value {value!r}; allowed: {allowed}")
    if expected in ("integer", "number"):
        _check_bounds(value, schema, where, errors)
    elif expected == "string":
        if schema.get("format") == "date-time" and not _date_time_ok(value):
            errors.append(f"{where}: expected an RFC 3339 date-time, got {value!r}")
        if isinstance(value, str) and len(value) < schema.get("minLength", 0):
            errors.append(f"{where}: must have at least {schema['minLength']} characters")
        if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{where}: must have at most {schema['maxLength']} characters")
    elif expected == "array":
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{where}: must have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{where}: must have at most {schema['maxItems']} items")
        items = schema.get("items")
        if items is not None:
            for index, item in enumerate(value):
                _check(item, items, f"{path}[{index}]", errors)
    elif expected == "object":
        _check_object(value, schema, path, errors)


def _check_bounds(value: float, schema: Mapping[str, Any], where: str, errors: list[str]) -> None:
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is not None:
        if schema.get("exclusiveMinimum") and value <= low:
            errors.append(f"{where}: must be greater than {low}")
        elif value < low:
            errors.append(f"{where}: must be at least {low}")
    if high is not None:
        if schema.get("exclusiveMaximum") and value >= high:
            errors.append(f"{where}: must be less than {high}")
        elif value > high:
            errors.append(f"{where}: must be at most {high}")


def _check_object(
    value: Mapping[Any, Any], schema: Mapping[str, Any], path: str, errors: list[str]
) -> None:
    if "properties" not in schema and "additionalProperties" not in schema:
        return  # an opaque object, such as metadata (the API server owns its schema)
    properties: Mapping[str, Any] = schema.get("properties", {})
    extra: Mapping[str, Any] | None = schema.get("additionalProperties")
    for name in schema.get("required", ()):
        if name not in value:
            errors.append(f"{_join(path, name)}: required field is missing")
    for key, item in value.items():
        child = _join(path, str(key))
        if key in properties:
            _check(item, properties[key], child, errors)
        elif extra is not None:
            _check(item, extra, child, errors)
        elif not schema.get(PRESERVE):
            errors.append(f"{child}: unknown field")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
