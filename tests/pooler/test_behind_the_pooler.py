"""What running behind a transaction-pooling PgBouncer takes (tests/pooler/conftest.py): the
stack and this process reach the database only through it; a connection that prepares its
statements (the product's default) breaks there as soon as its transactions move between
server connections, and DATABASE_POOLER=transaction's setup does not; and nothing in the tree
keeps a lock on a session, which a pooler hands to other clients between transactions."""

import re
import subprocess

import psycopg
import pytest
from django.db import ProgrammingError, connection

from tests.conftest import PYTHON, ROOT
from tests.factories import agent_api, post_action, refund_body

STATEMENT = "SELECT count(*) FROM ledger_action WHERE status = %s"


def test_the_stack_and_this_process_reach_the_test_database_only_through_pgbouncer(stack, pgbouncer,
                                                                                  django_db_blocker):
    name = connection.settings_dict["NAME"]
    with django_db_blocker.unblock(), psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}",
                                                      autocommit=True) as direct:
        # The suite's other server (session-wide, on the same test database) may hold direct
        # connections from the tests before: they are not this stack's, so they are ended first.
        stray = list(backends(direct) - pgbouncer.server_pids(name))
        direct.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [stray])
        client = agent_api(stack.url)
        assert post_action(client, "refund:ORD-P1:full:dec-1", refund_body("ORD-P1")).status_code == 201
        connection.ensure_connection()
        found = backends(direct)
    through = pgbouncer.server_pids(name)
    assert found and found <= through, f"connected straight to PostgreSQL: {found - through}"


def backends(direct):
    """The client backends of `direct`'s database, but its own."""
    return {pid for (pid,) in direct.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                                             "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")}


def connection_setup(env, pooler):
    """What a process started with `env` and DATABASE_POOLER=`pooler` connects with."""
    return subprocess.run(
        [PYTHON, "manage.py", "shell", "-v", "0", "-c", "from django.db import connection as c; "
         "print(c.settings_dict['OPTIONS'].get('prepare_threshold'), c.settings_dict['DISABLE_SERVER_SIDE_CURSORS'])"],
        cwd=ROOT, env={**env, "DATABASE_POOLER": pooler}, capture_output=True, text=True)


def test_the_servers_and_workers_setting_turns_prepared_statements_and_server_side_cursors_off(server):
    assert connection_setup(server.env, "transaction").stdout.split() == ["None", "True"]
    assert connection_setup(server.env, "").stdout.split() == ["2", "False"]  # the default: prepared
    assert connection_setup(server.env, "session").stdout.split() == ["2", "False"]
    refused = connection_setup(server.env, "statement")
    assert refused.returncode != 0 and "DATABASE_POOLER must be empty, session or transaction" in refused.stderr


def run_around_another_client(options, pgbouncer):
    """One statement run three times on a Django connection with `options`, then again while
    another client holds, in a transaction, the server connection it ran on last (PgBouncer
    hands out the one released last), so that the fourth run lands on another one."""
    ours = connection.copy()
    ours.settings_dict["OPTIONS"] = options
    other = psycopg.connect(pgbouncer.url(ours.settings_dict["NAME"]), prepare_threshold=None)
    try:
        with ours.cursor() as cursor:
            for _ in range(3):
                cursor.execute(STATEMENT, ["queued"])
        other.execute("SELECT 1")  # not in autocommit: its transaction stays open
        with ours.cursor() as cursor:
            cursor.execute(STATEMENT, ["queued"])
            return cursor.fetchone()[0]
    finally:
        other.close()
        ours.close()


def test_prepared_statements_break_behind_the_pooler_and_database_pooler_transaction_turns_them_off(
        pgbouncer, django_db_blocker, settings):
    with django_db_blocker.unblock():
        # The product's default on PostgreSQL: prepared after the second run (config/settings.py).
        with pytest.raises(ProgrammingError, match="prepared statement .* does not exist"):
            run_around_another_client({**connection.settings_dict["OPTIONS"], "prepare_threshold": 2}, pgbouncer)
        # This process's connections are set up as DATABASE_POOLER=transaction sets them up.
        assert run_around_another_client(connection.settings_dict["OPTIONS"], pgbouncer) == 0


# What stays on a server connection after the transaction, which PgBouncer then gives the next
# client, and which the client's own next transaction may not find: an advisory lock of the
# session, a LISTEN, a temporary table, a holdable cursor, a SET without LOCAL.
SESSION_STATE = re.compile(r"pg_(try_)?advisory_(un)?lock(_shared)?\b|pg_advisory_unlock_all|(?-i:\bLISTEN\b)|"
                           r"\bCREATE\s+(TEMP|TEMPORARY)\b|\bWITH\s+HOLD\b|withhold=True|"
                           r"execute\(\s*f?[\"']SET\s+(?!LOCAL\b|CONSTRAINTS\b)", re.IGNORECASE)


def test_nothing_in_the_tree_keeps_state_on_a_database_session():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("config", "ledger", "approvals", "dlq", "sandbox", "demo", "bench")
             for path in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if SESSION_STATE.search(line)]
    assert not found, found
