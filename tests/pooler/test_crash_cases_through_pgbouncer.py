"""The crash cases through PgBouncer in transaction pooling mode (tests/pooler/conftest.py): a
worker SIGKILLed while its action is pending, or at each point of a refund task, loses
nothing and doubles nothing. The tests (and their fixtures) are those of
tests/ledger/test_worker_killed_while_pending.py and test_task_resume_after_kill.py."""

from tests.ledger.test_task_resume_after_kill import (  # noqa: F401 (collected here, behind the pooler)
    client,
    test_a_worker_killed_after_the_refund_succeeded_but_before_its_checkpoint_does_not_call_again,
    test_a_worker_killed_as_soon_as_the_refund_is_checkpointed_leaves_one_refund,
    test_a_worker_killed_right_after_the_refund_went_out_resumes_at_write_confirmation,
    test_a_worker_killed_while_the_message_is_in_flight_is_verified_not_resent,
)
from tests.ledger.test_worker_killed_while_pending import (  # noqa: F401
    test_a_worker_killed_while_pending_is_verified_after_its_lease_not_repeated,
)
