"""The runtime's replay of the engines' per-slot prompt caches (runtime/prefix.py) and
its price: a copy that still holds a call's thread saves that call most of its prefill."""

from __future__ import annotations

import pytest

from kubemoot.runtime import options
from kubemoot.runtime.cost import Option, OptionKind
from kubemoot.runtime.occupancy import OccupancyBook
from kubemoot.runtime.options import Round
from kubemoot.runtime.prefix import PrefixBook, ThreadPrompt
from kubemoot.runtime.snapshot import DemandSnapshot, FleetSnapshot, ProviderSnapshot
from kubemoot.settings import RuntimeSettings
from kubemoot.testing.state import NOW, gpu

RATE = 0.001  # seconds a token


def _fleet(**residents: dict[str, float]) -> FleetSnapshot:
    return FleetSnapshot.of(NOW, [ProviderSnapshot(state=gpu(name, 48, residents=models,
                                                            slots=2))
                                  for name, models in residents.items()])


def test_a_slot_keeps_its_last_thread_and_the_oldest_slot_is_overwritten() -> None:
    book = PrefixBook(RATE)
    book.served("a", "m", 2, ThreadPrompt("t1", 1000), at=1)
    book.served("a", "m", 2, ThreadPrompt("t2", 500), at=2)
    assert (book.cached("a", "m", "t1"), book.cached("a", "m", "t2")) == (1000, 500)
    book.served("a", "m", 2, ThreadPrompt("t1", 1800), at=3)  # t1 again: its own slot
    assert book.cached("a", "m", "t1") == 1800
    book.served("a", "m", 2, ThreadPrompt("t3", 700), at=4)  # overwrites t2's (older)
    assert (book.cached("a", "m", "t1"), book.cached("a", "m", "t2"),
            book.cached("a", "m", "t3")) == (1800, 0, 700)
    assert book.cached("b", "m", "t1") == 0  # another copy never served it


def test_seconds_credit_only_a_resident_copy_that_holds_the_thread() -> None:
    book = PrefixBook(RATE)
    book.served("a", "m", 2, ThreadPrompt("t", 3000), at=1)
    book.served("b", "m", 2, ThreadPrompt("other", 3000), at=1)
    book.expect("call-1", ThreadPrompt("t", 4000))
    seconds = book.seconds("call-1", _fleet(a={"m": 10}, b={"m": 10}))
    # anywhere: the whole 4000 tokens; on a: only the 1000 added since
    assert seconds == {("", ""): pytest.approx(4.0), ("a", "m"): pytest.approx(1.0)}
    # the copy on a was unloaded: its cache went with it, even if it loads again later
    assert book.seconds("call-1", _fleet(a={}, b={"m": 10})) == {("", ""): pytest.approx(4.0)}
    assert book.seconds("call-1", _fleet(a={"m": 10}, b={"m": 10})) == {
        ("", ""): pytest.approx(4.0)}
    book.forget("call-1")
    assert book.seconds("call-1", _fleet(a={"m": 10})) == {}  # no thread: no prefill term


def test_every_option_pays_its_prefill_and_the_holding_copy_less() -> None:
    fleet = _fleet(a={"m": 10}, b={"m": 10})
    rnd = Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                   occupancy=OccupancyBook(), prompt_tokens=4000)
    warm = Option(OptionKind.WARM, "b", "m", 0.0)
    assert rnd.with_prefill(warm) == warm  # no thread: DESIGN §5's prices unchanged
    rnd.prefill = {("", ""): 4.0, ("a", "m"): 1.0}
    assert rnd.with_prefill(warm).seconds == 4.0
    assert rnd.with_prefill(Option(OptionKind.WARM, "a", "m", 0.0)).seconds == 1.0
    assert rnd.with_prefill(Option(OptionKind.COLD_LOAD, "c", "m", 12.0)).seconds == 16.0


def test_a_thread_goes_back_to_the_copy_that_holds_it() -> None:
    # Two warm copies with free slots: by name "a" would win; "b" holds the thread.
    book = PrefixBook(RATE)
    book.served("b", "m", 2, ThreadPrompt("t", 3000), at=1)
    book.expect("h", ThreadPrompt("t", 4000))
    fleet = _fleet(a={"m": 10}, b={"m": 10})
    rnd = Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                   occupancy=OccupancyBook(), prompt_tokens=4000)
    assert options.warm_options(rnd, "m")[0].provider == "a"
    rnd = Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                   occupancy=OccupancyBook(), prompt_tokens=4000)
    rnd.prefill = book.seconds("h", fleet)
    best = options.warm_options(rnd, "m")[0]
    assert (best.provider, best.seconds) == ("b", pytest.approx(1.0))


def test_a_free_slot_elsewhere_is_no_cheap_case_when_waiting_for_the_cache_is_cheaper() -> None:
    from kubemoot.testing.state import ticket

    # "a" has a free slot but would evaluate the whole 20 s prompt; "b" holds the thread
    # (1 s left to evaluate) and its one slot frees in 15 s: 16 s against 20 s.
    a = ProviderSnapshot(state=gpu("a", 48, residents={"m": 10}, slots=1), latency_seconds=20)
    b = ProviderSnapshot(state=gpu("b", 48, residents={"m": 10}, slots=1), latency_seconds=20,
                         tickets=(ticket("m", age=5),))
    fleet = FleetSnapshot.of(NOW, [a, b])
    rnd = Round.of(fleet, DemandSnapshot(), settings=RuntimeSettings(),
                   occupancy=OccupancyBook(), prompt_tokens=20000)
    assert [o.provider for o in options.warm_options(rnd, "m")] == ["a"]  # no thread
    rnd.prefill = {("", ""): 20.0, ("b", "m"): 1.0}
    assert options.warm_options(rnd, "m") == []
    rnd.prefill = {("", ""): 10.0, ("b", "m"): 1.0}  # a shorter prompt: the free slot wins
    assert [o.provider for o in options.warm_options(rnd, "m")] == ["a"]
