"""An auditor opens an action's evidence record from the action's page: every part of the
history is on the printable page, its print layout leaves the navigation out, and the JSON file
it offers is the record `evidence_verify` checks."""

import json

import pytest
from django.core.management import call_command

from bench.evidence_scenario import rich_action
from tests.browser.conftest import login, status_message

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


def test_an_auditor_verifies_the_chain_and_an_uploaded_evidence_file_on_the_audit_page(stack, page, people, shot,
                                                                                        tmp_path):
    action = rich_action(stack.url)
    login(page, "aldo")
    saved, tampered = tmp_path / "evidence-action.json", tmp_path / "tampered.json"
    record = page.request.get(f"/actions/{action.pk}/evidence.json").json()
    saved.write_text(json.dumps(record))
    record["audit"]["events"][0]["reason"] = "nothing happened"  # a reason rewritten after the fact
    tampered.write_text(json.dumps(record))

    page.goto("/audit/")
    page.locator("#audit-verify > summary").click()
    with page.expect_navigation():
        page.locator("#chain-verify-button").click()
    assert "Hash chain verified" in status_message(page)
    assert page.locator("[data-chain=intact]").is_visible()

    page.locator("#audit-verify > summary").click()
    page.locator("#evidence-file").set_input_files(str(saved))
    with page.expect_navigation():
        page.locator("#evidence-verify-button").click()
    assert f"{saved.name}: intact: {len(record['audit']['events'])} audit events checked" in status_message(page)

    page.locator("#audit-verify > summary").click()
    page.locator("#evidence-file").set_input_files(str(tampered))
    with page.expect_navigation():
        page.locator("#evidence-verify-button").click()
    told = status_message(page)
    assert "tampered.json:" in told and "problem(s)" in told and "intact" not in told
    assert not page.console_errors, page.console_errors
    shot(page, "audit-verified")
