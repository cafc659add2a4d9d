"""The demand view: how much each model is wanted soon, shared by every agent.

Entries live in ``kubemoot_model_demand``, one key per model and agent, so writers
never race for a key and need no compare-and-set:

* ``wait.<model>.<agent>`` — the agent is waiting for GPU capacity for the model;
* ``intent.<model>.<agent>`` — the agent was selected and plans to call the model;
* ``use.<model>`` — recent calls: a count that decays with time constant
  ``use_window_seconds`` (read-modify-write without CAS; a lost increment only makes
  the estimate a little low, which is acceptable for a heuristic);
* ``sel.<agent>`` — the agent's candidate models and how often it is selected; a
  model's *prediction* is the sum of the frequencies of the agents that name it.

Every value carries ``expiresAt`` and readers ignore expired ones, so a crashed agent's
entries fade without cleanup. Demand only orders victims and weighs their reload cost;
it never causes a load.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar, overload

from kubemoot.clock import Clock
from kubemoot.runtime import faults
from kubemoot.runtime.demand_follow import (
    FULL_READ_SECONDS,
    INTENT,
    SELECTION,
    USE,
    WAIT,
    DemandMirror,
)
from kubemoot.runtime.demand_follow import SELECTION_PREFIX as _SELECTION_PREFIX
from kubemoot.runtime.snapshot import DemandSnapshot, ModelDemand
from kubemoot.settings import DEFAULTS, RuntimeSettings
from kubemoot.store.documents import DemandEntry, SelectionEntry
from kubemoot.store.keys import decode_token, join_key
from kubemoot.store.protocol import Bucket, StoreError

__all__ = ["FULL_READ_SECONDS", "DemandBoard"]

_T = TypeVar("_T")

#: How long the forecast read from the board stands before it is read again. The
#: forecast is a share of the threads of the last hour, so it moves slowly, while the
#: board holds one entry per agent selected in that hour: reading them all on every
#: placement round made the read grow with the fleet's agents (fleet-16: about 130
#: entries a read, most of them forecast).
FORECAST_REFRESH_SECONDS = 30.0


def _decayed(count: float, since: float | None, now: float, window: float) -> float:
    if since is None or window <= 0:
        return count
    return count * math.exp(-max(0.0, now - since) / window)


class DemandBoard:
    """Reads and writes the demand bucket for one process."""

    def __init__(
        self, bucket: Bucket, *, clock: Clock, settings: RuntimeSettings = DEFAULTS
    ) -> None:
        self._bucket = bucket
        self._clock = clock
        # How long each kind of entry lives, and how fast recent use decays.
        self.wait_ttl_seconds = settings.demand_wait_ttl_seconds
        self.intent_ttl_seconds = settings.demand_intent_ttl_seconds
        self.use_window_seconds = settings.demand_use_window_seconds
        self.selection_ttl_seconds = settings.selection_window_seconds
        #: Each entry parsed once per revision: the board is read for every placement
        #: round in the demand window, and most entries have not changed since.
        self._parsed: dict[str, tuple[int, DemandEntry | SelectionEntry]] = {}
        #: each model's use key, encoded once: every call's record_use names one
        self._use_keys: dict[str, str] = {}
        self._shapes: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._folded: dict[
            str, tuple[int, str, tuple[str, ...], DemandEntry | SelectionEntry]] = {}
        #: when the forecast was last read, and the prediction it gave
        self._forecast: tuple[float, dict[str, float], float] | None = None
        #: The last listing and its keys other than the forecast's: the listing is often the
        #: same from one round to the next (fleet-16: two reads in five), and then neither the
        #: filtering nor the pruning of the caches below needs doing again. A writer
        #: that caches a key outside it forgets it, so that a key written and deleted
        #: between two reads is still pruned.
        self._listing: tuple[list[str], list[str], set[str]] | None = None
        #: the bucket's copy kept by a watch, while the board follows (:meth:`follow`)
        self._mirror: DemandMirror | None = None
        #: The last snapshot of the followed copy: when it was made, the copy's change
        #: count and the forecast it used. Rounds often read the board again at the same
        #: instant with nothing changed (fleet-16: 548 of 1,199 reads), and every figure
        #: is then the same, recent use's decay included.
        self._last: tuple[float, int, object, DemandSnapshot] | None = None
        #: The forecast the followed copy last worked out: the copy, its count of
        #: forecast changes then, the prediction and when its first counted entry expires.
        self._worked_forecast: tuple[DemandMirror, int, dict[str, float], float] | None = None
        #: the prediction this board's own selection last left, every figure in it above
        #: the rounding residue (see record_selection)
        self._clean: dict[str, float] | None = None
        #: each agent's forecast key, encoded once
        self._selection_keys: dict[str, str] = {}

    # -- following -------------------------------------------------------------------

    async def follow(self) -> bool:
        """Keep a copy of the bucket from a watch instead of reading it on every
        :meth:`snapshot`; False when the store cannot watch (the board reads then)."""
        if self._mirror is not None:
            return True
        try:
            watch = self._bucket.watch()
            await watch.ready()
        except StoreError as error:
            faults.noted("demand-watch", faults.STORE,
                         "demand board cannot watch; it reads instead", error)
            return False
        self._mirror = DemandMirror(watch, self._fold_entry, self._forget)
        return True

    async def close(self) -> None:
        """Stop following (the board keeps working by reading)."""
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            await mirror.watch.aclose()

    def _fold_entry(
        self, key: str, revision: int, value: bytes
    ) -> tuple[str, tuple[str, ...], DemandEntry | SelectionEntry]:
        # The followed copy folds every change (its own writes, met again on the watch,
        # most of them): a key's shape and a revision's parse, when known, are taken
        # here without the calls of _shape and _parse.
        shapes, parsed = self._shapes, self._parsed
        kind, segments = shapes[key] if key in shapes else self._shape(key)
        if key in parsed:
            known = parsed[key]
            if known[0] == revision:
                return kind, segments, known[1]
        selecting = kind == SELECTION and len(segments) == 1
        return kind, segments, self._parse(key, revision, value, selecting=selecting)

    def _forget(self, key: str) -> None:
        for cache in (self._parsed, self._shapes, self._folded):
            cache.pop(key, None)  # type: ignore[attr-defined]

    # -- writers ---------------------------------------------------------------------

    async def _mark(self, kind: str, model: str, agent: str, ttl: float) -> None:
        entry = DemandEntry(expires_at=self._clock.now() + ttl)
        key = join_key(kind, model, agent)
        # What this process wrote needs no parsing when it reads it back (a following
        # board meets every one of its own writes again on its watch).
        self._parsed[key] = (await self._bucket.put(key, entry.to_json()), entry)
        self._cached(key)

    async def add_waiter(self, model: str, agent: str) -> None:
        """The agent waits for capacity for ``model`` (re-add to keep it alive)."""
        await self._mark(WAIT, model, agent, self.wait_ttl_seconds)

    async def remove_waiter(self, model: str, agent: str) -> None:
        await self._bucket.delete(join_key(WAIT, model, agent))

    async def add_intent(self, model: str, agent: str) -> None:
        """The agent, selected for a thread, plans to call ``model``."""
        await self._mark(INTENT, model, agent, self.intent_ttl_seconds)

    async def remove_intent(self, model: str, agent: str) -> None:
        await self._bucket.delete(join_key(INTENT, model, agent))

    async def record_use(self, model: str) -> None:
        """Count one call of ``model`` into its decaying recent-use figure."""
        key = self._use_keys.get(model)
        if key is None:
            key = self._use_keys[model] = join_key(USE, model)
        now = self._clock.now()
        current = await self._bucket.get(key)
        count = 0.0
        if current is not None:
            # parsed once per revision, like the snapshot's reads: most calls of a model
            # find the entry the snapshot (or this process's last call) already parsed
            previous = self._parse(key, current.revision, current.value, selecting=False)
            assert isinstance(previous, DemandEntry)
            if previous.expires_at > now:
                count = _decayed(
                    previous.count, previous.last_used_at, now, self.use_window_seconds
                )
        # Kept until the count has decayed below about 1 % of a single call.
        entry = DemandEntry(
            expires_at=now + 5 * self.use_window_seconds, count=count + 1.0, last_used_at=now
        )
        # What this process wrote needs no parsing when it reads it back.
        self._parsed[key] = (await self._bucket.put(key, entry.to_json()), entry)
        self._cached(key)

    async def record_selection(
        self, agent: str, models: Sequence[str], frequency: float
    ) -> None:
        """The agent's candidate models and how often it is selected (its forecast)."""
        now = self._clock.now()
        entry = SelectionEntry(
            expires_at=now + self.selection_ttl_seconds,
            models=list(dict.fromkeys(models)),
            frequency=frequency,
        )
        key = self._selection_keys.get(agent)
        if key is None:
            key = self._selection_keys[agent] = join_key(SELECTION, agent)
        revision = await self._bucket.put(key, entry.to_json())
        self._parsed[key] = (revision, entry)
        # This process's own writes show in the forecast it holds at once: the entry
        # it replaces comes out of the prediction, the new one goes in.
        forecast = self._forecast
        if forecast is not None:
            prediction = dict(forecast[1])
            folded = self._folded
            replaced = folded[key][3] if key in folded else None
            touched: set[str] = set()
            # prediction.get(model, 0.0) -/+ frequency, without a call per model
            if isinstance(replaced, SelectionEntry) and replaced.expires_at > now:
                touched = set(replaced.models)
                frequency_of = replaced.frequency
                for model in touched:
                    if model in prediction:
                        prediction[model] -= frequency_of
                    else:
                        prediction[model] = 0.0 - frequency_of
            added, frequency_of = set(entry.models), entry.frequency
            for model in added:
                if model in prediction:
                    prediction[model] += frequency_of
                else:
                    prediction[model] = 0.0 + frequency_of
            # a model nobody names any more leaves, not as a rounding error's residue
            if forecast[1] is self._clean:
                # Every other figure was above the residue already (this board's last
                # write left it so): only the models changed here can have fallen to
                # it. Deleting them keeps the order the comprehension below keeps.
                for model in touched | added:
                    figure = prediction[model]
                    if not (figure > 1e-9 or figure < -1e-9):  # not abs(figure) > 1e-9
                        del prediction[model]
            else:
                prediction = {m: v for m, v in prediction.items() if abs(v) > 1e-9}
            self._clean = prediction
            self._forecast = (forecast[0], prediction, min(forecast[2], entry.expires_at))
        self._folded[key] = (revision, SELECTION, (agent,), entry)
        self._cached(key)

    def _cached(self, key: str) -> None:
        if self._listing is not None and key not in self._listing[2]:
            self._listing = None  # the next read prunes the caches again

    # -- reader ----------------------------------------------------------------------

    async def snapshot(self) -> DemandSnapshot:
        """Every live entry folded into per-model demand.

        The forecast (the ``sel`` entries, one per agent selected in the last hour) is
        read again only every :data:`FORECAST_REFRESH_SECONDS`, or sooner when an entry
        it counted expires; in between the last reading's prediction stands (with this
        process's own selections applied). Waiters, intents and use are read every time.
        """
        mirror = self._mirror
        if mirror is not None:
            mirror.catch_up()
            if not mirror.ended:
                return await self._followed(mirror)
            self._mirror = None  # the watch ended (the store closed): read from now on
        keys = await self._bucket.keys()
        now = self._clock.now()
        forecast = self._forecast
        # read again when the window has passed, or an entry counted in it has expired
        refresh = (forecast is None or now - forecast[0] >= FORECAST_REFRESH_SECONDS
                   or now >= forecast[2])
        listing = self._listing
        unchanged = listing is not None and keys == listing[0]
        if refresh:
            wanted = keys
        elif listing is not None and unchanged:
            wanted = listing[1]
        else:
            wanted = [k for k in keys if not k.startswith(_SELECTION_PREFIX)]
        entries = await self._bucket.get_many(wanted)
        tally = _Tally(now, self.use_window_seconds)
        folded = self._folded
        for key, entry in zip(wanted, entries, strict=True):
            if entry is None:
                continue
            # One look-up for a key unchanged since the last read (most of them: every
            # selected agent has an entry, and the board is read every demand window).
            known = folded.get(key)
            if known is not None and known[0] == entry.revision:
                _revision, kind, segments, parsed = known
            else:
                try:
                    kind, segments = self._shape(key)
                    selecting = kind == SELECTION and len(segments) == 1
                    parsed = self._parse(key, entry.revision, entry.value, selecting=selecting)
                except ValueError as error:  # a key or value this version does not understand
                    faults.noted("demand", faults.UNREADABLE,
                                 f"demand entry {key} unreadable; left out", error)
                    continue
                folded[key] = (entry.revision, kind, segments, parsed)
            tally.add(kind, segments, parsed)
        if refresh:
            self._forecast = (now, tally.prediction, tally.expiry)
        elif forecast is not None:
            tally.prediction = forecast[1]
        if not unchanged:  # a key gone since the last listing leaves the caches
            live = set(keys)
            for cache in (self._parsed, self._shapes, folded):
                for gone in cache.keys() - live:
                    del cache[gone]
            self._listing = (
                keys, [k for k in keys if not k.startswith(_SELECTION_PREFIX)]
                if refresh else wanted, live)
        return tally.snapshot()

    def _shape(self, key: str) -> tuple[str, tuple[str, ...]]:
        """The key's kind and its decoded segments, worked out once per key (a key that
        does not decode raises every time it is read, so each read notes it)."""
        known = self._shapes.get(key)
        if known is None:
            kind, _, rest = key.partition(".")
            segments = tuple(decode_token(s) for s in rest.split(".")) if rest else ()
            known = self._shapes[key] = (kind, segments)
        return known

    def _parse(
        self, key: str, revision: int, value: bytes, *, selecting: bool
    ) -> DemandEntry | SelectionEntry:
        """The entry's document, parsed once per revision (a value that does not parse
        raises every time it is read, so each read notes it)."""
        known = self._parsed.get(key)
        if known is not None and known[0] == revision:
            return known[1]
        parsed: DemandEntry | SelectionEntry = (
            SelectionEntry.from_json(value) if selecting else DemandEntry.from_json(value)
        )
        if known is None or known[0] < revision:
            # Not over a newer one: a followed copy catches up on a key's older
            # revisions after ``record_use`` read (and parsed) its newest, which the
            # copy then meets too (fleet-16: a few hundred parses a run).
            self._parsed[key] = (revision, parsed)
        return parsed

    # -- reading a followed board ----------------------------------------------------

    async def _followed(self, mirror: DemandMirror) -> DemandSnapshot:
        """What :meth:`snapshot`'s read answers, from the watched copy, in the same loop
        turns (the simulator's decisions depend on the turns)."""
        now = self._clock.now()
        forecast = self._forecast
        refresh = (forecast is None or now - forecast[0] >= FORECAST_REFRESH_SECONDS
                   or now >= forecast[2])
        seeded = mirror.seeded_at
        if seeded is None or now - seeded >= FULL_READ_SECONDS:
            keys = await self._bucket.keys()
            if keys if refresh else any(not k.startswith(_SELECTION_PREFIX) for k in keys):
                read = await self._bucket.get_many(keys)
                mirror.seed([entry for entry in read if entry is not None], now)
            else:  # the plain read would fetch nothing now: only drop what expired
                mirror.prune(keys)
                if not keys:  # the copy is the whole (empty) board: follow it from here
                    mirror.seeded_at = now
            return self._fold_copy(mirror, now, refresh, forecast, skip=set())
        wanted = bool(mirror.records) if refresh else mirror.wants_read
        created = await mirror.turns() if wanted else set()
        if created:  # keys created after the read began: the plain read has not seen them
            return self._fold_copy(mirror, now, refresh, forecast, skip=created)
        last = self._last
        if (last is not None and not refresh and last[0] == now
                and last[1] == mirror.changes and last[2] is forecast
                and not mirror.unreadable):
            # The same instant, the same entries and forecast: the same figures (the
            # forecast is not read again, and no unreadable entry is to be noted).
            return last[3]
        for key in mirror.unreadable:
            if refresh or not key.startswith(_SELECTION_PREFIX):
                error = mirror.records[key].error
                assert error is not None
                faults.noted("demand", faults.UNREADABLE,
                             f"demand entry {key} unreadable; left out", error)
        waiters, intents = mirror.tallies(now)
        uses: dict[str, tuple[float, float | None]] = {}
        records = mirror.records
        window, exp = self.use_window_seconds, math.exp
        for key in sorted(mirror.uses):
            record = records[key]
            folded = record.folded
            assert folded is not None
            figures = record.figures
            if figures is None:
                # a DemandEntry: the copy holds no other document under ``uses`` (_set)
                demand: DemandEntry = folded[3]  # type: ignore[assignment]
                figures = record.figures = (demand.expires_at, demand.count,
                                            demand.last_used_at)
            if figures[0] > now:
                # _decayed(), inline (the same arithmetic: max(0.0, x) is x when x > 0.0,
                # else 0.0): every read at a new instant decays each model's use
                count, since = figures[1], figures[2]
                if since is not None and window > 0:
                    elapsed = now - since
                    count = count * exp(-(elapsed if elapsed > 0.0 else 0.0) / window)
                uses[folded[2][0]] = (count, since)
        prediction: dict[str, float] = {}
        worked = self._worked_forecast
        if (refresh and worked is not None and worked[0] is mirror
                and worked[1] == mirror.selection_changes and now < worked[3]):
            # No forecast entry changed since the forecast was last worked out, and none
            # it counted has expired: the sums would be the same (fleet-16: 104 of 184
            # refreshes). The board's own selections since then are entries changed.
            prediction = worked[2]
            self._forecast = (now, prediction, worked[3])
        elif refresh:
            expiry = float("inf")
            for key in sorted(mirror.selections):
                record = records[key]
                folded = record.folded
                if folded is None:
                    continue
                self._folded[key] = folded
                figures = record.figures
                if figures is None:  # (its fields copied out once: see _Record.figures)
                    parsed = folded[3]
                    figures = record.figures = (
                        (parsed.expires_at, parsed.frequency, parsed.models)
                        if isinstance(parsed, SelectionEntry) else ())
                if figures and (ends := figures[0]) > now:
                    if ends < expiry:  # min(), without a call per entry
                        expiry = ends
                    frequency = figures[1]
                    for model in set(figures[2]):  # prediction.get(model, 0.0) + ...
                        if model in prediction:
                            prediction[model] += frequency
                        else:
                            prediction[model] = 0.0 + frequency
            self._forecast = (now, prediction, expiry)
            self._worked_forecast = (mirror, mirror.selection_changes, prediction, expiry)
        elif forecast is not None:
            prediction = forecast[1]
        snapshot = _demand(now, waiters, intents, uses, prediction)
        self._last = (now, mirror.changes, self._forecast, snapshot)
        return snapshot

    def _fold_copy(
        self, mirror: DemandMirror, now: float, refresh: bool,
        forecast: tuple[float, dict[str, float], float] | None, *, skip: set[str],
    ) -> DemandSnapshot:
        """The plain read's fold, entry by entry, over the copy less ``skip``."""
        tally = _Tally(now, self.use_window_seconds)
        records = mirror.records
        for key in sorted(records):
            if key in skip or (not refresh and key.startswith(_SELECTION_PREFIX)):
                continue
            record = records[key]
            if record.folded is None:
                assert record.error is not None
                faults.noted("demand", faults.UNREADABLE,
                             f"demand entry {key} unreadable; left out", record.error)
                continue
            _revision, kind, segments, parsed = record.folded
            if kind == SELECTION:
                self._folded[key] = record.folded
            tally.add(kind, segments, parsed)
        if refresh:
            self._forecast = (now, tally.prediction, tally.expiry)
            if not skip:  # every forecast entry of the copy counted
                self._worked_forecast = (mirror, mirror.selection_changes,
                                         tally.prediction, tally.expiry)
        elif forecast is not None:
            tally.prediction = forecast[1]
        return tally.snapshot()


