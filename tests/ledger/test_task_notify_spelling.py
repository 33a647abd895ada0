"""A refund task's `notify` is recorded with its domain in one spelling, as a message's recipient
is: a retry of the task with the domain written in another case is the same task (it was refused
as a task id reused). Tasks recorded before keep their input; migration 0044 gives their print."""

import importlib
import json

import pytest
from django.apps import apps as django_apps

from ledger.models import Task
from tests.factories import make_agent_on

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def post_task(client, notify):
    body = {"workflow": "refund", "input": {"order_id": "ORD-1", "amount": "25.00", "currency": "EUR",
                                            "customer": "CUST-1", "notify": notify}}
    return client.post("/api/v1/tasks", json.dumps(body), content_type="application/json",
                       headers={"Idempotency-Key": "task-n1"})


def test_a_retry_with_the_domain_in_another_case_is_the_same_task(client):
    make_agent_on(client)
    assert post_task(client, "Ada@Customers.EXAMPLE").status_code == 201
    assert Task.objects.get().input["notify"] == "Ada@customers.example"  # the part before @ as written
    for spelling in ("Ada@Customers.EXAMPLE", "Ada@customers.example"):
        again = post_task(client, spelling)
        assert (again.status_code, again["Idempotent-Replayed"]) == (200, "true"), again.content
    assert post_task(client, "ada@customers.example").json()["code"] == "idempotency_key_reused"
    assert Task.objects.count() == 1


def test_the_migration_gives_a_task_recorded_before_the_rule_its_print_in_one_spelling(client):
    reprint = importlib.import_module("ledger.migrations.0044_refund_task_notify_in_one_spelling")
    make_agent_on(client)
    assert post_task(client, "ada@CUSTOMERS.example").status_code == 201
    written = {**Task.objects.get().input, "notify": "ada@CUSTOMERS.example"}  # as recorded before the rule
    Task.objects.update(input=written, fingerprint=reprint.hashed("workflow:refund", "task-n1", written))
    assert post_task(client, "ada@customers.example").status_code == 422  # the exact body answers from its row

    reprint.forwards(django_apps, None)

    for spelling in ("ada@CUSTOMERS.example", "ada@customers.example"):
        assert post_task(client, spelling).status_code == 200
    assert Task.objects.get().input == written  # what was recorded stays as it was
    reprint.backwards(django_apps, None)
    assert Task.objects.get().fingerprint == reprint.hashed("workflow:refund", "task-n1", written)
