"""The replay set through PgBouncer in transaction pooling mode (tests/pooler/conftest.py):
refund, send_message and create_booking against the sandbox, every case passing, each effect
once at the provider. The tests are tests/ledger/test_replay_check.py's own."""

from tests.ledger.test_replay_check import (  # noqa: F401 (collected here, behind the pooler)
    test_replay_check_passes_for_every_action_type_against_the_sandbox,
    test_replay_check_refund_against_the_sandbox_passes_and_keeps_six_cases,
)
