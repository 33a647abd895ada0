"""The key's lifetime, published and kept, through the HTTP API of a live server (gunicorn on
the test database; no worker runs, so nothing is executed): every answer about an action or
task says when its key expires; within the lifetime the replay holds; after it, and once the
action is archived, any request under the key is `410 operation_key_expired` and nothing is
recorded again."""

from datetime import datetime, timedelta

import httpx
import pytest
from django.conf import settings
from django.db import IntegrityError, transaction

from ledger.models import Action, ArchivedKey, ArchivedTask, AuditEvent, Task
from ledger.retention import rfc3339
from tests.factories import (agent_api, make_action, make_agent_on, message_body, post_action, post_action_in_process,
                             post_task, refund_body, refund_task_body)

KEY = "refund:ORD-8841:dec-77"
HEADER = "Idempotency-Key-Expires"


def expires(response):
    return datetime.fromisoformat(response.headers[HEADER])


def lifetime():
    return timedelta(days=settings.OPERATION_KEY_LIFETIME_DAYS)


def assert_expired(response):
    assert response.status_code == 410, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    assert response.json()["code"] == "operation_key_expired"


def age(model, days, **where):
    model.objects.filter(**where).update(created_at=model.objects.get(**where).created_at - timedelta(days=days))


@pytest.fixture
def api(stack):
    with agent_api(stack.url) as client:
        yield client


def test_every_answer_about_an_action_says_when_its_key_expires(api):
    first = post_action(api, KEY, refund_body())
    assert first.status_code == 201
    action = Action.objects.get(operation_key=KEY)
    expected = (action.created_at + lifetime()).replace(microsecond=0)
    assert expires(first) == expected

    again = post_action(api, KEY, refund_body())
    read = api.get(f"/api/v1/actions/{KEY}")
    evidence = api.get(f"/api/v1/actions/{KEY}/evidence")
    assert (again.status_code, again.headers["Idempotent-Replayed"]) == (200, "true")
    assert evidence.status_code == 200
    assert expires(again) == expires(read) == expires(evidence) == expected
    assert read.headers[HEADER].endswith("Z")


def test_after_the_lifetime_the_key_answers_410_and_nothing_is_recorded(api):
    assert post_action(api, KEY, refund_body()).status_code == 201
    age(Action, settings.OPERATION_KEY_LIFETIME_DAYS - 1, operation_key=KEY)
    assert post_action(api, KEY, refund_body()).status_code == 200  # a day left: the replay holds
    age(Action, 2, operation_key=KEY)
    events = AuditEvent.objects.count()

    assert_expired(post_action(api, KEY, refund_body()))
    assert_expired(post_action(api, KEY, refund_body(amount="30.00")))  # not 422: the key names nothing now

    assert Action.objects.count() == 1
    assert AuditEvent.objects.count() == events
    read = api.get(f"/api/v1/actions/{KEY}")  # still in the ledger until it is archived: readable
    assert read.status_code == 200
    assert expires(read) < datetime.now(tz=expires(read).tzinfo)


def test_another_agents_expired_key_is_still_refused_as_theirs(api, stack):
    assert post_action(api, KEY, refund_body()).status_code == 201
    age(Action, settings.OPERATION_KEY_LIFETIME_DAYS + 1, operation_key=KEY)
    with agent_api(stack.url, name="other") as other:
        answer = post_action(other, KEY, refund_body())
    assert (answer.status_code, answer.json()["code"]) == (422, "idempotency_key_reused")


def test_a_tasks_key_has_the_same_lifetime(api):
    first = post_task(api, "task-1", refund_task_body())
    assert first.status_code == 201
    task = Task.objects.get(task_id="task-1")
    assert expires(first) == (task.created_at + lifetime()).replace(microsecond=0)
    assert expires(api.get("/api/v1/tasks/task-1")) == expires(first)

    age(Task, settings.OPERATION_KEY_LIFETIME_DAYS + 1, task_id="task-1")
    assert_expired(post_task(api, "task-1", refund_task_body()))
    # Whatever the body, archived or not (a body the intake would refuse as it stands):
    assert_expired(post_task(api, "task-1", {"workflow": "refund"}))
    assert_expired(post_task(api, "task-1", {"workflow": "no-such-workflow", "input": {}}))
    assert Task.objects.count() == 1


