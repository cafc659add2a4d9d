"""The declared markers stay true: whatever starts a nats-server or drives Chromium says so.

``-m "not nats"`` and ``-m "not browser"`` are how a developer leaves out what their
machine cannot run; a test that starts a server but is not marked would break that
silently. tests/conftest.py marks every test that asks (directly or through other
fixtures) for a fixture named in ``NATS_FIXTURES`` or ``BROWSER_FIXTURES``; this reads
the source of every test module and checks that nothing escapes that net.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from tests.conftest import BROWSER_FIXTURES, NATS_FIXTURES

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

#: Names whose use starts a real nats-server (kubemoot.testing.nats_server).
STARTS_NATS = frozenset({"NatsServer", "running_nats_server", "find_nats_server"})
#: Names whose use drives a browser.
DRIVES_BROWSER = frozenset({"async_playwright", "sync_playwright"})


def _names(node: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)}


def _marks(decorators: list[ast.expr]) -> set[str]:
    """Marker names of ``@pytest.mark.x`` / ``pytestmark = pytest.mark.x`` expressions."""
    found = set()
    for decorator in decorators:
        for node in ast.walk(decorator):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr == "mark"):
                found.add(node.attr)
    return found


def _is_fixture(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in _names(d) for d in function.decorator_list)


def _module_marks(tree: ast.Module) -> set[str]:
    values = [s.value for s in tree.body if isinstance(s, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)]
    return _marks(values)


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _unmarked(marker: str, uses: frozenset[str], fixtures: frozenset[str], *,
              under: Path = TESTS) -> list[str]:
    """Fixtures that use ``uses`` but are not in ``fixtures``; tests that use them
    without the ``marker`` mark."""
    problems = []
    for path in sorted(under.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        module_marked = marker in _module_marks(tree)
        for function in _functions(tree):
            # the body only: an annotation naming NatsServer starts nothing
            if not set().union(*map(_names, function.body)) & uses:
                continue
            where = f"{path.relative_to(under)}::{function.name}"
            marked = module_marked or marker in _marks(function.decorator_list)
            if _is_fixture(function):
                # in the list, or its parameters that need the thing carry the mark
                if function.name not in fixtures and not marked:
                    problems.append(f"fixture {where} is not in tests/conftest.py's list")
            elif function.name.startswith("test_") and not marked:
                problems.append(f"{where} is not marked {marker}")
    return problems


def test_markers_used_here_are_declared() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["markers"]
    assert {line.split(":")[0] for line in declared} >= {"nats", "browser", "slow"}


@pytest.mark.parametrize(("marker", "uses", "fixtures"), [
    ("nats", STARTS_NATS, NATS_FIXTURES),
    ("browser", DRIVES_BROWSER, BROWSER_FIXTURES),
])
def test_what_starts_a_server_or_a_browser_is_marked(
    marker: str, uses: frozenset[str], fixtures: frozenset[str]
) -> None:
    assert _unmarked(marker, uses, fixtures) == []


def test_the_check_finds_what_escapes_the_net(tmp_path: Path) -> None:
    (tmp_path / "test_loose.py").write_text(
        "@pytest.fixture\nasync def server():\n    return NatsServer()\n\n"
        "async def test_x():\n    async with running_nats_server():\n        pass\n\n"
        "@pytest.mark.nats\nasync def test_y():\n    NatsServer()\n")
    (tmp_path / "test_marked.py").write_text(
        "pytestmark = [pytest.mark.nats, pytest.mark.slow]\n\n"
        "def test_z():\n    find_nats_server()\n")
    assert _unmarked("nats", STARTS_NATS, frozenset(), under=tmp_path) == [
        "fixture test_loose.py::server is not in tests/conftest.py's list",
        "test_loose.py::test_x is not marked nats",
    ]
    assert _unmarked("nats", STARTS_NATS, frozenset({"server"}), under=tmp_path) == [
        "test_loose.py::test_x is not marked nats"]
