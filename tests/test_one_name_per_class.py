"""One name, one concept: no two public classes in ``src/kubemoot`` share a name.

Two classes with one name made readers guess which one a module meant (the runtime's
per-call ``Candidate`` and the Agent status's ``Candidate``; the capability gates and the
scheduling plugins both called ``RuntimeGate``). A re-export (``from … import X`` in a
package ``__init__``) is one class and is not counted: only ``class`` statements are.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kubemoot"

#: Names that may be defined more than once, each with why it is one concept. Empty:
#: add an entry only for a class that truly is the same concept in two places.
ALLOWED: dict[str, str] = {}


def public_classes(root: Path) -> dict[str, list[str]]:
    """Every module-level public class name under ``root``, with the modules defining it."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(root.parent)))
    return found


def test_the_scan_sees_the_package() -> None:
    classes = public_classes(SRC)
    # Names this test exists for: each now defined once, where its concept lives.
    assert classes["CallPlacement"] == ["kubemoot/runtime/placement.py"]
    assert classes["Placement"] == ["kubemoot/scheduling/candidate.py"]
    assert classes["PhaseCandidate"] == ["kubemoot/api/agent.py"]
    assert classes["CandidateModel"] == ["kubemoot/runtime/placement.py"]


def test_no_two_public_classes_share_a_name() -> None:
    shared = {
        name: modules
        for name, modules in public_classes(SRC).items()
        if len(modules) > 1 and name not in ALLOWED
    }
    assert not shared, "one name, two concepts: " + "; ".join(
        f"{name} in {', '.join(modules)}" for name, modules in sorted(shared.items())
    )


def test_allowed_duplicates_still_exist() -> None:
    # An allow-list entry whose duplicate is gone would hide the next one of that name.
    classes = public_classes(SRC)
    stale = [name for name in ALLOWED if len(classes.get(name, [])) < 2]
    assert not stale, f"remove from ALLOWED: {stale}"
