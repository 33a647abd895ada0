"""The OpenAPI document itself: generated without a warning, valid OpenAPI, one request
schema per action type and per workflow, and links from each POST to its GET."""

import json
import re

import pytest
from django.core.management import call_command

from ledger.models import ActionType
from ledger.workflows import WORKFLOWS


@pytest.fixture(scope="module")
def document(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "openapi.json"
    # --fail-on-warn: a field drf-spectacular cannot describe would leave a hole the fuzzer walks through.
    call_command("spectacular", "--validate", "--fail-on-warn", "--format", "openapi-json", "--file", str(path))
    return json.loads(path.read_text())


def request_schema(document, path):
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def test_it_has_a_request_schema_per_action_type(document):
    ref = request_schema(document, "/api/v1/actions")["$ref"].rsplit("/", 1)[1]
    discriminator = document["components"]["schemas"][ref]["discriminator"]
    assert discriminator["propertyName"] == "action_type"
    assert set(discriminator["mapping"]) == set(ActionType.values)


def test_it_has_a_request_schema_per_workflow(document):
    ref = request_schema(document, "/api/v1/tasks")["$ref"].rsplit("/", 1)[1]
    discriminator = document["components"]["schemas"][ref]["discriminator"]
    assert discriminator["propertyName"] == "workflow"
    assert set(discriminator["mapping"]) == set(WORKFLOWS)


@pytest.mark.parametrize("path, read, parameter", [
    ("/api/v1/actions", "actions_retrieve", "operation_key"), ("/api/v1/tasks", "tasks_retrieve", "task_id"),
])
def test_it_links_each_intake_to_the_read_of_what_it_recorded(document, path, read, parameter):
    responses = document["paths"][path]["post"]["responses"]
    for status in ("200", "201"):
        link = responses[status]["links"][f"read_{parameter}"]
        assert link == {"operationId": read, "parameters": {parameter: f"$response.body#/{parameter}"},
                        "description": f"Read the record again by its {parameter}."}


def test_every_problem_is_problem_json(document):
    for path in document["paths"].values():
        for operation in path.values():
            problems = {status: response for status, response in operation["responses"].items()
                        if status.startswith("4") and status != "414"}
            assert {"401", "404"} & set(problems), operation["operationId"]  # every operation documents its refusals
            for status, response in problems.items():
                assert list(response["content"]) == ["application/problem+json"], status


def test_every_answer_to_try_later_names_retry_after_and_its_problem_admits_its_status(document):
    """A 429 or 503 carries Retry-After, and its body is a problem whose status is 429 or 503."""
    status = document["components"]["schemas"]["Problem"]["properties"]["status"]
    assert status["minimum"] <= 429 and status["maximum"] >= 503
    for path in document["paths"].values():
        for operation in path.values():
            for later in {"429", "503"} & set(operation["responses"]):
                assert "Retry-After" in operation["responses"][later].get("headers", {}), (operation["operationId"], later)


def test_a_text_the_document_calls_not_blank_is_one_the_api_does_not_trim_to_blank(document):
    """The API trims what Python's str.strip() strips, and refuses what is left blank; a pattern's
    \\s is ECMAScript's, which leaves U+001C-U+001F and U+0085 out: the document spells the set out."""
    from rest_framework import serializers

    from ledger.api.openapi import NOT_BLANK

    patterns = {prop.get("pattern") for schema in document["components"]["schemas"].values()
                for prop in schema.get("properties", {}).values()}
    assert NOT_BLANK["pattern"] in patterns
    # No \s: its set is the engine's (Python's re, here, takes U+001C as space; ECMAScript's does not).
    assert "\\s" not in NOT_BLANK["pattern"]
    field = serializers.CharField()
    for code in range(0x110000):
        if chr(code).isspace():
            text = f" {chr(code)} "
            assert not re.search(NOT_BLANK["pattern"], text), hex(code)
            with pytest.raises(serializers.ValidationError):
                field.run_validation(text)
    for kept in ("a", "\ufeff", " x "):
        assert re.search(NOT_BLANK["pattern"], kept) and field.run_validation(kept)


@pytest.mark.parametrize("component", ["RefundParams", "RefundInput"])
def test_a_refunds_amount_has_no_more_decimals_than_its_currency_for_an_action_and_a_task(document, component):
    """A refund action's params were split by the currency's minor digits, a refund task's input
    not: the document took 25.005 EUR and 1.5 JPY as a task's, which the API refuses."""
    groups = document["components"]["schemas"][component]["oneOf"]

    def admitted(amount, currency):
        return [g for g in groups if re.search(g["properties"]["amount"]["pattern"], amount)
                and re.search(g["properties"]["currency"]["pattern"], currency)]

    assert not admitted("25.005", "EUR") and not admitted("1.5", "JPY")
    assert len(admitted("25.00", "EUR")) == 1 and len(admitted("1500", "JPY")) == 1


def test_every_operation_lists_the_406_and_every_intake_the_415_the_api_answers(document, client, db):
    """The API answers a request whose Accept admits no JSON 406, and a body sent as another type
    415, both as problems; the document, which says it lists every status, listed neither."""
    from tests.factories import make_agent_on

    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            if path.startswith("/api/v1/") and "schema" not in path:
                assert "406" in operation["responses"], (method, path)
                assert method != "post" or "415" in operation["responses"], path
    make_agent_on(client)
    assert client.get("/api/v1/actions/k1", headers={"Accept": "text/html"}).status_code == 406
    sent = client.post("/api/v1/actions", data="x", content_type="text/plain", headers={"Idempotency-Key": "k1"})
    assert sent.status_code == 415 and sent.json()["code"] == "unsupported_media_type"
