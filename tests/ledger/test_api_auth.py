"""Who may do what through /api/v1/, and how every refusal is shaped (RFC 9457 problems)."""

import pytest

from ledger.models import Action
from tests.factories import make_agent, post_action_in_process, refund_body

KEY = "refund:ORD-8841:full:dec-77"


class Actors:
    """Two agents who may refund, and one who may only send messages."""

    def __init__(self):
        self.billing, self.billing_token = make_agent("billing")
        self.support, self.support_token = make_agent("support")
        self.messenger, self.messenger_token = make_agent("messenger", grants=("send_message",))


@pytest.fixture
def actors(db):
    return Actors()


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def assert_problem(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    problem = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(problem)
    assert (problem["status"], problem["code"]) == (status, code)
    return problem


def test_it_refuses_a_request_without_a_token(client, actors):
    response = post_action_in_process(client, KEY, refund_body())
    assert_problem(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert not Action.objects.exists()


def test_it_refuses_a_wrong_token(client, actors):
    response = post_action_in_process(client, KEY, refund_body(), headers=bearer("sur_not-a-token"))
    assert_problem(response, 401, "unauthenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert not Action.objects.exists()


def test_it_refuses_a_token_in_another_scheme(client, actors):
    response = post_action_in_process(client, KEY, refund_body(),
                                      headers={"Authorization": f"Token {actors.billing_token}"})
    assert_problem(response, 401, "unauthenticated")


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_it_takes_the_schemes_name_in_any_case(client, actors, scheme):
    """An authentication scheme's name is case-insensitive (RFC 9110): "bearer" was refused 401."""
    response = post_action_in_process(client, KEY, refund_body(),
                                      headers={"Authorization": f"{scheme} {actors.billing_token}"})
    assert response.status_code == 201, response.content


def test_it_refuses_the_token_of_a_deactivated_agent(client, actors):
    actors.billing.is_active = False
    actors.billing.save(update_fields=["is_active"])
    response = post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.billing_token))
    assert_problem(response, 401, "unauthenticated")


def test_it_refuses_an_action_type_the_agent_was_not_granted(client, actors):
    response = post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.messenger_token))
    assert_problem(response, 403, "forbidden")
    assert not Action.objects.exists()


def test_it_hides_another_agents_action(client, actors):
    assert post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.billing_token)).status_code == 201
    mine = client.get(f"/api/v1/actions/{KEY}", headers=bearer(actors.billing_token))
    theirs = client.get(f"/api/v1/actions/{KEY}", headers=bearer(actors.support_token))
    assert mine.status_code == 200
    assert_problem(theirs, 404, "not_found")


def test_it_answers_404_for_an_action_that_does_not_exist(client, actors):
    response = client.get("/api/v1/actions/refund:nope", headers=bearer(actors.billing_token))
    assert_problem(response, 404, "not_found")


def test_it_refuses_a_key_another_agent_owns_even_with_the_same_body(client, actors):
    assert post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.billing_token)).status_code == 201
    before = Action.objects.values().get()

    response = post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.support_token))

    assert_problem(response, 422, "idempotency_key_reused")
    assert "Idempotent-Replayed" not in response
    assert Action.objects.values().get() == before


def test_it_refuses_a_key_another_agent_owns_with_another_body(client, actors):
    assert post_action_in_process(client, KEY, refund_body(), headers=bearer(actors.billing_token)).status_code == 201
    response = post_action_in_process(client, KEY, refund_body(amount="99.00"), headers=bearer(actors.support_token))
    assert_problem(response, 422, "idempotency_key_reused")
    assert Action.objects.count() == 1


def test_it_answers_an_unknown_url_under_the_api_with_a_problem(client, actors):
    response = client.get("/api/v1/nothing-here", headers=bearer(actors.billing_token))
    assert_problem(response, 404, "not_found")


def test_it_refuses_a_wrong_method_with_a_problem(client, actors):
    response = client.get("/api/v1/actions", headers=bearer(actors.billing_token))
    assert_problem(response, 405, "method_not_allowed")
    assert "POST" in response["Allow"]


@pytest.mark.parametrize("path", ["/api/v1/actions", "/api/v1/actions/k-1", "/api/v1/actions/k-1/evidence",
                                  "/api/v1/tasks", "/api/v1/tasks/t-1"])
def test_options_is_a_method_no_path_lists(client, actors, path):
    """DRF answered OPTIONS with a description of the view (200), a method the document lists on
    no path."""
    response = client.options(path, headers=bearer(actors.billing_token))
    assert_problem(response, 405, "method_not_allowed")
    assert "OPTIONS" not in response["Allow"]


def test_it_refuses_a_body_that_is_not_json(client, actors):
    response = post_action_in_process(client, KEY, "refund ORD-8841 25.00 EUR", headers=bearer(actors.billing_token),
                                      content_type="text/plain")
    assert_problem(response, 415, "unsupported_media_type")
    assert not Action.objects.exists()


def test_it_serves_the_openapi_schema_without_a_token(client, db):
    response = client.get("/api/v1/schema", headers={"Accept": "application/vnd.oai.openapi+json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert "post" in schema["paths"]["/api/v1/actions"]
    assert "get" in schema["paths"]["/api/v1/actions/{operation_key}"]
    parameters = schema["paths"]["/api/v1/actions"]["post"]["parameters"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" and p["required"] for p in parameters)
