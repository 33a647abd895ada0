from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals"

    def ready(self):
        from ledger import hooks
        from ledger.models import Action

        from . import intake
        from .reviews import review_follow_move

        # The limits decide what waits for a person; a review item follows each action that does.
        hooks.set_policy(intake)
        hooks.on_move(Action, review_follow_move)
