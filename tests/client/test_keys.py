"""Operation keys named by the decision's effect, never by its arguments (no server needed)."""

import hashlib

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


def test_a_key_of_parts_without_colon_percent_or_surrounding_space_is_what_it_always_was():
    """Keys already in use must not change: a restarted agent would send another key for its decision."""
    assert refund_key("ch_3Nf/8841", "dec 7", scope="full") == "refund:ch_3Nf/8841:full:dec 7"
    assert message_key("+4930123456", "receipt", "d-1") == "send_message:+4930123456:receipt:d-1"
    assert booking_key("ROOM 1", "cust@example.com", "d~2") == "create_booking:ROOM 1:cust@example.com:d~2"
    long_order = "ORD-" + "9" * 300
    assert refund_key(long_order, "dec-1") == (
        "refund:sha256:" + hashlib.sha256(f"refund:{long_order}:dec-1".encode()).hexdigest())
    assert message_key("zoë@example.com", "receipt", "dec-1") == (
        "send_message:sha256:" + hashlib.sha256("send_message:zoë@example.com:receipt:dec-1".encode()).hexdigest())


def test_colon_and_percent_are_escaped_within_a_part_so_no_two_effects_share_a_key():
    assert refund_key("gid://shop/Order/1", "dec-7") == "refund:gid%3A//shop/Order/1:dec-7"
    assert refund_key("gid://shop/Order/1", "dec-7") != refund_key("gid", "//shop/Order/1:dec-7")
    assert refund_key("ORD-1:partial", "dec-7") != refund_key("ORD-1", "dec-7", scope="partial")
    assert booking_key("ROOM:1", "C", "d") != booking_key("ROOM", "1:C", "d")
    assert message_key("a@example.com", "x:y", "d") != message_key("a@example.com", "x", "y:d")
    # '%' is escaped too, so a part that holds an escape is not the part it spells.
    assert refund_key("A%3AB", "d") == "refund:A%253AB:d" != refund_key("A:B", "d") == "refund:A%3AB:d"
    long_order = "gid://shop/Order/" + "9" * 300  # a digest of the escaped form: distinct alike
    assert refund_key(long_order, "dec-7") != refund_key("gid", long_order.removeprefix("gid:") + ":dec-7")


def test_surrounding_whitespace_is_stripped_from_each_part_as_the_api_strips_what_it_stores():
    assert refund_key(" ORD-1", "dec-7 ") == "refund:ORD-1:dec-7" == refund_key("ORD-1", "dec-7")
    assert booking_key("ROOM-1 ", "\tCUST-1", "d\n") == "create_booking:ROOM-1:CUST-1:d"
    assert refund_key("ORD 1", "dec 7") == "refund:ORD 1:dec 7"  # inside a part, a space stays


def test_a_refund_tasks_id_keeps_the_form_earlier_clients_gave_it():
    """Known by its id alone, a task asked again under a new form after an upgrade would be a
    second task, and a second refund: so its parts stay as written (a shared id is refused, safe)."""
    assert refund_task_id("gid://shop/Order/1", "dec-7") == "task:refund:gid://shop/Order/1:dec-7"
    assert refund_task_id("ORD%41", "dec-7") == "task:refund:ORD%41:dec-7"
    assert refund_task_id("ORD-1", "dec-7\xa0") == (
        "task:refund:sha256:" + hashlib.sha256("task:refund:ORD-1:dec-7\xa0".encode()).hexdigest())


def test_a_refund_tasks_id_drops_the_trailing_spaces_no_earlier_client_could_send():
    """An id ending in a space is no valid header value: as written, "dec-7 " (a restarted model's
    spelling of "dec-7") was unsendable, though the tools promise surrounding whitespace is ignored."""
    assert refund_task_id("ORD-1", "dec-7  ") == "task:refund:ORD-1:dec-7" == refund_task_id("ORD-1", "dec-7")
    assert refund_task_id("ORD-1", "dec-7 ", scope="full") == "task:refund:ORD-1:full:dec-7"
    assert refund_task_id("ORD-1 ", " dec-7") == "task:refund:ORD-1 : dec-7"  # sent as such before: kept
