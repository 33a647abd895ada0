"""Two Stripe-compatible servers written by others, each a subprocess on a free port for the
test session, and the app configured with the Stripe connector pointing at one of them.

What each lacks, as found by running them (a test that leaves one out names the gap here):

- stripe-stateful-mock (npm): pays with Stripe's test card tokens (`tok_visa`) only; honours
  `Idempotency-Key` as Stripe does; refunds charges only (no payment intents); knows no KWD.
- localstripe (PyPI): pays with Stripe's test payment methods (`pm_card_visa`) only, answering
  `tok_visa` with 400; ignores `Idempotency-Key` (the same request twice is two refunds);
  answers a refund list filtered by `created` with a 500, so reconciliation cannot read it.
  It writes its whole store to /tmp/localstripe.pickle after each request; `--from-scratch`
  never reads it back, so two runs at once do not share state.
"""

import json
import os
import signal
import subprocess
from dataclasses import dataclass, replace

import pytest

from tests.conftest import PYTHON, ROOT, _wait_for_http, free_port
from tests.connectors.stripe_stack import API_KEY, WEBHOOK_SECRET, sdk, stripe_app

TEST_WEBHOOK_SECRET = "whsec_test_mode_surety"  # the test-mode endpoint's: never the live one


@dataclass(frozen=True)
class StripeServer:
    name: str
    command: tuple
    test_card: str  # a `source` it takes for a charge
    honours_idempotency_key: bool
    currencies_missing: frozenset = frozenset()
    url: str = ""

    def start(self, port):
        return subprocess.Popen(
            [part.format(port=port) for part in self.command], cwd=ROOT, env={**os.environ, "PORT": str(port)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def client(self):
        return sdk(self.url)

    def charge(self, amount, currency):
        """A new charge at this server of `amount` in Stripe's units; its id."""
        return self.client().v1.charges.create(params={
            "amount": amount, "currency": currency, "source": self.test_card}).id

    def refunds(self, charge):
        """The charge's refunds as this server lists them."""
        return [refund.to_dict() for refund in
                self.client().v1.refunds.list(params={"charge": charge, "limit": 100}).auto_paging_iter()]


SERVERS = {server.name: server for server in (
    StripeServer("stripe-stateful-mock", ("node", "node_modules/stripe-stateful-mock/dist/cli.js"),
                 test_card="tok_visa", honours_idempotency_key=True, currencies_missing=frozenset({"kwd"})),
    StripeServer("localstripe", (PYTHON, "-m", "localstripe", "--port", "{port}", "--from-scratch"),
                 test_card="pm_card_visa", honours_idempotency_key=False),
)}


@pytest.fixture(scope="session", params=list(SERVERS))
def stripe_provider(request):
    """One of SERVERS, up and empty; killed at the end of the session."""
    port = free_port()
    server = SERVERS[request.param]
    process = server.start(port)
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/v1/charges")  # 401 without a key: up
        yield replace(server, url=f"http://127.0.0.1:{port}")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def provider_app(server, stripe_provider):
    """The app whose refunds go through the Stripe connector to `stripe_provider`."""
    with stripe_app(server, stripe_provider.url) as app:
        yield app


@pytest.fixture
def provider_stack(stack, provider_app):
    """`stack`'s clean database and Redis, with `provider_app` and its workers."""
    yield provider_app
    provider_app.stop_workers()


def uses(*names):
    """Parametrize `stripe_provider` with some of SERVERS only (the test says why)."""
    return pytest.mark.parametrize("stripe_provider", names, indirect=True)


def production_stripe_env(test_api_base):
    """The refund connector as production configures Stripe: a live key and its webhook secret,
    the live API base an address where nothing listens (a replay run must never call it); and
    the test mode at `test_api_base`, with a test key and the test-mode endpoint's own webhook
    secret, which Stripe signs test-mode events with (the live one never verifies them)."""
    return {"CONNECTOR_REFUND": "stripe", "STRIPE_API_KEY": API_KEY.replace("_test_", "_live_"),
            "STRIPE_API_BASE": f"http://127.0.0.1:{free_port()}", "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET,
            "STRIPE_TEST_API_KEY": "sk_test_replay", "STRIPE_TEST_API_BASE": test_api_base,
            "STRIPE_TEST_WEBHOOK_SECRET": TEST_WEBHOOK_SECRET}


@pytest.fixture
def production_stack(stack, stripe_provider):
    """`stack`'s clean database and Redis, with an app of its own configured by
    `production_stripe_env` (its test mode `stripe_provider`), and its workers: one deployment's
    settings for its web, where the replay set's webhook case posts a test-mode event, and for
    the workers that grant_promote asks which connector they run. A test's own process takes
    them with `configured_refund_connector(**production_stack.env)`."""
    with stripe_app(stack, **production_stripe_env(stripe_provider.url)) as app:
        try:
            yield app
        finally:
            app.stop_workers()


def configured_refund_connector(**env):
    """SURETY_CONNECTORS["refund"] as config.settings makes it from the environment `env` (a
    process's, or `production_stripe_env`), with no sandbox unless it says so; read in a process
    of its own, as the settings read the environment once."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "STRIPE_", "SANDBOX_"))}
    shown = subprocess.run(
        [PYTHON, "-c", "import json, django; django.setup(); from django.conf import settings; "
                       "print(json.dumps(settings.SURETY_CONNECTORS['refund']))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**keep, "DJANGO_SETTINGS_MODULE": "config.settings", "SANDBOX_ENABLED": "false", **env})
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)
