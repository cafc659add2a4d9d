"""One settings object, read from ``KUBEMOOT_*`` by every entry point, documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from kubemoot.api.errors import InputError
from kubemoot.runtime.settings import ENV_VARIABLES, RuntimeSettings

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))
DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
FIELDS = [item.name for item in fields(RuntimeSettings)]


def test_every_setting_has_its_own_variable() -> None:
    assert sorted(ENV_VARIABLES) == sorted(FIELDS)
    assert len(set(ENV_VARIABLES.values())) == len(FIELDS)
    assert all(name.startswith("KUBEMOOT_") for name in ENV_VARIABLES.values())


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_is_read_from_its_variable(name: str) -> None:
    default = getattr(RuntimeSettings(), name)
    wanted = default + 3 if isinstance(default, int) else default * 2 + 0.5
    read = RuntimeSettings.from_env({ENV_VARIABLES[name]: str(wanted), "OTHER": "x"})
    assert getattr(read, name) == wanted
    assert type(getattr(read, name)) is type(default)
    others = [n for n in FIELDS if n != name]
    assert [getattr(read, n) for n in others] == [getattr(RuntimeSettings(), n) for n in others]


@pytest.mark.parametrize(
    ("name", "text"),
    [("ticket_ttl_seconds", "soon"), ("claim_attempts", "2.5"),
     ("reserve_mib", "-1"), ("connect_wait_seconds", "nan")],
)
def test_a_bad_value_names_its_variable(name: str, text: str) -> None:
    variable = ENV_VARIABLES[name]
    with pytest.raises(InputError) as raised:
        RuntimeSettings.from_env({variable: text})
    assert raised.value.field == variable


def test_an_empty_variable_counts_as_unset() -> None:
    assert RuntimeSettings.from_env({ENV_VARIABLES["ticket_ttl_seconds"]: " "}) == \
        RuntimeSettings()


def test_the_docs_list_every_variable_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(KUBEMOOT_[A-Z_]+)` \| ([^|]+) \|", DOCS.read_text(), re.M))
    defaults = RuntimeSettings()
    for name, variable in ENV_VARIABLES.items():
        assert variable in rows, f"docs/runtime.md has no row for {variable}"
        assert float(rows[variable]) == getattr(defaults, name), variable


@pytest.mark.parametrize(
    "command",
    [["demo"], ["dashboard", "--port", "0"], ["operator", "--embedded"],
     ["emulate-ollama", "--port", "0"]],
    ids=lambda command: command[0],
)
def test_every_entry_point_reads_the_settings(command: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "KUBEMOOT_SHUTDOWN_GRACE_SECONDS": "soon", "HOME": str(tmp_path)}
    done = subprocess.run([KUBEMOOT, *command], capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    assert done.returncode == 2, done.stderr
    assert "field KUBEMOOT_SHUTDOWN_GRACE_SECONDS: must be a number" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_stack_built_without_settings_takes_the_deployments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kubemoot.agent.wiring import build_stack
    from kubemoot.clock import ManualClock
    from kubemoot.store.memory import MemoryKV

    monkeypatch.setenv(ENV_VARIABLES["ticket_ttl_seconds"], "42")
    clock = ManualClock(0.0)
    kv = MemoryKV(clock)
    # no provider: the chat pool's factory is never called
    stack = await build_stack(kv, clients={}, client_factory=_no_client, clock=clock)
    try:
        assert stack.settings.ticket_ttl_seconds == 42.0
    finally:
        await stack.close()
        await kv.close()


def _no_client(*args: object) -> Any:
    raise AssertionError("no provider here")
