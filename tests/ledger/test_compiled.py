"""Statements compiled once answer exactly what the ORM answers, and the doorbell reuses
one Redis connection."""

from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
import redis
from django.db import DataError, close_old_connections, connection, transaction
from django.db.models import Subquery
from django.db.transaction import TransactionManagementError

from ledger.compiled import Compiled, insert, update
from ledger.jobs import ring
from ledger.models import Action, Agent, AuditEvent
from tests.factories import make_agent, new_action

pytestmark = pytest.mark.django_db


def an_action(agent, key, **fields):
    return new_action(agent, "cancelled", key=key, target=f"ORD-{key}", customer="CUST-1", amount="25.50",
                      params={"amount": "25.50", "currency": "EUR", "nested": {"a": [1, 2]}}, **fields)


def field_values(obj):
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_insert_writes_what_save_writes():
    agent, _ = make_agent("billing")
    saved = an_action(agent, "by-save")
    saved.save(force_insert=True)
    inserted = insert(an_action(agent, "by-insert"))

    assert inserted.pk is not None and not inserted._state.adding
    a, b = (field_values(Action.objects.get(pk=x.pk)) for x in (saved, inserted))
    differs = {k for k in a if a[k] != b[k]}
    assert differs == {"id", "operation_key", "target", "created_at", "updated_at"}


def test_a_compiled_lookup_returns_the_instances_the_orm_returns():
    agent, _ = make_agent("billing")
    for key in ("k1", "k2", "k3"):
        insert(an_action(agent, key))
    by_key = Compiled(lambda key: Action.objects.filter(operation_key=key))
    by_target_or_key = Compiled(lambda key, target: Action.objects.filter(operation_key=key) | Action.objects.filter(
        target=target).order_by("id"))

    found = by_key.first("k2")
    assert field_values(found) == field_values(Action.objects.get(operation_key="k2"))
    assert isinstance(found.amount, Decimal) and found.params["nested"] == {"a": [1, 2]}
    assert by_key.first("k9") is None
    assert [a.operation_key for a in by_target_or_key.all("k1", "ORD-k3")] == ["k1", "k3"]
    # The values are bound, never spliced into the SQL.
    assert by_key.first("k1' OR '1'='1") is None


def test_annotations_become_attributes_as_the_orm_sets_them():
    agent, _ = make_agent("billing")
    insert(an_action(agent, "k1"))
    with_key = Compiled(lambda name, key: Agent.objects.filter(name=name).only("name").annotate(
        key_action_id=Subquery(Action.objects.filter(operation_key=key).values("pk")[:1])))

    found = with_key.first("billing", "k1")
    assert found == agent and found.name == "billing"
    assert found.key_action_id == Action.objects.get(operation_key="k1").pk
    assert with_key.first("billing", "k9").key_action_id is None


def test_compiled_values_of_other_types_and_constants_of_the_same_type_are_kept_apart():
    agent, _ = make_agent("billing")
    action = insert(an_action(agent, "k1", attempts=3))
    insert(an_action(agent, "k2", attempts=2))
    by_pk_and_attempts = Compiled(lambda pk, since: Action.objects.filter(pk=pk, attempts=3, created_at__gte=since),
                                  int, datetime)

    assert by_pk_and_attempts.first(action.pk, action.created_at).operation_key == "k1"
    assert by_pk_and_attempts.first(action.pk, action.created_at + timedelta(seconds=1)) is None
    assert by_pk_and_attempts.first(action.pk + 1, action.created_at) is None


def test_update_writes_only_the_fields_named_and_only_while_the_condition_holds():
    agent, _ = make_agent("billing")
    action = insert(an_action(agent, "k1", fence=4))
    action.status, action.error, action.target = "failed", {"code": "x"}, "ORD-elsewhere"

    assert update(action, ["status", "error"], fence=3) == 0
    assert Action.objects.get(pk=action.pk).status == "cancelled"
    assert update(action, ["status", "error"], fence=4) == 1
    stored = Action.objects.get(pk=action.pk)
    assert (stored.status, stored.error, stored.target) == ("failed", {"code": "x"}, "ORD-k1")


