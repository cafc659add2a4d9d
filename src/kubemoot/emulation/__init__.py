"""The Ollama emulation: one model of an Ollama engine, and an HTTP server around it.

* :mod:`~kubemoot.emulation.engine` — the engine model of one card (memory less a
  reserve, one line, loads one at a time, unloads that take time, slots, keep-alive, a
  footprint that grows with the context, reload on a new context, the silent cut of an
  over-long prompt, prefill with a per-slot prompt-prefix cache), driven by an injected
  clock. The simulator's GPUs (:mod:`kubemoot.sim.gpu`) run it in virtual time.
* :mod:`~kubemoot.emulation.card` — the emulator's side of that engine: catalogue,
  tokenizer, deterministic replies, the books a test reads.
* :mod:`~kubemoot.emulation.calls` — one call, whichever API it came in by.
* :mod:`~kubemoot.emulation.server` — the HTTP server and its one route table over
  :mod:`~kubemoot.emulation.ollama_routes` and :mod:`~kubemoot.emulation.openai_routes`.
* :mod:`~kubemoot.emulation.faults` — injected failures and hostile answers.

Rules (import-linter states them): the package imports nothing of the runtime but its
settings (the engine's physical defaults are the runtime's assumptions), and
``providers`` imports nothing from here: the emulator is something a provider client
talks to over HTTP, not a part of the client. This ``__init__`` imports no submodule,
so the simulator can take the engine without the HTTP stack.
"""
