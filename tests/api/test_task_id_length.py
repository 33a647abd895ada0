"""A task's input leaves room for what its steps record: its id for its steps' keys (`{task_id}:{step}:v{version}`, each at most an
operation key's 255 characters): a longer one is refused with a problem and writes nothing.
Found by the schema fuzzer: a 255-character task id was a 500."""

import json

import pytest

from ledger.api.serializers import task_id_room
from ledger.models import AuditEvent, Task, TaskStep
from ledger.tasks import task_request
from tests.factories import make_agent_on, refund_task_body

pytestmark = pytest.mark.django_db


def post_task(client, task_id):
    return client.post("/api/v1/tasks", data=json.dumps(refund_task_body()), content_type="application/json",
                       headers={"Idempotency-Key": task_id})


def test_it_refuses_a_task_id_its_steps_keys_would_not_fit_after(client):
    make_agent_on(client)
    events = AuditEvent.objects.count()
    response = post_task(client, "t" * 255)
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "invalid"
    assert problem["errors"]["Idempotency-Key"] == [
        f"At most {task_id_room('refund')} characters: the steps' keys add their names to it."]
    assert not Task.objects.exists() and not TaskStep.objects.exists()
    assert AuditEvent.objects.count() == events


def test_it_takes_the_longest_task_id_that_leaves_room(client):
    make_agent_on(client)
    task_id = "t" * task_id_room("refund")
    assert post_task(client, task_id).status_code == 201
    assert max(len(step.idempotency_key) for step in TaskStep.objects.filter(task__task_id=task_id)) == 255


@pytest.mark.parametrize("customer, notify, status", [("c" * 230, None, 201), ("c" * 231, None, 400),
                                                      ("c" * 255, "ops@example.com", 201)])
def test_a_customer_whose_confirmation_would_not_fit_is_refused_before_anything_runs(client, customer, notify, status):
    """Without `notify` the confirmation goes to <customer>@customers.surety.example, an action's
    target of at most 255 characters: a longer customer failed its last step, after the refund,
    on every retry. With `notify`, a customer may be as long as a refund's."""
    make_agent_on(client)
    given = {"customer": customer, **({"notify": notify} if notify else {})}
    body = {**refund_task_body(), "input": {**refund_task_body()["input"], **given}}
    response = client.post("/api/v1/tasks", data=json.dumps(body), content_type="application/json",
                           headers={"Idempotency-Key": "task-long-customer"})
    assert response.status_code == status, response.content
    assert Task.objects.exists() == (status == 201)


def _refund_task(client, customer, notify=None, task_id="task-customer-address"):
    body = refund_task_body(customer=customer)
    if notify:
        body["input"]["notify"] = notify
    return client.post("/api/v1/tasks", data=json.dumps(body), content_type="application/json",
                       headers={"Idempotency-Key": task_id}), body


@pytest.mark.parametrize("customer, notify, status", [("ACME Corp", None, 400), ("a@b", None, 400),
                                                      ("ACME Corp", "ops@example.com", 201), ("Cust-7", None, 201)])
def test_a_customer_that_makes_no_address_needs_notify_before_anything_runs(client, customer, notify, status):
    """Without `notify` the confirmation goes to <customer>@customers.surety.example: a customer
    that makes no e-mail address of it failed the task's last step, after the refund was made."""
    make_agent_on(client)
    response, _ = _refund_task(client, customer, notify)
    assert response.status_code == status, response.content
    if status == 400:
        [said] = response.json()["errors"]["input.customer"]
        assert "is not an e-mail address: give notify" in said
    assert Task.objects.exists() == (status == 201)


def test_a_task_recorded_before_the_address_rule_is_replayed_under_its_id(client):
    """A deployment's tasks from before the rule keep their promise: the same request under the same
    id is their replay, not a 400."""
    agent = make_agent_on(client)
    _, body = _refund_task(client, "ACME Corp")
    task, _ = task_request(agent=agent, task_id="task-customer-address", workflow="refund", input=body["input"])
    response, _ = _refund_task(client, "ACME Corp")
    assert response.status_code == 200, response.content
    assert response.json()["task_id"] == task.task_id and Task.objects.count() == 1
