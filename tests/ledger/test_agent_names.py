"""Two people creating an agent of the same name at the same moment: one gets it, the other
the same clear refusal as for a name already taken (never an IntegrityError, a 500 on the
dashboard). Real PostgreSQL, one connection per thread."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from ledger.agents import agent_create
from ledger.models import Agent

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite serialises every writer"),
]


def test_a_name_created_twice_at_once_is_one_agent_and_one_refusal():
    barrier, outcomes = threading.Barrier(6), []
    owner = get_user_model().objects.create_user("olga")

    def create():
        try:
            barrier.wait(10)
            agent_create("twin-bot", actor="system:tests", owner=owner)
            outcomes.append("created")
        except ValueError as exc:
            outcomes.append(str(exc))
        except Exception as exc:  # noqa: BLE001 (the failure this test is about)
            outcomes.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)

    refusal = "an agent named 'twin-bot' exists, or its username agent-twin-bot is taken"
    assert sorted(outcomes) == sorted(["created"] + [refusal] * 5), outcomes
    assert Agent.objects.filter(name="twin-bot").count() == 1
