"""`evidence_verify --archives` reads each archive file once, a line at a time, and keeps of its
events only those the record cites: a run's file may hold millions of rows, tens of GB read whole.

How much memory a process takes is no check that holds on a loaded machine, so the tests record
how the file is read instead: `Path.open` is wrapped (the files, the database and the records are
real) to note the size of every piece the check takes of an archive file. The largest is a line,
never the file."""

import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from dlq.archive import archive_expired
from ledger.evidence import archived_events, evidence_actions, evidence_record, record_problems
from ledger.models import AuditEvent
from tests.dlq.test_archive_expired import LATER, agent, billing, ledger  # noqa: F401

pytestmark = pytest.mark.django_db


class Pieces:
    """A file opened for reading, noting the size of each piece taken of it (`sizes`)."""

    def __init__(self, file, sizes):
        self.file, self.sizes = file, sizes

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def __iter__(self):
        for line in self.file:
            self.sizes.append(len(line))
            yield line

    def read(self, size=-1):
        data = self.file.read(size)
        self.sizes.append(len(data))
        return data


@pytest.fixture
def archived(ledger, settings, tmp_path):
    """An evidence record of an action kept past its lifetime, saved, then a run that archived the
    first 99 audit events (those it cites among them) in one file: (record, saved, archives, file)."""
    settings.AUDIT_CHECKPOINT_EVERY = 100
    with transaction.atomic():
        for i in range(250):
            AuditEvent.objects.record(actor="system:test", verb="noted", obj=ledger["done"], reason=f"note {i}")
    AuditEvent.objects.seal()
    record = evidence_record(evidence_actions().get(pk=ledger["open"].pk), [])
    saved = tmp_path / "evidence.json"
    saved.write_text(json.dumps(record))
    archives = tmp_path / "archives"
    archives.mkdir()
    archive, counts = archive_expired(archives, now=timezone.now() + LATER)
    assert (archive.checkpoint.seq, counts["ledger.auditevent"]) == (100, 99)
    assert any(isinstance(e["seq"], int) and e["seq"] < 100 for e in record["audit"]["events"])
    return record, saved, archives, archives / archive.file


@pytest.fixture
def pieces(monkeypatch):
    """{file name: [the size of each piece read]} of the files opened by `Path.open` from now on."""
    taken, real_open = {}, Path.open

    def noted(path, *args, **kwargs):
        return Pieces(real_open(path, *args, **kwargs), taken.setdefault(path.name, []))

    monkeypatch.setattr(Path, "open", noted)
    return taken


def test_an_archive_file_is_read_once_a_line_at_a_time(archived, pieces):
    record, saved, archives, file = archived
    lines = file.read_bytes().splitlines(keepends=True)
    pieces.clear()

    assert record_problems(record, archives=archives) == []
    call_command("evidence_verify", str(saved), "--archives", str(archives))

    sizes = pieces[file.name]
    assert sum(sizes) == 2 * file.stat().st_size  # the whole file, once a check
    assert len(sizes) == 2 * len(lines) > 200
    assert max(sizes) == max(map(len, lines)) < file.stat().st_size / 20


def test_only_the_events_a_record_cites_are_kept(archived):
    _, _, archives, _ = archived
    found, held, problems = archived_events(archives, {2, 7}, set())
    assert (set(found), held, problems) == ({2, 7}, True, [])
    by_id, _, _ = archived_events(archives, set(), {found[2][0]})  # an event the export saw unsealed
    assert set(by_id) == {2}


@pytest.mark.parametrize("line", [b"not json\n", b"\xff\n", b"[1, 2]\n", b'{"model": "ledger.auditevent"}\n'],
                         ids=["not JSON", "not UTF-8", "no object", "no fields"])
def test_a_file_changed_into_lines_that_are_no_rows_is_told_by_its_sha256(archived, line):
    record, _, archives, file = archived
    lines = file.read_bytes().splitlines(keepends=True)
    file.write_bytes(b"".join([*lines[:3], line, *lines[3:]]))

    problems = record_problems(record, archives=archives)
    assert f"archive {file.name}: not the file the ledger wrote (its SHA-256 differs)" in problems
