"""Mounts the sandbox where config/urls.py does, whatever SANDBOX_ENABLED says in the test run."""

from django.urls import include, path

urlpatterns = [
    path("sandbox/v1/", include("sandbox.urls")),
    path("sandbox/stripe/v1/", include("sandbox.stripe_urls")),
]
