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

from kubemoot.settings import ENV_VARIABLES, SettingError, Settings

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))
DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"
#: Every setting read from a variable, as ``section.field``.
KEYS = sorted(ENV_VARIABLES)
SECTIONS = ("runtime", "process", "crew", "dashboard")


def value(settings: Settings, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(settings, section), name)


def test_every_numeric_setting_of_every_read_section_has_its_own_variable() -> None:
    numeric = sorted(
        f"{section}.{item.name}" for section in SECTIONS
        for item in fields(getattr(Settings(), section)) if item.type in ("int", "float")
        and f"{section}.{item.name}" != "dashboard.store_check_seconds")
    assert numeric == KEYS
    assert len(set(ENV_VARIABLES.values())) == len(KEYS)
    assert all(name.startswith("KUBEMOOT_") for name in ENV_VARIABLES.values())


@pytest.mark.parametrize("key", KEYS)
def test_every_setting_is_read_from_its_variable(key: str) -> None:
    default = value(Settings(), key)
    wanted = default + 3 if isinstance(default, int) else default * 2 + 0.5
    read = Settings.from_env({ENV_VARIABLES[key]: str(wanted), "OTHER": "x"})
    assert value(read, key) == wanted
    assert type(value(read, key)) is type(default)
    others = [k for k in KEYS if k != key]
    assert [value(read, k) for k in others] == [value(Settings(), k) for k in others]


def test_the_dashboard_checks_the_store_as_the_process_does() -> None:
    read = Settings.from_env({ENV_VARIABLES["process.store_check_seconds"]: "0.5"})
    assert read.dashboard.store_check_seconds == read.process.store_check_seconds == 0.5


@pytest.mark.parametrize(
    ("key", "text"),
    [("runtime.ticket_ttl_seconds", "soon"), ("runtime.claim_attempts", "2.5"),
     ("runtime.reserve_mib", "-1"), ("process.connect_wait_seconds", "nan"),
     ("crew.silence_seconds", "x"), ("dashboard.max_clients", "1.5")],
)
def test_a_bad_value_names_its_variable(key: str, text: str) -> None:
    variable = ENV_VARIABLES[key]
    with pytest.raises(SettingError) as raised:
        Settings.from_env({variable: text})
    assert raised.value.field == variable


def test_an_empty_variable_counts_as_unset() -> None:
    assert Settings.from_env({ENV_VARIABLES["runtime.ticket_ttl_seconds"]: " "}) == Settings()


def test_the_wait_limit_falls_back_to_the_synthesis_deadline() -> None:
    assert Settings.from_env({"KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS": "45"}
                             ).runtime.gpu_wait_limit_seconds == 45.0
    both = {"KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS": "45",
            ENV_VARIABLES["runtime.gpu_wait_limit_seconds"]: "12"}
    assert Settings.from_env(both).runtime.gpu_wait_limit_seconds == 12.0


def test_the_docs_list_every_variable_with_its_default() -> None:
    rows = dict(re.findall(r"^\| `(KUBEMOOT_[A-Z_]+)` \| ([^|]+) \|", DOCS.read_text(), re.M))
    defaults = Settings()
    for key, variable in ENV_VARIABLES.items():
        assert variable in rows, f"docs/runtime.md has no row for {variable}"
        assert float(rows[variable]) == value(defaults, key), variable


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


async def test_a_stack_built_without_settings_takes_the_defaults_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only an entry point reads the environment (DESIGN §10): a stack given no
    settings uses the defaults even when a variable says otherwise."""
    from kubemoot.agent.wiring import build_stack
    from kubemoot.clock import ManualClock
    from kubemoot.store.memory import MemoryKV

    monkeypatch.setenv(ENV_VARIABLES["runtime.ticket_ttl_seconds"], "42")
    clock = ManualClock(0.0)
    kv = MemoryKV(clock)
    # no provider: the chat pool's factory is never called
    stack = await build_stack(kv, clients={}, client_factory=_no_client, clock=clock)
    try:
        assert stack.settings.ticket_ttl_seconds == Settings().runtime.ticket_ttl_seconds
        assert Settings.from_env().runtime.ticket_ttl_seconds == 42.0
    finally:
        await stack.close()
        await kv.close()


def _no_client(*args: object) -> Any:
    raise AssertionError("no provider here")
