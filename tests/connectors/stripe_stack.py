"""The app configured with the Stripe connector for refunds: a gunicorn of its own (its webhooks
know the Stripe connector) and RQ workers, on the test database and the run's Redis, like
tests/conftest.py's `server` and `stack`. Stripe is the sandbox's Stripe wire format here, or
any Stripe-compatible server (tests/connectors/stripe_servers.py)."""

import os
import signal
import subprocess
from contextlib import contextmanager

import pytest
import stripe

from tests.conftest import PYTHON, ROOT, Stack, _wait_for_http, free_port
from tests.factories import sandbox

API_KEY = "sk_test_surety"
WEBHOOK_SECRET = "whsec_test_surety"


def sandbox_stripe(base_url):
    """The Stripe API base of the sandbox served at `base_url`."""
    return f"{base_url}/sandbox/stripe"


def stripe_env(api_base):
    """What makes the refund connector Stripe's, with Stripe's API at `api_base`."""
    return {"CONNECTOR_REFUND": "stripe", "STRIPE_API_KEY": API_KEY,
            "STRIPE_API_BASE": api_base, "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET}


def start_gunicorn(env, port):
    process = subprocess.Popen(
        [PYTHON, "-m", "gunicorn", "config.wsgi", "--preload", "-b", f"127.0.0.1:{port}", "-k", "gthread",
         "-w", "2", "--threads", "8", "--timeout", "60", "--log-level", "warning", "--keep-alive", "30"],
        cwd=ROOT, env=env, start_new_session=True,
    )
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/api/v1/schema")
    except RuntimeError:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    return process


@contextmanager
def stripe_app(server, api_base=None, **env):
    """A second app server, beside `server`, whose refunds go through the Stripe connector to
    `api_base`, by default to its own sandbox's Stripe wire format; `env` over its environment
    (its workers' too)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**server.env, **stripe_env(api_base or sandbox_stripe(url)), "SANDBOX_BASE_URL": f"{url}/sandbox/v1",
           "SITE_URL": url, **env}
    process = start_gunicorn(env, port)
    try:
        yield Stack(url, env)  # on the same database
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


@pytest.fixture(scope="module")
def stripe_server(server):
    """A second app server whose refunds go through the Stripe connector to its own sandbox."""
    with stripe_app(server) as app:
        yield app


@pytest.fixture
def stripe_stack(stack, stripe_server):
    """`stack`'s clean database and Redis, with the Stripe-configured server and its workers."""
    yield stripe_server
    stripe_server.stop_workers()


def sdk(api_base, api_key=API_KEY):
    """The official SDK as a caller of Stripe's API at `api_base`."""
    return stripe.StripeClient(api_key, base_addresses={"api": api_base}, max_network_retries=0,
                               http_client=stripe.HTTPXClient(timeout=10, allow_sync_methods=True))


def stripe_client(base_url, api_key=API_KEY):
    """The official SDK as a caller of the sandbox's Stripe wire format at `base_url`."""
    return sdk(sandbox_stripe(base_url), api_key)


def make_order(client, order_id, amount="100.00", currency="EUR", customer="CUST-17"):
    """A payment at the sandbox (a charge `ch_…` or a payment intent `pi_…`) to refund."""
    response = sandbox(client, "POST", "orders", json={"order_id": order_id, "customer": customer,
                                                       "amount": amount, "currency": currency})
    assert response.status_code == 201, response.text