class _Tally:
    """What one read of the board counts, entry by entry: waiters, intents and recent
    use per model, the forecast, and when its first counted entry expires. The plain
    read and the copy's fallback fold count through this one class, so they agree."""

    __slots__ = ("expiry", "intents", "now", "prediction", "use_window", "uses", "waiters")

    def __init__(self, now: float, use_window: float) -> None:
        self.now, self.use_window = now, use_window
        self.waiters: dict[str, int] = {}
        self.intents: dict[str, int] = {}
        self.uses: dict[str, tuple[float, float | None]] = {}
        self.prediction: dict[str, float] = {}
        self.expiry = float("inf")  # the first counted forecast entry to expire

    def add(self, kind: str, segments: tuple[str, ...],
            parsed: DemandEntry | SelectionEntry) -> None:
        now = self.now
        if isinstance(parsed, SelectionEntry):
            if parsed.expires_at > now:
                self.expiry = min(self.expiry, parsed.expires_at)
                prediction = self.prediction
                for model in set(parsed.models):
                    prediction[model] = prediction.get(model, 0.0) + parsed.frequency
            return
        if parsed.expires_at <= now:
            return
        if kind in (WAIT, INTENT) and len(segments) == 2:
            counts = self.waiters if kind == WAIT else self.intents
            counts[segments[0]] = counts.get(segments[0], 0) + 1
        elif kind == USE and len(segments) == 1:
            count = _decayed(parsed.count, parsed.last_used_at, now, self.use_window)
            self.uses[segments[0]] = (count, parsed.last_used_at)

    def snapshot(self) -> DemandSnapshot:
        return _demand(self.now, self.waiters, self.intents, self.uses, self.prediction)


