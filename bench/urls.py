"""The product's URLs plus the baseline views under /bench/ (used only by the benchmark)."""

from django.urls import include, path

from config.urls import handler404  # noqa: F401 (Django looks it up in ROOT_URLCONF)
from config.urls import urlpatterns as product_urlpatterns

urlpatterns = [*product_urlpatterns, path("bench/", include("bench.baseline.urls"))]
