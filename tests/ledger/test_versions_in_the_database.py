"""A version is never made of an action sent to its provider before (migration 0045), on PostgreSQL
and on SQLite (`make test` runs this module on both): the page and ledger.versions refuse the edit
(tests/approvals/test_edit_down.py); a writer past them (a script, a later change) meets the
database's rule on the version's insert."""

import pytest
from django.db import IntegrityError, transaction

from ledger.models import Action, ActionStatus
from tests.factories import make_action, make_agent, new_action

S = ActionStatus
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("attempts", [0, 1, 3])
def test_a_version_is_stored_only_of_an_action_never_sent(attempts):
    agent, _ = make_agent("billing")
    original = make_action(agent, S.SUPERSEDED, key="refund:ORD-1:full:dec-1", attempts=attempts)
    version = new_action(agent, S.AWAITING_APPROVAL, key="refund:ORD-1:full:dec-1~v2", amount="20.00",
                         supersedes=original)
    if attempts:
        with pytest.raises(IntegrityError, match="sent to its provider before"), transaction.atomic():
            version.save(force_insert=True)
        assert not Action.objects.filter(supersedes=original).exists()
    else:
        version.save(force_insert=True)
        assert Action.objects.get(supersedes=original).operation_key == "refund:ORD-1:full:dec-1~v2"
