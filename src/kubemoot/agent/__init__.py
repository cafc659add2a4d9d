"""The agent side of every inference call.

* :mod:`~kubemoot.agent.pool` — chat clients keyed by endpoint, model and call settings.
* :mod:`~kubemoot.agent.toolloop` — the tool loop, its context guard and failure caps.
* :mod:`~kubemoot.agent.signals` — consensus signals with per-call attribution.
* :mod:`~kubemoot.agent.runtime` — one call's tool loop and static fallback, over
  the runtime's call service (:mod:`~kubemoot.runtime.calls`).
* :mod:`~kubemoot.agent.discussion` — a minimal coordinator and its crew.
* :mod:`~kubemoot.agent.answers` — the crew's answer when no GPU could be had.
* :mod:`~kubemoot.agent.wiring` — the runtime assembled over one store.

This package sees the store and providers only through their protocols; adapters
(Ollama, the emulator, NATS) are chosen by whoever wires it (the CLI's ``demo``).
"""
