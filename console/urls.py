"""Every page people work in, and the monitoring endpoints."""

from django.urls import path

from . import analytics_views as analytics
from . import approval_views as approvals
from . import bulk_views as redrives
from . import delegation_views as delegation
from . import dlq_views as dlq
from . import evidence_views as evidence
from . import incident_views as incidents
from . import ledger_views as ledger
from . import link_views as links
from . import monitoring
from . import readiness_views as readiness
from . import whatif_views as whatif

urlpatterns = [
    # Monitoring: Prometheus scrapes /metrics (token or allow-list). Operators' alerts ask /healthz,
    # load balancers /healthz/web: monitoring.HealthChecksMiddleware answers both, for any Host.
    path("metrics", monitoring.metrics_view, name="metrics"),
    # The dashboard
    path("", ledger.overview, name="overview"),
    path("approvals/", approvals.review_queue, {"queue": "approvals"}, name="approvals"),
    path("unknown/", approvals.review_queue, {"queue": "unknown"}, name="unknown-outcomes"),
    path("review/<int:pk>/", approvals.review_detail, name="review-detail"),
    path("review/<int:pk>/decide", approvals.review_decide_view, name="review-decide"),
    path("review/<int:pk>/group", approvals.held_group_decide_view, name="held-group-decide"),
    path("review/<int:pk>/edit", approvals.review_edit_view, name="review-edit"),
    # An alert e-mail's decision link: its token is the path (approvals.links).
    path("decide/<slug:token>", links.decision_link, name="decision-link"),
    path("delegations/", delegation.delegations, name="delegations"),
    path("delegations/new", delegation.delegation_create, name="delegation-create"),
    path("delegations/<int:pk>/end", delegation.delegation_end, name="delegation-end"),
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
