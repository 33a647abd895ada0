from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from approvals import analytics_views as analytics
from approvals import views as approvals
from approvals import whatif_views as whatif
from dlq import bulk_views as redrives
from dlq import incident_views as incidents
from dlq import views as dlq
from ledger import evidence_views as evidence
from ledger import metrics as monitoring
from ledger import readiness_views as readiness
from ledger import site_url
from ledger import views as ledger
from ledger.api.problems import api_not_found
from ledger.api.unavailable import server_error
from ledger.webhooks import webhook_receive

urlpatterns = [
    path("api/v1/", include("ledger.api.urls")),
    path("webhooks/<slug:connector>/", webhook_receive, name="webhook"),
    # Monitoring: Prometheus scrapes /metrics (token or allow-list); load balancers ask /healthz.
    path("metrics", monitoring.metrics_view, name="metrics"),
    path("healthz", monitoring.healthz_view, name="healthz"),
    # Answers a signed probe only this deployment can: SITE_URL is checked against it (ledger.site_url).
    path("site-probe", site_url.site_probe, name="site-probe"),
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # The dashboard
    path("", ledger.overview, name="overview"),
    path("approvals/", approvals.review_queue, {"queue": "approvals"}, name="approvals"),
    path("unknown/", approvals.review_queue, {"queue": "unknown"}, name="unknown-outcomes"),
    path("review/<int:pk>/", approvals.review_detail, name="review-detail"),
    path("review/<int:pk>/decide", approvals.review_decide_view, name="review-decide"),
    path("review/<int:pk>/group", approvals.held_group_decide_view, name="held-group-decide"),
    path("review/<int:pk>/edit", approvals.review_edit_view, name="review-edit"),
    path("policies/", approvals.policies, name="policies"),
    path("policies/whatif", whatif.policy_whatif, name="policy-whatif"),
    path("analytics/", analytics.decision_analytics, name="decision-analytics"),
    path("dlq/", dlq.deadletter_queue, name="deadletter-queue"),
    path("dlq/bulk", dlq.deadletter_bulk, name="deadletter-bulk"),
    path("dlq/redrives/", redrives.bulk_redrive_list, name="bulk-redrive-list"),
    path("dlq/redrives/<int:pk>/", redrives.bulk_redrive_detail, name="bulk-redrive-detail"),
    path("dlq/redrives/<int:pk>/start", redrives.bulk_redrive_start, name="bulk-redrive-start"),
    path("dlq/redrives/<int:pk>/stop", redrives.bulk_redrive_stop, name="bulk-redrive-stop"),
    path("dlq/<int:pk>/", dlq.deadletter_detail, name="deadletter-detail"),
    path("dlq/<int:pk>/<slug:op>", dlq.deadletter_operate, name="deadletter-operate"),
    path("incidents/", incidents.incident_list, name="incident-list"),
    path("incidents/<int:pk>/", incidents.incident_detail, name="incident-detail"),
    path("incidents/<int:pk>/<slug:op>", incidents.incident_operate, name="incident-operate"),
    path("ledger/", ledger.ledger_search, name="ledger-search"),
    path("actions/<int:pk>/", ledger.action_detail, name="action-detail"),
    path("actions/<int:pk>/evidence", evidence.action_evidence, name="action-evidence"),
    path("actions/<int:pk>/evidence.json", evidence.action_evidence_json, name="action-evidence-json"),
    path("tasks/<int:pk>/", ledger.task_detail, name="task-detail"),
    path("tasks/<int:pk>/run-now", ledger.task_run_now_view, name="task-run-now"),
    path("agents/", ledger.agent_list, name="agent-list"),
    path("agents/<int:pk>/<slug:op>", ledger.agent_change, name="agent-change"),
    path("agents/<int:pk>/grants/promote", readiness.agent_grant_promote, name="agent-grant-promote"),
    path("connectors/", readiness.connector_readiness, name="connectors"),
    path("connectors/<slug:action_type>/replay", readiness.replay_run_start, name="replay-run-start"),
    path("connectors/runs/<int:pk>/", readiness.replay_run_detail, name="replay-run"),
    path("audit/", ledger.audit_log, name="audit-log"),
    path("audit/verify-chain", evidence.audit_chain_verify, name="audit-chain-verify"),
    path("audit/verify-evidence", evidence.audit_evidence_verify, name="audit-evidence-verify"),
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
