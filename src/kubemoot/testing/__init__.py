"""kubemoot.testing: what tests across the project build on.

``builders`` (custom resources), ``state`` (provider states and tickets),
``emulators`` (the Ollama-API emulator as a real server), ``nats_server`` (a real
nats-server). Virtual time is :class:`kubemoot.clock.ManualClock`.
"""
