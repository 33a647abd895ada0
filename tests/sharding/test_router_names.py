"""The names the shards' router places a request by (sharding/router.py: names), read as the shard
records them: no live shard is needed to tell them."""

import unicodedata

import pytest

from ledger.api.serializers import ActionRequestSerializer
from sharding.router import Unreadable, names
from tests.factories import refund_body

# 130 accented letters, each written as a letter and its combining accent: 260 characters as
# sent, 130 as the shard keeps it (NFKC).
DECOMPOSED = unicodedata.normalize("NFD", "\u00e9" * 130)


def test_the_router_places_the_customer_the_shard_records():
    body = refund_body("ORD-1", customer=DECOMPOSED, decision="dec-1")
    request = ActionRequestSerializer(data=body)
    assert request.is_valid(), request.errors
    assert request.validated_data["customer"] == "\u00e9" * 130
    assert names("action", "refund:ORD-1:dec-1", body)[1] == ["customer:" + "\u00e9" * 130, "target:ORD-1"]


def test_a_task_is_placed_by_its_customer_as_the_shard_records_it():
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "customer": DECOMPOSED}}
    assert names("task", "task-1", body)[1] == ["customer:" + "\u00e9" * 130, "target:ORD-1"]


def test_a_customer_the_shard_refuses_as_too_long_is_refused_by_the_router_too():
    body = refund_body("ORD-1", customer="\u00e9" * 256, decision="dec-1")
    assert not ActionRequestSerializer(data=body).is_valid()
    with pytest.raises(Unreadable):
        names("action", "refund:ORD-1:dec-1", body)
