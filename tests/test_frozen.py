"""``quick_init``: the same objects as the dataclass-made ``__init__``, still frozen."""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import InitVar, dataclass, field

import pytest

from kubemoot.frozen import quick_init
from kubemoot.runtime.calls import CallRequest
from kubemoot.runtime.claims import Claim
from kubemoot.runtime.cost import Option
from kubemoot.runtime.placement import CallPlacement
from kubemoot.runtime.snapshot import DemandSnapshot
from kubemoot.sim.metrics import SimulatedOutcome
from kubemoot.sim.simulation import ServedCall
from kubemoot.store.protocol import Change, Entry

SEEN: list[int] = []


def _shapes() -> tuple[type, type]:
    """One class of every supported shape, twice: with dataclasses' __init__ and ours."""

    def make() -> type:
        @dataclass(frozen=True, slots=True)
        class Shape:
            a: int
            b: str = "b"
            c: list[int] = field(default_factory=list)
            d: dict[str, int] = field(default_factory=dict, init=False)
            e: float = field(default=2.5, init=False)
            f: int = field(default=0, kw_only=True)
            g: tuple[int, ...] = field(default=(), kw_only=True)

            def __post_init__(self) -> None:
                SEEN.append(self.a)

        return Shape

    return make(), quick_init(make())


def _fields(obj: object) -> list[tuple[str, object]]:
    return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]  # type: ignore[arg-type]


@pytest.mark.parametrize("args, kwargs", [
    ((1,), {}), ((1, "x"), {}), ((1, "x", [3]), {"f": 4}), ((1,), {"g": (1, 2), "b": "y"}),
])
def test_the_same_fields_as_the_dataclass_init(args: tuple, kwargs: dict) -> None:
    plain, quick = _shapes()
    SEEN.clear()
    one, two = plain(*args, **kwargs), quick(*args, **kwargs)
    assert _fields(one) == _fields(two)
    assert [args[0], args[0]] == SEEN  # __post_init__ ran for both
    assert repr(one).split("(", 1)[1] == repr(two).split("(", 1)[1]


def test_factories_give_each_object_its_own_value() -> None:
    _, quick = _shapes()
    first, second = quick(1), quick(2)
    assert first.c == [] and first.c is not second.c
    assert first.d == {} and first.d is not second.d


def test_still_frozen_equal_hashable_and_picklable() -> None:
    quick = quick_init(dataclass(frozen=True, slots=True)(
        type("Pair", (), {"__annotations__": {"x": "int", "y": "int"}})))
    pair = quick(1, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.x = 3
    assert pair == quick(1, 2) and hash(pair) == hash(quick(1, 2))
    entry = Entry("k", b"v", 3)  # a module-level class, which pickle can find
    assert pickle.loads(pickle.dumps(entry)) == entry


def test_the_same_errors_for_wrong_arguments() -> None:
    plain, quick = _shapes()
    for cls in (plain, quick):
        with pytest.raises(TypeError, match="missing 1 required positional argument: 'a'"):
            cls()
        with pytest.raises(TypeError, match="unexpected keyword argument 'd'"):
            cls(1, d={})
        with pytest.raises(TypeError, match="positional argument"):
            cls(1, "b", [], 4)


def test_what_it_cannot_reproduce_is_refused() -> None:
    with pytest.raises(TypeError, match="frozen"):
        quick_init(dataclass(slots=True)(type("Open", (), {"__annotations__": {"x": "int"}})))
    with pytest.raises(TypeError, match="frozen"):
        quick_init(dataclass(frozen=True)(type("NoSlots", (), {"__annotations__": {"x": "int"}})))

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        x: int
        y: InitVar[int]

    with pytest.raises(TypeError, match="InitVar"):
        quick_init(WithInitVar)


@pytest.mark.parametrize("cls", [Option, CallPlacement, Claim, CallRequest, DemandSnapshot,
                                 SimulatedOutcome, ServedCall, Change, Entry])
def test_the_hot_classes_use_it(cls: type) -> None:
    # the dataclass-made __init__ reads "__dataclass_builtins_object__"; ours does not
    assert "__dataclass_builtins_object__" not in cls.__init__.__code__.co_names
    assert "__dataclass_builtins_object__" not in cls.__init__.__code__.co_freevars
