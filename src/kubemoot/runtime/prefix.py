"""What the engines' prompt caches still hold, as far as the runtime's own records say.

An Ollama runner keeps, per slot, the last prompt it evaluated there, and a new request
on that slot evaluates only what follows the part it shares with it. A crew's thread
re-sends its whole history on every call, so a call that lands on the copy that served
its thread's previous call skips most of its prefill. The runtime never sees the slots;
it knows which copy it sent each of its calls to. :class:`PrefixBook` replays those
calls against the engine's rule — a slot keeps its last prompt; a call of a thread a
slot holds goes there, any other call overwrites the slot unused longest — and credits
a copy only with a thread its replay still finds in a slot. A copy that is not resident
now holds nothing.

Pure bookkeeping; the planner turns it into seconds (:meth:`PrefixBook.seconds`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kubemoot.runtime.snapshot import FleetSnapshot

__all__ = ["PrefixBook", "ThreadPrompt"]


@dataclass(frozen=True, slots=True)
class ThreadPrompt:
    """A call's prompt as the cache sees it: its thread and its length in tokens."""

    thread: str
    tokens: int


@dataclass(slots=True)
class _Slot:
    thread: str
    tokens: int
    used_at: float


class PrefixBook:
    """Per copy ``(provider, model)``, what each slot last held (see the module docstring)."""

    def __init__(self, prefill_seconds_per_token: float) -> None:
        self.rate = prefill_seconds_per_token
        self._slots: dict[tuple[str, str], list[_Slot]] = {}
        self._expected: dict[str, ThreadPrompt] = {}  # holder id → the call's prompt

    def expect(self, holder_id: str, prompt: ThreadPrompt) -> None:
        """The call ``holder_id`` is about to be placed with ``prompt``."""
        self._expected[holder_id] = prompt

    def forget(self, holder_id: str) -> None:
        self._expected.pop(holder_id, None)

    def served(self, provider: str, model: str, slots: int, prompt: ThreadPrompt,
               at: float) -> None:
        """A call of ``prompt`` went to the copy: replay the engine's choice of slot."""
        held = self._slots.setdefault((provider, model), [])
        mine = next((s for s in held if s.thread == prompt.thread), None)
        if mine is None and len(held) < max(1, slots):
            held.append(_Slot(prompt.thread, prompt.tokens, at))
            return
        if mine is None:
            mine = min(held, key=lambda s: s.used_at)
            mine.thread = prompt.thread
        mine.tokens, mine.used_at = prompt.tokens, at

    def cached(self, provider: str, model: str, thread: str) -> int:
        """Tokens of ``thread`` a slot of the copy holds by the replay (0: none)."""
        return max((s.tokens for s in self._slots.get((provider, model), ())
                    if s.thread == thread), default=0)

    def seconds(self, holder_id: str, fleet: FleetSnapshot) -> dict[tuple[str, str], float]:
        """Expected prefill per copy for the call ``holder_id``, and ``("", "")``: the
        prefill anywhere else (the whole prompt). Empty when the call has no thread."""
        prompt = self._expected.get(holder_id)
        if prompt is None:
            return {}
        out = {("", ""): prompt.tokens * self.rate}
        for (provider, model), _slots in list(self._slots.items()):
            p = fleet.provider(provider)
            if p is None or not p.is_resident(model):
                if p is not None and not p.has_copy(model):
                    del self._slots[(provider, model)]  # unloaded: its cache went with it
                continue
            cached = min(self.cached(provider, model, prompt.thread), prompt.tokens)
            if cached:
                out[(provider, model)] = (prompt.tokens - cached) * self.rate
        return out
