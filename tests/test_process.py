"""The process lifecycle stops what a process started in the one safe order.

Run on the simulator's virtual-time loop, so the stragglers' grace is counted without
waiting for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kubemoot.clock import LoopClock
from kubemoot.process import Lifecycle, Stage
from kubemoot.sim.vloop import run_virtual


def test_shutdown_runs_tasks_runtime_stragglers_clients_emulators_store_in_order() -> None:
    order: list[str] = []

    async def main() -> tuple[list[str], list[str], float]:
        loop = asyncio.get_running_loop()
        clock = LoopClock(epoch=0.0, anchor=0.0)
        process = Lifecycle(straggler_grace=2.0)
        open_ = {"store": True}

        def stop(name: str) -> Callable[[], Awaitable[None]]:
            async def stopping() -> None:
                order.append(name)
            return stopping

        # registered in the order a process starts them, not in the order they stop
        process.on_stop(Stage.STORE, stop("store"), name="store")
        process.stop_in_thread(Stage.EMULATORS, lambda: order.append("emulator"),
                               name="emulator")
        process.on_stop(Stage.CLIENTS, stop("client a"), name="client a")
        process.on_stop(Stage.CLIENTS, stop("client b"), name="client b")
        process.on_stop(Stage.RUNTIME, stop("runtime stack"), name="runtime stack")

        async def broken() -> None:
            raise RuntimeError("this page would not stop")

        process.on_stop(Stage.RUNTIME, broken, name="dashboard")

        async def work() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                # a call gives its ticket back while the store is still open
                order.append("work cancelled" if open_["store"] else "work too late")

        process.add_task(asyncio.create_task(work()))
        # what the runtime left running on its own: kubemoot code (the clock's sleep)
        finishing = asyncio.create_task(clock.sleep(1.0))
        endless = asyncio.create_task(clock.sleep(3600.0))
        await asyncio.sleep(0)
        began = loop.time()
        await process.shutdown()
        await process.shutdown()  # a second call does nothing
        assert finishing.done() and not finishing.cancelled()
        assert endless.cancelled()
        return order, process.stopped, loop.time() - began

    seen, stopped, took = run_virtual(main())
    assert seen == ["work cancelled", "runtime stack", "client b", "client a", "emulator",
                    "store"]
    # the page that failed to stop is logged and passed; the rest still stop
    assert stopped == ["tasks", "dashboard", "runtime stack", "stragglers", "client b",
                       "client a", "emulator", "store"]
    assert took == 2.0  # the stragglers' grace, then the endless one was cancelled


def test_tasks_are_not_stopped_but_cancelled() -> None:
    async def main() -> None:
        process = Lifecycle(straggler_grace=0.0)

        async def nothing() -> None:
            return None

        with pytest.raises(ValueError, match="add_task"):
            process.on_stop(Stage.TASKS, nothing)

    run_virtual(main())


def test_a_demo_that_fails_while_starting_stops_the_emulators_that_came_up() -> None:
    """The store cannot be opened after the emulators started: the run fails with the
    store's error, and no emulator is left serving."""
    import threading

    from kubemoot.clock import Clock
    from kubemoot.demo import default_bundle, run_demo
    from kubemoot.settings import Settings
    from kubemoot.store.protocol import KV, StoreUnavailable

    opened: list[list[str]] = []

    async def no_store(clock: Clock) -> KV:
        opened.append(sorted(t.name for t in threading.enumerate()
                             if t.name.startswith("ollama-emulator-")))
        raise StoreUnavailable("no store here")

    class Silent:
        async def follow(self, *args: object) -> None: ...
        def store_health_changed(self, *args: object) -> None: ...
        def dashboard_started(self, url: str) -> None: ...
        def dashboard_lingers(self, url: str, seconds: float | None) -> None: ...

    with default_bundle() as bundle, pytest.raises(StoreUnavailable, match="no store"):
        asyncio.run(run_demo(bundle, open_store=no_store, store="memory", discussions=1,
                             seed=1, time_scale=0.01, dashboard=None, view=Silent(),
                             tunables=Settings()))
    assert len(opened) == 1 and len(opened[0]) == 2  # the homelab's two cards were up
    assert not [t for t in threading.enumerate() if t.name in opened[0] and t.is_alive()]


def test_an_operator_that_fails_while_starting_still_closes_its_store() -> None:
    """The operator stops through the lifecycle too: a store that opened and then failed
    (its buckets cannot be made) is closed before the error reaches the user."""
    import kopf

    from kubemoot.clock import Clock
    from kubemoot.operator.run import OperatorOptions, run_operator
    from kubemoot.store.memory import MemoryBucket, MemoryKV
    from kubemoot.store.protocol import KV, StoreUnavailable

    closed: list[str] = []

    class NoBuckets(MemoryKV):
        async def bucket(self, name: str, *, max_age: float | None = None) -> MemoryBucket:
            raise StoreUnavailable(f"no bucket {name} here")

        async def close(self) -> None:
            closed.append("store")
            await super().close()

    async def login() -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server="https://127.0.0.1:1")

    async def open_kv(clock: Clock) -> KV:
        return NoBuckets(clock)

    with pytest.raises(StoreUnavailable, match="no bucket"):
        asyncio.run(run_operator(OperatorOptions(straggler_grace_seconds=0.5), login=login,
                                 open_kv=open_kv))
    assert closed == ["store"]
