from django.urls import path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.permissions import AllowAny

from . import views


def api_patterns(evidence_sections):
    """The agents' API, with the sections that the apps built on the ledger add to an action's
    evidence record (ledger.evidence.EvidenceSection; config/urls.py passes console.evidence's)."""
    return [
        path("actions", views.ActionCreateView.as_view(), name="action-create"),
        # Before the action's own read, which would take "/evidence" as part of the key.
        path("actions/<path:operation_key>/evidence", views.evidence_view(evidence_sections), name="action-evidence"),
        path("actions/<path:operation_key>", views.ActionDetailView.as_view(), name="action-detail"),
        path("tasks", views.TaskCreateView.as_view(), name="task-create"),
        path("tasks/<path:task_id>", views.TaskDetailView.as_view(), name="task-detail"),
        path("schema", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[AllowAny]),
             name="schema"),
    ]
