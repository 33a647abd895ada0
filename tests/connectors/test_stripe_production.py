"""With PRODUCTION on (no sandbox of its own, production settings, every check) and the Stripe
connector configured, a refund is carried out end to end: the provider is the test server's
sandbox in Stripe's wire format, reached at a URL as Stripe would be."""

import os
import signal

from tests.conftest import STACK_ENV, Stack, free_port
from tests.connectors.stripe_stack import make_order, sandbox_stripe, start_gunicorn, stripe_env
from tests.connectors.test_stripe import settled, stripe_refunds
from tests.factories import api_client, make_agent, post_action, refund_body


def production_env(stack):
    """The test server's database and Redis; config.settings itself (tests.settings refuses
    PRODUCTION), hardened; refunds to Stripe at the test server's sandbox."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "STRIPE_", "SANDBOX_"))}
    return {
        **keep, **STACK_ENV, **stripe_env(sandbox_stripe(stack.url)),
        "DJANGO_SETTINGS_MODULE": "config.settings", "PRODUCTION": "true", "DEBUG": "false",
        "SECRET_KEY": "p" * 60, "ALLOWED_HOSTS": "127.0.0.1", "SECURE_SSL_REDIRECT": "false",
        "DATABASE_URL": stack.env["DATABASE_URL"], "REDIS_URL": stack.env["REDIS_URL"],
        # Production has no sandbox: the other action types name a connector too.
        "CONNECTOR_SEND_MESSAGE": "sandbox", "CONNECTOR_CREATE_BOOKING": "sandbox",
        "SANDBOX_BASE_URL": f"{stack.url}/sandbox/v1",
    }


def test_production_with_the_stripe_connector_carries_out_a_refund_end_to_end(stack):
    env = production_env(stack)
    port = free_port()
    process = start_gunicorn(env, port)
    production = Stack(f"http://127.0.0.1:{port}", env)
    try:
        _, token = make_agent("billing")
        provider = api_client(stack.url, token)
        client = api_client(production.url, token)
        make_order(provider, "ch_prod")
        production.start_worker()  # runs the system checks with production settings first

        assert post_action(client, "refund:ch_prod:full:dec-1", refund_body("ch_prod")).status_code == 201
        action = settled(client, "refund:ch_prod:full:dec-1")

        assert action["status"] == "succeeded", action
        [refund] = stripe_refunds(provider, "ch_prod")
        assert action["external_ref"] == refund["id"]
        assert refund["metadata"]["operation_key"] == "refund:ch_prod:full:dec-1"
    finally:
        production.stop_workers()
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(10)
