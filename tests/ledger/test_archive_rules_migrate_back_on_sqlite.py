"""Migration 0046 goes back on SQLite too: its update rule names the column it adds
(`hash_version`), and SQLite drops no column a trigger names, so going back puts the rule of
before (0032's) in its place first, and the archive's delete rule stays as it was."""

import os
import sqlite3
import subprocess

from tests.conftest import PYTHON, ROOT


def migrate(database, *target):
    done = subprocess.run([PYTHON, "manage.py", "migrate", *target, "--noinput", "-v0"], cwd=ROOT,
                          env={**os.environ, "DATABASE_URL": f"sqlite:///{database}",
                               "DJANGO_SETTINGS_MODULE": "tests.settings"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def triggers(database):
    with sqlite3.connect(database) as db:
        return dict(db.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' "
                               "AND name LIKE 'ledger_audit_%'"))


def test_0046_goes_back_to_0045_and_forward_again(tmp_path):
    database = tmp_path / "surety.sqlite3"
    migrate(database, "ledger", "0046")
    migrate(database, "ledger", "0045")
    rules = triggers(database)
    assert set(rules) == {"ledger_audit_no_update", "ledger_audit_no_delete"}
    assert "hash_version" not in rules["ledger_audit_no_update"]
    assert "ledger_archive" in rules["ledger_audit_no_delete"]

    migrate(database, "ledger", "0046")
    assert "NEW.hash_version IS NOT OLD.hash_version" in triggers(database)["ledger_audit_no_update"]