def test_an_archived_key_answers_410_and_is_never_recorded_again(api):
    """What archive_expired leaves of an action: its ArchivedKey (made here by hand; the
    command's own tests archive for real)."""
    created = datetime.now().astimezone() - lifetime() - timedelta(days=3)
    ArchivedKey.objects.create(operation_key=KEY, agent=api.agent, created_at=created, archive_sha256="0" * 64)

    assert_expired(post_action(api, KEY, refund_body()))
    assert_expired(api.get(f"/api/v1/actions/{KEY}"))
    assert_expired(api.get(f"/api/v1/actions/{KEY}/evidence"))
    assert not Action.objects.exists()
    # The database holds the rule, whatever code inserts.
    with pytest.raises(IntegrityError, match="operation_key_archived"), transaction.atomic():
        make_action(api.agent, "queued", key=KEY)


def test_the_document_publishes_the_lifetime_and_the_410(stack):
    document = httpx.get(f"{stack.url}/api/v1/schema", params={"format": "json"}).json()
    for path, read in (("/api/v1/actions", "/api/v1/actions/{operation_key}"), ("/api/v1/tasks", "/api/v1/tasks/{task_id}")):
        create = document["paths"][path]["post"]
        assert f"{settings.OPERATION_KEY_LIFETIME_DAYS} days" in create["description"]
        for status in ("201", "200"):
            assert HEADER in create["responses"][status]["headers"]
        assert "operation_key_expired" in create["responses"]["410"]["description"]
        assert HEADER in document["paths"][read]["get"]["responses"]["200"]["headers"]
    assert HEADER in document["paths"]["/api/v1/actions/{operation_key}/evidence"]["get"]["responses"]["200"]["headers"]
    assert "410" in document["paths"]["/api/v1/actions/{operation_key}"]["get"]["responses"]


def test_an_archived_key_answers_410_whatever_the_body(stack):
    """Refused before the intake (its body, its grant) or not, a request under an archived key
    is told the key is spent: a retry with a mangled body must not read as a request to fix."""
    created = datetime.now().astimezone() - lifetime() - timedelta(days=3)
    with agent_api(stack.url, name="refunds-only", grants=("refund",)) as api:
        ArchivedKey.objects.create(operation_key=KEY, agent=api.agent, created_at=created, archive_sha256="0" * 64)
        ArchivedTask.objects.create(task_id="task-1", agent=api.agent, created_at=created, archive_sha256="0" * 64)

        assert_expired(post_action(api, KEY, {"action_type": "refund"}))  # invalid: no target, no params
        assert_expired(post_action(api, KEY, message_body()))  # not granted: 403 under a new key
        assert post_action(api, "message:ada:dec-1", message_body()).status_code == 403
        assert_expired(post_task(api, "task-1", {"workflow": "refund"}))  # invalid: no input
        assert post_task(api, "task-2", {"workflow": "refund"}).status_code == 400
    assert not Action.objects.exists() and not Task.objects.exists()


def test_another_agents_archived_key_tells_nothing_of_it(api, stack):
    """Decision 42: another agent's key is `422`, expired or not, archived or not; the `410`
    would say that the key was used, and until when."""
    created = datetime.now().astimezone() - lifetime() - timedelta(days=3)
    ArchivedKey.objects.create(operation_key=KEY, agent=api.agent, created_at=created, archive_sha256="0" * 64)
    ArchivedTask.objects.create(task_id="task-1", agent=api.agent, created_at=created, archive_sha256="0" * 64)
    with agent_api(stack.url, name="other") as other:
        for answer in (post_action(other, KEY, refund_body()), post_task(other, "task-1", refund_task_body()),
                       post_action(other, KEY, {"action_type": "refund"})):
            assert (answer.status_code, answer.json()["code"]) in {(422, "idempotency_key_reused"), (400, "invalid")}
            assert rfc3339(created + lifetime()) not in answer.text
        assert other.get(f"/api/v1/actions/{KEY}").status_code == 404
    assert not Action.objects.exists() and not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("key, first, again, status", [
    ("refund:operation_key_archived:dec-1", refund_body(), refund_body(amount="30.00"), 422),
    ("refund:operation_key_archived:dec-2", refund_body(), refund_body(amount="25"), 200),
])
def test_a_key_that_reads_like_the_archive_rule_is_a_key_like_any_other(client, key, first, again, status):
    """The database's rule for archived keys raises a message of its own; a unique violation
    quotes the key it refused, and a key may hold the same words: a 500 once."""
    make_agent_on(client)
    assert post_action_in_process(client, key, first).status_code == 201
    assert post_action_in_process(client, key, again).status_code == status
    body = refund_body(decision="operation_key_archived")
    assert post_action_in_process(client, "refund:A:1", body).status_code == 201
    assert post_action_in_process(client, "refund:A:2", body).status_code == 200  # the same refund, its first key
    assert Action.objects.count() == 2
