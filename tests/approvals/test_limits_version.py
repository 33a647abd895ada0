"""The limits' version (approvals migration 0004): the database bumps it on every change to
the limits, the API's authenticating statement reads it, and a process keeps its copy of the
limits only while the version is the same. `make test` runs this module on SQLite as well."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from approvals.models import Limit, LimitsVersion
from tests.factories import make_agent_on, post_action_in_process, refund_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


@pytest.fixture
def version_row():
    """The row the migration writes (a database emptied by an earlier test lost it)."""
    return LimitsVersion.objects.get_or_create(id=1)[0]


def version():
    return LimitsVersion.objects.get(id=1).version


def test_every_change_to_the_limits_gives_a_new_version_whoever_makes_it(version_row):
    seen = [version()]
    limit = Limit.limit_set(actor="system:tests", reason="the tests' policy",
                            action_type="refund", currency="EUR", max_amount=Decimal("500"))
    seen.append(version())
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("600"))
    seen.append(version())
    with connection.cursor() as cursor:  # not through the model: the database still sees it
        cursor.execute("UPDATE approvals_limit SET max_amount = 700 WHERE id = %s", [limit.pk])
    seen.append(version())
    Limit.objects.filter(pk=limit.pk).delete()
    seen.append(version())
    assert len(set(seen)) == 5, seen
    # Never given twice, even after a rollback (this test's own changes are rolled back).
    if connection.vendor == "postgresql":
        assert seen == sorted(seen)


@pytest.fixture
def post(client):
    make_agent_on(client)

    def post(key, order, amount):
        response = post_action_in_process(client, key, refund_body(order, amount, customer=order))
        assert response.status_code == 201, response.content
        return response.json()["status"]

    return post


def test_a_limit_change_applies_to_the_next_request_of_a_process_that_kept_the_limits(version_row, post):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    assert post("k1", "ORD-1", "750.00") == "awaiting_approval"
    assert post("k2", "ORD-2", "400.00") == "queued"  # from this process's copy

    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("1000.00"))
    assert post("k3", "ORD-3", "750.00") == "queued"
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("100.00"))
    assert post("k4", "ORD-4", "400.00") == "awaiting_approval"


def test_a_process_with_the_current_copy_asks_for_no_limit(version_row, post):
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    post("k1", "ORD-1", "25.00")  # reads the limits at this version

    with CaptureQueriesContext(connection) as queries:
        post("k2", "ORD-2", "25.00")
    assert not any('"approvals_limit"' in q["sql"] for q in queries.captured_queries)


def test_without_the_version_row_the_limits_are_asked_every_time(post):
    LimitsVersion.objects.all().delete()
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("500.00"))
    assert post("k1", "ORD-1", "750.00") == "awaiting_approval"
    Limit.limit_set(actor="system:tests", reason="the tests' policy",
                    action_type="refund", currency="EUR", max_amount=Decimal("1000.00"))
    assert post("k2", "ORD-2", "750.00") == "queued"


@pytest.mark.parametrize("values", [{"daily_customer_total": Decimal("-1.00")}, {"review_deadline_hours": 0},
                                    {"review_deadline_hours": 24 * 365 + 1}])
def test_the_database_refuses_a_limit_the_policy_form_would_refuse(values):
    with pytest.raises(IntegrityError), transaction.atomic():
        Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                        max_amount=Decimal("500.00"), **values)
    assert not Limit.objects.exists()
