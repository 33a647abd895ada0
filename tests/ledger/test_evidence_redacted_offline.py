"""From the file alone, an audit event that names values in `redacted` has its content hash left
unchecked: the file does not hold the values it was computed from. So `redacted` holds only where the
event shows what the agent's record withholds: a count, `{"withheld": n}`, in its `before` or `after`,
under one of the keys the record names in `withheld_keys` (the keys its sections withhold, under the
record's digest and signature). Added anywhere else, to pass an edited event, it fails the check
(decision 62)."""

import json

import pytest
from django.core.management import CommandError, call_command

from ledger.evidence import record_digest, record_problems
from tests.ledger.test_evidence_no_staff_addresses import agents_record, escalated, event  # noqa: F401

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("jobs_to_test_redis")]


def forged(record, verb, change):
    """`record` with the event `verb` changed by `change(event)` and the digest written again to fit,
    as anyone holding the file can; with the event's name in the problems."""
    tampered = json.loads(json.dumps(record))
    shown = event(tampered, verb)
    change(shown)
    tampered["integrity"]["digest"] = record_digest(tampered)
    return tampered, f"event #{shown['seq']}: "


def edited_and_said_withheld(*paths, **shown):
    """An event's reason rewritten, with `shown` put in its detail and `paths` named as withheld."""
    def change(event):
        event["reason"] = "nobody asked for this"
        for path, value in shown.items():
            *parents, last = path.split("__")
            place = event
            for key in parents:
                place = place.setdefault(key, {})
            place[last] = value
        event["redacted"] = list(paths)
    return change


def test_the_agents_record_names_the_keys_it_withholds_under_its_digest_and_staffs_none(client, escalated,
                                                                                           auditor):
    record = agents_record(client).json()
    assert record["withheld_keys"] == ["first_tier", "next_tier"]
    widened = json.loads(json.dumps(record))
    widened["withheld_keys"].append("max_amount")
    assert record_problems(widened, database=False) == [
        "the digest is not the record's: the record was changed after it was written"]
    widened["integrity"]["digest"] = record_digest(widened)
    assert "the signature is not this ledger's for this digest" in record_problems(widened)

    client.force_login(auditor)
    staffs = json.loads(client.get(f"/actions/{escalated.pk}/evidence.json").content)
    assert staffs["withheld_keys"] == []


@pytest.mark.parametrize("change, why", [
    # A key the record does not withhold, the value a count or as the chain holds it.
    (edited_and_said_withheld("after.anything", after__anything={"withheld": 1}),
     "it says it withheld after.anything, which is not under a key the record withholds (first_tier, next_tier)"),
    (edited_and_said_withheld("after.status"),
     "it says it withheld after.status, which is not under a key the record withholds (first_tier, next_tier)"),
    # A key the record withholds, but not in the event's detail.
    (edited_and_said_withheld("first_tier", first_tier={"withheld": 1}),
     "it says it withheld first_tier, which is not under a key the record withholds (first_tier, next_tier)"),
    (edited_and_said_withheld("reason.first_tier"),
     "it says it withheld reason.first_tier, which is not under a key the record withholds (first_tier, next_tier)"),
    # A key the record withholds, in the detail, but no count there.
    (edited_and_said_withheld("after.first_tier"), "it says it withheld after.first_tier, which it does not show"),
    (edited_and_said_withheld("after.first_tier", after__first_tier="desk@staff.example"),
     "what it shows at after.first_tier is not a value withheld ({\"withheld\": n})"),
    *[(edited_and_said_withheld("after.first_tier", after__first_tier=shown),
       "what it shows at after.first_tier is not a value withheld ({\"withheld\": n})")
      for shown in ({"withheld": -1}, {"withheld": "2"}, {"withheld": True}, {"withheld": 2.0}, {"withheld": None},
                    {"withheld": 2, "addresses": "desk@staff.example"}, [{"withheld": 2}], {})],
], ids=["undeclared-key", "undeclared-value", "outside-the-detail", "under-the-reason", "absent", "an-address",
        "negative", "text", "boolean", "float", "null", "more-than-a-count", "a-list", "empty"])
def test_redacted_on_an_event_shown_whole_does_not_pass_it_from_the_file(client, escalated, change, why):
    record = agents_record(client).json()

    tampered, name = forged(record, "requested", change)

    assert name + why in record_problems(tampered, database=False)
    assert name + why in record_problems(tampered)


def test_redacted_on_an_event_that_withheld_names_only_what_it_withheld(client, escalated, tmp_path):
    record = agents_record(client).json()

    # The limit's maximum hidden as if it were an address, beside the tiers it rightly withheld.
    tampered, name = forged(record, "limit_set", edited_and_said_withheld(
        "after.first_tier", "after.max_amount", "after.next_tier", "before.first_tier", "before.next_tier",
        after__max_amount={"withheld": 1}))

    why = "it says it withheld after.max_amount, which is not under a key the record withholds (first_tier, next_tier)"
    assert record_problems(tampered, database=False) == [name + why]
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(tampered))
    with pytest.raises(CommandError, match=r"after\.max_amount, which is not under a key the record withholds"):
        call_command("evidence_verify", str(saved), "--offline")


def test_redacted_on_staffs_record_does_not_pass_an_event_from_the_file(client, escalated, auditor):
    client.force_login(auditor)
    staffs = json.loads(client.get(f"/actions/{escalated.pk}/evidence.json").content)

    tampered, name = forged(staffs, "limit_set", edited_and_said_withheld("after.first_tier"))

    assert record_problems(tampered, database=False) == [
        name + "it says it withheld after.first_tier, which is not under a key the record withholds (none)"]

