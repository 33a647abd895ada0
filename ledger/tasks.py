"""Tasks: checkpointed workflows run by RQ workers (filled in by the durable-tasks work)."""


def task_follow_action(action):
    """An action of a task moved: wake, pause or fail the task with it."""
    if action.task_id is None:
        return


def task_expire_leases():
    return 0


def task_runnable_exists():
    return False


def task_claim_next(owner):
    return None


def task_run_claimed(task):
    return None
