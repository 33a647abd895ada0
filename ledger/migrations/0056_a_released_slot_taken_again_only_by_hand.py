"""A booking's slot let go is taken again only by a booking a person then did by hand, held by the
database (ledger.dbrules.BOOKING_RELEASED_FINAL and its SQLite pair; SQL frozen as `manage.py dbrules
ledger` printed it).

A booking that failed for good, or was rejected, cancelled or expired, released its slot, and another
booking may have taken that time since. Python moves a released row only to confirmed, and only once
its action is done by hand (a person booked it outside Surety and resolved its dead letter:
Booking.TRANSITIONS and Booking._refuse, ledger.actions._book_again); a raw UPDATE or a queryset's
`.update()` that confirmed it otherwise, or put it back to pending, would hold a slot nobody booked.
Now the database refuses both. The trigger fires only for an update of a released row's status: no
other write pays for it, the rest of the row may still be written, and no row breaks it when it is
installed, as it looks only at updates.
"""

import importlib

from django.db import migrations

rules = importlib.import_module("ledger.migrations.0048_audit_sealed_only_after_the_chains_end").rules

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_booking_released_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM 'confirmed'
       OR NOT EXISTS (SELECT 1 FROM ledger_action a
                      WHERE a.id = OLD.action_id AND a.status = 'failed' AND a.error -> 'done_by_hand' = 'true'::jsonb) THEN
        RAISE EXCEPTION USING MESSAGE = 'the slot of booking ' || OLD.id || ' was let go: only a booking a person '
                                        || 'then did by hand takes it again, confirmed',
                              ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER ledger_booking_released_final BEFORE UPDATE OF status ON ledger_booking
    FOR EACH ROW WHEN (OLD.status = 'released' AND NEW.status IS DISTINCT FROM 'released')
    EXECUTE FUNCTION ledger_booking_released_final();
"""
BACKWARD = """
DROP TRIGGER ledger_booking_released_final ON ledger_booking;
DROP FUNCTION ledger_booking_released_final();
"""
SQLITE_FORWARD = ["""CREATE TRIGGER ledger_booking_released_final BEFORE UPDATE OF status ON ledger_booking
WHEN OLD.status = 'released' AND NEW.status IS NOT 'released'
    AND (NEW.status IS NOT 'confirmed'
         OR NOT EXISTS (SELECT 1 FROM ledger_action a
                      WHERE a.id = OLD.action_id AND a.status = 'failed' AND json_type(a.error, '$.done_by_hand') = 'true'))
BEGIN
    SELECT RAISE(ABORT, 'the slot of a booking was let go: only a booking a person then did by hand takes it again, confirmed');
END"""]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_booking_released_final"]


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0055_tasks_closed_before_marked'),
    ]

    operations = [
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
