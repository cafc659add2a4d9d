"""One call, one lifecycle (DESIGN §10), checked on the source.

* The agent, the gateway and the simulator each reach a call's life through
  ``kubemoot.runtime.calls``; none writes its own.
* A refusal is a typed value: no code compares a refusal's reason as text
  (``placement.reason == Reason.X.value``, ``reason == "gpu-busy"``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kubemoot.runtime.refusals import Reason

SRC = Path(__file__).resolve().parents[1] / "src" / "kubemoot"
_ENUMS = {"Reason", "StandAsideReason"}
_WIRE_NAMES = {r.value for r in Reason}


def _imports(package: str) -> set[str]:
    found: set[str] = set()
    for path in (SRC / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("package", ["agent", "gateway", "sim"])
def test_every_caller_goes_through_the_call_service(package: str) -> None:
    assert "kubemoot.runtime.calls" in _imports(package), (
        f"kubemoot.{package} must place its calls through kubemoot.runtime.calls")


def _names_a_reason(node: ast.expr) -> bool:
    """``Reason.X``, ``Reason.X.value`` or a reason's wire name as a literal."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id in _ENUMS
    return isinstance(node, ast.Constant) and node.value in _WIRE_NAMES


def string_comparisons_of_reasons(source: str) -> list[int]:
    """Lines where a reason is compared with ``==``/``!=``/``in`` (not ``is``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        textual = [op for op in node.ops if isinstance(op, ast.Eq | ast.NotEq | ast.In
                                                             | ast.NotIn)]
        if textual and any(_names_a_reason(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("source, hits", [
    ('if placement.reason == Reason.MODEL_UNKNOWN.value: pass', 1),
    ('if reason == "gpu-busy": pass', 1),
    ('if r != StandAsideReason.GPU_BUSY: pass', 1),
    ('if refusal.reason is Reason.GPU_BUSY: pass', 0),
    ('if isinstance(refusal, GpuBusy): pass', 0),
])
def test_the_check_finds_what_it_forbids(source: str, hits: int) -> None:
    assert len(string_comparisons_of_reasons(source)) == hits


def test_no_code_compares_a_refusal_reason_as_text() -> None:
    offenders = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        for line in string_comparisons_of_reasons(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "compare typed refusals, not their names: " + ", ".join(offenders)
