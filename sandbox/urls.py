from django.urls import path, re_path

from . import views

app_name = "sandbox"

urlpatterns = [
    path("refunds", views.endpoint(GET=views.refund_list, POST=views.refund_create), name="refunds"),
    path("messages", views.endpoint(GET=views.message_list, POST=views.message_create), name="messages"),
    path("bookings", views.endpoint(GET=views.booking_list, POST=views.booking_create), name="bookings"),
    path("orders", views.endpoint(POST=views.order_create), name="orders"),
    path("orders/<path:order_id>", views.endpoint(GET=views.order_detail), name="order"),
    path(
        "faults",
        views.endpoint(GET=views.fault_list, POST=views.fault_create, DELETE=views.fault_clear),
        name="faults",
    ),
    path("settings", views.endpoint(GET=views.settings_read, PUT=views.settings_update), name="settings"),
    path("reset", views.endpoint(POST=views.sandbox_reset), name="reset"),
    # Any other URL under /sandbox/v1/ answers in the sandbox's error form, not the site's HTML page.
    re_path(r"", views.not_found),
]
