"""The demand board's copy of its bucket, kept current by a watch.

A board that follows its bucket does not list and read it on every placement round
(fleet-16: about 1,200 reads of some fifty keys each); it keeps the entries here, with
the waiters and intents already counted per model, and catches up with the watch's
pending changes only when it is read. The board still reads the whole bucket now and
then (:data:`FULL_READ_SECONDS`): a watch does not announce entries the store lets
expire, and a NATS watch that was re-established does not replay what it missed.

A read answers what the board's plain read answers (the same figures, in the same loop
turns): that read lists the keys at once and fetches their values a loop turn later;
here the listing is the copy as it stands when the read begins, and the values are
taken after catching up on that same later turn, leaving out keys created in between.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubemoot.store.documents import DemandEntry, SelectionEntry
from kubemoot.store.protocol import ChangesLost, Entry, Watch

__all__ = ["FULL_READ_SECONDS", "INTENT", "SELECTION", "SELECTION_PREFIX", "USE", "WAIT",
           "DemandMirror", "Folded"]

WAIT = "wait"
INTENT = "intent"
USE = "use"
SELECTION = "sel"
SELECTION_PREFIX = SELECTION + "."

#: How often a following board reads its whole bucket again (virtual or real seconds).
FULL_READ_SECONDS = 300.0

#: One entry as the board folds it: revision, kind, decoded key segments, document.
Folded = tuple[int, str, tuple[str, ...], DemandEntry | SelectionEntry]
#: Works out (kind, segments, document) of an entry; raises ValueError when unreadable.
Fold = Callable[[str, int, bytes], tuple[str, tuple[str, ...], DemandEntry | SelectionEntry]]


@dataclass(slots=True)
class _Record:
    revision: int
    folded: Folded | None  # None: the key or value is unreadable (``error`` says why)
    error: ValueError | None = None
    #: the model this entry is counted for among the waiters or intents, if it is
    tallied: str | None = None
    #: the document's fields the board's read folds at every new instant, copied out on
    #: the first such read (a record is made anew when its entry changes): each read of
    #: a pydantic document's attribute goes through the slot hook its __getattr__ puts
    #: on the class (about 280 instructions more than a tuple's item)
    figures: tuple[Any, ...] | None = None


class DemandMirror:
    """The entries of one demand bucket, as of the last catch-up with its watch."""

    def __init__(self, watch: Watch, fold: Fold, forget: Callable[[str], None]) -> None:
        self.watch = watch
        self._fold = fold
        self._forget = forget  # the board's caches drop a key that is gone
        self.records: dict[str, _Record] = {}
        self.selections: set[str] = set()  # keys under SELECTION_PREFIX
        self.uses: set[str] = set()  # ``use.<model>`` keys holding a readable entry
        self.unreadable: set[str] = set()
        #: live waiter and intent entries per model, counting each entry not yet seen
        #: expired; valid while the clock is before ``tally_expiry``
        self.tally: dict[str, dict[str, int]] = {WAIT: {}, INTENT: {}}
        self.tally_expiry = float("inf")
        self.seeded_at: float | None = None
        self.ended = False
        #: how many times an entry was set or removed: a read that finds the same count
        #: as an earlier one at the same instant would count the same figures
        self.changes = 0
        #: how many times a forecast (``sel.``) entry was set or removed: a forecast
        #: worked out when the count was the same counted the same entries
        self.selection_changes = 0

    # -- keeping up ------------------------------------------------------------------

    def seed(self, entries: Iterable[Entry], now: float) -> None:
        """Start again from a full read (keys listed, then their values)."""
        entries = list(entries)
        # a key kept keeps the board's caches (the forecast's own writes rely on them)
        self.prune(entry.key for entry in entries)
        records = self.records
        for entry in entries:
            record = records.get(entry.key)
            if record is not None and record.revision == entry.revision:
                # Held already, from the watch: folding the same revision again would
                # count the same (fleet-16: most of a full read's hundred entries).
                continue
            self._set(entry.key, entry.revision, entry.value)
        self.seeded_at = now

    def prune(self, keys: Iterable[str]) -> None:
        """Drop the keys a listing no longer shows (the store let them expire)."""
        for key in self.records.keys() - set(keys):
            self._remove(key)

    def catch_up(self) -> set[str]:
        """Apply the watch's pending changes; returns the keys they created.

        A change no newer than what the copy holds is skipped: after a full read the
        watch still delivers the changes that read already saw. Changes of one key
        arrive in revision order, so a key the read found absent ends absent again
        after its stale creation and deletion are replayed.
        """
        try:
            changes = self.watch.drain()
        except ChangesLost:
            # nobody read the board for long (an idle process): read it whole next time
            # (the changes after the loss are pending still)
            self.seeded_at = None
            return set()
        if changes is None:
            self.ended = True
            return set()
        created: set[str] = set()
        deleted: set[str] = set()
        records = self.records
        for change in changes:
            key = change.key
            record = records.get(key)
            if record is not None and record.revision >= change.revision:
                continue
            if change.value is None:
                if record is not None:
                    self._remove(key)
                    deleted.add(key)
            else:
                if record is None and key not in deleted:
                    created.add(key)
                self._set(key, change.revision, change.value)
        return created

    async def turns(self) -> set[str]:
        """Catch up on the next loop turn and resume on the one after, as the store's
        ``get_many`` answers; returns the keys created after the read began."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[set[str]] = loop.create_future()

        def read() -> None:
            created = self.catch_up()
            loop.call_soon(_answer, answer, created)

        loop.call_soon(read)
        return await answer

    def _set(self, key: str, revision: int, value: bytes) -> None:
        # Every change of the bucket passes here (fleet-16: about 4,000 a run): the sets
        # are tested before they are changed, and nothing is untallied that was not
        # counted, which spares a call each.
        self.changes += 1
        records, uses = self.records, self.uses
        if key in records:
            old = records[key]
            if old.tallied is not None:
                self._untally(old)
        try:
            kind, segments, parsed = self._fold(key, revision, value)
        except ValueError as error:
            records[key] = _Record(revision, None, error)
            self.unreadable.add(key)
            uses.discard(key)
        else:
            record = _Record(revision, (revision, kind, segments, parsed))
            records[key] = record
            if key in self.unreadable:
                self.unreadable.remove(key)
            if kind == USE and len(segments) == 1 and isinstance(parsed, DemandEntry):
                uses.add(key)
            elif key in uses:
                uses.remove(key)
            if (kind in (WAIT, INTENT) and len(segments) == 2
                    and isinstance(parsed, DemandEntry)):
                self._count(record, kind, segments[0], parsed.expires_at)
        if key.startswith(SELECTION_PREFIX):
            self.selections.add(key)
            self.selection_changes += 1

    def _count(self, record: _Record, kind: str, model: str, expires_at: float) -> None:
        tally = self.tally[kind]
        tally[model] = tally.get(model, 0) + 1
        record.tallied = model
        if expires_at < self.tally_expiry:
            self.tally_expiry = expires_at

    def _untally(self, record: _Record) -> None:
        model = record.tallied
        if model is None or record.folded is None:
            return
        tally = self.tally[record.folded[1]]
        left = tally[model] - 1
        if left:
            tally[model] = left
        else:
            del tally[model]
        record.tallied = None

    def _remove(self, key: str) -> None:
        self.changes += 1
        record = self.records.pop(key)
        self._untally(record)
        if key in self.selections:
            self.selections.discard(key)
            self.selection_changes += 1
        self.uses.discard(key)
        self.unreadable.discard(key)
        self._forget(key)

    # -- reading ---------------------------------------------------------------------

    @property
    def wants_read(self) -> bool:
        """Whether the plain read would fetch anything besides the forecast's keys."""
        return len(self.records) > len(self.selections)

    def tallies(self, now: float) -> tuple[dict[str, int], dict[str, int]]:
        """Waiters and intents per model whose entries are live at ``now``."""
        if now >= self.tally_expiry:
            # An entry has expired since it was counted: it stops counting for good
            # (an expired value never comes back; a new one is a new revision).
            expiry = float("inf")
            for record in self.records.values():
                if record.tallied is None or record.folded is None:
                    continue
                parsed = record.folded[3]
                if parsed.expires_at <= now:
                    self._untally(record)
                elif parsed.expires_at < expiry:
                    expiry = parsed.expires_at
            self.tally_expiry = expiry
        return dict(self.tally[WAIT]), dict(self.tally[INTENT])


def _answer(future: asyncio.Future[set[str]], created: set[str]) -> None:
    if not future.done():  # the reader may have been cancelled meanwhile
        future.set_result(created)
