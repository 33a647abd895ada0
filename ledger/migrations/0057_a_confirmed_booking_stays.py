"""A confirmed booking keeps its status and its slot, held by the database
(ledger.dbrules.BOOKING_CONFIRMED_FINAL and its SQLite pair; SQL frozen as `manage.py dbrules ledger`
printed it).

Python moves nothing out of confirmed (Booking.TRANSITIONS); a raw UPDATE or a queryset's `.update()`
that released a confirmed booking, or moved its resource or times, would free or shift a time the
provider booked, and the exclusion constraint would let another booking take it. The trigger fires only
for such a write; the rows already confirmed are unaffected by its installation.
"""

import importlib

from django.db import migrations

rules = importlib.import_module("ledger.migrations.0048_audit_sealed_only_after_the_chains_end").rules

FORWARD = r"""
CREATE OR REPLACE FUNCTION ledger_booking_confirmed_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'booking ' || OLD.id || ' is confirmed: its status and slot stay',
                          ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER ledger_booking_confirmed_final BEFORE UPDATE OF status, resource, start, "end" ON ledger_booking
    FOR EACH ROW WHEN (OLD.status = 'confirmed'
                       AND (NEW.status IS DISTINCT FROM OLD.status OR NEW.resource IS DISTINCT FROM OLD.resource
                            OR NEW.start IS DISTINCT FROM OLD.start OR NEW."end" IS DISTINCT FROM OLD."end"))
    EXECUTE FUNCTION ledger_booking_confirmed_final();
"""
BACKWARD = """
DROP TRIGGER ledger_booking_confirmed_final ON ledger_booking;
DROP FUNCTION ledger_booking_confirmed_final();
"""
SQLITE_FORWARD = ["""CREATE TRIGGER ledger_booking_confirmed_final BEFORE UPDATE OF status, resource, start, "end" ON ledger_booking
WHEN OLD.status = 'confirmed'
    AND (NEW.status IS NOT OLD.status OR NEW.resource IS NOT OLD.resource OR NEW.start IS NOT OLD.start
         OR NEW."end" IS NOT OLD."end")
BEGIN
    SELECT RAISE(ABORT, 'a confirmed booking: its status and slot stay');
END"""]
SQLITE_BACKWARD = ["DROP TRIGGER ledger_booking_confirmed_final"]


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0056_a_released_slot_taken_again_only_by_hand'),
    ]

    operations = [
        migrations.RunPython(rules(postgresql=FORWARD, sqlite=SQLITE_FORWARD),
                             rules(postgresql=BACKWARD, sqlite=SQLITE_BACKWARD)),
    ]
