"""The ledger on two databases split by customer (sharding/router.py, docs/scale.md).

Two whole Surety deployments, each a gunicorn server on a PostgreSQL database of its own with a
Redis server and RQ workers of its own, stand behind the router (gunicorn too) and its directory
(a third database). The agent and its grants are the same on both, as the reference data of a
sharded deployment is: the second database is a copy of the first made once the agent was made.
Everything goes over real HTTP, and each assertion on placement reads the shards' own tables.
"""

import http.client
import io
import json
import os
import subprocess
import uuid
from collections import Counter
from contextlib import ExitStack
from types import SimpleNamespace
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from sharding.router import Router, hashed_shard, place, take_back
from tests.conftest import PYTHON, ROOT, OwnRedis, _database_url, _kill, _wait_for_http, free_port, serving, wait_until
from tests.factories import api_client, message_body, post_action, post_task, refund_body, refund_task_body, sandbox_list, \
    sandbox_order, send_together

pytestmark = pytest.mark.stack

MAKE_AGENT = """import django; django.setup()
from tests.factories import make_agent
print(make_agent("billing")[1])"""


def customer_on(shard, name):
    """A customer `name-N` whose hash places it on `shard` (of two)."""
    return next(f"{name}-{i}" for i in range(100) if hashed_shard(f"customer:{name}-{i}", 2) == shard)


