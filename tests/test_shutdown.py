"""``run_until_stopped``: SIGTERM and SIGINT end a command cleanly, and within a bound."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

KUBEMOOT = str(Path(sys.executable).with_name("kubemoot"))

# A program whose main coroutine prints "ready", then waits; on cancellation it runs its
# cleanup ("stopping", "cleaned up"), or, with "stubborn", never finishes it. The grace
# is its second argument: a minute where the test must not meet it (however slowly a
# loaded machine runs the cleanup or delivers a second signal), a second where the cut
# is the point (a stubborn cleanup never ends, so nothing races the cut).
PROGRAM = textwrap.dedent("""
    import asyncio, sys
    from kubemoot.cli._shutdown import Stopped, run_until_stopped

    async def main(stubborn):
        print("ready", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            print("stopping", flush=True)
            if stubborn:
                await asyncio.shield(asyncio.Event().wait())
            print("cleaned up", flush=True)

    try:
        run_until_stopped(main(sys.argv[1] == "stubborn"), grace_seconds=float(sys.argv[2]))
    except Stopped as stopped:
        print(stopped.describe(), flush=True)
        sys.exit(stopped.exit_code)
""")


def _start(mode: str, grace: float = 60.0) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", PROGRAM, mode, str(grace)], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline() == "ready\n"
    return process


@pytest.mark.parametrize(
    ("signum", "word"), [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")]
)
def test_a_signal_runs_the_cleanup_then_exits_with_its_status(signum: int, word: str) -> None:
    process = _start("polite")
    process.send_signal(signum)
    out, err = process.communicate(timeout=30)
    assert out.splitlines() == ["stopping", "cleaned up", word], err
    assert process.returncode == 128 + signum


def test_a_shutdown_that_hangs_is_cut_off_after_the_grace() -> None:
    process = _start("stubborn", grace=1.0)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=30)
    assert "cleaned up" not in out
    assert "shutdown took over 1 s; exiting now" in err
    assert process.returncode == 128 + signal.SIGTERM


def test_a_second_signal_ends_a_slow_shutdown_at_once() -> None:
    process = _start("stubborn")
    process.send_signal(signal.SIGINT)
    assert process.stdout is not None
    assert process.stdout.readline() == "stopping\n"  # the first one was taken
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGINT
    assert "a second signal; exiting now" in err


def test_sigterm_stops_the_emulator_cleanly() -> None:
    process = subprocess.Popen([KUBEMOOT, "emulate-ollama", "--port", "0"], text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stderr is not None
    assert "not Ollama" in process.stderr.readline()
    process.send_signal(signal.SIGTERM)
    _out, err = process.communicate(timeout=30)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines() == ["terminated"]
