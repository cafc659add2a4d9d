"""kubemoot.runtime — the per-call placement runtime.

Decides, at the moment an inference call is needed and against fresh shared state,
which (model, provider) serves it: hard filters, one cost in expected seconds, a VRAM
ticket claimed by compare-and-set, queue-or-unload, eviction of idle models, a
state-driven wait and honest refusals. See ``docs/runtime.md``.

Entry points: :class:`kubemoot.runtime.planner.CallPlanner` (``place``, ``finish``),
:class:`kubemoot.runtime.waiting.CapacityWaiter`,
:class:`kubemoot.runtime.selection.SelectionPlanner`,
:class:`kubemoot.runtime.placement.Placement`. Time comes from an injected clock; no
network library is imported here.
"""
