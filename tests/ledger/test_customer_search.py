"""The ledger search finds a customer or a target as people write the id: any case, or its beginning."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command

from ledger.actions import action_request
from tests.factories import make_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def approver_client(client):
    call_command("setup_roles", verbosity=0)
    user = get_user_model().objects.create(username="searcher")
    user.groups.add(Group.objects.get(name="approvers"))
    client.force_login(user)
    return client


def refund_for(agent, customer, n):
    action_request(agent=agent, operation_key=f"refund:ORD-S{n}:full:dec-s{n}", action_type="refund",
                   target=f"ORD-S{n}", customer=customer, params={"amount": "10.00", "currency": "EUR"})
    return f"refund:ORD-S{n}:full:dec-s{n}"


def keys_found(client, customer, field="customer"):
    page = client.get("/ledger/", {field: customer}).content.decode()
    return {key for key in ("refund:ORD-S1:full:dec-s1", "refund:ORD-S2:full:dec-s2", "refund:ORD-S3:full:dec-s3")
            if key in page}


def test_a_customer_is_found_in_any_case_and_by_the_beginning_of_the_id(approver_client):
    agent, _ = make_agent("search-bot")
    first = refund_for(agent, "CUST-17", 1)
    second = refund_for(agent, "CUST-170", 2)
    refund_for(agent, "CUST-2", 3)
    assert keys_found(approver_client, "CUST-17") == {first}  # as written: that customer alone
    assert keys_found(approver_client, "cust-17") == {first, second}
    assert keys_found(approver_client, "Cust-1") == {first, second}
    assert keys_found(approver_client, "cust-9") == set()


def test_a_target_is_found_in_any_case_and_by_the_beginning_of_the_id(approver_client):
    agent, _ = make_agent("search-bot")
    first, second, third = (refund_for(agent, f"CUST-{n}", n) for n in (1, 2, 3))  # targets ORD-S1 to ORD-S3
    assert keys_found(approver_client, "ORD-S1", "target") == {first}  # as written
    assert keys_found(approver_client, "ord-s1", "target") == {first}
    assert keys_found(approver_client, "ord-s", "target") == {first, second, third}
    assert keys_found(approver_client, "ord-x", "target") == set()