def test_an_update_inserts_its_companion_only_if_it_writes_and_as_insert_would():
    agent, _ = make_agent("billing")
    action = insert(an_action(agent, "k1", fence=4))
    action.status = "failed"
    with transaction.atomic():
        refused = AuditEvent.objects.event(actor=agent, verb="failed", obj=action, before=None, after={"a": [1]})
        assert update(action, ["status"], and_insert=refused, fence=3) == 0
        assert refused.pk is None
        written = AuditEvent.objects.event(actor=agent, verb="failed", obj=action, before=None, after={"a": [1]})
        assert update(action, ["status"], and_insert=written, fence=4) == 1
    assert not written._state.adding
    stored = AuditEvent.objects.get(verb="failed")
    assert stored.pk == written.pk
    assert {k: v for k, v in field_values(stored).items() if k != "id"} == {
        k: v for k, v in field_values(written).items() if k != "id"}
    assert (stored.before, stored.after) == (None, {"a": [1]})  # SQL NULL, and JSON
    assert Action.objects.get(pk=action.pk).status == "failed"


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps text of any length")
def test_a_companion_value_too_long_for_its_column_is_refused_not_cut_short():
    agent, _ = make_agent("billing")
    action = insert(an_action(agent, "k1"))
    action.status = "failed"
    with pytest.raises(DataError), transaction.atomic():
        event = AuditEvent.objects.event(actor=agent, verb="x" * 51, obj=action, after={})
        update(action, ["status"], and_insert=event)
    assert not AuditEvent.objects.history(action).exists()
    assert Action.objects.get(pk=action.pk).status == "cancelled"


def test_a_compiled_lookup_refuses_what_it_cannot_build():
    with pytest.raises(ValueError):
        Compiled(lambda key: Action.objects.select_related("task").filter(operation_key=key)).first("k")


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite empties such a test's database with DELETE")
def test_a_compiled_locking_read_needs_a_transaction_every_time():
    locked = Compiled(lambda key: Action.objects.select_for_update().filter(operation_key=key))
    with transaction.atomic():
        assert locked.first("k") is None
    with pytest.raises(TransactionManagementError):
        locked.first("k")


def test_the_audit_entry_point_still_chains_events():
    agent, _ = make_agent("billing")
    action = insert(an_action(agent, "k1"))
    with transaction.atomic():
        AuditEvent.objects.record(actor=agent, verb="requested", obj=action, after={"status": "cancelled"})
    assert AuditEvent.objects.seal() == AuditEvent.objects.count() > 0
    assert AuditEvent.objects.verify_chain() is None
    assert AuditEvent.objects.history(action).get().after == {"status": "cancelled"}


@pytest.mark.django_db(transaction=True)  # django-rq enqueues at commit
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite empties such a test's database with DELETE")
def test_ringing_reuses_one_redis_connection(jobs_to_test_redis, settings):
    client = redis.Redis.from_url(settings.RQ_QUEUES["default"]["URL"])
    db = client.connection_pool.connection_kwargs["db"]

    def connections_to_this_db():
        return sum(1 for c in client.client_list() if int(c["db"]) == db)

    ring("actions")  # the first ring connects
    before, queued = connections_to_this_db(), client.llen("rq:queue:default")
    for _ in range(30):
        client.delete("surety:doorbell:actions")  # so that each ring enqueues a job
        ring("actions")
    assert connections_to_this_db() == before
    assert client.llen("rq:queue:default") == queued + 30


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's prepared statements and backends")
@pytest.mark.django_db(transaction=True)
def test_a_connection_the_database_dropped_is_replaced_and_its_statements_prepared_again():
    agent, _ = make_agent("billing")
    insert(an_action(agent, "k1"))
    by_key = Compiled(lambda key: Action.objects.filter(operation_key=key))

    def run_and_look():
        """Run the lookup past psycopg's prepare threshold; this backend's pid and how many
        statements of the lookup it holds prepared."""
        assert [by_key.first("k1").operation_key for _ in range(3)] == ["k1"] * 3
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                           ["%ledger_action%operation_key%"])
            return cursor.fetchone()

    first_backend, prepared = run_and_look()
    assert prepared == 1
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"], port=s["PORT"], user=s["USER"], dbname=s["NAME"], autocommit=True) as other:
        assert other.execute("SELECT pg_terminate_backend(%s, 5000)", [first_backend]).fetchone() == (True,)
    close_old_connections()  # as at the end of a request: the next one checks the connection first

    second_backend, prepared = run_and_look()
    assert second_backend != first_backend and prepared == 1
