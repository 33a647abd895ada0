"""Operation keys named by the decision's effect, never by its arguments (no server needed)."""

from surety_client import booking_key, message_key, refund_key, refund_task_id


def test_the_same_decision_gives_the_same_key_and_another_decision_another():
    assert refund_key("ORD-1", "dec-1") == "refund:ORD-1:dec-1" != refund_key("ORD-1", "dec-2")
    assert refund_key("ORD-1", "dec-1", scope="partial") == "refund:ORD-1:partial:dec-1"
    assert refund_task_id("ORD-1", "dec-1") == "task:refund:ORD-1:dec-1"
    assert message_key("ana@example.com", "receipt", "dec-1") == "send_message:ana@example.com:receipt:dec-1"
    assert booking_key("ROOM-1", "CUST-1", "d") == "create_booking:ROOM-1:CUST-1:d"


def test_a_key_too_long_or_not_printable_ascii_is_a_digest_of_it():
    long_order = "ORD-" + "9" * 300
    hashed = refund_key(long_order, "dec-1")
    assert hashed.startswith("refund:sha256:") and len(hashed) == 14 + 64
    assert hashed == refund_key(long_order, "dec-1") != refund_key(long_order, "d2")
    assert message_key("zoë@example.com", "receipt", "dec-1").startswith("send_message:sha256:")
    assert message_key("a@example.com", "receipt", "dec\n1").startswith("send_message:sha256:")


def test_a_task_id_leaves_room_for_its_steps_keys():
    order = "ORD-" + "1" * 190
    assert refund_task_id(order, "dec-1").startswith("task:refund:sha256:")
    assert len(refund_task_id(order, "dec-1")) < 200
    assert not refund_key(order, "dec-1").startswith("refund:sha256:")
