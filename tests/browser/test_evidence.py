"""An auditor opens an action's evidence record from the action's page: every part of the
history is on the printable page, its print layout leaves the navigation out, and the JSON file
it offers is the record `evidence_verify` checks."""

import json

import pytest
from django.core.management import call_command

from bench.evidence_scenario import rich_action
from tests.browser.conftest import login

pytestmark = pytest.mark.browser


def test_an_auditor_opens_the_printable_record_from_the_action_page(stack, page, people, shot, tmp_path):
    action = rich_action(stack.url)

    login(page, "aldo")
    page.goto(f"/actions/{action.pk}/")
    with page.expect_navigation():
        page.locator("#evidence-link").click()
    assert page.url.endswith(f"/actions/{action.pk}/evidence")
    assert page.locator("#evidence-key").inner_text() == action.operation_key
    assert page.locator("#ev-fingerprint").inner_text() == action.fingerprint
    assert page.locator("#ev-grant-state").inner_text() == "live"
    assert "refunds above 500 EUR need a person" in page.locator("#ev-limit").inner_text()
    approvals = page.inner_text("[aria-labelledby=ev-approvals]")
    assert "photos of the damage attached" in approvals and "evidence-bob" in approvals and "1000.00" in approvals
    assert "the card issuer lifted its block" in page.inner_text("[aria-labelledby=ev-deadletters]")
    assert page.locator("#ev-webhook-rows tbody tr").count() == 1
    assert page.locator("#ev-events > li").count() >= 20
    assert not page.console_errors, page.console_errors
    shot(page, "evidence")

    # On paper: the record without the site's navigation.
    page.emulate_media(media="print")
    assert not page.locator(".site-header").is_visible() and not page.locator("#evidence-json").is_visible()
    assert page.locator("#ev-events").is_visible()
    shot(page, "evidence-print")
    page.emulate_media(media="screen")

    download = page.request.get(page.locator("#evidence-json").get_attribute("href"))
    assert download.status == 200
    saved = tmp_path / "evidence.json"
    saved.write_text(download.text())
    assert json.loads(download.text())["request"]["operation_key"] == action.operation_key
    call_command("evidence_verify", str(saved))
