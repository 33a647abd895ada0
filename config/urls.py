from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

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
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Every page people work in, /metrics and /healthz.
    path("", include("console.urls")),
]
if settings.SANDBOX_ENABLED:
    urlpatterns.append(path("sandbox/v1/", include("sandbox.urls")))
    # The same provider in Stripe's wire format: the Stripe connector's API base is /sandbox/stripe.
    urlpatterns.append(path("sandbox/stripe/v1/", include("sandbox.stripe_urls")))


handler500 = server_error


def handler404(request, exception=None):
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
