"""What an Agent's spec asks of its process: the tools it may call and its prompts.

The operator templates two variables from the Agent's spec beside the binding:

* ``KUBEMOOT_AGENT_ENABLED_TOOLS`` — ``spec.enabledTools`` as a JSON list of tool names.
  Each must name a tool of the process's toolbox (for ``kubemoot agent``, the demo's
  canned tools); the model is offered exactly these, and the tool loop with its caps
  and its context guard runs in the agent's own process.
* ``KUBEMOOT_AGENT_PROMPT_REFS`` — ``spec.promptRefs`` as a JSON list of ConfigMap keys.
  The crew mounts the ConfigMap that holds them as a directory (``KUBEMOOT_PROMPTS_DIR``,
  default ``/etc/kubemoot/prompts``): one file per key, as a ConfigMap volume lays them
  out. The system prompt is the files' text in the order of the list.

A malformed list, an unknown tool or a missing prompt file is an
:class:`~kubemoot.api.errors.InputError` naming the variable and the entry, so the
process exits 2 before it joins its crew. A ConfigMap edit reaches a mounted volume
without a restart; :class:`PromptSource` reads the files again when asked and keeps the
last good text when a file has gone missing meanwhile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubemoot.agent.toolloop import Tool
from kubemoot.api.errors import InputError

__all__ = [
    "DEFAULT_PROMPTS_DIR",
    "ENV_ENABLED_TOOLS",
    "ENV_PROMPTS_DIR",
    "ENV_PROMPT_REFS",
    "PromptSource",
    "enabled_tools",
    "prompt_source",
]

log = logging.getLogger(__name__)

ENV_ENABLED_TOOLS = "KUBEMOOT_AGENT_ENABLED_TOOLS"
ENV_PROMPT_REFS = "KUBEMOOT_AGENT_PROMPT_REFS"
ENV_PROMPTS_DIR = "KUBEMOOT_PROMPTS_DIR"
DEFAULT_PROMPTS_DIR = "/etc/kubemoot/prompts"
MAX_NAMES = 64  # far more than an Agent lists; bounds a malformed variable
MAX_PROMPT_BYTES = 256 * 1024  # a system prompt, not a corpus


def json_list(env: Mapping[str, str], variable: str, *, example: str, limit: int,
              what: str) -> list[Any]:
    """The JSON list in ``variable`` ([] when unset), at most ``limit`` entries; a clear
    InputError naming the variable otherwise."""
    text = env.get(variable, "").strip()
    if not text:
        return []
    try:
        items = json.loads(text)
    except ValueError as error:
        raise InputError(f"is not JSON: {error}", field=variable) from None
    if not isinstance(items, list):
        raise InputError(f"must be a JSON list like {example}", field=variable)
    if len(items) > limit:
        raise InputError(f"lists {len(items)} {what}; at most {limit}", field=variable)
    return items


def _names(env: Mapping[str, str], variable: str) -> tuple[str, ...]:
    items = json_list(env, variable, example='["kubectl_get"]', limit=MAX_NAMES,
                      what="names")
    names: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise InputError(f"must be a non-empty name, got {item!r}",
                             field=f"{variable}[{index}]")
        names.append(item.strip())
    return tuple(names)  # duplicates kept, so an error's index is the entry's own


def enabled_tools(env: Mapping[str, str], toolbox: Mapping[str, Tool]) -> tuple[Tool, ...]:
    """The toolbox's tools that ``KUBEMOOT_AGENT_ENABLED_TOOLS`` names, in its order."""
    tools: dict[str, Tool] = {}
    for index, name in enumerate(_names(env, ENV_ENABLED_TOOLS)):
        tool = toolbox.get(name)
        if tool is None:
            known = ", ".join(sorted(toolbox)) or "none"
            raise InputError(f"names no tool this agent has: {name!r} (it has: {known})",
                             field=f"{ENV_ENABLED_TOOLS}[{index}]")
        tools.setdefault(name, tool)  # a tool listed twice is offered once
    return tuple(tools.values())


@dataclass(slots=True)
class PromptSource:
    """The system prompt from the mounted ConfigMap keys, read again on request."""

    directory: Path
    refs: tuple[str, ...]
    text: str = ""

    def read(self) -> str:
        """Read every file now; :class:`InputError` names the first that is missing."""
        parts: list[str] = []
        for index, ref in enumerate(self.refs):
            where = f"{ENV_PROMPT_REFS}[{index}]"
            if "/" in ref or ref in (".", ".."):
                raise InputError(f"{ref!r} is not a ConfigMap key", field=where)
            path = self.directory / ref
            try:
                data = path.read_bytes()
            except OSError as error:
                raise InputError(
                    f"no prompt {ref!r}: cannot read {path} ({error.strerror}); mount the "
                    f"ConfigMap that holds the key at {self.directory} (or set "
                    f"{ENV_PROMPTS_DIR})", field=where) from None
            if len(data) > MAX_PROMPT_BYTES:
                raise InputError(f"{path} holds {len(data)} bytes; at most "
                                 f"{MAX_PROMPT_BYTES}", field=where)
            parts.append(data.decode("utf-8", errors="replace").strip())
        self.text = "\n\n".join(p for p in parts if p)
        return self.text

    def reread(self) -> str:
        """The files' text now, or the last good text when one cannot be read."""
        try:
            return self.read()
        except InputError as error:
            log.warning("keeping the last system prompt: %s", error)
            return self.text


def prompt_source(env: Mapping[str, str]) -> PromptSource | None:
    """The prompt files ``KUBEMOOT_AGENT_PROMPT_REFS`` names, read once; None without refs."""
    refs = _names(env, ENV_PROMPT_REFS)
    if not refs:
        return None
    directory = Path(env.get(ENV_PROMPTS_DIR, "").strip() or DEFAULT_PROMPTS_DIR)
    source = PromptSource(directory, refs)
    source.read()
    return source
