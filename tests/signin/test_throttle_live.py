"""Failed sign-ins are counted for the whole deployment, not per web process: the live stack's
gunicorn runs two processes, which share the counts in the database's cache table (the cache the
settings configure). Counted per process, five failures spread over the two would let the
sixth try in."""

import httpx
from django.contrib.auth import get_user_model

from ledger.models import AuditEvent
from tests.signin.conftest import PASSWORD


def try_password(url, password):
    """One sign-in from a new connection (gunicorn hands each to either process)."""
    with httpx.Client(base_url=url, timeout=10) as browser:
        browser.get("/accounts/login/")
        return browser.post("/accounts/login/", headers={"Referer": url}, data={
            "login": "alice", "password": password, "csrfmiddlewaretoken": browser.cookies["csrftoken"]})


def test_failed_sign_ins_are_throttled_across_the_web_processes(stack):
    get_user_model().objects.create_user("alice", password=PASSWORD)
    for _ in range(5):
        answer = try_password(stack.url, "guess")
        assert answer.status_code == 200 and "not correct" in answer.text
    refused = try_password(stack.url, PASSWORD)
    assert refused.status_code == 200 and "Too many failed login attempts" in refused.text
    assert AuditEvent.objects.filter(verb="sign_in_failed").count() == 5
