from django.conf import settings
from django.contrib import admin
from allauth.account import views as account_views
from django.urls import include, path

from console import signin
from console.evidence import SECTIONS as EVIDENCE_SECTIONS
from ledger import site_url
from ledger.api.problems import api_not_found
from ledger.api.unavailable import server_error
from ledger.api.urls import api_patterns
from ledger.webhooks import webhook_receive

urlpatterns = [
    path("api/v1/", include((api_patterns(EVIDENCE_SECTIONS), "api"))),
    path("webhooks/<slug:connector>/", webhook_receive, name="webhook"),
    # Answers a signed probe only this deployment can: SITE_URL is checked against it (ledger.site_url).
    path("site-probe", site_url.site_probe, name="site-probe"),
    path("admin/", admin.site.urls),
    # Sign-in, the second factor and step-up are allauth's (docs/signin.md); `login` and `logout`
    # are the names the pages and LOGIN_URL use for its views.
    path("accounts/login/", account_views.login, name="login"),
    path("accounts/logout/", account_views.logout, name="logout"),
    path("accounts/email/", signin.addresses_set_by_an_admin, name="account_email"),
    path("accounts/password/set/", signin.passwords_set_by_an_admin, name="account_set_password"),
    path("accounts/", include("allauth.urls")),
    # Every page people work in and /metrics (the health checks: console.monitoring.HealthChecksMiddleware).
    path("", include("console.urls")),
]
if settings.SANDBOX_ENABLED:
    urlpatterns.append(path("sandbox/v1/", include("sandbox.urls")))
    # The same provider in Stripe's wire format: the Stripe connector's API base is /sandbox/stripe.
    urlpatterns.append(path("sandbox/stripe/v1/", include("sandbox.stripe_urls")))


handler500 = server_error


def handler404(request, exception=None):
    # The API's and the webhooks' clients read problems (docs/contract.md), people read the page.
    if request.path.startswith(("/api/", "/webhooks/")):
        return api_not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
