"""The environment is read once per process, by its entry point (DESIGN §10).

Only ``kubemoot.settings`` (which parses the ``KUBEMOOT_*`` variables) and the command
modules under ``kubemoot.cli`` (the entry points that call it) touch ``os.environ``.
Everything below them receives values, so a test, the simulator or a second process in
one interpreter builds the same objects without setting variables.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kubemoot"

#: Modules below the entry points that read a variable that is not Kubemoot's, and why.
NOT_OURS = {
    "operator/kube.py": "KUBECONFIG, as kubectl reads it",
    "operator/events.py": "HOSTNAME, the Pod's name in the Events it writes",
}


def _entry_point(relative: str) -> bool:
    return relative == "settings.py" or relative.startswith("cli/")


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that reach ``os.environ`` or ``os.getenv`` (or import them from ``os``)."""
    lines = []
    for node in ast.walk(tree):
        attribute = (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                     and isinstance(node.value, ast.Name) and node.value.id == "os")
        imported = (isinstance(node, ast.ImportFrom) and node.module == "os"
                    and any(alias.name in ("environ", "getenv") for alias in node.names))
        if attribute or imported:
            lines.append(getattr(node, "lineno", 0))
    return lines


def _reads_settings_from_the_environment(tree: ast.AST) -> list[int]:
    """Lines that call ``X.from_env()`` with no mapping: that reads ``os.environ``."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "from_env" and not node.args and not node.keywords]


def _names_a_kubemoot_variable(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Constant) and isinstance(node.value, str)
               and node.value.startswith("KUBEMOOT_") for node in ast.walk(tree))


def test_no_module_below_the_entry_points_reads_a_kubemoot_variable() -> None:
    offenders: dict[str, list[int]] = {}
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if _entry_point(relative):
            continue
        tree = ast.parse(path.read_text(), str(path))
        lines = _reads_settings_from_the_environment(tree)
        if relative in NOT_OURS:
            assert not _names_a_kubemoot_variable(tree), (
                f"{relative} may read only {NOT_OURS[relative]}")
        else:
            lines += _reads_environment(tree)
        if lines:
            offenders[relative] = sorted(lines)
    assert offenders == {}, f"environment read below the entry points: {offenders}"


def test_the_check_sees_a_read() -> None:
    """The checks find each way of reading the environment they guard against."""
    reads = ast.parse("import os\nos.environ.get('KUBEMOOT_X')\nos.getenv('KUBEMOOT_Y')\n")
    imported = ast.parse("from os import environ\n")
    settings = ast.parse("Settings.from_env()\nSettings.from_env({})\n")
    assert sorted(_reads_environment(reads)) == [2, 3]
    assert _reads_environment(imported) == [1]
    assert _reads_settings_from_the_environment(settings) == [1]
    assert _names_a_kubemoot_variable(reads)


def test_the_exceptions_still_exist() -> None:
    """A module named as an exception that no longer reads the environment is dropped
    from the list, so the list stays the truth."""
    for relative in NOT_OURS:
        tree = ast.parse((SRC / relative).read_text())
        assert _reads_environment(tree), relative