@pytest.fixture(scope="module")
def shards(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        base, test_database = connection.settings_dict["NAME"], _database_url()
    server = test_database.rsplit("/", 1)[0]
    names = [f"{base}_shard0", f"{base}_shard1", f"{base}_directory"]
    urls = [f"{server}/{name}" for name in names]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin, ExitStack() as running:
        def create(name, template=None):
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)) if template is None else
                          sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template)))
            running.callback(admin.execute, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

        create(names[0])
        env = {"DATABASE_URL": urls[0], "DJANGO_SETTINGS_MODULE": "tests.settings"}
        subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env={**os.environ, **env}, check=True)
        token = subprocess.run([PYTHON, "-c", MAKE_AGENT], cwd=ROOT, env={**os.environ, **env}, check=True,
                               capture_output=True, text=True).stdout.split()[-1]
        create(names[1], template=names[0])
        create(names[2])

        stacks = []
        for url in urls[:2]:
            redis_server = OwnRedis()
            redis_server.start()
            running.callback(redis_server.stop)
            # Few threads: the suite's other workers run stacks of their own on the same server,
            # and each thread holds a connection (max_connections is 100).
            stacks.append(running.enter_context(serving(url, workers=1, threads=6, REDIS_URL=redis_server.url)))
            stacks[-1].database_url = url
        port = free_port()
        router = subprocess.Popen(
            [PYTHON, "-m", "gunicorn", "sharding.router:app", "-b", f"127.0.0.1:{port}", "-k", "gthread",
             "--threads", "6", "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, "SHARD_URLS": ",".join(s.url for s in stacks), "SHARD_DIRECTORY_URL": urls[2]},
            start_new_session=True)
        running.callback(_kill, router)
        router_url = f"http://127.0.0.1:{port}"
        _wait_for_http(f"{router_url}/api/v1/schema")
        yield SimpleNamespace(url=router_url, token=token, stacks=stacks, directory=urls[2],
                              client=api_client(router_url, token))


def keys_on(stack):
    with psycopg.connect(stack.database_url) as conn:
        return {key for (key,) in conn.execute("SELECT operation_key FROM ledger_action")}


def archive(stack, key):
    """`key` as an archive run leaves it on `stack`: its action moved out, an ArchivedKey in its place."""
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("INSERT INTO ledger_archivedkey (agent_id, created_at, archived_at, archive_sha256, "
                     "operation_key) SELECT id, now() - interval '400 days', now(), repeat('0', 64), %s "
                     "FROM ledger_agent WHERE name = 'billing'", [key])


def placed(shards, name):
    with psycopg.connect(shards.directory) as conn:
        row = conn.execute("SELECT shard FROM shard_placement WHERE name = %s", [name]).fetchone()
    return row and row[0]


@pytest.fixture
def workers(shards):
    """A worker on each shard for this test only: the others keep what they post in flight."""
    for stack in shards.stacks:
        stack.start_worker()
    yield
    for stack in shards.stacks:
        stack.stop_workers()


def succeeded(client, key):
    return wait_until(lambda: (a := client.get(f"/api/v1/actions/{key}").json())["status"] == "succeeded" and a,
                      message=f"{key} to succeed")


def test_each_customers_actions_go_to_its_shard_run_there_once_and_are_read_back_through_the_router(
        shards, workers):
    client, (zero, one) = shards.client, shards.stacks
    # Three customers: two actions of one customer at once would hold each other for a person.
    ada, amy, bob = customer_on(0, "ADA"), customer_on(0, "AMY"), customer_on(1, "BOB")
    posts = {"refund:ORD-A1:full:dec-1": refund_body("ORD-A1", customer=ada, decision="dec-1"),
             "refund:ORD-A2:full:dec-1": refund_body("ORD-A2", customer=amy, decision="dec-1"),
             "refund:ORD-B1:full:dec-1": refund_body("ORD-B1", customer=bob, decision="dec-1")}

    answers = {key: post_action(client, key, body) for key, body in posts.items()}

    assert {key: (a.status_code, a.headers["Surety-Shard"]) for key, a in answers.items()} == {
        "refund:ORD-A1:full:dec-1": (201, "0"), "refund:ORD-A2:full:dec-1": (201, "0"),
        "refund:ORD-B1:full:dec-1": (201, "1")}
    assert keys_on(zero) >= {"refund:ORD-A1:full:dec-1", "refund:ORD-A2:full:dec-1"}
    assert "refund:ORD-B1:full:dec-1" not in keys_on(zero)
    assert "refund:ORD-B1:full:dec-1" in keys_on(one)
    assert not keys_on(one) & {"refund:ORD-A1:full:dec-1", "refund:ORD-A2:full:dec-1"}
    for key, stack in (("refund:ORD-A1:full:dec-1", zero), ("refund:ORD-A2:full:dec-1", zero),
                       ("refund:ORD-B1:full:dec-1", one)):
        done = succeeded(client, key)
        refunds = sandbox_list(api_client(stack.url, shards.token), "refunds", operation_key=key)
        assert [r["id"] for r in refunds] == [done["external_ref"]]

    replay = post_action(client, "refund:ORD-B1:full:dec-1", posts["refund:ORD-B1:full:dec-1"])
    assert (replay.status_code, replay.headers["Idempotent-Replayed"], replay.headers["Surety-Shard"]) == (200, "true", "1")
    assert replay.json()["status"] == "succeeded"
    evidence = client.get("/api/v1/actions/refund%3AORD-B1%3Afull%3Adec-1/evidence")
    assert (evidence.status_code, evidence.headers["Surety-Shard"]) == (200, "1"), evidence.text


def test_a_key_reused_with_another_customers_body_is_answered_on_the_keys_shard(shards):
    client, (zero, one) = shards.client, shards.stacks
    cleo, dan, eli = customer_on(0, "CLEO"), customer_on(1, "DAN"), customer_on(1, "ELI")
    assert post_action(client, "refund:ORD-L1:full:dec-2", refund_body("ORD-L1", customer=eli,
                                                                       decision="dec-2")).status_code == 201
    key = "refund:ORD-C1:full:dec-2"

    first = post_action(client, key, refund_body("ORD-C1", customer=cleo, decision="dec-2"))
    reused = post_action(client, key, refund_body("ORD-D1", customer=dan, decision="dec-2"))
    reused_by_a_placed_customer = post_action(client, key, refund_body("ORD-D2", customer=eli, decision="dec-2"))

    assert first.status_code == 201
    assert (reused.status_code, reused.json()["code"], reused.headers["Surety-Shard"]) == (
        422, "idempotency_key_reused", "0")
    # eli's actions are on shard 1, but the key's action is on shard 0: that shard answers the reuse,
    # and can record nothing under the key.
    assert (reused_by_a_placed_customer.status_code, reused_by_a_placed_customer.json()["code"],
            reused_by_a_placed_customer.headers["Surety-Shard"]) == (422, "idempotency_key_reused", "0")
    assert key in keys_on(zero) and key not in keys_on(one)
    # The shard refused the reuse: nothing it named was placed. dan and his order go by their hash.
    assert placed(shards, f"customer:{dan}") is None and placed(shards, "target:ORD-D1") is None


def test_what_a_shard_refuses_places_nothing_so_a_retry_goes_where_its_customer_is(shards):
    client, (zero, one) = shards.client, shards.stacks
    kay = customer_on(1, "KAY")
    assert post_action(client, "refund:ORD-K1:full:dec-8", refund_body("ORD-K1", customer=kay,
                                                                       decision="dec-8")).status_code == 201
    key, body = "refund:ORD-K2:full:dec-8", refund_body("ORD-K2", customer=kay, decision="dec-8")

    unauthenticated = api_client(shards.url, "sur_not-a-token").post(
        "/api/v1/actions", json=refund_body("ORD-M1", customer=customer_on(0, "MIA")),
        headers={"Idempotency-Key": "refund:ORD-M1:full:dec-8"})
    not_json = client.post("/api/v1/actions", content=b"{not json", headers={
        "Idempotency-Key": key, "Content-Type": "application/json"})
    invalid = post_action(client, key, refund_body("ORD-K2", "-5.00", customer=kay, decision="dec-8"))
    retried = post_action(client, key, body)

    assert unauthenticated.status_code == 401
    assert placed(shards, "action:refund:ORD-M1:full:dec-8") is None and placed(shards, "target:ORD-M1") is None
    assert (not_json.status_code, not_json.headers["Surety-Shard"]) == (400, "0")
    assert (invalid.status_code, invalid.headers["Surety-Shard"]) == (400, "1")
    # Neither pinned the key: the retry goes to kay's shard, where her first refund holds it.
    assert (retried.status_code, retried.headers["Surety-Shard"], retried.json()["status"]) == (201, "1", "held")
    assert key in keys_on(one) and key not in keys_on(zero)


def test_subjects_are_placed_as_the_shard_stores_them(shards):
    """The shard's serializer strips whitespace and takes a whole number as its digits: the same
    order or customer written so must reach the same shard."""
    client = shards.client
    # A customer on shard 0 whose name as written, padded, would hash to shard 1.
    nia = next(f"NIA-{i}" for i in range(200) if hashed_shard(f"customer:NIA-{i}", 2) == 0
               and hashed_shard(f"customer: NIA-{i}", 2) == 1)
    number = next(n for n in range(100, 200) if hashed_shard(f"customer:{n}", 2) == 1)
    assert post_action(client, "refund:ORD-Q1:full:dec-9", refund_body("ORD-Q1", customer=nia,
                                                                       decision="dec-9")).status_code == 201

    padded = post_action(client, "refund:ORD-Q2:full:dec-10", refund_body(" ORD-Q2 ", customer=f" {nia}",
                                                                          decision="dec-10"))
    as_number = post_action(client, "refund:ORD-R1:full:dec-9", refund_body("ORD-R1", customer=number,
                                                                            decision="dec-9"))
    as_text = post_action(client, "refund:ORD-R2:full:dec-9", refund_body("ORD-R2", customer=f"{number} ",
                                                                          decision="dec-9"))

    assert (padded.status_code, padded.headers["Surety-Shard"], padded.json()["status"]) == (201, "0", "held")
    assert (as_number.status_code, as_number.headers["Surety-Shard"]) == (201, "1")
    assert (as_text.status_code, as_text.headers["Surety-Shard"], as_text.json()["status"]) == (201, "1", "held")


def test_an_email_recipients_domain_spelled_otherwise_is_placed_as_one_recipient(shards):
    """The API stores an e-mail address with its domain in lower case: the same recipient with
    its domain written otherwise, whose hash as written says the other shard, reaches the first
    message's shard, where the one message per recipient and decision answers it as that one."""
    client, one = shards.client, shards.stacks[1]
    name = next(f"ivy{i}" for i in range(200) if hashed_shard(f"target:ivy{i}@mail.example", 2) == 0
                and hashed_shard(f"target:ivy{i}@Mail.EXAMPLE", 2) == 1)
    first = post_action(client, f"message:{name}:receipt:dec-1", message_body(f"{name}@mail.example"))
    again = post_action(client, f"message:{name}:receipt:dec-1:again", message_body(f"{name}@Mail.EXAMPLE"))

    assert (first.status_code, first.headers["Surety-Shard"]) == (201, "0")
    assert (again.status_code, again.headers["Surety-Shard"], again.json()["operation_key"]) == (
        200, "0", f"message:{name}:receipt:dec-1")
    assert not keys_on(one) & {f"message:{name}:receipt:dec-1", f"message:{name}:receipt:dec-1:again"}


def test_an_action_on_a_placed_target_goes_to_the_targets_shard_where_the_same_subject_hold_sees_it(shards):
    """No worker runs: the first refund stays queued, in flight, so the second, on the same order
    for a customer whose hash says the other shard, must be held, as on one database."""
    client, (zero, one) = shards.client, shards.stacks
    eve, fay = customer_on(0, "EVE"), customer_on(1, "FAY")

    first = post_action(client, "refund:ORD-E1:full:dec-3", refund_body("ORD-E1", customer=eve, decision="dec-3"))
    second = post_action(client, "refund:ORD-E1:part:dec-4", refund_body("ORD-E1", "5.00", customer=fay, decision="dec-4"))
    later = post_action(client, "refund:ORD-F9:full:dec-3", refund_body("ORD-F9", customer=fay, decision="dec-3"))

    assert (first.status_code, first.json()["status"], first.headers["Surety-Shard"]) == (201, "queued", "0")
    assert (second.status_code, second.json()["status"], second.headers["Surety-Shard"]) == (201, "held", "0")
    # fay was placed with the order: her next action goes where her held one is, not by her hash.
    assert (later.status_code, later.json()["status"], later.headers["Surety-Shard"]) == (201, "held", "0")
    assert not keys_on(one) & {"refund:ORD-E1:full:dec-3", "refund:ORD-E1:part:dec-4", "refund:ORD-F9:full:dec-3"}


def test_a_request_whose_customer_and_target_are_on_two_shards_is_refused_and_records_nothing(shards):
    client, (zero, one) = shards.client, shards.stacks
    gus, hal = customer_on(0, "GUS"), customer_on(1, "HAL")
    assert post_action(client, "refund:ORD-G1:full:dec-5", refund_body("ORD-G1", customer=gus, decision="dec-5")).status_code == 201
    assert post_action(client, "refund:ORD-H1:full:dec-5", refund_body("ORD-H1", customer=hal, decision="dec-5")).status_code == 201

    refused = post_action(client, "refund:ORD-G1:full:dec-6", refund_body("ORD-G1", customer=hal, decision="dec-6"))

    assert refused.status_code == 409
    assert refused.headers["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "shard_conflict"
    assert "refund:ORD-G1:full:dec-6" not in keys_on(zero) | keys_on(one)
    assert placed(shards, "action:refund:ORD-G1:full:dec-6") is None
    # The same key with a body the ledger can keep together is then taken as a new one.
    retried = post_action(client, "refund:ORD-G1:full:dec-6", refund_body("ORD-G1", customer=gus, decision="dec-6"))
    assert (retried.status_code, retried.headers["Surety-Shard"]) == (201, "0")


def test_many_requests_at_once_for_a_new_customer_place_it_once_and_one_key_makes_one_action(shards):
    ivy = customer_on(1, "IVY")
    sends = [lambda c, i=i: post_action(c, f"refund:ORD-I{i}:full:dec-7", refund_body(f"ORD-I{i}", customer=ivy,
                                                                                         decision="dec-7"))
             for i in range(12)]
    sends += [lambda c: post_action(c, "refund:ORD-I0:full:dec-7", refund_body("ORD-I0", customer=ivy, decision="dec-7"))] * 8

    answers = send_together(shards.url, shards.token, sends)

    assert {a.headers["Surety-Shard"] for a in answers} == {"1"}, [a.text for a in answers if a.status_code >= 400]
    assert Counter(a.status_code for a in answers) == {201: 12, 200: 8}
    assert {f"refund:ORD-I{i}:full:dec-7" for i in range(12)} <= keys_on(shards.stacks[1])


def test_a_customer_contested_between_two_shards_at_once_ends_on_one(shards):
    """Half the requests name an order placed on shard 0 with a new customer whose hash says 1;
    the other half name that customer with new orders. Whichever places the customer first, every
    request the router lets through reaches that shard, and the rest are refused."""
    client = shards.client
    assert post_action(client, "refund:ORD-P0:full:dec-11", refund_body(
        "ORD-P0", customer=customer_on(0, "PAM"), decision="dec-11")).status_code == 201
    for round_no in range(3):
        new = customer_on(1, f"PIA{round_no}")
        sends = [lambda c, i=i: post_action(c, f"refund:ORD-P0:{new}:{i}", refund_body(
                     "ORD-P0", "1.00", customer=new, decision=f"dec-{new}-{i}")) for i in range(6)]
        sends += [lambda c, i=i: post_action(c, f"refund:ORD-P{round_no}{i}:full:{new}", refund_body(
                      f"ORD-P{round_no}{i}", customer=new, decision="dec-11")) for i in range(1, 7)]

        answers = send_together(shards.url, shards.token, sends)

        through = {a.headers["Surety-Shard"] for a in answers if a.status_code != 409}
        assert set(Counter(a.status_code for a in answers)) <= {201, 409}, [a.text for a in answers]
        assert len(through) == 1 and through == {str(placed(shards, f"customer:{new}"))}, through


def test_a_task_runs_on_its_customers_shard_and_is_read_back_through_the_router(shards, workers):
    client, (zero, one) = shards.client, shards.stacks
    jo = customer_on(1, "JO")
    sandbox_order(api_client(one.url, shards.token), "ORD-J1", jo)

    started = post_task(client, "refund-J1", refund_task_body("ORD-J1", customer=jo))
    done = wait_until(lambda: (t := client.get("/api/v1/tasks/refund-J1", params={"wait": 5}).json())["state"]
                      == "succeeded" and t, seconds=30, message="the task to succeed")

    assert (started.status_code, started.headers["Surety-Shard"]) == (201, "1")
    assert [r["order_id"] for r in sandbox_list(api_client(one.url, shards.token), "refunds", order_id="ORD-J1")] == ["ORD-J1"]
    # The step's action was made by shard 1's worker: its key goes by its task's id.
    step_key = done["steps"]["call_refund_api"]["idempotency_key"]
    step = client.get(f"/api/v1/actions/{quote(step_key, safe='')}")
    assert (step.status_code, step.headers["Surety-Shard"], step.json()["status"]) == (200, "1", "succeeded")


def test_what_surety_refuses_the_router_passes_to_shard_zero_unplaced_and_it_answers_as_one_surety(shards):
    client = shards.client
    nested = b'{"target": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"

    answers = [
        post_action(client, "refund:ORD-N1:full:dec-1", refund_body("ORD-N1", customer="NUL\x00")),
        post_action(client, "refund:ORD-N2:full:dec-1", refund_body("ORD-N2", customer="C" * 256)),
        post_action(client, "k" * 256, refund_body("ORD-N3", customer="CUST-N3")),
        client.post("/api/v1/actions", content=nested, headers={"Idempotency-Key": "refund:ORD-N4",
                                                                "Content-Type": "application/json"}),
    ]

    assert [(a.status_code, a.headers["Content-Type"], a.headers["Surety-Shard"]) for a in answers] == [
        (400, "application/problem+json", "0")] * 4, [a.text[:200] for a in answers]
    with psycopg.connect(shards.directory) as conn:
        assert conn.execute("SELECT name FROM shard_placement WHERE name LIKE '%%ORD-N%%' "
                            "OR name LIKE 'customer:C%%' AND length(name) > 200").fetchall() == []


def chunked(body):
    """`body` as an iterator: httpx sends it chunked, with no Content-Length."""
    return iter([body[i:i + 1024] for i in range(0, len(body), 1024)])


def test_a_body_sent_chunked_is_routed_and_recorded_as_the_same_body_with_its_length(shards):
    """gunicorn de-chunks it and says where it ends: the router reads it as config/wsgi.py reads
    one for the shards (it read CONTENT_LENGTH bytes, none: the shard was sent an empty body),
    and refuses one past the API's 64 KiB as it refuses it with its length."""
    client, (zero, one) = shards.client, shards.stacks
    key = "refund:ORD-CH1:full:dec-1"
    body = json.dumps(refund_body("ORD-CH1", customer=customer_on(1, "CHUCK"))).encode()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    large = json.dumps({**refund_body("ORD-CH2", customer="CHUCK-X"), "padding": "x" * 70_000}).encode()
    large_headers = {**headers, "Idempotency-Key": "refund:ORD-CH2:full:dec-1"}

    created = client.post("/api/v1/actions", content=chunked(body), headers=headers)
    replayed = client.post("/api/v1/actions", content=body, headers=headers)
    too_large = client.post("/api/v1/actions", content=chunked(large), headers=large_headers)
    too_large_with_length = client.post("/api/v1/actions", content=large, headers=large_headers)

    assert (created.status_code, created.headers["Surety-Shard"]) == (201, "1"), created.text
    assert key in keys_on(one) and key not in keys_on(zero)
    assert (replayed.status_code, replayed.headers["Idempotent-Replayed"]) == (200, "true")
    assert too_large.status_code == 400 and too_large.json() == too_large_with_length.json()


def test_a_malformed_chunk_is_refused_by_the_router_as_by_a_shard(shards):
    address = urlsplit(shards.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    try:
        connection.putrequest("POST", "/api/v1/actions")
        for name, value in {"Transfer-Encoding": "chunked", "Content-Type": "application/json",
                            "Idempotency-Key": "refund:ORD-CH3:full:dec-1"}.items():
            connection.putheader(name, value)
        connection.endheaders()
        connection.send(b"zz\r\n{}\r\n0\r\n\r\n")
        answer = connection.getresponse()
        assert (answer.status, answer.getheader("Content-Type")) == (400, "application/problem+json")
        assert json.loads(answer.read())["title"] == "Unreadable body"
    finally:
        connection.close()


def test_a_key_never_placed_is_answered_404_by_every_shard_and_other_paths_are_not_routed(shards):
    missing = shards.client.get("/api/v1/actions/refund%3ANOPE%2Fslash")
    malformed = [shards.client.get(f"/api/v1/{path}") for path in ("actions/%00", "tasks/caf%C3%A9")]
    console = shards.client.get("/metrics")
    # Paths Django would route to the intake, written so that the router would not see it.
    # (Sent as written: httpx would otherwise resolve the dots itself.)
    disguised = [shards.client.post("/api/v1/actions", json=refund_body("ORD-S1", customer="SAM"), headers={
        "Idempotency-Key": f"refund:ORD-S1:{i}"}, extensions={"target": path}) for i, path in enumerate(
            [b"/api/v1/%61ctions", b"/api/v1/x/../actions", b"/api/v1/./actions"])]

    assert (missing.status_code, missing.headers["Content-Type"]) == (404, "application/problem+json")
    # Keys Surety refuses are not looked up (PostgreSQL's text holds no NUL): shard 0 answers them.
    assert [(a.status_code, a.headers["Surety-Shard"]) for a in malformed] == [(404, "0")] * 2
    assert (console.status_code, console.json()["code"]) == (404, "not_found")
    assert "Surety-Shard" not in console.headers
    assert [(a.status_code, a.json()["code"]) for a in disguised] == [(404, "not_found")] * 3
    assert not {k for k in keys_on(shards.stacks[0]) | keys_on(shards.stacks[1]) if k.startswith("refund:ORD-S1")}


def test_headers_pass_as_their_bytes_and_a_lone_surrogate_is_refused_as_one_surety_refuses_it(shards):
    client = shards.client
    odd_agent = client.post("/api/v1/actions", json=refund_body("ORD-U1", customer=customer_on(0, "UMA")),
                            headers={"Idempotency-Key": "refund:ORD-U1:full:dec-1", "User-Agent": b"caf\xc3\xa9"})
    odd_key = client.post("/api/v1/actions", json=refund_body("ORD-U2", customer="UMA-X"),
                          headers={"Idempotency-Key": b"refund:ORD-\xe9"})
    surrogate = client.post("/api/v1/actions", content=json.dumps(refund_body("ORD-U3", customer="\ud800")),
                            headers={"Idempotency-Key": "refund:ORD-U3:full:dec-1", "Content-Type": "application/json"})

    assert (odd_agent.status_code, odd_agent.headers["Surety-Shard"]) == (201, "0")
    assert (odd_key.status_code, odd_key.json()["code"], odd_key.headers["Surety-Shard"]) == (400, "invalid", "0")
    assert (surrogate.status_code, surrogate.headers["Content-Type"], surrogate.headers["Surety-Shard"]) == (
        400, "application/problem+json", "0")


def test_a_refused_request_takes_back_only_the_placements_no_other_request_leaned_on(shards):
    """The directory's own protocol, on its database: A places a key and a customer; B, for the
    same customer, is routed by A's placement; A is then refused by its shard."""
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(shards.directory, autocommit=True) as conn:
        first = place(conn, "action:k-zoe-1", ["customer:ZOE"], 2, a)
        second = place(conn, "action:k-zoe-2", ["customer:ZOE", "target:ORD-Z2"], 2, b)
        take_back(conn, a)
        left = dict(conn.execute("SELECT name, shard FROM shard_placement WHERE name LIKE %s OR name LIKE %s",
                                 ["%zoe%", "%ZOE%"]).fetchall())

    assert first == second == hashed_shard("customer:ZOE", 2)
    assert left == {"customer:ZOE": first, "action:k-zoe-2": first}
    # The database holds both rules, whoever writes.
    with psycopg.connect(shards.directory, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="never moves"):
            conn.execute("UPDATE shard_placement SET shard = 1 - shard WHERE name = 'customer:ZOE'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="customer:ZOE"):
            conn.execute("DELETE FROM shard_placement WHERE name = 'customer:ZOE'")
        assert conn.execute("DELETE FROM shard_placement WHERE name = 'action:k-zoe-2'").rowcount == 1  # not used


class After:
    """A request's directory connection that runs `step` (another request's) right after its own
    first statement: between place()'s first read and its inserts."""

    def __init__(self, conn, step):
        self.conn, self.step = conn, step

    def transaction(self):
        return self.conn.transaction()

    def execute(self, *args):
        cursor = self.conn.execute(*args)
        step, self.step = self.step, None
        if step:
            step()
        return cursor


def test_a_name_another_request_placed_while_this_one_looked_stays_when_that_request_is_refused(shards):
    """B reads the directory: YAN is not placed. A, for YAN too, places her and is forwarded. B's
    insert of YAN then does nothing, and B is forwarded by A's placement, so B's action is recorded
    on YAN's shard. A's shard then refuses A: its taking back must leave YAN placed."""
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(shards.directory, autocommit=True) as conn_b, \
            psycopg.connect(shards.directory, autocommit=True) as conn_a:
        placing_a = lambda: place(conn_a, "action:k-yan-1", ["customer:YAN", "target:ORD-Y1"], 2, a)  # noqa: E731
        shard_b = place(After(conn_b, placing_a), "action:k-yan-2", ["customer:YAN", "target:ORD-Y2"], 2, b)
        take_back(conn_a, a)
        left = dict(conn_b.execute("SELECT name, shard FROM shard_placement WHERE name = ANY(%s)", [[
            "customer:YAN", "action:k-yan-1", "target:ORD-Y1", "action:k-yan-2", "target:ORD-Y2"]]).fetchall())

    assert left == {"customer:YAN": shard_b, "action:k-yan-2": shard_b, "target:ORD-Y2": shard_b}


def test_a_key_is_read_from_the_shard_that_has_it_while_another_shard_does_not_answer(shards):
    """A router whose shard 0 is an address nothing listens on: a key not placed (one recorded
    straight into a shard) is still found on shard 1."""
    client, one = shards.client, shards.stacks[1]
    key = "refund:ORD-V1:full:dec-1"
    assert post_action(client, key, refund_body("ORD-V1", customer=customer_on(1, "VAL"))).status_code == 201
    router = Router([f"http://127.0.0.1:{free_port()}", one.url], shards.directory)

    def get(key):
        path = f"/api/v1/actions/{quote(key, safe='')}"
        return router.route({"REQUEST_METHOD": "GET", "RAW_URI": path, "PATH_INFO": path, "QUERY_STRING": "",
                             "HTTP_AUTHORIZATION": f"Bearer {shards.token}", "REMOTE_ADDR": "127.0.0.1",
                             "wsgi.input": io.BytesIO()})

    with psycopg.connect(shards.directory, autocommit=True) as conn:  # as if never placed here
        conn.execute("DELETE FROM shard_placement WHERE name = %s", [f"action:{key}"])
    try:
        found, unknown = get(key), get(key + "~v9")
    finally:
        router.directory.close()

    assert (found[0], dict(found[1])["Surety-Shard"]) == (200, "1")
    # Not on shard 1, and shard 0 did not answer: not known, so not "not found".
    assert unknown[0] == 503


def test_a_names_shard_is_the_same_in_every_process_and_release():
    """Not Python's hash(), salted per process: a name placed by one router process must be
    found by every other (8 names: a salted hash agrees on all of them once in 256 runs)."""
    here = [hashed_shard(f"customer:CUST-{i}", 2) for i in range(8)]
    code = "from sharding.router import hashed_shard; print([hashed_shard(f'customer:CUST-{i}', 2) for i in range(8)])"
    there = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert there.strip() == str(here) and set(here) == {0, 1}


def test_a_refund_task_places_its_order_so_a_direct_refund_of_it_goes_to_the_tasks_shard(shards):
    """The task's refund step acts on its input's order: a direct refund of that order must meet
    it on one shard (the one-effect rule and the same-subject hold), whatever its customer's hash."""
    client = shards.client
    ted, tom = customer_on(1, "TED"), customer_on(0, "TOM")

    task = post_task(client, "refund-T1", refund_task_body("ORD-T1", customer=ted))
    direct = post_action(client, "refund:ORD-T1:full:dec-1", refund_body("ORD-T1", customer=tom, decision="dec-1"))

    assert (task.status_code, task.headers["Surety-Shard"]) == (201, "1")
    assert placed(shards, "target:ORD-T1") == 1
    assert (direct.status_code, direct.headers["Surety-Shard"]) == (201, "1")

def test_a_refund_task_whose_workflow_is_written_with_spaces_places_its_order_as_the_shard_records_it(shards):
    """The shard trims the workflow's name (a CharField) and records a refund task: its order must be
    placed with it, or a direct refund of the order with the same decision goes to the other shard
    and the order is refunded twice for one decision."""
    client = shards.client
    tia, toby = customer_on(1, "TIA"), customer_on(0, "TOBY")

    task = post_task(client, "refund-T2", {**refund_task_body("ORD-T2", customer=tia), "workflow": " refund "})
    direct = post_action(client, "refund:ORD-T2:full:dec-1", refund_body("ORD-T2", customer=toby, decision="dec-1"))

    assert (task.status_code, task.headers["Surety-Shard"]) == (201, "1"), task.text
    assert placed(shards, "target:ORD-T2") == 1
    assert (direct.status_code, direct.headers["Surety-Shard"]) == (201, "1")



def test_a_key_the_shard_makes_from_a_task_or_an_action_goes_to_its_shard_whichever_comes_first(shards):
    """The shard makes keys of its own: a task's step's `<task id>:<step>:v<n>`, an edit's `<key>~v<n>`.
    A direct request under one of them must reach that shard, where the key's uniqueness answers it,
    whatever its customer's hash, and before or after the task or the action it derives from."""
    client, (zero, one) = shards.client, shards.stacks
    sia, sky = customer_on(0, "SIA"), customer_on(1, "SKY")
    assert post_task(client, "refund-SK1", refund_task_body("ORD-SK1", customer=sia)).headers["Surety-Shard"] == "0"

    step = post_action(client, "refund-SK1:call_refund_api:v1", refund_body("ORD-SK2", customer=sky))
    read = client.get(f"/api/v1/actions/{quote('refund-SK1:call_refund_api:v1', safe='')}")
    # The other way round: the direct request first, under a step's key of a task not yet asked for.
    early = post_action(client, "refund-SK3:notify_customer:v1", refund_body("ORD-SK3", customer=customer_on(1, "SAL")))
    task = post_task(client, "refund-SK3", refund_task_body("ORD-SK4", customer=customer_on(0, "SUE")))
    # An edit's version follows its original.
    assert post_action(client, "refund:ORD-SK5:full:dec-1", refund_body(
        "ORD-SK5", customer=customer_on(0, "STU"))).headers["Surety-Shard"] == "0"
    version = post_action(client, "refund:ORD-SK5:full:dec-1~v2", refund_body("ORD-SK6", customer=customer_on(1, "SY")))

    assert (step.status_code, step.headers["Surety-Shard"]) == (201, "0")
    assert (read.status_code, read.headers["Surety-Shard"], read.json()["target"]) == (200, "0", "ORD-SK2")
    assert (early.status_code, early.headers["Surety-Shard"]) == (201, "1")
    assert (task.status_code, task.headers["Surety-Shard"]) == (201, "1")
    assert (version.status_code, version.headers["Surety-Shard"]) == (201, "0")
    assert not keys_on(one) & {"refund-SK1:call_refund_api:v1", "refund:ORD-SK5:full:dec-1~v2"}
    assert "refund-SK3:notify_customer:v1" not in keys_on(zero)


def test_a_refund_tasks_confirmation_address_is_placed_with_it(shards):
    """The confirmation goes to `notify`, or without it to the customer's address at the customers'
    domain: an agent's own message to that address must meet it on one shard (one message per
    recipient and decision, the same-subject hold), whatever the address's hash."""
    client = shards.client
    nell = next(f"NELL-{i}" for i in range(200) if hashed_shard(f"customer:NELL-{i}", 2) == 1
                and hashed_shard(f"target:nell-{i}@customers.surety.example", 2) == 0)
    nora = next(f"nora{i}" for i in range(200) if hashed_shard(f"target:nora{i}@mail.example", 2) == 0)
    notified = refund_task_body("ORD-NT2", customer=customer_on(1, "NIKO"))
    notified["input"]["notify"] = f" {nora}@Mail.EXAMPLE"

    tasks = [post_task(client, "refund-NT1", refund_task_body("ORD-NT1", customer=nell)),
             post_task(client, "refund-NT2", notified)]
    messages = [post_action(client, f"message:{nell}:dec-1", message_body(f"{nell.lower()}@customers.surety.example")),
                post_action(client, f"message:{nora}:dec-1", message_body(f"{nora}@mail.example"))]

    assert [(t.status_code, t.headers["Surety-Shard"]) for t in tasks] == [(201, "1")] * 2, [t.text for t in tasks]
    assert [(m.status_code, m.headers["Surety-Shard"]) for m in messages] == [(201, "1")] * 2


def test_a_placed_keys_shard_answers_under_it_whatever_the_body_so_an_archived_key_is_gone(shards):
    """One Surety answers any request under a key whose action was archived 410, whatever the body
    (docs/contract.md): the key's shard must be asked, even with a body the router cannot read or
    one whose customer is placed on the other shard."""
    client, one = shards.client, shards.stacks[1]
    key, wes = "refund:ORD-W1:full:dec-1", customer_on(0, "WES")
    archive(one, key)
    with psycopg.connect(shards.directory, autocommit=True) as conn:  # as its first request placed it
        conn.execute("INSERT INTO shard_placement (name, shard, owner, used) VALUES (%s, 1, %s, true)",
                     [f"action:{key}", uuid.uuid4()])
    assert post_action(client, "refund:ORD-W2:full:dec-1", refund_body("ORD-W2", customer=wes)).status_code == 201

    not_json = client.post("/api/v1/actions", content=b"{not json", headers={
        "Idempotency-Key": key, "Content-Type": "application/json"})
    elsewhere = post_action(client, key, refund_body("ORD-W1", customer=wes))

    assert [(a.status_code, a.json()["code"], a.headers["Surety-Shard"]) for a in (not_json, elsewhere)] == [
        (410, "operation_key_expired", "1")] * 2
    assert placed(shards, "target:ORD-W1") is None


def test_the_fill_places_a_ledger_recorded_before_the_router_on_shard_zero(shards):
    """The router switched on in front of a Surety that ran alone (shard 0): what it recorded, under
    names whose hash says shard 1, must be placed on shard 0 before the router serves, or a retry
    of an old key is recorded and executed again on shard 1."""
    zero, alone = shards.stacks[0], api_client(shards.stacks[0].url, shards.token)
    ola, olga = customer_on(1, "OLA"), customer_on(1, "OLGA")
    key, body = "refund:ORD-O1:full:dec-1", refund_body("ORD-O1", customer=ola, decision="dec-1")
    assert post_action(alone, key, body).status_code == 201
    assert post_task(alone, "refund-O2", refund_task_body("ORD-O2", customer=olga)).status_code == 201
    archive(zero, "refund:ORD-O3:full:dec-1")
    step_action_of(zero, "refund-O2", key="refund-O2:notify_customer:v1", target="ada@example.com", like=key)

    for _ in range(2):  # run again, it changes nothing
        subprocess.run([PYTHON, "-m", "sharding.fill"], cwd=ROOT, check=True, env={
            **os.environ, "DATABASE_URL": zero.database_url, "SHARD_DIRECTORY_URL": shards.directory})
    retried = post_action(shards.client, key, body)
    gone = post_action(shards.client, "refund:ORD-O3:full:dec-1", refund_body("ORD-O3", customer=ola))

    assert (retried.status_code, retried.headers["Idempotent-Replayed"], retried.headers["Surety-Shard"]) == (
        200, "true", "0")
    assert (gone.status_code, gone.headers["Surety-Shard"]) == (410, "0"), gone.text
    names = [f"action:{key}", f"customer:{ola}", "target:ORD-O1", "task:refund-O2", f"customer:{olga}",
             "target:ORD-O2", f"target:{olga.lower()}@customers.surety.example", "action:refund:ORD-O3:full:dec-1"]
    assert {name: placed(shards, name) for name in names} == dict.fromkeys(names, 0)
    # A step's action goes by its task, whose names are placed: not by its own key or subjects.
    assert placed(shards, "action:refund-O2:notify_customer:v1") is None
    assert placed(shards, "target:ada@example.com") is None


def step_action_of(stack, task_id, *, key, target, like):
    """An action of the task's step in the stack's database, made from the action under `like`
    (a runner would make it; no worker runs here)."""
    with psycopg.connect(stack.database_url) as conn:
        conn.execute("""
            INSERT INTO ledger_action
            SELECT (jsonb_populate_record(a, jsonb_build_object(
                'id', nextval(pg_get_serial_sequence('ledger_action', 'id')), 'operation_key', %s::text,
                'target', %s::text,
                'task_id', t.id, 'decision_id', '', 'status', 'cancelled', 'next_attempt_at', null))).*
              FROM ledger_action a, ledger_task t WHERE a.operation_key = %s AND t.task_id = %s""",
                     [key, target, like, task_id])
