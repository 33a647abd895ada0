"""The sandbox provider's Stripe wire format (stripe_api.py), under `/sandbox/stripe/v1/`."""

from django.urls import path, re_path

from . import stripe_api

app_name = "sandbox-stripe"

urlpatterns = [
    path("refunds", stripe_api.endpoint(GET=stripe_api.refund_list, POST=stripe_api.refund_create), name="refunds"),
    path("charges", stripe_api.endpoint(POST=stripe_api.charge_create), name="charges"),
    path("charges/<str:charge_id>", stripe_api.endpoint(GET=stripe_api.charge_detail), name="charge"),
    path("payment_intents/<str:payment_intent_id>", stripe_api.endpoint(GET=stripe_api.payment_intent_detail),
         name="payment-intent"),
    # Any other URL under /sandbox/stripe/v1/ answers as Stripe does, not with the site's HTML page.
    re_path(r"", stripe_api.not_found),
]
