"""SITE_URL is checked with a signed probe only this deployment can answer (/site-probe, an HMAC
of a fresh nonce under its SECRET_KEY): `manage.py check_site_url` passes against the running
server and fails, naming SITE_URL, against another server or one with another key."""

from http.server import SimpleHTTPRequestHandler

import pytest
from django.core.management import CommandError, call_command

from ledger.site_url import probe_answer, site_url_problem
from tests.conftest import thread_server


class NotSurety(SimpleHTTPRequestHandler):
    """Another app where SITE_URL points: it serves files, and knows nothing of the probe."""

    def log_message(self, format, *args):  # noqa: A002
        pass


def test_the_probe_answers_an_hmac_of_the_nonce_and_refuses_a_bad_nonce(client):
    answer = client.get("/site-probe", {"nonce": "abc123"})
    assert answer.status_code == 200 and answer.json() == {"answer": probe_answer("abc123")}
    for nonce in ("", "x" * 65, "a/b"):
        refused = client.get("/site-probe", {"nonce": nonce})
        assert (refused.status_code, refused["Content-Type"]) == (400, "application/problem+json")


def test_check_site_url_passes_when_site_url_is_this_deployment(server, settings, capsys):
    settings.SITE_URL = server.url
    call_command("check_site_url")
    assert f"SITE_URL {server.url} reaches this deployment" in capsys.readouterr().out


def test_check_site_url_fails_naming_site_url_when_another_server_answers(db, settings):
    with thread_server(NotSurety) as other:
        settings.SITE_URL = other.url
        with pytest.raises(CommandError, match=f"SITE_URL {other.url} does not reach this deployment"):
            call_command("check_site_url")


def test_a_deployment_with_another_secret_key_is_not_this_one(server, settings):
    settings.SECRET_KEY = "another deployment's key"
    problem = site_url_problem(server.url)
    assert problem.startswith(f"SITE_URL {server.url} does not reach this deployment: another server answered")
