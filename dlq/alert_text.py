"""What a dead-letter alert says: the entry's snapshot as readable text, so that whoever reads
the e-mail or the webhook knows what failed without opening the dashboard.

The body is read from the entry's frozen snapshot (the checkpoint of a task, or the ledger row
and evidence of an action), so the alert says what was true when the entry opened.
"""

import json


def entry_subject(entry):
    kind = entry.capability[1]
    if entry.action_id:
        return f"Dead letter: action {entry.subject_label} ({kind}) failed after {entry.attempts} attempt(s)"
    return f"Dead letter: task {entry.subject_label} ({kind}) failed {entry.attempts}×"


def entry_body(entry):
    lines = [_error_line(entry.last_error), ""]
    lines += _action_lines(entry.snapshot) if entry.action_id else _checkpoint_lines(entry.snapshot)
    return "\n".join(lines)


def _error_line(error):
    if not error:
        return "Error: none recorded"
    kind = "retryable" if error.get("retryable") else "not retryable"
    return f"Error: {error.get('code', 'error')}: {error.get('message', '')} ({kind})"


def _action_lines(snap):
    params = snap.get("params") or {}
    amount = f"{params['amount']} {params.get('currency', '')}".strip() if params.get("amount") else "—"
    lines = [
        f"Operation key: {snap.get('operation_key', '—')}",
        f"Type: {snap.get('action_type', '—')}",
        f"Target: {snap.get('target', '—')}",
        f"Customer: {snap.get('customer') or '—'}",
        f"Amount: {amount}",
        f"Status: {snap.get('status', '—')}",
        f"Attempts: {snap.get('attempts', '—')}",
        f"Agent: {snap.get('agent', '—')}",
        f"Decision: {snap.get('decision_id') or '—'}",
        f"Params: {_compact(params)}",
    ]
    evidence = snap.get("evidence") or []
    lines += ["", f"Evidence ({len(evidence)}):"] if evidence else ["", "Evidence: none"]
    lines += [f"  {i}. {_compact(item)}" for i, item in enumerate(evidence, 1)]
    return lines


def _checkpoint_lines(snap):
    lines = [
        f"Task: {snap.get('task_id', '—')}",
        f"Workflow: {snap.get('workflow', '—')}",
        f"State: {snap.get('state', '—')}",
        f"Attempts: {snap.get('attempts', '—')} of {snap.get('max_attempts', '?')}",
        "",
        "Checkpoint:",
    ]
    for name, step in (snap.get("steps") or {}).items():
        key = f" key {step['idempotency_key']}" if step.get("idempotency_key") else ""
        error = f" error {_compact(step['error'])}" if step.get("error") else ""
        lines.append(f"  {name}: {step['status']}{key}{error}")
    return lines


def _compact(value):
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)
