"""The app configured with the Stripe connector for refunds, against the sandbox's Stripe wire
format: a gunicorn of its own (its webhooks know the Stripe connector) and RQ workers, on the
test database and the run's Redis, like tests/conftest.py's `server` and `stack`."""

import os
import signal
import subprocess

import pytest
import stripe

from tests.conftest import PYTHON, ROOT, Stack, _wait_for_http, free_port
from tests.factories import sandbox

API_KEY = "sk_test_surety"
WEBHOOK_SECRET = "whsec_test_surety"


def stripe_env(base_url):
    """What makes the refund connector Stripe's, with the sandbox at `base_url` as Stripe."""
    return {"CONNECTOR_REFUND": "stripe", "STRIPE_API_KEY": API_KEY,
            "STRIPE_API_BASE": f"{base_url}/sandbox/stripe", "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET}


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


@pytest.fixture(scope="module")
def stripe_server(server):
    """A second app server whose refunds go through the Stripe connector to its own sandbox."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**server.env, **stripe_env(url), "SANDBOX_BASE_URL": f"{url}/sandbox/v1", "SITE_URL": url}
    process = start_gunicorn(env, port)
    try:
        yield Stack(url, env, server.content_types)  # on the same database: the same ids
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)


@pytest.fixture
def stripe_stack(stack, stripe_server):
    """`stack`'s clean database and Redis, with the Stripe-configured server and its workers."""
    yield stripe_server
    stripe_server.stop_workers()


def stripe_client(base_url, api_key=API_KEY):
    """The official SDK as a caller of the sandbox's Stripe wire format."""
    return stripe.StripeClient(api_key, base_addresses={"api": f"{base_url}/sandbox/stripe"}, max_network_retries=0,
                               http_client=stripe.HTTPXClient(timeout=10, allow_sync_methods=True))


def make_order(client, order_id, amount="100.00", currency="EUR", customer="CUST-17"):
    """A payment at the sandbox (a charge `ch_…` or a payment intent `pi_…`) to refund."""
    response = sandbox(client, "POST", "orders", json={"order_id": order_id, "customer": customer,
                                                       "amount": amount, "currency": currency})
    assert response.status_code == 201, response.text
