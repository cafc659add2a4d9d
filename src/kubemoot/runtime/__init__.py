"""kubemoot.runtime — the per-call placement runtime.

Decides, at the moment an inference call is needed and against fresh shared state,
which (model, provider) serves it: hard filters, one cost in expected seconds, a VRAM
ticket claimed by compare-and-set, queue-or-unload, eviction of idle models, a
state-driven wait and honest refusals. See ``docs/runtime.md``.

Entry points: :func:`kubemoot.runtime.builder.build_runtime` (the one assembly),
:class:`kubemoot.runtime.planner.CallPlanner` (``place``, ``take_queue``, ``lease``,
``finish``), :class:`kubemoot.runtime.waiting.CapacityWaiter`,
:class:`kubemoot.runtime.held_plans.HeldPlans`,
:class:`kubemoot.runtime.placement.CallPlacement`.

One placement: :mod:`~kubemoot.runtime.options` prices a round's options (pure, over a
:class:`~kubemoot.runtime.snapshot.FleetSnapshot` and the demand, with the formulas of
:mod:`~kubemoot.runtime.cost`), :mod:`~kubemoot.runtime.claims` claims the one picked
(ticket compare-and-set through :mod:`~kubemoot.runtime.tickets`, then any unloads),
and the planner composes the two in DESIGN §5's order. Time comes from an injected
clock; no network library is imported here.
"""
