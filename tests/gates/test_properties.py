"""Properties of the engine over random candidates, verdicts and scores."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kubemoot.gates import Outcome, Standing, Verdict, Weighted, evaluate
from tests.gates.test_engine import GATES, Cand, ScoreOf, TableGate

verdicts = st.dictionaries(st.sampled_from(GATES), st.sampled_from(list(Verdict)), max_size=3)
candidates = st.lists(
    st.builds(
        Cand,
        name=st.text("abcdefgh", min_size=1, max_size=3),
        verdicts=verdicts,
        score=st.floats(0, 100, allow_nan=False),
    ),
    max_size=8,
    unique_by=lambda c: c.name,
)


@settings(max_examples=200, deadline=None)
@given(cands=candidates, stop=st.booleans())
def test_engine_invariants(cands: list[Cand], stop: bool) -> None:
    record = evaluate(
        cands,
        key=lambda c: c.name,
        gates=[TableGate(n) for n in GATES],
        scorers=[Weighted(ScoreOf(), 2.0)],
        subject="W",
        scheduler_version="t",
        scoring_policy_version="s",
        stop_at_first_fail=stop,
    )
    by_name = {c.name: c for c in cands}
    expected_verdicts = {c.name: [c.verdicts.get(g, Verdict.PASS) for g in GATES] for c in cands}
    for name, verdict_list in expected_verdicts.items():
        standing = record.candidates[name].standing
        if Verdict.FAIL in verdict_list:
            assert standing is Standing.HARD_FAILED
            assert name != record.chosen  # a node with any FAIL is never placed
        elif any(v is not Verdict.PASS for v in verdict_list):
            assert standing is Standing.UNCERTAIN
            assert name != record.chosen  # no UNKNOWN or STALE node is placed
        else:
            assert standing is Standing.FEASIBLE
    # Scores exist only for feasible candidates, and the sets partition the input.
    assert set(record.scores) == set(record.feasible)
    assert sorted(record.feasible + record.uncertain + record.hard_failed) == sorted(by_name)
    # The outcome rule.
    assert (record.outcome is Outcome.PLACE) == bool(record.feasible)
    assert (record.outcome is Outcome.DEFER) == (not record.feasible and bool(record.uncertain))
    assert (record.outcome is Outcome.UNSCHEDULABLE) == (
        not record.feasible and not record.uncertain
    )
    # The chosen candidate has the top score; ties go to the smallest id.
    if record.chosen is not None:
        best = max(record.scores.values())
        assert record.scores[record.chosen] == best
        assert record.chosen == min(n for n, s in record.scores.items() if s == best)
        assert record.scores[record.chosen] == round(2.0 * by_name[record.chosen].score, 9)
