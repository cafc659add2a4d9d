"""``kubemoot emulate-ollama`` — run the Ollama-API emulator in the foreground.

The emulator is not Ollama and runs no model: it answers Ollama's HTTP API over an
emulated GPU (VRAM, load time, parallel slots, prompt truncation) with deterministic
text, so the scheduler can be watched and tested without a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from kubemoot.api.errors import InputError
from kubemoot.cli._common import app, check_host, err_console, listen_error
from kubemoot.settings import DEFAULTS, Settings

if TYPE_CHECKING:
    from kubemoot.emulation.server import OllamaEmulator


@app.command("emulate-ollama")
def emulate_command(
    port: int = typer.Option(
        11434, "--port", metavar="PORT", min=0, max=65535, help="TCP port (0: any)."),
    host: str = typer.Option(
        "127.0.0.1", "--host", metavar="ADDRESS", help="Address to listen on."),
    vram_mib: int = typer.Option(
        24576, "--vram-mib", metavar="MIB", min=1, help="Emulated GPU memory."),
    reserve_mib: int = typer.Option(
        DEFAULTS.reserve_mib, "--reserve-mib", metavar="MIB", min=0,
        help="Memory the card keeps back; it offers --vram-mib less this."),
    num_parallel: int = typer.Option(
        1, "--num-parallel", metavar="N", min=1, help="Parallel slots per loaded model."),
    context_length: int = typer.Option(
        4096, "--context-length", metavar="TOKENS", min=1,
        help="Default per-slot context (tokens)."),
    load_rate_mibps: float = typer.Option(
        DEFAULTS.load_rate_mibps, "--load-rate-mibps", metavar="MIB/S", min=0.001,
        help="Model load speed in MiB/s."),
    time_scale: float = typer.Option(
        1.0, "--time-scale", metavar="SCALE", min=0.0,
        help="Real seconds per emulated second."),
    models: list[str] = typer.Option(
        [], "--model", metavar="NAME=MiB",
        help="A model in the catalogue (repeatable); default: qwen3 8b/14b/32b.",
    ),
) -> None:
    """Run an Ollama-API EMULATOR (not Ollama): emulated VRAM, slots, deterministic replies."""
    from kubemoot.cli._shutdown import run_until_stopped
    from kubemoot.emulation.server import (
        DEFAULT_MODELS,
        EMULATOR_VERSION,
        EmulatorConfig,
        OllamaEmulator,
        catalogue,
        parse_model_option,
    )

    tunables = Settings.from_env()
    check_host(host)
    if reserve_mib >= vram_mib:
        raise InputError(f"--reserve-mib {reserve_mib} must be less than --vram-mib {vram_mib}")
    parsed = [parse_model_option(_checked_model_option(text)) for text in models]
    config = EmulatorConfig(
        models=catalogue(parsed) if parsed else DEFAULT_MODELS,
        vram_mib=vram_mib, reserve_mib=reserve_mib, num_parallel=num_parallel,
        context_length=context_length,
        load_rate_mibps=load_rate_mibps, time_scale=time_scale,
    )
    emulator = OllamaEmulator(config, host=host, port=port, log_level="warning")
    try:
        emulator.bind()  # fail early, with a clear message, if the port is taken
    except OSError as error:
        raise listen_error(host, port, error) from None
    names = ", ".join(f"{m.name} ({m.size_mib} MiB)" for m in config.models)
    announcement = (
        f"Ollama-API emulator {EMULATOR_VERSION} (not Ollama) on {emulator.url}: "
        f"{vram_mib} MiB VRAM ({reserve_mib} MiB reserved), {num_parallel} slot(s), "
        f"context {context_length}, "
        f"models: {names}. Ctrl-C or SIGTERM stops it."
    )
    run_until_stopped(_serve(emulator, announcement),
                      grace_seconds=tunables.process.shutdown_grace_seconds)


async def _serve(emulator: OllamaEmulator, announcement: str) -> None:
    """Serve until cancelled (a signal), then stop the server and wait for it.

    The server runs in its own thread, so uvicorn leaves the process's signals to
    :func:`run_until_stopped` instead of taking them over. The announcement comes once
    it serves, when a signal is already answered by a clean stop.
    """
    import asyncio

    await asyncio.to_thread(emulator.start)
    err_console.print(announcement, highlight=False)
    try:
        await asyncio.Event().wait()
    finally:
        await asyncio.to_thread(emulator.stop)


_MODEL_EXAMPLE = "e.g. qwen3:8b=6144"


def _checked_model_option(text: str) -> str:
    """``--model NAME=MiB`` checked here, so each mistake is told in the flag's words."""
    name, sep, size = text.rpartition("=")
    if not sep or not name.strip():
        raise InputError(f"--model {text}: expected NAME=MiB, {_MODEL_EXAMPLE}")
    digits = size.strip().removeprefix("-")
    if not digits.isdecimal():  # isdecimal, not isdigit: int() refuses "²"
        raise InputError(f"--model {text}: size must be whole MiB, {_MODEL_EXAMPLE}")
    if int(size) <= 0:
        raise InputError(f"--model {text}: size must be positive, {_MODEL_EXAMPLE}")
    return text


