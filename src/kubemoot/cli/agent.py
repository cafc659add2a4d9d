"""``kubemoot agent`` — one Agent of a crew, as the process its Deployment runs.

It reads who it is (``--name``/``--namespace``/``--crew``/``--role``, or the
``KUBEMOOT_AGENT_*`` and ``KUBEMOOT_CREW`` variables the crew's manifests set), what the
operator bound for it (``KUBEMOOT_MODEL_*``), and the runtime's settings
(``KUBEMOOT_*``); connects to NATS (``--nats`` or ``KUBEMOOT_NATS_URL``); and takes part
in its crew's discussions until SIGTERM. The coordinator Agent answers questions asked
with ``kubemoot ask``; every other Agent takes part when the coordinator selects it.
The tools ``KUBEMOOT_AGENT_ENABLED_TOOLS`` may name are the demo's canned set; every
finished call goes to the call log (``kubemoot_call_log``) for the dashboard.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, err_console, install_log_lines
from kubemoot.cli._nats import (
    NO_NATS_FLAGS,
    NatsFlags,
    mask_servers,
    nats_options,
    open_shared_store,
    resolve_nats,
)

if TYPE_CHECKING:
    from kubemoot.agent.process import AgentIdentity
    from kubemoot.clock import Clock
    from kubemoot.process import Lifecycle
    from kubemoot.settings import NatsSettings, Settings
    from kubemoot.store.protocol import KV

READY_LINE = "kubemoot agent: ready"
#: Printed at start and whenever the shared state moves a static target.
STATIC_LINE = "kubemoot agent: static targets"


def _given(flag_value: str | None, variable: str, flag: str, *, default: str | None = None
           ) -> str:
    value = (flag_value if flag_value is not None else os.environ.get(variable, "")).strip()
    if value:
        return value
    if default is not None:
        return default
    raise InputError(f"is required (or set {variable})", field=flag)


@app.command("agent")
@nats_options(url_from_env=True)
def agent_command(
    name: str | None = typer.Option(None, "--name", metavar="NAME",
                                    help="The Agent's name (env KUBEMOOT_AGENT_NAME)."),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", metavar="NAMESPACE",
        help="The Agent's namespace (env KUBEMOOT_AGENT_NAMESPACE)."),
    crew: str | None = typer.Option(
        None, "--crew", metavar="CREW",
        help="The crew, the Agent's kubemoot.ai/crew label (env KUBEMOOT_CREW)."),
    role: str | None = typer.Option(
        None, "--role", metavar="ROLE",
        help="The Agent's discussRole; coordinator answers questions (env "
        "KUBEMOOT_AGENT_ROLE, default member)."),
    nats: NatsFlags = NO_NATS_FLAGS,
) -> None:
    """Run one Agent of a crew: join its discussions over NATS, place every call."""
    from kubemoot.agent.process import (
        ENV_AGENT_NAME,
        ENV_AGENT_NAMESPACE,
        ENV_AGENT_ROLE,
        ENV_CREW,
        AgentIdentity,
        profile_from_env,
        sizes_from_env,
    )
    from kubemoot.agent.remote import CrewRef

    identity = AgentIdentity(
        name=_given(name, ENV_AGENT_NAME, "--name"),
        namespace=_given(namespace, ENV_AGENT_NAMESPACE, "--namespace"),
        crew=CrewRef(_given(namespace, ENV_AGENT_NAMESPACE, "--namespace"),
                     _given(crew, ENV_CREW, "--crew")),
        role=_given(role, ENV_AGENT_ROLE, "--role", default="member"),
    )
    if not nats.names_servers():
        raise InputError("a crew talks over NATS: give --nats nats://HOST:PORT (or set "
                         "KUBEMOOT_NATS_URL)", field="--nats")
    settings = resolve_nats(nats, use_nats=True)
    assert settings is not None
    # a malformed binding, an unknown tool or a missing prompt is exit 2, before connecting
    from kubemoot.agent.demo import demo_toolbox
    from kubemoot.agent.spec_env import enabled_tools, prompt_source

    profile_from_env(os.environ, identity)
    sizes_from_env(os.environ)
    enabled_tools(os.environ, demo_toolbox())
    prompt_source(os.environ)
    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.settings import Settings

    tunables = Settings.from_env()
    install_log_lines()
    run_until_stopped(_run(identity, settings, tunables),
                      grace_seconds=tunables.process.shutdown_grace_seconds)


async def _run(identity: AgentIdentity, nats: NatsSettings, tunables: Settings) -> None:
    from kubemoot.cli._ready import clear_ready
    from kubemoot.clock import SystemClock
    from kubemoot.process import Lifecycle, Stage

    clear_ready()  # a file left by the previous run of this container vouches for nothing
    clock = SystemClock()
    # What started is stopped in one order (kubemoot.process): the agent's work first (its
    # threads give their tickets back), the call log's last entries, the runtime's
    # leftovers, the store last.
    process = Lifecycle(straggler_grace=tunables.process.straggler_grace_seconds)
    try:
        kv = await open_shared_store(nats, clock=clock,
                                     connect_wait=tunables.process.connect_wait_seconds)
        process.on_stop(Stage.STORE, kv.close, name="store")
        await _serve(identity, nats, tunables, kv, clock, process)
    finally:
        clear_ready()
        await process.shutdown()


async def _serve(identity: AgentIdentity, nats: NatsSettings, tunables: Settings, kv: KV,
                 clock: Clock, process: Lifecycle) -> None:
    from kubemoot.agent.demo import demo_toolbox
    from kubemoot.agent.discussion import AgentProfile
    from kubemoot.agent.pool import CallSettings
    from kubemoot.agent.process import describe, serve_agent
    from kubemoot.cli._ready import mark_ready
    from kubemoot.dashboard.calllog import CallLogWriter
    from kubemoot.process import Stage
    from kubemoot.providers.factory import ProviderClients
    from kubemoot.providers.protocol import ProviderClient
    from kubemoot.store.documents import ProviderState
    from kubemoot.store.nats import NatsKV
    from kubemoot.store.natsbus import NatsBus

    assert isinstance(kv, NatsKV)

    # every provider client of this process, with the timeouts read at its start
    clients = ProviderClients.of(tunables.runtime, clock=clock)

    def make_client(state: ProviderState) -> ProviderClient:
        return clients.for_state(state)

    def chat_client(provider: str, endpoint: str, settings: CallSettings) -> ProviderClient:
        return clients.client(provider, endpoint, timeout=settings.timeout)

    def ready(profile: AgentProfile) -> None:
        mark_ready()  # the Pod's probes: joined the crew
        shown = describe(profile)
        reason = shown["unschedulable"].get("mulling")
        mulling = ", ".join(shown["mulling"]) or (
            f"unschedulable ({reason})" if reason else "not bound yet")
        tools = ", ".join(shown["tools"]) or "none"
        err_console.print(
            f"{READY_LINE}: {shown['agent']} ({shown['role']}) in crew {identity.crew} on "
            f"NATS at {mask_servers(nats.servers)}; mulling {mulling}; tools {tools}",
            highlight=False, markup=False, soft_wrap=True)
        changed(profile)

    def changed(profile: AgentProfile) -> None:
        static = describe(profile)["static"]
        shown = "; ".join(f"{phase} {target}" for phase, target in static.items())
        err_console.print(f"{STATIC_LINE}: {shown or 'none'}", highlight=False,
                          markup=False, soft_wrap=True)

    calllog = await CallLogWriter.open(kv)
    grace = tunables.process.shutdown_grace_seconds

    async def flush() -> None:
        # the last calls' entries, before the store closes under them
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(calllog.flush(), grace)

    process.on_stop(Stage.RUNTIME, flush, name="call log")
    await serve_agent(kv, NatsBus(kv), identity, env=dict(os.environ), settings=tunables,
                      make_client=make_client, chat_factory=chat_client, clock=clock,
                      ready=ready, toolbox=demo_toolbox(), on_record=[calllog.record],
                      changed=changed)
