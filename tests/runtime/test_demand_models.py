"""A read of the demand board makes each model's figures only when asked for them."""

from __future__ import annotations

import pytest

from kubemoot.runtime import demand
from kubemoot.runtime.snapshot import ModelDemand

WAITERS = {"a": 2}
INTENTS = {"a": 1, "b": 1}
USES = {"b": (0.5, 10.0), "c": (1.5, 12.0)}
PREDICTION = {"c": 0.25, "d": 1.0}


def _eager() -> dict[str, ModelDemand]:
    """What a read gave before: every named model's figures, made at once."""
    names = set(WAITERS) | set(INTENTS) | set(USES) | set(PREDICTION)
    return {m: ModelDemand(waiters=WAITERS.get(m, 0), intents=INTENTS.get(m, 0),
                           recent_use=USES.get(m, (0.0, None))[0],
                           prediction=PREDICTION.get(m, 0.0),
                           last_used_at=USES.get(m, (0.0, None))[1]) for m in names}


def test_the_models_of_a_read_are_those_it_always_named() -> None:
    snapshot = demand._demand(20.0, dict(WAITERS), dict(INTENTS), dict(USES), dict(PREDICTION))
    assert snapshot.at == 20.0
    assert dict(snapshot.models) == _eager()
    assert snapshot.models == _eager() and _eager() == snapshot.models
    assert len(snapshot.models) == 4 and "d" in snapshot.models and "e" not in snapshot.models
    for model, wanted in _eager().items():
        assert snapshot.of(model) == wanted
        assert snapshot.demand(model) == wanted.demand
    assert snapshot.of("e") == ModelDemand()  # not named: not wanted
    with pytest.raises(KeyError):
        snapshot.models["e"]


def test_a_read_makes_only_the_figures_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []

    def counted(**fields: float | int | None) -> ModelDemand:
        made.append("one")
        return ModelDemand(**fields)  # type: ignore[arg-type]

    monkeypatch.setattr(demand, "ModelDemand", counted)
    snapshot = demand._demand(20.0, dict(WAITERS), dict(INTENTS), dict(USES), dict(PREDICTION))
    first = snapshot.of("c")
    assert snapshot.of("c") is first  # made once, then kept
    assert snapshot.of("e") == ModelDemand()
    assert len(made) == 1
