"""Chromium (Debian's, through Playwright) driving the dashboard served by the real stack.

One browser per test session; each test gets fresh contexts (no shared cookies). The people
are built once per test (the database is flushed between tests): two approvers, an operator
who owns the agent, an auditor. Screenshots land in artifacts/screenshots/<test>-<page>.png.
"""

import fcntl
import os
import re
import tempfile
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from playwright.sync_api import sync_playwright

from approvals.models import Limit
from tests.conftest import ROOT
from tests.factories import api_client, make_agent, post_action, refund_body

SCREENSHOTS = ROOT / "artifacts" / "screenshots"
PASSWORD = "correct-horse-battery-staple"
PEOPLE = {"alice": "approvers", "bob": "approvers", "olga": "operators", "aldo": "auditors"}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# Long enough for a page served by gunicorn under load, short enough to fail fast.
TIMEOUT_MS = 10_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # The outcome of each phase, so that `page` can take a screenshot of a failure.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def pytest_collection_finish(session):
    """The test server runs with DEBUG off: static files (htmx, the dashboard's JS and CSS) are
    served from STATIC_ROOT, as `make static` leaves them, and WhiteNoise indexes that directory
    once, as the server starts. So a session that runs browser tests collects them before any
    test, and so before the session's server (which a test of another directory may start
    first): a run straight after a change to the JavaScript, or in a fresh clone, never tests
    yesterday's file, or none. (`make test` collects them first as well; a direct run of pytest
    relies on this.)"""
    if not session.config.option.collectonly and any(item.get_closest_marker("browser") for item in session.items):
        _collect_static()


@pytest.fixture(scope="session")
def static_collected():
    """The static files collected, for a browser test outside this directory (tests/signin),
    whose session may not have loaded this file's hook."""
    _collect_static()


_collected = []


def _collect_static():
    """Once per session; parallel sessions (xdist) take turns."""
    if _collected:
        return
    with open(Path(tempfile.gettempdir()) / "surety-collectstatic.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        call_command("collectstatic", interactive=False, verbosity=0)
    _collected.append(True)


@pytest.fixture(scope="session")
def browser():
    # Playwright's sync API keeps an asyncio loop running in this thread; Django would then
    # refuse every ORM call of the test itself. The loop only carries the browser's
    # messages, so the ORM calls are safe.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    playwright = sync_playwright().start()
    chromium = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
    try:
        yield chromium
    finally:
        chromium.close()
        playwright.stop()
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


class Pages:
    """Opens fresh browser contexts on the live server; screenshots a failed test's pages."""

    def __init__(self, browser, base_url):
        self.browser = browser
        self.base_url = base_url
        self.opened = []

    def new(self):
        context = self.browser.new_context(base_url=self.base_url, viewport={"width": 1280, "height": 900})
        context.set_default_timeout(TIMEOUT_MS)
        page = context.new_page()
        page.console_errors = []
        page.on("console", lambda msg: msg.type == "error" and page.console_errors.append(
            f"{msg.text} ({msg.location.get('url', '')})"))
        page.on("pageerror", lambda exc: page.console_errors.append(str(exc)))
        page.on("response", lambda r: r.status >= 400 and page.console_errors.append(f"{r.status} {r.url}"))
        self.opened.append(page)
        return page

    def close(self, failed_as=None):
        for n, page in enumerate(self.opened):
            if failed_as and not page.is_closed():
                try:
                    screenshot(page, failed_as, f"failure-{n}")
                except Exception:  # a crashed page must not hide the test's own error
                    pass
            page.context.close()


@pytest.fixture
def pages(stack, browser, request):  # the server first: its environment is copied from ours
    for old in SCREENSHOTS.glob(f"{_file_safe(request.node.name)}-*.png"):
        old.unlink()  # a passing run must not leave last run's failure screenshots behind
    opened = Pages(browser, stack.url)
    yield opened
    report = getattr(request.node, "report_call", None)
    opened.close(failed_as=request.node.name if report is not None and report.failed else None)


@pytest.fixture
def page(pages):
    return pages.new()


def _file_safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


def screenshot(page, test_name, page_name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{_file_safe(f'{test_name}-{page_name}')}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def shot(request):
    """`shot(page, "review-detail")` -> artifacts/screenshots/<test>-review-detail.png"""
    return lambda page, name: screenshot(page, request.node.name, name)


# --- people, the agent and the limit ------------------------------------------------------------

@pytest.fixture
def people(stack):
    """alice and bob (approvers), olga (operators, owns billing-bot), aldo (auditors)."""
    call_command("setup_roles", verbosity=0)
    users = {}
    for username, group in PEOPLE.items():
        # The server checks this password with the tests' fast hasher (tests/settings.py).
        user = get_user_model().objects.create_user(username=username, password=PASSWORD,
                                                    email=f"{username}@surety.example")
        user.groups.add(Group.objects.get(name=group))
        users[username] = user
    return users


@pytest.fixture
def agent(people):
    """billing-bot, the agent olga is responsible for; its API token as `agent.token`."""
    agent, token = make_agent("billing-bot")
    agent.owner = people["olga"]
    agent.save(update_fields=["owner"])
    agent.token = token
    return agent


@pytest.fixture
def limit(stack):
    return Limit.limit_set(actor="system:tests", reason="the tests' policy", action_type="refund", currency="EUR",
                           max_amount=Decimal("500.00"), dual_approval_above=None)


@pytest.fixture
def api(stack, agent):
    """billing-bot's API client on the live server."""
    with api_client(stack.url, agent.token) as client:
        yield client


def request_refund(api, key, order, amount, customer):
    response = post_action(api, key, refund_body(order=order, amount=amount, customer=customer))
    assert response.status_code == 201, response.text
    return response.json()


def login(page, username, password=PASSWORD):
    page.goto("/accounts/login/")
    page.fill("#id_login", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.locator("#id_password").press("Enter")
    assert "/accounts/login/" not in page.url, f"{username} could not log in"
    return page


def status_message(page):
    """The text of the page's messages (role=status), '' if there are none."""
    region = page.locator("[role=status]")
    return " ".join(region.all_inner_texts()) if region.count() else ""


def csrf_post(page, path, form, headers=None):
    """A POST forged from the logged-in browser: its session and a valid CSRF token, but no
    form on any page. Redirects are not followed, so the answer itself is checked."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    return page.request.post(path, form=form, max_redirects=0,
                             headers={"X-CSRFToken": token, "Referer": page.url, **(headers or {})})