def _demand(
    now: float, waiters: dict[str, int], intents: dict[str, int],
    uses: dict[str, tuple[float, float | None]], prediction: dict[str, float],
) -> DemandSnapshot:
    return DemandSnapshot(at=now, models=_Wanted(waiters, intents, uses, prediction))


class _Wanted(Mapping[str, ModelDemand]):
    """One read's demand per model, each :class:`ModelDemand` made when first asked for.

    A read names every model that has a waiter, an intent, recent use or a forecast
    (fleet-16: about a dozen a read), while a placement round asks for the few its
    options and victims name: building them all made 8,913 of them a fleet-16 run.
    Iterated, compared or counted, it is the mapping of every named model as before.
    It keeps the dicts it is given: each read makes its own, and the forecast's
    prediction is replaced when it changes, never changed in place.
    """

    __slots__ = ("_intents", "_made", "_names", "_prediction", "_uses", "_waiters")

    def __init__(
        self, waiters: dict[str, int], intents: dict[str, int],
        uses: dict[str, tuple[float, float | None]], prediction: dict[str, float],
    ) -> None:
        self._waiters, self._intents = waiters, intents
        self._uses, self._prediction = uses, prediction
        self._made: dict[str, ModelDemand] = {}
        self._names: set[str] | None = None

    @overload
    def get(self, model: str, /) -> ModelDemand | None: ...

    @overload
    def get(self, model: str, /, default: ModelDemand | _T) -> ModelDemand | _T: ...

    def get(self, model: str, default: object = None) -> object:
        made = self._made.get(model)
        if made is not None:
            return made
        waiters, intents = self._waiters.get(model), self._intents.get(model)
        use, prediction = self._uses.get(model), self._prediction.get(model)
        if waiters is None and intents is None and use is None and prediction is None:
            return default
        recent, last_used_at = use if use is not None else (0.0, None)
        made = self._made[model] = ModelDemand(
            waiters=waiters or 0, intents=intents or 0, recent_use=recent,
            prediction=prediction if prediction is not None else 0.0,
            last_used_at=last_used_at,
        )
        return made

    def __getitem__(self, model: str) -> ModelDemand:
        made = self.get(model)
        if made is None:
            raise KeyError(model)
        return made

    def _named(self) -> set[str]:
        names = self._names
        if names is None:
            names = self._names = (set(self._waiters) | set(self._intents) | set(self._uses)
                                   | set(self._prediction))
        return names

    def __iter__(self) -> Iterator[str]:
        return iter(self._named())

    def __len__(self) -> int:
        return len(self._named())

    def __contains__(self, model: object) -> bool:
        return model in self._named()

    def __repr__(self) -> str:
        return repr(dict(self.items()))
