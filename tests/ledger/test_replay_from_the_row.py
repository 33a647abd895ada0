"""A replayed POST is answered from the stored row; anything that is not the very same
request still goes through validation and the intake, with their answers.

No live server: the test client, and the run's own Redis for the doorbell (no worker
listens), so nothing is executed.
"""


import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.actions import action_request
from ledger.executor import action_claim_next
from ledger.grants import agent_revoke, capability
from ledger.models import Action, AuditEvent, Capability
from tests.factories import another_transaction, make_agent, make_agent_on, post_action_in_process, refund_body

KEY = "refund:ORD-8841:full:dec-77"


@pytest.fixture
def billing(client, db, jobs_to_test_redis):
    return make_agent_on(client)


def statements(queries):
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    return [q["sql"] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith(control)]


def test_the_same_request_again_reads_the_row_and_writes_nothing(client, billing):
    first = post_action_in_process(client, KEY, refund_body())
    assert first.status_code == 201
    events = AuditEvent.objects.count()

    with CaptureQueriesContext(connection) as queries:
        again = post_action_in_process(client, KEY, refund_body())

    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    # The agent by its token (which finds the key's action), the action: no transaction, no lock, no write.
    assert len(statements(queries)) == 2, statements(queries)
    assert not any(q["sql"].startswith(("BEGIN", "INSERT", "UPDATE")) for q in queries.captured_queries)
    assert AuditEvent.objects.count() == events


def test_a_new_key_costs_no_lookup_of_its_own_before_its_transaction(client, billing):
    first = post_action_in_process(client, "first", refund_body(order="ORD-1", customer="C-1"))
    assert first.status_code == 201  # the grant is now cached
    with CaptureQueriesContext(connection) as queries:
        assert post_action_in_process(client, "second", refund_body(order="ORD-2", customer="C-2")).status_code == 201

    sql = [q["sql"] for q in queries.captured_queries]
    before = sql[:next(i for i, q in enumerate(sql) if q.startswith(("BEGIN", "SAVEPOINT")))]
    # The agent's statement answered whether the key was taken (it was not).
    assert len(before) == 1 and "ledger_agent" in before[0] and "ledger_action" in before[0], before


def test_the_contract_body_with_a_null_task_id_is_replayed_from_the_row(client, billing):
    body = {**refund_body(), "task_id": None}  # as docs/contract.md writes it
    first = post_action_in_process(client, KEY, body)
    assert first.status_code == 201 and first.json()["task_id"] is None

    with CaptureQueriesContext(connection) as queries:
        again = post_action_in_process(client, KEY, body)
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert len(statements(queries)) == 2, statements(queries)
    without = post_action_in_process(client, KEY, refund_body())  # the same request without the field
    assert without.status_code == 200


def test_another_spelling_of_the_same_request_is_still_a_replay(client, billing):
    assert post_action_in_process(client, KEY, refund_body(currency="eur")).status_code == 201
    again = post_action_in_process(client, KEY, refund_body(currency="EUR"))
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert Action.objects.count() == 1


@pytest.mark.parametrize(("change", "status", "code"), [
    (lambda body: {**body, "params": {**body["params"], "amount": "26.00"}}, 422, "idempotency_key_reused"),
    (lambda body: {**body, "target": "ORD-9999"}, 422, "idempotency_key_reused"),
    (lambda body: {**body, "customer": "CUST-OTHER"}, 422, "idempotency_key_reused"),
    (lambda body: {**body, "colour": "red"}, 400, "invalid"),
    (lambda body: {**body, "params": {**body["params"], "amount": 25}}, 400, "invalid"),
    # Invalid as asked (a message's params are not a refund's): never answered with the refund.
    (lambda body: {**body, "action_type": "send_message"}, 400, "invalid"),
    # Only a workflow's steps add actions to a task (docs/contract.md): refused, not replayed.
    (lambda body: {**body, "task_id": "task:refund:ORD-8841:dec-77"}, 400, "invalid"),
], ids=["another amount", "another target", "another customer", "an unknown field", "a float amount",
        "another action type", "a task id"])
def test_a_changed_request_on_a_used_key_gets_the_full_answer(client, billing, change, status, code):
    first = post_action_in_process(client, KEY, refund_body())
    assert first.status_code == 201

    response = post_action_in_process(client, KEY, change(refund_body()))

    assert response.status_code == status, response.content
    assert response.json()["code"] == code
    assert list(Action.objects.values_list("params", flat=True)) == [first.json()["params"]]


def test_a_replay_needs_the_grant_still(client, billing):
    assert post_action_in_process(client, KEY, refund_body()).status_code == 201
    agent_revoke(billing, capability(Capability.Kind.ACTION_TYPE, "refund"), actor="system:tests",
                 reason="the replay run needs no live grant")
    response = post_action_in_process(client, KEY, refund_body())
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"


def test_another_agents_key_is_never_shown(client, billing):
    assert post_action_in_process(client, KEY, refund_body()).status_code == 201
    make_agent_on(client, "support")
    response = post_action_in_process(client, KEY, refund_body())
    assert response.status_code == 422
    assert response.json()["code"] == "idempotency_key_reused"
    assert "ORD-8841" not in response.content.decode().replace(KEY, "")


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises writers: nothing to skip there")
def test_a_replay_inside_the_intake_does_not_lock_the_row_a_worker_is_about_to_claim(jobs_to_test_redis):
    """Claims skip locked rows: a replay holding the row would make a drain find nothing."""
    agent, _ = make_agent("billing")
    request = {"agent": agent, "operation_key": KEY, "action_type": "refund", "target": "ORD-8841",
               "customer": "CUST-17", "params": {"amount": "25.00", "currency": "EUR"}}
    action, created = action_request(**request)
    assert created and action.status == "queued"

    def replay():
        assert action_request(**request)[1] is False

    with another_transaction(replay):
        claimed = action_claim_next("host:test")
    assert claimed is not None and claimed.pk == action.pk


def test_a_replay_spelling_a_blank_field_another_way_gets_the_full_answer(client, billing):
    body = {k: v for k, v in refund_body().items() if k != "customer"}
    assert post_action_in_process(client, KEY, body).status_code == 201
    assert post_action_in_process(client, KEY, {**body, "customer": None}).status_code == 200
    response = post_action_in_process(client, KEY, {**body, "customer": False})
    assert response.status_code == 400
    assert "customer" in response.json()["errors"]
