"""The per-call paths read enum members from module globals, not through their class.

On Python 3.11 ``OptionKind.WARM`` runs ``EnumType``'s ``__getattr__`` hook (about 850
instructions under callgrind, against about 150 for a global); these functions run once
or more per simulated call, so a member read through its class here is a regression.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from kubemoot.emulation.engine import OllamaEngine
from kubemoot.gates import results
from kubemoot.runtime import (
    claims,
    cost,
    filters,
    held_plans,
    options,
    planner,
    snapshot,
    ticket_decision,
    tickets,
)
from kubemoot.runtime.circuit import CircuitBreakers
from kubemoot.sim.phases import WaitPhases


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _code(function: Callable[..., Any]) -> types.CodeType:
    return getattr(function, "fget", function).__code__  # type: ignore[no-any-return]


@pytest.mark.parametrize("function, enum", [
    (WaitPhases.split, "WaitSource"),
    (claims.condition_for, "OptionKind"),
    (claims.Claims.claim, "OptionKind"),
    (options.or_a_copy_as_soon, "OptionKind"),
    (options._free_copies, "OptionKind"),
    (planner.CallPlanner._place, "TicketState"),
    (planner.CallPlanner._place_round, "OptionKind"),
    (results.standing, "Verdict"),
    (results.GateResult.admits, "Verdict"),
    (results.GateResult.pass_, "Verdict"),
    (held_plans.HeldPlans._shares_a_copy, "OptionKind"),
    (held_plans.HeldPlans._shares_a_copy, "Action"),
    (OllamaEngine.release, "CopyState"),
    (ticket_decision.decide, "OpKind"),
    (ticket_decision._apply_announced, "RequestKind"),
    (tickets._Op.request, "OpKind"),
    (tickets._Op.announceable, "OpKind"),
    (tickets.TicketManager.claim, "OpKind"),
    (tickets.TicketManager._serve, "OpKind"),
    (tickets.TicketManager._answer, "OpKind"),
    (tickets.TicketManager._read_for, "OpKind"),
    (tickets._known_state, "OpKind"),
    (CircuitBreakers.state, "CircuitState"),
    (CircuitBreakers.allows, "CircuitState"),
    (CircuitBreakers.admit, "CircuitState"),
    (CircuitBreakers.record_failure, "CircuitState"),
    (snapshot._loaders, "TicketState"),
    (snapshot._Budget.of, "TicketState"),
    (snapshot._Calls.__init__, "TicketState"),
    (tickets.TicketManager.release, "OpKind"),
    (tickets.TicketManager._release_once, "OpKind"),
    (tickets.TicketManager.release_sent, "OpKind"),
    (tickets.TicketManager._give_back, "OpKind"),
    (tickets.TicketManager.renew, "OpKind"),
    (tickets.TicketManager.update_state, "OpKind"),
    (tickets.TicketManager.mark_running, "TicketState"),
    (cost.CostModel.copy_option, "OptionKind"),
    (cost.CostModel.priced_queue, "OptionKind"),
    (cost.CostModel.cold_option, "OptionKind"),
    (cost.CostModel.unload_option, "OptionKind"),
    (filters.feasible, "Standing"),
])
def test_no_member_read_through_its_class(function: Callable[..., Any], enum: str) -> None:
    assert enum not in _names(_code(function))
