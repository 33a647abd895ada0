from django.conf import settings
from django.contrib import admin
from django.urls import include, path

from ledger.api.problems import api_not_found
from ledger.webhooks import webhook_receive

urlpatterns = [
    path("api/v1/", include("ledger.api.urls")),
    path("webhooks/<slug:connector>/", webhook_receive, name="webhook"),
    path("admin/", admin.site.urls),
]
if settings.SANDBOX_ENABLED:
    urlpatterns.append(path("sandbox/v1/", include("ledger.sandbox.urls")))


def handler404(request, exception=None):
    if request.path.startswith("/api/"):
        return api_not_found(request, exception)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
