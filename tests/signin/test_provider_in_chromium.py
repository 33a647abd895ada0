"""Signing in through the company's provider in Chromium (Debian's, through Playwright), on a live
server configured as a deployment that signs in only through it (OIDC_ISSUER, PASSWORD_SIGN_IN
false): the sign-in page's button posts a form, allauth redirects it to the provider, and Chromium
follows that redirect only if the page's CSP form-action names the provider's origin."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import sync_playwright

from ledger.models import AuditEvent
from tests.browser.conftest import CHROMIUM_ARGS, SCREENSHOTS, TIMEOUT_MS, screenshot, static_collected  # noqa: F401
from tests.conftest import free_port, running_server
from tests.signin.conftest import CLIENT_ID, CLIENT_SECRET, provider_sending_back_to

pytestmark = pytest.mark.browser


def in_chromium(base_url, test_name, drive):
    """`drive(page)` in a Chromium of its own, started as the browser tests' is, run in a thread of
    its own: Playwright's sync API keeps an asyncio loop in the thread that starts it, and this
    one's may already hold the browser tests' (tests/browser/conftest.py, one per session), beside
    which a second refuses to start. A failure leaves artifacts/screenshots/<test>-failure.png."""
    def run():
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                                 args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
                context.set_default_timeout(TIMEOUT_MS)
                page = context.new_page()
                page.console_errors = []
                page.on("console", lambda msg: msg.type == "error" and page.console_errors.append(msg.text))
                for old in SCREENSHOTS.glob(f"{test_name}-*.png"):
                    old.unlink()  # a passing run must not leave last run's failure screenshot behind
                try:
                    return drive(page)
                except BaseException:
                    screenshot(page, test_name, "failure")
                    raise
            finally:
                browser.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """The live server with the company's provider as the only way in, and that provider (its
    address chosen first: the server reads it at start, the provider needs the server's)."""
    port = free_port()
    with running_server(django_db_blocker, OIDC_ISSUER=f"http://127.0.0.1:{port}", OIDC_CLIENT_ID=CLIENT_ID,
                        OIDC_CLIENT_SECRET=CLIENT_SECRET, OIDC_NAME="Company SSO", PASSWORD_SIGN_IN="false") as stack:
        with provider_sending_back_to(f"{stack.url}/accounts/oidc/company/login/callback/", port) as issuer:
            stack.issuer = issuer
            yield stack


def test_the_provider_button_takes_chromium_to_the_provider_and_back_signed_in(stack, static_collected, request):
    get_user_model().objects.create_user(username="ada", email="ada@company.example")

    def sign_in(page):
        shot = lambda name: screenshot(page, request.node.name, name)  # noqa: E731
        # The provider's pages import a web font: nothing here reaches the internet.
        page.route("https://fonts.googleapis.com/**", lambda route: route.abort())
        page.goto("/accounts/login/")
        assert page.locator("#id_password").count() == 0  # the provider is the only way in
        shot("sign-in")

        page.locator("#sign-in-company").click()
        try:
            page.wait_for_url(lambda url: url.startswith(f"{stack.issuer}/"))
        except PlaywrightTimeoutError:
            raise AssertionError(f"Chromium stayed at {page.url}: {page.console_errors}") from None
        shot("provider-login")

        # The provider's development pages: any login name (ada's), then consent.
        page.fill("input[name=login]", "ada")
        page.fill("input[name=password]", "any")
        with page.expect_navigation():
            page.locator("button[type=submit]").click()
        with page.expect_navigation(url=f"{stack.url}/"):
            page.locator("button[type=submit]").click()
        shot("signed-in")
        return page.console_errors

    console_errors = in_chromium(stack.url, request.node.name, sign_in)
    assert AuditEvent.objects.get(verb="signed_in").actor == "user:ada"
    assert not [error for error in console_errors if "Content Security Policy" in error]
