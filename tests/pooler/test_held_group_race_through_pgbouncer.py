"""The held-group race through PgBouncer in transaction pooling mode (tests/pooler/conftest.py):
two requests for one order close together are both held (the subjects' advisory locks are
transaction-scoped, so they hold through the pooler), one decision, one refund. The tests are
those of tests/approvals/test_held_groups.py and tests/ledger/test_same_subject_in_the_database.py."""

from tests.approvals.test_held_groups import (  # noqa: F401 (collected here, behind the pooler)
    test_two_requests_for_one_order_close_together_end_with_exactly_one_effect,
)
from tests.ledger.test_same_subject_in_the_database import (  # noqa: F401
    test_an_insert_waits_for_the_locks_python_takes_on_the_same_subjects,
)
