"""schemathesis reads the OpenAPI document the live gunicorn server serves and fuzzes all
four operations, then follows the document's links from each POST to its GET: no answer may
be a 5xx, and every answer must be one the document describes (its status, media type, body
and headers).

It runs as schemathesis's own command line, which runs every phase (the document's examples,
coverage of its boundaries, random fuzzing, stateful sequences through the links). Its pytest
plugin is not used: its lazy loader (the only one for a server started by a fixture) sets a
private attribute of pytest's items that pytest 9 no longer has."""

import subprocess
import sys

from tests.factories import GRANTS, make_agent

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "response_headers_conformance")


def test_every_answer_is_one_the_document_describes(stack, tmp_path):
    # Every action type and workflow, so that every request the document calls valid can
    # reach the ledger rather than stop at a 403.
    _, token = make_agent("fuzzer", grants=(*GRANTS, "noop"))
    # A worker settles the actions and tasks the fuzzer records, so a read with ?wait=30
    # (which the document allows) answers at once rather than holding for its 30 seconds.
    stack.start_worker()
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "run", f"{stack.url}/api/v1/schema",
         "--header", f"Authorization: Bearer {token}",
         "--checks", ",".join(CHECKS),
         # Bounded and derandomized: the same requests on every run, so a failure in CI is one
         # anybody can replay, in well under two minutes on two cores.
         "--max-examples", "40", "--generation-deterministic",
         "--workers", "1", "--request-timeout", "40",
         "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
