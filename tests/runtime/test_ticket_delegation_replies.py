"""The combiner's replies on the wire: the revision of its write travels along, and a
reply from a combiner that sends none still decodes (a rolling upgrade mixes both)."""

from __future__ import annotations

import json

import pytest

from kubemoot.runtime import ticket_delegation as delegation


def test_a_reply_carries_the_revision_of_the_combiners_write() -> None:
    sent = [delegation.Reply("t1", delegation.RELEASED, revision=42),
            delegation.Reply("t2", delegation.LAPSED, reason="stopped")]
    assert delegation.decode_replies(delegation.encode_replies(sent)) == sent


def test_a_reply_without_a_revision_decodes_as_not_known() -> None:
    old = json.dumps([{"ticketId": "t1", "result": "released", "reason": ""}]).encode()
    (reply,) = delegation.decode_replies(old)
    assert (reply.ticket_id, reply.result, reply.revision) == ("t1", "released", 0)


def test_a_revision_that_is_no_number_is_no_reply() -> None:
    bad = json.dumps([{"ticketId": "t1", "result": "released", "revision": None}]).encode()
    with pytest.raises(ValueError):
        delegation.decode_replies(bad)
