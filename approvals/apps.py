from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self):
        from ledger import hooks
        from ledger.metrics import register_collector
        from ledger.models import Action

        from . import intake
        from .evidence import ApprovalsEvidenceSerializer, approvals_evidence
        from .metrics import DecisionCollector, ReviewCollector
        from .overview import review_cards
        from .reviews import approval_expire_due, review_follow_action, review_follow_move

        # The limits decide what waits for a person; a review item follows each action that does.
        hooks.set_policy(intake)
        hooks.on_record(review_follow_action)
        hooks.on_move(Action, review_follow_move)
        hooks.on_overview(review_cards)
        hooks.on_sweep("approvals_expired", approval_expire_due)
        hooks.on_evidence("approvals", approvals_evidence, schema=ApprovalsEvidenceSerializer,
                          template="ledger/evidence_approvals.html")
        register_collector(ReviewCollector())
        register_collector(DecisionCollector())
