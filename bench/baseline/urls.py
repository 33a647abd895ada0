from django.urls import path

from . import views

urlpatterns = [
    path("baseline/rows", views.baseline_insert, name="bench-baseline-insert"),
    path("baseline/rows/<path:key>", views.baseline_read, name="bench-baseline-read"),
]
