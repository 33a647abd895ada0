"""An action's evidence record as this product composes it: the ledger's record
(ledger.evidence) with the sections of the apps built on it, in this order. The API's evidence
read, its OpenAPI document, the printable page and the JSON file all take them from here."""

from approvals.evidence import ApprovalsEvidenceSerializer, approvals_evidence
from dlq.evidence import DeadLettersEvidenceSerializer, deadletters_evidence
from ledger.evidence import EvidenceSection, evidence_record

SECTIONS = (
    # Review items with who decided, and the limit in force when the action was requested.
    EvidenceSection("approvals", approvals_evidence, ApprovalsEvidenceSerializer, "ledger/evidence_approvals.html"),
    # Dead-letter entries, their alerts and deliveries, and reconciliation incidents.
    EvidenceSection("dead_letters", deadletters_evidence, DeadLettersEvidenceSerializer,
                    "ledger/evidence_dead_letters.html"),
)


def evidence_export(action):
    """The record of `action` (one of `ledger.evidence.evidence_actions()`), JSON-ready and signed."""
    return evidence_record(action, SECTIONS)
